"""Predicted against measured: one step drawn twice, rank by rank, with the error per kind.

``pipesim verify --trace-out FILE`` writes the measured step as a pipesim
trace (:mod:`pipesim.trace_io`); :func:`overlay_figure` draws the prediction
and the measurement of each rank on neighbouring rows (``rank 0 predicted``,
``rank 0 measured``, ...) on one time axis, measured bars hatched, and titles
the figure with the makespan error and the mean-duration error of each kind of
action (:func:`kind_errors`). Both steps are read as Traces with their
schedule (:mod:`pipesim.views`), so any two traces of one schedule compare.

Errors are ``(predicted - measured) / measured``, as ``pipesim verify``
reports its makespan error: positive when pipesim predicts too long.

>>> from pipesim.costs import CostModel
>>> from pipesim.engine import simulate
>>> from pipesim.schedules import generate
>>> s = generate("1f1b", n_ranks=2, n_microbatches=2)
>>> slow = simulate(s, costs=CostModel.uniform(forward="5/4", backward=2))
>>> errors = kind_errors(simulate(s), slow)
>>> errors.percent["F"], errors.percent["B"]
(-20.0, 0.0)
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from fractions import Fraction

import plotly.graph_objects as go

from pipesim.engine import Simulation
from pipesim.errors import PipesimError
from pipesim.exact import whole_or_fraction
from pipesim.metrics import error_percent
from pipesim.plot.memory import scaled
from pipesim.plot.style import BAR_KINDS, headline, kind_of
from pipesim.plot.timeline import bar_traces, time_scale
from pipesim.units import format_duration, time_axis_title
from pipesim.views import Viewable, step_of

__all__ = ["KindErrors", "kind_errors", "overlay_figure"]

_ROW_PX = 22


@dataclass(frozen=True, slots=True, kw_only=True)
class KindErrors:
    """Mean durations per kind of action, predicted and measured, and the errors."""

    predicted: dict[str, Fraction]
    """Mean predicted duration per kind (F, B, I, W, overlap) present in both steps."""
    measured: dict[str, Fraction]
    """Mean measured duration per kind."""
    percent: dict[str, float]
    """``(predicted - measured) / measured * 100`` per kind (0 where both are 0)."""
    makespan_percent: float
    """The same for the makespans."""
    time_unit: str

    def lines(self) -> list[str]:
        """One line per kind, then the makespan, for the terminal."""
        out = []
        for kind, error in self.percent.items():
            out.append(
                f"{kind}: predicted {self._duration(self.predicted[kind])}"
                f", measured {self._duration(self.measured[kind])}"
                f" ({error:+.1f}%)"
            )
        out.append(f"makespan error {self.makespan_percent:+.1f}%")
        return out

    def _duration(self, value: Fraction) -> str:
        return format_duration(whole_or_fraction(value), self.time_unit)


def _means(sim: Simulation) -> dict[str, Fraction]:
    total: dict[str, Fraction] = defaultdict(Fraction)
    count: dict[str, int] = defaultdict(int)
    for record in sim.trace.actions:
        kind = kind_of(record.work)
        total[kind] += Fraction(record.duration)
        count[kind] += 1
    return {kind: total[kind] / count[kind] for kind in BAR_KINDS if count.get(kind)}


def kind_errors(predicted: Viewable, measured: Viewable) -> KindErrors:
    """Mean duration per kind of action in both steps and the relative errors."""
    pred, meas = step_of(predicted), step_of(measured)
    if pred.costs.time_unit != meas.costs.time_unit:
        raise PipesimError(
            f"the prediction is in {pred.costs.time_unit} but the measurement in "
            f"{meas.costs.time_unit}; predict with the measured cost file (its time unit)"
        )
    p_means, m_means = _means(pred), _means(meas)
    kinds = [k for k in BAR_KINDS if k in p_means and k in m_means]
    return KindErrors(
        predicted={k: p_means[k] for k in kinds},
        measured={k: m_means[k] for k in kinds},
        percent={k: error_percent(p_means[k], m_means[k]) for k in kinds},
        makespan_percent=error_percent(pred.trace.makespan, meas.trace.makespan),
        time_unit=pred.costs.time_unit,
    )


def overlay_figure(
    predicted: Viewable, measured: Viewable, /, *, title: str | None = None
) -> go.Figure:
    """Prediction and measurement of one schedule, a pair of rows per rank.

    >>> from pipesim.engine import simulate
    >>> from pipesim.schedules import generate
    >>> sim = simulate(generate("1f1b", n_ranks=2, n_microbatches=2))
    >>> list(overlay_figure(sim, sim).layout.yaxis.ticktext)
    ['rank 0 predicted', 'rank 0 measured', 'rank 1 predicted', 'rank 1 measured']
    """
    pred, meas = step_of(predicted), step_of(measured)
    if pred.trace.n_ranks != meas.trace.n_ranks:
        raise PipesimError(
            f"the prediction has {pred.trace.n_ranks} ranks, the measurement "
            f"{meas.trace.n_ranks}: they are not the same schedule"
        )
    errors = kind_errors(pred, meas)
    factor, unit = time_scale([pred, meas])
    fig = go.Figure()
    for which, sim in (("predicted", pred), ("measured", meas)):
        for bar in bar_traces(sim, idle=False, factor=factor, time_unit=unit):
            if bar.legendgroup == "transfer":
                continue  # link lanes would need rows of their own; the ranks are the point
            bar.y = [2 * y + (which == "measured") for y in bar.y]
            bar.name = f"{which}: {bar.name}"
            bar.legendgroup = f"{which} {bar.legendgroup}"
            if which == "measured":
                bar.marker.pattern = {"shape": "/", "fgcolor": "white", "solidity": 0.3}
            fig.add_trace(bar)
    n_ranks = pred.trace.n_ranks
    labels = [f"rank {r} {w}" for r in range(n_ranks) for w in ("predicted", "measured")]
    per_kind = " · ".join(f"{k} {e:+.1f}%" for k, e in errors.percent.items())
    subtitle = (
        f"predicted: {headline(pred.metrics)}<br>measured makespan "
        f"{format_duration(meas.trace.makespan, meas.costs.time_unit)}"
        f" · error (predicted - measured) / measured: makespan {errors.makespan_percent:+.1f}%"
        f" · mean duration {per_kind}"
    )
    heading = title or f"{pred.schedule.name}: predicted and measured, rank by rank"
    longest = max(scaled(pred.trace.makespan, factor), scaled(meas.trace.makespan, factor))
    fig.update_layout(
        template="plotly_white",
        title={"text": f"{heading}<br><sup>{subtitle}</sup>", "x": 0.01, "xanchor": "left"},
        barmode="overlay",
        height=max(200, _ROW_PX * len(labels)) + 220,
        uniformtext={"minsize": 8, "mode": "hide"},
        hovermode="closest",
        legend={"x": 1.01, "xanchor": "left", "y": 1, "yanchor": "top"},
        margin={"t": 120, "l": 130, "r": 20, "b": 60},
        xaxis={
            "range": [0, longest],
            "title": {"text": time_axis_title(unit)},
            "ticks": "outside",
            "exponentformat": "none",
        },
        yaxis={
            "tickmode": "array",
            "tickvals": list(range(len(labels))),
            "ticktext": labels,
            "range": [len(labels) - 0.5, -0.5],
            "showgrid": False,
            "zeroline": False,
        },
    )
    return fig
