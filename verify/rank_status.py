"""What each rank process is doing, shared with the launcher, and the words for it.

Every rank writes its state into one shared array (no lock: each rank owns its
three slots, the launcher only reads): whether it is computing a unit of its
program, waiting for a message, finished or not yet started, which one, and the
peer it waits on. When a rank fails, dies or the run passes its deadline,
:func:`verify.launch.launch` turns the array into the error's words
(:func:`describe_states`, :func:`describe_failure`), so a hang names the rank, the
action it was waiting for and the peer.

>>> from pipesim.schedules import generate
>>> status = [WAITING, 0, 1, COMPUTING, 1, -1, 0]
>>> print(describe_states(generate("gpipe", n_ranks=2, n_microbatches=2), status, [0, 1]))
rank 0 was waiting for rank 1 to take 0F0's message; rank 1 was running 1F0
"""

from __future__ import annotations

import signal
from collections.abc import MutableSequence, Sequence
from pathlib import Path
from typing import Any

from pipesim.comms import lower_comms, messages
from pipesim.schedule import Schedule

__all__ = [
    "COMPUTING",
    "FINISHED",
    "STARTING",
    "WAITING",
    "current_schedule",
    "describe_failure",
    "describe_states",
    "set_current_schedule",
    "set_state",
    "status_length",
]

# One rank's slots: (state, program position or message index, peer).
STARTING, COMPUTING, WAITING, FINISHED = 0, 1, 2, 3


def status_length(n_ranks: int) -> int:
    """Slots of the shared array: three per rank and one for the schedule being run."""
    return 3 * n_ranks + 1


def set_state(status: MutableSequence[int], rank: int, state: int, value: int, peer: int) -> None:
    """Rank ``rank`` is now in ``state`` at ``value`` (program position or message index)."""
    status[3 * rank : 3 * rank + 3] = [state, value, peer]


def set_current_schedule(status: MutableSequence[int], n_ranks: int, index: int) -> None:
    """The ranks are running the ``index``-th schedule of the launch (rank 0 says so)."""
    status[3 * n_ranks] = index


def current_schedule(status: Sequence[int], n_ranks: int) -> int:
    """The index of the schedule the ranks are at."""
    return max(0, int(status[3 * n_ranks]))


def describe_failure(
    schedule: Schedule, processes: Sequence[Any], workdir: Path, status: Sequence[int]
) -> str:
    """One clause per rank that ended badly, ranks killed by a signal first, then the states
    of the ranks that were still running."""
    parts = []
    codes = {rank: p.exitcode for rank, p in enumerate(processes)}
    for rank in sorted(codes, key=lambda r: (codes[r] is None or codes[r] >= 0, r)):
        code = codes[rank]
        if code is None or code == 0:
            continue
        error = workdir / f"rank{rank}.error"
        if error.exists():
            parts.append(error.read_text().strip())
        else:
            how = f"killed by {signal.Signals(-code).name}" if code < 0 else f"exit status {code}"
            parts.append(f"rank {rank} died ({how}); " + describe_states(schedule, status, [rank]))
    running = [r for r, code in codes.items() if code is None]
    if running:
        parts.append(describe_states(schedule, status, running))
    return "; ".join(parts)


def describe_states(schedule: Schedule, status: Sequence[int], ranks: Sequence[int] | range) -> str:
    """What each of ``ranks`` was doing, in words."""
    programs = lower_comms(schedule).programs
    found = messages(schedule)
    words = []
    for rank in ranks:
        state, value, peer = status[3 * rank : 3 * rank + 3]
        if state == COMPUTING:
            words.append(f"rank {rank} was running {programs[rank][value]}")
        elif state == WAITING:
            message = found[value]
            if message.dst_rank == rank:
                words.append(
                    f"rank {rank} was waiting for {message.producer} from rank {peer} "
                    f"(needed by {message.consumer})"
                )
            else:
                words.append(
                    f"rank {rank} was waiting for rank {peer} to take {message.producer}'s message"
                )
        elif state == FINISHED:
            words.append(f"rank {rank} had finished its step")
        else:
            words.append(f"rank {rank} had not started its step")
    return "; ".join(words)
