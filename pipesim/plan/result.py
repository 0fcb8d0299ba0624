"""Plan results: one :class:`PlanPoint` per configuration, ranked, Pareto front marked.

Ranking: configurations that fit in memory first, fastest step first (then
least memory); then those that do not fit, least memory first; then the
infeasible ones. The Pareto front is taken over the configurations that fit:
a point is on it when no other fitting point is at least as fast and uses at
most as much memory, with one of the two strictly better.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields, replace
from fractions import Fraction
from typing import Any

from pipesim.plan.hardware import Accelerator
from pipesim.plan.point import Point
from pipesim.units import NS_PER_S, format_bytes

__all__ = [
    "PlanPoint",
    "PlanResult",
    "alternatives",
    "compare_step_times",
    "explain",
    "from_plan_point",
    "rank_points",
    "to_plan_point",
]


@dataclass(frozen=True, slots=True, kw_only=True)
class PlanPoint(Point):
    """One configuration (a :class:`~pipesim.plan.point.Point`: a dimension added there is
    a PlanPoint's too) and what it costs."""

    n_stages: int | None = None
    """Stages the model is cut into (``p * v`` for interleaved schedules)."""
    layers_per_stage: tuple[int, ...] = ()
    """Layers (embedding and head included) on each stage."""
    step_time_ns: int | None = None
    """The whole iteration: pipeline time + exposed data-parallel traffic + optimizer
    step, integer nanoseconds."""
    pipeline_time_ns: int | None = None
    """The pipeline schedule's makespan, tensor-parallel traffic inside F / I included."""
    tp_comm_time_ns: int | None = None
    """Tensor- and context-parallel communication not hidden under compute, inside the
    pipeline time (busiest rank; part of it)."""
    dp_comm_time_ns: int | None = None
    """Data-parallel traffic not hidden behind compute (added to the pipeline time)."""
    dp_comm_total_ns: int | None = None
    """All data-parallel traffic of the busiest rank, hidden or not."""
    optimizer_time_ns: int | None = None
    """Optimizer step (added to the pipeline time)."""
    pp_comm_time_ns: int | None = None
    """How much longer the pipeline is for its sends between stages (its makespan less
    the same schedule's with free links); measured for the best configuration only."""
    allreduce_time_ns: int | None = None
    """What follows the pipeline: exposed data-parallel traffic + optimizer step."""
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
    """1 = recommended; only configurations that fit are ranked (and, in a pruned plan,
    only those faster than every configuration pruned: the rank of a slower one is
    unknown, None)."""
    pareto: bool = False
    """On the step-time / memory Pareto front (of configurations that fit)."""
    evaluated: bool = True
    """False when the sweep stopped (deadline, Ctrl-C) before reaching this point."""
    period_sync: str = "global"
    """The optimizer synchronization whose steady-state iteration period ``step_time_ns``
    is (:mod:`pipesim.iterations`): ``global``, pipeline + dp_comm + optimizer; another
    where the plan re-simulated this point under it (:mod:`pipesim.plan.period`)."""

    @property
    def feasible(self) -> bool:
        """Simulated (the schedule accepted the configuration)."""
        return self.step_time_ns is not None

    @property
    def step_time_s(self) -> float | None:
        """Step time in seconds."""
        return None if self.step_time_ns is None else self.step_time_ns / NS_PER_S

    @property
    def bubble_time_ns(self) -> int | None:
        """Idle time inside the pipeline: ``bubble x pipeline time``."""
        if self.bubble is None or self.pipeline_time_ns is None:
            return None
        return round(self.bubble * self.pipeline_time_ns)

    def label(self) -> str:
        """A short description: ``1f1b t=8 p=4 v=1 d=2 b=2 m=16 sp recompute=full zero1``.

        >>> PlanPoint(schedule="1f1b", pipeline=4, virtual=1, data_parallel=2,
        ...           microbatch_size=1, n_microbatches=8, tensor=8, sequence_parallel=True,
        ...           recompute="selective", distributed_optimizer=True).label()
        '1f1b t=8 p=4 v=1 d=2 b=1 m=8 sp recompute=selective zero1'
        """
        text = (
            f"{self.schedule} t={self.tensor} p={self.pipeline} v={self.virtual} "
            f"d={self.data_parallel} b={self.microbatch_size} m={self.n_microbatches}"
        )
        if self.context_parallel > 1:
            text += f" c={self.context_parallel}"
        if self.expert_parallel > 1:
            text += f" e={self.expert_parallel}"
        if self.expert_tensor > 1:
            text += f" et={self.expert_tensor}"
        if self.sequence_parallel:
            text += " sp"
        if self.recompute != "none":
            text += f" recompute={self.recompute}"
        if self.distributed_optimizer:
            text += " zero1"
        return text

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready fields (bubble as a float, times in seconds and nanoseconds)."""
        return {
            "rank": self.rank,
            "schedule": self.schedule,
            "pipeline": self.pipeline,
            "virtual": self.virtual,
            "tensor_parallel": self.tensor,
            "data_parallel": self.data_parallel,
            "context_parallel": self.context_parallel,
            "expert_parallel": self.expert_parallel,
            "expert_tensor_parallel": self.expert_tensor,
            "sequence_parallel": self.sequence_parallel,
            "recompute": self.recompute,
            "distributed_optimizer": self.distributed_optimizer,
            "microbatch_size": self.microbatch_size,
            "n_microbatches": self.n_microbatches,
            "n_stages": self.n_stages,
            "layers_per_stage": list(self.layers_per_stage),
            "step_time_s": self.step_time_s,
            "step_time_ns": self.step_time_ns,
            "parts_s": self.parts_s(),
            "pipeline_time_ns": self.pipeline_time_ns,
            "tp_comm_time_ns": self.tp_comm_time_ns,
            "dp_comm_time_ns": self.dp_comm_time_ns,
            "dp_comm_total_ns": self.dp_comm_total_ns,
            "optimizer_time_ns": self.optimizer_time_ns,
            "pp_comm_time_ns": self.pp_comm_time_ns,
            "bubble_time_ns": self.bubble_time_ns,
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
            "evaluated": self.evaluated,
            "period_sync": self.period_sync,
        }

    def parts_s(self) -> dict[str, float] | None:
        """The iteration in seconds, part by part: ``pipeline`` (the schedule's
        makespan, which contains ``tp_comm`` (exposed tensor- and context-parallel
        communication of the busiest rank), ``bubble`` (ranks' mean idle time, pipeline
        sends waited on included) and ``compute``, the rest), then ``dp_comm`` (exposed)
        and ``optimizer``, which follow it; ``step = pipeline + dp_comm + optimizer``.
        For the best configuration ``pp_comm`` says how much of the pipeline its sends
        between stages cost (mostly inside ``bubble``: ranks wait for them)."""
        if self.step_time_ns is None:
            return None

        def s(ns: int | None) -> float:
            return 0.0 if ns is None else ns / NS_PER_S

        compute = s(self.pipeline_time_ns) - s(self.tp_comm_time_ns) - s(self.bubble_time_ns)
        pp = {} if self.pp_comm_time_ns is None else {"pp_comm": s(self.pp_comm_time_ns)}
        return pp | {
            "compute": max(0.0, compute),
            "pipeline": s(self.pipeline_time_ns),
            "tp_comm": s(self.tp_comm_time_ns),
            "bubble": s(self.bubble_time_ns),
            "dp_comm": s(self.dp_comm_time_ns),
            "dp_comm_hidden": s((self.dp_comm_total_ns or 0) - (self.dp_comm_time_ns or 0)),
            "optimizer": s(self.optimizer_time_ns),
            # what the next step's start overlaps of this one's (a sync other than global)
            "next_step_overlap": s(
                (self.pipeline_time_ns or 0)
                + (self.allreduce_time_ns or 0)
                - (self.step_time_ns or 0)
            ),
            "step": s(self.step_time_ns),
        }


def to_plan_point(point: Point, /) -> PlanPoint:
    """``point`` as a ranked configuration, nothing measured yet."""
    return PlanPoint(**{f.name: getattr(point, f.name) for f in fields(Point)})


def from_plan_point(point: PlanPoint, /) -> Point:
    """The sweep's configuration behind a ranked ``point`` alone (the converse of
    :func:`to_plan_point`): what workers are sent and compare."""
    return Point(**{f.name: getattr(point, f.name) for f in fields(Point)})


def _order(point: PlanPoint) -> tuple[Any, ...]:
    tie = (
        point.schedule,
        point.tensor,
        point.pipeline,
        point.virtual,
        point.microbatch_size,
        point.recompute,
        point.sequence_parallel,
        point.distributed_optimizer,
        point.context_parallel,
        point.expert_parallel,
        point.expert_tensor,
    )
    if point.fits:
        return (0, point.step_time_ns, point.peak_memory_bytes, *tie)
    if point.feasible:
        return (1, point.peak_memory_bytes, point.step_time_ns, *tie)
    return (2 if point.evaluated else 3, 0, 0, *tie)


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
    """Device memory the plan was made for (the accelerator's, or ``--memory-capacity``)."""
    points: tuple[PlanPoint, ...]
    """Ranked (see :func:`rank_points`)."""
    engine: str = "fast"
    memory_headroom: float = 0.0
    """Share of the capacity kept free (allocator fragmentation, workspaces)."""
    min_mfu: float | None = None
    """The least MFU a winner must reach to be recommended (None: no bar)."""
    stopped: str | None = None
    """Why the sweep stopped early (deadline, Ctrl-C); None when complete."""
    n_duplicates: int = 0
    n_pruned: int = 0
    """Configurations not simulated because exact bounds keep them out of every printed
    row (:mod:`pipesim.plan.prune`); listed with a ``pruned:`` reason."""
    """Configurations dropped as identical to one listed (same per-rank orders, costs)."""
    n_layers: int = 0
    """Transformer blocks of the model (for framework settings; 0 if unknown)."""
    seq_length: int | None = None
    tp_comm_overlap: bool = False
    """Tensor-parallel collectives were hidden under GEMMs (``--tp-comm-overlap``)."""
    overlap_p2p: bool = False
    """Pipeline sends ran beside compute (``--overlap-p2p``)."""
    dtype: str | None = None
    """The training precision the plan priced (None: the model's own)."""
    grad_reduce_in_bf16: bool = False
    """The model keeps and reduces its gradients in bf16 (``--grad-reduce-in-bf16``)."""
    fp8_recipe: str | None = None
    """An fp8 plan's scaling recipe (``delayed``, ``tensorwise``; ``--fp8-recipe``);
    None for other precisions."""
    optimizer_sync: str = "global"
    """The optimizer synchronization the plan ranks by (its steady-state period)."""
    period_candidates: int = 0
    """With a sync other than ``global``: the fastest configurations (by the global
    period) re-simulated under it; the others keep the global period, never shorter."""

    @property
    def usable_memory_bytes(self) -> int:
        """What a configuration may use: capacity minus the headroom."""
        return math.floor(self.memory_capacity_bytes * (1 - self.memory_headroom))

    @property
    def best(self) -> PlanPoint | None:
        """The fastest configuration that fits (None if nothing fits)."""
        first = self.points[0] if self.points else None
        return first if first is not None and first.fits else None

    @property
    def recommended(self) -> PlanPoint | None:
        """:attr:`best` when it reaches ``min_mfu``; None when nothing fits or nothing
        that fits runs at a sane efficiency."""
        best = self.best
        if best is None or self.min_mfu is None or best.mfu is None:
            return best
        return best if best.mfu >= self.min_mfu else None

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
        from pipesim.plan.frameworks import megatron_args, torchtitan_args

        best = self.recommended
        return {
            "model": self.model,
            "accelerator": self.accelerator.name,
            "accelerator_spec": self.accelerator.to_dict(),
            "devices": self.devices,
            "global_batch": self.global_batch,
            "memory_capacity_bytes": self.memory_capacity_bytes,
            "memory_headroom": self.memory_headroom,
            "usable_memory_bytes": self.usable_memory_bytes,
            "min_mfu": self.min_mfu,
            "engine": self.engine,
            "optimizer_sync": self.optimizer_sync,
            "period_candidates": self.period_candidates,
            "complete": self.stopped is None,
            "stopped": self.stopped,
            "n_points": len(self.points),
            "n_fitting": len(self.fitting),
            "n_duplicates": self.n_duplicates,
            "n_pruned": self.n_pruned,
            "best": None if best is None else best.to_dict(),
            "megatron_args": None if best is None else megatron_args(self, best),
            "torchtitan_args": None if best is None else torchtitan_args(self, best),
            "reason": explain(self),
            "points": [p.to_dict() for p in self.points],
        }


def _bytes(n_bytes: int | None) -> str:
    return "?" if n_bytes is None else format_bytes(n_bytes)


_DIMENSIONS = (
    ("tensor", "t"),
    ("pipeline", "p"),
    ("recompute", "recompute"),
    ("schedule", "schedule"),
    ("microbatch_size", "b"),
)


def alternatives(result: PlanResult, /) -> list[tuple[str, PlanPoint]]:
    """For each dimension (t, p, recompute, schedule, b), the fastest configuration that
    fits with another value than the winner's, as ``(what differs, point)``, fastest
    first: why the winner wins, one alternative at a time."""
    best = result.best
    if best is None:
        return []
    found: list[tuple[str, PlanPoint]] = []
    listed: set[str] = set()
    for field, short in _DIMENSIONS:
        mine = getattr(best, field)
        seen = set()
        for point in result.fitting:
            value = getattr(point, field)
            if value == mine or value in seen:
                continue
            seen.add(value)
            if point.label() not in listed:  # one point may differ in several dimensions
                listed.add(point.label())
                found.append((f"{short}={value}", point))
    found.sort(key=lambda item: item[1].step_time_ns or 0)
    return found


def compare_step_times(best_ns: float, other_ns: float, /) -> str:
    """How the winner's step time reads beside another's: never "0.0% faster" (two
    configurations can tie exactly, as 1F1B and GPipe on one stage do).

    >>> compare_step_times(100, 112), compare_step_times(100, 100)
    ('12.0% faster than', 'same step time as')
    >>> compare_step_times(10**6, 10**6 + 1), compare_step_times(112, 100)
    ('under 0.1% faster than', '10.7% slower than')
    """
    gain = other_ns / best_ns - 1
    if other_ns == best_ns:
        return "same step time as"
    if 0 < gain < 0.0005:  # would print as 0.0%
        return "under 0.1% faster than"
    if -0.0005 < gain < 0:
        return "under 0.1% slower than"
    return f"{abs(gain):.1%} {'faster' if gain > 0 else 'slower'} than"


def explain(result: PlanResult, /) -> str:
    """One line: why the winner wins (or why nothing is recommended)."""
    best = result.best
    usable = _bytes(result.usable_memory_bytes)
    prefix = ""
    if result.stopped is not None:
        done = sum(p.evaluated for p in result.points)
        prefix = f"partial plan ({result.stopped}; {done} of {len(result.points)} evaluated): "
    if best is None:
        feasible = [p for p in result.points if p.feasible]
        if not feasible:
            return (
                prefix + "no configuration is feasible: every schedule refused every configuration"
            )
        least = min(feasible, key=lambda p: p.peak_memory_bytes or 0)
        return prefix + (
            f"nothing fits in {usable} per device ({_bytes(result.memory_capacity_bytes)} less "
            f"{result.memory_headroom:.0%} headroom); the least memory is "
            f"{_bytes(least.peak_memory_bytes)} ({least.label()}): add devices, use tensor "
            "parallelism, recomputation or the distributed optimizer, lower the micro-batch "
            "size, or use an accelerator with more memory"
        )
    assert best.step_time_ns is not None and best.bubble is not None
    if result.recommended is None:
        return prefix + (
            f"no configuration reaches a sane efficiency: the fastest that fits, "
            f"{best.label()}, takes {best.step_time_ns / NS_PER_S:.3g} s/step at "
            f"{best.mfu or 0:.1%} MFU, below {result.min_mfu or 0:.1%}; add devices, or "
            "allow tensor parallelism and recomputation"
        )
    mfu = "" if best.mfu is None else f", MFU {best.mfu:.1%}"
    parts = [
        f"{best.label()} is the fastest configuration that fits: "
        f"{best.step_time_ns / NS_PER_S:.3g} s/step{mfu}, {_bytes(best.peak_memory_bytes)} of "
        f"{usable} usable, bubble {float(best.bubble):.1%}"
    ]
    for what, other in alternatives(result)[:2]:
        if other.step_time_ns:
            versus = compare_step_times(best.step_time_ns, other.step_time_ns)
            parts.append(f"{versus} the best with {what} ({other.label()})")
    faster = [
        p
        for p in result.points
        if p.feasible and not p.fits and (p.step_time_ns or 0) < best.step_time_ns
    ]
    if faster:
        parts.append(f"{len(faster)} faster configurations need more memory than {usable}")
    return prefix + "; ".join(parts)
