"""Shared checks and builders for the schedule generators."""

from __future__ import annotations

from pipesim.actions import Action, Op
from pipesim.errors import ScheduleError


def check_count(name: str, value: object, *, minimum: int = 1) -> int:
    """A whole number of at least ``minimum``; ScheduleError naming the value otherwise."""
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ScheduleError(f"{name} must be a whole number >= {minimum}, got {value!r}")
    return value


def forward(stage: int, microbatch: int) -> Action:
    """``{stage}F{microbatch}``."""
    return Action(stage=stage, op=Op.F, microbatch=microbatch)


def backward(stage: int, microbatch: int) -> Action:
    """``{stage}B{microbatch}``."""
    return Action(stage=stage, op=Op.B, microbatch=microbatch)


def refuse_virtual(name: str, virtual: int) -> None:
    """Schedules with one stage per rank refuse ``virtual != 1``."""
    if virtual != 1:
        raise ScheduleError(
            f"schedule {name!r} holds one stage per rank, got virtual={virtual}; drop --virtual "
            "or use interleaved-1f1b"
        )


def refuse_forward_only(name: str, forward_only: bool) -> None:
    """Training-only schedules refuse ``forward_only``."""
    if forward_only:
        raise ScheduleError(
            f"schedule {name!r} has no forward-only variant; use 'gpipe' or 'sequential' "
            "with --forward-only for inference"
        )
