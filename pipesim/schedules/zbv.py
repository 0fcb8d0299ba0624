"""``zbv``: the V-shaped zero-bubble schedule (Qi et al., "Zero Bubble Pipeline
Parallelism", ICLR 2024, section 6 "ZB-V"; torch's ``ScheduleZBVZeroBubble``).

Each of the ``p`` ranks holds two stages in a V: rank ``r`` holds stage ``r``
(chunk 0, on the way down) and stage ``2p - 1 - r`` (chunk 1, on the way
back), so the model is cut into ``2p`` stages and the last rank holds the two
middle ones. Both the first and the last stage live on rank 0. Each backward
is split into ``I`` and ``W``.

Order of rank ``r`` (torch's rule, which follows the paper's figure), with
``n = max(m, 2p - 1)`` micro-batches planned and those ``>= m`` dropped
afterwards:

1. ``2 (p - r) - 1`` forwards of chunk 0;
2. ``r`` times: forward of chunk 1, forward of chunk 0;
3. ``p - r`` times: forward, ``I`` and ``W`` of chunk 1;
4. steady state, while chunk-0 forwards remain or chunk 1 lags: forward of
   chunk 0 (while any remain), ``I`` and ``W`` of chunk 0, then forward,
   ``I`` and ``W`` of chunk 1;
5. cool-down: ``r`` times ``I`` of chunk 0 and ``I`` of chunk 1; ``p - r``
   times ``I`` of chunk 0 and its oldest pending ``W``; then the pending ``W``
   of chunk 1, then those of chunk 0.

With ``F = I = W`` (per chunk) and ``m >= 2p - 1`` every rank works without a
gap from its first action to its last (the paper's zero bubble), and a rank
holds at most ``2p`` chunk activations, each half a stage of 1F1B: no more
activation memory than 1F1B's ``p`` stage activations on rank 0.

Rules: ``virtual = 2`` (two stages per rank), training only; any ``m >= 1``.
"""

from __future__ import annotations

from collections import deque

from pipesim.actions import Action, Op, trusted_action
from pipesim.errors import ScheduleError
from pipesim.schedule import Schedule
from pipesim.schedules._common import check_count, refuse_forward_only

__all__ = ["v_placement", "zbv"]


def v_placement(n_ranks: int) -> tuple[int, ...]:
    """Stage -> rank for a V of ``2 * n_ranks`` stages: down the ranks, then back up.

    >>> v_placement(3)
    (0, 1, 2, 2, 1, 0)
    """
    return tuple(range(n_ranks)) + tuple(reversed(range(n_ranks)))


def require_two_stages_per_rank(name: str, virtual: int) -> None:
    """V-shaped schedules hold exactly two stages per rank."""
    if virtual != 2:
        raise ScheduleError(
            f"schedule {name!r} places exactly two stages on each rank in a V, got "
            f"virtual={virtual}; drop --virtual (it defaults to 2) or pass --virtual 2"
        )


class _Chunk:
    """Counters of one chunk (stage) on a rank: next F, next I, pending W."""

    def __init__(self, stage: int) -> None:
        self.stage = stage
        self.n_f = 0
        self.n_i = 0
        self.pending_w: deque[int] = deque()

    def forward(self) -> Action:
        self.n_f += 1
        return trusted_action(self.stage, Op.F, self.n_f - 1)

    def input_grad(self) -> Action:
        self.n_i += 1
        self.pending_w.append(self.n_i - 1)
        return trusted_action(self.stage, Op.I, self.n_i - 1)

    def weight_grad(self) -> Action:
        return trusted_action(self.stage, Op.W, self.pending_w.popleft())


def zbv(
    *, n_ranks: int, n_microbatches: int, virtual: int = 2, forward_only: bool = False
) -> Schedule:
    """ZB-V: two stages per rank in a V, I and W split.

    >>> s = zbv(n_ranks=2, n_microbatches=3)
    >>> s.placement
    (0, 1, 1, 0)
    >>> [str(a) for a in s.orders[1]][:6]
    ['1F0', '2F0', '1F1', '2F1', '2I0', '2W0']
    """
    p = check_count("n_ranks", n_ranks)
    m = check_count("n_microbatches", n_microbatches)
    require_two_stages_per_rank("zbv", virtual)
    refuse_forward_only("zbv", forward_only)
    planned = max(m, 2 * p - 1)  # enough micro-batches to fill the V; extras dropped below
    orders: list[list[Action]] = []
    for rank in range(p):
        down, up = _Chunk(rank), _Chunk(2 * p - 1 - rank)
        order: list[Action] = [down.forward() for _ in range(2 * (p - rank) - 1)]
        for _ in range(rank):
            order += [up.forward(), down.forward()]
        for _ in range(p - rank):
            order += [up.forward(), up.input_grad(), up.weight_grad()]
        while up.n_f < down.n_f or down.n_f < planned:
            if down.n_f < planned:
                order.append(down.forward())
            order += [down.input_grad(), down.weight_grad()]
            order += [up.forward(), up.input_grad(), up.weight_grad()]
        for _ in range(rank):
            order += [down.input_grad(), up.input_grad()]
        for _ in range(p - rank):
            order += [down.input_grad(), down.weight_grad()]
        order += [up.weight_grad() for _ in range(len(up.pending_w))]
        order += [down.weight_grad() for _ in range(len(down.pending_w))]
        orders.append([a for a in order if a.microbatch < m])
    return Schedule.from_orders(orders, placement=v_placement(p), n_microbatches=m, name="zbv")
