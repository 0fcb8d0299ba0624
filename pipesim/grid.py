"""The pipeline chapter's step-by-rank table: which micro-batch each rank works on
in each cycle, ``-`` when idle.

A cycle is the shortest action's duration; every action must last a whole
number of cycles (unit costs are the usual case), and a longer action fills
several cells.

>>> from pipesim.engine import simulate
>>> from pipesim.schedules import generate
>>> print(format_grid(simulate(generate("gpipe", n_ranks=2, n_microbatches=4,
...                                     forward_only=True))))
cycle  rank 0  rank 1
    0       0       -
    1       1       0
    2       2       1
    3       3       2
    4       -       3
"""

from __future__ import annotations

from fractions import Fraction

from pipesim.actions import Action
from pipesim.engine import Simulation
from pipesim.errors import PipesimError
from pipesim.text_table import format_table

__all__ = ["format_grid", "grid_cells"]


def grid_cells(simulation: Simulation, /) -> list[list[str]]:
    """``cells[cycle][rank]``: the label of the work running, or ``-``."""
    trace, schedule = simulation.trace, simulation.schedule
    durations = {r.end - r.start for r in trace.actions if r.end > r.start}
    if not durations:
        return []
    cycle = min(durations)
    starts = {r.start for r in trace.actions}
    bad = sorted(
        {Fraction(x) / cycle for x in durations | starts | {trace.makespan}}
        - {Fraction(int(Fraction(x) / cycle)) for x in durations | starts | {trace.makespan}}
    )
    if bad:
        raise PipesimError(
            f"--grid needs every action to start and last a whole number of cycles of "
            f"{cycle} (the shortest action); use unit costs or drop --grid"
        )
    n_cycles = int(Fraction(trace.makespan) / cycle)
    cells = [["-"] * trace.n_ranks for _ in range(n_cycles)]
    one_stage_per_rank = schedule.n_stages == schedule.n_ranks
    for record in trace.actions:
        first = int(Fraction(record.start) / cycle)
        last = int(Fraction(record.end) / cycle)
        label = _label(record.work, one_stage_per_rank, schedule.forward_only)
        for c in range(first, last):
            cells[c][record.rank] = label
    return cells


def _label(work: object, one_stage_per_rank: bool, forward_only: bool) -> str:
    if isinstance(work, Action) and one_stage_per_rank:
        return str(work.microbatch) if forward_only else f"{work.op.value}{work.microbatch}"
    return str(work)


def format_grid(simulation: Simulation, /) -> str:
    """The table as text, one row per cycle, one column per rank."""
    cells = grid_cells(simulation)
    n_ranks = simulation.trace.n_ranks
    headers = ["cycle"] + [f"rank {r}" for r in range(n_ranks)]
    rows = [[str(c), *row] for c, row in enumerate(cells)]
    return format_table(headers, rows)
