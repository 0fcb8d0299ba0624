"""The memory model, written once: what each action allocates when it starts and
frees when it ends, per rank, in activation bytes and stage-micro-batches in flight.

Per stage ``s`` and micro-batch (see :class:`~pipesim.costs.StageCost`):

- ``F`` allocates the stage's ``activation_bytes`` (Qi et al.'s ``M_B``) when it
  starts; the stage-micro-batch is then *in flight*;
- a full backward ``B`` frees all of them when it ends, and the micro-batch
  leaves flight (the gradients it computes live and die inside it);
- a split backward keeps, from the end of ``I`` until ``W`` ends, the
  ``weight_grad_bytes`` W needs (Qi et al.'s ``M_W``): the inputs of the stage's
  weight matmuls, which F stored, *and* the gradients of their outputs, which I
  computes and hands to W. ``I`` turns the micro-batch's ``activation_bytes``
  into ``weight_grad_bytes``: what it adds (``weight_grad_bytes`` may exceed
  ``activation_bytes``, e.g. under full recomputation) is counted when it starts,
  what it frees when it ends; ``W`` frees the ``weight_grad_bytes`` when it ends.
  The micro-batch stays in flight from its first forward until its last backward
  op, ``B`` or ``W``, ends, whatever bytes it holds;
- in a forward-only (inference) step no backward needs the activations, so F
  frees its own when it ends.

Only what outlives a pass is counted, as in Qi et al., "Zero Bubble Pipeline
Parallelism", ICLR 2024, section 2 (Table 1: ``M_B = sb(34h + 5as)`` for B and
``M_W = 32sbh`` for W per transformer layer; Table 2's peaks ``p M_B`` for ZB-H1 and
``(2p - 1) M_B`` for ZB-H2) and in their scheduler (sail-sg/zero-bubble-pipeline-
parallelism, ``zerobubble/runtime.py``: ``f_mem = 34h + 5as``, ``w_mem = -32h``,
``b_mem = -(f_mem + w_mem)`` per token): buffers a pass allocates and frees itself
(the input gradient it sends, a fused B's weight gradients) are not. Our reading
of ``32sbh`` at t = 1, which adds up to the paper's figure: the four weight
matmuls' inputs (QKV 2sbh, output projection 2sbh, MLP 2sbh + 8sbh = 14sbh, all in
F's ``34sbh``, Korthikanti et al. 2023, Table 2) plus their output gradients (QKV
6sbh, output projection 2sbh, MLP 8sbh + 2sbh = 18sbh, which I creates).

An :class:`~pipesim.actions.Overlap` has the summed effects of its parts. The
SimPy engine, the planner's evaluators, the synthesizer and the compiled step all
read these tables (through :mod:`pipesim.step.cost_tables`); no other module restates them.

>>> from pipesim.costs import StageCost
>>> table = op_effects(StageCost(activation_bytes=10, weight_grad_bytes=4), forward_only=False)
>>> table[0], table[2], table[3]  # F, I, W: (bytes, count) at start, then at end
(Effect(start_bytes=10, start_count=1, end_bytes=0, end_count=0), \
Effect(start_bytes=0, start_count=0, end_bytes=-6, end_count=0), \
Effect(start_bytes=0, start_count=0, end_bytes=-4, end_count=-1))
>>> op_effects(StageCost(activation_bytes=10, weight_grad_bytes=12), forward_only=False)[2]
Effect(start_bytes=2, start_count=0, end_bytes=0, end_count=0)
>>> microbatch_peak(StageCost(activation_bytes=10, weight_grad_bytes=12))
12
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from itertools import accumulate, chain
from typing import NamedTuple

from pipesim.actions import OP_INDEX, Work
from pipesim.costs import CostModel, StageCost

__all__ = [
    "NO_EFFECT",
    "Effect",
    "RunningPeak",
    "byte_peaks",
    "held_levels",
    "level_peaks",
    "microbatch_peak",
    "op_effects",
    "rank_peaks",
    "stage_effects",
    "work_effect",
]


class Effect(NamedTuple):
    """Signed changes of a rank's held activation bytes and in-flight count."""

    start_bytes: int
    """Change when the work starts (allocations are positive)."""
    start_count: int
    """Change of stage-micro-batches in flight when the work starts."""
    end_bytes: int
    """Change when the work ends (frees are negative)."""
    end_count: int
    """Change of stage-micro-batches in flight when the work ends."""


NO_EFFECT = Effect(0, 0, 0, 0)


def op_effects(cost: StageCost, /, *, forward_only: bool) -> tuple[Effect, Effect, Effect, Effect]:
    """The effects of F, B, I and W (in that order, :data:`pipesim.actions.OP_INDEX`) on
    one stage with costs ``cost``."""
    act, kept = cost.activation_bytes, cost.weight_grad_bytes
    forward = Effect(act, 1, -act if forward_only else 0, -1 if forward_only else 0)
    full = Effect(0, 0, -act, -1)
    # I: from act held to kept held; growth (output gradients beyond the activations it
    # frees) at its start, the net free at its end.
    change = kept - act
    input_grad = Effect(max(change, 0), 0, min(change, 0), 0)
    weight_grad = Effect(0, 0, -kept, -1)
    return forward, full, input_grad, weight_grad


def microbatch_peak(cost: StageCost, /) -> int:
    """The most one micro-batch holds on a stage with costs ``cost`` in a training step:
    what F allocates plus what I adds at its start (``max(activation_bytes,
    weight_grad_bytes)``)."""
    forward, _, input_grad, _ = op_effects(cost, forward_only=False)
    return forward.start_bytes + input_grad.start_bytes


def stage_effects(
    costs: CostModel, /, *, n_stages: int, forward_only: bool
) -> list[tuple[Effect, Effect, Effect, Effect]]:
    """:func:`op_effects` of every stage: ``table[stage][op index]``."""
    return [op_effects(costs.stage(s), forward_only=forward_only) for s in range(n_stages)]


def work_effect(table: Sequence[tuple[Effect, ...]], work: Work, /) -> Effect:
    """The effect of ``work``: an action's entry, or the sum over an overlap's parts."""
    parts = work.parts
    if len(parts) == 1:
        action = parts[0]
        return table[action.stage][OP_INDEX[action.op]]
    sb = sc = eb = ec = 0
    for action in parts:
        e = table[action.stage][OP_INDEX[action.op]]
        sb, sc, eb, ec = sb + e[0], sc + e[1], eb + e[2], ec + e[3]
    return Effect(sb, sc, eb, ec)


def held_levels(effects: Sequence[Effect], order: Iterable[int], /) -> tuple[list[int], list[int]]:
    """What a rank holds after each change, running ``order`` (node ids into ``effects``):
    activation bytes and stage-micro-batches in flight after each node's start effect
    (even positions) and end effect (odd positions), applied in program order from
    nothing. A rank's memory changes only where its own work starts and ends, in its
    program order, so the levels do not depend on timing.

    >>> f, b = Effect(10, 1, 0, 0), Effect(0, 0, -10, -1)
    >>> held_levels([f, b], [0, 0, 1, 1])
    ([10, 10, 20, 20, 20, 10, 10, 0], [1, 1, 2, 2, 2, 1, 1, 0])
    """
    rows = [effects[node] for node in order]
    if not rows:
        return [], []
    start_bytes, start_count, end_bytes, end_count = zip(*rows, strict=True)
    changes: list[int] = [0] * (2 * len(rows))
    changes[0::2], changes[1::2] = start_bytes, end_bytes
    held = list(accumulate(changes))
    changes[0::2], changes[1::2] = start_count, end_count
    return held, list(accumulate(changes))


def level_peaks(
    levels: Iterable[tuple[int, int, int]], /, *, n_ranks: int
) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """Per rank its peak: the most activation bytes and the most stage-micro-batches in
    flight it held at once, over ``levels`` ``(rank, bytes, count)`` (0 for a rank that
    held nothing). The one rule of a memory peak; :func:`rank_peaks` reads it from a
    compiled step, :meth:`pipesim.trace.Trace.totals` from a trace's records, and
    :func:`byte_peaks` (its bytes alone) serves the synthesizer, the V-Half/V-Min
    generators and the planner's bounds.

    The planner's fast evaluators keep their own copies in their per-node loops, for
    speed (``pipesim/plan/fastsim.py`` ``_memory_peaks``, ``pipesim/plan/onepass.py``),
    pinned equal to the engine by the differential tests (``tests/test_plan_fastsim.py``).

    >>> level_peaks([(0, 10, 1), (1, 4, 1), (0, 20, 2), (0, 0, 0)], n_ranks=3)
    ((20, 4, 0), (2, 1, 0))
    """
    held: list[list[int]] = [[] for _ in range(n_ranks)]
    inflight: list[list[int]] = [[] for _ in range(n_ranks)]
    for rank, n_bytes, count in levels:
        held[rank].append(n_bytes)
        inflight[rank].append(count)
    return tuple(map(_peak, held)), tuple(map(_peak, inflight))


class RunningPeak:
    """A rank's memory level and its peak so far: the highest level it has held, counting
    the one it started from (0, nothing held, before its first work). The one rule of a
    memory peak, in the incremental form a scan needs (:func:`_peak` is its batch form; the
    controllable-memory schedules' squeeze, :mod:`pipesim.schedules.controllable`, asks at
    each step whether one more change keeps under a cap).

    >>> running = RunningPeak(2)
    >>> running.add(3); running.add(-4); running.level, running.peak
    (1, 5)
    >>> running.reach([0, 7, 6]); running.level, running.peak
    (6, 7)
    """

    __slots__ = ("level", "peak")

    def __init__(self, level: int = 0) -> None:
        self.level = level
        self.peak = level

    def add(self, change: int) -> None:
        """The rank's level changes by ``change``."""
        self.level += change
        if self.level > self.peak:
            self.peak = self.level

    def reach(self, levels: Sequence[int]) -> None:
        """The rank holds each of ``levels`` in turn."""
        if levels:
            self.peak = max(self.peak, max(levels))
            self.level = levels[-1]


def _peak(levels: Sequence[int]) -> int:
    """The peak of a rank that holds ``levels`` in turn from nothing (:class:`RunningPeak`)."""
    running = RunningPeak()
    running.reach(levels)
    return running.peak


def rank_peaks(
    effects: Sequence[Effect], orders: Sequence[Iterable[int]], /
) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """:func:`level_peaks` of each rank running its order (``orders[rank]``, node ids
    into ``effects``): the peaks of its :func:`held_levels`.

    >>> f, b = Effect(10, 1, 0, 0), Effect(0, 0, -10, -1)
    >>> rank_peaks([f, b], [[0, 1, 0, 1], [0, 0, 1, 1], []])
    ((10, 20, 0), (1, 2, 0))
    """
    peak_bytes: list[int] = []
    peak_count: list[int] = []
    for order in orders:  # one rank's levels at a time: a large step holds millions
        held, inflight = held_levels(effects, order)
        peak_bytes.append(_peak(held))
        peak_count.append(_peak(inflight))
    return tuple(peak_bytes), tuple(peak_count)


def byte_peaks(effects: Sequence[Effect], orders: Iterable[Iterable[int]], /) -> tuple[int, ...]:
    """The bytes of :func:`rank_peaks` alone: per order (node ids into ``effects``), the
    most activation bytes held at once, each node's start effect then its end effect
    applied from nothing held. For a small table of effects read by many orders (the
    synthesizer's candidates, a generator's repeated blocks, the planner's bounds): it
    pairs each effect's two byte changes once and counts no micro-batches in flight, so
    it costs what a hand-written loop over the order would.

    >>> f, b = Effect(10, 1, 0, 0), Effect(0, 0, -10, -1)
    >>> byte_peaks([f, b], [[0, 1, 0, 1], [0, 0, 1, 1], []])
    (10, 20, 0)
    """
    changes = [(effect.start_bytes, effect.end_bytes) for effect in effects]
    return tuple(
        _peak(list(accumulate(chain.from_iterable([changes[node] for node in order]))))
        for order in orders
    )
