"""The planner's steady-state iteration period under an optimizer synchronization.

The sweep (:mod:`pipesim.plan.evaluation`) prices an iteration as the pipeline's makespan,
then the exposed data-parallel traffic and the optimizer step of the rank with the
most: the period under a ``global`` synchronization (Megatron-LM's: every rank waits
for the gradient-norm all-reduce), exactly where every rank's share is the largest's.
Under ``post-validation`` (the zero-bubble runtime's) or ``none`` the first ranks start
the next step while the last still drain, so the period is shorter; it needs the
engine's iterations (:mod:`pipesim.iterations`) on the configuration's compiled step.

:func:`period_ns` runs them with each rank's optimizer step (its first stage's
``optimizer`` time) the largest rank's exposed traffic and optimizer step, the figure
the sweep keeps: exact where the ranks' shares are equal (uniform stages), an upper
bound (a rank never waits less for a longer step of its own) where they differ.
"""

from __future__ import annotations

from dataclasses import replace
from fractions import Fraction

from pipesim.iterations import steady_period
from pipesim.plan.evaluation import build_configuration
from pipesim.plan.point import Point, SweepContext

__all__ = ["period_ns"]


def period_ns(context: SweepContext, point: Point, /, *, after_ns: int, sync: str) -> int:
    """The steady-state period of ``point`` under ``sync``, in nanoseconds (rounded to a
    whole one), every rank's optimizer step lasting ``after_ns``."""
    schedule, costs = build_configuration(context, point)
    first_stage = {rank: schedule.placement.index(rank) for rank in range(schedule.n_ranks)}
    firsts = set(first_stage.values())
    stages = tuple(
        replace(cost, optimizer=after_ns if stage in firsts else 0)
        for stage, cost in enumerate(costs.stages)
    )
    found = steady_period(schedule, costs=replace(costs, stages=stages), sync=sync, check=False)
    return round(Fraction(found.period))
