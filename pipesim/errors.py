"""The one small error hierarchy of pipesim.

Every error pipesim raises on bad input is a :class:`PipesimError`; each
subclass also subclasses the matching built-in, so ``except ValueError`` keeps
working for callers that do not know pipesim. Messages name the problem, the
offending values and the fix. The library never prints; the CLI turns these
into ``pipesim: error: ...`` and a non-zero exit status.
"""

from __future__ import annotations

__all__ = [
    "CostError",
    "DeadlockError",
    "ParseError",
    "PartitionError",
    "PipesimError",
    "PlanError",
    "ScheduleError",
    "UnknownNameError",
]


class PipesimError(Exception):
    """Base class of every error pipesim raises on purpose."""


class ScheduleError(PipesimError, ValueError):
    """A schedule, or the parameters asked of a schedule generator, are invalid."""


class DeadlockError(ScheduleError):
    """The per-rank orders wait on each other in a cycle and can never finish.

    ``cycle`` holds the actions of one such cycle, as action strings, each a
    prerequisite of the next: the next waits on it, and the first waits on the
    last.
    """

    def __init__(self, message: str, *, cycle: tuple[str, ...] = ()) -> None:
        super().__init__(message)
        self.cycle = cycle


class ParseError(PipesimError, ValueError):
    """A file or string could not be read; the message carries the line."""


class CostError(PipesimError, ValueError):
    """A cost model value is impossible (negative, NaN, infinite, wrong length)."""


class PartitionError(PipesimError, ValueError):
    """Layers cannot be cut into the stages asked (more stages than layers)."""


class PlanError(PipesimError, ValueError):
    """A capacity-planning request is impossible (devices, batch, model or hardware)."""


class UnknownNameError(PipesimError, LookupError):
    """A name (schedule, preset, model) is not known; the message lists the valid ones."""

    def __str__(self) -> str:  # LookupError would quote the message like a KeyError
        return str(self.args[0]) if self.args else ""
