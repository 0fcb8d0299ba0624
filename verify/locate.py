"""Where a wrong gradient arose: the first B or W after which a stage's gradients differ.

A stage's final gradient is the sum of its micro-batches' gradients, added in the order
the schedule runs its B (or W) actions, then divided once (:mod:`verify.compare`). When
the final gradient differs, the report alone can only say which actions added to it. A
run that keeps every parameter's gradient after each B and W
(``run_schedule(..., trace_grads=True)``, ``LocalRun.grad_trace``) can be checked step
by step against the unsplit model's per-micro-batch gradients added in the same order:
the first partial sum that differs names the action that made the difference. Across
stages, the earliest such action in the executor's global order
(:func:`pipesim.comms.global_order`) is the first. The executors trace only on request
(the copies cost a step's gradients per micro-batch), so the check re-runs the step
after a gradient mismatch.

A gradient that was already wrong when it arrived (a wrong input gradient from the next
stage) shows up at the B or W that used it: the action named is where the difference
entered this stage's parameters.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor, nn

from pipesim.actions import Action, parse_action
from pipesim.comms import global_order
from verify.local import LocalRun

__all__ = ["first_gradient_difference", "max_abs_diff", "twin"]


def first_gradient_difference(
    run: LocalRun,
    /,
    *,
    layers: nn.Module,
    stages: Sequence[nn.Module],
    reference_grads: Sequence[Sequence[Tensor | None]],
    orders: Sequence[Sequence[int]],
) -> str | None:
    """The first action after which a stage's gradient differs from the reference's
    partial sum, the parameter and the largest difference; None when every partial sum
    of ``run.grad_trace`` is equal (or nothing was traced).

    ``reference_grads[k][i]``: parameter ``i`` of ``layers`` from micro-batch ``k`` alone
    (``Reference.grads``); ``orders[s]``: the micro-batches in the order stage ``s`` adds
    them.
    """
    schedule = run.schedule
    position = {str(a): i for i, work in enumerate(global_order(schedule)) for a in work.parts}
    per_copy = schedule.n_stages // schedule.n_copies
    named = list(layers.named_parameters())
    index_of = {id(p): i for i, (_, p) in enumerate(named)}
    found: list[tuple[int, str]] = []
    for s, trace in enumerate(run.grad_trace):
        model_index = [index_of.get(id(p)) for p in twin(stages, s, per_copy=per_copy).parameters()]
        totals: dict[int, Tensor] = {}
        for (action, grads), k in zip(trace, orders[s], strict=False):
            difference = _first_difference(grads, model_index, totals, reference_grads[k])
            if difference is not None:
                i, diff = difference
                ran = parse_action(action)  # one B or W: an Action
                added = ran.microbatch if isinstance(ran, Action) else k
                due = "" if added == k else f"; micro-batch {k} was due"
                found.append(
                    (
                        position.get(action, len(position)),
                        f"gradients first differ after {action} (stage {s}{due}): "
                        f"gradient of {named[i][0]} (max abs diff {diff:.3g})",
                    )
                )
                break
    return min(found)[1] if found else None


def _first_difference(
    grads: Sequence[Tensor | None],
    model_index: Sequence[int | None],
    totals: dict[int, Tensor],
    added: Sequence[Tensor | None],
) -> tuple[int, float] | None:
    """Add one micro-batch's reference gradients to ``totals`` (as ``.grad`` accumulates)
    and compare the traced gradients with them: the first differing parameter, if any."""
    first = None
    for grad, i in zip(grads, model_index, strict=True):
        if i is None:
            continue
        g = added[i]
        if g is not None:
            total = totals.get(i)
            totals[i] = g.detach().cpu().clone() if total is None else total.add_(g.cpu())
        expected = totals.get(i)
        if first is not None or (grad is None and expected is None):
            continue
        if grad is None or expected is None:
            first = (i, float("inf"))
        elif grad.shape != expected.shape or not torch.equal(grad, expected):
            first = (i, max_abs_diff(grad, expected))
    return first


def twin(stages: Sequence[nn.Module], stage: int, /, *, per_copy: int) -> nn.Module:
    """The stage of model copy 0 that ``stage`` matches position by position: itself, or
    for a stage of copy c > 0 (DualPipe's second copy) the copy-0 stage whose modules the
    model shares; ``per_copy`` stages make one copy.

    >>> stages = [nn.Linear(2, 2) for _ in range(4)]  # two copies of two stages
    >>> twin(stages, 3, per_copy=2) is stages[1], twin(stages, 1, per_copy=2) is stages[1]
    (True, True)
    """
    return stages[stage % per_copy]


def max_abs_diff(a: Tensor, b: Tensor, /) -> float:
    """The largest elementwise difference of two tensors (on the CPU, in float64); inf when
    their shapes differ.

    >>> max_abs_diff(torch.tensor([1.0, 2.0]), torch.tensor([1.0, 2.5]))
    0.5
    """
    if a.shape != b.shape:
        return float("inf")
    if a.numel() == 0:
        return 0.0
    return float((a.detach().double().cpu() - b.detach().double().cpu()).abs().max())
