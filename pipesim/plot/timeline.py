"""Timeline figures: a row per rank, a lane per busy link, a bar per unit of work.

Each bar kind (F, B, I, W, overlapped F&B, transfer, idle) is **one** horizontal
``go.Bar`` trace per chunk whose bars start at ``base`` and last ``x``: a
32-rank x 256-micro-batch schedule is a handful of traces, not 16,000, which
keeps the HTML small and the browser quick. Rows are numbered from the top
(rank 0 first), links follow the ranks; the y axis labels them.

What a reader needs at a glance:

- every panel has time ticks, and its axis title names the unit (the cost
  model's :attr:`~pipesim.costs.CostModel.time_unit`, shown in the readable
  unit of :func:`pipesim.units.display_scale`: a 0.38 s step reads in ms);
- where a rank holds several stages (interleaved, V-shaped), each chunk has its
  own shade of the op colour and its own legend entry ("F forward, chunk 1");
- an overlapped F&B pair is labelled with both halves (``F3 B1``);
- above :data:`~pipesim.plot.binned.LARGE_BARS` bars the rows are drawn binned
  (:mod:`pipesim.plot.binned`), and the title says so;
- memory above the device capacity is drawn red (:mod:`pipesim.plot.memory`);
- a comms schedule's sends and receives are marks on their rank's row
  (:mod:`pipesim.plot.comms`; in a binned figure, one mark per rank and bin
  that holds any, sized by their count).

Idle gaps are drawn as pale grey bars so that they stay visible and show their
extent on hover; they are exactly :func:`pipesim.metrics.idle_intervals`.

Every figure takes a Simulation, or a Trace with ``schedule=`` (and
``costs=``): see :mod:`pipesim.views`.

>>> from pipesim.engine import simulate
>>> from pipesim.schedules import generate
>>> fig = timeline_figure(simulate(generate("1f1b", n_ranks=4, n_microbatches=8)))
>>> [t.legendgroup for t in fig.data if t.type == "bar"]
['F', 'B', 'idle']
>>> fig.layout.xaxis.range, fig.layout.xaxis.title.text
((0, 33), 'time (units)')
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

import plotly.graph_objects as go
from plotly.colors import qualitative
from plotly.subplots import make_subplots

from pipesim.actions import Action
from pipesim.costs import CostModel
from pipesim.engine import Simulation
from pipesim.errors import PipesimError
from pipesim.metrics import idle_intervals_by_rank
from pipesim.plot.binned import LARGE_BARS, N_BINS, bar_count, binned_traces
from pipesim.plot.comms import binned_comm_traces, comm_traces
from pipesim.plot.memory import (
    Quantity,
    memory_axis_title,
    memory_divisor,
    memory_quantity,
    memory_traces,
    peak_rank,
    sample_ranks,
    scaled,
)
from pipesim.plot.style import BAR_KINDS, OP_COLORS, OP_NAMES, headline, kind_of, shade
from pipesim.schedule import Schedule
from pipesim.units import display_scale, time_axis_title, unit_suffix
from pipesim.views import Viewable, step_of

__all__ = [
    "bar_traces",
    "chunk_of",
    "compare_figure",
    "default_label",
    "lane_labels",
    "time_scale",
    "timeline_figure",
]

_LANE_PX = 24  # pixels per rank or link row
_MEMORY_PX = 240
_CHROME_PX = 200  # title, axis titles and margins
_AXIS_PX = 56  # tick labels and the time axis title under a panel

_ACTION_HOVER = (
    "<b>%{customdata[0]}</b>{chunk}<br>stage %{customdata[1]}<br>micro-batch %{customdata[2]}"
    "<br>start %{customdata[3]}{unit}<br>end %{customdata[4]}{unit}"
    "<br>duration %{customdata[5]}{unit}<extra></extra>"
)
_OVERLAP_HOVER = (
    "<b>F&B pair %{customdata[0]}</b>{chunk}<br>%{text} (op and micro-batch of each half)"
    "<br>stages %{customdata[1]}<br>start %{customdata[3]}{unit}<br>end %{customdata[4]}{unit}"
    "<br>duration %{customdata[5]}{unit}<extra></extra>"
)
_TRANSFER_HOVER = (
    "<b>%{customdata[0]}</b><br>stage %{customdata[1]}<br>micro-batch %{customdata[2]}"
    "<br>start %{customdata[3]}{unit}<br>end %{customdata[4]}{unit}"
    "<br>duration %{customdata[5]}{unit}<br>%{customdata[6]} bytes<extra></extra>"
)
_IDLE_HOVER = (
    "idle<br>start %{customdata[0]}{unit}<br>end %{customdata[1]}{unit}"
    "<br>duration %{customdata[2]}{unit}<extra></extra>"
)


def time_scale(simulations: Sequence[Simulation], /) -> tuple[Fraction, str]:
    """``(factor, unit)``: the readable unit every panel of ``simulations`` is drawn in
    (:func:`pipesim.units.display_scale` of the longest makespan). Steps in different
    units cannot share an axis: PipesimError.

    >>> from pipesim.costs import CostModel
    >>> from pipesim.engine import simulate
    >>> from pipesim.schedules import generate
    >>> costs = CostModel.uniform(forward=10**6, backward=2 * 10**6, time_unit="ns")
    >>> time_scale([simulate(generate("1f1b", n_ranks=2, n_microbatches=2), costs=costs)])
    (Fraction(1, 1000000), 'ms')
    """
    units = {sim.costs.time_unit for sim in simulations}
    if len(units) > 1:
        raise PipesimError(
            f"steps in different time units ({', '.join(sorted(units))}) cannot share one time "
            "axis; give every cost model the same time_unit"
        )
    longest = max((sim.trace.makespan for sim in simulations), default=0)
    return display_scale(units.pop() if units else "unit", longest)


def lane_labels(step: Viewable, /) -> tuple[tuple[str, ...], dict[tuple[int, int], int]]:
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
    trace = step.trace if isinstance(step, Simulation) else step
    labels = [f"rank {rank}" for rank in range(trace.n_ranks)]
    pairs = sorted({(t.src_rank, t.dst_rank) for t in trace.transfers if t.end > t.start})
    rows = {}
    for src, dst in pairs:
        rows[(src, dst)] = len(labels)
        labels.append(f"link {src}→{dst}")
    return tuple(labels), rows


def chunk_of(schedule: Schedule, /) -> tuple[dict[int, int], int]:
    """Each stage's chunk on its rank (its position among the rank's stages, in stage
    order) and the most chunks any rank holds.

    >>> from pipesim.schedules import generate
    >>> chunk_of(generate("zbv", n_ranks=2, n_microbatches=4))  # V: rank 0 holds 0 and 3
    ({0: 0, 3: 1, 1: 0, 2: 1}, 2)
    """
    chunks: dict[int, int] = {}
    most = 1
    for rank in range(schedule.n_ranks):
        stages = sorted(schedule.stages_of(rank))
        most = max(most, len(stages))
        for index, stage in enumerate(stages):
            chunks[stage] = index
    return chunks, most


class _Columns:
    """The columns of one bar trace, filled bar by bar."""

    def __init__(self) -> None:
        self.y: list[int] = []
        self.base: list[int | float] = []
        self.x: list[int | float] = []
        self.text: list[str] = []
        self.customdata: list[list[Any]] = []


def _label(parts: tuple[Action, ...]) -> str:
    """A bar's text: the micro-batch, or ``F3 B1`` for an overlapped pair."""
    if len(parts) == 1:
        return str(parts[0].microbatch)
    return " ".join(f"{a.op.value}{a.microbatch}" for a in parts)


def _fill_work(sim: Simulation, factor: Fraction, columns: dict[tuple[str, int], _Columns]) -> None:
    chunks, _ = chunk_of(sim.schedule)
    for record in sim.trace.actions:
        parts = record.work.parts
        col = columns.setdefault((kind_of(record.work), chunks.get(parts[0].stage, 0)), _Columns())
        col.y.append(record.rank)
        col.base.append(scaled(record.start, factor))
        col.x.append(scaled(record.duration, factor))
        col.text.append(_label(parts))
        col.customdata.append(
            [
                str(record.work),
                ",".join(str(a.stage) for a in parts),
                ",".join(str(a.microbatch) for a in parts),
                scaled(record.start, factor),
                scaled(record.end, factor),
                scaled(record.duration, factor),
            ]
        )


def _fill_transfers(
    sim: Simulation, factor: Fraction, link_rows: dict[tuple[int, int], int], col: _Columns
) -> None:
    for transfer in sim.trace.transfers:
        row = link_rows.get((transfer.src_rank, transfer.dst_rank))
        if row is None:  # a free link: the message took no time, there is nothing to draw
            continue
        duration = transfer.end - transfer.start
        col.y.append(row)
        col.base.append(scaled(transfer.start, factor))
        col.x.append(scaled(duration, factor))
        col.text.append(str(transfer.producer.microbatch))
        col.customdata.append(
            [
                f"{transfer.producer} → {transfer.consumer}",
                f"{transfer.producer.stage}→{transfer.consumer.stage}",
                transfer.producer.microbatch,
                scaled(transfer.start, factor),
                scaled(transfer.end, factor),
                scaled(duration, factor),
                transfer.n_bytes,
            ]
        )


def _fill_idle(sim: Simulation, factor: Fraction, col: _Columns) -> None:
    for rank, gaps in enumerate(idle_intervals_by_rank(sim.trace)):  # one pass, not per rank
        for start, end in gaps:
            col.y.append(rank)
            col.base.append(scaled(start, factor))
            col.x.append(scaled(end - start, factor))
            col.text.append("")
            col.customdata.append(
                [scaled(start, factor), scaled(end, factor), scaled(end - start, factor)]
            )


def bar_traces(
    step: Viewable,
    /,
    *,
    schedule: Schedule | None = None,
    costs: CostModel | None = None,
    idle: bool = True,
    showlegend: bool = True,
    factor: Fraction | None = None,
    time_unit: str | None = None,
) -> list[go.Bar]:
    """One horizontal bar trace per bar kind (and chunk, where ranks hold several
    stages) present in ``step``, in :data:`~pipesim.plot.style.BAR_KINDS` order;
    ``legendgroup`` is the kind. ``factor`` and ``time_unit`` set the drawn time unit
    (default: :func:`time_scale` of this step)."""
    sim = step_of(step, schedule=schedule, costs=costs)
    if factor is None or time_unit is None:
        factor, time_unit = time_scale([sim])
    suffix = unit_suffix(time_unit)
    _, link_rows = lane_labels(sim)
    _, n_chunks = chunk_of(sim.schedule)
    columns: dict[tuple[str, int], _Columns] = {}
    _fill_work(sim, factor, columns)
    if link_rows:
        _fill_transfers(sim, factor, link_rows, columns.setdefault(("transfer", 0), _Columns()))
    if idle:
        _fill_idle(sim, factor, columns.setdefault(("idle", 0), _Columns()))
    # White outlines separate neighbouring bars, but on crowded rows they wash the colour out.
    outline = 0.5 if len(sim.trace.actions) <= 64 * sim.trace.n_ranks else 0.0
    order = sorted(columns, key=lambda key: (BAR_KINDS.index(key[0]), key[1]))
    return [
        _bar(
            kind,
            chunk,
            columns[(kind, chunk)],
            n_chunks=n_chunks,
            suffix=suffix,
            outline=outline,
            showlegend=showlegend,
        )
        for kind, chunk in order
        if columns[(kind, chunk)].y
    ]


def _bar(
    kind: str,
    chunk: int,
    col: _Columns,
    *,
    n_chunks: int,
    suffix: str,
    outline: float,
    showlegend: bool,
) -> go.Bar:
    """The bar trace of one kind (and chunk) from its ``col``umns."""
    chunked = n_chunks > 1 and kind not in ("transfer", "idle")
    name = OP_NAMES[kind] + (f", chunk {chunk}" if chunked else "")
    template = {"transfer": _TRANSFER_HOVER, "idle": _IDLE_HOVER, "overlap": _OVERLAP_HOVER}
    hover = template.get(kind, _ACTION_HOVER).replace("{unit}", suffix)
    hover = hover.replace("{chunk}", f" (chunk {chunk} of its rank)" if chunked else "")
    return go.Bar(
        orientation="h",
        y=col.y,
        base=col.base,
        x=col.x,
        width=0.8,
        name=name,
        legendgroup=kind,
        showlegend=showlegend,
        marker={
            "color": shade(OP_COLORS[kind], chunk, n_chunks),
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


def default_label(step: Viewable, /, *, schedule: Schedule | None = None) -> str:
    """``name p=P m=M`` (and ``v=V`` when ranks hold several stages).

    >>> from pipesim.engine import simulate
    >>> from pipesim.schedules import generate
    >>> default_label(simulate(generate("interleaved-1f1b", n_ranks=2, n_microbatches=4,
    ...                                 virtual=2)))
    'interleaved-1f1b p=2 m=4 v=2'
    """
    s = step.schedule if isinstance(step, Simulation) else schedule
    if s is None:
        raise PipesimError("a Trace is labelled with the schedule it ran: pass schedule=...")
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
    # Pinned to the top of the page: the margin below it is sized for its lines.
    return {
        "text": f"{text}<br><sup>{subtitle}</sup>",
        "x": 0.01,
        "xanchor": "left",
        "yref": "container",
        "y": 1,
        "yanchor": "top",
        "pad": {"t": 30},  # below plotly's mode bar
    }


def is_large(sim: Simulation, /, *, idle: bool = True) -> bool:
    """Whether ``sim``'s timeline is drawn binned (:mod:`pipesim.plot.binned`)."""
    return bar_count(sim, idle=idle) > LARGE_BARS


def _binned_note(sim: Simulation) -> str:
    return (
        f"{len(sim.trace.actions):,} actions, too many bars for a browser: each row is drawn "
        f"as {N_BINS:,} time bins, each mixing the op colours by the time they fill in it"
    )


def _draw_rows(
    fig: go.Figure,
    sim: Simulation,
    *,
    row: int,
    factor: Fraction,
    unit: str,
    idle: bool,
    shown: set[str],
    large: bool,
) -> None:
    """Bars (or, when ``large``, the binned heatmap) of ``sim`` into subplot ``row``; one
    legend entry per legend name across the figure."""
    labels, link_rows = lane_labels(sim)
    if large:
        traces: list[Any] = binned_traces(
            sim, link_rows=link_rows, n_lanes=len(labels), factor=factor
        )
        traces += binned_comm_traces(sim, factor=factor, time_unit=unit)
    else:
        traces = bar_traces(sim, idle=idle, factor=factor, time_unit=unit)
        traces += comm_traces(sim, factor=factor, time_unit=unit)
    for trace in traces:
        if trace.type != "image":
            trace.showlegend = trace.name not in shown
            shown.add(trace.name)
        fig.add_trace(trace, row=row, col=1)
    fig.update_yaxes(_lane_axis(labels), row=row, col=1)
    if large:  # an image would otherwise pin the axes to square pixels
        fig.update_yaxes(scaleanchor=False, row=row, col=1)


def _time_axes(fig: go.Figure, rows: int, *, unit: str, longest: int | float) -> None:
    """Ticks and the unit on every panel, not only the bottom one."""
    for row in range(1, rows + 1):
        fig.update_xaxes(
            range=[0, longest],
            showticklabels=True,
            ticks="outside",
            exponentformat="none",
            title={"text": time_axis_title(unit), "standoff": 4},
            row=row,
            col=1,
        )


def _legend() -> dict[str, Any]:
    # Right of the plot area, below the title: never over a title or a subplot title.
    return {"tracegroupgap": 12, "x": 1.01, "xanchor": "left", "y": 1, "yanchor": "top"}


def timeline_figure(
    step: Viewable,
    /,
    *,
    schedule: Schedule | None = None,
    costs: CostModel | None = None,
    memory: bool = True,
    idle: bool = True,
    title: str | None = None,
) -> go.Figure:
    """The timeline of one step, with memory curves below it.

    ``step`` is a Simulation, or a (measured) Trace with ``schedule`` and ``costs``.
    The title carries makespan, bubble ratio, idle slots and peak memory; the x
    axis runs from 0 to the makespan and is shared with the memory panel. A trace
    with no memory records (a measured one) gets no memory panel.

    >>> from pipesim.engine import simulate
    >>> from pipesim.schedules import generate
    >>> fig = timeline_figure(simulate(generate("gpipe", n_ranks=2, n_microbatches=4)))
    >>> fig.layout.title.text.splitlines()[0]
    'gpipe: 2 ranks, 2 stages, 4 micro-batches<br><sup>makespan 15 units · bubble 20.0% · \
idle slots 6 · peak memory 0 B (4 in flight)</sup>'
    """
    sim = step_of(step, schedule=schedule, costs=costs)
    s = sim.schedule
    memory = memory and bool(sim.trace.memory)
    labels, _ = lane_labels(sim)
    factor, unit = time_scale([sim])
    lanes_px = max(120, _LANE_PX * len(labels))
    rows = 2 if memory else 1
    heights = [lanes_px, _MEMORY_PX] if memory else [lanes_px]
    total_px = sum(heights) + _CHROME_PX + (_AXIS_PX if memory else 0)
    fig = make_subplots(
        rows=rows,
        cols=1,
        shared_xaxes=True,
        row_heights=heights,
        vertical_spacing=_AXIS_PX / total_px if memory else 0.0,
    )
    large = is_large(sim, idle=idle)
    _draw_rows(fig, sim, row=1, factor=factor, unit=unit, idle=idle, shown=set(), large=large)
    if memory:
        _draw_memory(fig, sim, row=2, factor=factor, unit=unit, large=large)
    heading = title or (
        f"{s.name}: {s.n_ranks} ranks, {s.n_stages} stages, {s.n_microbatches} micro-batches"
    )
    fig.update_layout(
        template="plotly_white",
        title=_title(heading, _timeline_subtitle(sim, large=large, memory=memory)),
        barmode="overlay",
        height=total_px,
        uniformtext={"minsize": 8, "mode": "hide"},  # hide labels that no longer fit
        hovermode="closest",
        legend=_legend(),
        margin={"t": 120 if large else 100, "l": 80, "r": 20, "b": 50},
    )
    _time_axes(fig, rows, unit=unit, longest=scaled(sim.trace.makespan, factor))
    return fig


def _draw_memory(
    fig: go.Figure, sim: Simulation, *, row: int, factor: Fraction, unit: str, large: bool
) -> None:
    """The memory curves of every rank into subplot ``row`` (when ``large``, of a sample
    of ranks, thinned to their per-bin highs)."""
    quantity = memory_quantity(sim)
    divisor, byte_unit = memory_divisor([sim]) if quantity == "bytes" else (1, "B")
    for line in memory_traces(
        sim,
        quantity=quantity,
        ranks=sample_ranks(sim, quantity=quantity) if large else None,
        factor=factor,
        time_unit=unit,
        divisor=divisor,
        byte_unit=byte_unit,
        n_bins=N_BINS if large else None,
    ):
        fig.add_trace(line, row=row, col=1)
    fig.update_yaxes(
        title={"text": memory_axis_title(sim, quantity=quantity, unit=byte_unit)},
        rangemode="tozero",
        exponentformat="none",
        row=row,
        col=1,
    )


def _timeline_subtitle(sim: Simulation, *, large: bool, memory: bool) -> str:
    """The headline, and for a binned figure what the binning leaves out."""
    subtitle = headline(sim.metrics)
    if large:
        subtitle += "<br>" + _binned_note(sim)
        if memory and sim.trace.n_ranks > 8:
            subtitle += "; memory of 8 ranks (the peak one among them), highest per bin"
    return subtitle


def compare_figure(
    steps: Sequence[Viewable],
    /,
    *,
    labels: Sequence[str] | None = None,
    memory: bool = True,
    title: str | None = None,
) -> go.Figure:
    """Several steps stacked on one shared time axis.

    Each step gets its own block of rank (and link) rows, titled with its label
    and headline; with ``memory`` a last panel draws, for each step, the memory
    of its highest-peak rank, so that GPipe's climb and 1F1B's plateau sit on
    the same axes. ``steps`` are Simulations (a Trace needs its schedule: use
    :func:`pipesim.views.step_of` first).

    >>> from pipesim.engine import simulate
    >>> from pipesim.schedules import generate
    >>> sims = [simulate(generate(n, n_ranks=4, n_microbatches=8)) for n in ("gpipe", "1f1b")]
    >>> fig = compare_figure(sims)
    >>> [a.text.split(":")[0] for a in fig.layout.annotations]
    ['<b>gpipe p=4 m=8</b>', '<b>1f1b p=4 m=8</b>', 'peak-memory rank of each schedule']
    """
    sims = [step_of(step) for step in steps]
    names = _compare_names(sims, labels)
    factor, unit = time_scale(sims)
    memory = memory and all(sim.trace.memory for sim in sims)
    panels = _Panels.of(sims, names, memory=memory)
    fig = make_subplots(
        rows=len(panels.heights),
        cols=1,
        shared_xaxes=True,
        row_heights=panels.heights,
        vertical_spacing=panels.gap_px / panels.total_px,
        subplot_titles=panels.titles,
    )
    for annotation in fig.layout.annotations:  # left-aligned: clear of the legend
        annotation.update(x=0, xanchor="left", align="left", font={"size": 13})
    larges = [is_large(sim) for sim in sims]
    _draw_blocks(fig, sims, factor=factor, unit=unit, larges=larges)
    if memory:
        row = len(panels.heights)
        _compare_memory(fig, sims, names, row=row, factor=factor, unit=unit, larges=larges)
    longest = max(scaled(sim.trace.makespan, factor) for sim in sims)
    heading = title or f"{len(sims)} schedules on one time axis"
    top_px = _compare_top_px(heading, panels.titles[0])
    fig.update_layout(
        template="plotly_white",
        title=_title(heading, " · ".join(names)),
        barmode="overlay",
        height=panels.total_px + top_px - 100,
        uniformtext={"minsize": 8, "mode": "hide"},
        hovermode="closest",
        legend=_legend(),
        margin={"t": top_px, "l": 80, "r": 20, "b": 50},
    )
    _time_axes(fig, len(panels.heights), unit=unit, longest=longest)
    return fig


def _compare_names(sims: list[Simulation], labels: Sequence[str] | None) -> list[str]:
    """One label per simulation: the given ones, or :func:`default_label` of each."""
    if not sims:
        raise PipesimError("nothing to compare: give one or more simulations")
    names = list(labels) if labels is not None else [default_label(sim) for sim in sims]
    if len(names) != len(sims):
        raise PipesimError(
            f"got {len(names)} labels for {len(sims)} simulations; give one label per simulation"
        )
    return names


@dataclass(frozen=True)
class _Panels:
    """The subplots of a comparison: a block of rows per step, then the memory panel."""

    heights: list[int]  # pixels of each panel
    titles: list[str]
    gap_px: int  # between one panel and the next
    total_px: int  # panels, gaps and chrome

    @classmethod
    def of(cls, sims: list[Simulation], names: list[str], *, memory: bool) -> _Panels:
        """The panels of ``sims`` labelled ``names``, with the memory panel when ``memory``."""
        lane_sets = [lane_labels(sim)[0] for sim in sims]
        heights = [max(96, _LANE_PX * len(lanes)) for lanes in lane_sets]
        titles = [_block_title(name, sim) for name, sim in zip(names, sims, strict=True)]
        if memory:
            heights.append(_MEMORY_PX)
            titles.append("peak-memory rank of each schedule")
        # tick labels and axis title of a block, then the next one's title (two lines at most)
        gap_px = _AXIS_PX + 28 + (16 if any("<br>" in t for t in titles) else 0)
        total_px = sum(heights) + gap_px * (len(heights) - 1) + _CHROME_PX
        return cls(heights=heights, titles=titles, gap_px=gap_px, total_px=total_px)


def _draw_blocks(
    fig: go.Figure, sims: list[Simulation], *, factor: Fraction, unit: str, larges: list[bool]
) -> None:
    """Each step's rows into its own subplot, with a dotted line at its makespan."""
    shown: set[str] = set()  # one legend entry per bar kind; it toggles that kind everywhere
    for index, sim in enumerate(sims):
        large = larges[index]
        _draw_rows(
            fig, sim, row=index + 1, factor=factor, unit=unit, idle=True, shown=shown, large=large
        )
        fig.add_vline(
            x=scaled(sim.trace.makespan, factor),
            line={"dash": "dot", "color": "#555555", "width": 1},
            row=index + 1,
            col=1,
        )


def _compare_top_px(heading: str, first_title: str) -> int:
    """The top margin: the heading's lines, the labels' line, and the first block's
    title, which sits in the margin."""
    title_lines = heading.count("<br>") + 2  # the heading's lines and the labels' line
    first_block = first_title.count("<br>") + 1
    return 40 + 20 * title_lines + 18 * first_block


def _block_title(name: str, sim: Simulation) -> str:
    """``<b>name</b>: headline``, wrapped before the memory part when long, so that it
    stays left of the legend at 1100 px."""
    text = f"<b>{name}</b>: {headline(sim.metrics)}"
    if len(text) - 7 > 96:  # 7: the <b></b> tags
        head, _, memory = text.rpartition(" · peak memory")
        text = f"{head}<br>peak memory{memory}"
    return text


def _compare_memory(
    fig: go.Figure,
    sims: list[Simulation],
    names: list[str],
    *,
    row: int,
    factor: Fraction,
    unit: str,
    larges: list[bool],
) -> None:
    quantities = {memory_quantity(sim) for sim in sims}
    quantity: Quantity = "bytes" if "bytes" in quantities else "inflight"
    divisor, byte_unit = memory_divisor(sims) if quantity == "bytes" else (1, "B")
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
            factor=factor,
            time_unit=unit,
            divisor=divisor,
            byte_unit=byte_unit,
            n_bins=N_BINS if larges[index] else None,
        ):
            line.legendgrouptitle = None
            fig.add_trace(line, row=row, col=1)
    fig.update_yaxes(
        title={"text": memory_axis_title(sims[0], quantity=quantity, unit=byte_unit)},
        rangemode="tozero",
        exponentformat="none",
        row=row,
        col=1,
    )
