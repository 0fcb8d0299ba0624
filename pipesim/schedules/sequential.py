"""``sequential``: plain model parallelism, one micro-batch at a time.

Each micro-batch runs through every stage (forward, then backward when
training) before the next one enters: the single-controller loop of the model
parallelism chapter, ``h = stage0(x); out = stage1(h)`` per micro-batch. Total
time is ``m * p * (F + B)``: at any instant exactly one rank works.

In training the per-rank orders already force this (rank 0 runs ``0F{k+1}``
only after ``0B{k}``, the last step of micro-batch k). Forward-only, rank 0
would run ahead, so the schedule carries a ``happens_before`` edge from the
last stage's forward of micro-batch k to the first stage's forward of k+1.

Rules: any ranks >= 1, micro-batches >= 1, one stage per rank.
"""

from __future__ import annotations

from pipesim.actions import Action
from pipesim.schedule import Schedule
from pipesim.schedules._common import (
    backward,
    check_count,
    forward,
    refuse_virtual,
)


def sequential(
    *, n_ranks: int, n_microbatches: int, virtual: int = 1, forward_only: bool = False
) -> Schedule:
    """One micro-batch through the whole model before the next.

    >>> s = sequential(n_ranks=2, n_microbatches=2, forward_only=True)
    >>> [[str(a) for a in order] for order in s.orders]
    [['0F0', '0F1'], ['1F0', '1F1']]
    >>> [(str(a), str(b)) for a, b in s.happens_before]
    [('1F0', '0F1')]
    """
    p = check_count("n_ranks", n_ranks)
    m = check_count("n_microbatches", n_microbatches)
    refuse_virtual("sequential", virtual)
    orders: list[list[Action]] = [[] for _ in range(p)]
    for mb in range(m):
        for rank in range(p):
            orders[rank].append(forward(rank, mb))
            if not forward_only:
                orders[rank].append(backward(rank, mb))
    edges: list[tuple[Action, Action]] = []
    if forward_only:
        edges = [(forward(p - 1, mb), forward(0, mb + 1)) for mb in range(m - 1)]
    # Reorder training: per rank it is F0 B0 F1 B1 ... already, as built above.
    return Schedule.from_orders(
        orders,
        placement=tuple(range(p)),
        n_microbatches=m,
        name="sequential",
        happens_before=edges,
    )
