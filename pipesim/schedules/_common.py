"""Shared checks and builders for the schedule generators."""

from __future__ import annotations

from pipesim.actions import Action, Op, trusted_action
from pipesim.errors import ScheduleError


def check_count(name: str, value: object, *, minimum: int = 1) -> int:
    """A whole number of at least ``minimum``; ScheduleError naming the value otherwise."""
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ScheduleError(f"{name} must be a whole number >= {minimum}, got {value!r}")
    return value


def forward(stage: int, microbatch: int) -> Action:
    """``{stage}F{microbatch}`` (generators' indices are in range: no checks)."""
    return trusted_action(stage, _F, microbatch)


def backward(stage: int, microbatch: int) -> Action:
    """``{stage}B{microbatch}`` (generators' indices are in range: no checks)."""
    return trusted_action(stage, _B, microbatch)


_F, _B = Op.F, Op.B


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
