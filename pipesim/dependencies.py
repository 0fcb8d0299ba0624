"""A schedule's units of work as integer nodes, and the edges between them.

This is the one place the dependency rules live; :mod:`pipesim.graph` turns the
edges into a networkx graph for users and algorithms, and :mod:`pipesim.engine`
wires SimPy events from them. Working on integer node ids keeps both fast
for schedules of a hundred thousand actions.

Data rules (torch.distributed.pipelining's stage semantics):

- F of stage s needs F of stage s-1 (same micro-batch);
- B or I of stage s needs F of stage s (its saved activations) and, below the
  last stage, the input gradient of stage s+1 (its B or I);
- W of stage s needs I of stage s.

With ``Schedule.n_copies > 1`` "stage s-1" and "stage s+1" stay inside one
model copy: a copy's first stage reads the input and its last computes the loss.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

from pipesim.actions import Action, Op, Work
from pipesim.schedule import Schedule

__all__ = ["DependencyIndex", "index_schedule"]

_GRAD_OPS = (Op.B, Op.I)


@dataclass(slots=True)
class DependencyIndex:
    """Integer view of a schedule. Node ``n`` is ``works[n]``, run on ``ranks[n]``."""

    works: list[Work]
    ranks: list[int]
    positions: list[int]
    """Position of each node in its rank's order."""
    orders: list[list[int]]
    """Per rank, its node ids in order."""
    node_of: dict[tuple[int, Op, int], int]
    """``(stage, op, microbatch)`` -> node holding that action (first one if duplicated)."""
    action_of: dict[tuple[int, Op, int], Action]
    """``(stage, op, microbatch)`` -> the Action object."""
    data_edges: list[tuple[int, int, Action, Action]]
    """``(producer node, consumer node, producer action, consumer action)``."""
    extra_edges: list[tuple[int, int]]
    """``happens_before`` constraints between nodes (unknown actions are skipped)."""

    @property
    def n_nodes(self) -> int:
        """Number of units of work."""
        return len(self.works)

    def successors(self) -> list[list[int]]:
        """Adjacency lists over order, data and extra edges (may repeat an edge)."""
        succ: list[list[int]] = [[] for _ in self.works]
        for order in self.orders:
            for a, b in itertools.pairwise(order):
                succ[a].append(b)
        for producer, consumer, _, _ in self.data_edges:
            if producer != consumer:
                succ[producer].append(consumer)
        for a, b in self.extra_edges:
            succ[a].append(b)
        return succ


def index_schedule(schedule: Schedule, /) -> DependencyIndex:
    """Number the schedule's work and derive every dependency edge."""
    works: list[Work] = []
    ranks: list[int] = []
    positions: list[int] = []
    orders: list[list[int]] = []
    node_of: dict[tuple[int, Op, int], int] = {}
    action_of: dict[tuple[int, Op, int], Action] = {}
    for rank, order in enumerate(schedule.orders):
        ids = []
        for position, work in enumerate(order):
            node = len(works)
            works.append(work)
            ranks.append(rank)
            positions.append(position)
            ids.append(node)
            for action in work.parts:
                key = (action.stage, action.op, action.microbatch)
                if key not in node_of:
                    node_of[key] = node
                    action_of[key] = action
        orders.append(ids)

    # Stage s feeds s + 1 within one model copy (DualPipe keeps two; Schedule.n_copies).
    per_copy = schedule.n_stages // schedule.n_copies
    data_edges: list[tuple[int, int, Action, Action]] = []
    get = node_of.get
    for key, node in node_of.items():
        stage, op, mb = key
        if op is Op.F:
            if stage % per_copy:
                _link(data_edges, node_of, action_of, (stage - 1, Op.F, mb), key, node)
        elif op is Op.W:
            _link(data_edges, node_of, action_of, (stage, Op.I, mb), key, node)
        else:
            _link(data_edges, node_of, action_of, (stage, Op.F, mb), key, node)
            if (stage + 1) % per_copy:
                for grad_op in _GRAD_OPS:
                    grad = (stage + 1, grad_op, mb)
                    if get(grad) is not None:
                        _link(data_edges, node_of, action_of, grad, key, node)
    extra_edges = []
    for a, b in schedule.happens_before:
        ka, kb = (a.stage, a.op, a.microbatch), (b.stage, b.op, b.microbatch)
        if ka in node_of and kb in node_of:
            extra_edges.append((node_of[ka], node_of[kb]))
    return DependencyIndex(
        works=works,
        ranks=ranks,
        positions=positions,
        orders=orders,
        node_of=node_of,
        action_of=action_of,
        data_edges=data_edges,
        extra_edges=extra_edges,
    )


def _link(
    edges: list[tuple[int, int, Action, Action]],
    node_of: dict[tuple[int, Op, int], int],
    action_of: dict[tuple[int, Op, int], Action],
    producer: tuple[int, Op, int],
    consumer: tuple[int, Op, int],
    consumer_node: int,
) -> None:
    node = node_of.get(producer)
    if node is not None:
        edges.append((node, consumer_node, action_of[producer], action_of[consumer]))
