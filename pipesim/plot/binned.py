"""Large timelines: each lane cut into time bins, drawn as one picture.

A browser draws a few tens of thousands of SVG bars comfortably; a 64-rank x
1024-micro-batch 1F1B step has 131,072 actions plus its idle gaps, which as
bars make an 11.7 MB page that does not open. Above :data:`LARGE_BARS` bars a
timeline is therefore drawn *aggregated*: every lane (rank or link) is cut into
:data:`N_BINS` equal time bins, and each bin is one pixel column whose colour
mixes the op colours in proportion to the time each kind of bar covers in the
bin (idle grey for the rest). A bin that is all forward is the forward blue,
a 1F1B steady state (one F and one B of twice its length per bin) a blue-red
mix, a bubble grey. The picture is a PNG embedded in the page as one
``go.Image`` trace, a few tens of kB however long the step, so the page stays
small and opens in seconds; the figure says so in its title line. Simulate
fewer micro-batches where individual bars matter.

>>> from pipesim.engine import simulate
>>> from pipesim.schedules import generate
>>> sim = simulate(generate("gpipe", n_ranks=2, n_microbatches=2, forward_only=True))
>>> bin_colors(sim, n_bins=3)[1]  # makespan 3: rank 1 idle in [0, 1], F in [1, 3]
[(230, 230, 230), (76, 120, 168), (76, 120, 168)]
"""

from __future__ import annotations

import base64
import struct
import zlib
from fractions import Fraction
from itertools import chain

import plotly.graph_objects as go

from pipesim.engine import Simulation
from pipesim.exact import Time
from pipesim.plot.style import BAR_KINDS, OP_COLORS, OP_NAMES, kind_of

__all__ = ["LARGE_BARS", "N_BINS", "bar_count", "bin_colors", "binned_traces", "png_bytes"]

#: Above this many bars (actions, transfers, idle gaps) a timeline is drawn binned.
LARGE_BARS = 25_000

#: Time bins per lane of a binned timeline (about one per pixel column of a wide screen).
N_BINS = 1200

_PX_PER_LANE = 5  # image rows per lane: 4 coloured, 1 white as the gap between lanes

RGB = tuple[int, int, int]


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
        makespan = trace.makespan  # a property that scans every record: read it once
        count += sum(1 for end in ends if end < makespan)
    return count


# Binning only decides colours on screen, so it runs in floats: exact Fractions would
# make a 131,072-action step take seconds here.
def _lane_colors(intervals: list[tuple[float, float, int]], n_bins: int, width: float) -> list[RGB]:
    """Per bin, the op colours weighted by the time each covers, idle for the rest."""
    red, green, blue, covered = ([0.0] * n_bins for _ in range(4))
    for start, end, kind in intervals:
        r, g, b = _RGB[kind]
        first = min(int(start / width), n_bins - 1)
        last = min(int(end / width), n_bins - 1)
        for i in range(first, last + 1):
            overlap = min(end, (i + 1) * width) - max(start, i * width)
            if overlap > 0:
                red[i] += overlap * r
                green[i] += overlap * g
                blue[i] += overlap * b
                covered[i] += overlap
    ir, ig, ib = _RGB[BAR_KINDS.index("idle")]
    row: list[RGB] = []
    for i in range(n_bins):
        idle = max(width - covered[i], 0.0)
        total = covered[i] + idle or 1.0
        row.append(
            (
                round((red[i] + idle * ir) / total),
                round((green[i] + idle * ig) / total),
                round((blue[i] + idle * ib) / total),
            )
        )
    return row


def _lanes(
    simulation: Simulation, link_rows: dict[tuple[int, int], int], n_lanes: int
) -> list[list[tuple[float, float, int]]]:
    trace = simulation.trace
    lanes: list[list[tuple[float, float, int]]] = [[] for _ in range(n_lanes)]
    for record in trace.actions:
        kind = BAR_KINDS.index(kind_of(record.work))
        lanes[record.rank].append((float(record.start), float(record.end), kind))
    transfer = BAR_KINDS.index("transfer")
    for t in trace.transfers if link_rows else ():  # reading them may build the records
        row = link_rows.get((t.src_rank, t.dst_rank))
        if row is not None and t.end > t.start:
            lanes[row].append((float(t.start), float(t.end), transfer))
    return lanes


_RGB = [tuple(int(OP_COLORS[k][i : i + 2], 16) for i in (1, 3, 5)) for k in BAR_KINDS]


def _colors(
    simulation: Simulation, link_rows: dict[tuple[int, int], int], n_lanes: int, n_bins: int
) -> tuple[list[list[RGB]], set[int]]:
    """Per lane and bin, the blended colour; and the kinds present."""
    width = float(simulation.trace.makespan or 1) / n_bins
    idle = BAR_KINDS.index("idle")
    rows: list[list[RGB]] = []
    present: set[int] = set()
    for lane in _lanes(simulation, link_rows, n_lanes):
        present.update(kind for *_, kind in lane)
        rows.append(_lane_colors(lane, n_bins, width))
    present.add(idle)
    return rows, present


def bin_colors(simulation: Simulation, /, *, n_bins: int = N_BINS) -> list[list[RGB]]:
    """Per rank, the colour of each time bin: the op colours mixed by the time each
    kind covers in the bin, idle grey for the rest."""
    return _colors(simulation, {}, simulation.trace.n_ranks, n_bins)[0]


def png_bytes(rows: list[list[RGB]], /) -> bytes:
    """An 8-bit RGB PNG (RFC 2083) of ``rows`` of pixels, filter 0, zlib level 9."""
    height, width = len(rows), len(rows[0]) if rows else 0

    def chunk(kind: bytes, body: bytes) -> bytes:
        crc = struct.pack(">I", zlib.crc32(kind + body))
        return struct.pack(">I", len(body)) + kind + body + crc

    lines: dict[int, bytes] = {}  # rows repeat (a lane is several pixel rows): pack once
    raw = b"".join(
        lines.setdefault(id(row), b"\x00" + bytes(chain.from_iterable(row))) for row in rows
    )
    return (
        b"\x89PNG\r\n\x1a\n"
        + chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0))
        + chunk(b"IDAT", zlib.compress(raw, 9))
        + chunk(b"IEND", b"")
    )


def binned_traces(
    simulation: Simulation,
    /,
    *,
    link_rows: dict[tuple[int, int], int],
    n_lanes: int,
    factor: Fraction,
    n_bins: int = N_BINS,
    showlegend: bool = True,
) -> list[go.Image | go.Scatter]:
    """The binned timeline as one image trace (lane ``i`` covers ``y`` in
    ``[i - 0.5, i + 0.3]``, then a white gap), plus one empty legend-only trace per kind
    present (an image has no legend of its own)."""
    colors, present = _colors(simulation, link_rows, n_lanes, n_bins)
    white: list[RGB] = [(255, 255, 255)] * n_bins
    pixels = []
    for row in colors:
        pixels += [row] * (_PX_PER_LANE - 1) + [white]
    width = Fraction(simulation.trace.makespan or 1) * factor / n_bins
    image = go.Image(
        source="data:image/png;base64," + base64.b64encode(png_bytes(pixels)).decode("ascii"),
        x0=float(width / 2),
        dx=float(width),
        y0=-0.5 + 0.5 / _PX_PER_LANE,
        dy=1 / _PX_PER_LANE,
        hoverinfo="x",
        name="binned timeline",
        meta={"pipesim": "binned", "n_bins": n_bins},
    )
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
        for k in sorted(present)
    ]
    return [image, *legend]
