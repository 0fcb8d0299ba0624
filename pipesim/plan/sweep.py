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
import itertools
import math
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, fields, replace
from fractions import Fraction
from typing import Any

from pipesim.costs import CostModel, Link, Links, StageCost
from pipesim.engine import simulate
from pipesim.errors import PipesimError, PlanError, ScheduleError
from pipesim.metrics import Metrics
from pipesim.nogc import sparse_gc
from pipesim.partition import partition
from pipesim.plan import splice
from pipesim.plan.backends import Backend, LostChunk, open_backend
from pipesim.plan.cost_aware import get_cost_aware
from pipesim.plan.fastsim import compile_schedule, evaluate, metrics_of
from pipesim.plan.gpu import LayerTime, layer_times, scatter_gather_seconds
from pipesim.plan.hardware import Accelerator, Interconnect
from pipesim.plan.iteration import (
    BYTES_PER_PARAM,
    OPTIMIZER_BYTES_PER_PARAM,
    RankIteration,
    embedding_sync_ns,
    rank_iteration,
    static_bytes,
)
from pipesim.plan.kernels import Shard
from pipesim.plan.measured import measured_stages
from pipesim.plan.onepass import quick_step
from pipesim.plan.overlap import overlap_partners, pair_seconds, pass_parts
from pipesim.plan.result import PlanPoint
from pipesim.plan.steady import Pattern, find_pattern, work_keys
from pipesim.plan.workload import Workload, workload_from_model
from pipesim.schedule import Schedule
from pipesim.schedules import generate, get_spec
from pipesim.step.structure import StepStructure
from pipesim.units import NS_PER_S

__all__ = [
    "Evaluation",
    "Point",
    "SweepContext",
    "build_configuration",
    "evaluate_point",
    "evaluate_points",
    "pipeline_comm_ns",
]


@dataclass(frozen=True, slots=True, kw_only=True)
class Point:
    """One configuration of the sweep."""

    schedule: str
    pipeline: int
    """Pipeline degree p: ranks per pipeline."""
    virtual: int
    """Stages per rank asked of the schedule."""
    microbatch_size: int
    n_microbatches: int
    data_parallel: int
    tensor: int = 1
    """Tensor-parallel size t."""
    sequence_parallel: bool = False
    recompute: str = "none"
    """Activation recomputation: none, selective or full."""
    distributed_optimizer: bool = False
    """Optimizer state sharded over the data-parallel replicas (ZeRO-1)."""
    context_parallel: int = 1
    """Context-parallel size c: each sequence split over c devices (ring attention)."""
    expert_parallel: int = 1
    """Expert-parallel size e: each expert layer's routed experts split over e devices
    (taken from the t c d devices that hold one pipeline stage, as Megatron-Core does)."""
    expert_tensor: int = 1
    """Expert tensor parallelism: each routed expert split over this many devices (an
    expert group spans e x this of the t c d devices)."""

    @property
    def gradient_group(self) -> int:
        """Devices that hold the same weights and reduce their gradients together: the
        data-parallel and context-parallel ranks (Megatron-Core's dp-cp group), over
        which the distributed optimizer also shards."""
        return self.data_parallel * self.context_parallel

    @property
    def expert_devices(self) -> int:
        """Devices one expert layer's routed experts are split over: e x expert tensor."""
        return self.expert_parallel * self.expert_tensor


@dataclass(frozen=True, slots=True, kw_only=True)
class SweepContext:
    """Everything a worker needs besides the points."""

    workload: Workload
    """The model at t = 1 without recomputation (other variants are derived from its
    ``spec``; a cost-file workload has only this one)."""
    accelerator: Accelerator
    devices: int
    bytes_per_param: int = BYTES_PER_PARAM
    """Weights + gradients + optimizer state per parameter without the distributed
    optimizer (:mod:`pipesim.plan.iteration`)."""
    optimizer_bytes_per_param: int = OPTIMIZER_BYTES_PER_PARAM
    """The part of ``bytes_per_param`` the distributed optimizer shards."""
    memory_capacity_bytes: int
    engine: str = "fast"
    """``fast`` (pipesim.plan.fastsim) or ``simpy`` (the reference engine)."""
    overlap_grad_reduce: bool = True
    """Hide data-parallel traffic behind the last backward / first forward."""
    tp_comm_overlap: bool = False
    """Hide tensor-parallel collectives under the GEMMs next to them (Megatron-LM's
    ``--tp-comm-overlap``, :mod:`pipesim.plan.gpu`)."""
    overlap_p2p: bool = False
    """Pipeline sends run beside compute (Megatron-Core's ``--overlap-p2p-communication``,
    torch.distributed.pipelining's isend); False, Megatron-LM's default: a rank waits for
    its send and receive to finish (``p2p_communication._communicate`` waits on every
    request before it returns), :attr:`pipesim.costs.CostModel.overlap_comm` false."""

    def workload_for(self, point: Point, /) -> Workload:
        """The workload of ``point``'s tensor parallelism and recomputation."""
        w = self.workload
        sp = point.sequence_parallel and point.tensor > 1
        key = (
            point.tensor,
            sp,
            point.recompute,
            point.context_parallel,
            point.expert_parallel,
            point.expert_tensor,
        )
        if key == (
            w.tensor,
            w.sequence_parallel,
            w.recompute,
            w.context,
            w.expert,
            w.expert_tensor,
        ):
            return w
        if w.spec is None:
            raise PlanError(
                f"{w.name} is a cost file: tensor parallelism and recomputation apply only to "
                "a model given by its shapes (a preset, a model file or --layers/--hidden/...)"
            )
        return workload_from_model(
            w.spec,
            tensor=point.tensor,
            sequence_parallel=sp,
            recompute=point.recompute,
            context=point.context_parallel,
            expert=point.expert_parallel,
            expert_tensor=point.expert_tensor,
        )


@dataclass(frozen=True, slots=True, kw_only=True)
class Evaluation:
    """A point's outcome: ``reason`` set when infeasible, else the numbers."""

    reason: str | None = None
    stopped: bool = False
    """Not evaluated: the sweep stopped (deadline or Ctrl-C) first."""
    n_stages: int = 0
    layers_per_stage: tuple[int, ...] = ()
    """Per stage of one model copy."""
    makespan_ns: int = 0
    """Pipeline time of one step (tensor-parallel traffic included in F / I)."""
    tp_comm_ns: int = 0
    """Tensor- and context-parallel communication not hidden, inside the pipeline time,
    on the busiest rank over the step."""
    dp_comm_ns: int = 0
    """Data-parallel traffic of the rank with the most (all of it, hidden or not)."""
    dp_exposed_ns: int = 0
    """Data-parallel traffic not hidden, added to the iteration (the largest of any rank)."""
    optimizer_ns: int = 0
    """Optimizer step (the largest of any rank)."""
    allreduce_ns: int = 0
    """What the iteration adds after the pipeline: exposed data-parallel traffic and
    optimizer step, the largest over ranks."""
    bubble: Fraction = Fraction(0)
    """Idle share of ranks x pipeline time (Metrics.bubble_ratio)."""
    peak_memory_bytes: int = 0
    """Largest over ranks of static (params + grads + optimizer) + peak activations."""
    static_bytes: int = 0
    """Static memory of the rank with the peak."""
    activation_bytes: int = 0
    """Peak activations (with any recomputation transient) of the rank with the peak."""
    fingerprint: str = ""
    """Digest of the generated schedule: equal for identical per-rank orders."""


# -- per-process caches (a worker keeps them for its lifetime) ---------------------------
_CONTEXT: SweepContext | None = None
_SCHEDULES: dict[tuple[str, int, int, int], tuple[Schedule, str] | str] = {}
_WORKLOADS: dict[tuple[int, bool, str, int, int, int], Workload] = {}
_LAYER_TIMES: dict[tuple[Any, ...], dict[str, LayerTime]] = {}
_PARTITIONS: dict[tuple[int, bool, str, int, int, int, int], tuple[int, ...]] = {}
_COSTS: dict[tuple[Any, ...], _StageTable] = {}
_SIMULATED: dict[tuple[int, int, int], tuple[Schedule, CostModel, Metrics]] = {}
_ITERATIONS: dict[tuple[Any, ...], RankIteration] = {}
_MAX_SCHEDULES = 64
_PATTERNS: dict[int, tuple[Schedule, Pattern | None]] = {}  # by id(schedule)
_STRUCTURES: dict[int, tuple[Schedule, StepStructure]] = {}  # by id(schedule)
_STEADY = [True]  # extrapolate steady states (pipesim.plan.steady); PIPESIM_STEADY=0: no
_LAST_COST_AWARE: list[Schedule] = []  # the last schedule built from the costs


@dataclass(frozen=True, slots=True)
class _StageTable:
    costs: CostModel
    params: list[int | Fraction]
    """Per stage."""
    transient: list[int]
    """Per stage: bytes re-created for one backward (full recomputation)."""
    tp_ns: list[int]
    """Per stage: tensor-parallel traffic of one micro-batch's F + backward."""
    expert_params: list[int | Fraction] | None = None
    """Per stage: the part of ``params`` that is routed experts (None: none)."""


def _install(context: SweepContext) -> None:
    global _CONTEXT
    _CONTEXT = context
    _SCHEDULES.clear()
    _WORKLOADS.clear()
    _LAYER_TIMES.clear()
    _PARTITIONS.clear()
    _COSTS.clear()
    _SIMULATED.clear()
    _PREFIXES.clear()
    _ITERATIONS.clear()
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


def _stage_costs(
    context: SweepContext,
    workload: Workload,
    sizes: tuple[int, ...],
    microbatch_size: int,
    ranks_per_node: int | None,
    n_copies: int,
    partners: tuple[int, ...] | None = None,
) -> _StageTable:
    """Cost model of the stages (integer ns) and what the iteration needs per stage;
    ``n_copies`` copies of the model's stages one after the other; pipeline ranks
    ``ranks_per_node`` to a node (None: the whole job in one node); ``partners``: per
    stage, the stage whose backward an overlapped F&B pair runs its forward with
    (:func:`pipesim.plan.overlap.overlap_partners`; None: no pairs priced apart)."""
    key = (
        *_shard_key(workload),
        sizes,
        microbatch_size,
        n_copies,
        ranks_per_node,
        partners,
    )
    found = _COSTS.get(key)
    if found is None:
        if workload.measured is None:
            found = _model_costs(
                context, workload, sizes, microbatch_size, ranks_per_node, n_copies, partners
            )
        else:
            found = _measured_costs(
                context, workload, sizes, microbatch_size, ranks_per_node, n_copies
            )
        _COSTS[key] = found
    return found


def _model_costs(
    context: SweepContext,
    workload: Workload,
    sizes: tuple[int, ...],
    microbatch_size: int,
    ranks_per_node: int | None,
    n_copies: int,
    partners: tuple[int, ...] | None = None,
) -> _StageTable:
    """The stages of a model given by its shapes: its layers' work on this accelerator,
    tensor-parallel traffic inside F and the backward, the accelerator's links, and
    overlapped F&B pairs priced from their parts (:mod:`pipesim.plan.overlap`)."""
    message_bytes = math.ceil(workload.message_bytes * microbatch_size)
    stages, params, transient, tp_ns = _model_stages(
        context, workload, sizes, microbatch_size, message_bytes
    )
    all_stages = tuple(stages) * n_copies
    if partners is not None:
        all_stages = _paired(context, workload, sizes, microbatch_size, all_stages, partners)
    gather = scatter_gather_seconds(
        message_bytes,
        context.accelerator,
        tensor=workload.tensor,
        sequence_parallel=workload.sequence_parallel,
    )
    intra, links = _stage_links(
        context.accelerator, message_bytes, ranks_per_node, receive_overhead=_ns(gather)
    )
    costs = CostModel(
        stages=all_stages,
        link=intra,
        links=links,
        memory_capacity_bytes=context.memory_capacity_bytes,
        time_unit="ns",  # the planner's durations are whole nanoseconds
        overlap_comm=context.overlap_p2p,
    )
    experts: list[int | Fraction] | None = None
    if workload.spec is not None and workload.spec.moe is not None:
        prefix = _prefix_sums(workload)["expert_params"]
        bounds = [0, *itertools.accumulate(sizes)]
        per_stage: list[int | Fraction] = [
            prefix[b] - prefix[a] for a, b in itertools.pairwise(bounds)
        ]
        experts = per_stage * n_copies
    return _StageTable(costs, params * n_copies, transient * n_copies, tp_ns * n_copies, experts)


def _model_stages(
    context: SweepContext,
    workload: Workload,
    sizes: tuple[int, ...],
    b: int,
    message_bytes: int,
) -> tuple[list[StageCost], list[int | Fraction], list[int], list[int]]:
    """Per stage of ``sizes`` layers at micro-batch size ``b``: its cost, parameters,
    recomputation transient and tensor-parallel traffic (ns)."""
    times = _layer_times(context, workload, b)
    stages = []
    params: list[int | Fraction] = []
    transient: list[int] = []
    tp_ns: list[int] = []
    prefix = _prefix_sums(workload)
    start = 0
    for size in sizes:
        layers = workload.layers[start : start + size]
        end = start + size
        kinds = [times[layer.name] for layer in layers]
        forward = _ns(sum(x.forward.total_s for x in kinds))
        input_grad = _ns(sum(x.input_grad.total_s for x in kinds))
        weight_grad = _ns(sum(x.weight_grad.total_s for x in kinds))
        exposed = _ns(
            sum(
                p.tp_exposed_s + p.cp_exposed_s
                for x in kinds
                for p in (x.forward, x.input_grad, x.weight_grad)
            )
        )
        stage_params, act, kept = (
            prefix[field][end] - prefix[field][start]
            for field in ("params", "activation_bytes", "weight_grad_bytes")
        )
        start = end
        stages.append(
            StageCost(
                forward=forward,
                backward=input_grad + weight_grad,
                input_grad=input_grad,
                weight_grad=weight_grad,
                activation_bytes=math.ceil(act * b),
                weight_grad_bytes=math.ceil(kept * b),
                output_bytes=message_bytes,
                param_bytes=math.ceil(stage_params * context.bytes_per_param),
            )
        )
        params.append(stage_params)
        transient.append(
            math.ceil(max((Fraction(x.transient_bytes) for x in layers), default=0) * b)
        )
        tp_ns.append(exposed)
    return stages, params, transient, tp_ns


def _paired(
    context: SweepContext,
    workload: Workload,
    sizes: tuple[int, ...],
    b: int,
    stages: tuple[StageCost, ...],
    partners: tuple[int, ...],
) -> tuple[StageCost, ...]:
    """``stages`` with the duration of each overlapped F&B pair derived from its parts
    (:func:`pipesim.plan.overlap.pair_seconds`): the forward of stage s with the backward
    of ``partners[s]``; a pair without all-to-all keeps the sum of its parts."""
    times = _layer_times(context, workload, b)
    bounds = [0, *itertools.accumulate(sizes)]
    kinds = [
        [times[layer.name] for layer in workload.layers[lo:hi]]
        for lo, hi in itertools.pairwise(bounds)
    ]
    forward = [pass_parts(x.forward for x in stage) for stage in kinds]
    backward = [
        pass_parts((x.input_grad for x in stage), deferrable=(x.weight_grad for x in stage))
        for stage in kinds
    ]
    copies = len(stages) // len(sizes)  # DualPipe's stages are the model's, twice
    forward, backward = forward * copies, backward * copies
    out = []
    for s, stage in enumerate(stages):
        partner = partners[s]
        if partner < 0:  # its forward is never overlapped
            out.append(stage)
            continue
        f, bw = forward[s], backward[partner]
        if f.all_to_all_s + bw.all_to_all_s == 0:  # nothing to hide: the sum of the parts
            out.append(stage)
            continue
        parts_sum = stage.forward + stages[partner].backward
        pair = pair_seconds(f, bw, sm_count=context.accelerator.sm_count)
        out.append(replace(stage, overlap=min(_ns(pair), parts_sum)))
    return tuple(out)


def _ns(seconds: float) -> int:
    """Seconds as whole nanoseconds: the planner's cost models are integer."""
    return round(seconds * NS_PER_S)


def _shard_key(workload: Workload) -> tuple[int, bool, str, int, int, int]:
    """How ``workload`` is sharded: what the per-variant caches below key on beside their
    own arguments."""
    return (
        workload.tensor,
        workload.sequence_parallel,
        workload.recompute,
        workload.context,
        workload.expert,
        workload.expert_tensor,
    )


def _layer_times(context: SweepContext, workload: Workload, b: int) -> dict[str, LayerTime]:
    """F, I and W of each layer kind of ``workload`` at micro-batch size ``b`` on the
    context's accelerator (:mod:`pipesim.plan.gpu`), priced once per variant."""
    assert workload.spec is not None
    key = (
        *_shard_key(workload),
        b,
    )
    found = _LAYER_TIMES.get(key)
    if found is None:
        shard = Shard(
            microbatch_size=b,
            tensor=workload.tensor,
            context=workload.context,
            sequence_parallel=workload.sequence_parallel,
            recompute=workload.recompute,
            expert=workload.expert,
            expert_tensor=workload.expert_tensor,
        )
        found = _LAYER_TIMES[key] = layer_times(
            workload.spec, shard, context.accelerator, tp_comm_overlap=context.tp_comm_overlap
        )
    return found


def _stage_links(
    accelerator: Accelerator,
    message_bytes: int,
    ranks_per_node: int | None,
    measured: Link | None = None,
    *,
    receive_overhead: int = 0,
) -> tuple[Link, Links | None]:
    """The link between pipeline ranks in a node, and the links per rank pair when the
    job spans nodes (None: it does not); a cost file's ``measured`` link, when it has
    one, is the link in a node and lends its host overheads to the one between nodes.
    ``receive_overhead``: what a receiver spends on each message it takes (the
    scatter/gather all-gather, :func:`pipesim.plan.gpu.scatter_gather_seconds`)."""
    intra = measured or replace(
        _link(accelerator.link(inter_node=False), message_bytes),
        receive_overhead=receive_overhead,
    )
    links = None
    if ranks_per_node is not None:
        inter = replace(
            _link(accelerator.link(inter_node=True), message_bytes),
            receive_overhead=receive_overhead,
        )
        if measured is not None:  # posting and taking a message cost the host the same
            inter = replace(
                inter,
                send_overhead=measured.send_overhead,
                receive_overhead=measured.receive_overhead,
            )
        links = Links(ranks_per_node=ranks_per_node, intra_node=intra, inter_node=inter)
    return intra, links


def _measured_costs(
    context: SweepContext,
    workload: Workload,
    sizes: tuple[int, ...],
    microbatch_size: int,
    ranks_per_node: int | None,
    n_copies: int,
) -> _StageTable:
    """The stages of a cost file at this micro-batch size, with the file's link and
    overheads (:mod:`pipesim.plan.measured`); static memory from its parameters."""
    assert workload.measured is not None
    stages, link, dispatch = measured_stages(
        workload.measured, sizes, microbatch_size, source=workload.name
    )
    prefix = _prefix_sums(workload)["params"]
    bounds = [0, *itertools.accumulate(sizes)]
    params: list[int | Fraction] = [prefix[b] - prefix[a] for a, b in itertools.pairwise(bounds)]
    stages = [
        replace(stage, param_bytes=math.ceil(p * context.bytes_per_param))
        for stage, p in zip(stages, params, strict=True)
    ]
    message_bytes = math.ceil(workload.message_bytes * microbatch_size)
    intra, links = _stage_links(context.accelerator, message_bytes, ranks_per_node, link)
    costs = CostModel(
        stages=tuple(stages) * n_copies,
        link=intra,
        links=links,
        dispatch_overhead=dispatch,
        memory_capacity_bytes=context.memory_capacity_bytes,
        time_unit="ns",  # a cost file's times, as plan reads them
    )
    n = len(sizes) * n_copies
    return _StageTable(costs, params * n_copies, [0] * n, [0] * n)


_SUMMED = (
    "activation_bytes",
    "weight_grad_bytes",
    "params",
    "expert_params",
)
_PREFIXES: dict[int, tuple[Workload, dict[str, list[Fraction]]]] = {}


def _prefix_sums(workload: Workload) -> dict[str, list[Fraction]]:
    """Running totals of each summed layer field: a stage's total is a difference."""
    found = _PREFIXES.get(id(workload))
    if found is not None and found[0] is workload:
        return found[1]
    sums = {}
    for field in _SUMMED:
        running = [Fraction(0)]
        for layer in workload.layers:
            running.append(running[-1] + getattr(layer, field))
        sums[field] = running
    _PREFIXES[id(workload)] = (workload, sums)
    return sums


def _partition(context: SweepContext, workload: Workload, per_copy: int) -> tuple[int, ...]:
    key = (
        *_shard_key(workload),
        per_copy,
    )
    sizes = _PARTITIONS.get(key)
    if sizes is None:
        work = [layer.work for layer in workload.layers]
        sizes = _PARTITIONS[key] = partition(work, n_stages=per_copy)
    return sizes


def _link(path: Interconnect, message_bytes: int) -> Link:
    """``path`` in integer nanoseconds for messages of ``message_bytes``: the latency and
    the occupancy are rounded to whole nanoseconds so that every time stays an integer."""
    latency = round(Fraction(repr(path.latency_s)) * NS_PER_S)
    occupancy = round(
        Fraction(message_bytes) * NS_PER_S / Fraction(repr(path.bandwidth_bytes_per_s))
    )
    return Link(
        latency=latency,
        bandwidth_bytes_per_s=Fraction(message_bytes, occupancy) if occupancy else None,
    )


def _pipeline_ranks_per_node(context: SweepContext, point: Point) -> int | None:
    """Pipeline ranks per node, devices ordered tp-dp-pp (each pipeline rank is a block
    of t d devices); None when the job fits one node."""
    g = context.accelerator.gpus_per_node
    if context.devices <= g:
        return None
    span = point.tensor * point.context_parallel * point.data_parallel
    return g // span if g % span == 0 else 1


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
    metrics = _simulate(context, schedule, table.costs, point)
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


def _stage_sizes(context: SweepContext, workload: Workload, per_copy: int) -> tuple[int, ...] | str:
    """Layers per stage of one model copy cut into ``per_copy`` stages; the reason when
    the model has too few layers."""
    n_layers = len(workload.layers)
    if per_copy > n_layers:
        return (
            f"{per_copy} stages but the model has only {n_layers} layers (embedding "
            "and head included); use fewer stages or less virtual pipelining"
        )
    return _partition(context, workload, per_copy)


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
    no shorter instance repeats, from its schedule generated after all."""
    m = point.n_microbatches
    step = splice.extrapolated_step(point.schedule, point.pipeline, point.virtual, m, costs)
    if step is None:
        full, _ = _generated(point)
        step = quick_step(full, costs, pattern=_pattern(full))
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
        _partners(workload, schedule, _build_fingerprint(schedule)),
    )
    # the static memory of this point (the table's param_bytes assume no sharding)
    experts = table.expert_params or [0] * len(table.params)
    stages = tuple(
        replace(cost, param_bytes=_static(context, point, params, expert))
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


def _evaluate_chunk(
    chunk: list[tuple[int, Point]], context: SweepContext | None = None
) -> list[tuple[int, Evaluation]]:
    ctx = context if context is not None else _CONTEXT
    assert ctx is not None, "worker started without a sweep context"
    out = []
    with sparse_gc():
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
    with sparse_gc():  # and each chunk's own, nested, keeps these thresholds
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
