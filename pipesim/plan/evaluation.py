"""One configuration evaluated: its schedule generated (a
:class:`~pipesim.errors.ScheduleError` is the point's infeasibility reason), its stages
priced (:mod:`pipesim.plan.stage_costs`), one step simulated with the fast evaluator
(:mod:`pipesim.plan.onepass`, :mod:`pipesim.plan.fastsim`: identical to the SimPy engine,
which ``engine="simpy"`` uses instead), and the memory and iteration around it.

- Data-parallel gradient traffic (over the d c devices that hold the same weights),
  its overlap and the optimizer step follow :mod:`pipesim.plan.iteration`; they come
  after the pipeline.
- Full recomputation re-creates one block's activations at a time in the
  backward: the largest such transient on a rank is added to its peak.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Sequence
from dataclasses import dataclass, replace
from fractions import Fraction
from typing import Any

from pipesim.costs import CostModel, Link
from pipesim.engine import simulate
from pipesim.errors import PipesimError, ScheduleError
from pipesim.metrics import Metrics
from pipesim.plan.cost_aware import get_cost_aware
from pipesim.plan.fastsim import compile_schedule, evaluate, metrics_of
from pipesim.plan.iteration import (
    RankIteration,
    embedding_sync_ns,
    rank_iteration,
    static_bytes,
)
from pipesim.plan.onepass import quick_step
from pipesim.plan.overlap import overlap_partners
from pipesim.plan.point import Evaluation, Point, SweepContext
from pipesim.plan.stage_costs import (
    _clear_caches,
    _partition,
    _pipeline_ranks_per_node,
    _stage_costs,
    _stage_sizes,
    _StageTable,
)
from pipesim.plan.steady import Pattern, action_keys, find_pattern
from pipesim.plan.workload import Workload
from pipesim.schedule import Schedule
from pipesim.schedules import generate, get_spec
from pipesim.step.structure import StepStructure

__all__ = ["build_configuration", "evaluate_point", "pipeline_comm_ns"]


# -- per-process caches (a worker keeps them for its lifetime) ---------------------------
_CONTEXT: SweepContext | None = None
_SCHEDULES: dict[tuple[str, int, int, int], tuple[Schedule, str] | str] = {}
_WORKLOADS: dict[tuple[int, bool, str, int, int, int], Workload] = {}
_SIMULATED: dict[tuple[int, int], tuple[Schedule, CostModel, Metrics]] = {}
_ITERATIONS: dict[tuple[Any, ...], RankIteration] = {}
_MAX_SCHEDULES = 64
_PATTERNS: dict[int, tuple[Schedule, Pattern | None]] = {}  # by id(schedule)
_STRUCTURES: dict[int, tuple[Schedule, StepStructure]] = {}  # by id(schedule)
_STEADY = [True]  # extrapolate steady states (pipesim.plan.steady); PIPESIM_STEADY=0: no
_LAST_COST_AWARE: list[Schedule] = []  # the last schedule built from the costs


def _install(context: SweepContext) -> None:
    global _CONTEXT
    _CONTEXT = context
    _SCHEDULES.clear()
    _WORKLOADS.clear()
    _clear_caches()
    _SIMULATED.clear()
    _ITERATIONS.clear()
    _PATTERNS.clear()
    _STRUCTURES.clear()
    # a switch for measuring what the extrapolation saves (benchmarks/bench_plan.py):
    # both ways give identical results
    _STEADY[0] = os.environ.get("PIPESIM_STEADY", "1") != "0"


def _fingerprint(schedule: Schedule, keys: list[list[int]] | None) -> str:
    """A digest of the per-rank orders, equal across processes for equal schedules:
    actions by their keys (``keys``, :func:`pipesim.plan.steady.action_keys`; ints,
    whose hashes, unlike strings', are not salted per process), overlapped works (no
    ``keys``) by their text."""
    digest = hashlib.blake2b(digest_size=12)
    if keys is not None:
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
            schedule = generate(
                point.schedule,
                n_ranks=point.pipeline,
                n_microbatches=point.n_microbatches,
                virtual=point.virtual,
            )
            keys = action_keys(schedule)
            found = (schedule, _fingerprint(schedule, keys))
            _remember_pattern(schedule, keys)
        except ScheduleError as exc:
            found = f"schedule rule: {exc}"
        if len(_SCHEDULES) >= _MAX_SCHEDULES:
            _SCHEDULES.pop(next(iter(_SCHEDULES)))
        _SCHEDULES[key] = found
    return found


def _workload(context: SweepContext, point: Point) -> Workload:
    key = (
        point.tensor,
        point.sequence_parallel and point.tensor > 1,
        point.recompute,
        point.context_parallel,
        point.expert_parallel,
        point.expert_tensor,
    )
    found = _WORKLOADS.get(key)
    if found is None:
        found = _WORKLOADS[key] = context.workload_for(point)
    return found


def evaluate_point(context: SweepContext, point: Point, /) -> Evaluation:
    """Simulate one configuration (see the module docstring for the model)."""
    if _CONTEXT is not context:
        _install(context)
    cost_aware = get_cost_aware(point.schedule)  # built after the costs (synthesized)
    schedule: Schedule | None = None
    fingerprint = ""
    if cost_aware is None:
        # a model cut into more stages than it has layers is refused before the (costly)
        # schedule is built: the registry's schedules have p v stages, n_copies copies
        too_many = _stage_sizes(
            context,
            _workload(context, point),
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
    workload = _workload(context, point)
    # DualPipe keeps n_copies copies of the model: each copy is the whole model.
    sizes = _stage_sizes(context, workload, n_stages // n_copies)
    if isinstance(sizes, str):
        return Evaluation(reason=sizes)
    table = _stage_costs(
        context,
        workload,
        sizes,
        point.microbatch_size,
        _pipeline_ranks_per_node(context, point),
        n_copies,
        _partners(workload, schedule, fingerprint),
    )
    if schedule is None:
        assert cost_aware is not None
        built = _build_cost_aware(context, point, table, cost_aware)
        if isinstance(built, str):
            return Evaluation(reason=built)
        schedule = built
    metrics = _simulate(context, schedule, table.costs)
    loads = _rank_loads(context, point, schedule, table, metrics)
    sync = _embedding_syncs(context, workload, point, schedule.placement)
    after = [
        _rank_iteration(
            context,
            workload,
            point,
            loads.rank_params[r],
            table.costs,
            first,
            expert_params=loads.rank_experts[r],
            embedding_sync=sync.get(r, 0),
        )
        for r, first in enumerate(loads.first_stage)
    ]
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


@dataclass(frozen=True, slots=True)
class _RankLoads:
    """Per rank what the schedule places on it, and the rank with the peak memory."""

    rank_params: list[int | Fraction]
    """Per rank: parameters of its stages."""
    rank_experts: list[int | Fraction]
    """Per rank: the routed experts' part of ``rank_params``."""
    first_stage: list[int | None]
    """Per rank: its first stage (None: it holds none)."""
    tp_ns: int
    """Tensor-parallel traffic of the busiest rank over the step."""
    peak_bytes: int
    """Largest over ranks of static memory + peak activations."""
    static_bytes: int
    """Static memory of the rank with the peak."""
    activation_bytes: int
    """Peak activations (with any recomputation transient) of the rank with the peak."""


def _rank_loads(
    context: SweepContext, point: Point, schedule: Schedule, table: _StageTable, metrics: Metrics
) -> _RankLoads:
    """Sum the stages' parameters, transients and tensor-parallel traffic onto the ranks
    that hold them, and find the rank with the most memory."""
    n_ranks = schedule.n_ranks
    rank_params: list[int | Fraction] = [0] * n_ranks
    rank_experts: list[int | Fraction] = [0] * n_ranks
    rank_transient = [0] * n_ranks
    rank_tp = [0] * n_ranks
    first_stage: list[int | None] = [None] * n_ranks
    for stage, rank in enumerate(schedule.placement):
        rank_params[rank] += table.params[stage]
        if table.expert_params is not None:
            rank_experts[rank] += table.expert_params[stage]
        rank_transient[rank] = max(rank_transient[rank], table.transient[stage])
        rank_tp[rank] += table.tp_ns[stage] * point.n_microbatches
        if first_stage[rank] is None:
            first_stage[rank] = stage
    static = [_static(context, point, rank_params[r], rank_experts[r]) for r in range(n_ranks)]
    activation = [r.peak_activation_bytes + rank_transient[r.rank] for r in metrics.ranks]
    peak, peak_rank = max((static[r] + activation[r], -r) for r in range(n_ranks))
    peak_rank = -peak_rank
    return _RankLoads(
        rank_params=rank_params,
        rank_experts=rank_experts,
        first_stage=first_stage,
        tp_ns=max(rank_tp),
        peak_bytes=peak,
        static_bytes=static[peak_rank],
        activation_bytes=activation[peak_rank],
    )


def _static(
    context: SweepContext, point: Point, params: int | Fraction, expert_params: int | Fraction
) -> int:
    """Weights, gradients and optimizer state of ``params`` on one device: the
    distributed optimizer shards them over the gradient group, and the routed experts'
    part over the expert-data-parallel group, the ``t c d / e`` devices that hold the
    same experts (Megatron-Core's expert data parallelism)."""

    def sharded(n: int | Fraction, group: int) -> int:
        return static_bytes(
            n,
            data_parallel=group,
            distributed_optimizer=point.distributed_optimizer,
            bytes_per_param=context.bytes_per_param,
            optimizer_bytes_per_param=context.optimizer_bytes_per_param,
        )

    if not expert_params:
        return sharded(params, point.gradient_group)
    edp = max(1, point.gradient_group * point.tensor // point.expert_devices)
    return sharded(params - expert_params, point.gradient_group) + sharded(expert_params, edp)


def _build_cost_aware(
    context: SweepContext, point: Point, table: _StageTable, cost_aware: Any
) -> Schedule | str:
    """A schedule made from the costs (pipesim.plan.cost_aware), within the memory that
    weights, gradients, optimizer state and any recomputation transient leave."""
    experts = table.expert_params or [0] * len(table.params)
    static = [
        _static(context, point, params, expert) + transient
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


def _simulate(context: SweepContext, schedule: Schedule, costs: CostModel) -> Metrics:
    # Points that differ only in the optimizer's sharding come one after the other and
    # share the cached schedule and cost objects: simulate them once.
    key = (id(schedule), id(costs))
    found = _SIMULATED.get(key)
    if found is not None and found[0] is schedule and found[1] is costs:
        return found[2]
    if context.engine == "simpy":
        metrics = simulate(schedule, costs=costs, check=False).metrics
    else:
        step = quick_step(schedule, costs, pattern=_pattern(schedule))
        if step is None:  # overlapped works (DualPipe): the compiled path
            step = evaluate(_compiled(schedule), costs)
        metrics = metrics_of(schedule, costs, step)
    _SIMULATED.clear()
    _SIMULATED[key] = (schedule, costs, metrics)
    return metrics


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
        return _remember_pattern(schedule, None)
    return found[1]


def _remember_pattern(schedule: Schedule, keys: list[list[int]] | None) -> Pattern | None:
    if len(_PATTERNS) >= _MAX_SCHEDULES:
        _PATTERNS.pop(next(iter(_PATTERNS)))
    pattern = find_pattern(schedule, keys=keys) if _STEADY[0] else None
    _PATTERNS[id(schedule)] = (schedule, pattern)
    return pattern


def _embedding_syncs(
    context: SweepContext, workload: Workload, point: Point, placement: Sequence[int]
) -> dict[int, int]:
    """Per end rank, the tied word-embedding gradient all-reduce after the pipeline
    (:func:`pipesim.plan.iteration.embedding_sync_ns`), for ``point``'s placement."""
    return embedding_sync_ns(
        workload.spec,
        placement,
        accelerator=context.accelerator,
        tensor=point.tensor,
        stage_devices=point.tensor * point.gradient_group,
    )


def _rank_iteration(
    context: SweepContext,
    workload: Workload,
    point: Point,
    params: int | Fraction,
    costs: CostModel,
    first_stage: int | None,
    *,
    expert_params: int | Fraction = 0,
    embedding_sync: int = 0,
) -> RankIteration:
    stage = costs.stage(first_stage if first_stage is not None else 0)
    # ranks of equal stages (most of a pipeline's middle) give the same answer
    key = (
        params,
        expert_params,
        point.expert_parallel,
        point.expert_tensor,
        point.tensor,
        point.gradient_group,
        point.distributed_optimizer,
        workload.grad_bytes_per_param,
        workload.weight_bytes_per_param,
        workload.step_bytes_per_param,
        stage.backward,
        stage.forward,
        embedding_sync,
    )
    found = _ITERATIONS.get(key)
    if found is not None:
        return found
    if len(_ITERATIONS) > 4096:
        _ITERATIONS.clear()
    found = _ITERATIONS[key] = rank_iteration(
        params,
        accelerator=context.accelerator,
        tensor=point.tensor,
        data_parallel=point.gradient_group,
        distributed_optimizer=point.distributed_optimizer,
        grad_bytes_per_param=workload.grad_bytes_per_param,
        weight_bytes_per_param=workload.weight_bytes_per_param or workload.grad_bytes_per_param,
        last_backward_ns=int(stage.backward),
        first_forward_ns=int(stage.forward),
        overlap=context.overlap_grad_reduce,
        expert_params=expert_params,
        expert_parallel=point.expert_parallel,
        expert_tensor=point.expert_tensor,
        step_bytes_per_param=workload.step_bytes_per_param,
        embedding_sync=embedding_sync,
    )
    return found


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
    workload = _workload(context, point)
    sizes = _partition(context, workload, schedule.n_stages // schedule.n_copies)
    table = _stage_costs(
        context,
        workload,
        sizes,
        point.microbatch_size,
        _pipeline_ranks_per_node(context, point),
        schedule.n_copies,
        _partners(workload, schedule, _fingerprint(schedule, action_keys(schedule))),
    )
    # the static memory of this point (the table's param_bytes assume no sharding)
    experts = table.expert_params or [0] * len(table.params)
    stages = tuple(
        replace(cost, param_bytes=_static(context, point, params, expert))
        for cost, params, expert in zip(table.costs.stages, table.params, experts, strict=True)
    )
    return schedule, replace(table.costs, stages=stages)


def pipeline_comm_ns(context: SweepContext, point: Point, /, *, makespan_ns: int) -> int:
    """How much longer ``point``'s pipeline is for its sends between stages: its
    ``makespan_ns`` (as the sweep simulated it) less the same schedule's with free links
    (one more simulation)."""
    schedule, costs = build_configuration(context, point)
    ideal = _simulate(context, schedule, replace(costs, link=Link(), links=None)).makespan
    return max(0, makespan_ns - round(ideal))
