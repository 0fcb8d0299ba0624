"""Plan results: one :class:`PlanPoint` per configuration, ranked, Pareto front marked.

Ranking: configurations that fit in memory first, fastest step first (then
least memory); then those that do not fit, least memory first; then the
infeasible ones. The Pareto front is taken over the configurations that fit:
a point is on it when no other fitting point is at least as fast and uses at
most as much memory, with one of the two strictly better.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from fractions import Fraction
from typing import Any

from pipesim.plan.hardware import Accelerator

__all__ = ["PlanPoint", "PlanResult", "explain", "rank_points"]


@dataclass(frozen=True, slots=True, kw_only=True)
class PlanPoint:
    """One configuration and what it costs."""

    schedule: str
    pipeline: int
    """Pipeline degree p (ranks per pipeline, ``--stages``)."""
    virtual: int
    """Stages per rank asked of the schedule."""
    data_parallel: int
    microbatch_size: int
    n_microbatches: int
    n_stages: int | None = None
    """Stages the model is cut into (``p * v`` for interleaved schedules)."""
    layers_per_stage: tuple[int, ...] = ()
    """Layers (embedding and head included) on each stage."""
    step_time_ns: int | None = None
    """Pipeline time plus the data-parallel all-reduce, integer nanoseconds."""
    pipeline_time_ns: int | None = None
    allreduce_time_ns: int | None = None
    bubble: Fraction | None = None
    """Idle share of the pipeline's ranks x pipeline time."""
    tokens_per_s: float | None = None
    mfu: float | None = None
    """Model FLOPs per second over devices x peak FLOP/s (Narayanan et al. 2021)."""
    peak_memory_bytes: int | None = None
    """Largest per-device total: params + grads + optimizer + peak activations."""
    static_memory_bytes: int | None = None
    """Params + grads + optimizer state on that device."""
    peak_activation_bytes: int | None = None
    """Peak activations on that device, from the simulation."""
    fits: bool | None = None
    """Peak memory within capacity; None when the point is infeasible."""
    reason: str | None = None
    """Why the point is infeasible or does not fit."""
    rank: int | None = None
    """1 = recommended; only configurations that fit are ranked."""
    pareto: bool = False
    """On the step-time / memory Pareto front (of configurations that fit)."""

    @property
    def feasible(self) -> bool:
        """Simulated (the schedule accepted the configuration)."""
        return self.step_time_ns is not None

    @property
    def step_time_s(self) -> float | None:
        """Step time in seconds."""
        return None if self.step_time_ns is None else self.step_time_ns / 1e9

    def label(self) -> str:
        """A short description: ``1f1b p=4 v=1 d=2 b=2 m=16``."""
        return (
            f"{self.schedule} p={self.pipeline} v={self.virtual} d={self.data_parallel} "
            f"b={self.microbatch_size} m={self.n_microbatches}"
        )

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready fields (bubble as a float, times in seconds and nanoseconds)."""
        return {
            "rank": self.rank,
            "schedule": self.schedule,
            "pipeline": self.pipeline,
            "virtual": self.virtual,
            "data_parallel": self.data_parallel,
            "microbatch_size": self.microbatch_size,
            "n_microbatches": self.n_microbatches,
            "n_stages": self.n_stages,
            "layers_per_stage": list(self.layers_per_stage),
            "step_time_s": self.step_time_s,
            "step_time_ns": self.step_time_ns,
            "pipeline_time_ns": self.pipeline_time_ns,
            "allreduce_time_ns": self.allreduce_time_ns,
            "tokens_per_s": self.tokens_per_s,
            "mfu": self.mfu,
            "bubble": None if self.bubble is None else float(self.bubble),
            "peak_memory_bytes": self.peak_memory_bytes,
            "static_memory_bytes": self.static_memory_bytes,
            "peak_activation_bytes": self.peak_activation_bytes,
            "fits": self.fits,
            "pareto": self.pareto,
            "reason": self.reason,
        }


def _order(point: PlanPoint) -> tuple[Any, ...]:
    tie = (point.schedule, point.pipeline, point.virtual, point.microbatch_size)
    if point.fits:
        return (0, point.step_time_ns, point.peak_memory_bytes, *tie)
    if point.feasible:
        return (1, point.peak_memory_bytes, point.step_time_ns, *tie)
    return (2, 0, 0, *tie)


def rank_points(points: list[PlanPoint], /) -> tuple[PlanPoint, ...]:
    """``points`` in ranked order with ``rank`` and ``pareto`` set (see module docstring).

    >>> a = PlanPoint(schedule="a", pipeline=1, virtual=1, data_parallel=1, microbatch_size=1,
    ...               n_microbatches=1, step_time_ns=5, peak_memory_bytes=9, fits=True)
    >>> b = replace(a, schedule="b", step_time_ns=7, peak_memory_bytes=4)
    >>> c = replace(a, schedule="c", step_time_ns=8, peak_memory_bytes=6)
    >>> [(p.schedule, p.rank, p.pareto) for p in rank_points([c, b, a])]
    [('a', 1, True), ('b', 2, True), ('c', 3, False)]
    """
    ordered = sorted(points, key=_order)
    ranked = []
    best_memory: int | None = None
    rank = 0
    for point in ordered:
        if point.fits:
            rank += 1
            memory = point.peak_memory_bytes
            assert memory is not None
            on_front = best_memory is None or memory < best_memory
            if on_front:
                best_memory = memory
            ranked.append(replace(point, rank=rank, pareto=on_front))
        else:
            ranked.append(replace(point, rank=None, pareto=False))
    return tuple(ranked)


@dataclass(frozen=True, slots=True, kw_only=True)
class PlanResult:
    """Every point of a sweep, ranked, and what was asked."""

    model: str
    accelerator: Accelerator
    devices: int
    global_batch: int
    memory_capacity_bytes: int
    points: tuple[PlanPoint, ...]
    """Ranked (see :func:`rank_points`)."""
    engine: str = "fast"

    @property
    def best(self) -> PlanPoint | None:
        """The recommended configuration (None if nothing fits)."""
        first = self.points[0] if self.points else None
        return first if first is not None and first.fits else None

    @property
    def fitting(self) -> tuple[PlanPoint, ...]:
        """Points that fit, fastest first."""
        return tuple(p for p in self.points if p.fits)

    @property
    def pareto(self) -> tuple[PlanPoint, ...]:
        """The Pareto front (fastest first)."""
        return tuple(p for p in self.points if p.pareto)

    def to_dict(self) -> dict[str, Any]:
        """The ``pipesim plan --json`` object."""
        best = self.best
        return {
            "model": self.model,
            "accelerator": self.accelerator.name,
            "accelerator_spec": self.accelerator.to_dict(),
            "devices": self.devices,
            "global_batch": self.global_batch,
            "memory_capacity_bytes": self.memory_capacity_bytes,
            "engine": self.engine,
            "n_points": len(self.points),
            "n_fitting": len(self.fitting),
            "best": None if best is None else best.to_dict(),
            "reason": explain(self),
            "points": [p.to_dict() for p in self.points],
        }


def _gb(n_bytes: int | None) -> str:
    return "?" if n_bytes is None else f"{n_bytes / 1e9:.1f} GB"


def explain(result: PlanResult, /) -> str:
    """One line: why the winner wins (or why nothing fits)."""
    best = result.best
    capacity = _gb(result.memory_capacity_bytes)
    if best is None:
        feasible = [p for p in result.points if p.feasible]
        if not feasible:
            return "no configuration is feasible: every schedule refused every configuration"
        least = min(feasible, key=lambda p: p.peak_memory_bytes or 0)
        return (
            f"nothing fits in {capacity} per device; the least memory is "
            f"{_gb(least.peak_memory_bytes)} ({least.label()}): add devices, lower the "
            "micro-batch size, or use an accelerator with more memory"
        )
    assert best.step_time_ns is not None and best.bubble is not None
    parts = [
        f"{best.label()} is the fastest configuration that fits: "
        f"{best.step_time_ns / 1e9:.3g} s/step, {_gb(best.peak_memory_bytes)} of {capacity}, "
        f"bubble {float(best.bubble):.1%}"
    ]
    other = next((p for p in result.fitting if p.schedule != best.schedule), None)
    if other is not None and other.step_time_ns:
        gain = other.step_time_ns / best.step_time_ns - 1
        parts.append(f"{gain:.1%} faster than the best {other.schedule} ({other.label()})")
    faster = [
        p
        for p in result.points
        if p.feasible and not p.fits and (p.step_time_ns or 0) < best.step_time_ns
    ]
    if faster:
        parts.append(f"{len(faster)} faster configurations need more memory than {capacity}")
    return "; ".join(parts)
