"""The timeline of several training iterations: every step's work as
:func:`~pipesim.plot.timeline.timeline_figure` draws one step, each rank's optimizer step
as a bar of its own, and the time it waited for the synchronization as a lighter one
(:mod:`pipesim.iterations`).

>>> from pipesim.costs import CostModel
>>> from pipesim.iterations import simulate_iterations
>>> from pipesim.schedules import generate
>>> run = simulate_iterations(generate("1f1b", n_ranks=2, n_microbatches=2),
...                           costs=CostModel.uniform(optimizer=1), steps=2)
>>> fig = iterations_figure(run)
>>> [len(t.x) for t in fig.data if t.legendgroup in ("optimizer", "sync")]
[4, 2]
"""

from __future__ import annotations

from fractions import Fraction

import plotly.graph_objects as go

from pipesim.iterations import Iterations, OptimizerRecord
from pipesim.plot.memory import scaled
from pipesim.plot.timeline import time_scale, timeline_figure

__all__ = ["iterations_figure"]

_OPTIMIZER_COLOR = "#4d4d4d"
_SYNC_COLOR = "#c7c7c7"


def iterations_figure(
    iterations: Iterations, /, *, memory: bool = True, title: str | None = None
) -> go.Figure:
    """K iterations on one time axis, the optimizer steps and their waits drawn."""
    sim = iterations.simulation
    period, ratio = iterations.period, iterations.period_bubble_ratio()
    heading = title or (
        f"{iterations.schedule.name}: {iterations.steps} iterations, optimizer sync "
        f"{iterations.sync}; "
        + (
            "no steady-state period (it did not repeat)"
            if period is None or ratio is None
            else f"steady-state period {scaled(period.period, Fraction(1))} "
            f"{sim.costs.time_unit} (bubble {float(ratio):.1%})"
        )
    )
    fig = timeline_figure(sim, memory=memory, title=heading)
    factor, _ = time_scale([sim])
    steps = list(iterations.optimizer)
    waits = [o for o in steps if o.start > o.ready]
    fig.add_trace(_bars(steps, factor, kind="optimizer"), row=1, col=1)
    if waits:
        fig.add_trace(_bars(waits, factor, kind="sync"), row=1, col=1)
    fig.update_xaxes(range=[0, scaled(iterations.makespan, factor)])
    return fig


def _bars(records: list[OptimizerRecord], factor: Fraction, *, kind: str) -> go.Bar:
    """The optimizer steps (``optimizer``) or the waits before them (``sync``)."""
    starts = [r.start if kind == "optimizer" else r.ready for r in records]
    ends = [r.end if kind == "optimizer" else r.start for r in records]
    name = "optimizer step" if kind == "optimizer" else "waiting for the optimizer sync"
    return go.Bar(
        orientation="h",
        y=[f"rank {r.rank}" for r in records],
        base=[scaled(s, factor) for s in starts],
        x=[scaled(e - s, factor) for s, e in zip(starts, ends, strict=True)],
        width=0.8 if kind == "optimizer" else 0.4,
        name=name,
        legendgroup=kind,
        marker={"color": _OPTIMIZER_COLOR if kind == "optimizer" else _SYNC_COLOR},
        text=[f"opt {r.iteration}" if kind == "optimizer" else "" for r in records],
        textposition="inside",
        customdata=[r.iteration for r in records],
        hovertemplate=f"{name} after iteration %{{customdata}}<extra></extra>",
    )
