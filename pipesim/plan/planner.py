"""``plan``: sweep tensor, pipeline and data parallelism, recomputation, the optimizer's
sharding, micro-batch size, virtual stages and schedules.

For ``devices`` devices and a global batch of ``global_batch`` sequences, every
tensor-parallel size t (default: the divisors of the GPUs per node that divide
the heads: tensor parallelism inside a node), every pipeline degree p with t p
dividing ``devices`` (data parallel d = devices / (t p) fills the rest), every
micro-batch size b with ``global_batch`` divisible by ``d * b`` (so m =
global_batch / (d b) micro-batches), every recomputation (none, selective,
full), sequence parallelism and distributed optimizer (default: on wherever
they apply, since they cost no time), every virtual stage count v and every
registered schedule is a configuration; the schedule's own rules decide which
of them it accepts. Each accepted one is simulated and ranked (see
:mod:`pipesim.plan.evaluation` and :mod:`pipesim.plan.scoring`). Any dimension can
be pinned to one value or a list; with all pinned, exactly one configuration
is evaluated. Configurations whose schedules and costs come out identical
(interleaved 1F1B with one stage per rank is 1F1B) are listed once.

A configuration fits when its peak memory stays within the capacity less a
headroom (default 10%: the CUDA caching allocator's fragmentation, NCCL and
cuBLAS workspaces, which no formula here counts). The fastest that fits is
recommended only if it reaches a sane MFU (default: an eighth of the
accelerator's achievable matmul share, about 10% on an A100 or H100).

>>> from pipesim.plan.model import ModelSpec
>>> from pipesim.schedules import schedule_names
>>> spec = ModelSpec(n_layers=8, hidden=512, n_heads=8, seq_length=256, vocab_size=1000)
>>> result = plan(spec, devices=4, accelerator="h100-sxm", global_batch=16, workers=1)
>>> result.best.schedule in schedule_names()
True
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from pipesim.costs import CostModel
from pipesim.errors import PlanError
from pipesim.iterations import DEFAULT_SYNC
from pipesim.plan.budget import check_sweep
from pipesim.plan.dimensions import (
    DEFAULT_MICROBATCH_SIZES,
    DEFAULT_VIRTUAL,
    Dimensions,
    sweep_points,
)
from pipesim.plan.hardware import Accelerator
from pipesim.plan.model import ModelSpec
from pipesim.plan.prune import DEFAULT_KEEP, evaluate_best_first
from pipesim.plan.result import PlanPoint, PlanResult, from_plan_point
from pipesim.plan.scoring import by_period, plan_result, unranked_beyond
from pipesim.plan.settings import (
    DEFAULT_MEMORY_HEADROOM,
    as_workload,
    check_options,
    check_share,
    pinned,
    pipeline_degrees,
    plan_settings,
    resolve_accelerator,
    resolved_bytes_per_param,
    sweep_context,
    with_dtype,
)
from pipesim.plan.sweep import (
    Evaluation,
    Point,
    SweepContext,
    build_configuration,
    evaluate_points,
)
from pipesim.plan.workload import Workload
from pipesim.schedule import Schedule

__all__ = [
    "DEFAULT_MEMORY_HEADROOM",
    "DEFAULT_MICROBATCH_SIZES",
    "DEFAULT_VIRTUAL",
    "Dimensions",
    "check_share",
    "configuration",
    "plan",
    "sweep_points",
]


def plan(
    model: ModelSpec | Workload | str,
    /,
    *,
    devices: int,
    accelerator: Accelerator | str,
    global_batch: int,
    pipeline_parallel: Sequence[int] | None = None,
    stages: Sequence[int] | None = None,
    microbatch_sizes: Sequence[int] = DEFAULT_MICROBATCH_SIZES,
    virtual: Sequence[int] = DEFAULT_VIRTUAL,
    schedules: Sequence[str] | None = None,
    tensor: Sequence[int] | None = None,
    recompute: Sequence[str] | None = None,
    sequence_parallel: Sequence[bool] | None = None,
    distributed_optimizer: Sequence[bool] | None = None,
    context_parallel: Sequence[int] = (1,),
    expert_parallel: Sequence[int] = (1,),
    expert_tensor_parallel: Sequence[int] = (1,),
    dtype: str | None = None,
    tp_comm_overlap: bool = False,
    overlap_p2p: bool = False,
    overlap_grad_reduce: bool = True,
    bytes_per_param: int | None = None,
    memory_capacity_bytes: int | None = None,
    memory_headroom: float = DEFAULT_MEMORY_HEADROOM,
    min_mfu: float | None = None,
    engine: str = "fast",
    workers: int | None = None,
    timeout_s: float = 600.0,
    progress: Callable[[int, int], None] | None = None,
    partial: bool = False,
    cluster: str | None = None,
    prune: bool = False,
    keep: int = DEFAULT_KEEP,
    optimizer_sync: str = DEFAULT_SYNC,
    period_candidates: int = DEFAULT_KEEP,
) -> PlanResult:
    """Sweep the configurations of ``model`` on ``devices`` x ``accelerator``; rank them.

    ``model``: a preset name, a :class:`ModelSpec`, or a :class:`Workload` (e.g. from a
    calibrated cost file: t = 1 and no recomputation only); ``dtype``: the training precision
    instead of the model's own (``fp8``: FP8 GEMMs, bf16 storage).

    The values to try (defaults in the module docstring): ``pipeline_parallel`` (``stages``:
    its old name, still taken), ``tensor``, ``recompute``, ``sequence_parallel``,
    ``distributed_optimizer``, ``microbatch_sizes``, ``virtual``, ``schedules``;
    ``context_parallel``, ``expert_parallel`` (a model with expert layers,
    :mod:`pipesim.plan.moe`) and ``expert_tensor_parallel`` (the sizes each routed expert is
    split into), each 1 by default.

    How a configuration runs: ``tp_comm_overlap`` hides tensor-parallel collectives under the
    GEMMs next to them (Megatron-LM's ``--tp-comm-overlap``); ``overlap_p2p`` runs pipeline
    sends beside compute (Megatron-Core's ``--overlap-p2p-communication``; off, as Megatron-LM
    waits for each send and receive); ``overlap_grad_reduce`` hides data-parallel traffic
    behind the last backward and first forward (``--overlap-grad-reduce`` /
    ``--overlap-param-gather``; on, as Megatron-Core's recipes run). ``bytes_per_param``:
    weights + gradients + optimizer state per parameter without the distributed optimizer
    (None: Megatron-LM's, 18 for bf16 weights with fp32 gradients and Adam, 16 when the
    model reduces its gradients in bf16; :func:`pipesim.plan.iteration.default_bytes_per_param`).

    What fits and wins: ``memory_capacity_bytes`` overrides the accelerator's memory,
    ``memory_headroom`` is the share of it kept free; ``min_mfu``: the least MFU a winner needs
    to be recommended (default an eighth of the accelerator's achievable matmul share).
    ``optimizer_sync``: rank by the steady-state iteration period under this optimizer
    synchronization (:mod:`pipesim.iterations`; default ``global``, Megatron-LM's, whose period
    is what the sweep prices); under another the ``period_candidates`` fastest are re-simulated
    under it (:mod:`pipesim.plan.period`) and ranked again; ``auto`` sweeps the schedule
    synthesized for it.

    How the sweep runs: ``engine``: ``fast`` or ``simpy`` (the reference; identical results,
    slower). ``partial``: on a deadline (``timeout_s``) or Ctrl-C return what was evaluated
    (``result.stopped`` says why) instead of raising. ``cluster``: a Dask scheduler's address
    (``tcp://HOST:8786``) or ``local`` (a LocalCluster of ``workers`` processes) instead of
    local processes; the same results (``pip install 'pipesim[dask]'``). ``prune``: simulate
    only the configurations that can be among the ``keep`` fastest that fit, the next ``keep``
    of the Pareto front and the fastest alternatives (exact lower bounds,
    :mod:`pipesim.plan.prune`), listing the others as pruned: the printed rows are those of
    ``prune=False``, but not yet faster on the sweeps measured (docs/planner-speed.md), so off
    by default; local processes only.
    """
    check_options(prune=prune, cluster=cluster, optimizer_sync=optimizer_sync)
    workload = with_dtype(as_workload(model), dtype)
    accelerator = resolve_accelerator(accelerator, workload)
    settings = plan_settings(
        accelerator,
        engine=engine,
        bytes_per_param=resolved_bytes_per_param(bytes_per_param, workload),
        memory_capacity_bytes=memory_capacity_bytes,
        memory_headroom=memory_headroom,
        min_mfu=min_mfu,
    )
    dims = Dimensions(
        tensor=pinned(tensor),
        stages=pinned(pipeline_degrees(pipeline_parallel, stages)),
        microbatch_sizes=tuple(microbatch_sizes),
        virtual=tuple(virtual),
        schedules=pinned(schedules),
        recompute=pinned(recompute),
        sequence_parallel=pinned(sequence_parallel),
        distributed_optimizer=pinned(distributed_optimizer),
        context=tuple(context_parallel),
        expert=tuple(expert_parallel),
        expert_tensor=tuple(expert_tensor_parallel),
        optimizer_sync=optimizer_sync,
    )
    points, refused = _points(workload, accelerator, dims, devices, global_batch)
    context = sweep_context(
        workload,
        accelerator,
        devices=devices,
        settings=settings,
        overlaps=(tp_comm_overlap, overlap_p2p, overlap_grad_reduce),
    )
    evaluations, exact_below = _evaluations(
        context,
        points,
        _Run(
            prune=prune,
            keep=keep,
            workers=workers,
            timeout_s=timeout_s,
            progress=progress,
            partial=partial,
            cluster=cluster,
        ),
    )
    result = plan_result(context, settings, global_batch, points, evaluations, refused)
    result = by_period(result, context, sync=optimizer_sync, candidates=period_candidates)
    return unranked_beyond(result, exact_below)


def _points(
    workload: Workload,
    accelerator: Accelerator,
    dimensions: Dimensions,
    devices: int,
    global_batch: int,
) -> tuple[list[Point], list[PlanPoint]]:
    """The configurations to evaluate and those refused before any evaluation; LimitError
    for a sweep past pipesim's limit on simulated actions (:func:`check_sweep`)."""
    points, refused = sweep_points(
        devices=devices,
        global_batch=global_batch,
        gpus_per_node=accelerator.gpus_per_node,
        n_layers=len(workload.layers),
        workload=workload,
        dimensions=dimensions,
    )
    check_sweep(points, devices=devices, global_batch=global_batch)
    return points, refused


@dataclass(frozen=True, slots=True, kw_only=True)
class _Run:
    """How the sweep runs (:func:`plan`'s arguments of the same names)."""

    prune: bool
    keep: int
    workers: int | None
    timeout_s: float
    progress: Callable[[int, int], None] | None
    partial: bool
    cluster: str | None


def _evaluations(
    context: SweepContext, points: list[Point], run: _Run
) -> tuple[list[Evaluation], float]:
    """Every point's evaluation, and the step time below which the ranking is exact
    (infinite unless pruned)."""
    if run.prune:
        searched = evaluate_best_first(
            context,
            points,
            keep=run.keep,
            workers=run.workers,
            timeout_s=run.timeout_s,
            progress=run.progress,
            partial=run.partial,
        )
        return searched.evaluations, searched.exact_below_ns
    evaluations = evaluate_points(
        context,
        points,
        workers=run.workers,
        timeout_s=run.timeout_s,
        progress=run.progress,
        partial=run.partial,
        cluster=run.cluster,
    )
    return evaluations, math.inf


def configuration(
    result: PlanResult,
    point: PlanPoint,
    /,
    *,
    model: ModelSpec | Workload | str,
    bytes_per_param: int | None = None,
) -> tuple[Schedule, CostModel]:
    """The schedule and cost model (times in integer nanoseconds) behind ``point`` of
    ``result``: simulate it with :func:`pipesim.simulate`, plot it with ``pipesim.plot``.

    ``model`` (and ``bytes_per_param``) must be those the plan was made with. The
    cost model's durations include the tensor-parallel traffic inside F and I; the
    data-parallel traffic and optimizer step that follow the pipeline are not in it.
    """
    workload = with_dtype(as_workload(model), result.dtype)
    if not point.feasible:
        raise PlanError(f"{point.label()} was not simulated: {point.reason}")
    context = SweepContext(
        workload=workload,
        accelerator=result.accelerator,
        devices=result.devices,
        bytes_per_param=resolved_bytes_per_param(bytes_per_param, workload),
        memory_capacity_bytes=result.usable_memory_bytes,
        tp_comm_overlap=result.tp_comm_overlap,
        overlap_p2p=result.overlap_p2p,
    )
    return build_configuration(context, from_plan_point(point))
