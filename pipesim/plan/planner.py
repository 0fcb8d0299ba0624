"""``plan``: sweep pipeline degree, micro-batch size, virtual stages and schedules.

For ``devices`` devices and a global batch of ``global_batch`` sequences, every
pipeline degree p that divides ``devices`` (data parallel d = devices / p
fills the rest), every micro-batch size b with ``global_batch`` divisible by
``d * b`` (so m = global_batch / (d b) micro-batches), every virtual stage
count v and every registered schedule is a configuration; the schedule's own
rules decide which of them it accepts. Each accepted one is simulated and
ranked (see :mod:`pipesim.plan.sweep` and :mod:`pipesim.plan.result`).

>>> from pipesim.plan.model import ModelSpec
>>> spec = ModelSpec(n_layers=8, hidden=512, n_heads=8, seq_length=256, vocab_size=1000)
>>> result = plan(spec, devices=4, accelerator="h100-sxm", global_batch=16, workers=1)
>>> result.best.schedule in {"1f1b", "gpipe", "interleaved-1f1b", "sequential"} | set(
...     schedule_names())
True
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from pipesim.costs import CostModel
from pipesim.errors import PlanError
from pipesim.plan.cost_aware import cost_aware_names, get_cost_aware
from pipesim.plan.hardware import Accelerator, get_accelerator
from pipesim.plan.model import ModelSpec, get_model
from pipesim.plan.result import PlanPoint, PlanResult, rank_points
from pipesim.plan.sweep import (
    Evaluation,
    Point,
    SweepContext,
    build_configuration,
    evaluate_points,
)
from pipesim.plan.workload import Workload, workload_from_model
from pipesim.schedule import Schedule
from pipesim.schedules import get_spec, schedule_names

__all__ = [
    "DEFAULT_MICROBATCH_SIZES",
    "DEFAULT_VIRTUAL",
    "configuration",
    "plan",
    "sweep_points",
]

DEFAULT_MICROBATCH_SIZES = (1, 2, 4, 8)
DEFAULT_VIRTUAL = (1, 2, 4)


def _positive_ints(name: str, values: Sequence[int]) -> tuple[int, ...]:
    values = tuple(values)
    if not values or any(isinstance(v, bool) or not isinstance(v, int) or v < 1 for v in values):
        raise PlanError(f"{name} must be whole numbers >= 1, got {list(values)!r}")
    return tuple(sorted(set(values)))


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
) -> tuple[list[Point], list[PlanPoint]]:
    """The configurations to simulate, and those refused before simulation (with why).

    Raises PlanError when the request itself is impossible: devices not a
    whole number of nodes, a pipeline degree that does not divide the
    devices, or a global batch that no configuration can split.
    """
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
    if stages is None:
        degrees = tuple(p for p in range(1, devices + 1) if devices % p == 0 and p <= n_layers)
    else:
        degrees = _positive_ints("stages", stages)
        bad = [p for p in degrees if devices % p]
        if bad:
            divisors = [p for p in range(1, devices + 1) if devices % p == 0]
            raise PlanError(
                f"pipeline degree {bad} does not divide {devices} devices, so data parallelism "
                f"cannot fill the rest; use divisors of {devices}: {divisors}"
            )
    sizes = _positive_ints("microbatch_sizes", microbatch_sizes)
    virtuals = _positive_ints("virtual", virtual)
    names = tuple(schedule_names()) if schedules is None else tuple(schedules)
    if "auto" in names:  # every registered family and the schedules made from the costs
        names = (*schedule_names(), *cost_aware_names())
    if not names:
        raise PlanError("no schedules to sweep; give at least one (see `pipesim schedules`)")
    specs = {name: get_cost_aware(name) or get_spec(name) for name in names}  # or unknown name
    points: list[Point] = []
    refused: list[PlanPoint] = []
    for p in degrees:
        d = devices // p
        for b in sizes:
            m, remainder = divmod(global_batch, d * b)
            for v in virtuals:
                for name in names:
                    allowed = specs[name].virtual_values
                    if allowed is not None and v not in allowed:
                        continue  # not a configuration of this schedule at all
                    if remainder or m == 0:
                        refused.append(
                            PlanPoint(
                                schedule=name,
                                pipeline=p,
                                virtual=v,
                                data_parallel=d,
                                microbatch_size=b,
                                n_microbatches=0,
                                reason=f"global batch {global_batch} is not a multiple of "
                                f"data parallel {d} x micro-batch size {b} = {d * b}",
                            )
                        )
                        continue
                    points.append(
                        Point(
                            schedule=name,
                            pipeline=p,
                            virtual=v,
                            microbatch_size=b,
                            n_microbatches=m,
                            data_parallel=d,
                        )
                    )
    if not points and not refused:
        raise PlanError(
            f"no schedule among {list(names)} takes {list(virtuals)} stages per rank; "
            "see `pipesim schedules` for each schedule's rules, or change --virtual"
        )
    if not points:
        smallest = devices // max(degrees)
        raise PlanError(
            f"global batch {global_batch} cannot be split over {devices} devices with "
            f"pipeline degrees {list(degrees)} and micro-batch sizes {list(sizes)}: it must "
            f"be a multiple of data parallel x micro-batch size, at least {smallest}; use a "
            f"global batch of {smallest * min(sizes)} or more (a multiple of it), or more "
            "pipeline stages"
        )
    return points, refused


def plan(
    model: ModelSpec | Workload | str,
    /,
    *,
    devices: int,
    accelerator: Accelerator | str,
    global_batch: int,
    stages: Sequence[int] | None = None,
    microbatch_sizes: Sequence[int] = DEFAULT_MICROBATCH_SIZES,
    virtual: Sequence[int] = DEFAULT_VIRTUAL,
    schedules: Sequence[str] | None = None,
    bytes_per_param: int = 16,
    memory_capacity_bytes: int | None = None,
    engine: str = "fast",
    workers: int | None = None,
    timeout_s: float = 600.0,
    progress: Callable[[int, int], None] | None = None,
) -> PlanResult:
    """Sweep the configurations of ``model`` on ``devices`` x ``accelerator``; rank them.

    ``model``: a preset name, a :class:`ModelSpec`, or a :class:`Workload` (e.g.
    from a calibrated cost file). ``stages``: pipeline degrees to try (default:
    every divisor of ``devices`` up to the layer count). ``bytes_per_param``:
    weights + gradients + optimizer state per parameter (16 for mixed-precision
    Adam: fp16 weights and gradients, fp32 master weights, momentum and
    variance; Rajbhandari et al., "ZeRO", SC 2020, section 3.1).
    ``memory_capacity_bytes`` overrides the accelerator's memory. ``engine``:
    ``fast`` or ``simpy`` (the reference; identical results, slower).
    """
    if isinstance(model, str):
        model = get_model(model)
    workload = workload_from_model(model) if isinstance(model, ModelSpec) else model
    if isinstance(accelerator, str):
        accelerator = get_accelerator(accelerator)
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
    points, refused = sweep_points(
        devices=devices,
        global_batch=global_batch,
        gpus_per_node=accelerator.gpus_per_node,
        n_layers=len(workload.layers),
        stages=stages,
        microbatch_sizes=microbatch_sizes,
        virtual=virtual,
        schedules=schedules,
    )
    context = SweepContext(
        workload=workload,
        accelerator=accelerator,
        devices=devices,
        bytes_per_param=bytes_per_param,
        memory_capacity_bytes=capacity,
        engine=engine,
    )
    evaluations = evaluate_points(
        context, points, workers=workers, timeout_s=timeout_s, progress=progress
    )
    plan_points = [
        _plan_point(
            point,
            evaluation,
            workload=workload,
            accelerator=accelerator,
            devices=devices,
            global_batch=global_batch,
            capacity=capacity,
        )
        for point, evaluation in zip(points, evaluations, strict=True)
    ]
    return PlanResult(
        model=workload.name,
        accelerator=accelerator,
        devices=devices,
        global_batch=global_batch,
        memory_capacity_bytes=capacity,
        points=rank_points(plan_points + refused),
        engine=engine,
    )


def _plan_point(
    point: Point,
    evaluation: Evaluation,
    *,
    workload: Workload,
    accelerator: Accelerator,
    devices: int,
    global_batch: int,
    capacity: int,
) -> PlanPoint:
    base = PlanPoint(
        schedule=point.schedule,
        pipeline=point.pipeline,
        virtual=point.virtual,
        data_parallel=point.data_parallel,
        microbatch_size=point.microbatch_size,
        n_microbatches=point.n_microbatches,
    )
    if evaluation.reason is not None:
        return _replace(base, reason=evaluation.reason)
    step_ns = evaluation.makespan_ns + evaluation.allreduce_ns
    seconds = step_ns / 1e9
    fits = evaluation.peak_memory_bytes <= capacity
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
    reason = None
    if not fits:
        reason = (
            f"needs {evaluation.peak_memory_bytes / 1e9:.1f} GB per device "
            f"({evaluation.static_bytes / 1e9:.1f} GB params, grads and optimizer + "
            f"{evaluation.activation_bytes / 1e9:.1f} GB activations) > "
            f"{capacity / 1e9:.1f} GB"
        )
    return _replace(
        base,
        n_stages=evaluation.n_stages,
        layers_per_stage=evaluation.layers_per_stage,
        step_time_ns=step_ns,
        pipeline_time_ns=evaluation.makespan_ns,
        allreduce_time_ns=evaluation.allreduce_ns,
        bubble=evaluation.bubble,
        tokens_per_s=tokens,
        mfu=mfu,
        peak_memory_bytes=evaluation.peak_memory_bytes,
        static_memory_bytes=evaluation.static_bytes,
        peak_activation_bytes=evaluation.activation_bytes,
        fits=fits,
        reason=reason,
    )


def _replace(point: PlanPoint, **changes: object) -> PlanPoint:
    from dataclasses import replace

    return replace(point, **changes)  # type: ignore[arg-type]


def configuration(
    result: PlanResult,
    point: PlanPoint,
    /,
    *,
    model: ModelSpec | Workload | str,
    bytes_per_param: int = 16,
) -> tuple[Schedule, CostModel]:
    """The schedule and cost model (times in integer nanoseconds) behind ``point`` of
    ``result``: simulate it with :func:`pipesim.simulate`, plot it with ``pipesim.plot``.

    ``model`` (and ``bytes_per_param``) must be those the plan was made with.
    """
    if isinstance(model, str):
        model = get_model(model)
    workload = workload_from_model(model) if isinstance(model, ModelSpec) else model
    if not point.feasible:
        raise PlanError(f"{point.label()} was not simulated: {point.reason}")
    context = SweepContext(
        workload=workload,
        accelerator=result.accelerator,
        devices=result.devices,
        bytes_per_param=bytes_per_param,
        memory_capacity_bytes=result.memory_capacity_bytes,
    )
    return build_configuration(
        context,
        Point(
            schedule=point.schedule,
            pipeline=point.pipeline,
            virtual=point.virtual,
            microbatch_size=point.microbatch_size,
            n_microbatches=point.n_microbatches,
            data_parallel=point.data_parallel,
        ),
    )
