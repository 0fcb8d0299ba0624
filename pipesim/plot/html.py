"""Writing figures as standalone HTML: offline by default, deterministic always.

``plotly.io.to_html`` names the plot's ``<div>`` with a random UUID unless told
otherwise; pipesim fixes it, so the same figure always gives the same bytes
(handy for diffs, caches and tests). By default plotly.js (about 4.6 MB) is
embedded, so the file opens with no network; ``cdn=True`` links
``cdn.plot.ly`` instead and the file shrinks to the figure's data.

>>> from pipesim.engine import simulate
>>> from pipesim.plot.timeline import timeline_figure
>>> from pipesim.schedules import generate
>>> fig = timeline_figure(simulate(generate("gpipe", n_ranks=2, n_microbatches=2)))
>>> to_html(fig, cdn=True) == to_html(fig, cdn=True)
True
"""

from __future__ import annotations

from pathlib import Path

import plotly.graph_objects as go
import plotly.io as pio

from pipesim.files import write_text

__all__ = ["DIV_ID", "to_html", "write_html"]

#: The fixed id of the plot's <div> (plotly would pick a random one).
DIV_ID = "pipesim-figure"

_CONFIG = {"displaylogo": False, "responsive": True, "scrollZoom": False}


def to_html(fig: go.Figure, /, *, cdn: bool = False, div_id: str = DIV_ID) -> str:
    """A complete HTML page showing ``fig``; plotly.js embedded unless ``cdn``."""
    html: str = pio.to_html(
        fig,
        config=_CONFIG,
        include_plotlyjs="cdn" if cdn else True,
        full_html=True,
        div_id=div_id,
        validate=True,
    )
    return html


def write_html(fig: go.Figure, path: str | Path, /, *, cdn: bool = False) -> Path:
    """Write ``fig`` as standalone HTML to ``path``; return the path.

    An unwritable path is a PipesimError naming the path and the reason.
    """
    return write_text(path, to_html(fig, cdn=cdn))
