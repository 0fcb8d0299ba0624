"""The Trace: everything that happened in one simulated (or measured) step.

A trace is plain data: every unit of work with its rank, start and end; every
transfer with its ranks, bytes, start and arrival; every change of a rank's
activation memory; for a comms schedule, every send and receive. Metrics, plots
and Perfetto export read it; ``verify`` builds one from measured times so that
measured and predicted steps are compared with the same code.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from pipesim.actions import Action, Comm, Op, Work
from pipesim.exact import Time
from pipesim.step.memory import level_peaks

__all__ = ["ActionRecord", "CommRecord", "MemoryRecord", "Trace", "TraceTotals", "TransferRecord"]


@dataclass(frozen=True, slots=True, kw_only=True)
class ActionRecord:
    """One unit of work run on ``rank`` from ``start`` to ``end``."""

    rank: int
    work: Work
    start: Time
    end: Time

    @property
    def duration(self) -> Time:
        """``end - start``."""
        return self.end - self.start


@dataclass(frozen=True, slots=True, kw_only=True)
class TransferRecord:
    """An activation (after F) or gradient (after B or I) sent between ranks.

    ``start`` is when the message got its link, ``end`` when it arrived.
    """

    src_rank: int
    dst_rank: int
    producer: Action
    consumer: Action
    n_bytes: int
    start: Time
    end: Time


@dataclass(frozen=True, slots=True, kw_only=True)
class CommRecord:
    """A send or receive of a comms schedule, holding ``rank`` from ``start`` to ``end``.

    A send holds its rank for its overhead, a receive for its overhead once the message
    has arrived (:mod:`pipesim.engine`); ``posted`` is when the rank reached it, so a
    receive waited ``start - posted`` for its message. ``peer`` is the rank at the other
    end, ``n_bytes`` the message's size.
    """

    rank: int
    comm: Comm
    peer: int
    n_bytes: int
    posted: Time
    start: Time
    end: Time

    @property
    def duration(self) -> Time:
        """``end - start``."""
        return self.end - self.start


@dataclass(frozen=True, slots=True, kw_only=True)
class MemoryRecord:
    """A rank's activation memory right after a change at ``time``."""

    rank: int
    time: Time
    activation_bytes: int
    inflight: int
    """Stage-micro-batch activations held (allocated by F, not yet fully freed)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class TraceTotals:
    """Per-rank totals of a trace: what :class:`~pipesim.metrics.Metrics` needs."""

    makespan: Time
    busy: tuple[Time, ...]
    """Per rank, the summed duration of its work (and of its sends and receives)."""
    peak_activation_bytes: tuple[int, ...]
    """Per rank, the most activation bytes held at once."""
    peak_inflight: tuple[int, ...]
    """Per rank, the most stage-micro-batches in flight at once."""


class Trace:
    """All records of one step, each tuple sorted by (start or time, rank).

    Build one from records (``Trace(n_ranks=..., actions=..., transfers=...,
    memory=...)``), or, as the engine does, with :meth:`deferred`: the records
    are then made on first access, and :meth:`totals` (hence the metrics) needs
    none of them. A trace is immutable either way; two traces are equal when
    their records are.

    >>> t = Trace(n_ranks=1, actions=(ActionRecord(rank=0, work=_EXAMPLE, start=0, end=2),))
    >>> t.makespan, t.totals().busy
    (2, (2,))
    """

    __slots__ = ("_actions", "_comms", "_memory", "_totals", "_transfers", "n_ranks")

    n_ranks: int
    _actions: tuple[ActionRecord, ...] | Callable[[], tuple[ActionRecord, ...]]
    _transfers: tuple[TransferRecord, ...] | Callable[[], tuple[TransferRecord, ...]]
    _memory: tuple[MemoryRecord, ...] | Callable[[], tuple[MemoryRecord, ...]]
    _comms: tuple[CommRecord, ...] | Callable[[], tuple[CommRecord, ...]]
    _totals: TraceTotals | None

    def __init__(
        self,
        *,
        n_ranks: int,
        actions: Sequence[ActionRecord],
        transfers: Sequence[TransferRecord] = (),
        memory: Sequence[MemoryRecord] = (),
        comms: Sequence[CommRecord] = (),
    ) -> None:
        _set = object.__setattr__
        _set(self, "n_ranks", n_ranks)
        _set(self, "_actions", tuple(actions))
        _set(self, "_transfers", tuple(transfers))
        _set(self, "_memory", tuple(memory))
        _set(self, "_comms", tuple(comms))
        _set(self, "_totals", None)

    @classmethod
    def deferred(
        cls,
        *,
        n_ranks: int,
        actions: Callable[[], tuple[ActionRecord, ...]],
        transfers: Callable[[], tuple[TransferRecord, ...]],
        memory: Callable[[], tuple[MemoryRecord, ...]],
        totals: TraceTotals,
        comms: Callable[[], tuple[CommRecord, ...]] | None = None,
    ) -> Trace:
        """A trace whose records each builder makes once, when first read; ``totals``
        must be what :meth:`totals` would compute from them."""
        trace = cls.__new__(cls)
        _set = object.__setattr__
        _set(trace, "n_ranks", n_ranks)
        _set(trace, "_actions", actions)
        _set(trace, "_transfers", transfers)
        _set(trace, "_memory", memory)
        _set(trace, "_comms", () if comms is None else comms)
        _set(trace, "_totals", totals)
        return trace

    def __setattr__(self, name: str, value: object) -> None:
        raise AttributeError(f"a Trace is immutable; cannot set {name!r}")

    def _built(self, name: str) -> Any:
        """The records in slot ``name``, built on first use when it holds a builder."""
        value = getattr(self, name)
        if callable(value):
            value = value()
            object.__setattr__(self, name, value)
        return value

    @property
    def actions(self) -> tuple[ActionRecord, ...]:
        """Every unit of work, sorted by (start, rank)."""
        return self._built("_actions")  # type: ignore[no-any-return]

    @property
    def transfers(self) -> tuple[TransferRecord, ...]:
        """Every message, sorted by (start, source rank, destination rank)."""
        return self._built("_transfers")  # type: ignore[no-any-return]

    @property
    def memory(self) -> tuple[MemoryRecord, ...]:
        """Every change of a rank's activation memory, sorted by (time, rank)."""
        return self._built("_memory")  # type: ignore[no-any-return]

    @property
    def comms(self) -> tuple[CommRecord, ...]:
        """Every send and receive of a comms schedule, sorted by (start, rank)."""
        return self._built("_comms")  # type: ignore[no-any-return]

    def totals(self) -> TraceTotals:
        """Makespan, and per rank busy time and memory peaks."""
        if self._totals is None:
            busy: list[Time] = [0] * self.n_ranks
            for record in self.actions:
                busy[record.rank] += record.end - record.start
            for comm in self.comms:  # a send or receive holds its rank for its overhead
                busy[comm.rank] += comm.end - comm.start
            peak_bytes, peak_inflight = level_peaks(
                ((m.rank, m.activation_bytes, m.inflight) for m in self.memory),
                n_ranks=self.n_ranks,
            )
            ends = [r.end for r in self.actions] + [t.end for t in self.transfers]
            totals = TraceTotals(
                makespan=max(ends, default=0),
                busy=tuple(busy),
                peak_activation_bytes=peak_bytes,
                peak_inflight=peak_inflight,
            )
            object.__setattr__(self, "_totals", totals)
        assert self._totals is not None
        return self._totals

    @property
    def makespan(self) -> Time:
        """End of the last action or transfer (a step starts at time 0)."""
        return self.totals().makespan

    def rank_actions(self, rank: int) -> tuple[ActionRecord, ...]:
        """The records of ``rank``, in start order."""
        return tuple(r for r in self.actions if r.rank == rank)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Trace):
            return NotImplemented
        return (
            self.n_ranks == other.n_ranks
            and self.actions == other.actions
            and self.transfers == other.transfers
            and self.memory == other.memory
            and self.comms == other.comms
        )

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        comms = f", comms={self.comms!r}" if self.comms else ""
        return (
            f"Trace(n_ranks={self.n_ranks}, actions={self.actions!r}, "
            f"transfers={self.transfers!r}, memory={self.memory!r}{comms})"
        )


_EXAMPLE = Action(stage=0, op=Op.F, microbatch=0)
