"""Timeline figures: a row per rank, a lane per busy link, a bar per unit of work.

Each bar kind (F, B, I, W, overlapped F&B, transfer, idle) is **one** horizontal
``go.Bar`` trace whose bars start at ``base`` and last ``x``: a 32-rank x
256-micro-batch schedule is a handful of traces, not 16,000, which keeps the
HTML small and the browser quick. Rows are numbered from the top (rank 0
first), links follow the ranks; the y axis labels them.

Idle gaps are drawn as pale grey bars so that they stay visible and show their
extent on hover; they are exactly :func:`pipesim.metrics.idle_intervals`.

>>> from pipesim.engine import simulate
>>> from pipesim.schedules import generate
>>> fig = timeline_figure(simulate(generate("1f1b", n_ranks=4, n_microbatches=8)))
>>> [t.legendgroup for t in fig.data if t.type == "bar"]
['F', 'B', 'idle']
>>> fig.layout.xaxis.range
(0, 33)
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import plotly.graph_objects as go
from plotly.colors import qualitative
from plotly.subplots import make_subplots

from pipesim.engine import Simulation
from pipesim.errors import PipesimError
from pipesim.metrics import idle_intervals
from pipesim.plot.memory import (
    Quantity,
    memory_axis_title,
    memory_quantity,
    memory_traces,
    peak_rank,
)
from pipesim.plot.style import BAR_KINDS, OP_COLORS, OP_NAMES, headline, kind_of, to_float

__all__ = ["bar_traces", "compare_figure", "default_label", "lane_labels", "timeline_figure"]

_LANE_PX = 24  # pixels per rank or link row
_MEMORY_PX = 240
_CHROME_PX = 170  # title, axis titles and margins

_ACTION_HOVER = (
    "<b>%{customdata[0]}</b><br>stage %{customdata[1]}<br>micro-batch %{customdata[2]}"
    "<br>start %{customdata[3]}<br>end %{customdata[4]}<br>duration %{customdata[5]}"
)
_TRANSFER_HOVER = (
    "<b>%{customdata[0]}</b><br>stage %{customdata[1]}<br>micro-batch %{customdata[2]}"
    "<br>start %{customdata[3]}<br>end %{customdata[4]}<br>duration %{customdata[5]}"
    "<br>%{customdata[6]} bytes"
)
_IDLE_HOVER = "idle<br>start %{customdata[0]}<br>end %{customdata[1]}<br>duration %{customdata[2]}"


def lane_labels(simulation: Simulation, /) -> tuple[tuple[str, ...], dict[tuple[int, int], int]]:
    """Row labels (ranks, then each link direction that carries time) and the row of
    each ``(src_rank, dst_rank)`` link.

    >>> from pipesim.costs import CostModel, Link
    >>> from pipesim.engine import simulate
    >>> from pipesim.schedules import generate
    >>> sim = simulate(generate("1f1b", n_ranks=2, n_microbatches=2),
    ...                costs=CostModel.uniform(link=Link(latency=1)))
    >>> lane_labels(sim)
    (('rank 0', 'rank 1', 'link 0→1', 'link 1→0'), {(0, 1): 2, (1, 0): 3})
    """
    labels = [f"rank {rank}" for rank in range(simulation.trace.n_ranks)]
    pairs = sorted(
        {(t.src_rank, t.dst_rank) for t in simulation.trace.transfers if t.end > t.start}
    )
    rows = {}
    for src, dst in pairs:
        rows[(src, dst)] = len(labels)
        labels.append(f"link {src}→{dst}")
    return tuple(labels), rows


class _Columns:
    """The columns of one bar trace, filled bar by bar."""

    def __init__(self) -> None:
        self.y: list[int] = []
        self.base: list[int | float] = []
        self.x: list[int | float] = []
        self.text: list[str] = []
        self.customdata: list[list[Any]] = []


def bar_traces(
    simulation: Simulation,
    /,
    *,
    idle: bool = True,
    showlegend: bool = True,
) -> list[go.Bar]:
    """One horizontal bar trace per bar kind present in ``simulation``, in
    :data:`~pipesim.plot.style.BAR_KINDS` order; ``legendgroup`` is the kind."""
    trace = simulation.trace
    _, link_rows = lane_labels(simulation)
    columns = {kind: _Columns() for kind in BAR_KINDS}
    for record in trace.actions:
        col = columns[kind_of(record.work)]
        parts = record.work.parts
        microbatches = ",".join(str(a.microbatch) for a in parts)
        col.y.append(record.rank)
        col.base.append(to_float(record.start))
        col.x.append(to_float(record.duration))
        col.text.append(microbatches)
        col.customdata.append(
            [
                str(record.work),
                ",".join(str(a.stage) for a in parts),
                microbatches,
                to_float(record.start),
                to_float(record.end),
                to_float(record.duration),
            ]
        )
    for transfer in trace.transfers:
        row = link_rows.get((transfer.src_rank, transfer.dst_rank))
        if row is None:  # a free link: the message took no time, there is nothing to draw
            continue
        col = columns["transfer"]
        duration = transfer.end - transfer.start
        col.y.append(row)
        col.base.append(to_float(transfer.start))
        col.x.append(to_float(duration))
        col.text.append(str(transfer.producer.microbatch))
        col.customdata.append(
            [
                f"{transfer.producer} → {transfer.consumer}",
                f"{transfer.producer.stage}→{transfer.consumer.stage}",
                transfer.producer.microbatch,
                to_float(transfer.start),
                to_float(transfer.end),
                to_float(duration),
                transfer.n_bytes,
            ]
        )
    if idle:
        col = columns["idle"]
        for rank in range(trace.n_ranks):
            for start, end in idle_intervals(trace, rank):
                col.y.append(rank)
                col.base.append(to_float(start))
                col.x.append(to_float(end - start))
                col.text.append("")
                col.customdata.append([to_float(start), to_float(end), to_float(end - start)])
    # White outlines separate neighbouring bars, but on crowded rows they wash the colour out.
    outline = 0.5 if len(trace.actions) <= 64 * trace.n_ranks else 0.0
    bars = []
    for kind in BAR_KINDS:
        col = columns[kind]
        if not col.y:
            continue
        hover = {"transfer": _TRANSFER_HOVER, "idle": _IDLE_HOVER}.get(kind, _ACTION_HOVER)
        bars.append(
            go.Bar(
                orientation="h",
                y=col.y,
                base=col.base,
                x=col.x,
                width=0.8,
                name=OP_NAMES[kind],
                legendgroup=kind,
                showlegend=showlegend,
                marker={
                    "color": OP_COLORS[kind],
                    "line": {"width": outline if kind != "idle" else 0.0, "color": "white"},
                },
                text=col.text if kind != "idle" else None,
                textposition="inside" if kind != "idle" else "none",
                insidetextanchor="middle",
                textangle=0,
                textfont={"color": "white" if kind != "idle" else "#444444"},
                customdata=col.customdata,
                hovertemplate=hover,
            )
        )
    return bars


def default_label(simulation: Simulation, /) -> str:
    """``name p=P m=M`` (and ``v=V`` when ranks hold several stages).

    >>> from pipesim.engine import simulate
    >>> from pipesim.schedules import generate
    >>> default_label(simulate(generate("interleaved-1f1b", n_ranks=2, n_microbatches=4,
    ...                                 virtual=2)))
    'interleaved-1f1b p=2 m=4 v=2'
    """
    s = simulation.schedule
    label = f"{s.name} p={s.n_ranks} m={s.n_microbatches}"
    if s.n_stages != s.n_ranks:
        label += f" v={s.n_stages // s.n_ranks}"
    return label


def _lane_axis(labels: Sequence[str]) -> dict[str, Any]:
    return {
        "tickmode": "array",
        "tickvals": list(range(len(labels))),
        "ticktext": list(labels),
        "range": [len(labels) - 0.5, -0.5],  # rank 0 on top
        "showgrid": False,
        "zeroline": False,
    }


def _title(text: str, subtitle: str) -> dict[str, Any]:
    return {"text": f"{text}<br><sup>{subtitle}</sup>", "x": 0.01, "xanchor": "left"}


def timeline_figure(
    simulation: Simulation,
    /,
    *,
    memory: bool = True,
    idle: bool = True,
    title: str | None = None,
) -> go.Figure:
    """The timeline of one simulated step, with memory curves below it.

    The title carries makespan, bubble ratio, idle slots and peak memory; the x
    axis runs from 0 to the makespan and is shared with the memory panel.

    >>> from pipesim.engine import simulate
    >>> from pipesim.schedules import generate
    >>> fig = timeline_figure(simulate(generate("gpipe", n_ranks=2, n_microbatches=4)))
    >>> fig.layout.title.text.splitlines()[0]
    'gpipe: 2 ranks, 2 stages, 4 micro-batches<br><sup>makespan 15 · bubble 20.0% · \
idle slots 6 · peak memory 0 B (4 in flight)</sup>'
    """
    s, metrics = simulation.schedule, simulation.metrics
    labels, _ = lane_labels(simulation)
    makespan = to_float(simulation.trace.makespan)
    lanes_px = max(120, _LANE_PX * len(labels))
    rows = 2 if memory else 1
    heights = [lanes_px, _MEMORY_PX] if memory else [lanes_px]
    total_px = sum(heights) + _CHROME_PX + (40 if memory else 0)
    fig = make_subplots(
        rows=rows,
        cols=1,
        shared_xaxes=True,
        row_heights=heights,
        vertical_spacing=40 / total_px if memory else 0.0,
    )
    for bar in bar_traces(simulation, idle=idle):
        fig.add_trace(bar, row=1, col=1)
    if memory:
        quantity = memory_quantity(simulation)
        for line in memory_traces(simulation, quantity=quantity):
            fig.add_trace(line, row=2, col=1)
        fig.update_yaxes(
            title={"text": memory_axis_title(simulation, quantity=quantity)},
            rangemode="tozero",
            row=2,
            col=1,
        )
    heading = title or (
        f"{s.name}: {s.n_ranks} ranks, {s.n_stages} stages, {s.n_microbatches} micro-batches"
    )
    fig.update_layout(
        template="plotly_white",
        title=_title(heading, headline(metrics)),
        barmode="overlay",
        height=total_px,
        uniformtext={"minsize": 8, "mode": "hide"},  # hide labels that no longer fit
        hovermode="closest",
        legend={"tracegroupgap": 16},
        margin={"t": 90, "l": 80, "r": 20, "b": 50},
    )
    fig.update_yaxes(_lane_axis(labels), row=1, col=1)
    fig.update_xaxes(range=[0, makespan])
    fig.update_xaxes(title={"text": "time"}, row=rows, col=1)
    return fig


def compare_figure(
    simulations: Sequence[Simulation],
    /,
    *,
    labels: Sequence[str] | None = None,
    memory: bool = True,
    title: str | None = None,
) -> go.Figure:
    """Several simulated steps stacked on one shared time axis.

    Each step gets its own block of rank (and link) rows, titled with its label
    and headline; with ``memory`` a last panel draws, for each step, the memory
    of its highest-peak rank, so that GPipe's climb and 1F1B's plateau sit on
    the same axes.

    >>> from pipesim.engine import simulate
    >>> from pipesim.schedules import generate
    >>> sims = [simulate(generate(n, n_ranks=4, n_microbatches=8)) for n in ("gpipe", "1f1b")]
    >>> fig = compare_figure(sims)
    >>> [a.text.split(":")[0] for a in fig.layout.annotations]
    ['<b>gpipe p=4 m=8</b>', '<b>1f1b p=4 m=8</b>', 'peak-memory rank of each schedule']
    """
    sims = list(simulations)
    if not sims:
        raise PipesimError("nothing to compare: give one or more simulations")
    names = list(labels) if labels is not None else [default_label(sim) for sim in sims]
    if len(names) != len(sims):
        raise PipesimError(
            f"got {len(names)} labels for {len(sims)} simulations; give one label per simulation"
        )
    lane_sets = [lane_labels(sim)[0] for sim in sims]
    heights = [max(96, _LANE_PX * len(lanes)) for lanes in lane_sets]
    titles = [
        f"<b>{name}</b>: {headline(sim.metrics)}" for name, sim in zip(names, sims, strict=True)
    ]
    if memory:
        heights.append(_MEMORY_PX)
        titles.append("peak-memory rank of each schedule")
    gap_px = 56
    total_px = sum(heights) + gap_px * (len(heights) - 1) + _CHROME_PX
    fig = make_subplots(
        rows=len(heights),
        cols=1,
        shared_xaxes=True,
        row_heights=heights,
        vertical_spacing=gap_px / total_px,
        subplot_titles=titles,
    )
    shown: set[str] = set()  # one legend entry per bar kind; it toggles that kind everywhere
    for index, sim in enumerate(sims):
        for bar in bar_traces(sim):
            bar.showlegend = bar.legendgroup not in shown
            shown.add(bar.legendgroup)
            fig.add_trace(bar, row=index + 1, col=1)
        fig.update_yaxes(_lane_axis(lane_sets[index]), row=index + 1, col=1)
        fig.add_vline(
            x=to_float(sim.trace.makespan),
            line={"dash": "dot", "color": "#555555", "width": 1},
            row=index + 1,
            col=1,
        )
    if memory:
        quantities = {memory_quantity(sim) for sim in sims}
        quantity: Quantity = "bytes" if "bytes" in quantities else "inflight"
        palette = qualitative.Dark2
        for index, (name, sim) in enumerate(zip(names, sims, strict=True)):
            rank = peak_rank(sim, quantity=quantity)
            for line in memory_traces(
                sim,
                quantity=quantity,
                ranks=(rank,),
                label=f"{name}: ",
                colors=[palette[index % len(palette)]],
                legendgroup=f"memory {index}",
            ):
                line.legendgrouptitle = None
                fig.add_trace(line, row=len(heights), col=1)
        fig.update_yaxes(
            title={"text": memory_axis_title(sims[0], quantity=quantity)},
            rangemode="tozero",
            row=len(heights),
            col=1,
        )
    longest = max(to_float(sim.trace.makespan) for sim in sims)
    fig.update_layout(
        template="plotly_white",
        title=_title(title or f"{len(sims)} schedules on one time axis", " · ".join(names)),
        barmode="overlay",
        height=total_px,
        uniformtext={"minsize": 8, "mode": "hide"},
        hovermode="closest",
        legend={"tracegroupgap": 16},
        margin={"t": 100, "l": 80, "r": 20, "b": 50},
    )
    fig.update_xaxes(range=[0, longest])
    fig.update_xaxes(title={"text": "time"}, row=len(heights), col=1)
    return fig
