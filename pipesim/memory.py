"""The memory model, written once: what each action allocates when it starts and
frees when it ends, per rank, in activation bytes and stage-micro-batches in flight.

Per stage ``s`` and micro-batch (see :class:`~pipesim.costs.StageCost`):

- ``F`` allocates the stage's ``activation_bytes`` when it starts; the
  stage-micro-batch is then *in flight*;
- a full backward ``B`` frees all of them when it ends, and the micro-batch
  leaves flight;
- a split backward frees ``activation_bytes - weight_grad_bytes`` when ``I`` ends and
  the rest (what W still needs) when ``W`` ends (Qi et al., "Zero Bubble Pipeline
  Parallelism", ICLR 2024, section 2). The micro-batch stays in flight from its first
  forward until its last backward op, ``B`` or ``W``, ends, whatever bytes it holds;
- in a forward-only (inference) step no backward needs the activations, so F
  frees its own when it ends.

An :class:`~pipesim.actions.Overlap` has the summed effects of its parts. The
SimPy engine, the planner's evaluators and the compiled step
(:mod:`pipesim.step`) all read these tables; no other module restates them.

>>> from pipesim.costs import StageCost
>>> table = op_effects(StageCost(activation_bytes=10, weight_grad_bytes=4), forward_only=False)
>>> table[0], table[2], table[3]  # F, I, W: (bytes, count) at start, then at end
(Effect(start_bytes=10, start_count=1, end_bytes=0, end_count=0), \
Effect(start_bytes=0, start_count=0, end_bytes=-6, end_count=0), \
Effect(start_bytes=0, start_count=0, end_bytes=-4, end_count=-1))
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

from pipesim.actions import OP_INDEX, Work
from pipesim.costs import CostModel, StageCost

__all__ = ["NO_EFFECT", "Effect", "op_effects", "stage_effects", "work_effect"]


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
    input_grad = Effect(0, 0, kept - act, 0)
    weight_grad = Effect(0, 0, -kept, -1)
    return forward, full, input_grad, weight_grad


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
