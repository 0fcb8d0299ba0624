"""The planner's branch and bound (pipesim.plan.bounds, pipesim.plan.prune) is exact.

Oracles: the generated schedule itself (the shape a bound reads from a small instance
must hold at every micro-batch count), full simulation by the planner's fast evaluator
and by the SimPy engine (a bound never exceeds what they compute), and the exhaustive
plan (``prune=False``: a pruned plan prints the same rows).
"""

from __future__ import annotations

import random
from collections import Counter
from fractions import Fraction

import pytest

from pipesim.actions import Action, Op
from pipesim.engine import simulate
from pipesim.errors import ScheduleError
from pipesim.plan import get_accelerator, get_model, plan, workload_from_model
from pipesim.plan.bounds import bound, shape
from pipesim.plan.model import ModelSpec
from pipesim.plan.planner import Dimensions, sweep_points
from pipesim.plan.report import format_table
from pipesim.plan.sweep import Point, SweepContext, build_configuration, evaluate_point
from pipesim.schedules import generate, schedule_names


def _runs(schedule: object) -> list[Counter[tuple[int, object]]]:
    out = []
    for order in schedule.orders:  # type: ignore[attr-defined]
        runs: Counter[tuple[int, object]] = Counter()
        for work in order:
            for a in (work,) if isinstance(work, Action) else work.parts:
                if a.op is not Op.W:  # one gradient per micro-batch: a B, or an I
                    runs[(a.stage, Op.F if a.op is Op.F else Op.B)] += 1
        out.append(runs)
    return out


@pytest.mark.parametrize("name", schedule_names())
def test_shape_holds_at_every_microbatch_count(name: str) -> None:
    """Placement, work per micro-batch and the warm-up prefix read from the small
    instance are those of the schedule generated at larger m (a family whose warm-up
    changes with m, such as looped BFS, keeps none)."""
    checked = 0
    for p in (1, 2, 3, 4, 8):
        for v in (1, 2, 3, 4):
            for m in (p, 2 * p, 3 * p + 1, 4 * p, 6 * p, 8 * p + 2, 16 * p):
                try:
                    schedule = generate(name, n_ranks=p, n_microbatches=m, virtual=v)
                except ScheduleError:
                    continue
                found = shape(name, p, v, m)
                assert found is not None
                assert schedule.placement == found.placement
                assert schedule.n_copies == found.n_copies
                for rank, runs in enumerate(_runs(schedule)):
                    expected = {k: Fraction(n, m) for k, n in runs.items()}
                    assert dict(found.per_microbatch[rank]) == expected, (p, v, m, rank)
                    if m >= found.n_microbatches:
                        prefix = found.warmup[rank]
                        assert schedule.orders[rank][: len(prefix)] == prefix, (p, v, m, rank)
                checked += 1
    assert checked > 5


def _context(model: str, devices: int, accelerator: str = "h100-sxm") -> SweepContext:
    acc = get_accelerator(accelerator)
    return SweepContext(
        workload=workload_from_model(get_model(model)),
        accelerator=acc,
        devices=devices,
        memory_capacity_bytes=int(acc.memory_bytes * 0.9),
    )


def _sample(context: SweepContext, global_batch: int, k: int, most_actions: int) -> list[Point]:
    points, _ = sweep_points(
        devices=context.devices,
        global_batch=global_batch,
        gpus_per_node=context.accelerator.gpus_per_node,
        n_layers=len(context.workload.layers),
        workload=context.workload,
        dimensions=Dimensions(),
    )
    small = [p for p in points if p.pipeline * p.virtual * p.n_microbatches <= most_actions]
    return random.Random(7).sample(small, k)


@pytest.mark.slow
@pytest.mark.parametrize(("model", "devices"), [("llama2-70b", 4096), ("llama3.1-405b", 16384)])
def test_bounds_never_exceed_the_simulated_step(model: str, devices: int) -> None:
    """On sampled configurations of the big sweeps: the fast evaluator's numbers equal
    the SimPy engine's, and the bounds lie at or below them."""
    context = _context(model, devices)
    checked = 0
    for point in _sample(context, 16384, 40, 600):
        found = bound(context, point)
        fast = evaluate_point(context, point)
        if fast.reason is not None:
            continue
        reference = evaluate_point(SweepContext(**{**_fields(context), "engine": "simpy"}), point)
        assert fast == reference
        schedule, costs = build_configuration(context, point)
        engine = simulate(schedule, costs=costs, check=True).metrics
        assert engine.makespan == fast.makespan_ns
        assert found is not None
        assert found.step_ns <= fast.makespan_ns + fast.allreduce_ns
        assert found.memory_bytes <= fast.peak_memory_bytes
        checked += 1
    assert checked >= 10


@pytest.mark.parametrize("schedule", ["interleaved-1f1b", "interleaved-zb", "looped-bfs"])
def test_bounds_of_a_mixture_of_experts_stay_below_its_simulation(schedule: str) -> None:
    """One rank holding 4 stages of mixtral-8x7b, t=4 d=4, expert parallel 1: its routed
    experts are reduced and stepped over t c d / e = 16 devices, the dense weights over d = 4.
    The bound once priced the experts as dense weights (the optimizer over 4 shards: 1.3 s
    above the simulated iteration) and sharded their static memory over 4 (394 GiB against a
    321 GiB peak), so the branch and bound dropped faster configurations from its count."""
    context = _context("mixtral-8x7b", 16)
    point = Point(
        schedule=schedule,
        pipeline=1,
        virtual=4,
        microbatch_size=2,
        n_microbatches=16,
        data_parallel=4,
        tensor=4,
        sequence_parallel=True,
        recompute="full",
        distributed_optimizer=True,
    )
    found = bound(context, point)
    simulated = evaluate_point(context, point)
    assert found is not None and simulated.reason is None
    assert found.step_ns <= simulated.makespan_ns + simulated.allreduce_ns
    assert found.memory_bytes <= simulated.peak_memory_bytes
    # one rank: no fill or drain, and the iteration's tail is exact, so the step bound is tight
    assert found.step_ns == simulated.makespan_ns + simulated.allreduce_ns


def _fields(context: SweepContext) -> dict[str, object]:
    return {f: getattr(context, f) for f in SweepContext.__dataclass_fields__}


def test_bounds_are_tight_for_1f1b_by_hand() -> None:
    """1F1B with equal stages: (m + p - 1)(F + B) is both the bound and the makespan."""
    spec = ModelSpec(n_layers=6, hidden=256, n_heads=4, seq_length=128, vocab_size=1000)
    acc = get_accelerator("h100-sxm")
    context = SweepContext(
        workload=workload_from_model(spec),
        accelerator=acc,
        devices=4,
        memory_capacity_bytes=acc.memory_bytes,
    )
    point = Point(
        schedule="1f1b",
        pipeline=4,
        virtual=1,
        microbatch_size=1,
        n_microbatches=8,
        data_parallel=1,
    )
    found = bound(context, point)
    evaluation = evaluate_point(context, point)
    assert found is not None
    assert found.step_ns <= evaluation.makespan_ns + evaluation.allreduce_ns
    assert found.memory_bytes <= evaluation.peak_memory_bytes


def _is_row(line: str) -> bool:
    """A row of the plan's table: rank ... fits [pareto]."""
    words = line.split()
    return len(words) in (19, 20) and words[-1] in ("yes", "no", "*")


_FEW = ("1f1b", "interleaved-1f1b", "zb-h1", "zbv", "gpipe", "dualpipev")
_SWEEPS = [
    ("llama2-7b", 16, 128, {"microbatch_sizes": (1, 2), "virtual": (1, 2), "schedules": _FEW}),
    (
        "llama2-13b",
        32,
        256,
        {"microbatch_sizes": (1,), "virtual": (1, 2), "schedules": _FEW[:4]},
    ),
    ("llama2-70b", 64, 128, {"microbatch_sizes": (1, 2), "virtual": (1, 2), "tensor": (8,)}),
    # a mixture of experts: routed experts reduced, stepped and sharded over their own group
    ("mixtral-8x7b", 16, 128, {"expert_parallel": (1, 4)}),
]


@pytest.mark.slow
@pytest.mark.parametrize(("model", "devices", "global_batch", "dims"), _SWEEPS)
def test_pruned_plan_prints_the_exhaustive_plan(
    model: str, devices: int, global_batch: int, dims: dict[str, object]
) -> None:
    kwargs = dict(devices=devices, accelerator="h100-sxm", global_batch=global_batch, workers=1)
    pruned = plan(model, prune=True, **kwargs, **dims)  # type: ignore[arg-type]
    every = plan(model, prune=False, **kwargs, **dims)  # type: ignore[arg-type]
    assert pruned.best == every.best
    table, full = format_table(pruned).splitlines(), format_table(every).splitlines()
    # the rows (top table and Pareto front) and the winner's lines are identical, but a
    # Pareto row slower than a pruned configuration has an unknown rank ("?"); the
    # header's counts and the list of what was not simulated say what was pruned
    rows = [line.split() for line in full if _is_row(line)]
    mine = [line.split() for line in table if _is_row(line)]
    assert len(rows) > 2 and len(rows) == len(mine)
    for row, other in zip(rows, mine, strict=True):
        assert other == row or (other[0] == "?" and other[1:] == row[1:] and int(row[0]) > 15)
    assert (
        full[full.index(next(x for x in full if x.startswith("winner:"))) :]
        == table[table.index(next(x for x in table if x.startswith("winner:"))) :]
    )
    # every point simulated by both reads the same; a pruned one provably cannot
    # enter the table: it does not fit, or is no faster than its bound says
    exhaustive = {p.label(): p for p in every.points}
    for point in pruned.points:
        other = exhaustive.get(point.label())
        if other is None:  # a twin the exhaustive plan dropped
            continue
        if point.feasible:
            assert point.step_time_ns == other.step_time_ns
            assert point.peak_memory_bytes == other.peak_memory_bytes
            assert point.pareto == other.pareto
            assert point.rank in (None, other.rank)
        elif (point.reason or "").startswith("pruned:"):
            # outside the table: it does not fit, or the HTML report's 15 come first
            assert other.rank is None or other.rank > 15
            assert other.peak_memory_bytes is None or other.rank is not None or (not other.fits)
    assert pruned.n_pruned == sum((p.reason or "").startswith("pruned:") for p in pruned.points)


def test_pruning_on_a_dask_cluster_is_refused_before_any_work() -> None:
    """The branch and bound runs its batches on local processes; with a cluster it would
    start one per batch, so it says so instead (nothing is connected to: no address is
    reachable here)."""
    from pipesim.errors import PlanError

    with pytest.raises(PlanError, match=r"cluster='tcp://nowhere:1'.*drop prune"):
        plan(
            "llama2-7b",
            devices=8,
            accelerator="h100-sxm",
            global_batch=8,
            prune=True,
            cluster="tcp://nowhere:1",
        )


def test_the_branch_and_bound_drops_the_twins_the_plan_drops() -> None:
    """Worked by hand: four fitting points with one fingerprint; interleaved-1f1b at v=1
    is a twin of 1f1b (the plan keeps 1f1b), a point with another expert-parallel size
    or expert tensor split is not (the branch and bound's own key once left both out)."""
    from dataclasses import replace

    from pipesim.plan.point import Evaluation
    from pipesim.plan.prune import _distinct
    from pipesim.plan.result import to_plan_point
    from pipesim.plan.scoring import _dedupe

    base = Point(
        schedule="1f1b",
        pipeline=2,
        virtual=1,
        microbatch_size=1,
        n_microbatches=8,
        data_parallel=2,
        expert_parallel=2,
    )
    points = [
        replace(base, schedule="interleaved-1f1b"),
        base,
        replace(base, expert_parallel=4),
        replace(base, expert_tensor=2),
    ]
    results: list[Evaluation | None] = [
        Evaluation(makespan_ns=10 + i, peak_memory_bytes=5, fingerprint="same")
        for i in range(len(points))
    ]
    kept = _distinct(points, results, usable=10)
    assert [points[k.index].schedule for k in kept] == ["1f1b", "1f1b", "1f1b"]
    assert [k.index for k in kept] == [1, 2, 3]
    plan_points = [replace(to_plan_point(p), step_time_ns=1) for p in points]
    listed, dropped = _dedupe(plan_points, ["same"] * len(points))
    assert dropped == 1 and listed == plan_points[1:]
