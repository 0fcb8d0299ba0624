"""What each action does to a stage: the one place verify's F, B, I, W semantics live.

:mod:`verify.local` (every rank in one process) and :mod:`verify.dist` (one
process per rank) are drivers over :class:`StageRuntime`: they decide *when*
an action runs and *how* its input arrives and its output leaves; the runtime
decides what the action computes. The semantics follow
torch.distributed.pipelining's stages (``torch/distributed/pipelining/stage.py``,
``schedules.py``):

- ``F``: run the stage on its input (micro-batch ``k`` for a model copy's first
  stage, else the previous stage's output detached into a fresh leaf, so each
  stage has its own autograd graph); a copy's last stage also computes the
  micro-batch's loss. Returns the output for the next stage.
- ``B``: backward from the loss (last stage) or from the gradient the next
  stage sent; parameter gradients accumulate in ``.grad``; returns the input
  gradient for the previous stage (zeros when the output does not depend on
  the input).
- ``I``: only the input gradient, saving the gradients that reach the graph's
  weight-owning nodes; ``W``: only the parameter gradients, from those saved
  gradients without walking the input path again (:mod:`verify.split_backward`,
  torch's ``stage_backward_input`` / ``stage_backward_weight``), added to
  ``.grad`` (AccumulateGrad's elementwise add: the same bits as B's accumulation).
- An :class:`~pipesim.actions.Overlap` runs its parts in order.

Gradients accumulate in the order the schedule runs a stage's B (or W); after
a stage's last one they are divided once by the step's micro-batch count,
torch's ``scale_grads`` for a mean loss. With ``Schedule.n_copies > 1``
(DualPipe) each copy is a pipeline of its own. A forward-only schedule runs
under ``torch.no_grad()``.

>>> import torch
>>> from pipesim.schedules import generate
>>> from verify.models import mlp
>>> from verify.stage_cut import cut_stages
>>> model = mlp()
>>> x, t = model.make_batch(4)
>>> schedule = generate("gpipe", n_ranks=1, n_microbatches=1)
>>> rt = StageRuntime(schedule, dict(enumerate(cut_stages(model.layers, n_stages=1))),
...                   devices={0: torch.device("cpu")}, inputs=(x,), targets=(t,),
...                   loss_fn=model.loss_fn)
>>> from pipesim.actions import parse_action
>>> rt.run(parse_action("0F0"), None) is None, rt.run(parse_action("0B0"), None) is None
(True, True)
>>> rt.accumulated, float(rt.losses[0]) > 0
({0: [0]}, True)
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path

import torch
from torch import Tensor, nn

from pipesim.actions import Action, Op
from pipesim.schedule import Schedule
from pipesim.step.structure import StepStructure, step_structure
from verify.errors import VerifyError
from verify.split_backward import PendingWeights, input_backward, weight_backward

__all__ = ["PROFILE_ENV", "SavedBytes", "StageRuntime", "profiled"]

PROFILE_ENV = "PIPESIM_PROFILE_DIR"
"""Set to a directory, the rank processes of ``verify --dist`` (and torchrun) profile
their measured step with torch.profiler and write ``rank{N}.json`` there."""


@contextmanager
def profiled(rank: int, /, *, measured: bool) -> Iterator[None]:
    """The block under torch.profiler (CPU activities) when it is the ``measured`` step
    and ``$PIPESIM_PROFILE_DIR`` names a directory; its Chrome trace goes to
    ``rank{rank}.json`` there (what ``pipesim calibrate --from-trace`` reads)."""
    folder = os.environ.get(PROFILE_ENV)
    if not measured or not folder:
        yield
        return
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU]) as prof:
        yield
    Path(folder).mkdir(parents=True, exist_ok=True)
    prof.export_chrome_trace(str(Path(folder) / f"rank{rank}.json"))


class SavedBytes:
    """A saved-tensor hook that sums the bytes autograd keeps for backward, parameters excluded."""

    def __init__(self, params: set[int]) -> None:
        self.params = params
        self.seen: set[tuple[int, int]] = set()
        self.total = 0

    def pack(self, tensor: Tensor) -> Tensor:
        if tensor.device.type != "meta":
            key = (tensor.data_ptr(), tensor.numel())
            storage = tensor.untyped_storage().data_ptr()
            if storage not in self.params and key not in self.seen:
                self.seen.add(key)
                self.total += tensor.numel() * tensor.element_size()
        # Detached: the tensor handed in still carries its grad_fn, and where it is that
        # node's own output (softmax, exp) the node would hold itself through it, a cycle
        # through C++ that no gc.collect() frees once a graph outlives its backward
        # (retain_graph=True, as I and W do). It leaked every split stage's activations
        # each step, and the heap's growth made each W fault in fresh pages and run slow
        # (docs/fidelity.md, "Two harness faults"). Lossless: unpacking restores
        # the grad_fn. pytorch/pytorch#115255, #153049 (torch's docs now say the same).
        return tensor.detach()

    @staticmethod
    def unpack(tensor: Tensor) -> Tensor:
        return tensor


class StageRuntime:
    """The stages one process holds and their state through one step.

    ``stages`` maps stage index -> module (the stages held here), ``devices``
    stage index -> its device. ``inputs`` / ``targets`` are the step's
    micro-batches. Existing ``.grad`` of the stages' parameters are cleared.
    After the step: ``outputs`` and ``losses`` per micro-batch (held by the
    last stages here), ``activation_bytes`` per stage, ``transfer_bytes`` per
    (stage, micro-batch) output handed on, ``accumulated`` per stage the
    micro-batches in the order their weight gradients were added,
    ``peak_weight_pending_bytes`` per stage the most gradient bytes held at once
    between I and W; with ``trace_grads``, ``grad_trace`` per stage the gradients
    after each B or W. ``structure`` is ``step_structure(schedule)`` when a driver that
    runs many steps has it already.
    """

    def __init__(
        self,
        schedule: Schedule,
        stages: Mapping[int, nn.Module],
        /,
        *,
        devices: Mapping[int, torch.device],
        inputs: Sequence[Tensor],
        targets: Sequence[Tensor] | None,
        loss_fn: Callable[[Tensor, Tensor], Tensor] | None,
        trace_grads: bool = False,
        structure: StepStructure | None = None,
    ) -> None:
        self.training = not schedule.forward_only
        self.trace_grads = trace_grads
        if self.training and (targets is None or loss_fn is None):
            raise VerifyError("a training schedule needs targets and a loss function")
        self.stages, self.devices = stages, devices
        self.inputs, self.targets, self.loss_fn = inputs, targets, loss_fn
        self.n_microbatches = schedule.n_microbatches
        # Schedule.n_copies: the stages form independent model copies (DualPipe keeps two);
        # which stage reads the input and which computes the loss is
        # pipesim.step.dependencies' rule.
        self.structure = step_structure(schedule) if structure is None else structure
        self.mbs_per_copy = schedule.n_microbatches // schedule.n_copies
        self.params = {s: [p for p in m.parameters() if p.requires_grad] for s, m in stages.items()}
        self.param_storage = {
            s: {p.untyped_storage().data_ptr() for p in m.parameters()} for s, m in stages.items()
        }
        for module in stages.values():
            for p in module.parameters():
                p.grad = None
        self.stage_in: dict[tuple[int, int], Tensor] = {}
        self.stage_root: dict[tuple[int, int], Tensor] = {}  # output, or the loss
        # What each I leaves for its W (verify.split_backward), and the bytes of the
        # gradients it holds: now and the most at once, per stage.
        self.pending: dict[tuple[int, int], PendingWeights] = {}
        self.weight_pending_bytes: dict[int, int] = {s: 0 for s in stages}
        self.peak_weight_pending_bytes: dict[int, int] = {s: 0 for s in stages}
        self.outputs: dict[int, Tensor] = {}
        self.losses: dict[int, Tensor] = {}
        self.activation_bytes: dict[int, int] = {s: 0 for s in stages}
        self.transfer_bytes: dict[tuple[int, int], int] = {}
        self.accumulated: dict[int, list[int]] = {s: [] for s in stages}
        # With trace_grads: per stage, after each B or W, the action and a CPU copy of every
        # parameter's .grad so far (before the final division), to find where a wrong
        # gradient arose (verify.compare.first_gradient_difference).
        self.grad_trace: dict[int, list[tuple[str, tuple[Tensor | None, ...]]]] = {
            s: [] for s in stages
        }

    def is_first(self, stage: int) -> bool:
        """A model copy's first stage: reads the input, sends no input gradient."""
        return self.structure.reads_input(stage)

    def is_last(self, stage: int) -> bool:
        """A model copy's last stage: computes the loss, sends no activation."""
        return self.structure.computes_loss(stage)

    def run(self, action: Action, incoming: Tensor | None, /) -> Tensor | None:
        """Run ``action`` with the tensor another stage handed it (activation for F,
        gradient for B / I; None where none comes); return what it hands on. Under a
        profiler the action is a ``record_function`` range named as the action (``0F3``),
        which :mod:`pipesim.kineto` reads; without one nothing is recorded."""
        if torch.autograd.profiler._is_profiler_enabled:
            with torch.profiler.record_function(str(action)):
                return self._run(action, incoming)
        return self._run(action, incoming)

    def _run(self, action: Action, incoming: Tensor | None, /) -> Tensor | None:
        if action.op is Op.F:
            return self._forward(action, incoming)
        if action.op is Op.B:
            return self._backward(action, incoming)
        if action.op is Op.I:
            return self._input_grad(action, incoming)
        self._weight_grad(action)
        return None

    def _forward(self, a: Action, incoming: Tensor | None) -> Tensor | None:
        s, mb = a.stage, a.microbatch
        device = self.devices[s]
        if self.is_first(s):
            x = self.inputs[mb].to(device)
        elif incoming is None:
            raise VerifyError(f"{a} ran without the activation of stage {s - 1}")
        else:
            x = incoming
            if self.training and x.is_floating_point():
                x = x.detach().requires_grad_(True)
        if self.training:
            hook = SavedBytes(self.param_storage[s])
            with torch.autograd.graph.saved_tensors_hooks(hook.pack, hook.unpack):
                out = self.stages[s](x)  # (microbatch, ...)
            self.activation_bytes[s] = max(self.activation_bytes[s], hook.total)
        else:
            with torch.no_grad():
                out = self.stages[s](x)
        root, handed = out, None
        if self.is_last(s):
            self.outputs[mb] = out.detach()
            if self.loss_fn is not None and self.targets is not None:
                with torch.set_grad_enabled(self.training):
                    loss = self.loss_fn(out, self.targets[mb].to(device))
                self.losses[mb] = loss.detach()
                root = loss
        else:
            handed = out.detach()
            self.transfer_bytes[(s, mb)] = handed.numel() * handed.element_size()
        if self.training:
            self.stage_in[(s, mb)] = x
            self.stage_root[(s, mb)] = root
        return handed

    def _input_gradient(self, s: int, x: Tensor, grad: Tensor | None) -> Tensor | None:
        if self.is_first(s):
            return None
        # The output does not depend on the input: the gradient is zero.
        return torch.zeros_like(x) if grad is None else grad.detach()

    def _backward(self, a: Action, grad: Tensor | None) -> Tensor | None:
        s, mb = a.stage, a.microbatch
        root, x = self.stage_root.pop((s, mb)), self.stage_in.pop((s, mb))
        if root.requires_grad:
            torch.autograd.backward(root, grad_tensors=grad)
        handed = self._input_gradient(s, x, x.grad)
        self._weights_done(a)
        return handed

    def _input_grad(self, a: Action, grad: Tensor | None) -> Tensor | None:
        s, mb = a.stage, a.microbatch
        x = self.stage_in.pop((s, mb))
        gx, pending = input_backward(self.stage_root.pop((s, mb)), grad, x, self.params[s])
        self.pending[(s, mb)] = pending
        self.weight_pending_bytes[s] += pending.saved_bytes
        self.peak_weight_pending_bytes[s] = max(
            self.peak_weight_pending_bytes[s], self.weight_pending_bytes[s]
        )
        return self._input_gradient(s, x, gx)

    def _weight_grad(self, a: Action) -> None:
        s, mb = a.stage, a.microbatch
        pending = self.pending.pop((s, mb))
        self.weight_pending_bytes[s] -= pending.saved_bytes
        for p, g in zip(pending.params, weight_backward(pending), strict=True):
            if g is None:
                continue
            if p.grad is None:
                p.grad = g.detach()
            else:
                p.grad.add_(g)  # AccumulateGrad's elementwise add: the same bits
        self._weights_done(a)

    def _weights_done(self, a: Action) -> None:
        s = a.stage
        done = self.accumulated[s]
        done.append(a.microbatch)
        if self.trace_grads:
            grads = tuple(
                None if p.grad is None else p.grad.detach().cpu().clone()
                for p in self.stages[s].parameters()
            )
            self.grad_trace[s].append((str(a), grads))
        # torch's scale_grads: once, after the stage's last backward, by the step's
        # micro-batch count (each copy's share then adds up to the mean over the step).
        if len(done) == self.mbs_per_copy:
            for p in self.params[s]:
                if p.grad is not None:
                    p.grad.div_(self.n_microbatches)
