"""pipesim.synth: properties over random per-stage costs, the bound, the memory limit.

Oracles: the SimPy engine (memory peaks, makespan), the dependency graph's longest
path, the built-in schedules run on the same costs, and closed forms (the bound's
parallelogram, Qi et al. 2024).
"""

from __future__ import annotations

import importlib
from dataclasses import replace
from fractions import Fraction

import pytest
from hypothesis import given
from hypothesis import strategies as st

from pipesim import CostModel, Link, StageCost, critical_path, generate, simulate, validate
from pipesim.errors import CostError, PipesimError, ScheduleError
from pipesim.schedule import Schedule
from pipesim.step.memory import microbatch_peak
from pipesim.synth import lower_bound, make_problem, parse_memory_limit, synthesize
from pipesim.synth.heuristic import greedy_run, links_never_queue, policies
from pipesim.synth.synthesize import order_peaks


@st.composite
def stage_costs(draw: st.DrawFn, n_stages: int, *, latency: bool = False) -> CostModel:
    """Random integer F, I, W per stage; activations with a part kept for W; with
    ``latency``, messages with latency, bandwidth and overheads, and a dispatch overhead."""
    stages = []
    for _ in range(n_stages):
        f = draw(st.integers(1, 6))
        i = draw(st.integers(1, 6))
        w = draw(st.integers(0, 6))
        act = draw(st.integers(2, 9))
        stages.append(
            StageCost(
                forward=f,
                input_grad=i,
                weight_grad=w,
                backward=i + w,
                activation_bytes=act,
                weight_grad_bytes=draw(st.integers(1, 2 * act)),  # > act: output gradients
                output_bytes=draw(st.integers(0, 3)),
            )
        )
    if not latency:
        return CostModel(stages=tuple(stages))
    link = Link(
        latency=draw(st.integers(0, 2)),
        bandwidth_bytes_per_s=2,
        send_overhead=draw(st.integers(0, 1)),
        receive_overhead=draw(st.integers(0, 1)),
    )
    return CostModel(stages=tuple(stages), link=link, dispatch_overhead=draw(st.integers(0, 1)))


def _baseline(name: str, p: int, m: int, costs: CostModel, virtual: int | None = None) -> int:
    schedule = generate(name, n_ranks=p, n_microbatches=m, virtual=virtual)
    return simulate(schedule, costs=costs).metrics.makespan  # type: ignore[return-value]


def _checked(result, limit_factor: int) -> None:  # type: ignore[no-untyped-def]
    """Valid, within the limit in the engine's own simulation, makespan = longest path."""
    schedule, pb = result.schedule, result.problem
    validate(schedule)
    sim = simulate(schedule, costs=pb.memory_costs)
    for rank in sim.metrics.ranks:
        assert rank.peak_activation_bytes <= pb.limit_bytes[rank.rank]
        assert pb.limit_bytes[rank.rank] == limit_factor * pb.microbatch_bytes(rank.rank)
    assert sim.metrics.makespan == result.metrics.makespan
    assert result.metrics.makespan >= result.lower_bound


@given(data=st.data(), p=st.integers(2, 4), m=st.integers(1, 9))
def test_limit_p_validates_fits_and_never_loses_to_zb_h1(
    data: st.DataObject, p: int, m: int
) -> None:
    costs = data.draw(stage_costs(p))
    result = synthesize(n_ranks=p, n_microbatches=m, memory_limit=p, costs=costs)
    _checked(result, p)
    # Free links: every action starts when what it waits for ends.
    assert result.metrics.makespan == critical_path(result.schedule, costs=costs).length
    assert result.metrics.makespan <= _baseline("zb-h1", p, m, costs)
    assert result.metrics.makespan <= _baseline("1f1b", p, m, costs)


@pytest.mark.slow
@given(data=st.data(), p=st.integers(2, 4), m=st.integers(1, 9))
def test_limit_2p_never_loses_to_zb_h2(data: st.DataObject, p: int, m: int) -> None:
    costs = data.draw(stage_costs(p, latency=True))
    result = synthesize(n_ranks=p, n_microbatches=m, memory_limit=2 * p, costs=costs)
    _checked(result, 2 * p)
    zb_h2 = simulate(generate("zb-h2", n_ranks=p, n_microbatches=m), costs=costs)
    # (2p - 1) micro-batches at most (Qi et al. Table 2), each holding at most its peak
    # (max of activation_bytes and weight_grad_bytes; the limit's unit)
    fits = all(
        r.peak_activation_bytes <= 2 * p * microbatch_peak(costs.stage(r.rank))
        for r in zb_h2.metrics.ranks
    )
    assert fits
    assert result.metrics.makespan <= zb_h2.metrics.makespan
    assert result.metrics.makespan <= _baseline("zb-h1", p, m, costs)


@pytest.mark.slow
@given(data=st.data(), p=st.integers(2, 4), m=st.integers(1, 8))
def test_v_placement_at_limit_p_never_loses_to_zbv(data: st.DataObject, p: int, m: int) -> None:
    costs = data.draw(stage_costs(2 * p))
    result = synthesize(
        n_ranks=p, n_microbatches=m, memory_limit=p, costs=costs, virtual=2, placement="v"
    )
    _checked(result, p)
    assert result.schedule.placement == generate("zbv", n_ranks=p, n_microbatches=m).placement
    zbv = simulate(generate("zbv", n_ranks=p, n_microbatches=m), costs=costs)
    if all(
        r.peak_activation_bytes <= result.problem.limit_bytes[r.rank] for r in zbv.metrics.ranks
    ):
        assert result.metrics.makespan <= zbv.metrics.makespan


@given(
    data=st.data(),
    p=st.integers(2, 6),
    m=st.integers(1, 12),
    latency=st.booleans(),
    limit=st.sampled_from(["(p+2)//2", "p/2", "(p+4)//3", "p/3"]),
)
@pytest.mark.slow
def test_v_placement_at_tight_limits_never_loses_to_v_half_or_v_min(
    data: st.DataObject, p: int, m: int, latency: bool, limit: str
) -> None:
    # The controllable-memory family (Qi et al. 2024b) on random per-stage costs: at the
    # limits of V-Half and V-Min, p/2 and p/3, wherever the handcrafted schedule fits,
    # the synthesized one is at least as fast (the better of the greedy and the pattern).
    memory = {
        "(p+2)//2": Fraction((p + 2) // 2),
        "p/2": Fraction(p, 2),
        "(p+4)//3": Fraction((p + 4) // 3),
        "p/3": max(Fraction(1), Fraction(p, 3)),
    }[limit]
    costs = data.draw(stage_costs(2 * p, latency=latency))
    result = synthesize(
        n_ranks=p, n_microbatches=m, memory_limit=memory, costs=costs, virtual=2, placement="v"
    )
    schedule, pb = result.schedule, result.problem
    validate(schedule)
    assert result.metrics.makespan >= result.lower_bound
    for rank in simulate(schedule, costs=pb.memory_costs).metrics.ranks:
        assert rank.peak_activation_bytes <= pb.limit_bytes[rank.rank]
    if not latency:
        assert result.metrics.makespan == critical_path(schedule, costs=costs).length
    for name in ("v-half", "v-min"):
        sim = simulate(generate(name, n_ranks=p, n_microbatches=m), costs=pb.memory_costs)
        if all(r.peak_activation_bytes <= pb.limit_bytes[r.rank] for r in sim.metrics.ranks):
            assert result.metrics.makespan <= sim.metrics.makespan, name


@pytest.mark.parametrize("fraction", [Fraction(1, 2), Fraction(1, 3)])
def test_v_placement_under_half_and_a_third_of_1f1b_memory(fraction: Fraction) -> None:
    # The controllable-memory family (Qi et al. 2024b): V-Half and V-Min hold p/2 and about
    # p/3 micro-batches; the synthesized schedule must respect exactly that, rank by rank.
    p, m = 6, 18
    limit = fraction * p
    result = synthesize(n_ranks=p, n_microbatches=m, memory_limit=limit, virtual=2, placement="v")
    validate(result.schedule)
    sim = simulate(result.schedule, costs=result.problem.memory_costs)
    for rank in sim.metrics.ranks:
        assert rank.peak_activation_bytes <= limit * 2  # two 1-byte chunks per micro-batch
    assert result.metrics.makespan >= result.lower_bound


def test_equal_costs_meet_the_bound_at_2p() -> None:
    # F = I = W: ZB-H2's parallelogram, (p - 1) F + 3 m F, is the bound and is reached.
    p, m = 4, 12
    result = synthesize(n_ranks=p, n_microbatches=m, memory_limit=2 * p)
    assert result.lower_bound == (p - 1) + 3 * m
    assert result.metrics.makespan == result.lower_bound
    assert result.gap == 0


def test_unequal_costs_beat_zb_h1_and_report_the_winner() -> None:
    # W much cheaper than F (Qi et al.'s motivating case): with 2p micro-batches the greedy
    # schedule removes bubble zb-h1 leaves; the winner names a candidate that exists.
    p, m = 4, 16
    costs = CostModel.uniform(
        forward=10,
        input_grad=10,
        weight_grad=5,
        backward=15,
        activation_bytes=10,
        weight_grad_bytes=4,
    )
    result = synthesize(n_ranks=p, n_microbatches=m, memory_limit=2 * p, costs=costs)
    assert result.metrics.makespan < _baseline("zb-h1", p, m, costs)
    assert result.winner in {c.name for c in result.candidates}
    best = result.best_builtin
    assert best is not None and best.makespan >= result.metrics.makespan


def test_lower_bound_by_hand() -> None:
    # Two ranks, F=2, I=3, W=1 (B = I + W), m=3, a message of latency 1: rank 1 starts at
    # F + 1 = 3 and has 3 (2 + 3 + 1) = 18 of work: 21. One micro-batch: 2+1+2+3+1+3+1 = 13.
    costs = CostModel.uniform(
        forward=2, input_grad=3, weight_grad=1, backward=4, link=Link(latency=1)
    )
    pb = make_problem(n_ranks=2, n_microbatches=3, costs=costs, memory_limit=2)
    assert lower_bound(pb) == 21


def test_memory_limit_parsing() -> None:
    assert parse_memory_limit("16/3").microbatches == Fraction(16, 3)
    assert parse_memory_limit("2GiB").n_bytes == 2 * 2**30
    assert parse_memory_limit("1.5e3B").n_bytes == 1500
    for bad in ("", "x", "3XB", "0", "-1"):
        with pytest.raises(CostError):
            parse_memory_limit(bad)


def test_bad_problems_are_refused_with_the_fix() -> None:
    with pytest.raises(PipesimError, match="below one micro-batch"):
        make_problem(n_ranks=2, n_microbatches=2, memory_limit="1/2")
    with pytest.raises(PipesimError, match="needs activation bytes"):
        make_problem(n_ranks=2, n_microbatches=2, memory_limit="1GiB")
    with pytest.raises(ScheduleError, match="virtual 2"):
        make_problem(n_ranks=2, n_microbatches=2, memory_limit=2, placement="v")
    with pytest.raises(ScheduleError, match="valid placements"):
        make_problem(n_ranks=2, n_microbatches=2, memory_limit=2, placement="zigzag")


def test_limit_in_bytes_is_the_same_as_in_microbatches() -> None:
    costs = CostModel.uniform(activation_bytes=1000, weight_grad_bytes=300)
    by_count = synthesize(n_ranks=3, n_microbatches=6, memory_limit=3, costs=costs)
    by_bytes = synthesize(n_ranks=3, n_microbatches=6, memory_limit="3000B", costs=costs)
    assert by_count.problem.limit_bytes == by_bytes.problem.limit_bytes == (3000, 3000, 3000)
    assert by_count.metrics.makespan == by_bytes.metrics.makespan


def test_quick_tries_fewer_policies_and_keeps_the_guarantee() -> None:
    costs = CostModel.uniform(
        forward=10, input_grad=11, weight_grad=6, backward=17, activation_bytes=10,
        weight_grad_bytes=4,
    )  # fmt: skip
    full = synthesize(n_ranks=4, n_microbatches=12, memory_limit=4, costs=costs)
    quick = synthesize(n_ranks=4, n_microbatches=12, memory_limit=4, costs=costs, quick=True)
    assert len(quick.candidates) < len(full.candidates)
    assert full.metrics.makespan <= quick.metrics.makespan <= _baseline("zb-h1", 4, 12, costs)


@given(
    data=st.data(),
    p=st.integers(2, 4),
    m=st.integers(1, 7),
    v=st.booleans(),
    queue=st.booleans(),
    overlap=st.booleans(),
)
@pytest.mark.slow
def test_greedy_run_predicts_the_evaluator_where_no_message_queues(
    data: st.DataObject, p: int, m: int, v: bool, queue: bool, overlap: bool
) -> None:
    # synthesize trusts the greedy's own makespan where links_never_queue holds (it then
    # skips re-running every candidate), and order_peaks always (peaks need the order only).
    costs = data.draw(stage_costs(2 * p if v else p, latency=True))
    if not queue:
        costs = replace(costs, stages=tuple(replace(c, output_bytes=0) for c in costs.stages))
    costs = replace(costs, blocking_sends=not overlap)
    problem = make_problem(
        n_ranks=p,
        n_microbatches=m,
        costs=costs,
        memory_limit=data.draw(st.sampled_from([1, 2, p, 2 * p])),
        virtual=2 if v else 1,
        placement="v" if v else "looped",
    )
    trusted = links_never_queue(problem)
    assert trusted if overlap and not queue else (overlap or not trusted)
    for policy in policies(problem):
        run = greedy_run(problem, policy)
        if run is None:
            continue
        schedule = Schedule.from_orders(run.orders, placement=problem.placement, n_microbatches=m)
        sim = simulate(schedule, costs=problem.memory_costs).metrics
        assert order_peaks(problem, run.orders) == tuple(r.peak_activation_bytes for r in sim.ranks)
        if trusted and not policy.timed_by_the_evaluator:
            assert run.makespan == sim.makespan, policy.name
        elif trusted:  # a pace or a patient block may hold a pass back; the engine runs
            # it at once
            assert run.makespan >= sim.makespan


def test_v_placement_tries_the_building_block_policies() -> None:
    p, m = 6, 18
    result = synthesize(
        n_ranks=p, n_microbatches=m, memory_limit=(p + 2) // 2, virtual=2, placement="v"
    )
    names = {c.name: c for c in result.candidates}
    for block in ("v-half", "v-min"):
        assert names[f"greedy[block-{block}]"].fits  # within the limit: never stuck there
        assert result.metrics.makespan <= names[f"greedy[block-{block}]"].makespan


def test_a_wrong_greedy_prediction_falls_back_to_the_evaluator(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Were the greedy's own makespan ever wrong, synthesize must notice and re-run every
    # candidate: the answer is then the one computed with every candidate evaluated.
    module = importlib.import_module("pipesim.synth.synthesize")  # the package's name is
    # taken by the function
    costs = CostModel.uniform(forward=2, input_grad=2, weight_grad=1, backward=3)
    expected = synthesize(n_ranks=3, n_microbatches=6, memory_limit=3, costs=costs)
    real = module.greedy_run

    def lying(problem, policy):  # type: ignore[no-untyped-def]
        run = real(problem, policy)
        return None if run is None else replace(run, makespan=1)

    monkeypatch.setattr(module, "greedy_run", lying)
    result = synthesize(n_ranks=3, n_microbatches=6, memory_limit=3, costs=costs)
    assert result.metrics.makespan == expected.metrics.makespan > 1
    assert result.winner == expected.winner
    assert all(c.makespan > 1 for c in result.candidates)
