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
:mod:`pipesim.plan.sweep` and :mod:`pipesim.plan.result`). Any dimension can
be pinned to one value or a list; with all pinned, exactly one configuration
is evaluated. Configurations whose schedules and costs come out identical
(interleaved 1F1B with one stage per rank is 1F1B) are listed once.

A configuration fits when its peak memory stays within the capacity less a
headroom (default 10%: the CUDA caching allocator's fragmentation, NCCL and
cuBLAS workspaces, which no formula here counts). The fastest that fits is
recommended only if it reaches a sane MFU (default: an eighth of the
accelerator's achievable matmul share, about 10% on an A100 or H100).

>>> from pipesim.plan.model import ModelSpec
>>> spec = ModelSpec(n_layers=8, hidden=512, n_heads=8, seq_length=256, vocab_size=1000)
>>> result = plan(spec, devices=4, accelerator="h100-sxm", global_batch=16, workers=1)
>>> result.best.schedule in schedule_names()
True
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import TypeVar

from pipesim.costs import CostModel
from pipesim.errors import PlanError, brief
from pipesim.iterations import DEFAULT_SYNC, check_sync
from pipesim.plan.budget import check_sweep
from pipesim.plan.cost_aware import cost_aware_names, get_cost_aware
from pipesim.plan.hardware import Accelerator, get_accelerator
from pipesim.plan.iteration import BYTES_PER_PARAM, OPTIMIZER_BYTES_PER_PARAM
from pipesim.plan.kernels import check_context_parallel
from pipesim.plan.layers import RECOMPUTE
from pipesim.plan.model import ModelSpec, get_model
from pipesim.plan.moe import check_expert_parallel
from pipesim.plan.prune import DEFAULT_KEEP, evaluate_best_first
from pipesim.plan.result import PlanPoint, PlanResult, rank_points
from pipesim.plan.sweep import (
    Evaluation,
    Point,
    SweepContext,
    build_configuration,
    evaluate_points,
    pipeline_comm_ns,
)
from pipesim.plan.workload import Workload, workload_from_model
from pipesim.schedule import Schedule
from pipesim.schedules import get_spec, schedule_names
from pipesim.units import NS_PER_S, format_bytes

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

_T = TypeVar("_T")

DEFAULT_MICROBATCH_SIZES = (1, 2, 4, 8)
DEFAULT_VIRTUAL = (1, 2, 4)
#: Share of device memory kept free for allocator fragmentation and workspaces.
DEFAULT_MEMORY_HEADROOM = 0.10


@dataclass(frozen=True, slots=True, kw_only=True)
class Dimensions:
    """The values each dimension of the sweep takes (None: the default set)."""

    tensor: tuple[int, ...] | None = None
    """Tensor-parallel sizes; None: divisors of the GPUs per node that divide the heads."""
    stages: tuple[int, ...] | None = None
    """Pipeline degrees; None: every one that divides devices / t."""
    microbatch_sizes: tuple[int, ...] = DEFAULT_MICROBATCH_SIZES
    virtual: tuple[int, ...] = DEFAULT_VIRTUAL
    schedules: tuple[str, ...] | None = None
    recompute: tuple[str, ...] | None = None
    """None: none, selective (unless flash attention, where it saves no memory), full."""
    sequence_parallel: tuple[bool, ...] | None = None
    """None: on wherever t > 1 (it costs no time and saves memory)."""
    distributed_optimizer: tuple[bool, ...] | None = None
    """None: on wherever d > 1 (same traffic as an all-reduce, less memory)."""
    context: tuple[int, ...] = (1,)
    """Context-parallel sizes (each sequence split c ways, ring attention)."""
    expert: tuple[int, ...] = (1,)
    """Expert-parallel sizes (each expert layer's routed experts split e ways)."""
    expert_tensor: tuple[int, ...] = (1,)
    """Expert tensor-parallel sizes (each routed expert split this many ways)."""
    optimizer_sync: str = DEFAULT_SYNC
    """The optimizer synchronization ranked by: ``auto`` sweeps the synthesized schedule
    made for it (:mod:`pipesim.plan.cost_aware`)."""


def _positive_ints(name: str, values: Sequence[int]) -> tuple[int, ...]:
    values = tuple(values)
    if not values or any(isinstance(v, bool) or not isinstance(v, int) or v < 1 for v in values):
        raise PlanError(f"{name} must be whole numbers >= 1, got {list(values)!r}")
    return tuple(sorted(set(values)))


def _divisors(n: int) -> tuple[int, ...]:
    return tuple(k for k in range(1, n + 1) if n % k == 0)


def _tensor_sizes(
    dims: Dimensions, *, devices: int, gpus_per_node: int, workload: Workload
) -> tuple[int, ...]:
    spec = workload.spec
    if dims.tensor is None:
        if spec is None:
            return (1,)
        return tuple(
            t
            for t in _divisors(gpus_per_node)
            if devices % t == 0 and spec.n_heads % t == 0 and spec.kv_heads % t == 0
        )
    sizes = _positive_ints("tensor parallel sizes", dims.tensor)
    bad = [t for t in sizes if devices % t]
    if bad:
        raise PlanError(
            f"tensor parallel size {bad} does not divide {devices} devices; use divisors of "
            f"{devices}: {list(_divisors(devices))}"
        )
    if spec is None and sizes != (1,):
        raise PlanError(
            f"{workload.name} is a cost file: tensor parallelism applies only to a model given "
            "by its shapes; drop --tensor-parallel"
        )
    if spec is not None:
        bad = [t for t in sizes if spec.n_heads % t or spec.kv_heads % t]
        if bad:
            raise PlanError(
                f"tensor parallel size {bad} must divide the attention heads ({spec.n_heads}) "
                f"and key/value heads ({spec.kv_heads})"
            )
    return sizes


def _dividing_sizes(values: Sequence[int], what: str, *, devices: int) -> tuple[int, ...]:
    """The ``what``-parallel sizes, positive and each dividing the devices."""
    sizes = _positive_ints(f"{what} parallel sizes", values)
    bad = [size for size in sizes if devices % size]
    if bad:
        raise PlanError(
            f"{what} parallel size {bad} does not divide {devices} devices; use divisors of "
            f"{devices}: {list(_divisors(devices))}"
        )
    return sizes


def _context_sizes(dims: Dimensions, *, devices: int, workload: Workload | None) -> tuple[int, ...]:
    """The context-parallel sizes, checked: each divides the devices, and the model can
    split its sequences that many ways (fused attention, 2c equal chunks)."""
    sizes = _dividing_sizes(dims.context, "context", devices=devices)
    if sizes == (1,):
        return sizes
    spec = None if workload is None else workload.spec
    if spec is None:
        raise PlanError(
            "context parallelism applies only to a model given by its shapes (a preset, a "
            "model file or --layers/--hidden/...); drop --context-parallel"
        )
    for c in sizes:
        check_context_parallel(spec, c)
    return sizes


def _expert_sizes(
    values: tuple[int, ...], what: str, *, devices: int, workload: Workload | None
) -> tuple[int, ...]:
    """The expert-parallel (``what`` = "expert") or expert tensor-parallel sizes,
    checked: each divides the devices and the model's routed experts or expert width
    (only a model with expert layers takes more than 1)."""
    sizes = _dividing_sizes(values, what, devices=devices)
    if sizes == (1,):
        return sizes
    spec = None if workload is None else workload.spec
    if spec is None:
        raise PlanError(
            "expert parallelism applies only to a model given by its shapes with expert "
            f"layers (e.g. --model mixtral-8x7b); drop --{what.replace(' ', '-')}-parallel"
        )
    for e in sizes:
        if what == "expert":
            check_expert_parallel(spec, e)
        else:
            check_expert_parallel(spec, 1, expert_tensor=e)
    return sizes


def _recomputes(dims: Dimensions, workload: Workload) -> tuple[str, ...]:
    if dims.recompute is None:
        if workload.spec is None:
            return ("none",)
        if workload.spec.flash_attention:  # selective saves nothing, repeats attention
            return ("none", "full")
        return RECOMPUTE
    values = tuple(dict.fromkeys(dims.recompute))
    bad = [r for r in values if r not in RECOMPUTE]
    if not values or bad:
        raise PlanError(f"recompute takes {', '.join(RECOMPUTE)}, got {list(values)!r}")
    if workload.spec is None and values != ("none",):
        raise PlanError(
            f"{workload.name} is a cost file: recomputation applies only to a model given by "
            "its shapes; drop --recompute"
        )
    return values


def _flags(values: tuple[bool, ...] | None, applies: bool) -> tuple[bool, ...]:
    """Default on where it applies; where it does not, off is the same configuration."""
    if not applies:
        return (False,)
    return (True,) if values is None else tuple(dict.fromkeys(values))


@dataclass(frozen=True, slots=True)
class _Axes:
    """The checked values of every dimension swept, before they are combined."""

    tensors: tuple[int, ...]
    recomputes: tuple[str, ...]
    pinned_stages: tuple[int, ...] | None
    """Pipeline degrees asked for; None: every divisor of devices / t up to the layers."""
    sizes: tuple[int, ...]
    """Micro-batch sizes."""
    virtuals: tuple[int, ...]
    names: tuple[str, ...]
    """Schedules, ``auto`` expanded."""
    virtual_values: dict[str, tuple[int, ...] | None]
    """Per schedule: the stages per rank its rules accept (None: any)."""
    sequence_parallel: tuple[bool, ...] | None
    distributed_optimizer: tuple[bool, ...] | None
    contexts: tuple[int, ...]
    """Context-parallel sizes."""
    experts: tuple[int, ...] = (1,)
    """Expert-parallel sizes."""
    expert_tensors: tuple[int, ...] = (1,)
    """Expert tensor-parallel sizes."""


@dataclass(frozen=True, slots=True)
class _Enumerated:
    """What combining the axes gave: configurations to simulate, those refused, and the
    degrees seen (for the error when every one was refused)."""

    points: list[Point]
    refused: list[PlanPoint]
    degrees_seen: list[int]
    data_parallel_seen: list[int]


def sweep_points(
    *,
    devices: int,
    global_batch: int,
    gpus_per_node: int,
    n_layers: int,
    stages: Sequence[int] | None = None,
    microbatch_sizes: Sequence[int] = DEFAULT_MICROBATCH_SIZES,
    virtual: Sequence[int] = DEFAULT_VIRTUAL,
    schedules: Sequence[str] | None = None,
    workload: Workload | None = None,
    dimensions: Dimensions | None = None,
) -> tuple[list[Point], list[PlanPoint]]:
    """The configurations to simulate, and those refused before simulation (with why).

    Raises PlanError when the request itself is impossible: devices not a
    whole number of nodes, a pipeline degree that does not divide the
    devices, or a global batch that no configuration can split.
    """
    _check_request(devices=devices, global_batch=global_batch, gpus_per_node=gpus_per_node)
    dims = dimensions or Dimensions(
        stages=None if stages is None else tuple(stages),
        microbatch_sizes=tuple(microbatch_sizes),
        virtual=tuple(virtual),
        schedules=None if schedules is None else tuple(schedules),
    )
    axes = _axes(dims, devices=devices, gpus_per_node=gpus_per_node, workload=workload)
    found = _enumerate(axes, devices=devices, global_batch=global_batch, n_layers=n_layers)
    if not found.points and not found.refused:
        raise PlanError(
            f"no schedule among {list(axes.names)} takes {list(axes.virtuals)} stages per rank "
            "with these degrees; see `pipesim schedules` for each schedule's rules, or change "
            "--virtual, --stages or --tensor-parallel"
        )
    if not found.points:
        raise _unsplittable_batch(found, axes, devices=devices, global_batch=global_batch)
    return found.points, found.refused


def _check_request(*, devices: int, global_batch: int, gpus_per_node: int) -> None:
    """PlanError unless ``devices`` and ``global_batch`` are whole numbers >= 1 and the
    devices fill whole nodes."""
    for name, value in (("devices", devices), ("global_batch", global_batch)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise PlanError(f"{name} must be a whole number >= 1, got {value!r}")
    if devices > gpus_per_node and devices % gpus_per_node:
        low = devices - devices % gpus_per_node
        raise PlanError(
            f"{devices} devices is not a whole number of {gpus_per_node}-GPU nodes; use "
            f"{low} or {low + gpus_per_node} devices (or an accelerator with another "
            "gpus_per_node)"
        )


def _axes(
    dims: Dimensions, *, devices: int, gpus_per_node: int, workload: Workload | None
) -> _Axes:
    """Each dimension's values checked (PlanError naming the bad ones) and defaulted."""
    if workload is None:
        tensors: tuple[int, ...] = (1,)
        recomputes: tuple[str, ...] = ("none",)
    else:
        tensors = _tensor_sizes(
            dims, devices=devices, gpus_per_node=gpus_per_node, workload=workload
        )
        recomputes = _recomputes(dims, workload)
    pinned_stages = None if dims.stages is None else _positive_ints("stages", dims.stages)
    if pinned_stages is not None:
        bad = [p for p in pinned_stages if devices % p]
        if bad:
            raise PlanError(
                f"pipeline degree {bad} does not divide {devices} devices, so data parallelism "
                f"cannot fill the rest; use divisors of {devices}: {list(_divisors(devices))}"
            )
    sizes = _positive_ints("microbatch_sizes", dims.microbatch_sizes)
    virtuals = _positive_ints("virtual", dims.virtual)
    names = tuple(schedule_names()) if dims.schedules is None else tuple(dims.schedules)
    if "auto" in names:  # every registered family and the schedules made from the costs
        names = (*schedule_names(), *cost_aware_names(sync=dims.optimizer_sync))
    if not names:
        raise PlanError("no schedules to sweep; give at least one (see `pipesim schedules`)")
    specs = {name: get_cost_aware(name) or get_spec(name) for name in names}  # or unknown name
    return _Axes(
        tensors=tensors,
        recomputes=recomputes,
        pinned_stages=pinned_stages,
        sizes=sizes,
        virtuals=virtuals,
        names=names,
        virtual_values={name: spec.virtual_values for name, spec in specs.items()},
        sequence_parallel=dims.sequence_parallel,
        distributed_optimizer=dims.distributed_optimizer,
        contexts=_context_sizes(dims, devices=devices, workload=workload),
        experts=_expert_sizes(dims.expert, "expert", devices=devices, workload=workload),
        expert_tensors=_expert_sizes(
            dims.expert_tensor, "expert tensor", devices=devices, workload=workload
        ),
    )


def _enumerate(axes: _Axes, *, devices: int, global_batch: int, n_layers: int) -> _Enumerated:
    """Every combination of the axes that the schedules' rules accept, in sweep order;
    those whose global batch does not split into whole micro-batches are refused."""
    # One loop nest on purpose: a helper per level would be a call per configuration.
    points: list[Point] = []
    refused: list[PlanPoint] = []
    degrees_seen: list[int] = []
    data_parallel_seen: list[int] = []
    for t, c in itertools.product(axes.tensors, axes.contexts):
        if devices % (t * c):
            continue
        if axes.pinned_stages is None:
            degrees = tuple(p for p in _divisors(devices // (t * c)) if p <= n_layers)
        else:
            degrees = tuple(p for p in axes.pinned_stages if (devices // (t * c)) % p == 0)
        degrees_seen += degrees
        data_parallel_seen += [devices // (t * c * p) for p in degrees]
        for p, e, et in itertools.product(degrees, axes.experts, axes.expert_tensors):
            d = devices // (t * c * p)
            if (t * c * d) % (e * et):
                continue  # an expert group lies within one stage's t c d devices
            for b in axes.sizes:
                m, remainder = divmod(global_batch, d * b)
                for v in axes.virtuals:
                    for name in axes.names:
                        allowed = axes.virtual_values[name]
                        if allowed is not None and v not in allowed:
                            continue  # not a configuration of this schedule at all
                        for recompute in axes.recomputes:
                            for sp in _flags(axes.sequence_parallel, t > 1):
                                for zero in _flags(axes.distributed_optimizer, d > 1):
                                    point = Point(
                                        schedule=name,
                                        pipeline=p,
                                        virtual=v,
                                        microbatch_size=b,
                                        n_microbatches=m,
                                        data_parallel=d,
                                        tensor=t,
                                        sequence_parallel=sp,
                                        recompute=recompute,
                                        distributed_optimizer=zero,
                                        context_parallel=c,
                                        expert_parallel=e,
                                        expert_tensor=et,
                                    )
                                    if remainder or m == 0:
                                        refused.append(
                                            _refused(
                                                point,
                                                f"global batch {global_batch} is not a multiple "
                                                f"of data parallel {d} x micro-batch size {b} = "
                                                f"{d * b}",
                                            )
                                        )
                                    else:
                                        points.append(point)
    return _Enumerated(points, refused, degrees_seen, data_parallel_seen)


def _unsplittable_batch(
    found: _Enumerated, axes: _Axes, *, devices: int, global_batch: int
) -> PlanError:
    """The error when no configuration splits the global batch, naming the nearest
    global batches that some configuration would."""
    # Each configuration swept splits the batch into data-parallel x micro-batch-size
    # pieces: the nearest global batches some configuration divides are the fix.
    pieces = sorted({d * b for d in set(found.data_parallel_seen) for b in axes.sizes})
    above = min(-(-global_batch // q) * q for q in pieces)
    below = max(global_batch // q * q for q in pieces)
    nearest = f"{below} or {above}" if below else str(above)
    return PlanError(
        f"global batch {global_batch} cannot be split over {devices} devices with "
        f"pipeline degrees {sorted(set(found.degrees_seen))} and micro-batch sizes "
        f"{list(axes.sizes)}: it must be a multiple of data parallel x micro-batch size (here "
        f"one of {brief(pieces)}); use a global batch of {nearest}, or other micro-batch "
        "sizes or pipeline degrees"
    )


def _ranked_point(point: Point, /) -> PlanPoint:
    """The configuration of ``point`` as a ranked point, nothing measured yet (the
    converse of :func:`_sweep_point`)."""
    return PlanPoint(
        schedule=point.schedule,
        pipeline=point.pipeline,
        virtual=point.virtual,
        data_parallel=point.data_parallel,
        microbatch_size=point.microbatch_size,
        n_microbatches=point.n_microbatches,
        tensor=point.tensor,
        sequence_parallel=point.sequence_parallel,
        recompute=point.recompute,
        distributed_optimizer=point.distributed_optimizer,
        context_parallel=point.context_parallel,
        expert_parallel=point.expert_parallel,
        expert_tensor=point.expert_tensor,
    )


def _refused(point: Point, reason: str) -> PlanPoint:
    return replace(_ranked_point(point), n_microbatches=0, reason=reason)


def check_share(value: object, /, *, name: str, include_one: bool = False) -> float:
    """``value`` as a float when it is a share from 0 to below 1 (memory headroom), or
    to 1 itself with ``include_one`` (a share of peak FLOP/s); a PlanError naming
    ``name`` and the range otherwise (NaN included).

    >>> check_share(0.1, name="--memory-headroom")
    0.1
    >>> check_share(float("nan"), name="--memory-headroom")
    Traceback (most recent call last):
    ...
    pipesim.errors.PlanError: --memory-headroom must be a number from 0 to below 1, got nan
    """
    share = value if isinstance(value, int | float) and not isinstance(value, bool) else None
    if share is None or not (0 <= share <= 1 if include_one else 0 <= share < 1):
        limit = "to 1" if include_one else "to below 1"
        raise PlanError(f"{name} must be a number from 0 {limit}, got {value!r}")
    return float(share)


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
    bytes_per_param: int = BYTES_PER_PARAM,
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

    ``model``: a preset name, a :class:`ModelSpec`, or a :class:`Workload` (e.g.
    from a calibrated cost file: t = 1 and no recomputation only).
    ``pipeline_parallel`` (``stages``: its old name, still taken), ``tensor``,
    ``recompute``, ``sequence_parallel``, ``distributed_optimizer``, ``microbatch_sizes``,
    ``virtual``, ``schedules``: the values to try (see the module docstring for the
    defaults). ``bytes_per_param``: weights + gradients
    + optimizer state per parameter without the distributed optimizer (18:
    Megatron-LM's bf16 weights with fp32 gradients and Adam, see
    :mod:`pipesim.plan.iteration`). ``context_parallel``: the context-parallel sizes
    to try (default 1). ``expert_parallel``: the expert-parallel sizes to try (default 1;
    a model with expert layers, :mod:`pipesim.plan.moe`), ``expert_tensor_parallel``
    the sizes each routed expert is split into (default 1). ``dtype``: the training
    precision instead of the model's own (``fp8``: FP8 GEMMs, bf16 storage).
    ``tp_comm_overlap``: hide tensor-parallel collectives under the GEMMs next to them
    (Megatron-LM's ``--tp-comm-overlap``).
    ``overlap_p2p``: pipeline sends beside compute (Megatron-Core's
    ``--overlap-p2p-communication``; off by default, as Megatron-LM waits for each send
    and receive). ``overlap_grad_reduce``: hide data-parallel traffic behind the last backward and
    first forward (``--overlap-grad-reduce`` / ``--overlap-param-gather``; on by
    default, as Megatron-Core's recipes run).
    ``memory_capacity_bytes`` overrides the
    accelerator's memory; ``memory_headroom`` is the share of it kept free.
    ``min_mfu``: the least MFU a winner needs to be recommended (default an
    eighth of the accelerator's achievable matmul share). ``engine``: ``fast`` or ``simpy``
    (the reference; identical results, slower). ``partial``: on a deadline or
    Ctrl-C return what was evaluated (``result.stopped`` says why) instead of
    raising. ``cluster``: evaluate on a Dask cluster instead of local processes, a
    scheduler's address (``tcp://HOST:8786``) or ``local`` (a LocalCluster of ``workers``
    processes); the same results (``pip install 'pipesim[dask]'``). ``prune``: simulate only
    the configurations that can be among the ``keep`` fastest that fit, the next ``keep`` of
    the Pareto front and the fastest alternatives (exact lower bounds,
    :mod:`pipesim.plan.prune`); the others are listed as pruned. Exact (the printed rows are
    those of ``prune=False``, which simulates every configuration) but not yet faster on the
    sweeps measured (docs/planner-speed.md), so off by default; local processes only.
    ``optimizer_sync``: rank by the steady-state iteration period under this optimizer
    synchronization (:mod:`pipesim.iterations`; default ``global``, Megatron-LM's, whose
    period is the pipeline + exposed data-parallel traffic + optimizer step the sweep
    prices); under another the ``period_candidates`` fastest by that are re-simulated
    under it (:mod:`pipesim.plan.period`) and ranked again, and ``auto`` sweeps the
    schedule synthesized for it.
    """
    _check_options(prune=prune, cluster=cluster, optimizer_sync=optimizer_sync)
    workload = _with_dtype(_as_workload(model), dtype)
    if isinstance(accelerator, str):
        accelerator = get_accelerator(accelerator)
    if workload.spec is not None and workload.spec.dtype == "fp8":
        accelerator.fp8_flops  # noqa: B018  # PlanError now, not in every worker
    settings = _settings(
        accelerator,
        engine=engine,
        bytes_per_param=bytes_per_param,
        memory_capacity_bytes=memory_capacity_bytes,
        memory_headroom=memory_headroom,
        min_mfu=min_mfu,
    )
    dims = Dimensions(
        tensor=_pinned(tensor),
        stages=_pinned(_pipeline_degrees(pipeline_parallel, stages)),
        microbatch_sizes=tuple(microbatch_sizes),
        virtual=tuple(virtual),
        schedules=_pinned(schedules),
        recompute=_pinned(recompute),
        sequence_parallel=_pinned(sequence_parallel),
        distributed_optimizer=_pinned(distributed_optimizer),
        context=tuple(context_parallel),
        expert=tuple(expert_parallel),
        expert_tensor=tuple(expert_tensor_parallel),
        optimizer_sync=optimizer_sync,
    )
    points, refused = sweep_points(
        devices=devices,
        global_batch=global_batch,
        gpus_per_node=accelerator.gpus_per_node,
        n_layers=len(workload.layers),
        workload=workload,
        dimensions=dims,
    )
    check_sweep(points, devices=devices, global_batch=global_batch)
    context = _context(
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
    result = _plan_result(context, settings, global_batch, points, evaluations, refused)
    result = _by_period(result, context, sync=optimizer_sync, candidates=period_candidates)
    return _unranked_beyond(result, exact_below)


def _check_options(*, prune: bool, cluster: str | None, optimizer_sync: str) -> None:
    """Refuse what :func:`plan` cannot do, before any work."""
    if prune and cluster is not None:
        raise PlanError(
            "pruning runs the sweep in batches on local processes and cannot use a Dask "
            f"cluster yet (cluster={cluster!r}): drop prune (--prune) or the cluster"
        )
    check_sync(optimizer_sync)


def _context(
    workload: Workload,
    accelerator: Accelerator,
    *,
    devices: int,
    settings: _Settings,
    overlaps: tuple[bool, bool, bool],
) -> SweepContext:
    """What every worker needs; ``overlaps``: tensor-parallel collectives, pipeline sends,
    data-parallel traffic (:func:`plan`'s ``tp_comm_overlap``, ``overlap_p2p``,
    ``overlap_grad_reduce``)."""
    tp_comm_overlap, overlap_p2p, overlap_grad_reduce = overlaps
    return SweepContext(
        workload=workload,
        accelerator=accelerator,
        devices=devices,
        bytes_per_param=settings.bytes_per_param,
        optimizer_bytes_per_param=min(OPTIMIZER_BYTES_PER_PARAM, settings.bytes_per_param),
        memory_capacity_bytes=settings.usable,
        engine=settings.engine,
        tp_comm_overlap=tp_comm_overlap,
        overlap_p2p=overlap_p2p,
        overlap_grad_reduce=overlap_grad_reduce,
    )


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


def _by_period(
    result: PlanResult, context: SweepContext, *, sync: str, candidates: int
) -> PlanResult:
    """``result`` ranked by the steady-state period under ``sync``. Under ``global`` that
    is the sweep's step time already. Otherwise the ``candidates`` fastest that fit are
    re-simulated under ``sync`` (:func:`pipesim.plan.period.period_ns`) and every point
    ranked again: a period under ``post-validation`` or ``none`` is never longer than under
    ``global`` (each rank is released no later), so the others keep an upper bound."""
    if sync == DEFAULT_SYNC:
        return replace(result, optimizer_sync=sync)
    from pipesim.plan.period import period_ns

    chosen = {id(p) for p in result.fitting[:candidates]}
    points = []
    for point in result.points:
        if id(point) in chosen:
            assert point.allreduce_time_ns is not None
            ns = period_ns(
                context, _sweep_point(point), after_ns=point.allreduce_time_ns, sync=sync
            )
            tokens, mfu = _throughput(
                ns,
                workload=context.workload,
                accelerator=context.accelerator,
                devices=context.devices,
                global_batch=result.global_batch,
            )
            point = replace(point, step_time_ns=ns, tokens_per_s=tokens, mfu=mfu, period_sync=sync)
        points.append(point)
    ranked = _with_winner_sends(context, rank_points(points))
    return replace(result, points=ranked, optimizer_sync=sync, period_candidates=len(chosen))


def _unranked_beyond(result: PlanResult, exact_below: float) -> PlanResult:
    """``result`` with no rank on the points that fit at or past ``exact_below`` ns, where
    pruned configurations may come before them (their Pareto marks stay exact)."""
    if exact_below == math.inf:
        return result
    points = tuple(
        replace(p, rank=None) if p.rank is not None and (p.step_time_ns or 0) >= exact_below else p
        for p in result.points
    )
    return replace(
        result, points=points, n_pruned=sum((p.reason or "").startswith("pruned:") for p in points)
    )


def _as_workload(model: ModelSpec | Workload | str) -> Workload:
    """The workload of a preset name, a :class:`ModelSpec` or a :class:`Workload`."""
    if isinstance(model, str):
        model = get_model(model)
    return workload_from_model(model) if isinstance(model, ModelSpec) else model


def _with_dtype(workload: Workload, dtype: str | None) -> Workload:
    """``workload`` trained in ``dtype`` (None: its own); a cost file has its own."""
    if dtype is None or (workload.spec is not None and workload.spec.dtype == dtype):
        return workload
    if workload.spec is None:
        raise PlanError(
            f"{workload.name} is a cost file, measured in its own precision; drop --dtype"
        )
    return workload_from_model(replace(workload.spec, dtype=dtype))


def _pipeline_degrees(
    pipeline_parallel: Sequence[int] | None, stages: Sequence[int] | None
) -> Sequence[int] | None:
    """The pipeline-parallel degrees under their name or their old one, not both."""
    if pipeline_parallel is not None and stages is not None:
        raise PlanError(
            f"pipeline_parallel={list(pipeline_parallel)!r} and stages={list(stages)!r} name "
            "the same dimension (stages is its old name): give only pipeline_parallel"
        )
    return stages if pipeline_parallel is None else pipeline_parallel


def _pinned(values: Sequence[_T] | None) -> tuple[_T, ...] | None:
    """The values a dimension is pinned to, as a tuple; None: its defaults."""
    return None if values is None else tuple(values)


@dataclass(frozen=True, slots=True, kw_only=True)
class _Settings:
    """A plan's checked settings besides the sweep's dimensions."""

    engine: str
    bytes_per_param: int
    capacity: int
    """Device memory in bytes."""
    headroom: float
    usable: int
    """``capacity`` less the headroom: what a configuration must fit in."""
    min_mfu: float


def _settings(
    accelerator: Accelerator,
    *,
    engine: str,
    bytes_per_param: int,
    memory_capacity_bytes: int | None,
    memory_headroom: float,
    min_mfu: float | None,
) -> _Settings:
    """``plan``'s settings checked (PlanError naming the first bad one) and defaulted from
    ``accelerator``."""
    if engine not in ("fast", "simpy"):
        raise PlanError(f"engine must be 'fast' or 'simpy', got {engine!r}")
    if (
        isinstance(bytes_per_param, bool)
        or not isinstance(bytes_per_param, int)
        or (bytes_per_param < 1)
    ):
        raise PlanError(f"bytes_per_param must be a whole number >= 1, got {bytes_per_param!r}")
    capacity = accelerator.memory_bytes if memory_capacity_bytes is None else memory_capacity_bytes
    if isinstance(capacity, bool) or not isinstance(capacity, int) or capacity < 1:
        raise PlanError(f"memory capacity must be a whole number of bytes >= 1, got {capacity!r}")
    headroom = check_share(memory_headroom, name="memory headroom")
    if min_mfu is None:
        min_mfu = accelerator.matmul_efficiency / 8
    return _Settings(
        engine=engine,
        bytes_per_param=bytes_per_param,
        capacity=capacity,
        headroom=headroom,
        usable=math.floor(capacity * (1 - headroom)),
        min_mfu=check_share(min_mfu, name="min_mfu", include_one=True),
    )


def _plan_result(
    context: SweepContext,
    settings: _Settings,
    global_batch: int,
    points: list[Point],
    evaluations: list[Evaluation],
    refused: list[PlanPoint],
) -> PlanResult:
    """The evaluated configurations, twins dropped, with those refused, ranked."""
    workload = context.workload
    stopped = next((e.reason for e in evaluations if e.stopped), None)
    plan_points, duplicates = _dedupe(
        [
            _plan_point(
                point,
                evaluation,
                workload=workload,
                accelerator=context.accelerator,
                devices=context.devices,
                global_batch=global_batch,
                usable=settings.usable,
            )
            for point, evaluation in zip(points, evaluations, strict=True)
        ],
        [e.fingerprint for e in evaluations],
    )
    spec = workload.spec
    ranked = _with_winner_sends(context, rank_points(plan_points + refused))
    return PlanResult(
        model=workload.name,
        accelerator=context.accelerator,
        devices=context.devices,
        global_batch=global_batch,
        memory_capacity_bytes=settings.capacity,
        memory_headroom=settings.headroom,
        min_mfu=settings.min_mfu,
        points=ranked,
        engine=settings.engine,
        stopped=None if stopped is None else stopped.removeprefix("not evaluated: "),
        n_duplicates=duplicates,
        n_layers=0 if spec is None else spec.n_layers,
        seq_length=workload.seq_length,
        tp_comm_overlap=context.tp_comm_overlap,
        overlap_p2p=context.overlap_p2p,
        dtype=None if spec is None else spec.dtype,
    )


def _with_winner_sends(
    context: SweepContext, ranked: tuple[PlanPoint, ...]
) -> tuple[PlanPoint, ...]:
    """``ranked`` with what the winner's sends cost (one more simulation), once."""
    if not ranked or not ranked[0].fits or ranked[0].pp_comm_time_ns is not None:
        return ranked
    best = ranked[0]
    assert best.pipeline_time_ns is not None
    sends = pipeline_comm_ns(context, _sweep_point(best), makespan_ns=best.pipeline_time_ns)
    return (replace(best, pp_comm_time_ns=sends), *ranked[1:])


#: Which name an identical configuration keeps: the schedules frameworks run by name.
_PREFERRED = ("1f1b", "interleaved-1f1b", "gpipe")


def _dedupe(points: list[PlanPoint], fingerprints: list[str]) -> tuple[list[PlanPoint], int]:
    """Drop configurations identical to another: the same generated per-rank orders
    (``fingerprint``) with the same degrees, batch and memory choices give the same
    simulation. The one kept is named 1f1b, interleaved-1f1b or gpipe if one of them
    is among the twins (1F1B at p = 1 is also "sequential"), else the first in
    registry order."""
    rank = {name: i for i, name in enumerate(_PREFERRED)}
    order = sorted(range(len(points)), key=lambda i: rank.get(points[i].schedule, len(rank)))
    seen: set[tuple[object, ...]] = set()
    dropped: set[int] = set()
    for i in order:
        point, fingerprint = points[i], fingerprints[i]
        if not (point.feasible and fingerprint):
            continue
        key = (
            fingerprint,
            point.tensor,
            point.pipeline,
            point.microbatch_size,
            point.n_microbatches,
            point.sequence_parallel,
            point.recompute,
            point.distributed_optimizer,
            point.context_parallel,
            point.expert_parallel,
            point.expert_tensor,
        )
        if key in seen:
            dropped.add(i)
        seen.add(key)
    kept = [p for i, p in enumerate(points) if i not in dropped]
    return kept, len(dropped)


def _digits_apart(need: int, usable: int) -> int:
    """Significant digits (3 to 6) at which ``need`` and ``usable`` bytes read apart, so a
    refusal never says "needs 71.7 GiB > 71.7 GiB usable"."""
    for digits in range(3, 6):
        if format_bytes(need, digits=digits) != format_bytes(usable, digits=digits):
            return digits
    return 6


def _plan_point(
    point: Point,
    evaluation: Evaluation,
    *,
    workload: Workload,
    accelerator: Accelerator,
    devices: int,
    global_batch: int,
    usable: int,
) -> PlanPoint:
    base = _ranked_point(point)
    if evaluation.reason is not None:
        return replace(base, reason=evaluation.reason, evaluated=not evaluation.stopped)
    step_ns = evaluation.makespan_ns + evaluation.allreduce_ns
    tokens, mfu = _throughput(
        step_ns,
        workload=workload,
        accelerator=accelerator,
        devices=devices,
        global_batch=global_batch,
    )
    fits = evaluation.peak_memory_bytes <= usable
    return replace(
        base,
        n_stages=evaluation.n_stages,
        layers_per_stage=evaluation.layers_per_stage,
        step_time_ns=step_ns,
        pipeline_time_ns=evaluation.makespan_ns,
        tp_comm_time_ns=evaluation.tp_comm_ns,
        dp_comm_time_ns=evaluation.dp_exposed_ns,
        dp_comm_total_ns=evaluation.dp_comm_ns,
        optimizer_time_ns=evaluation.optimizer_ns,
        allreduce_time_ns=evaluation.allreduce_ns,
        bubble=evaluation.bubble,
        tokens_per_s=tokens,
        mfu=mfu,
        peak_memory_bytes=evaluation.peak_memory_bytes,
        static_memory_bytes=evaluation.static_bytes,
        peak_activation_bytes=evaluation.activation_bytes,
        fits=fits,
        reason=None if fits else _memory_reason(evaluation, usable),
    )


def _throughput(
    step_ns: float,
    *,
    workload: Workload,
    accelerator: Accelerator,
    devices: int,
    global_batch: int,
) -> tuple[float | None, float | None]:
    """Tokens per second and model FLOPs utilisation of a step of ``step_ns``; None where
    the workload lacks the sequence length or FLOPs per sequence (or the step is 0)."""
    seconds = step_ns / NS_PER_S
    tokens = None
    if workload.seq_length is not None and step_ns:
        tokens = global_batch * workload.seq_length / seconds
    mfu = None
    if workload.flops_per_sequence is not None and step_ns:
        mfu = (
            workload.flops_per_sequence
            * global_batch
            / (seconds * devices * accelerator.peak_flops)
        )
    return tokens, mfu


def _memory_reason(evaluation: Evaluation, usable: int) -> str:
    """Why a point does not fit: its peak per device, split, against ``usable``."""
    peak = evaluation.peak_memory_bytes
    digits = _digits_apart(peak, usable)
    return (
        f"needs {format_bytes(peak, digits=digits)} per device "
        f"({format_bytes(evaluation.static_bytes)} params, grads and optimizer + "
        f"{format_bytes(evaluation.activation_bytes)} activations) > "
        f"{format_bytes(usable, digits=digits)} usable"
    )


def configuration(
    result: PlanResult,
    point: PlanPoint,
    /,
    *,
    model: ModelSpec | Workload | str,
    bytes_per_param: int = BYTES_PER_PARAM,
) -> tuple[Schedule, CostModel]:
    """The schedule and cost model (times in integer nanoseconds) behind ``point`` of
    ``result``: simulate it with :func:`pipesim.simulate`, plot it with ``pipesim.plot``.

    ``model`` (and ``bytes_per_param``) must be those the plan was made with. The
    cost model's durations include the tensor-parallel traffic inside F and I; the
    data-parallel traffic and optimizer step that follow the pipeline are not in it.
    """
    workload = _with_dtype(_as_workload(model), result.dtype)
    if not point.feasible:
        raise PlanError(f"{point.label()} was not simulated: {point.reason}")
    context = SweepContext(
        workload=workload,
        accelerator=result.accelerator,
        devices=result.devices,
        bytes_per_param=bytes_per_param,
        memory_capacity_bytes=result.usable_memory_bytes,
        tp_comm_overlap=result.tp_comm_overlap,
        overlap_p2p=result.overlap_p2p,
    )
    return build_configuration(context, _sweep_point(point))


def _sweep_point(point: PlanPoint) -> Point:
    """The sweep's configuration behind a ranked ``point``."""
    return Point(
        schedule=point.schedule,
        pipeline=point.pipeline,
        virtual=point.virtual,
        microbatch_size=point.microbatch_size,
        n_microbatches=point.n_microbatches,
        data_parallel=point.data_parallel,
        tensor=point.tensor,
        sequence_parallel=point.sequence_parallel,
        recompute=point.recompute,
        distributed_optimizer=point.distributed_optimizer,
        context_parallel=point.context_parallel,
        expert_parallel=point.expert_parallel,
        expert_tensor=point.expert_tensor,
    )
