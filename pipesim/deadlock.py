"""The one error for a step that cannot finish: its wait cycle, and where ranks stopped.

>>> from pipesim.actions import parse_action
>>> from pipesim.schedule import Schedule
>>> from pipesim.structure import step_structure
>>> stuck = Schedule.from_orders([[parse_action("0B0"), parse_action("0F0")]],
...                              placement=(0,), n_microbatches=1)
>>> deadlock_error(step_structure(stuck)).cycle  # each waits for the next: order, data
('0B0', '0F0')
"""

from __future__ import annotations

from collections.abc import Sequence

import networkx as nx

from pipesim.errors import DeadlockError
from pipesim.structure import StepStructure

__all__ = ["deadlock_error", "find_cycle"]


def find_cycle(structure: StepStructure, /) -> tuple[str, ...]:
    """One wait cycle as action strings, each a prerequisite of the next (empty if none).

    Kahn's algorithm leaves exactly the nodes on or behind a cycle; networkx's
    ``find_cycle`` names one cycle among them.
    """
    succ = structure.successors()
    indegree = [0] * structure.n_nodes
    for targets in succ:
        for t in targets:
            indegree[t] += 1
    ready = [n for n, d in enumerate(indegree) if d == 0]
    while ready:
        node = ready.pop()
        for t in succ[node]:
            indegree[t] -= 1
            if indegree[t] == 0:
                ready.append(t)
    left = {n for n, d in enumerate(indegree) if d > 0}
    if not left:
        return ()
    sub = nx.DiGraph()
    for node in left:
        sub.add_edges_from((node, t) for t in succ[node] if t in left)
    return tuple(str(structure.works[u]) for u, _ in nx.find_cycle(sub))


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
