"""What :func:`pipesim.plan.planner.plan` is given, checked and resolved before any work:
its settings (engine, memory, headroom, MFU floor; a PlanError names the first bad one),
the model in its precision, and the sweep context every worker evaluates with."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import TypeVar

from pipesim.errors import PlanError
from pipesim.iterations import check_sync
from pipesim.plan.hardware import Accelerator, get_accelerator
from pipesim.plan.iteration import OPTIMIZER_BYTES_PER_PARAM, default_bytes_per_param
from pipesim.plan.model import ModelSpec, get_model
from pipesim.plan.point import SweepContext
from pipesim.plan.workload import Workload, workload_from_model

__all__ = [
    "DEFAULT_MEMORY_HEADROOM",
    "Settings",
    "as_workload",
    "check_options",
    "check_share",
    "pinned",
    "pipeline_degrees",
    "plan_settings",
    "resolve_accelerator",
    "resolved_bytes_per_param",
    "sweep_context",
    "with_dtype",
]


_T = TypeVar("_T")

#: Share of device memory kept free for allocator fragmentation and workspaces.
DEFAULT_MEMORY_HEADROOM = 0.10


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


def check_options(*, prune: bool, cluster: str | None, optimizer_sync: str) -> None:
    """Refuse what :func:`plan` cannot do, before any work."""
    if prune and cluster is not None:
        raise PlanError(
            "pruning runs the sweep in batches on local processes and cannot use a Dask "
            f"cluster yet (cluster={cluster!r}): drop prune (--prune) or the cluster"
        )
    check_sync(optimizer_sync)


def sweep_context(
    workload: Workload,
    accelerator: Accelerator,
    *,
    devices: int,
    settings: Settings,
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


def as_workload(model: ModelSpec | Workload | str) -> Workload:
    """The workload of a preset name, a :class:`ModelSpec` or a :class:`Workload`."""
    if isinstance(model, str):
        model = get_model(model)
    return workload_from_model(model) if isinstance(model, ModelSpec) else model


def resolve_accelerator(accelerator: Accelerator | str, workload: Workload) -> Accelerator:
    """The accelerator of a preset name (or given); an FP8 workload's PlanError about an
    accelerator without FP8 rates comes now, not in every worker."""
    if isinstance(accelerator, str):
        accelerator = get_accelerator(accelerator)
    if workload.spec is not None and workload.spec.dtype == "fp8":
        accelerator.fp8_flops  # noqa: B018  # raises where the accelerator has none
    return accelerator


def resolved_bytes_per_param(bytes_per_param: int | None, workload: Workload) -> int:
    """``bytes_per_param`` as given, or (None) Megatron-LM's for ``workload``'s model
    (:func:`~pipesim.plan.iteration.default_bytes_per_param`: 16 with a bf16 gradient
    buffer, else 18; a cost file's workload has no model, and gets 18)."""
    if bytes_per_param is not None:
        return bytes_per_param
    in_bf16 = workload.spec is not None and workload.spec.grad_reduce_in_bf16
    return default_bytes_per_param(grad_reduce_in_bf16=in_bf16)


def with_dtype(workload: Workload, dtype: str | None) -> Workload:
    """``workload`` trained in ``dtype`` (None: its own); a cost file has its own."""
    if dtype is None or (workload.spec is not None and workload.spec.dtype == dtype):
        return workload
    if workload.spec is None:
        raise PlanError(
            f"{workload.name} is a cost file, measured in its own precision; drop --dtype"
        )
    return workload_from_model(replace(workload.spec, dtype=dtype))


def pipeline_degrees(
    pipeline_parallel: Sequence[int] | None, stages: Sequence[int] | None
) -> Sequence[int] | None:
    """The pipeline-parallel degrees under their name or their old one, not both."""
    if pipeline_parallel is not None and stages is not None:
        raise PlanError(
            f"pipeline_parallel={list(pipeline_parallel)!r} and stages={list(stages)!r} name "
            "the same dimension (stages is its old name): give only pipeline_parallel"
        )
    return stages if pipeline_parallel is None else pipeline_parallel


def pinned(values: Sequence[_T] | None) -> tuple[_T, ...] | None:
    """The values a dimension is pinned to, as a tuple; None: its defaults."""
    return None if values is None else tuple(values)


@dataclass(frozen=True, slots=True, kw_only=True)
class Settings:
    """A plan's checked settings besides the sweep's dimensions."""

    engine: str
    bytes_per_param: int
    capacity: int
    """Device memory in bytes."""
    headroom: float
    usable: int
    """``capacity`` less the headroom: what a configuration must fit in."""
    min_mfu: float


def plan_settings(
    accelerator: Accelerator,
    *,
    engine: str,
    bytes_per_param: int,
    memory_capacity_bytes: int | None,
    memory_headroom: float,
    min_mfu: float | None,
) -> Settings:
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
    return Settings(
        engine=engine,
        bytes_per_param=bytes_per_param,
        capacity=capacity,
        headroom=headroom,
        usable=math.floor(capacity * (1 - headroom)),
        min_mfu=check_share(min_mfu, name="min_mfu", include_one=True),
    )
