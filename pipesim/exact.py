"""Exact time values: integers where possible, fractions otherwise, never float drift.

Durations enter pipesim as ints, Fractions, decimal strings (``"1.5"``,
``"3/2"``), floats, or any other number type (numpy scalars, ``Decimal``).
Floats are read through their shortest decimal spelling, so ``0.1`` becomes
exactly ``1/10``. Everything downstream adds and compares these exact values,
which is why identities such as ``idle == n_ranks * makespan - busy`` hold
exactly.

Exact arithmetic stays fast only while the numbers stay small, so a value whose
exact numerator or denominator needs more than
:data:`~pipesim.limits.MAX_NUMBER_DIGITS` digits (``1e5000``, ``1e99999999``, a
5000-digit integer) is refused before it is built.

>>> to_time("1.5", name="forward")
Fraction(3, 2)
>>> to_time(0.1, name="latency") * 3 == to_time("0.3", name="x")
True
>>> to_time(4.0, name="forward")
4
>>> to_time("1e99999999", name="forward")
Traceback (most recent call last):
...
pipesim.errors.CostError: forward '1e99999999' is too large or too finely divided to \
compute with exactly: its exact value needs more than 40 digits (MAX_NUMBER_DIGITS in \
pipesim.limits); round it, or change the time or byte unit
"""

from __future__ import annotations

import math
import numbers
import re
from decimal import Decimal
from fractions import Fraction
from typing import TypeAlias

from pipesim.errors import CostError, brief
from pipesim.limits import MAX_NUMBER_DIGITS, as_int

__all__ = ["Time", "as_number", "to_count", "to_fraction", "to_time"]  # and whole_or_fraction

_NON_FINITE = {"nan", "inf", "infinity", "snan"}
_BOUND = 10**MAX_NUMBER_DIGITS  # numerators and denominators stay below this
_MAX_TEXT = 4 * MAX_NUMBER_DIGITS  # characters of a number's text, underscores and all
_MAX_EXPONENT = 5 * MAX_NUMBER_DIGITS  # beyond it no text this short is within _BOUND
_DIGITS = r"[0-9]+(?:_[0-9]+)*"
_NUMBER = re.compile(
    rf"""(?P<sign>[-+]?)
    (?:(?P<num>{_DIGITS})\s*/\s*(?P<den>{_DIGITS})
      |(?=\.?[0-9])(?P<int>{_DIGITS})?(?:\.(?P<frac>{_DIGITS})?)?(?:[eE](?P<exp>[-+]?{_DIGITS}))?
    )""",
    re.VERBOSE | re.ASCII,
)

#: An exact duration or instant: an int when integral, else a Fraction.
Time: TypeAlias = int | Fraction


def to_time(value: object, *, name: str, allow_zero: bool = True) -> Time:
    """Convert ``value`` to an exact, finite, non-negative time; CostError otherwise."""
    exact = _exact(value, name=name, whole=False)
    if exact < 0 or (exact == 0 and not allow_zero):
        bound = "non-negative" if allow_zero else "positive"
        raise CostError(f"{name} must be {bound}, got {brief(value)}")
    return exact.numerator if exact.denominator == 1 else exact


def to_count(value: object, *, name: str, minimum: int = 0) -> int:
    """An integer count (bytes, micro-batches) of at least ``minimum``; CostError otherwise.

    >>> to_count("80e9", name="memory_capacity_bytes"), to_count("8_000", name="x")
    (80000000000, 8000)
    """
    exact = _exact(value, name=name, whole=True)
    if exact.denominator != 1:
        raise CostError(f"{name} must be a whole number, got {brief(value)}")
    count = exact.numerator
    if count < minimum:
        raise CostError(f"{name} must be at least {minimum}, got {count}")
    return count


def to_fraction(value: object, *, name: str) -> Fraction:
    """Any finite number, or its text, exactly (no sign or range check); CostError otherwise.

    >>> to_fraction("-1.5e3", name="x"), to_fraction(0.1, name="x")
    (Fraction(-1500, 1), Fraction(1, 10))
    """
    return _exact(value, name=name, whole=False)


def _exact(value: object, *, name: str, whole: bool) -> Fraction:
    """Any finite number, or its text, as a Fraction within the digit limit."""
    kind = "a whole number" if whole else "a number like 2, 1.5 or 3/2"
    integer = as_int(value)
    if integer is not None:
        return _bounded(Fraction(integer), value, name)
    if isinstance(value, bool):
        raise CostError(f"{name} must be {kind}, got {value!r}")
    if isinstance(value, Fraction):
        return _bounded(value, value, name)
    if isinstance(value, float):
        if not math.isfinite(value):
            raise CostError(f"{name} must be finite, got {value!r}; give a number like 1.5")
        text = float.__repr__(value)  # the shortest spelling: 0.1 is 1/10 (numpy too)
    elif isinstance(value, str):
        text = value
    elif isinstance(value, Decimal | numbers.Real):  # numpy floats spell themselves shortest
        text = str(value)
    else:
        raise CostError(f"{name} must be {kind}, got {brief(value)}")
    return _parse(text, value, name=name, kind=kind)


def _parse(text: str, value: object, *, name: str, kind: str) -> Fraction:
    text = text.strip()
    if text.lower().lstrip("+-") in _NON_FINITE:
        raise CostError(f"{name} must be finite, got {brief(value)}; give a number like 1.5")
    match = _NUMBER.fullmatch(text) if len(text) <= _MAX_TEXT else None
    if match is None:
        if len(text) > _MAX_TEXT and _NUMBER.fullmatch(text[:_MAX_TEXT]):
            raise _too_big(value, name)
        raise CostError(f"{name} must be {kind}, got {brief(value)}")
    sign = -1 if match["sign"] == "-" else 1
    if match["num"] is not None:
        numerator, denominator = int(match["num"]), int(match["den"])
        if denominator == 0:
            raise CostError(f"{name} must be {kind}, got {brief(value)}: it divides by zero")
        return _bounded(Fraction(sign * numerator, denominator), value, name)
    digits = (match["int"] or "") + (match["frac"] or "")
    mantissa = int(digits)
    if mantissa == 0:
        return Fraction(0)
    exponent = int(match["exp"] or 0) - len((match["frac"] or "").replace("_", ""))
    if abs(exponent) > _MAX_EXPONENT:
        raise _too_big(value, name)
    if exponent >= 0:
        return _bounded(Fraction(sign * mantissa * 10**exponent), value, name)
    return _bounded(Fraction(sign * mantissa, 10**-exponent), value, name)


def _bounded(exact: Fraction, value: object, name: str) -> Fraction:
    if abs(exact.numerator) >= _BOUND or exact.denominator >= _BOUND:
        raise _too_big(value, name)
    return exact


def _too_big(value: object, name: str) -> CostError:
    return CostError(
        f"{name} {brief(value)} is too large or too finely divided to compute with exactly: "
        f"its exact value needs more than {MAX_NUMBER_DIGITS} digits (MAX_NUMBER_DIGITS in "
        "pipesim.limits); round it, or change the time or byte unit"
    )


def whole_or_fraction(value: Fraction, /) -> Time:
    """An exact result as a :data:`Time`: an int when it is whole, else the Fraction, so
    integer inputs give integer outputs.

    >>> whole_or_fraction(Fraction(6, 2)), whole_or_fraction(Fraction(3, 2))
    (3, Fraction(3, 2))
    """
    return value.numerator if value.denominator == 1 else value


def as_number(value: Time) -> int | float:
    """For JSON and tables: an int stays an int, a Fraction becomes the nearest float."""
    if isinstance(value, Fraction):
        return value.numerator if value.denominator == 1 else float(value)
    return value
