"""Trace -> the numbers a planner wants: makespan, busy / idle, bubble, peak memory.

Definitions (the output contract of docs/architecture.md):

- ``makespan``: end of the last action or transfer; a step starts at 0.
- ``busy`` of a rank: the summed duration of its work; ``idle = makespan - busy``.
- ``bubble_ratio``: idle share of ``n_ranks x makespan``.
- ``idle_slots``: total idle time in units of one stage's forward time (the
  pipeline chapter's "slot"; the mean forward time when stages differ); None when
  forwards take no time, rather than a 0 that would contradict a non-zero ``idle``.
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
from pipesim.exact import Time, as_number, whole_or_fraction
from pipesim.schedule import Schedule
from pipesim.trace import ActionRecord, CommRecord, Trace

__all__ = [
    "Metrics",
    "RankMetrics",
    "SpanMetrics",
    "compute_metrics",
    "idle_intervals",
    "idle_intervals_by_rank",
    "metrics_from_totals",
    "span_metrics",
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
    idle_slots: Fraction | int | None
    """Idle time in slots; None when forwards take no time (there is no slot to count in)."""
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
            "idle_slots": None if self.idle_slots is None else as_number(self.idle_slots),
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


@dataclass(frozen=True, slots=True, kw_only=True)
class SpanMetrics:
    """Each rank's span, first start to last end of its work, and the bubble against the
    longest: the zero-bubble paper's metric (Qi et al., ICLR 2024, Table 5: ``cost`` is
    the largest execution time of any stage, and the bubble rate ``(cost - m (T_F + T_B +
    T_W)) / cost``). Unlike the makespan, a span does not count the fill a rank waits
    through before its first work, which the next step's work can use when the ranks do
    not wait for each other between steps (the paper's optimizer post-validation)."""

    spans: tuple[Time, ...]
    """Per rank, last end - first start of its work (0 for a rank with none)."""
    longest: Time
    """The largest span: the paper's ``cost``."""
    bubble_ratio: Fraction
    """Idle share of ranks x the longest span: ``1 - sum(busy) / (n_ranks * longest)``,
    the paper's rate when every rank is as busy as the others."""

    def to_dict(self) -> dict[str, Any]:
        return {
            "spans": [as_number(s) for s in self.spans],
            "longest_span": as_number(self.longest),
            "span_bubble_ratio": float(self.bubble_ratio),
        }


def span_metrics(trace: Trace, /) -> SpanMetrics:
    """The spans of ``trace``'s ranks and the bubble against the longest (exact).

    >>> from pipesim.costs import CostModel
    >>> from pipesim.engine import simulate
    >>> from pipesim.schedules import generate
    >>> sim = simulate(generate("gpipe", n_ranks=2, n_microbatches=2, forward_only=True),
    ...                costs=CostModel.uniform(forward=1))
    >>> m = span_metrics(sim.trace)   # rank 0 works 0..2, rank 1 works 1..3
    >>> m.spans, m.longest, m.bubble_ratio
    ((2, 2), 2, Fraction(0, 1))
    """
    first: list[Time | None] = [None] * trace.n_ranks
    last: list[Time] = [0] * trace.n_ranks
    records: Iterable[ActionRecord | CommRecord] = (*trace.actions, *trace.comms)
    for record in records:  # a send or receive holds its rank too
        r = record.rank
        start = first[r]
        first[r] = record.start if start is None else min(start, record.start)
        last[r] = max(last[r], record.end)
    spans = tuple(0 if f is None else last[r] - f for r, f in enumerate(first))
    longest = max(spans, default=0)
    busy = sum(trace.totals().busy, start=0)
    capacity = trace.n_ranks * longest
    ratio = Fraction(0) if not capacity else 1 - Fraction(busy) / Fraction(capacity)
    return SpanMetrics(spans=spans, longest=longest, bubble_ratio=ratio)


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
    slot = whole_or_fraction(
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
        idle_slots=whole_or_fraction(Fraction(total_idle) / slot) if slot else None,
        ranks=ranks,
        memory_capacity_bytes=costs.memory_capacity_bytes,
        time_unit=costs.time_unit,
    )


def error_percent(predicted: Time | float, measured: Time | float, /) -> float:
    """A prediction's error against a measurement, ``(predicted - measured) / measured``
    in percent: positive when the prediction is too slow; 0 when both are 0, infinite
    when only the measurement is.

    >>> error_percent(110, 100), error_percent(Fraction(9, 2), 5)
    (10.0, -10.0)
    """
    if measured == 0:
        return 0.0 if predicted == 0 else float("inf")
    return float((Fraction(predicted) - Fraction(measured)) / Fraction(measured) * 100)


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
