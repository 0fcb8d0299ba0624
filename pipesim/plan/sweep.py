"""Evaluating sweep points: one configuration -> step time and memory, on all cores.

A point is ``(schedule, pipeline degree p, virtual v, tensor parallel t,
sequence parallel, recomputation, distributed optimizer, micro-batch size b,
micro-batches m, data parallel d)``. Evaluating it generates the schedule from
the registry (a :class:`~pipesim.errors.ScheduleError` is the point's
infeasibility reason), cuts the workload of that t / recomputation into the
schedule's stages (:mod:`pipesim.partition`), builds an exact cost model
in integer nanoseconds (a cost file's stages at the point's micro-batch size,
with the file's link and overheads: :mod:`pipesim.plan.measured`), and
simulates one step with the fast evaluator (:mod:`pipesim.plan.fastsim`,
identical to the SimPy engine, which ``engine="simpy"`` uses instead).

Hardware model (documented assumptions):

- Each layer's F, I and W at the point's micro-batch size is the sum of its kernels
  (:mod:`pipesim.plan.kernels`) priced on the accelerator (:mod:`pipesim.plan.gpu`):
  GEMMs by shape, fused attention, memory-bound kernels by bytes, and the tensor- and
  context-parallel collectives that are not hidden. One model prices every point.
- Devices are ordered as Megatron-Core orders its groups (tensor parallel innermost,
  then context, data and pipeline parallel: ``megatron/core/parallel_state.py``,
  order "tp-cp-dp-pp"). A group stays in a node when it fits there; consecutive
  pipeline ranks (blocks of t c d devices) share a node g / (t c d) at a time; a hop
  inside a node takes the intra-node link, a hop between nodes the inter-node link
  (links per rank pair, :class:`pipesim.costs.Links`), each at NCCL's measured bus
  bandwidth.
- Data-parallel gradient traffic (over the d c devices that hold the same weights),
  its overlap and the optimizer step follow :mod:`pipesim.plan.iteration`; they come
  after the pipeline.
- Full recomputation re-creates one block's activations at a time in the
  backward: the largest such transient on a rank is added to its peak.

Workers: a backend (:mod:`pipesim.plan.backends`: a local process pool, or a Dask
cluster) evaluates chunks of points; every wait has a deadline, and a sweep
stopped by its deadline or by Ctrl-C stops its workers at once and
returns what was evaluated (unevaluated points carry ``stopped=True``).
"""

from __future__ import annotations

import hashlib
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, fields, replace
from fractions import Fraction
from typing import Any

from pipesim.costs import CostModel, Link
from pipesim.engine import simulate
from pipesim.errors import PipesimError, PlanError, ScheduleError
from pipesim.metrics import Metrics
from pipesim.plan.backends import Backend, LostChunk, open_backend
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
from pipesim.plan.result import PlanPoint
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

__all__ = [
    "Evaluation",
    "Point",
    "SweepContext",
    "build_configuration",
    "evaluate_point",
    "evaluate_points",
    "pipeline_comm_ns",
]


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


def _evaluate_chunk(
    chunk: list[tuple[int, Point]], context: SweepContext | None = None
) -> list[tuple[int, Evaluation]]:
    ctx = context if context is not None else _CONTEXT
    assert ctx is not None, "worker started without a sweep context"
    out = []
    for index, point in chunk:
        try:
            out.append((index, evaluate_point(ctx, point)))
        except PipesimError as exc:  # a generator or cost check refused this point
            out.append((index, Evaluation(reason=f"refused: {exc}")))
    return out


def _cost_estimate(point: Point) -> int:
    return point.pipeline * point.virtual * point.n_microbatches


def evaluate_points(
    context: SweepContext,
    points: Sequence[Point],
    /,
    *,
    workers: int | None = None,
    timeout_s: float = 600.0,
    progress: Callable[[int, int], None] | None = None,
    partial: bool = False,
    cluster: str | None = None,
) -> list[Evaluation]:
    """Evaluate ``points`` (in order) on ``workers`` processes (default: every core), or on
    a Dask ``cluster``: a scheduler's address (``tcp://HOST:8786``, its own workers) or
    ``local`` (a ``distributed.LocalCluster`` of ``workers`` processes); the results are
    the same (:mod:`pipesim.plan.backends`).

    ``progress(done, total)`` is called as results come in. A sweep that is not
    done after ``timeout_s`` seconds, or is interrupted (KeyboardInterrupt),
    terminates its workers at once; then with ``partial`` the points not yet
    evaluated come back as ``Evaluation(stopped=True)`` (their ``reason`` says
    why), without it a timeout raises PlanError and an interrupt propagates.

    >>> from pipesim.plan.hardware import get_accelerator
    >>> from pipesim.plan.model import ModelSpec
    >>> from pipesim.plan.workload import workload_from_model
    >>> spec = ModelSpec(n_layers=4, hidden=256, n_heads=4, seq_length=128, vocab_size=1000)
    >>> ctx = SweepContext(workload=workload_from_model(spec), devices=2,
    ...                    accelerator=get_accelerator("h100-sxm"), memory_capacity_bytes=10**10)
    >>> point = Point(schedule="1f1b", pipeline=2, virtual=1, microbatch_size=1,
    ...               n_microbatches=4, data_parallel=1)
    >>> [e.layers_per_stage for e in evaluate_points(ctx, [point], workers=1)]
    [(3, 3)]
    """
    total = len(points)
    if cluster not in (None, "local") and workers is not None:
        raise PlanError(
            f"workers={workers} (--workers) sizes --cluster local; the workers of the "
            f"scheduler at {cluster} are those started there (`dask worker {cluster}`): "
            "drop --workers"
        )
    workers = _check_workers(workers, timeout_s)
    stop = _Stopping(
        deadline=time.monotonic() + timeout_s,
        timeout_s=timeout_s,
        partial=partial,
        progress=progress,
    )
    # Cheapest first: results (and the progress bar) come from the first second, and a
    # sweep stopped early has ranked the many small configurations, not a few huge ones.
    indexed = sorted(enumerate(points), key=lambda item: _cost_estimate(item[1]))
    results: list[Evaluation | None] = [None] * total
    if progress is not None:
        progress(0, total)  # the bar shows from the first moment
    if cluster is None:
        workers = min(workers, max(1, total // 8))
        if workers == 1:
            return _evaluate_here(context, indexed, results, stop)
    return _evaluate_in_workers(context, indexed, results, stop, workers, cluster)


def _check_workers(workers: int | None, timeout_s: float) -> int:
    """The number of worker processes (None: every core); PlanError unless it is a whole
    number >= 1 and the timeout is positive."""
    if workers is None:
        workers = os.cpu_count() or 1
    if isinstance(workers, bool) or not isinstance(workers, int) or workers < 1:
        raise PlanError(f"workers must be a whole number >= 1, got {workers!r}")
    if timeout_s <= 0:
        raise PlanError(f"timeout must be positive, got {timeout_s!r} seconds")
    return workers


@dataclass(frozen=True, slots=True, kw_only=True)
class _Stopping:
    """When a sweep stops early, what it returns then, and whom it tells its progress."""

    deadline: float
    """``time.monotonic()`` past which the sweep stops."""
    timeout_s: float
    partial: bool
    """On a stop: return the points not evaluated as stopped (else raise)."""
    progress: Callable[[int, int], None] | None


def _stopped_early(results: list[Evaluation | None], why: str) -> list[Evaluation]:
    """``results`` with every point not evaluated marked as stopped for ``why``."""
    note = Evaluation(stopped=True, reason=f"not evaluated: {why}")
    return [note if r is None else r for r in results]


def _evaluate_here(
    context: SweepContext,
    indexed: list[tuple[int, Point]],
    results: list[Evaluation | None],
    stop: _Stopping,
) -> list[Evaluation]:
    """Evaluate the points in this process, one at a time, into ``results``."""
    total = len(results)
    deadline, progress = stop.deadline, stop.progress
    done = 0
    try:
        for item in indexed:
            if time.monotonic() > deadline:
                if stop.partial:
                    return _stopped_early(
                        results, f"the sweep stopped at its {stop.timeout_s:g} s deadline"
                    )
                raise _timed_out(stop.timeout_s, done, total)
            for index, evaluation in _evaluate_chunk([item], context):
                results[index] = evaluation
            done += 1
            if progress is not None:
                progress(done, total)
    except KeyboardInterrupt:
        if not stop.partial:
            raise
        return _stopped_early(results, "the sweep was interrupted")
    return [r for r in results if r is not None]


def _evaluate_in_workers(
    context: SweepContext,
    indexed: list[tuple[int, Point]],
    results: list[Evaluation | None],
    stop: _Stopping,
    workers: int,
    cluster: str | None,
) -> list[Evaluation]:
    """Evaluate the points in chunks on a backend (:mod:`pipesim.plan.backends`): a pool
    of ``workers`` processes, or the Dask ``cluster``; into ``results``."""
    total = len(results)
    done = 0
    backend: Backend | None = None
    try:
        backend = open_backend(
            context,
            evaluate=_evaluate_chunk,
            workers=workers,
            cluster=cluster,
            deadline=stop.deadline,
        )
        chunk_size = max(1, min(16, total // (backend.workers * 32)))
        chunks = [indexed[k : k + chunk_size] for k in range(0, total, chunk_size)]
        lost: list[str] = []
        for chunk_results in backend.results(chunks, deadline=stop.deadline):
            if isinstance(chunk_results, LostChunk):
                chunk_results = _lost(chunk_results)
                lost.append(chunk_results[0][1].reason or "")
            for index, evaluation in chunk_results:
                results[index] = evaluation
            done += len(chunk_results)
            if stop.progress is not None:
                stop.progress(done, total)
        if lost and not stop.partial:
            raise PlanError("; ".join(r.removeprefix("not evaluated: ") for r in lost))
    except TimeoutError:
        if stop.partial:
            return _stopped_early(
                results, f"the sweep stopped at its {stop.timeout_s:g} s deadline"
            )
        raise _timed_out(stop.timeout_s, done, total) from None
    except KeyboardInterrupt:
        if not stop.partial:
            raise
        return _stopped_early(results, "the sweep was interrupted")
    finally:  # before any result is returned: nothing keeps running
        if backend is not None:
            backend.close()
    assert all(r is not None for r in results)
    return [r for r in results if r is not None]


def _lost(lost: LostChunk) -> list[tuple[int, Evaluation]]:
    """The points of a chunk that kept killing its workers, marked not evaluated, by name."""
    names = ", ".join(_name(point) for _, point in lost.chunk)
    note = Evaluation(stopped=True, reason=f"not evaluated: {names}: {lost.why}")
    return [(index, note) for index, _ in lost.chunk]


def _name(point: Point) -> str:
    """``point`` as the plan's tables name it (``1f1b t=8 p=4 v=1 d=2 b=1 m=8``)."""
    return PlanPoint(**{f.name: getattr(point, f.name) for f in fields(point)}).label()


def _timed_out(timeout_s: float, done: int, total: int) -> PlanError:
    return PlanError(
        f"the sweep did not finish within {timeout_s:g} s ({done} of {total} configurations "
        "done); narrow it (--stages, --microbatch-sizes, --virtual, --schedules) or raise "
        "--timeout"
    )
