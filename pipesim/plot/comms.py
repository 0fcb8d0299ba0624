"""Sends and receives of a comms schedule as marks on their ranks' rows.

A comms schedule's SEND and RECV actions (:mod:`pipesim.comms`, simulated by
:mod:`pipesim.engine`) hold their rank only for their overheads, often no time at
all, so a bar would not show: each is a marker on its rank's row, a send a
triangle pointing right at the top of the row when the message leaves, a receive
a triangle pointing down at the bottom of the row when it was taken. Hover names
the action, the peer rank, the bytes, the time, the overhead and, for a
receive, how long the rank waited for the message, in the drawn time unit.
One ``go.Scatter`` per kind keeps the page small whatever the schedule's size.

>>> from pipesim.comms import lower_comms
>>> from pipesim.engine import simulate
>>> from pipesim.schedules import generate
>>> sim = simulate(lower_comms(generate("gpipe", n_ranks=2, n_microbatches=2)))
>>> [(t.name, len(t.x)) for t in comm_traces(sim, factor=Fraction(1), time_unit="unit")]
[('send (SEND_F, SEND_B)', 4), ('receive (RECV_F, RECV_B)', 4)]
"""

from __future__ import annotations

from fractions import Fraction
from typing import Any

import plotly.graph_objects as go

from pipesim.engine import Simulation
from pipesim.plot.memory import scaled
from pipesim.plot.style import format_bytes
from pipesim.units import unit_suffix

__all__ = ["COMM_COLORS", "comm_traces"]

#: Marker colour of the sends and of the receives.
COMM_COLORS = {"SEND": "#222222", "RECV": "#8A5A00"}
_SYMBOLS = {"SEND": "triangle-right", "RECV": "triangle-down"}
_NAMES = {"SEND": "send (SEND_F, SEND_B)", "RECV": "receive (RECV_F, RECV_B)"}
_OFFSET = {"SEND": -0.32, "RECV": 0.32}  # rows run top down: a send on top, a receive below

_SEND_HOVER = (
    "<b>%{customdata[0]}</b><br>to rank %{customdata[1]}<br>%{customdata[2]}"
    "<br>sent at %{customdata[4]}{unit}<br>overhead %{customdata[5]}{unit}<extra></extra>"
)
_RECV_HOVER = (
    "<b>%{customdata[0]}</b><br>from rank %{customdata[1]}<br>%{customdata[2]}"
    "<br>waited from %{customdata[3]}{unit} to %{customdata[4]}{unit}"
    "<br>overhead %{customdata[5]}{unit}<extra></extra>"
)


def comm_traces(
    sim: Simulation, /, *, factor: Fraction, time_unit: str, showlegend: bool = True
) -> list[go.Scatter]:
    """A marker trace for the sends and one for the receives of ``sim`` (none for a
    compute schedule); times scaled by ``factor`` into ``time_unit``."""
    columns: dict[str, tuple[list[Any], list[float], list[list[Any]]]] = {}
    for record in sim.trace.comms:
        kind = "SEND" if record.comm.op.is_send else "RECV"
        xs, ys, data = columns.setdefault(kind, ([], [], []))
        # A send is drawn when its message leaves (the end of its overhead), a receive when
        # the rank took the message (after any wait).
        at = scaled(record.end if kind == "SEND" else record.start, factor)
        xs.append(at)
        ys.append(record.rank + _OFFSET[kind])
        data.append(
            [
                str(record.comm),
                record.peer,
                f"{record.n_bytes:,} bytes ({format_bytes(record.n_bytes)})",
                scaled(record.posted, factor),
                at,
                scaled(record.duration, factor),
            ]
        )
    suffix = unit_suffix(time_unit)
    traces = []
    for kind in ("SEND", "RECV"):
        if kind not in columns:
            continue
        xs, ys, data = columns[kind]
        hover = _SEND_HOVER if kind == "SEND" else _RECV_HOVER
        traces.append(
            go.Scatter(
                x=xs,
                y=ys,
                mode="markers",
                name=_NAMES[kind],
                legendgroup=kind,
                showlegend=showlegend,
                marker={
                    "symbol": _SYMBOLS[kind],
                    "size": 7,
                    "color": COMM_COLORS[kind],
                    "line": {"width": 0},
                },
                customdata=data,
                hovertemplate=hover.replace("{unit}", suffix),
            )
        )
    return traces
