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

import html as html_escape
import re
from pathlib import Path

import plotly.graph_objects as go
import plotly.io as pio

from pipesim.files import write_text

__all__ = ["DIV_ID", "to_html", "write_html"]

#: The fixed id of the plot's <div> (plotly would pick a random one).
DIV_ID = "pipesim-figure"

_CONFIG = {"displaylogo": False, "responsive": True, "scrollZoom": False}


def page_title(fig: go.Figure, /) -> str:
    """The page's ``<title>``: the first line of the figure's title, tags dropped.

    >>> page_title(go.Figure(layout={"title": {"text": "1f1b: 4 ranks<br><sup>x</sup>"}}))
    '1f1b: 4 ranks'
    """
    text = fig.layout.title.text or "pipesim"
    first = re.split(r"<br\s*/?>", str(text), maxsplit=1)[0]
    return re.sub(r"<[^>]+>", "", first).strip() or "pipesim"


def to_html(fig: go.Figure, /, *, cdn: bool = False, div_id: str = DIV_ID) -> str:
    """A complete HTML page showing ``fig``; plotly.js embedded unless ``cdn``.

    The page has a ``<title>`` (:func:`page_title`), so a browser tab or a list of
    files says which plot it is.
    """
    html: str = pio.to_html(
        fig,
        config=_CONFIG,
        include_plotlyjs="cdn" if cdn else True,
        full_html=True,
        div_id=div_id,
        validate=True,
    )
    title = f"<title>{html_escape.escape(page_title(fig))} · pipesim</title>"
    return html.replace("<head>", f"<head>\n    {title}", 1)


def write_html(fig: go.Figure, path: str | Path, /, *, cdn: bool = False) -> Path:
    """Write ``fig`` as standalone HTML to ``path``; return the path.

    An unwritable path is a PipesimError naming the path and the reason.
    """
    return write_text(path, to_html(fig, cdn=cdn))
