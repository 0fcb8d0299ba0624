"""Large timelines: each rank's row cut into time bins, one heatmap cell per bin.

A browser draws a few tens of thousands of SVG bars comfortably; a 64-rank x
1024-micro-batch 1F1B step has 131,072 actions plus its idle gaps, which as
bars make an 11.7 MB page that does not open. Above :data:`LARGE_BARS` bars a
timeline is therefore drawn *aggregated*: every lane (rank or link) is cut into
:data:`N_BINS` equal time bins and each bin is one heatmap cell coloured by the
kind of bar that covers most of it (idle when nothing runs most of the time).
A heatmap is one image however many cells it has, so the page stays small and
renders in about a second; the figure says so in its title line. Zoom in on a
window by simulating fewer micro-batches when the individual bars matter.

>>> from pipesim.engine import simulate
>>> from pipesim.schedules import generate
>>> sim = simulate(generate("gpipe", n_ranks=2, n_microbatches=2, forward_only=True))
>>> bin_kinds(sim, n_bins=3)  # makespan 3: rank 0 runs F in [0, 2], rank 1 in [1, 3]
[['F', 'F', 'idle'], ['idle', 'F', 'F']]
"""

from __future__ import annotations

from fractions import Fraction

import plotly.graph_objects as go

from pipesim.engine import Simulation
from pipesim.exact import Time
from pipesim.plot.style import BAR_KINDS, OP_COLORS, OP_NAMES, kind_of

__all__ = ["LARGE_BARS", "N_BINS", "bar_count", "bin_kinds", "binned_traces"]

#: Above this many bars (actions, transfers, idle gaps) a timeline is drawn binned.
LARGE_BARS = 25_000

#: Time bins per lane of a binned timeline (about one per pixel column of a wide screen).
N_BINS = 1200


def bar_count(simulation: Simulation, /, *, idle: bool = True) -> int:
    """How many bars the full timeline of ``simulation`` draws: actions, transfers that
    take time, and (with ``idle``) idle gaps.

    >>> from pipesim.engine import simulate
    >>> from pipesim.schedules import generate
    >>> bar_count(simulate(generate("gpipe", n_ranks=2, n_microbatches=2, forward_only=True)))
    6
    """
    trace = simulation.trace
    count = len(trace.actions) + sum(1 for t in trace.transfers if t.end > t.start)
    if idle:
        ends: list[Time] = [0] * trace.n_ranks  # a rank's records come in start order
        for record in trace.actions:
            count += int(record.start > ends[record.rank])
            ends[record.rank] = max(ends[record.rank], record.end)
        count += sum(1 for end in ends if end < trace.makespan)
    return count


# Binning only decides colours on screen, so it runs in floats: exact Fractions would
# make a 131,072-action step take seconds here.
def _lane_cover(
    intervals: list[tuple[float, float, int]], n_bins: int, width: float
) -> list[list[float]]:
    """Per bin, the time each kind covers: ``cover[bin][kind index]``."""
    cover = [[0.0] * len(BAR_KINDS) for _ in range(n_bins)]
    for start, end, kind in intervals:
        first = min(int(start / width), n_bins - 1)
        last = min(int(end / width), n_bins - 1)
        for b in range(first, last + 1):
            low, high = max(start, b * width), min(end, (b + 1) * width)
            if high > low:
                cover[b][kind] += high - low
    return cover


def _lanes(
    simulation: Simulation, link_rows: dict[tuple[int, int], int], n_lanes: int
) -> list[list[tuple[float, float, int]]]:
    trace = simulation.trace
    lanes: list[list[tuple[float, float, int]]] = [[] for _ in range(n_lanes)]
    for record in trace.actions:
        kind = BAR_KINDS.index(kind_of(record.work))
        lanes[record.rank].append((float(record.start), float(record.end), kind))
    transfer = BAR_KINDS.index("transfer")
    for t in trace.transfers:
        row = link_rows.get((t.src_rank, t.dst_rank))
        if row is not None and t.end > t.start:
            lanes[row].append((float(t.start), float(t.end), transfer))
    return lanes


def _kinds(
    simulation: Simulation, link_rows: dict[tuple[int, int], int], n_lanes: int, n_bins: int
) -> list[list[int]]:
    """Per lane and bin, the index in BAR_KINDS of the kind covering most of the bin."""
    width = float(simulation.trace.makespan or 1) / n_bins
    idle = BAR_KINDS.index("idle")
    rows = []
    for lane in _lanes(simulation, link_rows, n_lanes):
        row = []
        for cover in _lane_cover(lane, n_bins, width):
            cover[idle] = width - sum(cover)
            row.append(max(range(len(cover)), key=lambda k: (cover[k], -k)))
        rows.append(row)
    return rows


def bin_kinds(simulation: Simulation, /, *, n_bins: int = N_BINS) -> list[list[str]]:
    """Per rank, the kind of bar (``F``, ``B``, ..., ``idle``) drawn in each time bin."""
    kinds = _kinds(simulation, {}, simulation.trace.n_ranks, n_bins)
    return [[BAR_KINDS[k] for k in row] for row in kinds]


def binned_traces(
    simulation: Simulation,
    /,
    *,
    link_rows: dict[tuple[int, int], int],
    lane_names: tuple[str, ...],
    factor: Fraction,
    time_suffix: str,
    n_bins: int = N_BINS,
    showlegend: bool = True,
) -> list[go.Heatmap | go.Scatter]:
    """The heatmap of the binned timeline, plus one empty legend-only trace per kind
    present (a heatmap has no legend of its own)."""
    n_lanes = len(lane_names)
    z = _kinds(simulation, link_rows, n_lanes, n_bins)
    n_kinds = len(BAR_KINDS)
    scale = []
    for index, kind in enumerate(BAR_KINDS):  # a discrete colour scale: one band per kind
        scale += [[index / n_kinds, OP_COLORS[kind]], [(index + 1) / n_kinds, OP_COLORS[kind]]]
    width = Fraction(simulation.trace.makespan or 1) * factor / n_bins
    heatmap = go.Heatmap(
        z=z,
        x0=float(width / 2),
        dx=float(width),
        y=list(range(n_lanes)),
        zmin=-0.5,
        zmax=n_kinds - 0.5,
        colorscale=scale,
        showscale=False,
        # No per-cell text: 77k hover strings would weigh more than the picture.
        hovertemplate="time %{x:.4g}" + time_suffix + "<extra>binned</extra>",
        name="binned timeline",
        meta={"pipesim": "binned", "n_bins": n_bins},
    )
    present = sorted({k for row in z for k in row})
    legend = [
        go.Scatter(
            x=[None],
            y=[None],
            mode="markers",
            marker={"symbol": "square", "size": 12, "color": OP_COLORS[BAR_KINDS[k]]},
            name=OP_NAMES[BAR_KINDS[k]],
            legendgroup=BAR_KINDS[k],
            showlegend=showlegend,
            hoverinfo="skip",
        )
        for k in present
    ]
    return [heatmap, *legend]
