"""The one small error hierarchy of pipesim.

Every error pipesim raises on bad input is a :class:`PipesimError`; each
subclass also subclasses the matching built-in, so ``except ValueError`` keeps
working for callers that do not know pipesim. Messages name the problem, the
offending values and the fix. The library never prints; the CLI turns these
into ``pipesim: error: ...`` and a non-zero exit status.
"""

from __future__ import annotations

import reprlib
from collections.abc import Sequence

__all__ = [
    "CostError",
    "DeadlockError",
    "LimitError",
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


class LimitError(PipesimError, ValueError):
    """An input passes one of the documented limits of :mod:`pipesim.limits`."""


class PlanError(PipesimError, ValueError):
    """A capacity-planning request is impossible (devices, batch, model or hardware)."""


class UnknownNameError(PipesimError, LookupError):
    """A name (schedule, preset, model) is not known; the message lists the valid ones."""

    def __str__(self) -> str:  # LookupError would quote the message like a KeyError
        return str(self.args[0]) if self.args else ""


class _Brief(reprlib.Repr):
    def repr_int(self, x: int, level: int) -> str:
        if x.bit_length() <= 128:
            return repr(x)
        # str() of a huge int is slow (and refused past 4300 digits): count the digits
        if x.bit_length() < 14_000:
            return f"an integer of {len(str(abs(x)))} digits"
        return f"an integer of about {int(x.bit_length() * 0.30103) + 1} digits"


_BRIEF = _Brief()
_BRIEF.maxstring = _BRIEF.maxother = 60
_BRIEF.maxlist = _BRIEF.maxtuple = _BRIEF.maxdict = _BRIEF.maxset = 4
_BRIEF.maxlevel = 2


# Not in __all__: helpers for pipesim's own messages, not error types.
def and_more(shown: int, total: int, /) -> str:
    """What a message that lists ``shown`` of ``total`` items adds after them.

    >>> and_more(2, 5), and_more(5, 5)
    (' and 3 more', '')
    """
    return f" and {total - shown} more" if total > shown else ""


def summarise(headline: str, problems: Sequence[str], /, *, limit: int = 8) -> str:
    """One error message of many problems: the headline, the first ``limit`` problems,
    and how many more there are.

    >>> summarise("invalid schedule", ["a", "b", "c"], limit=2)
    'invalid schedule: a; b; and 1 more problems'
    """
    shown = list(problems[:limit])
    more = and_more(len(shown), len(problems))
    return f"{headline}: " + "; ".join(shown) + (f";{more} problems" if more else "")


def brief(value: object) -> str:
    """A short repr of ``value`` for an error message: bounded in length and in the work
    to build it, whatever the value holds (a huge list, deep nesting, a 5000-digit int).

    >>> brief(list(range(1000)))
    '[0, 1, 2, 3, ...]'
    >>> brief(10**1000), brief([-(10**50000)])
    ('an integer of 1001 digits', '[an integer of about 50001 digits]')
    >>> brief("x" * 100)
    "'xxxxxxxxxxxxxxxxxxxxxxxxxx...xxxxxxxxxxxxxxxxxxxxxxxxxxxx'"
    """
    return _BRIEF.repr(value)
