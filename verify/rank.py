"""One rank's step: the per-rank driver loop of the multi-process executors.

A rank rebuilds the model from its name (``mlp``, ``gpt`` or
``package.module:factory``, the same seed, so the same bits), keeps only its
own stages, and walks its program from :func:`pipesim.comms.lower_comms`: its
compute work in the Schedule's order, with each send right after the work that
produced it and each receive posted where the global order puts it. Messages go
through :class:`verify.transport.OrderedTransport` without tags; a hand-over
between two stages of one rank stays in the process. What each action computes
is :class:`verify.runtime.StageRuntime`'s, as in :mod:`verify.local`. Each rank
times its compute (not its waits) with :class:`verify.timing.UnitClock`:
``time.perf_counter_ns`` on the CPU, CUDA events read once per step on a GPU,
both placed on the host's ``perf_counter_ns``, a clock shared by the processes
of one machine, so the ranks' timelines line up.

:mod:`verify.dist` (processes it spawns), :mod:`verify.torchrun` (processes
torchrun started) and :mod:`verify.crosscheck` run a rank with :func:`run_rank`;
``report(state, value, peer)`` hears what the rank is doing
(:mod:`verify.rank_status`).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor, nn

from pipesim.actions import Action
from pipesim.comms import Comm, Message, lower_comms, messages
from pipesim.schedule import Schedule
from pipesim.schedule_io import schedule_from_json, schedule_to_json
from pipesim.step.structure import step_structure
from verify.allocator import minor_page_faults
from verify.bit_identity import exact_settings
from verify.compare import build_stages, split_microbatches, step_rows
from verify.models import VerifyModel, load_model
from verify.rank_status import COMPUTING, FINISHED, WAITING, set_current_schedule, set_state
from verify.runtime import StageRuntime, profiled
from verify.timing import UnitClock
from verify.transport import OrderedTransport

__all__ = [
    "RankRunner",
    "RankSpec",
    "message_shapes",
    "prepare_spec",
    "run_rank",
    "run_specs",
]


@dataclass(frozen=True, slots=True, kw_only=True)
class RankSpec:
    """Everything a rank process needs to rebuild the run (picklable)."""

    schedule_json: str
    model: str
    model_options: Mapping[str, Any] = field(default_factory=dict)
    """``load_model``'s keyword options: sizes, ``dtype``, ``autocast``."""
    seed: int | None = None
    batch_size: int
    timeout_s: float
    """Deadline of every wait for a message."""
    group_timeout_s: float | None = None
    """Deadline of joining the process group (every rank started, imported torch and
    connected) and of the barrier after each step; None: ``timeout_s``. Starting processes
    on a loaded machine can take far longer than one message may: the launcher gives the
    group the run's overall deadline, which bounds everything anyway."""
    warmup: int = 1
    timed_steps: int = 1
    """Measured steps after the warm-ups; the report holds the one of median makespan
    (:func:`verify.rank_results.median_step`)."""
    n_threads: int = 1
    shapes: Mapping[Message, tuple[tuple[int, ...], torch.dtype]] | None = None
    """Each message's shape and dtype; None: each rank runs the model once to find them."""
    batch: tuple[Tensor, Tensor] | None = None
    """The step's inputs and targets; None: each rank draws them (the same seed)."""
    trace_grads: bool = False
    """Keep the gradients after every B and W (to locate a gradient mismatch)."""


def run_rank(
    rank: int,
    spec: RankSpec,
    /,
    *,
    device: torch.device,
    report: Callable[[int, int, int], None] | None = None,
) -> dict[str, Any]:
    """One rank's ``spec.timed_steps`` measured steps (after ``spec.warmup`` untimed
    ones), in a process group that is already up; the result holds the last step's CPU
    tensors, every measured step's unit timings (``step_timings``), and each step's wall
    and CPU time (``step_wall_ns``, ``step_cpu_ns``, warm-ups first) and minor page faults
    (``step_page_faults``, None where not counted). ``report(state, value, peer)`` hears
    what the rank is doing."""
    runner = RankRunner(rank, spec, device=device, report=report)
    result: dict[str, Any] = {}
    walls, cpu, faults, timings = [], [], [], []
    with exact_settings(runner.layers, devices=[device]):
        for k in range(spec.warmup + spec.timed_steps):  # untimed warm-ups, then measured
            # Let go of the last step's tensors first, as a training loop's next step finds
            # them gone: the step then reuses their memory instead of touching new pages.
            # Held, they made the measured step fault in fresh pages, each a slow trap on a
            # virtual machine, and so run longer than predicted (docs/fidelity.md, "Two
            # harness faults behind 'DualPipe runs slower'").
            result = {}
            before = minor_page_faults()
            with profiled(rank, measured=k == spec.warmup):
                result, wall_ns, cpu_ns = runner.timed_step()
            after = minor_page_faults()
            walls.append(wall_ns)
            cpu.append(cpu_ns)
            faults.append(None if before is None or after is None else after - before)
            if k >= spec.warmup:
                timings.append(result["timings"])
    result["step_timings"] = timings
    result["step_wall_ns"] = walls
    result["step_cpu_ns"] = cpu
    result["step_page_faults"] = faults
    return result


class RankRunner:
    """One rank's steps of ``spec``'s schedule, set up once (the model rebuilt from its name
    and cut, this rank's stages on ``device``, the program lowered, the transport made) and
    run as often as asked: :func:`run_rank` runs its warm-ups and measured step,
    :mod:`verify.crosscheck` alternates its steps with torch's. Run the steps under
    :func:`verify.bit_identity.exact_settings` of ``layers``."""

    def __init__(
        self,
        rank: int,
        spec: RankSpec,
        /,
        *,
        device: torch.device,
        report: Callable[[int, int, int], None] | None = None,
    ) -> None:
        schedule = schedule_from_json(spec.schedule_json)
        model = load_model(spec.model, seed=spec.seed, **spec.model_options)
        self.stages = build_stages(model, schedule)
        x, target = model.make_batch(spec.batch_size) if spec.batch is None else spec.batch
        self.xs = split_microbatches(x, schedule.n_microbatches)
        self.ts = split_microbatches(target, schedule.n_microbatches)
        shapes = spec.shapes
        if shapes is None:
            shapes = message_shapes(schedule, self.stages, self.xs)
        for stage in schedule.stages_of(rank):
            self.stages[stage].to(device)
        self.layers, self.loss_fn = model.layers, model.loss_fn
        self.spec, self.device = spec, device
        self.plan = _RankPlan(rank, schedule, report=report)
        self.transport = OrderedTransport(
            rank=rank,
            device=device,
            shapes=shapes,
            timeout_s=spec.timeout_s,
            on_wait=self.plan.on_wait,
        )
        # Every rank ready before any step starts: a rank slow to set up on a loaded machine
        # must not use up its peers' deadline for its first message.
        dist.barrier()

    def timed_step(self) -> tuple[dict[str, Any], int, int]:
        """One step and the barrier after it: its result, wall and CPU nanoseconds (the
        process's threads, gloo's too)."""
        start, start_cpu = time.perf_counter_ns(), time.process_time_ns()
        step = _RankStep(
            self.plan,
            self.transport,
            self.stages,
            self.xs,
            self.ts,
            self.loss_fn,
            self.device,
            self.spec,
        )
        result = step.run()
        dist.barrier()
        return result, time.perf_counter_ns() - start, time.process_time_ns() - start_cpu


def prepare_spec(
    schedule: Schedule,
    /,
    *,
    model: str,
    model_options: Mapping[str, Any],
    seed: int | None,
    batch_size: int | None,
    warmup: int,
    timeout_s: float,
    group_timeout_s: float | None = None,
    timed_steps: int = 1,
) -> tuple[VerifyModel, tuple[nn.Module, ...], RankSpec]:
    """The model (built here from its name), its stages for ``schedule`` and the ranks' spec:
    the batch drawn here (``batch_size`` rows, default 32 rounded up to whole micro-batches)
    and every message's shape found here, so the ranks need not run the model first."""
    built = load_model(model, seed=seed, **model_options)
    n_mb = schedule.n_microbatches
    rows = step_rows(n_mb, batch_size=batch_size)
    x, target = built.make_batch(rows)
    stages = build_stages(built, schedule)
    spec = RankSpec(
        schedule_json=schedule_to_json(schedule),
        model=model,
        model_options=model_options,
        seed=seed,
        batch_size=rows,
        timeout_s=timeout_s,
        group_timeout_s=group_timeout_s,
        warmup=max(warmup, 0),
        timed_steps=timed_steps,
        n_threads=torch.get_num_threads(),
        shapes=message_shapes(schedule, stages, split_microbatches(x, n_mb)),
        batch=(x, target),
    )
    return built, stages, spec


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


@dataclass(frozen=True, slots=True)
class _Send:
    message: Message


@dataclass(frozen=True, slots=True)
class _Receive:
    message: Message


@dataclass(frozen=True, slots=True)
class _Unit:
    """A unit of compute work: per action, the message it takes and the one it hands on."""

    text: str
    parts: tuple[tuple[Action, Message | None, Message | None], ...]


class _RankPlan:
    """What every step of one rank shares, derived from the schedule once per run (torch's
    runtime, too, lowers its schedule once and reuses it every step): the rank's program
    from :func:`pipesim.comms.lower_comms` with the message of each send and receive and
    the messages each action takes and hands on looked up, and the step's structure for
    the runtime."""

    def __init__(
        self, rank: int, schedule: Schedule, *, report: Callable[[int, int, int], None] | None
    ) -> None:
        self.rank, self.schedule, self.report = rank, schedule, report
        self.structure = step_structure(schedule)
        self.mine = schedule.stages_of(rank)
        found = messages(schedule)
        by_comm: dict[Comm, Message] = {}
        for m in found:
            if m.crosses_ranks:
                by_comm[m.send] = m
                by_comm[m.recv] = m
        needed_by = {m.consumer: m for m in found}
        sent_by = {m.producer: m for m in found}
        self.program: list[_Send | _Receive | _Unit] = []
        for step in lower_comms(schedule).programs[rank]:
            if isinstance(step, Comm):
                message = by_comm[step]
                self.program.append(_Send(message) if step.op.is_send else _Receive(message))
            else:
                parts = tuple((a, needed_by.get(a), sent_by.get(a)) for a in step.parts)
                self.program.append(_Unit(str(step), parts))

    def on_wait(self, message: Message | None, peer: int) -> None:
        """The transport is about to wait for ``message`` from or to ``peer``."""
        if self.report is not None and message is not None:
            self.report(WAITING, message.index, peer)


class _RankStep:
    """One rank's step: its program of compute work, sends and receives."""

    def __init__(
        self,
        plan: _RankPlan,
        transport: OrderedTransport,
        stages: Sequence[nn.Module],
        xs: Sequence[Tensor],
        ts: Sequence[Tensor],
        loss_fn: Callable[[Tensor, Tensor], Tensor],
        device: torch.device,
        spec: RankSpec,
    ) -> None:
        self.plan, self.transport, self.stages, self.device = plan, transport, stages, device
        self.runtime = StageRuntime(
            plan.schedule,
            {s: stages[s] for s in plan.mine},
            devices={s: device for s in plan.mine},
            inputs=xs,
            targets=ts,
            loss_fn=loss_fn,
            trace_grads=spec.trace_grads,
            structure=plan.structure,
        )
        # By message index: hand-overs between two stages of this rank, and what was produced
        # for the next SEND of the program.
        self.local: dict[int, Tensor] = {}
        self.outbox: dict[int, Tensor] = {}
        self.timings: list[tuple[str, int, int]] = []  # (unit, start, end) on perf_counter_ns

    def run(self) -> dict[str, Any]:
        """Walk the program; the step's results as CPU tensors, and each unit's timing."""
        plan, transport = self.plan, self.transport
        # CUDA events around each unit, read once after the step: no synchronize in between.
        clock = UnitClock([self.device])
        sent_before = transport.payload_bytes_sent
        for position, entry in enumerate(plan.program):
            if isinstance(entry, _Unit):
                self._unit(position, entry, clock)
            elif isinstance(entry, _Send):
                transport.send(entry.message, self.outbox.pop(entry.message.index))
            else:
                transport.post(entry.message)
        transport.finish()
        clock.finish()
        if plan.report is not None:
            plan.report(FINISHED, 0, -1)
        result = self._result()
        result["wire_bytes"] = transport.payload_bytes_sent - sent_before
        result["wire_dtypes"] = sorted(str(d).removeprefix("torch.") for d in transport.dtypes_sent)
        return result

    def _unit(self, position: int, unit: _Unit, clock: UnitClock) -> None:
        """Take the unit's inputs (received or handed over here), run it timed, keep what it
        hands on for the next SEND or the next stage of this rank."""
        incoming: list[Tensor | None] = []
        for _, needed, _ in unit.parts:
            if needed is None:
                incoming.append(None)
            elif needed.crosses_ranks:
                incoming.append(self.transport.take(needed))
            else:
                incoming.append(self.local.pop(needed.index))
        if self.plan.report is not None:
            self.plan.report(COMPUTING, position, -1)
        start = clock.mark(self.device)
        for (action, _, out), value in zip(unit.parts, incoming, strict=True):
            handed = self.runtime.run(action, value)
            if out is not None and handed is not None:
                (self.outbox if out.crosses_ranks else self.local)[out.index] = handed
        end = clock.mark(self.device)

        def done(start_ns: int, end_ns: int, text: str = unit.text) -> None:
            # On the host's perf_counter_ns, which the ranks of one machine share.
            self.timings.append((text, clock.origin_ns + start_ns, clock.origin_ns + end_ns))

        clock.span(self.device, start, end, done)

    def _result(self) -> dict[str, Any]:
        rt = self.runtime

        def cpu(t: Tensor | None) -> Tensor | None:
            return None if t is None else t.detach().cpu()

        return {
            "device": str(self.device),
            "outputs": {mb: cpu(t) for mb, t in rt.outputs.items()},
            "losses": {mb: cpu(t) for mb, t in rt.losses.items()},
            "grads": {
                s: [cpu(p.grad) for p in self.stages[s].parameters()] for s in self.plan.mine
            },
            "timings": self.timings,
            "transfer_bytes": dict(rt.transfer_bytes),
            "activation_bytes": dict(rt.activation_bytes),
            "accumulated": {s: list(order) for s, order in rt.accumulated.items()},
            "grad_trace": rt.grad_trace if rt.trace_grads else {},
        }


def run_specs(
    rank: int, world_size: int, specs: Sequence[RankSpec], workdir: str, status: Any
) -> None:
    """The verify step of each of ``specs`` in turn, as rank ``rank``; each result saved to
    ``workdir/rank{rank}-{index}.pt``, the rank's state kept in ``status``."""

    def report(state: int, value: int, peer: int) -> None:
        set_state(status, rank, state, value, peer)

    for index, spec in enumerate(specs):
        if rank == 0:
            set_current_schedule(status, world_size, index)
        result = run_rank(rank, spec, device=torch.device("cpu"), report=report)
        torch.save(result, Path(workdir) / f"rank{rank}-{index}.pt")
        del result  # saved: the next schedule's steps reuse its memory (see run_rank)
