"""``v-half`` and ``v-min``: V-shaped schedules with controllable memory.

After Qi, Wan, Amar and Lin, "Pipeline Parallelism with Controllable Memory"
(NeurIPS 2024, arXiv 2405.15362), sections 2-4 and appendix A, and the
zero-bubble repository's V-Half / V-Min schedules
(github.com/sail-sg/zero-bubble-pipeline-parallelism). The model is cut into
``2p`` stages placed in a V (rank ``r`` holds stages ``r`` and ``2p - 1 - r``,
as :mod:`pipesim.schedules.zbv`); every backward is split into ``I`` and ``W``.

**Building block.** A schedule repeats one block per micro-batch, every 6 time
slots (one slot = one pass of one chunk; a rank runs F, I and W of both its
chunks per micro-batch). The block fixes the slot of each pass on each rank:

- ``v-min``: the forward of chunk 0 moves down one rank per slot (offset 1),
  comes back up through chunk 1 one rank per slot, and the input gradient does
  the same on its way back: F0 at ``r``, F1 at ``2p - 1 - r``, I1 at
  ``2p + d + r``, I0 at ``4p + d - 1 - r``, with ``d = 2`` when 3 divides
  ``p`` (else 0) so that no two passes share a slot modulo 6;
- ``v-half``: offset 2 on the way down (forward and gradient), 1 on the way
  back: F0 at ``2r``, F1 at ``3p - 2 - r``, I1 at ``3p + d + 2r - 1``, I0 at
  ``6p + d - r - 2``, ``d = 3`` when ``p`` is even (else 0);
- each ``W`` takes the first slot of the block left free after its ``I``.

The paper's central observation: a rank holds a micro-batch's activations
for its *lifespan* (F to W), so its peak is the summed lifespan of its two
chunks divided by the 6-slot interval. In a V the two chunks' lifespans add up
to about the same on every rank (``4p`` slots for V-Min, ``6p`` for V-Half),
which gives, in micro-batches of a rank's activations (both chunks),
``(p + 4) // 3`` for V-Min and ``(p + 2) // 2`` for V-Half: a third and a half
of 1F1B's ``p`` (the repository's table; tested in ``tests/test_controllable.py``).

**Squeezing and reordering** (the paper's sec. 3.2, our own rules): the
repeated blocks are run pass by pass in unit time; when a rank's next pass is
not ready, it pulls in the first later pass that is (the micro-batch order of
each stage and op kept), a forward only while the rank's peak in the repeated
order is not exceeded; once a rank has run its last forward, it runs every
ready ``I`` before any ``W`` (deferring W then costs no memory: nothing is
allocated any more), which fills the cool-down with W as in ZB-H1. With
``F = I = W`` this gives bubbles of about half (V-Half) and two thirds (V-Min)
of 1F1B's, as the paper states.

Rules: ``virtual = 2``, training only, any ``p >= 1`` and ``m >= 1``.
"""

from __future__ import annotations

from collections import Counter

from pipesim.actions import OP_INDEX, Action, Op
from pipesim.costs import StageCost
from pipesim.errors import ScheduleError
from pipesim.schedule import Schedule
from pipesim.schedules._common import check_count, refuse_forward_only
from pipesim.schedules.zbv import require_two_stages_per_rank, v_placement
from pipesim.step.dependencies import prerequisites
from pipesim.step.memory import RunningPeak, byte_peaks, op_effects

__all__ = ["BLOCKS", "block_slots", "repeated_orders", "v_half", "v_min"]

#: The building blocks, by schedule name.
BLOCKS = ("v-half", "v-min")

#: Slots in one building block: F, I and W of the rank's two chunks.
_INTERVAL = 6

# One chunk's activations as one unit, all held from F until W (the paper's count;
# pipesim.step.memory's effects of a stage whose weight_grad_bytes equal its activations).
_UNIT = op_effects(StageCost(activation_bytes=1, weight_grad_bytes=1), forward_only=False)
_HELD = {op: _UNIT[OP_INDEX[op]].start_bytes + _UNIT[OP_INDEX[op]].end_bytes for op in Op}


def block_slots(kind: str, n_ranks: int, rank: int) -> tuple[int, int, int, int, int, int]:
    """Slots of (F0, F1, I1, I0, W1, W0) of micro-batch 0 on ``rank`` (chunk 0 is
    stage ``rank``, chunk 1 stage ``2p - 1 - rank``); micro-batch k's are 6k later.

    >>> block_slots("v-min", 4, 0), block_slots("v-min", 4, 3)
    ((0, 7, 8, 15, 10, 17), (3, 4, 11, 12, 13, 14))
    >>> block_slots("v-half", 4, 0)
    (0, 10, 14, 25, 15, 29)
    """
    p, r = n_ranks, rank
    if kind == "v-min":
        d = 2 if p % 3 == 0 else 0
        passes = [r, 2 * p - 1 - r, 2 * p + d + r, 4 * p + d - 1 - r]
    elif kind == "v-half":
        d = 3 if p % 2 == 0 else 0
        passes = [2 * r, 3 * p - 2 - r, 3 * p + d + 2 * r - 1, 6 * p + d - r - 2]
    else:
        raise ScheduleError(f"unknown building block {kind!r}; known: v-min, v-half")
    used = {slot % _INTERVAL for slot in passes}
    for input_grad in (passes[2], passes[3]):  # W after its I, in the first free slot
        weight = next(
            input_grad + j for j in range(1, _INTERVAL) if (input_grad + j) % 6 not in used
        )
        used.add(weight % _INTERVAL)
        passes.append(weight)
    return (passes[0], passes[1], passes[2], passes[3], passes[4], passes[5])


def repeated_orders(kind: str, p: int, m: int) -> list[list[Action]]:
    """Per rank, the block repeated for every micro-batch, in slot order (valid as it
    stands: every pass comes after the slots of what it waits for).

    >>> [str(a) for a in repeated_orders("v-min", 1, 2)[0]]
    ['0F0', '1F0', '1I0', '0I0', '1W0', '0W0', '0F1', '1F1', '1I1', '0I1', '1W1', '0W1']
    """
    ops = (Op.F, Op.F, Op.I, Op.I, Op.W, Op.W)
    orders = []
    for rank in range(p):
        down, up = rank, 2 * p - 1 - rank
        stages = (down, up, up, down, up, down)
        slots = block_slots(kind, p, rank)
        timed = [
            (slots[j] + _INTERVAL * k, Action(stage=stages[j], op=ops[j], microbatch=k))
            for k in range(m)
            for j in range(_INTERVAL)
        ]
        timed.sort(key=lambda item: item[0])
        orders.append([action for _, action in timed])
    return orders


def _highest_peak(orders: list[list[Action]]) -> int:
    """The most chunks of activations any rank holds running its order
    (:func:`pipesim.step.memory.byte_peaks` of the one-unit effects)."""
    return max(byte_peaks(_UNIT, ([OP_INDEX[action.op] for action in order] for order in orders)))


class _Squeeze:
    """Unit-time run of the repeated orders that pulls ready passes into idle slots."""

    def __init__(self, orders: list[list[Action]], n_stages: int) -> None:
        self.remaining = [list(order) for order in orders]
        self.cap = _highest_peak(orders)
        self.n_stages = n_stages
        self.forwards_left = [sum(a.op is Op.F for a in order) for order in orders]
        self.held = [0] * len(orders)
        self.done: dict[tuple[int, Op, int], int] = {}
        self.out: list[list[Action]] = [[] for _ in orders]
        # per rank: how many of each (stage, op) are left, so a scan can stop once it
        # has met every kind left (only the first of each kind may be picked)
        self.left: list[Counter[tuple[int, Op]]] = [
            Counter((a.stage, a.op) for a in order) for order in orders
        ]

    def ready(self, action: Action, now: int) -> bool:
        for key in prerequisites(
            action.stage, action.op, action.microbatch, per_copy=self.n_stages
        ):
            if key[1] is Op.B:  # these orders split every backward: the I stands for it
                continue
            end = self.done.get(key)
            if end is None or end > now:
                return False
        return True

    def pick(self, rank: int, now: int) -> int | None:
        """Index in the rank's remaining order of the pass to run at ``now``, if any."""
        order = self.remaining[rank]
        left = self.left[rank]
        if not self.forwards_left[rank]:  # cool-down: every ready I before any W
            for op in (Op.I, Op.W):
                seen: set[int] = set()
                stages = sum(1 for (_s, o), n in left.items() if o is op and n)
                for index, action in enumerate(order):
                    if len(seen) == stages:
                        break
                    if action.op is op and action.stage not in seen:
                        if self.ready(action, now):
                            return index
                        seen.add(action.stage)
            return None
        if self.ready(order[0], now):
            return 0
        # the rank's levels running the order's prefix before a candidate: moved ahead of
        # them, the candidate raises each by what it holds, so their peak by as much
        prefix = RunningPeak(self.held[rank])
        prefix.add(_HELD[order[0].op])
        seen_keys = {(order[0].stage, order[0].op)}
        kinds = sum(1 for n in left.values() if n)
        for index in range(1, len(order)):
            if len(seen_keys) == kinds:
                break
            action = order[index]
            key = (action.stage, action.op)
            fits = prefix.peak + _HELD[action.op] <= self.cap  # the peak is never raised
            if key not in seen_keys and fits and self.ready(action, now):
                return index
            seen_keys.add(key)
            prefix.add(_HELD[action.op])
        return None

    def run(self) -> list[list[Action]]:
        now = 0
        total = sum(len(order) for order in self.remaining)
        while any(self.remaining):
            if now > 2 * _INTERVAL * total:  # the block order cannot stall; a guard
                raise AssertionError("controllable-memory squeeze made no progress")
            for rank, order in enumerate(self.remaining):
                if not order:
                    continue
                index = self.pick(rank, now)
                if index is None:
                    continue
                action = order.pop(index)
                self.left[rank][(action.stage, action.op)] -= 1
                self.out[rank].append(action)
                self.done[(action.stage, action.op, action.microbatch)] = now + 1
                self.held[rank] += _HELD[action.op]
                self.forwards_left[rank] -= action.op is Op.F
            now += 1
        return self.out


def _build(
    kind: str, n_ranks: int, n_microbatches: int, virtual: int, forward_only: bool
) -> Schedule:
    p = check_count("n_ranks", n_ranks)
    m = check_count("n_microbatches", n_microbatches)
    require_two_stages_per_rank(kind, virtual)
    refuse_forward_only(kind, forward_only)
    orders = _Squeeze(repeated_orders(kind, p, m), 2 * p).run()
    return Schedule.from_orders(orders, placement=v_placement(p), n_microbatches=m, name=kind)


def v_min(
    *, n_ranks: int, n_microbatches: int, virtual: int = 2, forward_only: bool = False
) -> Schedule:
    """V-Min: a third of 1F1B's activation memory, ``(p + 4) // 3`` micro-batches.

    >>> s = v_min(n_ranks=2, n_microbatches=2)
    >>> [str(a) for a in s.orders[1]]
    ['1F0', '2F0', '1F1', '2F1', '2I0', '1I0', '2W0', '1W0', '2I1', '1I1', '2W1', '1W1']
    """
    return _build("v-min", n_ranks, n_microbatches, virtual, forward_only)


def v_half(
    *, n_ranks: int, n_microbatches: int, virtual: int = 2, forward_only: bool = False
) -> Schedule:
    """V-Half: half of 1F1B's activation memory, ``(p + 2) // 2`` micro-batches.

    >>> s = v_half(n_ranks=2, n_microbatches=2)
    >>> s.placement
    (0, 1, 1, 0)
    """
    return _build("v-half", n_ranks, n_microbatches, virtual, forward_only)
