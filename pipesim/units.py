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

>>> format_bytes(80 * 2**30), format_bytes(80 * 10**9), format_duration(378809301, "ns")
('80 GiB', '74.5 GiB', '378.809 ms')
>>> display_scale("ns", 378809301)
(Fraction(1, 1000000), 'ms')
"""

from __future__ import annotations

from collections.abc import Mapping
from fractions import Fraction
from types import MappingProxyType

from pipesim.errors import UnknownNameError
from pipesim.exact import Time, as_number

__all__ = [
    "BYTES_PER_UNIT",
    "SECONDS_PER_UNIT",
    "TIME_UNITS",
    "binary_scale",
    "check_time_unit",
    "display_scale",
    "format_bytes",
    "format_duration",
    "format_number",
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

#: Every time unit a cost model may name: ``unit`` (abstract slots) first.
TIME_UNITS = ("unit", *SECONDS_PER_UNIT)

#: Bytes per binary unit (IEC 80000-13 prefixes), smallest first.
BYTES_PER_UNIT: Mapping[str, int] = MappingProxyType(
    {"B": 1, "KiB": 2**10, "MiB": 2**20, "GiB": 2**30, "TiB": 2**40}
)


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
