"""Colours, legend names and number formats shared by every pipesim figure.

Colours come from the Tableau 10 palette (also Vega's ``tableau10``): distinct
in hue and still apart for the common colour-vision deficiencies, which matters
because F, B, I and W bars sit side by side.

>>> OP_COLORS["F"], OP_NAMES["W"]
('#4C78A8', 'W weight grad')
>>> format_bytes(3 * 2**20)
'3 MiB'

Where a rank holds several stages (interleaved or V-shaped schedules), its
chunks share their op's hue and differ in shade (:func:`shade`): chunk 0 is the
op colour itself, later chunks are darker, so ``0 1 2 3 0 1 2 3`` reads as two
chunks.
"""

from __future__ import annotations

from collections.abc import Mapping
from fractions import Fraction
from types import MappingProxyType

from pipesim.actions import Action, Work
from pipesim.exact import Time, as_number
from pipesim.metrics import Metrics
from pipesim.units import format_bytes, format_duration, format_number

__all__ = [
    "BAR_KINDS",
    "OP_COLORS",
    "OP_NAMES",
    "format_bytes",
    "format_time",
    "headline",
    "kind_of",
    "shade",
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
    return format_number(value)


def shade(color: str, chunk: int, n_chunks: int, /) -> str:
    """``color`` for chunk ``chunk`` of ``n_chunks``: itself for chunk 0, then darker
    (mixed towards black up to 55%), so chunks of one op stay one hue.

    >>> shade("#4C78A8", 0, 2), shade("#4C78A8", 1, 2)
    ('#4C78A8', '#22364C')
    """
    if chunk == 0 or n_chunks <= 1:
        return color
    keep = 1 - 0.55 * chunk / (n_chunks - 1)
    rgb = (int(color[i : i + 2], 16) for i in (1, 3, 5))
    return "#" + "".join(f"{round(c * keep):02X}" for c in rgb)


def headline(metrics: Metrics, /) -> str:
    """The one-line summary a figure's title carries.

    >>> from pipesim.engine import simulate
    >>> from pipesim.schedules import generate
    >>> headline(simulate(generate("1f1b", n_ranks=4, n_microbatches=8)).metrics)
    'makespan 33 units · bubble 27.3% · idle slots 36 · peak memory 0 B (4 in flight)'
    """
    inflight = max((r.peak_inflight for r in metrics.ranks), default=0)
    peak = f"peak memory {format_bytes(metrics.peak_activation_bytes)} ({inflight} in flight)"
    if metrics.memory_capacity_bytes is not None:
        peak += f" of {format_bytes(metrics.memory_capacity_bytes)}"
        peak += "" if metrics.fits else " (DOES NOT FIT)"
    return (
        f"makespan {format_duration(metrics.makespan, metrics.time_unit)} · "
        f"bubble {float(metrics.bubble_ratio):.1%} · "
        f"{_idle_slots(metrics)}{peak}"
    )


def _idle_slots(metrics: Metrics) -> str:
    if metrics.idle_slots is None:  # forwards take no time: there is no slot to count in
        return ""
    return f"idle slots {format_time(metrics.idle_slots)} · "
