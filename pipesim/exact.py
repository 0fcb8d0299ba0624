"""Exact time values: integers where possible, fractions otherwise, never float drift.

Durations enter pipesim as ints, Fractions, decimal strings (``"1.5"``,
``"3/2"``) or floats. Floats are read through their shortest decimal
spelling, so ``0.1`` becomes exactly ``1/10``. Everything downstream adds and
compares these exact values, which is why identities such as
``idle == n_ranks * makespan - busy`` hold exactly.

>>> to_time("1.5", name="forward")
Fraction(3, 2)
>>> to_time(0.1, name="latency") * 3 == to_time("0.3", name="x")
True
>>> to_time(4.0, name="forward")
4
"""

from __future__ import annotations

from fractions import Fraction
from typing import TypeAlias

from pipesim.errors import CostError

__all__ = ["Time", "as_number", "to_count", "to_time"]

_NON_FINITE = {"nan", "inf", "infinity"}

#: An exact duration or instant: an int when integral, else a Fraction.
Time: TypeAlias = int | Fraction


def to_time(value: object, *, name: str, allow_zero: bool = True) -> Time:
    """Convert ``value`` to an exact, finite, non-negative time; CostError otherwise."""
    if isinstance(value, bool) or not isinstance(value, int | Fraction | float | str):
        raise CostError(f"{name} must be a number, got {value!r}")
    if isinstance(value, float | str) and str(value).strip().lower().lstrip("+-") in _NON_FINITE:
        raise CostError(f"{name} must be finite, got {value!r}; give a number like 1.5")
    try:
        exact = Fraction(repr(value) if isinstance(value, float) else value)
    except (ValueError, ZeroDivisionError):
        raise CostError(f"{name} must be a number like 2, 1.5 or 3/2, got {value!r}") from None
    if exact < 0 or (exact == 0 and not allow_zero):
        bound = "non-negative" if allow_zero else "positive"
        raise CostError(f"{name} must be {bound}, got {value!r}")
    return exact.numerator if exact.denominator == 1 else exact


def to_count(value: object, *, name: str, minimum: int = 0) -> int:
    """An integer count (bytes, micro-batches) of at least ``minimum``; CostError otherwise."""
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if isinstance(value, str):  # "80000000000", "80e9", "8_000"
        try:
            exact = Fraction(value.strip())
        except (ValueError, ZeroDivisionError):
            raise CostError(f"{name} must be a whole number, got {value!r}") from None
        if exact.denominator == 1:
            value = exact.numerator
    if isinstance(value, bool) or not isinstance(value, int):
        raise CostError(f"{name} must be a whole number, got {value!r}")
    if value < minimum:
        raise CostError(f"{name} must be at least {minimum}, got {value}")
    return value


def as_number(value: Time) -> int | float:
    """For JSON and tables: an int stays an int, a Fraction becomes the nearest float."""
    if isinstance(value, Fraction):
        return value.numerator if value.denominator == 1 else float(value)
    return value
