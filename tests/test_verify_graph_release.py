"""A step's autograd graphs are freed when the step is: nothing it saved outlives it.

Why: the runtime's saved-tensor hook (verify.runtime.SavedBytes, which sums the bytes
autograd keeps) once returned the live tensor it was handed. Where that tensor is its
own node's output (exp, softmax), the node then held itself through it: a cycle through
C++ that gc.collect() cannot free once a graph outlives its backward, as the split
backward's I and W graphs do (retain_graph=True). Every zero-bubble step leaked its
split stages' activations. The oracle is Python's reference counting: a weak reference
to a tensor the step saved must be dead once the step's objects are gone.
"""

from __future__ import annotations

import gc
import weakref
from collections.abc import Iterator
from contextlib import contextmanager

import pytest
import torch
from torch import Tensor, nn
from torch.autograd.graph import saved_tensors_hooks

from pipesim.schedules import generate
from verify.local import run_schedule
from verify.models import gpt
from verify.runtime import SavedBytes
from verify.stage_cut import cut_stages


@pytest.mark.slow
def test_a_saved_output_dies_with_its_graph_after_a_retained_backward() -> None:
    x = torch.randn(5, requires_grad=True)
    hook = SavedBytes(set())
    with saved_tensors_hooks(hook.pack, hook.unpack):
        y = x.exp()  # exp saves its own output for backward
    assert hook.total == 5 * 4  # the one saved tensor, 5 float32
    (gx,) = torch.autograd.grad(y.sum(), x, retain_graph=True)
    assert torch.equal(gx, y.detach())  # d exp(x) / dx = exp(x): the graph still works
    alive = weakref.ref(y)
    del y, gx
    gc.collect()
    assert alive() is None


@contextmanager
def _outputs_of_every_module(stages: list[nn.Module]) -> Iterator[list[weakref.ref[Tensor]]]:
    """Weak references to the output of every module of ``stages`` run inside."""
    refs: list[weakref.ref[Tensor]] = []

    def keep(_: nn.Module, __: object, out: object) -> None:
        if isinstance(out, Tensor):
            refs.append(weakref.ref(out))

    handles = [m.register_forward_hook(keep) for s in stages for m in s.modules()]
    try:
        yield refs
    finally:
        for h in handles:
            h.remove()


@pytest.mark.slow
@pytest.mark.parametrize("name", ["zb-h1", "1f1b", "gpipe"])
def test_no_tensor_of_a_step_outlives_it(name: str) -> None:
    model = gpt(n_layers=2, width=32)  # attention softmax saves its own output
    schedule = generate(name, n_ranks=2, n_microbatches=4)
    stages = list(cut_stages(model.layers, n_stages=schedule.n_stages))
    x, t = model.make_batch(8)
    with _outputs_of_every_module(stages) as refs:
        run = run_schedule(
            schedule,
            stages,
            devices=["cpu", "cpu"],
            inputs=tuple(x.chunk(4)),
            targets=tuple(t.chunk(4)),
            loss_fn=model.loss_fn,
        )
    n_modules = sum(1 for s in stages for _ in s.modules())
    assert len(refs) == 4 * n_modules  # every module's output of every micro-batch seen
    del run
    gc.collect()
    assert [r for r in refs if r() is not None] == []
