"""Steady-state extrapolation (pipesim.plan.steady) changes no result.

Oracles: the one-pass evaluator run over every micro-batch (no pattern), the compiled
evaluator (pipesim.plan.fastsim.evaluate), the SimPy engine, and 1F1B's closed form.
Each case also records whether the evaluator jumped, so a pattern that is never used
(and so never tested) fails too.
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from fractions import Fraction

import pytest
from helpers import SMALL_MODEL

from pipesim.actions import Action, Op
from pipesim.costs import CostModel, Link, Links, StageCost
from pipesim.engine import simulate
from pipesim.errors import ScheduleError
from pipesim.exact import Time
from pipesim.plan import steady
from pipesim.plan.fastsim import compile_schedule, evaluate, metrics_of
from pipesim.plan.hardware import get_accelerator
from pipesim.plan.model import get_model
from pipesim.plan.onepass import quick_step
from pipesim.plan.planner import Dimensions, sweep_points
from pipesim.plan.steady import Pattern, find_pattern
from pipesim.plan.sweep import Point, SweepContext, build_configuration, evaluate_point
from pipesim.plan.workload import workload_from_model
from pipesim.schedule import Schedule
from pipesim.schedules import generate, schedule_names

# Families whose orders carry no repeating run: GPipe and looped BFS run all forwards
# (of a chunk) before any backward, so the middle of an order is no steady state.
# DualPipe's and DualPipeV's overlapped pairs repeat like any action (steady.work_keys).
_WHOLE = {"gpipe", "looped-bfs"}


def _time(rng: random.Random) -> Time:
    return rng.choice([rng.randint(1, 9), Fraction(rng.randint(1, 40), rng.randint(1, 6))])


def _costs(rng: random.Random, n_stages: int) -> CostModel:
    """Uneven stage costs, memory, and links that queue (latency, bandwidth, a few slots)."""
    stages = tuple(
        StageCost(
            forward=_time(rng),
            backward=_time(rng),
            input_grad=_time(rng),
            weight_grad=_time(rng),
            activation_bytes=rng.randint(0, 500),
            output_bytes=rng.randint(0, 64),
        )
        for _ in range(n_stages)
    )

    def link() -> Link:
        return Link(
            latency=rng.choice([0, _time(rng)]),
            bandwidth_bytes_per_s=rng.choice([None, Fraction(rng.randint(2, 40), 3)]),
            max_concurrent=rng.randint(1, 3),
        )

    return CostModel(
        stages=stages,
        link=link(),
        links=rng.choice([None, Links(ranks_per_node=2, intra_node=link(), inter_node=link())]),
        blocking_sends=rng.random() < 0.5,
    )


def _cases(name: str) -> Iterator[tuple[int, int, int]]:
    for p in (1, 2, 3, 4):
        for v in (1, 2, 3):
            # just above the warm-up, multiples and non-multiples of the period (1 or p)
            for m in sorted({p + 1, 2 * p, 4 * p + 1, 6 * p, 8 * p + 3, 12 * p}):
                yield p, v, m


class _Spy:
    """Counts the evaluator's jumps (Extrapolation._jump), to show a case used one."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.jumps = 0
        original = steady.Extrapolation._jump

        def counted(this: steady.Extrapolation, *args: object) -> Time:
            before = list(args[2])  # positions
            moved = original(this, *args)  # type: ignore[arg-type]
            self.jumps += before != list(args[2])
            return moved

        monkeypatch.setattr(steady.Extrapolation, "_jump", counted)


@pytest.mark.parametrize("name", schedule_names())
def test_extrapolation_equals_full_evaluation_and_engine(
    name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    spy = _Spy(monkeypatch)
    rng = random.Random(name)
    checked = jumped = 0
    for p, v, m in _cases(name):
        try:
            schedule = generate(name, n_ranks=p, n_microbatches=m, virtual=v)
        except ScheduleError:
            continue
        costs = _costs(rng, schedule.n_stages)
        full = quick_step(schedule, costs)
        before = spy.jumps
        fast = quick_step(schedule, costs, pattern=find_pattern(schedule))
        jumped += spy.jumps > before
        assert fast == full, (p, v, m)
        compiled = evaluate(compile_schedule(schedule), costs)
        if fast is not None:
            assert fast == compiled, (p, v, m)
        if p * v * m <= 150:  # the SimPy engine, on the smaller half
            reference = simulate(schedule, costs=costs).metrics
            assert metrics_of(schedule, costs, compiled) == reference, (p, v, m)
        checked += 1
    assert checked >= 5
    if name in _WHOLE:
        assert jumped == 0
    else:
        assert jumped >= checked // 3, (jumped, checked)


def test_1f1b_long_run_is_its_closed_form() -> None:
    # 1F1B on p ranks, m micro-batches, F and B alike everywhere, free links:
    # makespan (m + p - 1)(F + B), every rank busy m (F + B) (Narayanan et al. 2021)
    p, m, f, b = 8, 2048, 3, 7
    schedule = generate("1f1b", n_ranks=p, n_microbatches=m)
    pattern = find_pattern(schedule)
    assert pattern is not None and pattern.shift == 1
    step = quick_step(schedule, CostModel.uniform(forward=f, backward=b), pattern=pattern)
    assert step is not None
    assert step.makespan == (m + p - 1) * (f + b)
    assert step.busy == (m * (f + b),) * p


def test_pattern_of_1f1b_by_hand() -> None:
    # rank 1 of 2: F0 F1 B0 F2 B1 ... from its second action on, each action is the one
    # two positions earlier with the micro-batch one higher; the last B's do not repeat
    schedule = generate("1f1b", n_ranks=2, n_microbatches=8)
    assert find_pattern(schedule) == Pattern(shift=1, lengths=(2, 2), starts=(1, 0), ends=(13, 14))
    for order, length, start, end in zip(schedule.orders, (2, 2), (1, 0), (13, 14), strict=True):
        for x in range(start, end):
            a, b = order[x], order[x + length]
            assert (b.stage, b.op, b.microbatch) == (a.stage, a.op, a.microbatch + 1)


def test_irregular_orders_have_no_pattern() -> None:
    # every rank's work differs from one micro-batch to the next (one F per rank, no B on
    # odd micro-batches is not a schedule; swap two actions in the middle instead)
    schedule = generate("1f1b", n_ranks=2, n_microbatches=40)
    order = list(schedule.orders[0])
    middle = len(order) // 2
    order[middle], order[middle + 2] = order[middle + 2], order[middle]
    swapped = Schedule.from_orders(
        [order, list(schedule.orders[1])],
        placement=schedule.placement,
        n_microbatches=40,
        name="swapped",
    )
    pattern = find_pattern(swapped)
    assert pattern is None or not (pattern.starts[0] <= middle < pattern.ends[0])
    costs = CostModel.uniform(forward=2, backward=3, link=Link(latency=1))
    assert quick_step(swapped, costs, pattern=pattern) == quick_step(swapped, costs)


def test_a_state_that_never_repeats_is_evaluated_in_full(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # forward-only sequential whose happens_before edge is missing from one micro-batch:
    # the orders repeat but the signals do not, so no pattern is used
    schedule = generate("sequential", n_ranks=2, n_microbatches=40, forward_only=True)
    edges = [e for e in schedule.happens_before if e[1] != Action(stage=0, op=Op.F, microbatch=20)]
    broken = Schedule.from_orders(
        [list(o) for o in schedule.orders],
        placement=schedule.placement,
        n_microbatches=40,
        name="broken",
        happens_before=edges,
    )
    assert find_pattern(schedule) is not None
    assert find_pattern(broken) is None
    # and a cap of one cut: the evaluator stops looking and evaluates the rest
    monkeypatch.setattr(steady, "MAX_CUTS", 0)
    costs = CostModel.uniform(forward=2, link=Link(latency=1))
    pattern = find_pattern(schedule)
    assert quick_step(schedule, costs, pattern=pattern) == quick_step(schedule, costs)


def test_inexact_times_end_the_search() -> None:
    # pipesim.exact turns every cost into an int or a Fraction, so a float time cannot
    # come from a CostModel; should one reach a cut, equality of differences would not be
    # exact, so the search stops there and the rest is evaluated in full
    pattern = Pattern(shift=1, lengths=(2,), starts=(0,), ends=(10,))
    search = steady.Extrapolation(pattern)
    state = dict(positions=[0], held=[0], count=[0], busy=[0], avail={}, sleeping={}, slots={})
    limits, makespan = search.at_cut(clock=[0], makespan=0, **state)  # type: ignore[arg-type]
    assert limits == [2] and makespan == 0
    state["positions"] = [2]
    limits, makespan = search.at_cut(clock=[1.5], makespan=1.5, **state)  # type: ignore[arg-type]
    assert limits is None and makespan == 1.5


def test_sweep_switch_gives_the_same_evaluation(monkeypatch: pytest.MonkeyPatch) -> None:
    """PIPESIM_STEADY=0 (the benchmark's side-by-side switch) evaluates every micro-batch,
    with the same result; the default extrapolates."""
    spy = _Spy(monkeypatch)
    acc = get_accelerator("h100-sxm")
    context = SweepContext(
        workload=workload_from_model(SMALL_MODEL),
        accelerator=acc,
        devices=8,
        memory_capacity_bytes=acc.memory_bytes,
    )
    point = Point(
        schedule="interleaved-1f1b",
        pipeline=4,
        virtual=2,
        microbatch_size=1,
        n_microbatches=64,
        data_parallel=2,
    )
    with_steady = evaluate_point(context, point)
    assert spy.jumps == 1
    monkeypatch.setenv("PIPESIM_STEADY", "0")
    other = SweepContext(**{f: getattr(context, f) for f in context.__dataclass_fields__})
    without = evaluate_point(other, point)
    assert spy.jumps == 1
    assert with_steady.reason is None
    assert with_steady == without


def _big_sweep(model: str, devices: int) -> tuple[SweepContext, list[Point]]:
    acc = get_accelerator("h100-sxm")
    context = SweepContext(
        workload=workload_from_model(get_model(model)),
        accelerator=acc,
        devices=devices,
        memory_capacity_bytes=int(acc.memory_bytes * 0.9),
    )
    points, _ = sweep_points(
        devices=devices,
        global_batch=16384,
        gpus_per_node=acc.gpus_per_node,
        n_layers=len(context.workload.layers),
        workload=context.workload,
        dimensions=Dimensions(),
    )
    return context, points


@pytest.mark.slow
@pytest.mark.parametrize(("model", "devices"), [("llama2-70b", 4096), ("llama3.1-405b", 16384)])
def test_sampled_big_sweep_configurations(
    model: str, devices: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Configurations of the 4,096- and 16,384-GPU sweeps long enough to jump: the
    sweep's Evaluation with the extrapolation equals the one without and the SimPy
    engine's makespan of the same schedule and costs."""
    spy = _Spy(monkeypatch)
    context, points = _big_sweep(model, devices)
    mid = [
        p
        for p in points
        if p.n_microbatches >= 64 and p.pipeline * p.virtual * p.n_microbatches <= 2048
    ]
    checked = jumped = 0
    for point in random.Random(11).sample(mid, 12):
        before = spy.jumps
        fast = evaluate_point(context, point)
        if fast.reason is not None:
            continue
        jumped += spy.jumps > before
        monkeypatch.setenv("PIPESIM_STEADY", "0")
        whole = evaluate_point(
            SweepContext(**{f: getattr(context, f) for f in context.__dataclass_fields__}), point
        )
        monkeypatch.delenv("PIPESIM_STEADY")
        assert fast == whole, point
        schedule, costs = build_configuration(context, point)
        engine = simulate(schedule, costs=costs, check=False).metrics
        assert engine.makespan == fast.makespan_ns
        step = quick_step(schedule, costs, pattern=find_pattern(schedule))
        if step is not None:  # None: overlapped works, the compiled evaluator
            assert metrics_of(schedule, costs, step) == engine
        checked += 1
    assert checked >= 6 and jumped >= 3, (checked, jumped)
