"""``looped-bfs``: breadth-first looped pipeline (Lamy-Poirier, "Breadth-First
Pipeline Parallelism", MLSys 2023; torch's ``ScheduleLoopedBFS``).

Each of the ``p`` ranks holds ``v`` stages on the looped placement of
``interleaved-1f1b`` (stage ``c * p + r`` on rank ``r``). Where interleaved
1F1B goes depth first (a micro-batch moves on to the next chunk as soon as
it can), looped BFS goes breadth first: a rank runs the forward of *every*
micro-batch on its first chunk, then on its second, and so on; then the
backwards chunk by chunk from the last, each chunk's micro-batches from the
last to the first (torch's order: the most recent activations are consumed
first). It is GPipe on a looped placement: every rank holds all ``m * v``
chunk activations at its peak. With uniform stages (F and B per chunk) the
makespan is ``(v m + p - 1)(F + B)`` when ``m >= p``: the fill and drain happen
once, not once per loop. With ``m < p`` a rank runs out of work before
micro-batch 0 comes back round for its next chunk, and the makespan is
``(v p + m - 1)(F + B)``.

Rules: ranks >= 1, micro-batches >= 1, any ``virtual >= 1`` (default 2),
training only.
"""

from __future__ import annotations

from pipesim.actions import Action, Op, trusted_actions
from pipesim.schedule import Schedule
from pipesim.schedules._common import check_count, refuse_forward_only

__all__ = ["looped_bfs"]


def looped_bfs(
    *, n_ranks: int, n_microbatches: int, virtual: int = 2, forward_only: bool = False
) -> Schedule:
    """Breadth-first looped schedule.

    >>> s = looped_bfs(n_ranks=2, n_microbatches=2, virtual=2)
    >>> [str(a) for a in s.orders[0]]
    ['0F0', '0F1', '2F0', '2F1', '2B1', '2B0', '0B1', '0B0']
    """
    p = check_count("n_ranks", n_ranks)
    m = check_count("n_microbatches", n_microbatches)
    v = check_count("virtual", virtual)
    refuse_forward_only("looped-bfs", forward_only)
    orders: list[list[Action]] = []
    for rank in range(p):
        stages = [chunk * p + rank for chunk in range(v)]
        order = [a for s in stages for a in trusted_actions(s, Op.F, range(m))]
        last_first = range(m - 1, -1, -1)
        order += [a for s in reversed(stages) for a in trusted_actions(s, Op.B, last_first)]
        orders.append(order)
    placement = tuple(stage % p for stage in range(p * v))
    return Schedule.from_orders(orders, placement=placement, n_microbatches=m, name="looped-bfs")
