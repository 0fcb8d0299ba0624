"""What every view (plot, Perfetto export) draws: a Trace with its schedule and costs.

Views read a :class:`~pipesim.trace.Trace` and the :class:`~pipesim.schedule.Schedule`
it ran, nothing else of the engine, so a *measured* trace (``pipesim verify
--trace-out``, read with :func:`pipesim.trace_io.load_trace`) is drawn exactly like a
simulated one. :func:`step_of` accepts either a :class:`~pipesim.engine.Simulation`
(returned as it is) or a Trace plus its schedule, and fills in the metrics.

>>> from pipesim.engine import simulate
>>> from pipesim.schedules import generate
>>> sim = simulate(generate("1f1b", n_ranks=2, n_microbatches=2))
>>> step_of(sim.trace, schedule=sim.schedule).metrics == sim.metrics
True
"""

from __future__ import annotations

from typing import TypeAlias

from pipesim.costs import CostModel
from pipesim.engine import Simulation
from pipesim.errors import PipesimError
from pipesim.metrics import compute_metrics
from pipesim.schedule import Schedule
from pipesim.trace import Trace

__all__ = ["Viewable", "step_of"]

#: What a view takes: a simulation, or a (simulated or measured) trace.
Viewable: TypeAlias = Simulation | Trace


def step_of(
    step: Viewable, /, *, schedule: Schedule | None = None, costs: CostModel | None = None
) -> Simulation:
    """``step`` as a Simulation: itself, or a Trace with ``schedule`` (required) and
    ``costs`` (default: unit costs; it gives the time unit, the slot and the capacity)
    and metrics computed from the trace."""
    if isinstance(step, Simulation):
        return step
    if not isinstance(step, Trace):
        raise PipesimError(f"expected a Simulation or a Trace, got {type(step).__name__}")
    if schedule is None:
        raise PipesimError("a Trace is drawn with the schedule it ran: pass schedule=...")
    if schedule.n_ranks != step.n_ranks:
        raise PipesimError(
            f"the trace has {step.n_ranks} ranks but schedule {schedule.name!r} has "
            f"{schedule.n_ranks}; pass the schedule the trace ran"
        )
    costs = (costs or CostModel()).for_stages(schedule.n_stages)
    return Simulation(
        schedule=schedule,
        costs=costs,
        trace=step,
        metrics=compute_metrics(step, schedule=schedule, costs=costs),
    )
