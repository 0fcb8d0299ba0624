"""Run a Schedule with torch.distributed: one process per rank, gloo on the CPU.

Each rank is a process of its own (``torch.multiprocessing`` spawn, a file
rendezvous in a temporary directory) that rebuilds the model from its name
(``mlp``, ``gpt`` or ``package.module:factory``, the same seed, so the same
bits), keeps only its own stages, and runs its order from the Schedule:
activations and gradients go point to point (``isend`` / ``recv``, tagged by
kind, stage and micro-batch, so messages between two ranks can be taken in any
order). A hand-over between two stages of one rank stays in the process.

Unlike :mod:`verify.local`, the ranks really run at the same time, so the
measured step is comparable with pipesim's prediction for one device per rank.
Each rank times its work (compute only, not the wait for messages) with
``time.perf_counter_ns``; the monotonic clock is shared by every process of a
machine, so the ranks' timelines line up.

Everything has a deadline: the process group's timeout bounds every message,
and the launcher kills the ranks when ``timeout_s`` has passed.

Scope of this version: CPU ranks on one machine with gloo; NCCL on GPUs is not
implemented yet (use :func:`verify.compare.verify` with ``cuda:N`` devices).

>>> from pipesim.schedules import generate
>>> report = verify_distributed(generate("1f1b", n_ranks=2, n_microbatches=2), model="mlp")
>>> report.bit_identical, report.devices
(True, ('cpu', 'cpu'))
"""

from __future__ import annotations

import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor, nn
from torch.multiprocessing.spawn import (
    ProcessExitedException,
    ProcessRaisedException,
    start_processes,
)

from pipesim.actions import Action, Op, parse_action
from pipesim.graph import validate
from pipesim.schedule import Schedule
from pipesim.schedule_io import schedule_from_json, schedule_to_json
from verify.compare import (
    build_report,
    build_stages,
    reference_run,
    schedule_accumulation_orders,
    split_microbatches,
)
from verify.errors import VerifyError
from verify.exactness import exact_settings
from verify.local import ActionTiming, LocalRun, _SavedBytes
from verify.models import load_model
from verify.report import VerifyReport

__all__ = ["verify_distributed"]

_ACTIVATION, _GRADIENT = 0, 1


def verify_distributed(
    schedule: Schedule,
    /,
    *,
    model: str = "mlp",
    model_options: Mapping[str, int] | None = None,
    seed: int | None = None,
    batch_size: int | None = None,
    timeout_s: float = 120.0,
    warmup: int = 1,
) -> VerifyReport:
    """Run ``schedule`` with one process per rank and compare it with the unsplit model.

    ``model`` is a name for :func:`~verify.models.load_model` (each process
    builds its own), ``model_options`` its keyword options (``n_layers``,
    ``width``). The report is :func:`verify.compare.verify`'s; its
    ``predicted_makespan`` simulates the schedule with one device per rank.
    A run that has not finished after ``timeout_s`` seconds is stopped and
    reported as a :class:`~verify.errors.VerifyError`.
    """
    validate(schedule)
    if not isinstance(model, str):
        raise VerifyError(
            "verify_distributed rebuilds the model in every process: give its name "
            "(mlp, gpt or package.module:factory), not a model object"
        )
    options = dict(model_options or {})
    reference_model = load_model(model, seed=seed, **options)
    n_mb = schedule.n_microbatches
    rows = -(-32 // n_mb) * n_mb if batch_size is None else batch_size
    x, target = reference_model.make_batch(rows)
    xs, ts = split_microbatches(x, n_mb), split_microbatches(target, n_mb)
    stages = build_stages(reference_model, schedule)
    cpu = [torch.device("cpu")] * schedule.n_ranks
    with (
        tempfile.TemporaryDirectory(prefix="pipesim-dist-") as workdir,
        exact_settings(reference_model.layers, devices=cpu),
    ):
        args = (
            schedule.n_ranks,
            schedule_to_json(schedule),
            model,
            options,
            seed,
            rows,
            workdir,
            timeout_s,
            max(warmup, 0),
            torch.get_num_threads(),
        )
        _launch(args, n_ranks=schedule.n_ranks, timeout_s=timeout_s, name=schedule.name)
        results = [torch.load(Path(workdir) / f"rank{r}.pt") for r in range(schedule.n_ranks)]
        ref = reference_run(
            reference_model.layers,
            inputs=xs,
            targets=ts,
            loss_fn=reference_model.loss_fn,
            device=cpu[0],
            forward_only=schedule.forward_only,
        )
    run = _assemble(schedule, results, stages)
    return build_report(
        schedule,
        model=reference_model,
        stages=stages,
        run=run,
        ref=ref,
        devices=cpu,
        microbatch_sizes=tuple(int(t.shape[0]) for t in xs),
        accumulation_orders=schedule_accumulation_orders(schedule),
        as_run=schedule,
    )


def _launch(args: tuple[Any, ...], *, n_ranks: int, timeout_s: float, name: str) -> None:
    context = start_processes(  # type: ignore[no-untyped-call]
        _worker, args=args, nprocs=n_ranks, join=False, start_method="spawn"
    )
    deadline = time.monotonic() + timeout_s
    try:
        while not context.join(timeout=0.2):
            if time.monotonic() > deadline:
                raise VerifyError(
                    f"the distributed run of {name!r} did not finish within {timeout_s:g} s; "
                    "its ranks were stopped (raise timeout_s for bigger models)"
                )
    except ProcessRaisedException as exc:
        last = str(exc).strip().splitlines()[-1]
        raise VerifyError(f"a rank of the distributed run failed: {last}") from None
    except ProcessExitedException as exc:
        raise VerifyError(f"a rank of the distributed run exited: {exc}") from None
    finally:
        for process in context.processes:
            if process.is_alive():
                process.kill()
            process.join(timeout=5)


def _assemble(
    schedule: Schedule, results: Sequence[dict[str, Any]], stages: Sequence[nn.Module]
) -> LocalRun:
    """Merge the ranks' results into a LocalRun; put their gradients on ``stages``."""
    n_mb = schedule.n_microbatches
    origin = min((t[1] for r in results for t in r["timings"]), default=0)
    outputs: dict[int, Tensor] = {}
    losses: dict[int, Tensor] = {}
    transfer_bytes = [[0] * n_mb for _ in range(schedule.n_stages - 1)]
    activation_bytes = [0] * schedule.n_stages
    orders: list[tuple[int, ...]] = [() for _ in range(schedule.n_stages)]
    timings = []
    for rank, result in enumerate(results):
        outputs.update(result["outputs"])
        losses.update(result["losses"])
        for (stage, mb), n_bytes in result["transfer_bytes"].items():
            transfer_bytes[stage][mb] = n_bytes
        for stage, n_bytes in result["activation_bytes"].items():
            activation_bytes[stage] = n_bytes
        for stage, order in result["accumulated"].items():
            orders[stage] = tuple(order)
        for stage, grads in result["grads"].items():
            for p, g in zip(stages[stage].parameters(), grads, strict=True):
                p.grad = g
        for text, start, end in result["timings"]:
            timings.append(
                ActionTiming(
                    rank=rank, work=parse_action(text), start_ns=start - origin, end_ns=end - origin
                )
            )
    timings.sort(key=lambda t: (t.start_ns, t.rank))
    return LocalRun(
        schedule=schedule,
        executed=tuple(t.work for t in timings),
        outputs=tuple(outputs[k] for k in range(n_mb)),
        losses=tuple(losses[k] for k in sorted(losses)),
        actions=tuple(timings),
        transfers=(),
        transfer_bytes=tuple(tuple(row) for row in transfer_bytes),
        activation_bytes=tuple(activation_bytes),
        accumulation_orders=tuple(orders),
        wall_ns=max((t.end_ns for t in timings), default=0),
    )


# -- inside each rank's process ---------------------------------------------------------------
def _worker(
    rank: int,
    world_size: int,
    schedule_json: str,
    model_name: str,
    model_options: dict[str, int],
    seed: int | None,
    batch_size: int,
    workdir: str,
    timeout_s: float,
    warmup: int,
    n_threads: int,
) -> None:
    torch.set_num_threads(n_threads)  # the parent's count: same kernels, same bits
    torch.set_float32_matmul_precision("highest")
    dist.init_process_group(
        "gloo",
        init_method=f"file://{workdir}/rendezvous",
        rank=rank,
        world_size=world_size,
        timeout=timedelta(seconds=timeout_s),
    )
    try:
        schedule = schedule_from_json(schedule_json)
        model = load_model(model_name, seed=seed, **model_options)
        stages = build_stages(model, schedule)
        x, target = model.make_batch(batch_size)
        xs = split_microbatches(x, schedule.n_microbatches)
        ts = split_microbatches(target, schedule.n_microbatches)
        shapes = _boundary_shapes(schedule, stages, xs)
        for _ in range(warmup):
            _RankRunner(rank, schedule, stages, xs, ts, model.loss_fn, shapes).run()
            dist.barrier()
        result = _RankRunner(rank, schedule, stages, xs, ts, model.loss_fn, shapes).run()
        dist.barrier()
        torch.save(result, Path(workdir) / f"rank{rank}.pt")
    finally:
        dist.destroy_process_group()


def _boundary_shapes(
    schedule: Schedule, stages: Sequence[nn.Module], xs: Sequence[Tensor]
) -> dict[tuple[int, int], tuple[torch.Size, torch.dtype]]:
    """Shape and dtype of every stage output, so that a receiver can allocate it."""
    per_copy = schedule.n_stages // schedule.n_copies
    shapes = {}
    with torch.no_grad():
        for mb, x in enumerate(xs):
            for copy in range(schedule.n_copies):
                h = x
                for stage in range(copy * per_copy, (copy + 1) * per_copy):
                    h = stages[stage](h)
                    shapes[(stage, mb)] = (h.shape, h.dtype)
    return shapes


class _RankRunner:
    """One rank's step: its order, with blocking receives and non-blocking sends."""

    def __init__(
        self,
        rank: int,
        schedule: Schedule,
        stages: Sequence[nn.Module],
        xs: Sequence[Tensor],
        ts: Sequence[Tensor],
        loss_fn: Callable[[Tensor, Tensor], Tensor],
        shapes: dict[tuple[int, int], tuple[torch.Size, torch.dtype]],
    ) -> None:
        self.rank, self.schedule, self.stages = rank, schedule, stages
        self.xs, self.ts, self.loss_fn, self.shapes = xs, ts, loss_fn, shapes
        self.per_copy = schedule.n_stages // schedule.n_copies
        self.n_mb = schedule.n_microbatches
        self.present = set(schedule.actions())
        self.mine = schedule.stages_of(rank)
        for stage in self.mine:
            for p in stages[stage].parameters():
                p.grad = None
        self.local: dict[tuple[int, int, int], Tensor] = {}  # (kind, stage, mb) -> tensor
        self.sends: list[tuple[Any, Tensor]] = []
        self.outbox: list[tuple[int, int, int, int, Tensor]] = []  # sent after the timing
        self.stage_in: dict[tuple[int, int], Tensor] = {}
        self.stage_root: dict[tuple[int, int], Tensor] = {}
        self.grad_in: dict[tuple[int, int], Tensor | None] = {}
        self.result: dict[str, Any] = {
            "outputs": {},
            "losses": {},
            "grads": {},
            "timings": [],
            "transfer_bytes": {},
            "activation_bytes": {},
            "accumulated": {s: [] for s in self.mine},
        }

    # -- messages ------------------------------------------------------------------------
    def _tag(self, kind: int, stage: int, mb: int) -> int:
        return (kind * self.schedule.n_stages + stage) * self.n_mb + mb

    def _send(self, kind: int, stage: int, mb: int, to_stage: int, tensor: Tensor) -> None:
        tensor = tensor.detach().contiguous()
        if kind == _ACTIVATION:
            self.result["transfer_bytes"][(stage, mb)] = tensor.numel() * tensor.element_size()
        dst = self.schedule.rank_of(to_stage)
        if dst == self.rank:
            self.local[(kind, stage, mb)] = tensor
        else:
            self.sends.append((dist.isend(tensor, dst, tag=self._tag(kind, stage, mb)), tensor))

    def _receive(self, kind: int, stage: int, mb: int) -> Tensor:
        """The activation of ``stage`` (kind 0) or the gradient w.r.t. its output (kind 1)."""
        if self.schedule.rank_of(stage if kind == _ACTIVATION else stage + 1) == self.rank:
            return self.local.pop((kind, stage, mb))
        shape, dtype = self.shapes[(stage, mb)]
        buffer = torch.empty(shape, dtype=dtype)
        src = self.schedule.rank_of(stage if kind == _ACTIVATION else stage + 1)
        dist.recv(buffer, src, tag=self._tag(kind, stage, mb))
        return buffer

    # -- the step ------------------------------------------------------------------------
    def run(self) -> dict[str, Any]:
        for work in self.schedule.orders[self.rank]:
            received = [self._inputs(a) for a in work.parts]
            start = time.perf_counter_ns()
            for action, value in zip(work.parts, received, strict=True):
                self._compute(action, value)
            end = time.perf_counter_ns()
            self.result["timings"].append((str(work), start, end))
            self._flush()
        for request, _ in self.sends:
            request.wait()
        for stage in self.mine:
            self.result["grads"][stage] = [p.grad for p in self.stages[stage].parameters()]
        return self.result

    def _inputs(self, a: Action) -> Tensor | None:
        s, mb = a.stage, a.microbatch
        if a.op is Op.F:
            return self.xs[mb] if s % self.per_copy == 0 else self._receive(_ACTIVATION, s - 1, mb)
        if a.op in (Op.B, Op.I) and s % self.per_copy != self.per_copy - 1:
            return self._receive(_GRADIENT, s, mb)
        return None

    def _compute(self, a: Action, value: Tensor | None) -> None:
        s, mb = a.stage, a.microbatch
        training = not self.schedule.forward_only
        last = s % self.per_copy == self.per_copy - 1
        if a.op is Op.F:
            assert value is not None
            x = (
                value.detach().requires_grad_(True)
                if (training and s % self.per_copy and value.is_floating_point())
                else value
            )
            hook = _SavedBytes(
                {p.untyped_storage().data_ptr() for p in self.stages[s].parameters()}
            )
            with (
                torch.set_grad_enabled(training),
                torch.autograd.graph.saved_tensors_hooks(hook.pack, hook.unpack),
            ):
                out = self.stages[s](x)
            self.result["activation_bytes"][s] = max(
                self.result["activation_bytes"].get(s, 0), hook.total
            )
            root = out
            if last:
                self.result["outputs"][mb] = out.detach()
                with torch.set_grad_enabled(training):
                    loss = self.loss_fn(out, self.ts[mb])
                self.result["losses"][mb] = loss.detach()
                root = loss
            else:
                self.outbox.append((_ACTIVATION, s, mb, s + 1, out))
            if training:
                self.stage_in[(s, mb)], self.stage_root[(s, mb)] = x, root
        elif a.op is Op.B:
            x, root = self.stage_in.pop((s, mb)), self.stage_root.pop((s, mb))
            if root.requires_grad:
                torch.autograd.backward(root, grad_tensors=value)
            self._send_input_grad(s, mb, x, x.grad)
            self._weights_done(s, mb)
        elif a.op is Op.I:
            x, root = self.stage_in[(s, mb)], self.stage_root[(s, mb)]
            self.grad_in[(s, mb)] = value
            gx = None
            if s % self.per_copy and root.requires_grad and x.requires_grad:
                (gx,) = torch.autograd.grad(
                    root, x, grad_outputs=value, retain_graph=True, allow_unused=True
                )
            self._send_input_grad(s, mb, x, gx)
        else:  # W
            root = self.stage_root.pop((s, mb))
            self.stage_in.pop((s, mb))
            grad = self.grad_in.pop((s, mb))
            params = [p for p in self.stages[s].parameters() if p.requires_grad]
            if root.requires_grad and params:
                grads = torch.autograd.grad(root, params, grad_outputs=grad, allow_unused=True)
                for p, g in zip(params, grads, strict=True):
                    if g is not None:
                        p.grad = g.detach() if p.grad is None else p.grad.add_(g)
            self._weights_done(s, mb)

    def _send_input_grad(self, s: int, mb: int, x: Tensor, grad: Tensor | None) -> None:
        if s % self.per_copy == 0:
            return
        grad = torch.zeros_like(x) if grad is None else grad  # input unused: zero gradient
        self.outbox.append((_GRADIENT, s - 1, mb, s - 1, grad))

    def _flush(self) -> None:
        """Send what the last unit of work produced, after its timing ended."""
        for message in self.outbox:
            self._send(*message)
        self.outbox = []

    def _weights_done(self, s: int, mb: int) -> None:
        done = self.result["accumulated"][s]
        done.append(mb)
        if len(done) == self.n_mb // self.schedule.n_copies:  # torch's scale_grads, once
            for p in self.stages[s].parameters():
                if p.grad is not None:
                    p.grad.div_(self.n_mb)
