"""The sweep's dimensions and the configurations they make: each dimension's values
checked (a PlanError names the bad ones and the fix) and defaulted, then combined into
the points the schedules' rules accept (:func:`sweep_points`)."""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass, replace

from pipesim.errors import PlanError, brief
from pipesim.iterations import DEFAULT_SYNC
from pipesim.plan.cost_aware import cost_aware_names, get_cost_aware
from pipesim.plan.kernels import check_context_parallel
from pipesim.plan.layers import RECOMPUTE
from pipesim.plan.moe import check_expert_parallel
from pipesim.plan.point import Point
from pipesim.plan.result import PlanPoint, to_plan_point
from pipesim.plan.workload import Workload
from pipesim.schedules import get_spec, schedule_names

__all__ = ["DEFAULT_MICROBATCH_SIZES", "DEFAULT_VIRTUAL", "Dimensions", "sweep_points"]


DEFAULT_MICROBATCH_SIZES = (1, 2, 4, 8)
DEFAULT_VIRTUAL = (1, 2, 4)


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


def _refused(point: Point, reason: str) -> PlanPoint:
    return replace(to_plan_point(point), n_microbatches=0, reason=reason)
