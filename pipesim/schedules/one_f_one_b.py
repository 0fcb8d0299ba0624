"""``1f1b``: PipeDream-Flush (Narayanan et al., "Memory-Efficient Pipeline-Parallel
DNN Training", ICML 2021; also Megatron-LM's non-interleaved schedule).

Rank ``r`` of ``p`` runs a warm-up of ``min(p - r - 1, m)`` forwards, then
alternates one forward and one backward until every forward has run, then a
cool-down of the remaining backwards. The makespan equals GPipe's,
``(m + p - 1) * (F + B)`` for uniform stages, but rank ``r`` holds at most
``min(p - r, m)`` micro-batches of activations instead of ``m``.

Rules: any ranks >= 1, micro-batches >= 1, one stage per rank, training only.
"""

from __future__ import annotations

import itertools

from pipesim.actions import Action, Op, trusted_actions
from pipesim.schedule import Schedule
from pipesim.schedules._common import check_count, refuse_forward_only, refuse_virtual


def one_f_one_b(
    *, n_ranks: int, n_microbatches: int, virtual: int = 1, forward_only: bool = False
) -> Schedule:
    """PipeDream-Flush 1F1B.

    >>> [str(a) for a in one_f_one_b(n_ranks=2, n_microbatches=3).orders[0]]
    ['0F0', '0F1', '0B0', '0F2', '0B1', '0B2']
    """
    p = check_count("n_ranks", n_ranks)
    m = check_count("n_microbatches", n_microbatches)
    refuse_virtual("1f1b", virtual)
    refuse_forward_only("1f1b", forward_only)
    orders: list[list[Action]] = []
    for rank in range(p):
        forwards = trusted_actions(rank, Op.F, range(m))
        backwards = trusted_actions(rank, Op.B, range(m))
        warmup = min(p - rank - 1, m)  # Narayanan et al. 2021: p - r - 1 warm-up forwards
        steady = zip(forwards[warmup:], backwards[: m - warmup], strict=True)
        order = forwards[:warmup]
        order += itertools.chain.from_iterable(steady)  # one forward (warmup + k), one backward (k)
        order += backwards[m - warmup :]  # cool-down
        orders.append(order)
    return Schedule.from_orders(orders, placement=tuple(range(p)), n_microbatches=m, name="1f1b")
