"""``interleaved-zb``: interleaved 1F1B with the backward split into I and W
(Qi et al., "Zero Bubble Pipeline Parallelism", ICLR 2024, the ZB1P schedule on
a looped placement; torch's ``ScheduleInterleavedZeroBubble``).

Each of the ``p`` ranks holds ``v`` stages; stage ``c * p + r`` lives on rank
``r`` (chunk ``c``), as in ``interleaved-1f1b``. Micro-batches are taken in
rounds of ``N`` (torch: ``rounds = max(1, m // p)``, ``N = m // rounds``): the
k-th forward of a rank runs chunk ``(k // N) mod v``, the k-th input-gradient
backward runs chunk ``v - 1 - (k // N) mod v``, each chunk taking its
micro-batches in order.

Rank ``r`` first runs ``(v - 1) * N + (p - 1 - r)`` warm-up forwards (one hop
less per rank than interleaved 1F1B's ``2 (p - 1 - r)``, because an ``I`` is
about as long as an ``F``; capped at ``m * v``). Then it alternates one
forward with one ``I``; after its first ``r`` input-gradient backwards it
follows every ``I`` with the ``W`` of the oldest pending one, so rank ``r``
delays ``r`` weight-gradient passes and spends them filling the cool-down.
The remaining ``W`` run last. With ``v = 1`` this is ``zb-h1``.

Rules (torch's): ``m`` a multiple of the rounds ``max(1, m // p)``; any
``v >= 1``; training only.
"""

from __future__ import annotations

from collections import deque

from pipesim.actions import Action, Op, trusted_action
from pipesim.errors import ScheduleError
from pipesim.schedule import Schedule
from pipesim.schedules._common import check_count, refuse_forward_only

__all__ = ["interleaved_zero_bubble", "round_size"]


def round_size(n_ranks: int, n_microbatches: int) -> int:
    """Micro-batches per round, torch's rule: ``m // max(1, m // p)``.

    >>> round_size(4, 8), round_size(4, 10), round_size(4, 3)
    (4, 5, 3)
    """
    rounds = max(1, n_microbatches // n_ranks)
    if n_microbatches % rounds:
        lower, upper = rounds * (n_microbatches // rounds), rounds * (n_microbatches // rounds + 1)
        raise ScheduleError(
            f"interleaved schedules with torch's rounds need micro-batches to be a multiple of "
            f"the number of rounds max(1, m // p) = {rounds}, got m={n_microbatches} with "
            f"p={n_ranks}; use {lower} or {upper} micro-batches"
        )
    return n_microbatches // rounds


def split_backward_orders(
    *, n_ranks: int, n_microbatches: int, virtual: int, group: int
) -> list[list[Action]]:
    """Per-rank orders of the interleaved zero-bubble rule (see module docstring).

    ``group`` is the round size N. Shared with ``zb-h1`` (``virtual = 1``).
    """
    p, m, v = n_ranks, n_microbatches, virtual
    total = m * v
    orders: list[list[Action]] = []
    for rank in range(p):
        warmup = min((v - 1) * group + (p - 1 - rank), total)
        f_next = [0] * v  # next micro-batch of each chunk's forward
        i_next = [0] * v
        pending_w: deque[Action] = deque()  # I's whose W has not run, oldest first
        order: list[Action] = []

        def forward(k: int, rank: int = rank, f_next: list[int] = f_next) -> Action:
            chunk = (k // group) % v
            mb = f_next[chunk]
            f_next[chunk] += 1
            return trusted_action(chunk * p + rank, Op.F, mb)

        def input_grad(k: int, rank: int = rank, i_next: list[int] = i_next) -> Action:
            chunk = v - 1 - (k // group) % v
            mb = i_next[chunk]
            i_next[chunk] += 1
            return trusted_action(chunk * p + rank, Op.I, mb)

        order += [forward(k) for k in range(warmup)]
        for k in range(total):
            if warmup + k < total:
                order.append(forward(warmup + k))
            grad = input_grad(k)
            order.append(grad)
            pending_w.append(trusted_action(grad.stage, Op.W, grad.microbatch))
            # Rank r holds back its first r weight-gradient passes (Qi et al. 2024, ZB-H1).
            if k >= rank:
                order.append(pending_w.popleft())
        order += pending_w
        orders.append(order)
    return orders


def interleaved_zero_bubble(
    *,
    n_ranks: int,
    n_microbatches: int,
    virtual: int = 2,
    forward_only: bool = False,
) -> Schedule:
    """Torch's interleaved zero-bubble (ZB1P on ``virtual`` looped chunks per rank).

    >>> s = interleaved_zero_bubble(n_ranks=2, n_microbatches=2, virtual=2)
    >>> s.placement
    (0, 1, 0, 1)
    >>> [str(a) for a in s.orders[1]]
    ['1F0', '1F1', '3F0', '3I0', '3F1', '3I1', '3W0', '1I0', '3W1', '1I1', '1W0', '1W1']
    """
    p = check_count("n_ranks", n_ranks)
    m = check_count("n_microbatches", n_microbatches)
    v = check_count("virtual", virtual)
    refuse_forward_only("interleaved-zb", forward_only)
    group = round_size(p, m)
    orders = split_backward_orders(n_ranks=p, n_microbatches=m, virtual=v, group=group)
    placement = tuple(stage % p for stage in range(p * v))
    return Schedule.from_orders(
        orders, placement=placement, n_microbatches=m, name="interleaved-zb"
    )
