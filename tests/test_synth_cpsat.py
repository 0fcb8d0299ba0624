"""The CP-SAT oracle: optimum and bound on tiny problems, against the greedy and built-ins."""

from __future__ import annotations

import sys
from dataclasses import replace

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from pipesim import CostModel, Link, StageCost, critical_path, generate, simulate, validate
from pipesim.errors import PipesimError
from pipesim.synth import lower_bound, make_problem, synthesize
from pipesim.synth.cpsat import solve_exact


def test_hand_solved_case() -> None:
    # p = 2, m = 2, F = I = W = 1, plenty of memory. Rank 1 cannot start before t = 1 and has
    # six unit actions: 7 at best, and 7 is reached (F0 F1 | F0 I0 F1 I1 W0 W1 from t = 1).
    pb = make_problem(n_ranks=2, n_microbatches=2, memory_limit=2)
    solution = solve_exact(pb)
    assert solution.optimal and solution.bound == solution.makespan == 7
    assert solution.schedule is not None
    assert simulate(solution.schedule).metrics.makespan == 7


def test_overheads_count_as_the_engine_counts_them() -> None:
    # p = 2, m = 2, F = I = W = 1 with a dispatch overhead of 1 and a send overhead of 1
    # on every cross-rank message: F of stage 0 and I of stage 1 take 3, the other split
    # actions 2. Rank 1 starts at 3 and has F 2 + I 3 + W 2 per micro-batch: among split
    # schedules 3 + 2 x 7 = 17 is the best, and the solver reaches and proves it.
    costs = CostModel.uniform(backward=2, link=Link(send_overhead=1), dispatch_overhead=1)
    pb = make_problem(n_ranks=2, n_microbatches=2, memory_limit=2, costs=costs)
    solution = solve_exact(pb)
    assert solution.optimal and solution.makespan == 17
    assert solution.schedule is not None
    assert simulate(solution.schedule, costs=costs).metrics.makespan == 17
    # A full B pays one dispatch instead of two (B = 2 + 1 + 1 = 4 on stage 1 vs I + W = 5):
    # the closed-form bound covers such schedules too, so it stays below the split optimum,
    # and synthesize does not pass the solver's bound off as one for every schedule.
    assert lower_bound(pb) == 3 + 2 * (2 + 4)
    result = synthesize(n_ranks=2, n_microbatches=2, memory_limit=2, costs=costs, exact=True)
    assert result.lower_bound == 15 and not result.optimal


def test_reservoir_counts_the_output_gradients_at_the_start_of_i() -> None:
    # p = 2, m = 2, F = I = W = 1; F stores 10 bytes, W holds 12 (its inputs and the output
    # gradients I adds at its start). Makespan 7 needs rank 1 to run F0 I0 F1 I1 (in some
    # order) before any W, so 0I1 ends by 6: at 1I1's start both micro-batches hold 12, 24
    # bytes (zb-h1's peak). Within 24 bytes 7 is reached; within 23 rank 1 must run a W
    # first, and the optimum is 8.
    costs = CostModel.uniform(
        forward=1, input_grad=1, weight_grad=1, activation_bytes=10, weight_grad_bytes=12
    )
    for limit, best in (("24B", 7), ("23B", 8)):
        pb = make_problem(n_ranks=2, n_microbatches=2, memory_limit=limit, costs=costs)
        solution = solve_exact(pb)
        assert solution.optimal and solution.makespan == best
        assert solution.schedule is not None
        sim = simulate(solution.schedule, costs=costs)
        assert sim.metrics.makespan == best
        assert max(r.peak_activation_bytes for r in sim.metrics.ranks) <= pb.limit_bytes[1]


def test_memory_limit_binds_the_optimum() -> None:
    # One rank, m = 3: no waiting at all, makespan 3 (F + I + W) whatever the memory.
    # With 1 micro-batch of memory it must run F I W F I W ...; the reservoir allows it.
    costs = CostModel.uniform(
        forward=2, input_grad=2, weight_grad=1, activation_bytes=5, weight_grad_bytes=2
    )
    pb = make_problem(n_ranks=1, n_microbatches=3, memory_limit=1, costs=costs)
    solution = solve_exact(pb)
    assert solution.optimal and solution.makespan == 15
    assert solution.schedule is not None
    ops = "".join(a.op.value for a in solution.schedule.orders[0])
    assert ops == "FIWFIWFIW"
    peak = simulate(solution.schedule, costs=costs).metrics.peak_activation_bytes
    assert peak == 5


@settings(max_examples=12)
# A zero-length W at the instant a forward starts: the orders must free before allocating.
@example(p=2, m=3, times=[(1, 1, 0)] * 3, factor=1)
@given(
    p=st.integers(2, 3),
    m=st.integers(1, 4),
    times=st.lists(
        st.tuples(st.integers(1, 4), st.integers(1, 4), st.integers(0, 3)), min_size=3, max_size=3
    ),
    factor=st.sampled_from([1, 2]),
)
def test_optimum_bounds_greedy_and_builtins(
    p: int, m: int, times: list[tuple[int, int, int]], factor: int
) -> None:
    costs = CostModel(
        stages=tuple(
            StageCost(
                forward=f,
                input_grad=i,
                weight_grad=w,
                backward=i + w,
                activation_bytes=6,
                weight_grad_bytes=2,
            )
            for f, i, w in times[:p]
        )
    )
    pb = make_problem(n_ranks=p, n_microbatches=m, memory_limit=factor * p, costs=costs)
    solution = solve_exact(pb, time_limit_s=20)
    assert solution.optimal, solution.status
    assert solution.schedule is not None
    validate(solution.schedule)
    sim = simulate(solution.schedule, costs=costs)
    # Free links: the solver's model is the engine's; its orders replay to its optimum.
    assert sim.metrics.makespan == solution.makespan
    assert sim.metrics.makespan == critical_path(solution.schedule, costs=costs).length
    assert all(r.peak_activation_bytes <= factor * p * 6 for r in sim.metrics.ranks)
    assert lower_bound(pb) <= solution.bound
    greedy = synthesize(n_ranks=p, n_microbatches=m, memory_limit=factor * p, costs=costs)
    assert greedy.metrics.makespan >= solution.makespan
    for name in ("1f1b", "zb-h1", "zb-h2"):
        built = simulate(generate(name, n_ranks=p, n_microbatches=m), costs=costs).metrics
        if all(r.peak_activation_bytes <= factor * p * 6 for r in built.ranks):
            assert built.makespan >= solution.bound


def test_synthesize_with_exact_reports_the_proven_gap() -> None:
    costs = CostModel.uniform(
        forward=10,
        input_grad=10,
        weight_grad=7,
        backward=17,
        activation_bytes=10,
        weight_grad_bytes=4,
    )
    result = synthesize(n_ranks=3, n_microbatches=4, memory_limit=3, costs=costs, exact=True)
    assert "exact" in {c.name for c in result.candidates}
    assert result.optimal and result.gap == 0
    assert result.lower_bound >= lower_bound(result.problem)


def test_too_big_is_refused() -> None:
    pb = make_problem(n_ranks=8, n_microbatches=32, memory_limit=8)
    with pytest.raises(PipesimError, match="small problems"):
        solve_exact(pb)


def test_without_ortools_it_says_how_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "ortools", None)
    monkeypatch.setitem(sys.modules, "ortools.sat.python", None)
    pb = make_problem(n_ranks=2, n_microbatches=2, memory_limit=2)
    with pytest.raises(PipesimError, match=r"pip install 'pipesim\[exact\]'"):
        solve_exact(pb)


def test_period_objective_hand_solved() -> None:
    # p = 2, m = 2, F = I = W = 1, plenty of memory. Rank 0 can run only its two forwards
    # before 1I0 ends (at 3 at the earliest: 0F0, 1F0, 1I0), so it idles at least 1 of
    # its 7 units: without a sync the period is 7, each rank's span. With a global sync and
    # an optimizer step of 1 every rank waits for the last (makespan 7 at best, as above)
    # and steps: 8.
    from pipesim.iterations import steady_period

    pb = make_problem(n_ranks=2, n_microbatches=2, memory_limit=2)
    alone = solve_exact(pb, objective="period", sync="none")
    assert alone.optimal and alone.period == alone.bound == 7
    assert alone.schedule is not None
    assert steady_period(alone.schedule, sync="none").period == 7
    costs = CostModel.uniform(optimizer=1)
    pb = make_problem(n_ranks=2, n_microbatches=2, memory_limit=2, costs=costs)
    synced = solve_exact(pb, objective="period", sync="global")
    assert synced.optimal and synced.period == 8
    assert synced.schedule is not None
    assert steady_period(synced.schedule, costs=costs, sync="global").period == 8


@settings(max_examples=8, deadline=None)
@given(
    f=st.integers(1, 3),
    i=st.integers(1, 3),
    w=st.integers(0, 2),
    opt=st.integers(0, 2),
    sync_time=st.integers(0, 2),
    sync=st.sampled_from(["global", "none", "post-validation"]),
)
def test_period_objective_bounds_the_engine(
    f: int, i: int, w: int, opt: int, sync_time: int, sync: str
) -> None:
    # The engine runs the solver's orders no later than their rigid repetition every P,
    # so its period is at most the solver's; no schedule beats the proven bound, the
    # built-ins within the limit (p micro-batches: 1F1B and ZB-H1) included; the memory
    # limit holds in the engine.
    from pipesim.iterations import steady_period

    costs = CostModel.uniform(forward=f, input_grad=i, weight_grad=w, backward=i + w, optimizer=opt)
    costs = replace(costs, sync_time=sync_time)
    pb = make_problem(n_ranks=3, n_microbatches=3, memory_limit=3, costs=costs)
    solution = solve_exact(pb, objective="period", sync=sync, time_limit_s=20)
    assert solution.schedule is not None and solution.period is not None
    engine = steady_period(solution.schedule, costs=costs, sync=sync).period
    assert solution.bound <= engine <= solution.period
    sim = simulate(solution.schedule, costs=pb.memory_costs)
    assert max(r.peak_activation_bytes for r in sim.metrics.ranks) <= pb.limit_bytes[0]
    for name in ("1f1b", "zb-h1"):
        builtin = generate(name, n_ranks=3, n_microbatches=3)
        assert steady_period(builtin, costs=costs, sync=sync).period >= solution.bound
