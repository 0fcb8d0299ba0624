"""Units: what a time means, and how times and bytes are written for people.

**Time.** pipesim's times are exact numbers in whatever unit the cost model's
durations use; :attr:`pipesim.costs.CostModel.time_unit` names it: ``"unit"``
for abstract slots (the default: a forward of 1, a backward of 2), or ``"s"``,
``"ms"``, ``"us"``, ``"ns"`` (a cost file written by ``pipesim verify`` is in
``ns``). Every table, axis, hover text, trace and JSON object carries it.

**Bytes.** One convention everywhere: binary prefixes, labelled as such
(KiB = 1024 B, MiB, GiB, TiB), as ``nvidia-smi`` and PyTorch's memory summary
report device memory. A number of bytes is never written with an SI suffix
("15B" is 15 billion bytes to plotly, and looks like 15 bytes to a reader). Where
numbers line up (a table column, an axis) they share the unit :func:`binary_scale`
picks for the largest. Rates stay as datasheets write them
(a link of 450 GB/s moves 450 * 10**9 bytes a second): only amounts are binary.

**Reading bytes.** Every size a person gives pipesim (``--memory-capacity``,
``--memory-limit``, ``--activation-bytes`` and the other byte flags, the
``*_bytes`` fields of a cost file, an accelerator's ``memory_bytes``) is read by
:func:`parse_bytes`: a whole number of bytes (``85899345920``, ``80e9``) or a
number with a unit, case-insensitive: ``B``; ``KB``, ``MB``, ``GB``, ``TB``
(1000-based, as the SI and datasheets mean them); ``KiB``, ``MiB``, ``GiB``,
``TiB`` (1024-based). ``80GiB`` and ``80 GiB`` are 80 * 2**30 bytes, ``80GB``
is 80 * 10**9.

>>> parse_bytes("80GiB", name="--memory-capacity"), parse_bytes("1.5 kb", name="x")
(85899345920, 1500)
>>> format_bytes(80 * 2**30), format_bytes(80 * 10**9), format_duration(378809301, "ns")
('80 GiB', '74.5 GiB', '378.809 ms')
>>> display_scale("ns", 378809301)
(Fraction(1, 1000000), 'ms')
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from fractions import Fraction
from types import MappingProxyType

from pipesim.errors import CostError, UnknownNameError, brief
from pipesim.exact import Time, as_number, to_fraction
from pipesim.limits import MAX_NUMBER_DIGITS

__all__ = [
    "BYTES_PER_UNIT",
    "NS_PER_S",
    "SECONDS_PER_UNIT",
    "SIZE_UNITS",
    "TIME_UNITS",
    "binary_scale",
    "check_time_unit",
    "display_scale",
    "format_bytes",
    "format_duration",
    "format_number",
    "parse_bytes",
    "time_axis_title",
    "unit_suffix",
]

#: Seconds per time unit, for every unit with a physical meaning.
SECONDS_PER_UNIT: Mapping[str, Fraction] = MappingProxyType(
    {
        "s": Fraction(1),
        "ms": Fraction(1, 10**3),
        "us": Fraction(1, 10**6),
        "ns": Fraction(1, 10**9),
    }
)

#: Nanoseconds per second: the planner's cost models are in whole nanoseconds.
NS_PER_S = 10**9
#: Nanoseconds per millisecond, the unit measured steps are printed in.
NS_PER_MS = 10**6


def ms(ns: Time | Fraction | float, /) -> float:
    """Nanoseconds as float milliseconds, for printing measured and predicted steps.

    >>> ms(2_500_000)
    2.5
    """
    return float(ns) / NS_PER_MS


#: Every time unit a cost model may name: ``unit`` (abstract slots) first.
TIME_UNITS = ("unit", *SECONDS_PER_UNIT)

#: Bytes per binary unit (IEC 80000-13 prefixes), smallest first.
BYTES_PER_UNIT: Mapping[str, int] = MappingProxyType(
    {"B": 1, "KiB": 2**10, "MiB": 2**20, "GiB": 2**30, "TiB": 2**40}
)

#: Bytes per unit a size may be written in (:func:`parse_bytes`, case-insensitive): SI
#: prefixes 1000-based, as the SI and datasheets mean them, binary ones 1024-based.
SIZE_UNITS: Mapping[str, int] = MappingProxyType(
    {"B": 1, "KB": 10**3, "MB": 10**6, "GB": 10**9, "TB": 10**12, **BYTES_PER_UNIT}
)

_SIZE_UNIT_BY_KEY = {unit.lower(): n_bytes for unit, n_bytes in SIZE_UNITS.items()}
# A number, then what follows it (the unit): "1e9B" is 1e9 and B, "2 GB/s" 2 and GB/s.
_SIZE = re.compile(
    r"\s*(?P<number>[-+]?[0-9_./]*[0-9.](?:[eE][-+]?[0-9_]+)?)\s*(?P<unit>[^\s0-9].*?)?\s*",
    re.DOTALL,
)
_MAX_SIZE_TEXT = 200
_WHOLE_BYTES = "a whole number of bytes (85899345920, 80e9)"
_WITH_UNIT = (
    "a number with a unit: B, KB, MB, GB, TB (1000-based) or KiB, MiB, GiB, TiB "
    "(1024-based), e.g. 80GiB or 80GB"
)


def parse_bytes(value: object, /, *, name: str, minimum: int = 0, plain: str = _WHOLE_BYTES) -> int:
    """A byte size of at least ``minimum``: a whole number, or text with a unit of
    :data:`SIZE_UNITS` (a fraction of a unit is rounded down to whole bytes). Any
    other value is a CostError naming ``name``, the value and the accepted forms;
    ``plain`` says what a number without a unit is, where the caller reads those
    itself (``synthesize --memory-limit 8`` is micro-batches).

    >>> parse_bytes(2**20, name="x"), parse_bytes("0.5 MiB", name="x"), parse_bytes("2gb", name="x")
    (1048576, 524288, 2000000000)
    >>> parse_bytes("80 GiBs", name="--memory-capacity")
    Traceback (most recent call last):
    ...
    pipesim.errors.CostError: --memory-capacity: unknown unit 'GiBs' in '80 GiBs'; give a \
whole number of bytes (85899345920, 80e9) or a number with a unit: B, KB, MB, GB, TB \
(1000-based) or KiB, MiB, GiB, TiB (1024-based), e.g. 80GiB or 80GB
    """
    forms = f"give {plain} or {_WITH_UNIT}"
    # Sizes are short; a long text is refused before the regex could backtrack over it.
    short = isinstance(value, str) and len(value) <= _MAX_SIZE_TEXT
    match = _SIZE.fullmatch(str(value)) if short else None
    unit = (match["unit"] or "") if match is not None else ""
    scale = _SIZE_UNIT_BY_KEY.get(unit.lower()) if unit else 1
    if scale is None:
        raise CostError(f"{name}: unknown unit {unit!r} in {brief(value)}; {forms}")
    try:
        amount = to_fraction(match["number"] if match is not None and unit else value, name=name)
    except CostError as exc:
        if "too large" in str(exc):  # a number beyond exact arithmetic: that message says so
            raise
        raise CostError(f"{name}: cannot read {brief(value)} as a size; {forms}") from None
    n_bytes = amount * scale
    if unit:
        n_bytes = Fraction(math.floor(n_bytes))
    elif n_bytes.denominator != 1:
        raise CostError(f"{name}: {brief(value)} is not a whole number of bytes; {forms}")
    if n_bytes < minimum:
        what = "byte" if minimum == 1 else "bytes"
        raise CostError(f"{name} must be at least {minimum} {what}, got {brief(value)}; {forms}")
    if n_bytes >= 10**MAX_NUMBER_DIGITS:
        raise CostError(
            f"{name} {brief(value)} is too large to compute with exactly: more than "
            f"{MAX_NUMBER_DIGITS} digits of bytes (MAX_NUMBER_DIGITS in pipesim.limits)"
        )
    return n_bytes.numerator


def check_time_unit(unit: object, /) -> str:
    """``unit`` when it is one of :data:`TIME_UNITS`, else an error naming the choices.

    >>> check_time_unit("ms")
    'ms'
    """
    if unit not in TIME_UNITS:
        raise UnknownNameError(
            f"unknown time unit {unit!r}; give one of {', '.join(TIME_UNITS)} "
            "(`unit` for abstract slots, else what one time value stands for)"
        )
    return str(unit)


def unit_suffix(unit: str, /) -> str:
    """What follows a number of ``unit``: ``" ns"``, or ``" units"`` for abstract time.

    >>> "33" + unit_suffix("unit"), "5" + unit_suffix("ms")
    ('33 units', '5 ms')
    """
    return " units" if unit == "unit" else f" {unit}"


def format_number(value: Time | Fraction | float, /) -> str:
    """Ints as ints, other numbers with up to 6 significant digits.

    >>> format_number(33), format_number(Fraction(10, 3)), format_number(0.5)
    ('33', '3.33333', '0.5')
    """
    number = as_number(value) if not isinstance(value, float) else value
    return f"{number:.6g}" if isinstance(number, float) else str(number)


def display_scale(unit: str, largest: Time | float, /) -> tuple[Fraction, str]:
    """``(factor, shown_unit)``: multiply a time in ``unit`` by ``factor`` to write it in
    ``shown_unit``, the largest of s, ms, us, ns in which ``largest`` is at least 1 (so
    a 0.38 s step reads in ms, not as 378,809,301 ns). Abstract units stay as they are.

    >>> display_scale("unit", 10**9), display_scale("s", Fraction(1, 50))
    ((Fraction(1, 1), 'unit'), (Fraction(1000, 1), 'ms'))
    """
    if unit == "unit":
        return Fraction(1), unit
    seconds = Fraction(largest) * SECONDS_PER_UNIT[unit]
    for shown, per in SECONDS_PER_UNIT.items():  # s, ms, us, ns: largest first
        if seconds >= per or shown == "ns":
            return SECONDS_PER_UNIT[unit] / per, shown
    raise AssertionError("unreachable")  # pragma: no cover


def format_duration(value: Time, unit: str, /) -> str:
    """A time in ``unit`` for people: in the readable unit of :func:`display_scale`.

    >>> format_duration(33, "unit"), format_duration(Fraction(3, 2), "ms")
    ('33 units', '1.5 ms')
    """
    factor, shown = display_scale(unit, value)
    return format_number(Fraction(value) * factor) + unit_suffix(shown)


def time_axis_title(unit: str, /) -> str:
    """The title of a time axis drawn in ``unit``.

    >>> time_axis_title("ms"), time_axis_title("unit")
    ('time (ms)', 'time (units)')
    """
    return f"time ({'units' if unit == 'unit' else unit})"


def binary_scale(largest: int, /) -> tuple[int, str]:
    """``(divisor, unit)``: the binary unit in which ``largest`` bytes reads best.

    >>> binary_scale(500), binary_scale(15 * 10**9)
    ((1, 'B'), (1073741824, 'GiB'))
    """
    *smaller, (largest_unit, largest_divisor) = BYTES_PER_UNIT.items()
    for unit, divisor in smaller:
        if abs(largest) < 1024 * divisor:
            return divisor, unit
    return largest_divisor, largest_unit


def format_bytes(n_bytes: int, /, *, digits: int = 3) -> str:
    """Bytes in binary units, exact below 1 KiB, ``digits`` significant digits above.

    >>> format_bytes(0), format_bytes(1000), format_bytes(1536), format_bytes(15 * 10**9)
    ('0 B', '1000 B', '1.5 KiB', '14 GiB')
    >>> format_bytes(77_000_000_000, digits=4)
    '71.71 GiB'
    """
    divisor, unit = binary_scale(n_bytes)
    return f"{n_bytes} B" if unit == "B" else f"{n_bytes / divisor:.{digits}g} {unit}"
