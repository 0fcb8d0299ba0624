"""The one error for a step that cannot finish: its wait cycle, and where ranks stopped.

>>> from pipesim.actions import parse_action
>>> from pipesim.schedule import Schedule
>>> from pipesim.step.structure import step_structure
>>> stuck = Schedule.from_orders([[parse_action("0B0"), parse_action("0F0")]],
...                              placement=(0,), n_microbatches=1)
>>> deadlock_error(step_structure(stuck)).cycle  # each waits for the next: order, data
('0B0', '0F0')
"""

from __future__ import annotations

from collections.abc import Sequence

import networkx as nx

from pipesim.errors import DeadlockError
from pipesim.step.structure import StepStructure

__all__ = ["deadlock_error", "find_cycle"]


def find_cycle(structure: StepStructure, /) -> tuple[str, ...]:
    """One wait cycle as action strings, each a prerequisite of the next (empty if none).

    networkx's ``find_cycle`` over the step's dependency edges.
    """
    graph = nx.DiGraph()
    graph.add_edges_from(
        (node, t) for node, targets in enumerate(structure.successors()) for t in targets
    )
    try:
        cycle = nx.find_cycle(graph)
    except nx.NetworkXNoCycle:
        return ()
    return tuple(str(structure.works[u]) for u, _ in cycle)


def deadlock_error(structure: StepStructure, /, *, blocked: Sequence[int] = ()) -> DeadlockError:
    """The one error for a step that cannot finish: the wait cycle, and where ranks
    stopped when an engine ran into it (``blocked``: the node each stuck rank waits at).
    """
    cycle = find_cycle(structure)
    detail = " -> ".join((*cycle, cycle[0])) if cycle else "no cycle found"
    stuck = ""
    if blocked:
        stuck_ranks = [structure.rank_of_node(n) for n in blocked]
        stuck = f"; ranks {stuck_ranks} blocked at {[str(structure.step(n)) for n in blocked]}"
    return DeadlockError(
        f"schedule deadlocks: these actions wait on each other in a cycle: {detail}{stuck}; "
        "reorder the ranks so that each action runs after what it needs",
        cycle=cycle,
    )
