"""The Trace: everything that happened in one simulated (or measured) step.

A trace is plain data: every unit of work with its rank, start and end; every
transfer with its ranks, bytes, start and arrival; every change of a rank's
activation memory. Metrics, plots and Perfetto export read it; ``verify``
builds one from measured times so that measured and predicted steps are
compared with the same code.
"""

from __future__ import annotations

from dataclasses import dataclass

from pipesim.actions import Action, Work
from pipesim.exact import Time

__all__ = ["ActionRecord", "MemoryRecord", "Trace", "TransferRecord"]


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
class MemoryRecord:
    """A rank's activation memory right after a change at ``time``."""

    rank: int
    time: Time
    activation_bytes: int
    inflight: int
    """Stage-micro-batch activations held (allocated by F, not yet fully freed)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Trace:
    """All records of one step, each tuple sorted by (start or time, rank)."""

    n_ranks: int
    actions: tuple[ActionRecord, ...]
    transfers: tuple[TransferRecord, ...] = ()
    memory: tuple[MemoryRecord, ...] = ()

    @property
    def makespan(self) -> Time:
        """End of the last action or transfer (a step starts at time 0)."""
        ends = [r.end for r in self.actions] + [t.end for t in self.transfers]
        return max(ends, default=0)

    def rank_actions(self, rank: int) -> tuple[ActionRecord, ...]:
        """The records of ``rank``, in start order."""
        return tuple(r for r in self.actions if r.rank == rank)
