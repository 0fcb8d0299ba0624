"""Long schedules priced from short ones (pipesim.plan.splice) change no result.

Oracles: the real generator (the splice property: a long schedule's orders are its
base's with whole periods inserted), the one-pass evaluator over every micro-batch of
the generated schedule (no pattern), the SimPy engine, and the sweep with the splicing
and the extrapolation off (``PIPESIM_STEADY=0``).
"""

from __future__ import annotations

import os
import random
from collections.abc import Iterable

import pytest
from test_plan_steady import _costs

from pipesim.engine import simulate
from pipesim.errors import ScheduleError
from pipesim.plan import splice
from pipesim.plan.hardware import get_accelerator
from pipesim.plan.model import get_model
from pipesim.plan.onepass import quick_step
from pipesim.plan.steady import find_pattern, work_keys
from pipesim.plan.sweep import Point, SweepContext, evaluate_points
from pipesim.plan.workload import workload_from_model
from pipesim.schedules import generate, get_spec, schedule_names

_FAMILIES = sorted(splice.SPLICED_FAMILIES)


def _virtuals(name: str) -> tuple[int, ...]:
    accepted = get_spec(name).virtual_values or range(1, splice.MAX_SPLICED_VIRTUAL + 1)
    return tuple(v for v in accepted if v <= splice.MAX_SPLICED_VIRTUAL)


def _check_splices(
    name: str, p: int, v: int, microbatches: Iterable[int], *, built: bool = True
) -> int:
    """Every m of ``microbatches`` with a base: the generated orders are the base's spliced,
    with the base's run longer and its placement; with ``built``, also the schedule
    ``spliced_schedule`` builds from them (the same orders as works, so the fast subset
    shows it; the whole envelope checks the orders). Returns how many were checked."""
    checked = 0
    for m in microbatches:
        base = splice.base_instance(name, p, v, m)
        if base is None:
            continue
        m0, shift = base.schedule.n_microbatches, base.pattern.shift
        periods = (m - m0) // shift
        schedule = generate(name, n_ranks=p, n_microbatches=m, virtual=v)  # never refused
        keys = work_keys(schedule)
        assert keys is not None
        orders = splice.works_of(keys, m, schedule.n_stages)
        spliced = splice.spliced_orders(base.keys, m0, schedule.n_stages, base.pattern, periods)
        assert orders == spliced, (p, v, m)
        assert find_pattern(schedule, keys=keys) == splice.extended(base.pattern, periods)
        assert schedule.placement == base.schedule.placement
        assert schedule.n_copies == base.schedule.n_copies and not schedule.happens_before
        if built:  # built from the base as works (what a sweep evaluates whole)
            made = splice.spliced_schedule(name, p, v, m)
            assert made is not None and made == (schedule, find_pattern(schedule, keys=keys))
        checked += 1
    return checked


@pytest.mark.parametrize("name", _FAMILIES)
def test_long_orders_are_their_base_spliced(name: str) -> None:
    checked = sum(
        _check_splices(name, p, v, range(2, 41)) for p in (1, 2, 3, 4, 8) for v in _virtuals(name)
    )
    assert checked > 100


#: ``PIPESIM_WHOLE_ENVELOPE=1`` checks every m of the envelope (minutes: generating
#: 16 x 4 x 127 schedules is the cost, not the splice); run it after changing a generator
#: or the splice.
_WHOLE_ENVELOPE = os.environ.get("PIPESIM_WHOLE_ENVELOPE") == "1"
#: Above its dense start, the suite checks every ``_STRIDE``-th m at each p.
_STRIDE = 8


def _envelope_microbatches(p: int, dense_to: int = 32) -> list[int]:
    """The m the suite checks at ``p``: every m up to ``dense_to`` (at least 32; the
    envelope test passes its base's m + 4, so each base and its first periods), then
    every 8th, offset by ``p`` so that across ranks each residue mod 8 is checked at
    every length, and the envelope's top."""
    largest = splice.MAX_SPLICED_MICROBATCHES
    if _WHOLE_ENVELOPE:
        return list(range(2, largest + 1))
    dense_to = max(32, dense_to)
    first = dense_to + 1 + (p - dense_to - 1) % _STRIDE  # the first m > dense_to, = p mod 8
    return sorted(
        {*range(2, dense_to + 1), *range(first, largest + 1, _STRIDE), largest - 1, largest}
    )


def test_envelope_microbatches_cover_every_residue() -> None:
    ranks = range(1, splice.MAX_SPLICED_RANKS + 1)
    for dense_to in (32, 40, 65):
        assert all(
            set(range(2, dense_to + 1)) <= set(_envelope_microbatches(p, dense_to)) for p in ranks
        )
        for start in range(dense_to + 1, splice.MAX_SPLICED_MICROBATCHES - _STRIDE + 2):
            window = set(range(start, start + _STRIDE))  # each window of 8
            residues = {
                m % _STRIDE
                for p in ranks
                for m in _envelope_microbatches(p, dense_to)
                if m in window
            }
            assert residues == set(range(_STRIDE)), (dense_to, start)


@pytest.mark.slow
@pytest.mark.parametrize("name", _FAMILIES)
def test_splice_property_over_the_whole_envelope(name: str) -> None:
    """Every p and v the module is used for, at the m of ``_envelope_microbatches``: every
    m through the base's and four periods more, every 8th above."""
    largest = splice.MAX_SPLICED_MICROBATCHES
    for p in range(1, splice.MAX_SPLICED_RANKS + 1):
        for v in _virtuals(name):
            base = splice.base_instance(name, p, v, largest)
            dense_to = 0 if base is None else base.schedule.n_microbatches + 4
            _check_splices(name, p, v, _envelope_microbatches(p, dense_to), built=False)


def test_families_left_out_do_not_splice() -> None:
    """The interleaved families refuse some micro-batch counts by their own rules, the
    others have no run or overlapped works: none is spliced, each is generated."""
    for name in set(schedule_names()) - splice.SPLICED_FAMILIES:
        assert not splice.spliced(name, 4, 2, 64)
    assert not splice.spliced("1f1b", splice.MAX_SPLICED_RANKS + 1, 1, 64)
    assert not splice.spliced("1f1b", 4, 1, splice.MAX_SPLICED_MICROBATCHES + 1)


@pytest.mark.parametrize("name", _FAMILIES)
def test_extrapolated_step_equals_the_generated_schedule(name: str) -> None:
    """Uneven stage costs, memory and links that queue: the result priced from a shorter
    instance equals the full pass over the generated schedule (and the SimPy engine on
    some); a family whose every case falls back is not tested, so that fails too."""
    rng = random.Random(name)
    priced = 0
    for p in (2, 3, 4):
        for v in _virtuals(name)[:2]:
            costs = _costs(rng, p * v)
            for m in sorted({rng.randint(8, 40) for _ in range(4)} | {64}):
                step = splice.extrapolated_step(name, p, v, m, costs)
                if step is None:
                    continue
                priced += 1
                schedule = generate(name, n_ranks=p, n_microbatches=m, virtual=v)
                assert step == quick_step(schedule, costs), (p, v, m)
                if m <= 16:
                    reference = simulate(schedule, costs=costs, check=False).metrics
                    assert step.makespan == reference.makespan
                    assert step.busy == tuple(r.busy for r in reference.ranks)
                    assert step.peak_activation_bytes == tuple(
                        r.peak_activation_bytes for r in reference.ranks
                    )
    assert priced >= 8


def test_base_is_the_fewest_micro_batches_with_a_run() -> None:
    # 1F1B at p = 4 has a run of four periods from m = 8 (p + 4) on
    base = splice.base_instance("1f1b", 4, 1, 50)
    assert base is not None and base.schedule.n_microbatches == 8
    assert find_pattern(generate("1f1b", n_ranks=4, n_microbatches=7)) is None
    assert splice.base_instance("1f1b", 4, 1, 8) is None  # nothing shorter has a run
    with pytest.raises(ScheduleError):
        generate("zbv", n_ranks=4, n_microbatches=8, virtual=1)
    assert splice.base_instance("zbv", 4, 1, 50) is None  # refused at every size


def test_order_form_identifies_orders() -> None:
    """Spliced forms equal the generated schedule's, and differ between schedules."""
    forms = {}
    for name in _FAMILIES:
        v = _virtuals(name)[-1]
        for m in (30, 31):
            s = generate(name, n_ranks=4, n_microbatches=m, virtual=v)
            keys = work_keys(s)
            assert keys is not None
            pattern = find_pattern(s, keys=keys)
            assert pattern is not None
            forms[name, m] = splice.order_form(keys, m, s.n_stages, pattern)
        base = splice.base_instance(name, 4, v, 31)
        assert base is not None
        periods = (31 - base.schedule.n_microbatches) // base.pattern.shift
        form = splice.order_form(
            base.keys, base.schedule.n_microbatches, 4 * v, base.pattern, periods=periods
        )
        assert form == forms[name, 31]
    assert len(set(forms.values())) == len(forms)


def _sweep(steady: bool, monkeypatch: pytest.MonkeyPatch) -> list[object]:
    monkeypatch.setenv("PIPESIM_STEADY", "1" if steady else "0")
    model = get_model("llama2-13b")
    accelerator = get_accelerator("h100-sxm")
    context = SweepContext(
        workload=workload_from_model(model),
        accelerator=accelerator,
        devices=16,
        memory_capacity_bytes=accelerator.memory_bytes,
    )
    points = [
        Point(
            schedule=name,
            pipeline=p,
            virtual=v,
            microbatch_size=1,
            n_microbatches=m,
            data_parallel=16 // p,
        )
        for name in [*_FAMILIES, "gpipe", "interleaved-1f1b", "dualpipe"]
        for p in (2, 4)
        for v in (1, 2)
        for m in (3, 9, 17, 40, 64)
    ]
    return evaluate_points(context, points, workers=1, timeout_s=600)  # type: ignore[return-value]


def test_sweep_is_the_same_with_and_without(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every Evaluation, fingerprints (twins) included, equals the sweep that generates
    and evaluates every schedule whole."""
    calls = []
    real = splice.extrapolated_step

    def counted(*args: object) -> object:
        found = real(*args)  # type: ignore[arg-type]
        calls.append(found is not None)
        return found

    monkeypatch.setattr(splice, "extrapolated_step", counted)
    spliced = _sweep(True, monkeypatch)
    assert sum(calls) >= 20  # the splicing was used
    whole = _sweep(False, monkeypatch)
    assert spliced == whole


def test_sampled_goal_sweep_points_equal_the_simpy_engine() -> None:
    """Configurations drawn from bench_plan.py's goal sweep (Llama 2 13B on 16 H100s,
    p <= 16, m <= 128), each priced through its base: the whole Evaluation equals the
    sweep run on the SimPy engine (which generates every schedule and simulates it)."""
    model, accelerator = get_model("llama2-13b"), get_accelerator("h100-sxm")
    contexts = [
        SweepContext(
            workload=workload_from_model(model),
            accelerator=accelerator,
            devices=16,
            memory_capacity_bytes=accelerator.memory_bytes,
            engine=engine,
        )
        for engine in ("fast", "simpy")
    ]
    rng = random.Random(27)
    points = []
    for name in _FAMILIES:
        v = _virtuals(name)[-1]
        for p in rng.sample([2, 4, 8, 16], 2):
            m = rng.randint(2 * p + 8, 96 if p < 16 else 48)
            points.append(
                Point(
                    schedule=name,
                    pipeline=p,
                    virtual=v,
                    microbatch_size=1,
                    n_microbatches=m,
                    data_parallel=16 // p,
                )
            )
    calls = []
    real = splice.extrapolated_step

    def counted(*args: object) -> object:
        found = real(*args)  # type: ignore[arg-type]
        calls.append(found is not None)
        return found

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(splice, "extrapolated_step", counted)
        fast = evaluate_points(contexts[0], points, workers=1, timeout_s=600)
    reference = evaluate_points(contexts[1], points, workers=1, timeout_s=1200)
    assert sum(calls) >= len(points) // 2
    assert [e.reason for e in fast] == [None] * len(points)
    assert fast == reference
