"""One configuration evaluated: its schedule generated (a
:class:`~pipesim.errors.ScheduleError` is the point's infeasibility reason), its stages
priced (:mod:`pipesim.plan.stage_costs`), one step simulated with the fast evaluator
(:mod:`pipesim.plan.onepass`, :mod:`pipesim.plan.fastsim`: identical to the SimPy engine,
which ``engine="simpy"`` uses instead), and the memory and iteration around it on each
rank (:mod:`pipesim.plan.ranks`).
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import replace
from typing import Any

from pipesim.costs import CostModel, Link
from pipesim.engine import simulate
from pipesim.errors import PipesimError, ScheduleError
from pipesim.metrics import Metrics
from pipesim.plan import ranks, splice, stage_costs
from pipesim.plan.cost_aware import get_cost_aware
from pipesim.plan.fastsim import compile_schedule, evaluate, metrics_of
from pipesim.plan.onepass import quick_step
from pipesim.plan.overlap import overlap_partners
from pipesim.plan.point import Evaluation, Point, SweepContext
from pipesim.plan.ranks import rank_iterations, rank_loads, sharded_static_bytes
from pipesim.plan.stage_costs import (
    StageTable,
    pipeline_ranks_per_node,
    stage_sizes,
    stage_table,
)
from pipesim.plan.steady import Pattern, find_pattern, work_keys
from pipesim.plan.workload import Workload
from pipesim.schedule import Schedule
from pipesim.schedules import generate, get_spec
from pipesim.step.structure import StepStructure

__all__ = [
    "build_configuration",
    "evaluate_point",
    "pipeline_comm_ns",
    "point_workload",
    "use_context",
]


# -- per-process caches (a worker keeps them for its lifetime) ---------------------------
_CONTEXT: SweepContext | None = None
_SCHEDULES: dict[tuple[str, int, int, int], tuple[Schedule, str] | str] = {}
_WORKLOADS: dict[tuple[int, bool, str, int, int, int], Workload] = {}
_SIMULATED: dict[tuple[int, int, int], tuple[Schedule, CostModel, Metrics]] = {}
_MAX_SCHEDULES = 64
_PATTERNS: dict[int, tuple[Schedule, Pattern | None]] = {}  # by id(schedule)
_STRUCTURES: dict[int, tuple[Schedule, StepStructure]] = {}  # by id(schedule)
_STEADY = [True]  # extrapolate steady states (pipesim.plan.steady); PIPESIM_STEADY=0: no
_LAST_COST_AWARE: list[Schedule] = []  # the last schedule built from the costs


def use_context(context: SweepContext, /) -> None:
    """Evaluate with ``context`` in this process: the caches are kept while it stays the
    same object and cleared when another comes."""
    if _CONTEXT is not context:
        _install(context)


def _install(context: SweepContext) -> None:
    global _CONTEXT
    _CONTEXT = context
    _SCHEDULES.clear()
    _WORKLOADS.clear()
    stage_costs.clear_caches()
    ranks.clear_caches()
    _SIMULATED.clear()
    _PATTERNS.clear()
    _STRUCTURES.clear()
    # a switch for measuring what the extrapolation saves (benchmarks/bench_plan.py):
    # both ways give identical results
    _STEADY[0] = os.environ.get("PIPESIM_STEADY", "1") != "0"


def _fingerprint(
    schedule: Schedule,
    keys: list[list[int]] | None,
    pattern: Pattern | None,
    *,
    form: tuple[object, ...] | None = None,
) -> str:
    """A digest of the per-rank orders, equal across processes for equal schedules:
    actions by their keys (``keys``, :func:`pipesim.plan.steady.work_keys`; ints,
    whose hashes, unlike strings', are not salted per process), by their run
    (``pattern``, :func:`pipesim.plan.splice.order_form`, or that ``form`` given) where
    they have one, overlapped works of more than two parts (no ``keys``) by their text."""
    digest = hashlib.blake2b(digest_size=12)
    if form is None and keys is not None and pattern is not None:
        form = splice.order_form(keys, schedule.n_microbatches, schedule.n_stages, pattern)
    if form is not None:
        digest.update(repr(("run", hash(form))).encode())
    elif keys is not None:
        digest.update(repr(hash(tuple(map(tuple, keys)))).encode())
    else:
        digest.update(repr(tuple(tuple(map(str, order)) for order in schedule.orders)).encode())
    digest.update(repr((schedule.placement, schedule.n_copies)).encode())
    digest.update(" ".join(f"{a}<{b}" for a, b in schedule.happens_before).encode())
    return digest.hexdigest()


def _schedule(point: Point) -> tuple[Schedule, str] | str:
    key = (point.schedule, point.pipeline, point.n_microbatches, point.virtual)
    found = _SCHEDULES.get(key)
    if found is None:
        try:
            found = _spliced(point) or _generated(point)
        except ScheduleError as exc:
            found = f"schedule rule: {exc}"
        if len(_SCHEDULES) >= _MAX_SCHEDULES:
            _SCHEDULES.pop(next(iter(_SCHEDULES)))
        _SCHEDULES[key] = found
    return found


def _generated(point: Point) -> tuple[Schedule, str]:
    sizes = (point.schedule, point.pipeline, point.virtual, point.n_microbatches)
    try:
        schedule = generate(
            point.schedule,
            n_ranks=point.pipeline,
            n_microbatches=point.n_microbatches,
            virtual=point.virtual,
        )
    except ScheduleError:
        splice.note_generated(*sizes, None)
        raise
    keys = work_keys(schedule)
    pattern = None if keys is None else find_pattern(schedule, keys=keys)
    splice.note_generated(*sizes, (schedule, keys, pattern))
    _remember_pattern(schedule, pattern)
    return schedule, _fingerprint(schedule, keys, pattern)


def _spliced(point: Point) -> tuple[Schedule, str] | None:
    """A shorter schedule of the family that stands in for ``point``'s (its base,
    :mod:`pipesim.plan.splice`; ``_simulate`` prices the longer one from it), or None."""
    m = point.n_microbatches
    if not (_STEADY[0] and _CONTEXT is not None and _CONTEXT.engine != "simpy"):
        return None
    if not splice.spliced(point.schedule, point.pipeline, point.virtual, m):
        return None
    base = splice.base_instance(point.schedule, point.pipeline, point.virtual, m)
    if base is None:
        return None
    periods = (m - base.schedule.n_microbatches) // base.pattern.shift
    form = splice.instance_form(base, periods)
    return base.schedule, _fingerprint(base.schedule, base.keys, base.pattern, form=form)


def point_workload(context: SweepContext, point: Point) -> Workload:
    """:meth:`SweepContext.workload_for`, once per sharding in this process."""
    found = _WORKLOADS.get(point.sharding)
    if found is None:
        found = _WORKLOADS[point.sharding] = context.workload_for(point)
    return found


def evaluate_point(context: SweepContext, point: Point, /) -> Evaluation:
    """Simulate one configuration (the model: this module's docstring, and
    :mod:`pipesim.plan.stage_costs`' and :mod:`pipesim.plan.ranks`')."""
    use_context(context)
    cost_aware = get_cost_aware(point.schedule)  # built after the costs (synthesized)
    schedule: Schedule | None = None
    fingerprint = ""
    if cost_aware is None:
        # a model cut into more stages than it has layers is refused before the (costly)
        # schedule is built: the registry's schedules have p v stages, n_copies copies
        too_many = stage_sizes(
            context,
            point_workload(context, point),
            point.pipeline * point.virtual // get_spec(point.schedule).n_copies,
        )
        if isinstance(too_many, str):
            return Evaluation(reason=too_many)
        generated = _schedule(point)
        if isinstance(generated, str):
            return Evaluation(reason=generated)
        schedule, fingerprint = generated
    n_stages = point.pipeline * point.virtual if schedule is None else schedule.n_stages
    n_copies = 1 if schedule is None else schedule.n_copies
    workload = point_workload(context, point)
    # DualPipe keeps n_copies copies of the model: each copy is the whole model.
    sizes = stage_sizes(context, workload, n_stages // n_copies)
    if isinstance(sizes, str):
        return Evaluation(reason=sizes)
    table = stage_table(
        context,
        workload,
        sizes,
        point.microbatch_size,
        pipeline_ranks_per_node(context, point),
        n_copies,
        _partners(workload, schedule, fingerprint),
    )
    if schedule is None:
        assert cost_aware is not None
        built = _build_cost_aware(context, point, table, cost_aware)
        if isinstance(built, str):
            return Evaluation(reason=built)
        schedule = built
    metrics = _simulate(context, schedule, table.costs, point)
    loads = rank_loads(context, point, schedule, table, metrics)
    after = rank_iterations(
        context,
        workload,
        point,
        schedule.placement,
        table.costs,
        loads.rank_params,
        loads.first_stage,
        loads.rank_experts,
    )
    worst = max(range(len(after)), key=lambda r: after[r].dp_exposed_ns + after[r].optimizer_ns)
    # integer nanoseconds in, integer out; a cost file's link bandwidth can make a
    # message's occupancy a fraction of a nanosecond
    makespan = metrics.makespan if isinstance(metrics.makespan, int) else round(metrics.makespan)
    return Evaluation(
        n_stages=n_stages,
        layers_per_stage=sizes,
        makespan_ns=makespan,
        tp_comm_ns=loads.tp_ns,
        dp_comm_ns=max(x.dp_comm_ns for x in after),
        dp_exposed_ns=after[worst].dp_exposed_ns,
        optimizer_ns=after[worst].optimizer_ns,
        allreduce_ns=after[worst].dp_exposed_ns + after[worst].optimizer_ns,
        bubble=metrics.bubble_ratio,
        peak_memory_bytes=loads.peak_bytes,
        static_bytes=loads.static_bytes,
        activation_bytes=loads.activation_bytes,
        fingerprint=fingerprint,
    )


_PARTNERS: dict[str, tuple[int, ...] | None] = {}


def _partners(
    workload: Workload, schedule: Schedule | None, fingerprint: str
) -> tuple[int, ...] | None:
    """The overlapped pairs of ``schedule`` whose durations a model with expert layers
    derives from their parts; None for a dense model (a pair is the sum of its parts,
    as without this rule), a cost file, or a schedule made from the costs."""
    spec = workload.spec
    if schedule is None or spec is None or spec.moe is None or workload.measured is not None:
        return None
    found = _PARTNERS.get(fingerprint, ())
    if found == ():
        if len(_PARTNERS) >= _MAX_SCHEDULES:
            _PARTNERS.clear()
        found = _PARTNERS[fingerprint] = overlap_partners(schedule)
    return found


def _build_cost_aware(
    context: SweepContext, point: Point, table: StageTable, cost_aware: Any
) -> Schedule | str:
    """A schedule made from the costs (pipesim.plan.cost_aware), within the memory that
    weights, gradients, optimizer state and any recomputation transient leave."""
    experts = table.expert_params or [0] * len(table.params)
    static = [
        sharded_static_bytes(context, point, params, expert) + transient
        for params, expert, transient in zip(table.params, experts, table.transient, strict=True)
    ]
    # looped placement: rank r holds stages r, p + r, 2p + r, ...
    most_static = max(
        sum(static[point.pipeline * c + r] for c in range(point.virtual))
        for r in range(point.pipeline)
    )
    if most_static >= context.memory_capacity_bytes:
        return (
            f"weights, gradients and optimizer state ({most_static:,} bytes) leave no memory "
            f"for activations on a {context.memory_capacity_bytes:,}-byte device"
        )
    try:
        schedule: Schedule = cost_aware.build()(
            n_ranks=point.pipeline,
            n_microbatches=point.n_microbatches,
            virtual=point.virtual,
            costs=table.costs,
            memory_limit_bytes=context.memory_capacity_bytes - most_static,
        )
    except PipesimError as exc:
        return f"refused: {exc}"
    _LAST_COST_AWARE[:] = [schedule]
    return schedule


def _simulate(
    context: SweepContext, schedule: Schedule, costs: CostModel, point: Point | None = None
) -> Metrics:
    """The step's metrics; ``point``'s longer schedule where ``schedule`` is its base
    (:func:`_spliced`)."""
    m = schedule.n_microbatches if point is None else point.n_microbatches
    # Points that differ only in the optimizer's sharding come one after the other and
    # share the cached schedule and cost objects: simulate them once.
    key = (id(schedule), id(costs), m)
    found = _SIMULATED.get(key)
    if found is not None and found[0] is schedule and found[1] is costs:
        return found[2]
    if point is not None and m != schedule.n_microbatches:
        metrics = _extrapolated(schedule, costs, point)
    elif context.engine == "simpy":
        metrics = simulate(schedule, costs=costs, check=False).metrics
    else:
        step = quick_step(schedule, costs, pattern=_pattern(schedule))
        if step is None:  # overlapped works (DualPipe): the compiled path
            step = evaluate(_compiled(schedule), costs)
        metrics = metrics_of(schedule, costs, step)
    _SIMULATED.clear()
    _SIMULATED[key] = (schedule, costs, metrics)
    return metrics


def _extrapolated(base: Schedule, costs: CostModel, point: Point) -> Metrics:
    """``point``'s metrics from its schedule's ``base`` (:mod:`pipesim.plan.splice`); where
    no shorter instance repeats, from its whole schedule, built from the base."""
    m = point.n_microbatches
    step = splice.extrapolated_step(point.schedule, point.pipeline, point.virtual, m, costs)
    if step is None:  # evaluated whole, from its base's orders spliced
        built = splice.spliced_schedule(point.schedule, point.pipeline, point.virtual, m)
        assert built is not None, "a spliced point has a base"
        full, run = built
        step = quick_step(full, costs, pattern=run)
    assert step is not None, "a spliced family's schedules are of simple actions"
    # the base's metrics but for the micro-batch count: the rest is the step's or the same
    return replace(metrics_of(base, costs, step), n_microbatches=m)


def _compiled(schedule: Schedule) -> StepStructure:
    """The schedule's compiled structure (cost-independent: built once per schedule; the
    few latest kept, as each holds every action)."""
    found = _STRUCTURES.get(id(schedule))
    if found is None or found[0] is not schedule:
        if len(_STRUCTURES) >= 4:
            _STRUCTURES.pop(next(iter(_STRUCTURES)))
        found = _STRUCTURES[id(schedule)] = (schedule, compile_schedule(schedule))
    return found[1]


def _pattern(schedule: Schedule) -> Pattern | None:
    """The schedule's repeating run (cost-independent: found once per schedule)."""
    if not _STEADY[0]:
        return None
    found = _PATTERNS.get(id(schedule))
    if found is None or found[0] is not schedule:
        return _remember_pattern(schedule, find_pattern(schedule))
    return found[1]


def _remember_pattern(schedule: Schedule, pattern: Pattern | None) -> Pattern | None:
    if len(_PATTERNS) >= _MAX_SCHEDULES:
        _PATTERNS.pop(next(iter(_PATTERNS)))
    used = pattern if _STEADY[0] else None
    _PATTERNS[id(schedule)] = (schedule, used)
    return used


def build_configuration(context: SweepContext, point: Point, /) -> tuple[Schedule, CostModel]:
    """The schedule and cost model (integer nanoseconds) that ``point`` is simulated with,
    e.g. to simulate it with the SimPy engine or plot it; ScheduleError if refused."""
    _install(context)  # fresh caches for this context
    if get_cost_aware(point.schedule) is not None:  # made from the costs: evaluate builds it
        evaluated = evaluate_point(context, point)
        if evaluated.reason is not None:
            raise ScheduleError(evaluated.reason)
        schedule = _LAST_COST_AWARE[0]
    else:
        schedule = generate(
            point.schedule,
            n_ranks=point.pipeline,
            n_microbatches=point.n_microbatches,
            virtual=point.virtual,
        )
    workload = point_workload(context, point)
    sizes = stage_sizes(context, workload, schedule.n_stages // schedule.n_copies)
    if isinstance(sizes, str):
        raise ScheduleError(sizes)
    table = stage_table(
        context,
        workload,
        sizes,
        point.microbatch_size,
        pipeline_ranks_per_node(context, point),
        schedule.n_copies,
        _partners(workload, schedule, _build_fingerprint(schedule)),
    )
    # the static memory of this point (the table's param_bytes assume no sharding)
    experts = table.expert_params or [0] * len(table.params)
    stages = tuple(
        replace(cost, param_bytes=sharded_static_bytes(context, point, params, expert))
        for cost, params, expert in zip(table.costs.stages, table.params, experts, strict=True)
    )
    return schedule, replace(table.costs, stages=stages)


def _build_fingerprint(schedule: Schedule) -> str:
    keys = work_keys(schedule)
    return _fingerprint(schedule, keys, None if keys is None else find_pattern(schedule, keys=keys))


def pipeline_comm_ns(context: SweepContext, point: Point, /, *, makespan_ns: int) -> int:
    """How much longer ``point``'s pipeline is for its sends between stages: its
    ``makespan_ns`` (as the sweep simulated it) less the same schedule's with free links
    (one more simulation)."""
    schedule, costs = build_configuration(context, point)
    ideal = _simulate(context, schedule, replace(costs, link=Link(), links=None)).makespan
    return max(0, makespan_ns - round(ideal))
