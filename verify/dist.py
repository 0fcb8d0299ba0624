"""Run a Schedule with torch.distributed: one process per rank.

Each rank is a process of its own that rebuilds the model from its name
(``mlp``, ``gpt`` or ``package.module:factory``, the same seed, so the same
bits), keeps only its own stages, and walks its program from
:func:`pipesim.comms.lower_comms`: its compute work in the Schedule's order,
with each send right after the work that produced it and each receive posted
where the global order puts it. Messages go through
:class:`verify.transport.OrderedTransport` without tags, header first; a
hand-over between two stages of one rank stays in the process. What each
action computes is :class:`verify.runtime.StageRuntime`'s, as in
:mod:`verify.local`.

Two ways to start the ranks:

- :func:`verify_distributed` spawns them itself (``pipesim verify --dist``):
  gloo on the CPU, a file rendezvous in a temporary directory that is removed
  on exit and on SIGTERM, each rank's stderr (torch's own warnings) kept out of
  pipesim's output;
- :mod:`verify.torchrun` runs one rank per process that ``torchrun`` started
  (gloo on the CPU, NCCL on ``cuda:LOCAL_RANK``).

Every wait has a deadline. A rank that fails, dies or hangs ends the run: the
launcher stops every rank at once and the error names the rank, what it was
running or waiting for, and the peer. Each rank times its compute (not its
waits) with :class:`verify.timing.UnitClock`: ``time.perf_counter_ns`` on the
CPU, CUDA events read once per step on a GPU, both placed on the host's
``perf_counter_ns``, a clock shared by the processes of one machine, so the
ranks' timelines line up.

>>> from pipesim.schedules import generate
>>> report = verify_distributed(generate("1f1b", n_ranks=2, n_microbatches=2), model="mlp")
>>> report.bit_identical, report.devices
(True, ('cpu', 'cpu'))
"""

from __future__ import annotations

import dataclasses
import multiprocessing
import os
import signal
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor, nn

from pipesim.actions import parse_action
from pipesim.comms import Comm, CommSchedule, Message, lower_comms, messages
from pipesim.graph import validate
from pipesim.schedule import Schedule
from pipesim.schedule_io import schedule_from_json, schedule_to_json
from pipesim.sigterm import exit_on_sigterm
from verify.compare import (
    Reference,
    build_report,
    build_stages,
    locate_gradient_mismatch,
    reference_run,
    schedule_accumulation_orders,
    split_microbatches,
)
from verify.errors import RunFailedError, VerifyError
from verify.exactness import exact_settings
from verify.local import ActionTiming, LocalRun, transfer_table
from verify.models import VerifyModel, load_model
from verify.report import VerifyReport
from verify.runtime import StageRuntime
from verify.timing import UnitClock
from verify.transport import OrderedTransport

__all__ = [
    "RankSpec",
    "as_rank",
    "assemble",
    "launch",
    "locate_from_results",
    "message_shapes",
    "report_from_results",
    "run_rank",
    "verify_distributed",
    "verify_distributed_all",
]

# One rank's state for the launcher: (state, program position or message index, peer).
_STARTING, _COMPUTING, _WAITING, _FINISHED = 0, 1, 2, 3


@dataclass(frozen=True, slots=True, kw_only=True)
class RankSpec:
    """Everything a rank process needs to rebuild the run (picklable)."""

    schedule_json: str
    model: str
    model_options: Mapping[str, int] = field(default_factory=dict)
    seed: int | None = None
    batch_size: int
    timeout_s: float
    """Deadline of every wait for a message."""
    warmup: int = 1
    n_threads: int = 1
    shapes: Mapping[Message, tuple[tuple[int, ...], torch.dtype]] | None = None
    """Each message's shape and dtype; None: each rank runs the model once to find them."""
    batch: tuple[Tensor, Tensor] | None = None
    """The step's inputs and targets; None: each rank draws them (the same seed)."""
    trace_grads: bool = False
    """Keep the gradients after every B and W (to locate a gradient mismatch)."""


def verify_distributed(
    schedule: Schedule,
    /,
    *,
    model: str = "mlp",
    model_options: Mapping[str, int] | None = None,
    seed: int | None = None,
    batch_size: int | None = None,
    timeout_s: float = 120.0,
    wait_timeout_s: float | None = None,
    warmup: int = 1,
) -> VerifyReport:
    """Run ``schedule`` with one process per rank and compare it with the unsplit model.

    ``model`` is a name for :func:`~verify.models.load_model` (each process
    builds its own), ``model_options`` its keyword options (``n_layers``,
    ``width``). The report is :func:`verify.compare.verify`'s; its
    ``predicted_makespan`` simulates the schedule with one device per rank.
    A run that has not finished after ``timeout_s`` seconds is stopped; a rank
    that waits longer than ``wait_timeout_s`` (default ``timeout_s``) for one
    message gives up; those, and a rank that fails or dies, are a
    :class:`~verify.errors.RunFailedError` naming the ranks and what they were doing.
    """
    (report,) = verify_distributed_all(
        [schedule],
        model=model,
        model_options=model_options,
        seed=seed,
        batch_size=batch_size,
        timeout_s=timeout_s,
        wait_timeout_s=wait_timeout_s,
        warmup=warmup,
    )
    return report


def verify_distributed_all(
    schedules: Sequence[Schedule],
    /,
    *,
    model: str = "mlp",
    model_options: Mapping[str, int] | None = None,
    seed: int | None = None,
    batch_size: int | Sequence[int] | None = None,
    timeout_s: float = 120.0,
    wait_timeout_s: float | None = None,
    warmup: int = 1,
) -> tuple[VerifyReport, ...]:
    """:func:`verify_distributed` for several schedules of one rank count, one after the
    other in the same rank processes (started once); ``timeout_s`` bounds the whole run.
    ``batch_size`` is one for all or one per schedule."""
    if not schedules:
        return ()
    sizes = list(batch_size) if isinstance(batch_size, Sequence) else [batch_size] * len(schedules)
    if len(sizes) != len(schedules):
        raise VerifyError(f"{len(sizes)} batch sizes for {len(schedules)} schedules; give one each")
    for schedule in schedules:
        validate(schedule)
    n_ranks = {s.n_ranks for s in schedules}
    if len(n_ranks) != 1:
        raise VerifyError(f"the schedules have different rank counts {sorted(n_ranks)}; give one")
    if not isinstance(model, str):
        raise VerifyError(
            "verify_distributed rebuilds the model in every process: give its name "
            "(mlp, gpt or package.module:factory), not a model object"
        )
    options = dict(model_options or {})
    cpu = [torch.device("cpu")] * schedules[0].n_ranks
    prepared = []
    for schedule, size in zip(schedules, sizes, strict=True):
        reference_model = load_model(model, seed=seed, **options)
        n_mb = schedule.n_microbatches
        rows = -(-32 // n_mb) * n_mb if size is None else size
        x, target = reference_model.make_batch(rows)
        xs = split_microbatches(x, n_mb)
        stages = build_stages(reference_model, schedule)
        spec = RankSpec(
            schedule_json=schedule_to_json(schedule),
            model=model,
            model_options=options,
            seed=seed,
            batch_size=rows,
            timeout_s=timeout_s if wait_timeout_s is None else min(wait_timeout_s, timeout_s),
            warmup=max(warmup, 0),
            n_threads=torch.get_num_threads(),
            shapes=message_shapes(schedule, stages, xs),
            batch=(x, target),
        )
        prepared.append((schedule, reference_model, stages, spec))
    reports = []
    with (
        exit_on_sigterm(),
        tempfile.TemporaryDirectory(prefix="pipesim-dist-") as workdir,
        exact_settings(prepared[0][1].layers, devices=cpu),
    ):
        launch([p[3] for p in prepared], schedules, workdir=Path(workdir), timeout_s=timeout_s)
        for index, (schedule, reference_model, stages, spec) in enumerate(prepared):
            results = [
                torch.load(Path(workdir) / f"rank{r}-{index}.pt", weights_only=False)
                for r in range(schedule.n_ranks)
            ]
            report = report_from_results(schedule, reference_model, stages, spec, results, cpu)
            if report.grads_equal is False:
                report = _locate(report, schedule, reference_model, stages, spec, timeout_s)
            reports.append(report)
    return tuple(reports)


def _locate(
    report: VerifyReport,
    schedule: Schedule,
    reference_model: VerifyModel,
    stages: Sequence[nn.Module],
    spec: RankSpec,
    timeout_s: float,
) -> VerifyReport:
    """Re-run one step of ``schedule`` in new rank processes that keep the gradients after
    every B and W, and name the action where they first differ (verify.locate)."""
    traced = dataclasses.replace(spec, trace_grads=True, warmup=0)
    with tempfile.TemporaryDirectory(prefix="pipesim-dist-") as workdir:
        launch([traced], [schedule], workdir=Path(workdir), timeout_s=timeout_s)
        results = [
            torch.load(Path(workdir) / f"rank{r}-0.pt", weights_only=False)
            for r in range(schedule.n_ranks)
        ]
    return locate_from_results(report, schedule, reference_model, stages, spec, results)


def locate_from_results(
    report: VerifyReport,
    schedule: Schedule,
    reference_model: VerifyModel,
    stages: Sequence[nn.Module],
    spec: RankSpec,
    results: Sequence[dict[str, Any]],
) -> VerifyReport:
    """``report`` with the action where the gradients first differ, from the ranks'
    results of a step run with ``RankSpec.trace_grads`` (verify.locate)."""
    _, ref = _reference(schedule, reference_model, spec, device=torch.device("cpu"))
    return locate_gradient_mismatch(
        report,
        assemble(schedule, results, stages),
        model=reference_model,
        stages=stages,
        ref=ref,
        orders=schedule_accumulation_orders(schedule),
    )


def _reference(
    schedule: Schedule, model: VerifyModel, spec: RankSpec, /, *, device: torch.device
) -> tuple[tuple[Tensor, ...], Reference]:
    """The step's input micro-batches (``spec.batch`` cut as ``schedule`` cuts it) and the
    unsplit model run on them on ``device``: what the ranks' results are checked against."""
    assert spec.batch is not None
    n_mb = schedule.n_microbatches
    xs = split_microbatches(spec.batch[0], n_mb)
    ref = reference_run(
        model.layers,
        inputs=xs,
        targets=split_microbatches(spec.batch[1], n_mb),
        loss_fn=model.loss_fn,
        device=device,
        forward_only=schedule.forward_only,
    )
    return xs, ref


def report_from_results(
    schedule: Schedule,
    reference_model: VerifyModel,
    stages: Sequence[nn.Module],
    spec: RankSpec,
    results: Sequence[dict[str, Any]],
    devices: Sequence[torch.device],
) -> VerifyReport:
    """Compare the ranks' results with the unsplit model run on ``devices[0]``."""
    xs, ref = _reference(schedule, reference_model, spec, device=devices[0])
    run = assemble(schedule, results, stages)
    return build_report(
        schedule,
        model=reference_model,
        stages=stages,
        run=run,
        ref=ref,
        devices=devices,
        microbatch_sizes=tuple(int(t.shape[0]) for t in xs),
        accumulation_orders=schedule_accumulation_orders(schedule),
        as_run=schedule,
    )


def launch(
    specs: Sequence[RankSpec],
    schedules: Sequence[Schedule],
    *,
    workdir: Path,
    timeout_s: float,
    target: Callable[..., None] | None = None,
) -> None:
    """Start one process per rank running ``target(rank, world_size, specs, workdir,
    status)`` (default: the verify step), wait for all with a deadline, and stop every
    rank on the first failure; RunFailedError says which rank did what."""
    target = _worker if target is None else target
    n_ranks = schedules[0].n_ranks
    context = multiprocessing.get_context("spawn")
    status = context.Array("q", 3 * n_ranks + 1, lock=False)
    processes = [
        context.Process(
            target=target, args=(rank, n_ranks, specs, str(workdir), status), daemon=True
        )
        for rank in range(n_ranks)
    ]
    deadline = time.monotonic() + timeout_s
    try:
        for process in processes:
            process.start()
        while True:
            codes = [p.exitcode for p in processes]
            if all(code == 0 for code in codes):
                return
            if any(code not in (None, 0) for code in codes):
                # Let the other ranks notice (their waits fail fast) and say what they saw.
                grace = time.monotonic() + 1.0
                while time.monotonic() < grace and any(p.exitcode is None for p in processes):
                    time.sleep(0.02)
                schedule = schedules[_current(status, n_ranks)]
                raise RunFailedError(
                    f"the distributed run of {schedule.name!r} failed: "
                    + _describe_failure(schedule, processes, workdir, status)
                )
            if time.monotonic() > deadline:
                schedule = schedules[_current(status, n_ranks)]
                raise RunFailedError(
                    f"the distributed run of {schedule.name!r} did not finish within "
                    f"{timeout_s:g} s; its ranks were stopped (raise the timeout for bigger "
                    "models): " + _describe_states(schedule, status, range(n_ranks))
                )
            time.sleep(0.02)
    finally:
        for process in processes:
            if process.is_alive():
                process.kill()
        for process in processes:
            if process.pid is not None:
                process.join(timeout=5)


def _current(status: Any, n_ranks: int) -> int:
    """The index of the schedule the ranks are at (the status holds one more slot for it)."""
    return max(0, int(status[3 * n_ranks]))


def _describe_failure(
    schedule: Schedule, processes: Sequence[Any], workdir: Path, status: Any
) -> str:
    """One clause per rank that ended badly, ranks killed by a signal first, then the states
    of the ranks that were still running."""
    parts = []
    codes = {rank: p.exitcode for rank, p in enumerate(processes)}
    for rank in sorted(codes, key=lambda r: (codes[r] is None or codes[r] >= 0, r)):
        code = codes[rank]
        if code is None or code == 0:
            continue
        error = workdir / f"rank{rank}.error"
        if error.exists():
            parts.append(error.read_text().strip())
        else:
            how = f"killed by {signal.Signals(-code).name}" if code < 0 else f"exit status {code}"
            parts.append(f"rank {rank} died ({how}); " + _describe_states(schedule, status, [rank]))
    running = [r for r, code in codes.items() if code is None]
    if running:
        parts.append(_describe_states(schedule, status, running))
    return "; ".join(parts)


def _describe_states(schedule: Schedule, status: Any, ranks: Sequence[int] | range) -> str:
    programs = lower_comms(schedule).programs
    found = messages(schedule)
    words = []
    for rank in ranks:
        state, value, peer = status[3 * rank : 3 * rank + 3]
        if state == _COMPUTING:
            words.append(f"rank {rank} was running {programs[rank][value]}")
        elif state == _WAITING:
            message = found[value]
            if message.dst_rank == rank:
                words.append(
                    f"rank {rank} was waiting for {message.producer} from rank {peer} "
                    f"(needed by {message.consumer})"
                )
            else:
                words.append(
                    f"rank {rank} was waiting for rank {peer} to take {message.producer}'s message"
                )
        elif state == _FINISHED:
            words.append(f"rank {rank} had finished its step")
        else:
            words.append(f"rank {rank} had not started its step")
    return "; ".join(words)


# -- inside each rank's process ---------------------------------------------------------------
def _worker(
    rank: int, world_size: int, specs: Sequence[RankSpec], workdir: str, status: Any
) -> None:
    as_rank(rank, world_size, specs, workdir, status, body=_run_specs)


def _run_specs(
    rank: int, world_size: int, specs: Sequence[RankSpec], workdir: str, status: Any
) -> None:
    def report(state: int, value: int, peer: int) -> None:
        status[3 * rank : 3 * rank + 3] = [state, value, peer]

    for index, spec in enumerate(specs):
        if rank == 0:
            status[3 * world_size] = index
        result = run_rank(rank, spec, device=torch.device("cpu"), report=report)
        torch.save(result, Path(workdir) / f"rank{rank}-{index}.pt")


def as_rank(
    rank: int,
    world_size: int,
    specs: Sequence[RankSpec],
    workdir: str,
    status: Any,
    *,
    body: Callable[[int, int, Sequence[RankSpec], str, Any], None],
) -> None:
    """Run ``body`` as one rank of a gloo group on the CPU (a process :func:`launch`
    started): stderr to a log file, a failure written where the launcher reads it."""
    # torch's own warnings and C++ logs go to a file, not into pipesim's error output.
    log = os.open(os.path.join(workdir, f"rank{rank}.log"), os.O_WRONLY | os.O_CREAT, 0o600)
    os.dup2(log, 2)
    try:
        torch.set_num_threads(specs[0].n_threads)  # the parent's count: same kernels, same bits
        dist.init_process_group(
            "gloo",
            init_method=f"file://{workdir}/rendezvous",
            rank=rank,
            world_size=world_size,
            timeout=timedelta(seconds=specs[0].timeout_s),
        )
        try:
            body(rank, world_size, specs, workdir, status)
        finally:
            dist.destroy_process_group()
    except BaseException as exc:  # every failure is reported to the launcher
        text = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        if not text.startswith(f"rank {rank} "):
            text = f"rank {rank} failed: {text}"
        Path(workdir, f"rank{rank}.error").write_text(text + "\n")
        raise SystemExit(1) from None


def run_rank(
    rank: int,
    spec: RankSpec,
    /,
    *,
    device: torch.device,
    report: Callable[[int, int, int], None] | None = None,
) -> dict[str, Any]:
    """One rank's measured step (after ``spec.warmup`` untimed ones), in a process group
    that is already up; the result holds CPU tensors. ``report(state, value, peer)`` hears
    what the rank is doing."""
    schedule = schedule_from_json(spec.schedule_json)
    model = load_model(spec.model, seed=spec.seed, **spec.model_options)
    stages = build_stages(model, schedule)
    x, target = model.make_batch(spec.batch_size) if spec.batch is None else spec.batch
    xs = split_microbatches(x, schedule.n_microbatches)
    ts = split_microbatches(target, schedule.n_microbatches)
    comms = lower_comms(schedule)
    shapes = spec.shapes if spec.shapes is not None else message_shapes(schedule, stages, xs)
    for stage in schedule.stages_of(rank):
        stages[stage].to(device)
    result: dict[str, Any] = {}
    walls, cpu = [], []
    with exact_settings(model.layers, devices=[device]):
        for _ in range(spec.warmup + 1):  # untimed warm-up steps, then the measured one
            start, start_cpu = time.perf_counter_ns(), time.process_time_ns()
            step = _RankStep(rank, comms, stages, xs, ts, model.loss_fn, shapes, device, spec)
            step.report = report
            result = step.run()
            dist.barrier()
            walls.append(time.perf_counter_ns() - start)
            cpu.append(time.process_time_ns() - start_cpu)
    result["step_wall_ns"] = walls  # each step's wall time, warm-ups first
    result["step_cpu_ns"] = cpu  # and its CPU time (the process's threads, gloo's too)
    return result


def message_shapes(
    schedule: Schedule, stages: Sequence[nn.Module], xs: Sequence[Tensor]
) -> dict[Message, tuple[tuple[int, ...], torch.dtype]]:
    """Shape and dtype of every message, so that a receiver can post its buffer early: an
    activation is its stage's output, a gradient has the shape of what it differentiates."""
    per_copy = schedule.n_stages // schedule.n_copies
    out: dict[tuple[int, int], tuple[tuple[int, ...], torch.dtype]] = {}
    with torch.no_grad():
        for mb, x in enumerate(xs):
            for copy in range(schedule.n_copies):
                h = x
                for stage in range(copy * per_copy, (copy + 1) * per_copy):
                    h = stages[stage](h)
                    out[(stage, mb)] = (tuple(h.shape), h.dtype)
    shapes = {}
    for m in messages(schedule):
        boundary = m.producer.stage if m.is_forward else m.consumer.stage
        shapes[m] = out[(boundary, m.producer.microbatch)]
    return shapes


class _RankStep:
    """One rank's step: its program of compute work, sends and receives."""

    def __init__(
        self,
        rank: int,
        comms: CommSchedule,
        stages: Sequence[nn.Module],
        xs: Sequence[Tensor],
        ts: Sequence[Tensor],
        loss_fn: Callable[[Tensor, Tensor], Tensor],
        shapes: Mapping[Message, tuple[tuple[int, ...], torch.dtype]],
        device: torch.device,
        spec: RankSpec,
    ) -> None:
        schedule = comms.schedule
        self.rank, self.comms, self.stages, self.device = rank, comms, stages, device
        self.mine = schedule.stages_of(rank)
        self.runtime = StageRuntime(
            schedule,
            {s: stages[s] for s in self.mine},
            devices={s: device for s in self.mine},
            inputs=xs,
            targets=ts,
            loss_fn=loss_fn,
            trace_grads=spec.trace_grads,
        )
        found = messages(schedule)
        self.index = {m: m.index for m in found}
        self.by_comm: dict[Comm, Message] = {}
        for m in found:
            if m.crosses_ranks:
                self.by_comm[m.send] = m
                self.by_comm[m.recv] = m
        self.needed_by = {m.consumer: m for m in found}
        self.sent_by = {m.producer: m for m in found}
        self.report: Callable[[int, int, int], None] | None = None
        self.transport = OrderedTransport(
            rank=rank,
            device=device,
            shapes=shapes,
            timeout_s=spec.timeout_s,
            on_wait=self._on_wait,
        )

    def _on_wait(self, message: Message | None, peer: int) -> None:
        if self.report is not None and message is not None:
            self.report(_WAITING, self.index[message], peer)

    def run(self) -> dict[str, Any]:
        local: dict[Message, Tensor] = {}  # hand-overs between two stages of this rank
        outbox: dict[Message, Tensor] = {}  # produced, sent by the next SEND of the program
        timings: list[tuple[str, int, int]] = []
        # CUDA events around each unit, read once after the step: no synchronize in between.
        clock = UnitClock([self.device])
        for position, step in enumerate(self.comms.programs[self.rank]):
            if isinstance(step, Comm):
                message = self.by_comm[step]
                if step.op.is_send:
                    self.transport.send(message, outbox.pop(message))
                else:
                    self.transport.post(message)
                continue
            incoming: list[Tensor | None] = []
            for action in step.parts:
                needed = self.needed_by.get(action)
                if needed is None:
                    incoming.append(None)
                elif needed.crosses_ranks:
                    incoming.append(self.transport.take(needed))
                else:
                    incoming.append(local.pop(needed))
            if self.report is not None:
                self.report(_COMPUTING, position, -1)
            start = clock.mark(self.device)
            for action, value in zip(step.parts, incoming, strict=True):
                handed = self.runtime.run(action, value)
                out = self.sent_by.get(action)
                if out is not None and handed is not None:
                    (outbox if out.crosses_ranks else local)[out] = handed
            end = clock.mark(self.device)

            def done(start_ns: int, end_ns: int, text: str = str(step)) -> None:
                # On the host's perf_counter_ns, which the ranks of one machine share.
                timings.append((text, clock.origin_ns + start_ns, clock.origin_ns + end_ns))

            clock.span(self.device, start, end, done)
        self.transport.finish()
        clock.finish()
        if self.report is not None:
            self.report(_FINISHED, 0, -1)
        rt = self.runtime

        def cpu(t: Tensor | None) -> Tensor | None:
            return None if t is None else t.detach().cpu()

        return {
            "device": str(self.device),
            "outputs": {mb: cpu(t) for mb, t in rt.outputs.items()},
            "losses": {mb: cpu(t) for mb, t in rt.losses.items()},
            "grads": {s: [cpu(p.grad) for p in self.stages[s].parameters()] for s in self.mine},
            "timings": timings,
            "transfer_bytes": dict(rt.transfer_bytes),
            "activation_bytes": dict(rt.activation_bytes),
            "accumulated": {s: list(order) for s, order in rt.accumulated.items()},
            "grad_trace": rt.grad_trace if rt.trace_grads else {},
        }


def assemble(
    schedule: Schedule, results: Sequence[dict[str, Any]], stages: Sequence[nn.Module]
) -> LocalRun:
    """Merge the ranks' results into a LocalRun; put their gradients on ``stages``."""
    n_mb = schedule.n_microbatches
    origin = min((t[1] for r in results for t in r["timings"]), default=0)
    outputs: dict[int, Tensor] = {}
    losses: dict[int, Tensor] = {}
    sizes: dict[tuple[int, int], int] = {}
    activation_bytes = [0] * schedule.n_stages
    orders: list[tuple[int, ...]] = [() for _ in range(schedule.n_stages)]
    timings = []
    traced: dict[int, Any] = {}
    for rank, result in enumerate(results):
        traced.update(result.get("grad_trace", {}))
        outputs.update(result["outputs"])
        losses.update(result["losses"])
        sizes.update(result["transfer_bytes"])
        for stage, n_bytes in result["activation_bytes"].items():
            activation_bytes[stage] = n_bytes
        for stage, order in result["accumulated"].items():
            orders[stage] = tuple(order)
        for stage, grads in result["grads"].items():
            for p, g in zip(stages[stage].parameters(), grads, strict=True):
                p.grad = None if g is None else g.to(p.device)
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
        transfer_bytes=transfer_table(sizes, n_stages=schedule.n_stages, n_mb=n_mb),
        activation_bytes=tuple(activation_bytes),
        accumulation_orders=tuple(orders),
        wall_ns=max((t.end_ns for t in timings), default=0),
        grad_trace=tuple(tuple(traced[s]) for s in range(schedule.n_stages)) if traced else (),
    )
