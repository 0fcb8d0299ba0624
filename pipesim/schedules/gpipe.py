"""``gpipe``: fill-drain (Huang et al., "GPipe", NeurIPS 2019).

Every rank runs the forwards of all micro-batches, then all backwards, in
micro-batch order (as torch's ``ScheduleGPipe`` does). Uniform stages give a
makespan of ``(m + p - 1) * (F + B)`` and a bubble of ``(p - 1) / (m + p - 1)``;
every rank holds all ``m`` micro-batches' activations at its peak.
Forward-only (inference) it is the pipeline chapter's fill-drain table:
``m + p - 1`` cycles, efficiency ``m / (m + p - 1)``.

Rules: any ranks >= 1, micro-batches >= 1, one stage per rank.
"""

from __future__ import annotations

from pipesim.actions import Action, Op, trusted_actions
from pipesim.schedule import Schedule
from pipesim.schedules._common import check_count, refuse_virtual


def gpipe(
    *, n_ranks: int, n_microbatches: int, virtual: int = 1, forward_only: bool = False
) -> Schedule:
    """All forwards, then all backwards.

    >>> [str(a) for a in gpipe(n_ranks=2, n_microbatches=2).orders[0]]
    ['0F0', '0F1', '0B0', '0B1']
    """
    p = check_count("n_ranks", n_ranks)
    m = check_count("n_microbatches", n_microbatches)
    refuse_virtual("gpipe", virtual)
    orders: list[list[Action]] = []
    for rank in range(p):
        order = trusted_actions(rank, Op.F, range(m))
        if not forward_only:
            order += trusted_actions(rank, Op.B, range(m))
        orders.append(order)
    return Schedule.from_orders(orders, placement=tuple(range(p)), n_microbatches=m, name="gpipe")
