"""Run a pipesim Schedule in one process on a list of devices.

Every rank gets a device (several ranks may share one; ``cpu`` stands in for
as many ranks as you like). The executor walks one global order of the
schedule's work: a topological order of :func:`pipesim.graph.build_graph`'s
dependency graph, whose edges are each rank's own order, every data
dependency and the schedule's ``happens_before`` constraints, so each rank
runs its actions exactly in the Schedule's order and nothing runs before what
it needs. Ties are broken by (position in the rank's order, rank), which
steps the ranks in lock-step like a clock.

What each action does, following torch.distributed.pipelining's stage
semantics (``torch/distributed/pipelining/stage.py``, ``schedules.py``):

- ``F``: run the stage on its input (micro-batch ``k`` of the batch for stage
  0, else the previous stage's output moved to this device and detached into a
  fresh leaf, so each stage has its own autograd graph); the last stage also
  computes the micro-batch's loss. The output is sent (``.to(device)``) to the
  next stage's device right away.
- ``B``: backward through the stage from the loss (last stage) or from the
  gradient the next stage sent; parameter gradients accumulate in ``.grad``;
  the input gradient is sent back.
- ``I``: only the input gradient (``torch.autograd.grad`` w.r.t. the stage's
  input, keeping the graph); ``W``: only the parameter gradients
  (``torch.autograd.grad`` w.r.t. the parameters), added to ``.grad``.
- an :class:`~pipesim.actions.Overlap` runs its parts in order, timed as one.

With ``Schedule.n_copies > 1`` (DualPipe's two model copies) every copy is a
pipeline of its own: its first stage reads the input, its last computes the
loss, and activations never cross from one copy to the next.

After a stage's last backward (the ``n_microbatches``-th B or W) its
gradients are divided once by ``n_microbatches``: torch's ``scale_grads``
for a mean loss. Forward-only schedules run under ``torch.no_grad()``.

>>> import torch
>>> from pipesim.schedules import generate
>>> from verify.models import mlp
>>> from verify.partition import partition
>>> model = mlp()
>>> x, target = model.make_batch(8)
>>> run = run_schedule(generate("1f1b", n_ranks=2, n_microbatches=2),
...                    partition(model.layers, n_stages=2), devices=["cpu", "cpu"],
...                    inputs=x.tensor_split(2), targets=target.tensor_split(2),
...                    loss_fn=model.loss_fn)
>>> [str(w) for w in run.executed]
['0F0', '1F0', '0F1', '1B0', '0B0', '1F1', '1B1', '0B1']
>>> run.transfer_bytes
((1536, 1536),)
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import networkx as nx
import torch
from torch import Tensor, nn

from pipesim.actions import Action, Op, Work
from pipesim.graph import build_graph, validate
from pipesim.schedule import Schedule
from verify.errors import VerifyError

__all__ = [
    "ActionTiming",
    "LocalRun",
    "TransferTiming",
    "execution_order",
    "parse_devices",
    "run_schedule",
]


@dataclass(frozen=True, slots=True, kw_only=True)
class ActionTiming:
    """One unit of work as measured: nanoseconds from the start of the run."""

    rank: int
    work: Work
    start_ns: int
    end_ns: int


@dataclass(frozen=True, slots=True, kw_only=True)
class TransferTiming:
    """One activation or gradient moved between two ranks, as measured."""

    src_rank: int
    dst_rank: int
    producer: Action
    consumer: Action
    n_bytes: int
    start_ns: int
    end_ns: int


@dataclass(frozen=True, slots=True, kw_only=True, eq=False)
class LocalRun:
    """What one run of a schedule produced and how long each piece took."""

    schedule: Schedule
    executed: tuple[Work, ...]
    """The global order the work ran in."""
    outputs: tuple[Tensor, ...]
    """The last stage's output per micro-batch (detached)."""
    losses: tuple[Tensor, ...]
    """The loss per micro-batch (detached); empty without a loss function."""
    actions: tuple[ActionTiming, ...]
    transfers: tuple[TransferTiming, ...]
    """Messages between different ranks (same-rank hand-overs are not transfers)."""
    transfer_bytes: tuple[tuple[int, ...], ...]
    """Per stage boundary ``s -> s+1``, the activation bytes of each micro-batch
    (0 where a micro-batch does not cross it: another model copy's, or between copies)."""
    activation_bytes: tuple[int, ...]
    """Per stage, the most bytes of tensors saved for backward by one micro-batch's F."""
    accumulation_orders: tuple[tuple[int, ...], ...]
    """Per stage, the micro-batches in the order their parameter gradients were added."""
    wall_ns: int
    """Wall time of the whole run on the host."""


def parse_devices(text: str | Sequence[str], /, *, n_ranks: int) -> tuple[torch.device, ...]:
    """One device per rank from ``"cpu,cpu"`` / ``["cuda:0", "cuda:1"]``.

    A single device is used by every rank; ``None``-like empty input means the
    CUDA devices present (rank ``r`` on ``cuda:{r % count}``), else the CPU.

    >>> parse_devices("cpu", n_ranks=2)
    (device(type='cpu'), device(type='cpu'))
    """
    names = [t.strip() for t in text.split(",")] if isinstance(text, str) else list(text)
    names = [n for n in names if n]
    if not names:
        count = torch.cuda.device_count()
        if count:
            return tuple(torch.device(f"cuda:{r % count}") for r in range(n_ranks))
        return tuple(torch.device("cpu") for _ in range(n_ranks))
    if len(names) == 1:
        names = names * n_ranks
    if len(names) != n_ranks:
        raise VerifyError(
            f"got {len(names)} devices ({','.join(names)}) for {n_ranks} ranks; give one "
            "device, or exactly one per rank"
        )
    devices = []
    for name in names:
        try:
            device = torch.device(name)
        except (RuntimeError, ValueError):
            raise VerifyError(
                f"unknown device {name!r}; use cpu or cuda:N (e.g. --devices cuda:0,cuda:1)"
            ) from None
        if device.type == "cpu":
            device = torch.device("cpu")  # "cpu:1" names a rank; the memory is the same
        elif device.type == "cuda":
            count = torch.cuda.device_count()
            index = 0 if device.index is None else device.index
            if index >= count:
                present = ", ".join(f"cuda:{i}" for i in range(count)) or "none"
                raise VerifyError(
                    f"device {name!r} is not present (CUDA devices here: {present}); use one "
                    "of them or cpu"
                )
            device = torch.device("cuda", index)
        else:
            raise VerifyError(f"device {name!r} is not supported; use cpu or cuda:N")
        devices.append(device)
    return tuple(devices)


def execution_order(schedule: Schedule, /) -> tuple[Work, ...]:
    """The global order the executor runs ``schedule``'s work in (validates first).

    >>> from pipesim.schedules import generate
    >>> [str(w) for w in execution_order(generate("gpipe", n_ranks=2, n_microbatches=2))]
    ['0F0', '1F0', '0F1', '1F1', '1B0', '0B0', '1B1', '0B1']
    """
    validate(schedule)
    graph = build_graph(schedule)
    key: dict[Work, tuple[int, int]] = {}
    for rank, order in enumerate(schedule.orders):
        for position, work in enumerate(order):
            key[work] = (position, rank)
    return tuple(nx.lexicographical_topological_sort(graph, key=key.__getitem__))


class _Clock:
    """Nanoseconds since the run started: CUDA events on GPUs, perf_counter_ns on the CPU."""

    def __init__(self, devices: Sequence[torch.device]) -> None:
        self.cuda = sorted({d.index for d in devices if d.type == "cuda"})
        for index in self.cuda:
            torch.cuda.synchronize(index)
        self.host0 = time.perf_counter_ns()
        self.origin = {}
        for index in self.cuda:
            with torch.cuda.device(index):
                event = torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]
                event.record()
                self.origin[index] = event
        self.pending: list[tuple[Any, Any, Any, Callable[[int, int], None]]] = []

    def mark(self, device: torch.device) -> Any:
        if device.type == "cuda":
            with torch.cuda.device(device.index):
                event = torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]
                event.record()
                return event
        return time.perf_counter_ns() - self.host0

    def span(
        self, device: torch.device, start: Any, end: Any, done: Callable[[int, int], None]
    ) -> None:
        """Report (start_ns, end_ns) to ``done`` now (CPU) or after the final sync (CUDA)."""
        if device.type == "cuda":
            self.pending.append((self.origin[device.index], start, end, done))
        else:
            done(start, end)

    def finish(self) -> None:
        for index in self.cuda:
            torch.cuda.synchronize(index)
        for origin, start, end, done in self.pending:
            done(round(origin.elapsed_time(start) * 1e6), round(origin.elapsed_time(end) * 1e6))


class _SavedBytes:
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
        return tensor

    @staticmethod
    def unpack(tensor: Tensor) -> Tensor:
        return tensor


def run_schedule(
    schedule: Schedule,
    stages: Sequence[nn.Module],
    /,
    *,
    devices: Sequence[torch.device | str],
    inputs: Sequence[Tensor],
    targets: Sequence[Tensor] | None = None,
    loss_fn: Callable[[Tensor, Tensor], Tensor] | None = None,
) -> LocalRun:
    """Run one step of ``schedule`` with ``stages`` (one module per stage) on ``devices``
    (one per rank); ``inputs`` and ``targets`` are the micro-batches.

    Each stage module is moved to its rank's device (in place: stages that
    share modules with a model move that model's modules). Existing ``.grad``
    of the stages' parameters are cleared first, as ``zero_grad(set_to_none=True)``.
    Training schedules need ``targets`` and ``loss_fn``.
    """
    order = execution_order(schedule)
    n_mb = schedule.n_microbatches
    n_stages = schedule.n_stages
    training = not schedule.forward_only
    if len(stages) != n_stages:
        raise VerifyError(
            f"the schedule has {n_stages} stages but {len(stages)} stage modules were given; "
            f"partition the model into {n_stages} stages"
        )
    if len(devices) != schedule.n_ranks:
        raise VerifyError(f"{len(devices)} devices for {schedule.n_ranks} ranks; give one per rank")
    if len(inputs) != n_mb:
        raise VerifyError(f"{len(inputs)} input micro-batches for n_microbatches={n_mb}")
    if training and (targets is None or loss_fn is None):
        raise VerifyError("a training schedule needs targets and a loss function")
    if targets is not None and len(targets) != n_mb:
        raise VerifyError(f"{len(targets)} target micro-batches for n_microbatches={n_mb}")
    rank_device = tuple(torch.device(d) for d in devices)
    stage_device = tuple(rank_device[schedule.rank_of(s)] for s in range(n_stages))
    for stage, module in enumerate(stages):
        module.to(stage_device[stage])
        for p in module.parameters():
            p.grad = None
    params = [[p for p in m.parameters() if p.requires_grad] for m in stages]
    param_storage = [{p.untyped_storage().data_ptr() for p in m.parameters()} for m in stages]
    # Schedule.n_copies: the stages form independent model copies (DualPipe keeps two);
    # a copy's first stage reads the input and its last computes the loss.
    per_copy = n_stages // schedule.n_copies
    mbs_per_copy = n_mb // schedule.n_copies

    def is_first(stage: int) -> bool:
        return stage % per_copy == 0

    def is_last(stage: int) -> bool:
        return stage % per_copy == per_copy - 1

    stage_in: dict[tuple[int, int], Tensor] = {}  # (stage, mb) -> input (a leaf when training)
    stage_root: dict[tuple[int, int], Tensor] = {}  # output, or the loss on the last stage
    grad_in: dict[tuple[int, int], Tensor | None] = {}  # gradient w.r.t. stage_root
    act_inbox: dict[tuple[int, int], Tensor] = {}
    grad_inbox: dict[tuple[int, int], Tensor] = {}
    outputs: list[Tensor | None] = [None] * n_mb
    losses: list[Tensor | None] = [None] * n_mb
    transfer_bytes = [[0] * n_mb for _ in range(n_stages - 1)]
    activation_bytes = [0] * n_stages
    accumulated: list[list[int]] = [[] for _ in range(n_stages)]
    action_times: list[ActionTiming] = []
    transfer_times: list[TransferTiming] = []
    clock = _Clock(rank_device)

    def send(
        producer: Action, consumer: Action, tensor: Tensor, box: dict[tuple[int, int], Tensor]
    ) -> None:
        src, dst = schedule.rank_of(producer.stage), schedule.rank_of(consumer.stage)
        n_bytes = tensor.numel() * tensor.element_size()
        if producer.op is Op.F:
            transfer_bytes[producer.stage][producer.microbatch] = n_bytes
        start = clock.mark(rank_device[src])
        box[(consumer.stage, consumer.microbatch)] = tensor.detach().to(
            stage_device[consumer.stage]
        )
        end = clock.mark(rank_device[src])
        if src != dst:

            def done(start_ns: int, end_ns: int) -> None:
                transfer_times.append(
                    TransferTiming(
                        src_rank=src,
                        dst_rank=dst,
                        producer=producer,
                        consumer=consumer,
                        n_bytes=n_bytes,
                        start_ns=start_ns,
                        end_ns=end_ns,
                    )
                )

            clock.span(rank_device[src], start, end, done)

    def forward(a: Action) -> None:
        s, mb = a.stage, a.microbatch
        device = stage_device[s]
        if is_first(s):
            x = inputs[mb].to(device)
        else:
            x = act_inbox.pop((s, mb))
            if training and x.is_floating_point():
                x = x.detach().requires_grad_(True)
        if training:
            hook = _SavedBytes(param_storage[s])
            with torch.autograd.graph.saved_tensors_hooks(hook.pack, hook.unpack):
                out = stages[s](x)
            activation_bytes[s] = max(activation_bytes[s], hook.total)
        else:
            with torch.no_grad():
                out = stages[s](x)
        root = out
        if is_last(s):
            outputs[mb] = out.detach()
            if loss_fn is not None and targets is not None:
                with torch.set_grad_enabled(training):
                    loss = loss_fn(out, targets[mb].to(device))
                losses[mb] = loss.detach()
                root = loss
        else:
            send(a, Action(stage=s + 1, op=Op.F, microbatch=mb), out, act_inbox)
        if training:
            stage_in[(s, mb)] = x
            stage_root[(s, mb)] = root

    def incoming_grad(s: int, mb: int) -> Tensor | None:
        return None if is_last(s) else grad_inbox.pop((s, mb))

    def send_input_grad(a: Action, x: Tensor, grad: Tensor | None) -> None:
        s, mb = a.stage, a.microbatch
        if is_first(s):
            return
        if grad is None:  # the output does not depend on the input: the gradient is zero
            grad = torch.zeros_like(x)
        consumer = schedule_backward_consumer(s - 1, mb)
        send(a, consumer, grad, grad_inbox)

    present = set(schedule.actions())

    def schedule_backward_consumer(stage: int, mb: int) -> Action:
        full = Action(stage=stage, op=Op.B, microbatch=mb)
        return full if full in present else Action(stage=stage, op=Op.I, microbatch=mb)

    def after_weight_grads(s: int, mb: int) -> None:
        accumulated[s].append(mb)
        # torch's scale_grads: once, after the stage's last backward, by the step's
        # micro-batch count (each copy's share then adds up to the mean over the step).
        if len(accumulated[s]) == mbs_per_copy:
            for p in params[s]:
                if p.grad is not None:
                    p.grad.div_(n_mb)

    def backward(a: Action) -> None:
        s, mb = a.stage, a.microbatch
        root = stage_root.pop((s, mb))
        x = stage_in.pop((s, mb))
        grad = incoming_grad(s, mb)
        if root.requires_grad:
            torch.autograd.backward(root, grad_tensors=grad)
        send_input_grad(a, x, x.grad)
        after_weight_grads(s, mb)

    def input_grad(a: Action) -> None:
        s, mb = a.stage, a.microbatch
        root = stage_root[(s, mb)]
        grad = incoming_grad(s, mb)
        grad_in[(s, mb)] = grad
        if not is_first(s):
            x = stage_in[(s, mb)]
            gx = None
            if root.requires_grad and x.requires_grad:
                (gx,) = torch.autograd.grad(
                    root, x, grad_outputs=grad, retain_graph=True, allow_unused=True
                )
            send_input_grad(a, x, gx)

    def weight_grad(a: Action) -> None:
        s, mb = a.stage, a.microbatch
        root = stage_root.pop((s, mb))
        stage_in.pop((s, mb))
        grad = grad_in.pop((s, mb))
        if root.requires_grad and params[s]:
            grads = torch.autograd.grad(root, params[s], grad_outputs=grad, allow_unused=True)
            for p, g in zip(params[s], grads, strict=True):
                if g is None:
                    continue
                if p.grad is None:
                    p.grad = g.detach()
                else:
                    p.grad.add_(g)  # AccumulateGrad's elementwise add: the same bits
        after_weight_grads(s, mb)

    run_op = {Op.F: forward, Op.B: backward, Op.I: input_grad, Op.W: weight_grad}
    host_start = time.perf_counter_ns()
    for work in order:
        rank = schedule.rank_of(work.parts[0].stage)
        device = rank_device[rank]
        start = clock.mark(device)
        for action in work.parts:
            run_op[action.op](action)
        end = clock.mark(device)

        def done(start_ns: int, end_ns: int, rank: int = rank, work: Work = work) -> None:
            action_times.append(
                ActionTiming(rank=rank, work=work, start_ns=start_ns, end_ns=end_ns)
            )

        clock.span(device, start, end, done)
    clock.finish()
    wall_ns = time.perf_counter_ns() - host_start
    if any(o is None for o in outputs):
        raise VerifyError("the schedule did not run the last stage's forward of every micro-batch")
    action_times.sort(key=lambda t: (t.start_ns, t.rank))
    transfer_times.sort(key=lambda t: (t.start_ns, t.src_rank))
    return LocalRun(
        schedule=schedule,
        executed=order,
        outputs=tuple(o for o in outputs if o is not None),
        losses=tuple(loss for loss in losses if loss is not None),
        actions=tuple(action_times),
        transfers=tuple(transfer_times),
        transfer_bytes=tuple(tuple(row) for row in transfer_bytes),
        activation_bytes=tuple(activation_bytes),
        accumulation_orders=tuple(tuple(a) for a in accumulated),
        wall_ns=wall_ns,
    )
