"""``dualpipe`` and ``dualpipev``: DeepSeek's bidirectional schedules
(DeepSeek-AI, "DeepSeek-V3 Technical Report", 2024, section 3.2.1;
github.com/deepseek-ai/DualPipe; torch's ``ScheduleDualPipeV``).

Both overlap the forward of one chunk with the backward of another as one
unit of work, :class:`~pipesim.actions.Overlap` (torch spells it
``(0F3;3B1)OVERLAP_F_B``), whose duration is ``StageCost.overlap`` ("F&B",
default ``F + B``). Both place two stages on each rank, rank ``r`` holding
stages ``r`` and ``2p - 1 - r``; they differ in what those stages are.

**dualpipe** (``--pipeline-parallel P``: P ranks, P even). The model has ``P`` stages
and is kept twice: copy 0 (stages ``0..P-1`` on ranks ``0..P-1``) carries the
first half of the micro-batches from rank 0 down to rank ``P-1``; copy 1
(stages ``P..2P-1``, i.e. the model's stages ``0..P-1`` again, on ranks
``P-1..0``) carries the second half up the other way
(``Schedule.n_copies = 2``). So ``--virtual`` is 2 (two stages per rank) and
the parameter memory is doubled, as DeepSeek notes.

**dualpipev** (``--pipeline-parallel P``: P ranks, any P). DualPipe "cut in half": one
copy of a model of ``2P`` stages in a V (as ``zbv``), every micro-batch going
down the ranks and back up. ``--virtual`` is 2.

Order of a rank, following DeepSeek's eight steps. For ``dualpipev`` a rank's
depth is ``h = r`` in a V of ``H = P`` ranks with ``M = m`` micro-batches;
for ``dualpipe`` it is ``h = min(r, P - 1 - r)``, ``H = P / 2`` and ``M = m / 2``
per direction. "Near" is the chunk at depth ``h`` of its pipeline, "far" the
other one (for dualpipe on the lower half of the ranks: near = copy 0)::

    1. 2 (H - h - 1) x  F near
    2. (h + 1)       x  F near, F far
    3. (H - h - 1)   x  I far, W, F far
    4. (M - 2H + h + 1) x  (F near & B far), (F far & B near)
       (the first pair of the middle rank h = H - 1 runs unoverlapped)
    5. (H - h - 1)   x  B far, (F far & B near)
    6. (h + 1)       x  B far, B near  -- the second half split into I
    7. (H - h - 1)   x  W, I near
    8. (h + 1)       x  W

``W`` is always the oldest pending one (DeepSeek's ``WeightGradStore`` queue).
In step 6 the switch from B to I happens at iteration ``(h + 1) // 2``, before
the far chunk when ``h`` is odd and before the near chunk when it is even.

For uniform chunks DeepSeek's table gives a bubble of ``(P/2 - 1)(F&B + B - 3W)``
per rank for dualpipe (``B`` the full backward, ``W`` its weight part) and at
most ``P + 1`` micro-batch chunks of activation per rank.

Rules (DeepSeek's): dualpipe needs ranks even and micro-batches even and
``>= 2 * ranks``; dualpipev needs micro-batches ``>= 2 * ranks`` (torch: at
least as many as stages). Both training only, ``virtual = 2``.
"""

from __future__ import annotations

from collections import deque

from pipesim.actions import Action, Op, Overlap, Work, trusted_action
from pipesim.errors import ScheduleError
from pipesim.schedule import Schedule
from pipesim.schedules._common import check_count, refuse_forward_only
from pipesim.schedules.zbv import require_two_stages_per_rank, v_placement

__all__ = ["dualpipe", "dualpipev"]


class _Chunk:
    """One stage on a rank and the micro-batches it processes, in order."""

    def __init__(self, stage: int, first_microbatch: int) -> None:
        self.stage = stage
        self.next_f = first_microbatch
        self.next_b = first_microbatch

    def forward(self) -> Action:
        self.next_f += 1
        return trusted_action(self.stage, Op.F, self.next_f - 1)

    def backward(self, op: Op) -> Action:
        self.next_b += 1
        return trusted_action(self.stage, op, self.next_b - 1)


def _rank_order(near: _Chunk, far: _Chunk, *, depth: int, half: int, chunks: int) -> list[Work]:
    """DeepSeek's eight steps for one rank (see module docstring)."""
    h, n_half, n_chunks = depth, half, chunks
    order: list[Work] = []
    pending_w: deque[Action] = deque()

    def backward(chunk: _Chunk, split: bool) -> Action:
        action = chunk.backward(Op.I if split else Op.B)
        if split:
            pending_w.append(trusted_action(action.stage, Op.W, action.microbatch))
        return action

    def pair(forward_chunk: _Chunk, backward_chunk: _Chunk) -> Overlap:
        return Overlap(parts=(forward_chunk.forward(), backward(backward_chunk, False)))

    order += [near.forward() for _ in range(2 * (n_half - h - 1))]  # 1
    for _ in range(h + 1):  # 2
        order += [near.forward(), far.forward()]
    for _ in range(n_half - h - 1):  # 3: zero bubble, W right after its I
        order.append(backward(far, True))
        order += [pending_w.popleft(), far.forward()]
    for i in range(n_chunks - 2 * n_half + h + 1):  # 4: the main, overlapped step
        if i == 0 and h == n_half - 1:
            # DeepSeek: the middle rank does not overlap its first pair, to shrink the bubble.
            order += [near.forward(), backward(far, False)]
        else:
            order.append(pair(near, far))
        order.append(pair(far, near))
    for _ in range(n_half - h - 1):  # 5
        order += [backward(far, False), pair(far, near)]
    split = False
    for i in range(h + 1):  # 6: the second half of these backwards is split
        if i == (h + 1) // 2 and h % 2 == 1:
            split = True
        order.append(backward(far, split))
        if i == (h + 1) // 2 and h % 2 == 0:
            split = True
        order.append(backward(near, split))
    for _ in range(n_half - h - 1):  # 7
        order += [pending_w.popleft(), backward(near, True)]
    order += list(pending_w)  # 8: h + 1 of them
    return order


def dualpipe(
    *, n_ranks: int, n_microbatches: int, virtual: int = 2, forward_only: bool = False
) -> Schedule:
    """DualPipe: two model copies fed from both ends (``n_copies = 2``).

    >>> s = dualpipe(n_ranks=2, n_microbatches=4)
    >>> s.placement, s.n_copies
    ((0, 1, 1, 0), 2)
    >>> [str(w) for w in s.orders[0]]
    ['0F0', '3F2', '0F1', '3B2', '(3F3;0B0)OVERLAP_F_B', '3B3', '0I1', '0W1']
    """
    p = check_count("n_ranks", n_ranks)
    m = check_count("n_microbatches", n_microbatches)
    require_two_stages_per_rank("dualpipe", virtual)
    refuse_forward_only("dualpipe", forward_only)
    if p % 2:
        raise ScheduleError(
            f"dualpipe feeds micro-batches from both ends and needs an even number of ranks, "
            f"got {p}; use {p - 1 or 2} or {p + 1} ranks, or dualpipev"
        )
    if m % 2 or m < 2 * p:
        good = max(2 * p, m + m % 2)
        raise ScheduleError(
            f"dualpipe needs an even number of micro-batches, at least twice the ranks "
            f"(2 * {p} = {2 * p}), got {m}; use {good}"
        )
    half, per_direction = p // 2, m // 2
    orders: list[list[Work]] = []
    for rank in range(p):
        down = _Chunk(rank, 0)  # copy 0: stage rank, first half of the micro-batches
        up = _Chunk(2 * p - 1 - rank, per_direction)  # copy 1 runs ranks p-1 .. 0
        near, far = (down, up) if rank < half else (up, down)
        depth = min(rank, p - 1 - rank)
        orders.append(_rank_order(near, far, depth=depth, half=half, chunks=per_direction))
    return Schedule.from_orders(
        orders, placement=v_placement(p), n_microbatches=m, name="dualpipe", n_copies=2
    )


def dualpipev(
    *, n_ranks: int, n_microbatches: int, virtual: int = 2, forward_only: bool = False
) -> Schedule:
    """DualPipeV: DualPipe folded into one V of ``2 * n_ranks`` stages.

    >>> s = dualpipev(n_ranks=2, n_microbatches=4)
    >>> s.placement
    (0, 1, 1, 0)
    >>> [str(w) for w in s.orders[1]][:7]
    ['1F0', '2F0', '1F1', '2F1', '1F2', '2B0', '(2F2;1B0)OVERLAP_F_B']
    """
    p = check_count("n_ranks", n_ranks)
    m = check_count("n_microbatches", n_microbatches)
    require_two_stages_per_rank("dualpipev", virtual)
    refuse_forward_only("dualpipev", forward_only)
    if m < 2 * p:
        raise ScheduleError(
            f"dualpipev needs at least as many micro-batches as stages (2 * {p} ranks = "
            f"{2 * p}), got {m}; use {2 * p} or more"
        )
    orders = [
        _rank_order(_Chunk(rank, 0), _Chunk(2 * p - 1 - rank, 0), depth=rank, half=p, chunks=m)
        for rank in range(p)
    ]
    return Schedule.from_orders(
        orders, placement=v_placement(p), n_microbatches=m, name="dualpipev"
    )
