"""Plotly figures of simulated steps: timelines, memory curves, comparisons.

Every function returns a ``plotly.graph_objects.Figure`` (show it in a
notebook, or save it with :func:`write_html`); ``pipesim plot`` only writes
them.

- :func:`timeline_figure`: one row per rank (and a lane per link that carries
  time), a bar per unit of work coloured by op and labelled with its
  micro-batch, idle gaps in grey, memory per rank below, and a title with
  makespan, bubble ratio, idle slots and peak memory.
- :func:`compare_figure`: several steps stacked on one shared time axis.
- :func:`memory_figure`: the memory curves alone.
- :func:`overlay_figure`: a measured step under its prediction, rank by rank,
  with the error per kind of action (:func:`kind_errors`).
- :func:`write_html` / :func:`to_html`: standalone, deterministic HTML;
  :func:`write_image`: PNG, SVG or PDF through kaleido.

Every figure reads a Trace and its schedule (a Simulation has both; a measured
Trace is passed with ``schedule=``), see :mod:`pipesim.views`. Times are drawn
in the cost model's unit, bytes in binary units (:mod:`pipesim.units`).

The modules: :mod:`~pipesim.plot.timeline` (the timeline), :mod:`~pipesim.plot.memory`
(memory curves), :mod:`~pipesim.plot.binned` (large timelines as binned pictures),
:mod:`~pipesim.plot.iterations` (several training iterations),
:mod:`~pipesim.plot.overlay` (measured under predicted), :mod:`~pipesim.plot.comms`
(a comms schedule's sends and receives), :mod:`~pipesim.plot.style`
(colours, names, number formats), :mod:`~pipesim.plot.html` and
:mod:`~pipesim.plot.image` (writing HTML and images).

>>> from pipesim import generate, simulate
>>> from pipesim.plot import timeline_figure
>>> sim = simulate(generate("1f1b", n_ranks=4, n_microbatches=8))
>>> fig = timeline_figure(sim)
>>> sum(len(t.x) for t in fig.data if t.legendgroup in ("F", "B"))  # 2 actions per mb-stage
64
"""

from __future__ import annotations

from pipesim.plot.html import DIV_ID, to_html, write_html
from pipesim.plot.image import write_image
from pipesim.plot.memory import memory_figure, memory_steps, memory_traces
from pipesim.plot.overlay import kind_errors, overlay_figure
from pipesim.plot.style import BAR_KINDS, OP_COLORS, OP_NAMES
from pipesim.plot.timeline import bar_traces, compare_figure, lane_labels, timeline_figure

__all__ = [
    "BAR_KINDS",
    "DIV_ID",
    "OP_COLORS",
    "OP_NAMES",
    "bar_traces",
    "compare_figure",
    "kind_errors",
    "lane_labels",
    "memory_figure",
    "memory_steps",
    "memory_traces",
    "overlay_figure",
    "timeline_figure",
    "to_html",
    "write_html",
    "write_image",
]
