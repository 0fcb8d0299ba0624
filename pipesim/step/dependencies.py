"""The dependency rules of a pipeline step: which work waits for which.

torch.distributed.pipelining's stage semantics: F of stage s needs F of stage s-1
(same micro-batch); B or I of stage s needs F of stage s (its saved activations)
and, below the last stage, the input gradient of stage s+1 (its B or I); W of
stage s needs I of stage s. With ``Schedule.n_copies > 1`` "s-1" and "s+1" stay
inside one model copy: a copy's first stage reads the input, its last computes the
loss. Every evaluator, view and executor reads these three functions (through
:mod:`pipesim.step.wiring`, :mod:`pipesim.step.cost_tables` or directly); none restates them.

>>> prerequisites(1, Op.B, 0, per_copy=2)  # the last stage: only its own forward
((1, <Op.F: 'F'>, 0),)
"""

from __future__ import annotations

from pipesim.actions import Op

__all__ = ["forward_source", "gradient_source", "prerequisites"]

_Key = tuple[int, Op, int]
_F, _B, _I, _W = Op.F, Op.B, Op.I, Op.W


def forward_source(stage: int, /, *, per_copy: int) -> int | None:
    """The stage whose output F of ``stage`` reads; None for a copy's first stage
    (it reads the input micro-batch).

    >>> forward_source(0, per_copy=4), forward_source(5, per_copy=4), forward_source(4, per_copy=4)
    (None, 4, None)
    """
    return stage - 1 if stage % per_copy else None


def gradient_source(stage: int, /, *, per_copy: int) -> int | None:
    """The stage whose input gradient B or I of ``stage`` reads; None for a copy's last
    stage (it computes the loss).

    >>> gradient_source(2, per_copy=4), gradient_source(3, per_copy=4)
    (3, None)
    """
    return stage + 1 if (stage + 1) % per_copy else None


def prerequisites(stage: int, op: Op, microbatch: int, /, *, per_copy: int) -> tuple[_Key, ...]:
    """The actions ``(stage, op, microbatch)`` waits for, as ``(stage, op, microbatch)``
    keys; a gradient is named both as B and I of the next stage (a schedule runs one).

    >>> prerequisites(1, Op.I, 0, per_copy=3)
    ((1, <Op.F: 'F'>, 0), (2, <Op.B: 'B'>, 0), (2, <Op.I: 'I'>, 0))
    """
    if op is _F:
        source = forward_source(stage, per_copy=per_copy)
        return () if source is None else ((source, _F, microbatch),)
    if op is _W:
        return ((stage, _I, microbatch),)
    grad = gradient_source(stage, per_copy=per_copy)
    if grad is None:
        return ((stage, _F, microbatch),)
    return ((stage, _F, microbatch), (grad, _B, microbatch), (grad, _I, microbatch))
