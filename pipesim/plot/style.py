"""Colours, legend names and number formats shared by every pipesim figure.

Colours come from the Tableau 10 palette (also Vega's ``tableau10``): distinct
in hue and still apart for the common colour-vision deficiencies, which matters
because F, B, I and W bars sit side by side.

>>> OP_COLORS["F"], OP_NAMES["W"]
('#4C78A8', 'W weight grad')
>>> format_bytes(3 * 2**20)
'3 MiB'
"""

from __future__ import annotations

from collections.abc import Mapping
from fractions import Fraction
from types import MappingProxyType

from pipesim.actions import Action, Work
from pipesim.exact import Time, as_number
from pipesim.metrics import Metrics

__all__ = [
    "BAR_KINDS",
    "OP_COLORS",
    "OP_NAMES",
    "format_bytes",
    "format_time",
    "headline",
    "kind_of",
    "to_float",
]

#: Every kind of bar a timeline draws, in legend order.
BAR_KINDS = ("F", "B", "I", "W", "overlap", "transfer", "idle")

#: Bar colour per kind: the four ops, an overlapped F&B unit, a transfer on a link, idle.
OP_COLORS: Mapping[str, str] = MappingProxyType(
    {
        "F": "#4C78A8",  # blue
        "B": "#E45756",  # red
        "I": "#F58518",  # orange
        "W": "#54A24B",  # green
        "overlap": "#B279A2",  # purple
        "transfer": "#9D755D",  # brown
        "idle": "#E6E6E6",  # light grey: gaps stay visible without competing with work
    }
)

#: Legend entry per kind.
OP_NAMES: Mapping[str, str] = MappingProxyType(
    {
        "F": "F forward",
        "B": "B backward",
        "I": "I input grad",
        "W": "W weight grad",
        "overlap": "F&B overlap",
        "transfer": "transfer",
        "idle": "idle",
    }
)


def kind_of(work: Work, /) -> str:
    """The bar kind of a unit of work: its op letter, or ``overlap`` for an Overlap.

    >>> from pipesim.actions import parse_action
    >>> kind_of(parse_action("0F3")), kind_of(parse_action("(0F3;3B1)OVERLAP_F_B"))
    ('F', 'overlap')
    """
    return work.op.value if isinstance(work, Action) else "overlap"


def to_float(value: Time, /) -> int | float:
    """An exact time as a JSON-friendly number (ints stay ints).

    >>> to_float(Fraction(1, 4)), to_float(3)
    (0.25, 3)
    """
    return as_number(value)


def format_time(value: Time | Fraction, /) -> str:
    """A time for titles: ints as ints, others with up to 6 significant digits.

    >>> format_time(33), format_time(Fraction(10, 3))
    ('33', '3.33333')
    """
    number = as_number(value)
    return f"{number:.6g}" if isinstance(number, float) else str(number)


def format_bytes(n_bytes: int, /) -> str:
    """Bytes in binary units, exact below 1 KiB.

    >>> format_bytes(0), format_bytes(1000), format_bytes(1536)
    ('0 B', '1000 B', '1.5 KiB')
    """
    value = float(n_bytes)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(value) < 1024 or unit == "TiB":
            return f"{n_bytes} B" if unit == "B" else f"{value:.3g} {unit}"
        value /= 1024
    raise AssertionError("unreachable")  # pragma: no cover


def headline(metrics: Metrics, /) -> str:
    """The one-line summary a figure's title carries.

    >>> from pipesim.engine import simulate
    >>> from pipesim.schedules import generate
    >>> headline(simulate(generate("1f1b", n_ranks=4, n_microbatches=8)).metrics)
    'makespan 33 · bubble 27.3% · idle slots 36 · peak memory 0 B (4 in flight)'
    """
    inflight = max((r.peak_inflight for r in metrics.ranks), default=0)
    peak = f"peak memory {format_bytes(metrics.peak_activation_bytes)} ({inflight} in flight)"
    if metrics.memory_capacity_bytes is not None:
        peak += f" of {format_bytes(metrics.memory_capacity_bytes)}"
        peak += "" if metrics.fits else " (DOES NOT FIT)"
    return (
        f"makespan {format_time(metrics.makespan)} · "
        f"bubble {float(metrics.bubble_ratio):.1%} · "
        f"idle slots {format_time(metrics.idle_slots)} · {peak}"
    )
