"""A configuration's stages priced: the cost model (integer nanoseconds) of the stages the
workload is cut into, their links, and what the iteration needs per stage.

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
- A cost file's stages come at the point's micro-batch size with the file's link and
  overheads (:mod:`pipesim.plan.measured`).
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass, replace
from fractions import Fraction
from typing import Any

from pipesim.costs import CostModel, Link, Links, StageCost
from pipesim.partition import partition
from pipesim.plan.gpu import LayerTime, layer_times, scatter_gather_seconds
from pipesim.plan.hardware import Accelerator, Interconnect
from pipesim.plan.kernels import Shard
from pipesim.plan.measured import measured_stages
from pipesim.plan.overlap import pair_seconds, pass_parts
from pipesim.plan.point import Point, SweepContext
from pipesim.plan.workload import Workload
from pipesim.units import NS_PER_S

__all__ = ["StageTable", "clear_caches", "pipeline_ranks_per_node", "stage_sizes", "stage_table"]

# -- per-process caches (a worker keeps them for its lifetime) ---------------------------
_LAYER_TIMES: dict[tuple[Any, ...], dict[str, LayerTime]] = {}
_PARTITIONS: dict[tuple[int, bool, str, int, int, int, int], tuple[int, ...]] = {}
_COSTS: dict[tuple[Any, ...], StageTable] = {}


def clear_caches() -> None:
    """Forget every priced stage (a new sweep context)."""
    _LAYER_TIMES.clear()
    _PARTITIONS.clear()
    _COSTS.clear()
    _PREFIXES.clear()


@dataclass(frozen=True, slots=True)
class StageTable:
    costs: CostModel
    params: list[int | Fraction]
    """Per stage."""
    transient: list[int]
    """Per stage: bytes re-created for one backward (full recomputation)."""
    tp_ns: list[int]
    """Per stage: tensor-parallel traffic of one micro-batch's F + backward."""
    expert_params: list[int | Fraction] | None = None
    """Per stage: the part of ``params`` that is routed experts (None: none)."""


def stage_table(
    context: SweepContext,
    workload: Workload,
    sizes: tuple[int, ...],
    microbatch_size: int,
    ranks_per_node: int | None,
    n_copies: int,
    partners: tuple[int, ...] | None = None,
) -> StageTable:
    """Cost model of the stages (integer ns) and what the iteration needs per stage;
    ``n_copies`` copies of the model's stages one after the other; pipeline ranks
    ``ranks_per_node`` to a node (None: the whole job in one node); ``partners``: per
    stage, the stage whose backward an overlapped F&B pair runs its forward with
    (:func:`pipesim.plan.overlap.overlap_partners`; None: no pairs priced apart)."""
    key = (
        *workload.sharding,
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
) -> StageTable:
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
        blocking_sends=not context.overlap_p2p,
    )
    experts: list[int | Fraction] | None = None
    if workload.spec is not None and workload.spec.moe is not None:
        prefix = _prefix_sums(workload)["expert_params"]
        bounds = [0, *itertools.accumulate(sizes)]
        per_stage: list[int | Fraction] = [
            prefix[b] - prefix[a] for a, b in itertools.pairwise(bounds)
        ]
        experts = per_stage * n_copies
    return StageTable(costs, params * n_copies, transient * n_copies, tp_ns * n_copies, experts)


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


def _layer_times(context: SweepContext, workload: Workload, b: int) -> dict[str, LayerTime]:
    """F, I and W of each layer kind of ``workload`` at micro-batch size ``b`` on the
    context's accelerator (:mod:`pipesim.plan.gpu`), priced once per variant."""
    assert workload.spec is not None
    key = (
        *workload.sharding,
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
) -> StageTable:
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
    return StageTable(costs, params * n_copies, [0] * n, [0] * n)


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
        *workload.sharding,
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


def pipeline_ranks_per_node(context: SweepContext, point: Point) -> int | None:
    """Pipeline ranks per node, devices ordered tp-dp-pp (each pipeline rank is a block
    of t d devices); None when the job fits one node."""
    g = context.accelerator.gpus_per_node
    if context.devices <= g:
        return None
    span = point.tensor * point.context_parallel * point.data_parallel
    return g // span if g % span == 0 else 1


def stage_sizes(context: SweepContext, workload: Workload, per_copy: int) -> tuple[int, ...] | str:
    """Layers per stage of one model copy cut into ``per_copy`` stages; the reason when
    the model has too few layers."""
    n_layers = len(workload.layers)
    if per_copy > n_layers:
        return (
            f"{per_copy} stages but the model has only {n_layers} layers (embedding "
            "and head included); use fewer stages or less virtual pipelining"
        )
    return _partition(context, workload, per_copy)
