"""Activation memory over time, per rank: step lines under the timeline.

The engine records a rank's activation memory each time it changes (a forward
allocates when it starts, a backward frees when it ends; see
:mod:`pipesim.costs`), so the exact curve is a step function: constant between
records. It is drawn with ``line_shape="hv"`` from time 0 to the makespan.

What is drawn:

- ``bytes``: activation bytes, plus the rank's parameter bytes when the cost
  model gives any, so that the curve is comparable with the device capacity
  the same way :attr:`pipesim.metrics.Metrics.fits` compares them. The axis is
  in the binary unit that suits the largest value (B, KiB, MiB, GiB: see
  :mod:`pipesim.units`), never with an SI suffix;
- ``inflight``: when no stage has activation bytes, the number of
  stage-micro-batch activations held, which is what the schedule alone
  decides (GPipe holds every micro-batch, 1F1B at most ``p - r``);
- where a curve rises above the capacity, a thick red ``over capacity``
  segment on top of it, so the moment and the rank that do not fit show at once.

Times are drawn in the figure's time unit: ``factor`` converts the trace's
times (see :func:`pipesim.units.display_scale`).

>>> from pipesim.engine import simulate
>>> from pipesim.schedules import generate
>>> sim = simulate(generate("gpipe", n_ranks=2, n_microbatches=3))
>>> memory_quantity(sim), memory_steps(sim, 0, quantity="inflight")
('inflight', ([0, 1, 2, 8, 10, 12, 12], [1, 2, 3, 2, 1, 0, 0]))
"""

from __future__ import annotations

from dataclasses import dataclass
from fractions import Fraction
from typing import Literal

import plotly.graph_objects as go
from plotly.colors import sample_colorscale

from pipesim.engine import Simulation
from pipesim.exact import Time, as_number
from pipesim.units import binary_scale, format_bytes, time_axis_title, unit_suffix

__all__ = [
    "OVER_CAPACITY_COLOR",
    "Quantity",
    "memory_axis_title",
    "memory_curves",
    "memory_divisor",
    "memory_figure",
    "memory_quantity",
    "memory_steps",
    "memory_traces",
    "over_capacity",
    "peak_rank",
    "rank_colors",
    "sample_ranks",
    "scaled",
]

#: What a memory curve measures: bytes held, or stage-micro-batch activations held.
Quantity = Literal["bytes", "inflight"]

#: The colour of memory above the device capacity.
OVER_CAPACITY_COLOR = "#D62728"


def scaled(value: Time, factor: Fraction, /) -> int | float:
    """A time in the figure's unit: ``value * factor`` (ints stay ints).

    >>> scaled(3, Fraction(1)), scaled(1500, Fraction(1, 1000))
    (3, 1.5)
    """
    return as_number(value if factor == 1 else Fraction(value) * factor)


def memory_quantity(simulation: Simulation, /) -> Quantity:
    """``bytes`` when the cost model gives any memory, else ``inflight``."""
    if any(r.activation_bytes for r in simulation.trace.memory) or any(
        r.param_bytes for r in simulation.metrics.ranks
    ):
        return "bytes"
    return "inflight"


def memory_divisor(simulations: list[Simulation], /) -> tuple[int, str]:
    """The binary unit of a bytes axis holding ``simulations``' curves and capacities."""
    largest = 0
    for sim in simulations:
        ranks = sim.metrics.ranks
        largest = max(largest, *(r.peak_activation_bytes + r.param_bytes for r in ranks))
        largest = max(largest, sim.costs.memory_capacity_bytes or 0)
    return binary_scale(largest)


def memory_axis_title(simulation: Simulation, /, *, quantity: Quantity, unit: str = "B") -> str:
    """The y-axis title of the memory curves, with the bytes unit."""
    if quantity == "inflight":
        return "activations in flight"
    if any(r.param_bytes for r in simulation.metrics.ranks):
        return f"activations + params ({unit})"
    return f"activation memory ({unit})"


def memory_steps(
    simulation: Simulation, rank: int, /, *, quantity: Quantity
) -> tuple[list[Time], list[int]]:
    """The corners of ``rank``'s step curve: times from 0 to the makespan, values.

    Changes at one instant (a backward ending as the next forward starts) collapse to
    the state after the last of them, so the curve has no zero-width spikes; a rank
    records the frees of one unit of work before the allocations of the next, so no
    peak is lost.
    """
    return memory_curves(simulation, quantity=quantity)[rank]


def memory_curves(
    simulation: Simulation, /, *, quantity: Quantity
) -> list[tuple[list[Time], list[int]]]:
    """:func:`memory_steps` of every rank, in one pass over the trace."""
    trace = simulation.trace
    by_bytes = quantity == "bytes"
    curves: list[tuple[list[Time], list[int]]] = []
    for rank in range(trace.n_ranks):
        offset = simulation.metrics.ranks[rank].param_bytes if by_bytes else 0
        curves.append(([0], [offset]))
    for record in trace.memory:
        times, values = curves[record.rank]
        offset = simulation.metrics.ranks[record.rank].param_bytes if by_bytes else 0
        held = offset + (record.activation_bytes if by_bytes else record.inflight)
        if record.time == times[-1]:
            values[-1] = held
        else:
            times.append(record.time)
            values.append(held)
    makespan = trace.makespan
    for times, values in curves:
        times.append(makespan)
        values.append(values[-1])
    return curves


def envelope(
    times: list[Time], values: list[int], /, *, width: Fraction, n_bins: int
) -> tuple[list[Time], list[int]]:
    """A step curve reduced to ``n_bins`` bins of ``width``: the highest value in each
    bin, so that no peak is lost when a long curve is thinned out.

    >>> envelope([0, 1, 2, 3, 4], [5, 9, 1, 2, 2], width=Fraction(2), n_bins=2)
    ([0, 2, 4], [9, 2, 2])
    """
    highs = [0] * n_bins
    seen = [False] * n_bins
    for index in range(len(times) - 1):
        start, end, value = times[index], times[index + 1], values[index]
        if end <= start:
            continue
        first = min(int(Fraction(start) / width), n_bins - 1)
        last = min(int(Fraction(end) / width), n_bins - 1)
        if Fraction(end) / width == last and last > first:
            last -= 1  # a step ending exactly on a bin edge does not reach into the next
        for b in range(first, last + 1):
            highs[b] = max(highs[b], value) if seen[b] else value
            seen[b] = True
    xs: list[Time] = [b * width for b in range(n_bins)]
    xs = [x.numerator if isinstance(x, Fraction) and x.denominator == 1 else x for x in xs]
    return [*xs, times[-1]], [*highs, highs[-1]]


def over_capacity(
    times: list[Time], values: list[int], capacity: int, /
) -> list[tuple[Time, Time, int]]:
    """The ``(start, end, value)`` steps of a curve that lie above ``capacity``.

    Neighbouring steps of one value join (a backward ending as the next forward starts
    leaves the value where it was).

    >>> over_capacity([0, 1, 2, 3, 4], [50, 120, 120, 80, 80], 100)
    [(1, 3, 120)]
    """
    steps: list[tuple[Time, Time, int]] = []
    for i in range(len(times) - 1):
        if values[i] <= capacity or times[i + 1] <= times[i]:
            continue
        if steps and steps[-1][1] == times[i] and steps[-1][2] == values[i]:
            steps[-1] = (steps[-1][0], times[i + 1], values[i])
        else:
            steps.append((times[i], times[i + 1], values[i]))
    return steps


def peak_rank(simulation: Simulation, /, *, quantity: Quantity) -> int:
    """The rank whose curve reaches highest (the lowest such rank on a tie)."""
    ranks = simulation.metrics.ranks
    if quantity == "bytes":
        return max(ranks, key=lambda r: (r.peak_activation_bytes + r.param_bytes, -r.rank)).rank
    return max(ranks, key=lambda r: (r.peak_inflight, -r.rank)).rank


def sample_ranks(
    simulation: Simulation, /, *, quantity: Quantity, most: int = 8
) -> tuple[int, ...]:
    """At most ``most`` ranks to draw memory for: evenly spread, the peak rank always in.

    >>> from pipesim.engine import simulate
    >>> from pipesim.schedules import generate
    >>> sim = simulate(generate("1f1b", n_ranks=16, n_microbatches=16))
    >>> sample_ranks(sim, quantity="inflight", most=4)
    (0, 5, 10, 15)
    """
    n_ranks = simulation.trace.n_ranks
    if n_ranks <= most:
        return tuple(range(n_ranks))
    chosen = {round(i * (n_ranks - 1) / (most - 1)) for i in range(most)}
    peak = peak_rank(simulation, quantity=quantity)
    if peak not in chosen:
        chosen.discard(max(chosen - {0, n_ranks - 1}, key=lambda r: -abs(r - peak)))
        chosen.add(peak)
    return tuple(sorted(chosen))


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
    factor: Fraction = Fraction(1),
    time_unit: str | None = None,
    divisor: int = 1,
    byte_unit: str = "B",
    n_bins: int | None = None,
) -> list[go.Scatter]:
    """Step-line traces of activation memory, one per rank (all ranks by default),
    then a red ``over capacity`` trace where a curve exceeds the capacity and a dashed
    ``capacity`` line, when the cost model has a capacity and the curves are in bytes.

    ``factor`` and ``time_unit`` give the drawn time unit, ``divisor`` and
    ``byte_unit`` the drawn bytes unit; ``n_bins`` thins each curve to its
    per-bin highs (:func:`envelope`) for very long steps."""
    n_ranks = simulation.trace.n_ranks
    ranks = tuple(range(n_ranks)) if ranks is None else ranks
    colors = colors or [rank_colors(n_ranks)[r] for r in ranks]
    drawing = _Drawing(
        label=label,
        legendgroup=legendgroup,
        factor=factor,
        divisor=divisor,
        time_suffix=unit_suffix(time_unit or simulation.costs.time_unit),
        value_suffix=f" {byte_unit}" if quantity == "bytes" else " in flight",
    )
    makespan = simulation.trace.makespan
    capacity = simulation.costs.memory_capacity_bytes if quantity == "bytes" else None
    traces = []
    over: list[tuple[Time, Time, int]] = []
    curves = memory_curves(simulation, quantity=quantity)
    for index, rank in enumerate(ranks):
        times, values = curves[rank]
        if capacity is not None:
            over += over_capacity(times, values, capacity)
        if n_bins is not None and makespan:
            times, values = envelope(
                times, values, width=Fraction(makespan) / n_bins, n_bins=n_bins
            )
        color = colors[index % len(colors)]
        traces.append(_rank_trace(drawing, rank, times, values, color=color, first=index == 0))
    if capacity is not None:
        if over:
            traces.append(_over_capacity_trace(drawing, over))
        traces.append(_capacity_trace(drawing, capacity, makespan))
    return traces


@dataclass(frozen=True)
class _Drawing:
    """What every trace of one :func:`memory_traces` call shares: the name prefix, the
    legend group, and the drawn units (``factor`` for times, ``divisor`` for values)."""

    label: str
    legendgroup: str
    factor: Fraction
    divisor: int
    time_suffix: str
    value_suffix: str

    def y(self, value: int) -> int | float:
        """A value in the drawn unit (ints stay ints when nothing divides them)."""
        return value if self.divisor == 1 else value / self.divisor

    def hover(self, head: str) -> str:
        """A point's hover text: ``head``, its time and its value, with their units."""
        return (
            f"{head}<br>time %{{x}}{self.time_suffix}<br>%{{y:.4g}}{self.value_suffix}"
            "<extra></extra>"
        )


def _rank_trace(
    drawing: _Drawing,
    rank: int,
    times: list[Time],
    values: list[int],
    /,
    *,
    color: str,
    first: bool,
) -> go.Scatter:
    """The step line of one rank; the ``first`` of a legend group carries its title."""
    name = f"{drawing.label}rank {rank} memory"
    return go.Scatter(
        x=[scaled(t, drawing.factor) for t in times],
        y=[drawing.y(v) for v in values],
        mode="lines",
        line={"shape": "hv", "width": 1.5, "color": color},
        name=name,
        legendgroup=drawing.legendgroup,
        legendgrouptitle={"text": "memory"} if first else None,
        hovertemplate=drawing.hover(name),
    )


def _over_capacity_trace(drawing: _Drawing, over: list[tuple[Time, Time, int]], /) -> go.Scatter:
    """The steps above the capacity as thick red segments, broken apart by ``None``."""
    xs: list[int | float | None] = []
    ys: list[int | float | None] = []
    for start, end, value in over:
        xs += [scaled(start, drawing.factor), scaled(end, drawing.factor), None]
        ys += [drawing.y(value), drawing.y(value), None]
    return go.Scatter(
        x=xs,
        y=ys,
        mode="lines",
        line={"width": 5, "color": OVER_CAPACITY_COLOR},
        name=f"{drawing.label}over capacity",
        legendgroup=drawing.legendgroup,
        meta={"pipesim": "over capacity"},
        hovertemplate=drawing.hover("OVER CAPACITY"),
    )


def _capacity_trace(drawing: _Drawing, capacity: int, makespan: Time, /) -> go.Scatter:
    """The device capacity as a dashed line across the whole step."""
    return go.Scatter(
        x=[0, scaled(makespan, drawing.factor)],
        y=[drawing.y(capacity), drawing.y(capacity)],
        mode="lines",
        line={"dash": "dash", "color": "#222222", "width": 1.5},
        name=f"{drawing.label}capacity {format_bytes(capacity)}",
        legendgroup=drawing.legendgroup,
        meta={"pipesim": "capacity"},
        hovertemplate=f"capacity {capacity:,} bytes ({format_bytes(capacity)})<extra></extra>",
    )


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
    from pipesim.units import display_scale

    quantity = quantity or memory_quantity(simulation)
    factor, unit = display_scale(simulation.costs.time_unit, simulation.trace.makespan)
    divisor, byte_unit = memory_divisor([simulation]) if quantity == "bytes" else (1, "B")
    fig = go.Figure(
        data=memory_traces(
            simulation,
            quantity=quantity,
            factor=factor,
            time_unit=unit,
            divisor=divisor,
            byte_unit=byte_unit,
        )
    )
    fig.update_layout(
        template="plotly_white",
        title={"text": f"{simulation.schedule.name}: activation memory per rank"},
        xaxis={
            "title": {"text": time_axis_title(unit)},
            "range": [0, scaled(simulation.trace.makespan, factor)],
        },
        yaxis={
            "title": {"text": memory_axis_title(simulation, quantity=quantity, unit=byte_unit)},
            "exponentformat": "none",
        },
        height=360,
    )
    return fig
