"""Activation memory over time, per rank: step lines under the timeline.

The engine records a rank's activation memory each time it changes (a forward
allocates when it starts, a backward frees when it ends; see
:mod:`pipesim.costs`), so the exact curve is a step function: constant between
records. It is drawn with ``line_shape="hv"`` from time 0 to the makespan.

What is drawn:

- ``bytes``: activation bytes, plus the rank's parameter bytes when the cost
  model gives any, so that the curve is comparable with the device capacity
  the same way :attr:`pipesim.metrics.Metrics.fits` compares them;
- ``inflight``: when no stage has activation bytes, the number of
  stage-micro-batch activations held, which is what the schedule alone
  decides (GPipe holds every micro-batch, 1F1B at most ``p - r``).

>>> from pipesim.engine import simulate
>>> from pipesim.schedules import generate
>>> sim = simulate(generate("gpipe", n_ranks=2, n_microbatches=3))
>>> memory_quantity(sim), memory_steps(sim, 0, quantity="inflight")
('inflight', ([0, 1, 2, 8, 10, 12, 12], [1, 2, 3, 2, 1, 0, 0]))
"""

from __future__ import annotations

from typing import Literal

import plotly.graph_objects as go
from plotly.colors import sample_colorscale

from pipesim.engine import Simulation
from pipesim.exact import Time
from pipesim.plot.style import format_bytes, to_float

__all__ = [
    "Quantity",
    "memory_axis_title",
    "memory_figure",
    "memory_quantity",
    "memory_steps",
    "memory_traces",
    "peak_rank",
    "rank_colors",
]

#: What a memory curve measures: bytes held, or stage-micro-batch activations held.
Quantity = Literal["bytes", "inflight"]


def memory_quantity(simulation: Simulation, /) -> Quantity:
    """``bytes`` when the cost model gives any memory, else ``inflight``."""
    if any(r.activation_bytes for r in simulation.trace.memory) or any(
        r.param_bytes for r in simulation.metrics.ranks
    ):
        return "bytes"
    return "inflight"


def memory_axis_title(simulation: Simulation, /, *, quantity: Quantity) -> str:
    """The y-axis title of the memory curves."""
    if quantity == "inflight":
        return "activations in flight"
    if any(r.param_bytes for r in simulation.metrics.ranks):
        return "activations + params (bytes)"
    return "activation bytes"


def memory_steps(
    simulation: Simulation, rank: int, /, *, quantity: Quantity
) -> tuple[list[Time], list[int]]:
    """The corners of ``rank``'s step curve: times from 0 to the makespan, values.

    Changes at one instant (a backward ending as the next forward starts) collapse to
    the state after the last of them, so the curve has no zero-width spikes; a rank
    records the frees of one unit of work before the allocations of the next, so no
    peak is lost.
    """
    offset = simulation.metrics.ranks[rank].param_bytes if quantity == "bytes" else 0
    times: list[Time] = [0]
    values = [offset]
    for record in simulation.trace.memory:
        if record.rank != rank:
            continue
        held = offset + (record.activation_bytes if quantity == "bytes" else record.inflight)
        if record.time == times[-1]:
            values[-1] = held
        else:
            times.append(record.time)
            values.append(held)
    times.append(simulation.trace.makespan)
    values.append(values[-1])
    return times, values


def peak_rank(simulation: Simulation, /, *, quantity: Quantity) -> int:
    """The rank whose curve reaches highest (the lowest such rank on a tie)."""
    ranks = simulation.metrics.ranks
    if quantity == "bytes":
        return max(ranks, key=lambda r: (r.peak_activation_bytes + r.param_bytes, -r.rank)).rank
    return max(ranks, key=lambda r: (r.peak_inflight, -r.rank)).rank


def rank_colors(n_ranks: int, /) -> list[str]:
    """One colour per rank, sampled evenly along Viridis (no clash with op colours)."""
    if n_ranks == 1:
        return [str(sample_colorscale("Viridis", [0.0])[0])]
    points = [0.9 * r / (n_ranks - 1) for r in range(n_ranks)]  # skip Viridis' pale yellow end
    return [str(c) for c in sample_colorscale("Viridis", points)]


def memory_traces(
    simulation: Simulation,
    /,
    *,
    quantity: Quantity,
    ranks: tuple[int, ...] | None = None,
    label: str = "",
    colors: list[str] | None = None,
    legendgroup: str = "memory",
) -> list[go.Scatter]:
    """Step-line traces of activation memory, one per rank (all ranks by default),
    plus a dashed ``capacity`` line when the cost model has a capacity and the
    curves are in bytes."""
    n_ranks = simulation.trace.n_ranks
    ranks = tuple(range(n_ranks)) if ranks is None else ranks
    colors = colors or rank_colors(n_ranks)
    unit = "bytes" if quantity == "bytes" else "in flight"
    traces = []
    for index, rank in enumerate(ranks):
        times, values = memory_steps(simulation, rank, quantity=quantity)
        name = f"{label}rank {rank} memory"
        traces.append(
            go.Scatter(
                x=[to_float(t) for t in times],
                y=values,
                mode="lines",
                line={"shape": "hv", "width": 1.5, "color": colors[index % len(colors)]},
                name=name,
                legendgroup=legendgroup,
                legendgrouptitle={"text": "memory"} if index == 0 else None,
                hovertemplate=f"{name}<br>time %{{x}}<br>%{{y}} {unit}<extra></extra>",
            )
        )
    capacity = simulation.costs.memory_capacity_bytes
    if capacity is not None and quantity == "bytes":
        traces.append(
            go.Scatter(
                x=[0, to_float(simulation.trace.makespan)],
                y=[capacity, capacity],
                mode="lines",
                line={"dash": "dash", "color": "#222222", "width": 1.5},
                name=f"{label}capacity {format_bytes(capacity)}",
                legendgroup=legendgroup,
                meta={"pipesim": "capacity"},
                hovertemplate=f"capacity {capacity} bytes<extra></extra>",
            )
        )
    return traces


def memory_figure(simulation: Simulation, /, *, quantity: Quantity | None = None) -> go.Figure:
    """A figure of the memory curves alone (the timeline figure has them too).

    >>> from pipesim.costs import CostModel
    >>> from pipesim.engine import simulate
    >>> from pipesim.schedules import generate
    >>> sim = simulate(generate("1f1b", n_ranks=4, n_microbatches=8),
    ...                costs=CostModel.uniform(activation_bytes=100))
    >>> [max(t.y) for t in memory_figure(sim).data]  # 1F1B rank r holds p - r
    [400, 300, 200, 100]
    """
    quantity = quantity or memory_quantity(simulation)
    fig = go.Figure(data=memory_traces(simulation, quantity=quantity))
    fig.update_layout(
        template="plotly_white",
        title={"text": f"{simulation.schedule.name}: activation memory per rank"},
        xaxis={"title": {"text": "time"}, "range": [0, to_float(simulation.trace.makespan)]},
        yaxis={"title": {"text": memory_axis_title(simulation, quantity=quantity)}},
        height=360,
    )
    return fig
