"""What a sweep would simulate, counted before it starts: a sweep past
:data:`~pipesim.limits.MAX_SWEEP_ACTIONS` is refused up front instead of running
until its deadline.

A configuration's simulation time grows with its simple actions, at least p v m x 2
(:func:`pipesim.schedules.registry.least_actions`); the micro-batches m = global batch /
(data parallel x micro-batch size) make them large: 8 devices and a global batch of
10^6 sequences is 1520 configurations of up to 6.4 x 10^7 actions each.

>>> from pipesim.plan.point import Point
>>> point = Point(schedule="1f1b", pipeline=4, virtual=1, microbatch_size=1,
...               n_microbatches=8, data_parallel=1)
>>> sweep_actions([point, point])
128
"""

from __future__ import annotations

from collections.abc import Sequence

from pipesim.errors import LimitError
from pipesim.limits import MAX_ACTIONS, MAX_SWEEP_ACTIONS
from pipesim.plan.cost_aware import get_cost_aware
from pipesim.plan.point import Point
from pipesim.schedules.registry import get_spec, least_actions

__all__ = ["check_sweep", "sweep_actions"]


def sweep_actions(points: Sequence[Point], /) -> int:
    """How many simple actions simulating ``points`` takes: p v m x 2 each (exact for F +
    B schedules, fewer than I + W ones have). A point above MAX_ACTIONS counts 0 (its
    generator refuses it unsimulated); one its schedule's rules refuse still counts, so a
    sweep of many such points counts high."""
    return sum(_simulated_actions(point) for point in points)


def check_sweep(points: Sequence[Point], /, *, devices: int, global_batch: int) -> None:
    """Refuse a sweep of more than MAX_SWEEP_ACTIONS simple actions, naming the numbers
    and what to narrow."""
    total = sweep_actions(points)
    if total <= MAX_SWEEP_ACTIONS:
        return
    largest = max(points, key=_simulated_actions)
    raise LimitError(
        f"the sweep of {devices} devices with global batch {global_batch} would simulate "
        f"{total:.3g} actions in {len(points)} configurations (the largest: "
        f"{largest.schedule} p={largest.pipeline} v={largest.virtual} "
        f"m={largest.n_microbatches}, {_least_actions(largest):.3g} actions), above "
        f"pipesim's limit of {MAX_SWEEP_ACTIONS:.3g} (MAX_SWEEP_ACTIONS in pipesim.limits, "
        "about half an hour of CPU); the micro-batches per configuration make it: lower "
        "--global-batch or raise --microbatch-sizes, or narrow the sweep with --stages, "
        "--schedules, --virtual or --tensor-parallel"
    )


def _simulated_actions(point: Point) -> int:
    actions = _least_actions(point)
    return actions if actions <= MAX_ACTIONS else 0


def _least_actions(point: Point) -> int:
    # A schedule built from the costs (pipesim.plan.cost_aware) runs one model copy.
    copies = 1 if get_cost_aware(point.schedule) else get_spec(point.schedule).n_copies
    return least_actions(
        n_ranks=point.pipeline,
        virtual=point.virtual,
        n_microbatches=point.n_microbatches,
        n_copies=copies,
    )
