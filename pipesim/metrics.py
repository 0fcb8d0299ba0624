"""Trace -> the numbers a planner wants: makespan, busy / idle, bubble, peak memory.

Definitions (the output contract of docs/architecture.md):

- ``makespan``: end of the last action or transfer; a step starts at 0.
- ``busy`` of a rank: the summed duration of its work; ``idle = makespan - busy``.
- ``bubble_ratio``: idle share of ``n_ranks x makespan``.
- ``idle_slots``: total idle time in units of one stage's forward time (the
  pipeline chapter's "slot"; the mean forward time when stages differ).
- ``peak_activation_bytes`` / ``peak_inflight``: the most activation bytes, and
  stage-micro-batch activations, a rank holds at once.

All are exact (ints or Fractions) when the trace's times are.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

from pipesim.costs import CostModel
from pipesim.exact import Time, as_number
from pipesim.schedule import Schedule
from pipesim.trace import ActionRecord, CommRecord, Trace

__all__ = [
    "Metrics",
    "RankMetrics",
    "compute_metrics",
    "idle_intervals",
    "idle_intervals_by_rank",
    "metrics_from_totals",
]


@dataclass(frozen=True, slots=True, kw_only=True)
class RankMetrics:
    """One rank's share of a step."""

    rank: int
    busy: Time
    idle: Time
    peak_activation_bytes: int
    peak_inflight: int
    param_bytes: int
    """Parameter bytes of the stages on this rank (from the cost model)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Metrics:
    """Step-level metrics of a trace."""

    schedule: str
    n_ranks: int
    n_stages: int
    n_microbatches: int
    makespan: Time
    busy: Time
    idle: Time
    bubble_ratio: Fraction
    slot: Time
    """The forward time of one stage, the unit of ``idle_slots``."""
    idle_slots: Fraction | int
    ranks: tuple[RankMetrics, ...]
    memory_capacity_bytes: int | None = None
    time_unit: str = "unit"
    """The unit of every time above (see :mod:`pipesim.units`)."""

    @property
    def efficiency(self) -> Fraction:
        """``1 - bubble_ratio``: the busy share (the chapter's m/(m+s-1))."""
        return 1 - self.bubble_ratio

    @property
    def peak_activation_bytes(self) -> int:
        """The largest peak of any rank."""
        return max((r.peak_activation_bytes for r in self.ranks), default=0)

    @property
    def fits(self) -> bool | None:
        """Whether every rank's peak activations fit the capacity (None if unknown)."""
        if self.memory_capacity_bytes is None:
            return None
        return all(
            r.peak_activation_bytes + r.param_bytes <= self.memory_capacity_bytes
            for r in self.ranks
        )

    def to_dict(self) -> dict[str, Any]:
        """The JSON object of the ``pipesim simulate --json`` contract (docs/architecture.md)."""
        return {
            "schedule": self.schedule,
            "n_ranks": self.n_ranks,
            "n_stages": self.n_stages,
            "n_microbatches": self.n_microbatches,
            "time_unit": self.time_unit,
            "makespan": as_number(self.makespan),
            "busy": as_number(self.busy),
            "idle": as_number(self.idle),
            "bubble_ratio": float(self.bubble_ratio),
            "efficiency": float(self.efficiency),
            "idle_slots": as_number(self.idle_slots),
            "slot": as_number(self.slot),
            "peak_activation_bytes": self.peak_activation_bytes,
            "memory_capacity_bytes": self.memory_capacity_bytes,
            "fits": self.fits,
            "ranks": [
                {
                    "rank": r.rank,
                    "busy": as_number(r.busy),
                    "idle": as_number(r.idle),
                    "peak_activation_bytes": r.peak_activation_bytes,
                    "peak_inflight": r.peak_inflight,
                    "param_bytes": r.param_bytes,
                }
                for r in self.ranks
            ],
        }


def compute_metrics(trace: Trace, /, *, schedule: Schedule, costs: CostModel) -> Metrics:
    """Metrics of ``trace``, a step of ``schedule`` under ``costs``."""
    totals = trace.totals()
    return metrics_from_totals(
        schedule=schedule,
        costs=costs,
        makespan=totals.makespan,
        busy=totals.busy,
        peak_activation_bytes=totals.peak_activation_bytes,
        peak_inflight=totals.peak_inflight,
    )


def metrics_from_totals(
    *,
    schedule: Schedule,
    costs: CostModel,
    makespan: Time,
    busy: Sequence[Time],
    peak_activation_bytes: Sequence[int],
    peak_inflight: Sequence[int],
) -> Metrics:
    """Metrics from per-rank totals; every evaluator (trace or fast path) ends here."""
    costs = costs.for_stages(schedule.n_stages)
    n_ranks = schedule.n_ranks
    # One pass over the placement (not stages_of per rank, which grows with ranks x stages).
    param_bytes = [0] * n_ranks
    for stage, rank in enumerate(schedule.placement):
        param_bytes[rank] += costs.stage(stage).param_bytes
    ranks = tuple(
        RankMetrics(
            rank=rank,
            busy=busy[rank],
            idle=makespan - busy[rank],
            peak_activation_bytes=peak_activation_bytes[rank],
            peak_inflight=peak_inflight[rank],
            param_bytes=param_bytes[rank],
        )
        for rank in range(n_ranks)
    )
    total_busy = sum(busy, start=0)
    total_idle = n_ranks * makespan - total_busy
    capacity = Fraction(n_ranks * makespan)
    slot = _exact(
        Fraction(sum(costs.stage(s).forward for s in range(schedule.n_stages)), schedule.n_stages)
    )
    return Metrics(
        schedule=schedule.name,
        n_ranks=n_ranks,
        n_stages=schedule.n_stages,
        n_microbatches=schedule.n_microbatches,
        makespan=makespan,
        busy=total_busy,
        idle=total_idle,
        bubble_ratio=Fraction(total_idle) / capacity if capacity else Fraction(0),
        slot=slot,
        idle_slots=_exact(Fraction(total_idle) / slot) if slot else 0,
        ranks=ranks,
        memory_capacity_bytes=costs.memory_capacity_bytes,
        time_unit=costs.time_unit,
    )


def idle_intervals(trace: Trace, rank: int, /) -> tuple[tuple[Time, Time], ...]:
    """The ``(start, end)`` gaps in which ``rank`` runs nothing, within the makespan.

    >>> from pipesim.engine import simulate
    >>> from pipesim.schedules import generate
    >>> sim = simulate(generate("gpipe", n_ranks=2, n_microbatches=4, forward_only=True))
    >>> idle_intervals(sim.trace, 0), idle_intervals(sim.trace, 1)
    (((4, 5),), ((0, 1),))
    """
    held: list[ActionRecord | CommRecord] = [*trace.rank_actions(rank)]
    held += [c for c in trace.comms if c.rank == rank]
    return _gaps(held, trace.makespan)


def idle_intervals_by_rank(trace: Trace, /) -> tuple[tuple[tuple[Time, Time], ...], ...]:
    """:func:`idle_intervals` of every rank, in one pass over the trace (calling it per
    rank reads every record once per rank: ranks x actions).

    >>> from pipesim.engine import simulate
    >>> from pipesim.schedules import generate
    >>> sim = simulate(generate("gpipe", n_ranks=2, n_microbatches=4, forward_only=True))
    >>> idle_intervals_by_rank(sim.trace)
    (((4, 5),), ((0, 1),))
    """
    by_rank: list[list[ActionRecord | CommRecord]] = [[] for _ in range(trace.n_ranks)]
    for record in trace.actions:
        by_rank[record.rank].append(record)
    for comm in trace.comms:  # a send or receive holds its rank for its overhead
        by_rank[comm.rank].append(comm)
    makespan = trace.makespan
    return tuple(_gaps(records, makespan) for records in by_rank)


def _gaps(
    records: Iterable[ActionRecord | CommRecord], makespan: Time
) -> tuple[tuple[Time, Time], ...]:
    gaps = []
    cursor: Time = 0
    for record in sorted(records, key=lambda r: r.start):
        if record.start > cursor:
            gaps.append((cursor, record.start))
        cursor = max(cursor, record.end)
    if makespan > cursor:
        gaps.append((cursor, makespan))
    return tuple(gaps)


def _exact(value: Fraction) -> Time:
    return value.numerator if value.denominator == 1 else value
