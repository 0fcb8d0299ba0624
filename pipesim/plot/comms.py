"""Sends and receives of a comms schedule as marks on their ranks' rows.

A comms schedule's SEND and RECV actions (:mod:`pipesim.comms`, simulated by
:mod:`pipesim.engine`) hold their rank only for their overheads, often no time at
all, so a bar would not show: each is a marker on its rank's row, a send a
triangle pointing right at the top of the row when the message leaves, a receive
a triangle pointing down at the bottom of the row when it was taken. Hover names
the action, the peer rank, the bytes, the time, the overhead and, for a
receive, how long the rank waited for the message, in the drawn time unit.
One ``go.Scatter`` per kind keeps the page small whatever the schedule's size.

A binned timeline (:mod:`pipesim.plot.binned`, for schedules too large for bars)
draws them aggregated: each rank's time is cut into at most :data:`BINNED_MARKS`
``// n_ranks`` equal bins, and a bin holding sends (receives) gets one mark at its
middle, sized by how many it holds, with the count and the bin's span on hover.

>>> from pipesim.comms import lower_comms
>>> from pipesim.engine import simulate
>>> from pipesim.schedules import generate
>>> sim = simulate(lower_comms(generate("gpipe", n_ranks=2, n_microbatches=2)))
>>> [(t.name, len(t.x)) for t in comm_traces(sim, factor=Fraction(1), time_unit="unit")]
[('send (SEND_F, SEND_B)', 4), ('receive (RECV_F, RECV_B)', 4)]
>>> comm_bin_counts(sim, n_bins=2)["SEND"]  # makespan 9: rank 0 sends at 1, 2; rank 1 at 5, 7
[[2, 0], [0, 2]]
"""

from __future__ import annotations

from fractions import Fraction
from typing import Any

import plotly.graph_objects as go

from pipesim.engine import Simulation
from pipesim.exact import Time
from pipesim.plot.memory import scaled
from pipesim.plot.style import format_bytes
from pipesim.trace import CommRecord
from pipesim.units import unit_suffix

__all__ = ["BINNED_MARKS", "COMM_COLORS", "binned_comm_traces", "comm_bin_counts", "comm_traces"]

#: At most about this many marks per kind (send, receive) in a binned timeline: a few
#: tens of kB of page, where one mark per message of a large schedule would be megabytes.
BINNED_MARKS = 2_000

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


def _at(record: CommRecord) -> Time:
    """When a message is drawn: a send when it leaves (the end of its overhead), a
    receive when the rank took it (after any wait)."""
    return record.end if record.comm.op.is_send else record.start


def comm_traces(
    sim: Simulation, /, *, factor: Fraction, time_unit: str, showlegend: bool = True
) -> list[go.Scatter]:
    """A marker trace for the sends and one for the receives of ``sim`` (none for a
    compute schedule); times scaled by ``factor`` into ``time_unit``."""
    columns: dict[str, tuple[list[Any], list[float], list[list[Any]]]] = {}
    for record in sim.trace.comms:
        kind = "SEND" if record.comm.op.is_send else "RECV"
        xs, ys, data = columns.setdefault(kind, ([], [], []))
        at = scaled(_at(record), factor)
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
            _marks(
                kind,
                x=xs,
                y=ys,
                size=7,
                customdata=data,
                hovertemplate=hover.replace("{unit}", suffix),
                showlegend=showlegend,
            )
        )
    return traces


def _marks(
    kind: str,
    *,
    x: list[Any],
    y: list[float],
    size: int | list[int],
    customdata: list[list[Any]],
    hovertemplate: str,
    showlegend: bool,
    meta: dict[str, Any] | None = None,
) -> go.Scatter:
    """One kind's marks (``"SEND"`` or ``"RECV"``): its symbol, colour and legend group."""
    return go.Scatter(
        x=x,
        y=y,
        mode="markers",
        name=_NAMES[kind],
        legendgroup=kind,
        showlegend=showlegend,
        marker={
            "symbol": _SYMBOLS[kind],
            "size": size,
            "color": COMM_COLORS[kind],
            "line": {"width": 0},
        },
        customdata=customdata,
        hovertemplate=hovertemplate,
        meta=meta,
    )


def comm_bin_counts(sim: Simulation, /, *, n_bins: int) -> dict[str, list[list[int]]]:
    """Per kind (``"SEND"``, ``"RECV"``) and rank, how many messages fall in each of
    ``n_bins`` equal bins of the step (drawn at the instants of :func:`comm_traces`; an
    instant on a boundary belongs to the later bin, the makespan to the last)."""
    trace = sim.trace
    makespan = trace.makespan or 1
    counts = {kind: [[0] * n_bins for _ in range(trace.n_ranks)] for kind in ("SEND", "RECV")}
    for record in trace.comms:
        kind = "SEND" if record.comm.op.is_send else "RECV"
        # exact floor division (int or Fraction times): the same bin however it is scaled
        index = min(int(_at(record) * n_bins // makespan), n_bins - 1)
        counts[kind][record.rank][index] += 1
    return counts


_BINNED_HOVER = (
    "<b>%{customdata[0]} {what}</b> on rank %{customdata[1]}"
    "<br>from %{customdata[2]}{unit} to %{customdata[3]}{unit}<extra></extra>"
)


def binned_comm_traces(
    sim: Simulation, /, *, factor: Fraction, time_unit: str, showlegend: bool = True
) -> list[go.Scatter]:
    """The sends and receives of ``sim`` aggregated per rank and time bin (none for a
    compute schedule): one mark per bin that holds any, sized by its count."""
    if not sim.trace.comms:
        return []
    n_bins = max(1, BINNED_MARKS // max(sim.trace.n_ranks, 1))
    width = Fraction(sim.trace.makespan or 1) * factor / n_bins
    counts = comm_bin_counts(sim, n_bins=n_bins)
    suffix = unit_suffix(time_unit)
    traces = []
    for kind, what in (("SEND", "sends"), ("RECV", "receives")):
        marks = [
            (rank, i, n) for rank, row in enumerate(counts[kind]) for i, n in enumerate(row) if n
        ]
        if not marks:
            continue
        most = max(n for *_, n in marks)
        traces.append(
            _marks(
                kind,
                x=[float(width * i + width / 2) for _, i, _ in marks],
                y=[rank + _OFFSET[kind] for rank, _, _ in marks],
                size=[4 + round(6 * (n / most) ** 0.5) for *_, n in marks],
                customdata=[
                    [n, rank, float(width * i), float(width * (i + 1))] for rank, i, n in marks
                ],
                hovertemplate=_BINNED_HOVER.replace("{what}", what).replace("{unit}", suffix),
                showlegend=showlegend,
                meta={"pipesim": "binned-comms", "n_bins": n_bins},
            )
        )
    return traces
