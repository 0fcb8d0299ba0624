"""Run a pipesim Schedule in one process on a list of devices.

Every rank gets a device (several ranks may share one; ``cpu`` stands in for
as many ranks as you like). The executor walks one global order of the
schedule's work, :func:`pipesim.comms.global_order`: a topological order of
the dependency graph (each rank's own order, every data dependency, the
``happens_before`` constraints), ties broken by (position in the rank's order,
rank), which steps the ranks in lock-step like a clock. So each rank runs its
actions exactly in the Schedule's order and nothing runs before what it needs.

This module is only a driver: :class:`verify.runtime.StageRuntime` says what
each action computes; here a message to another stage is a copy
(``.to(device)``) to that stage's device, made right after its producer ran.

>>> import torch
>>> from pipesim.schedules import generate
>>> from verify.models import mlp
>>> from verify.stage_cut import cut_stages
>>> model = mlp()
>>> x, target = model.make_batch(8)
>>> run = run_schedule(generate("1f1b", n_ranks=2, n_microbatches=2),
...                    cut_stages(model.layers, n_stages=2), devices=["cpu", "cpu"],
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

import torch
from torch import Tensor, nn

from pipesim.actions import Action, Work
from pipesim.comms import Message, global_order, messages
from pipesim.schedule import Schedule
from verify.errors import ExactnessError, VerifyError
from verify.runtime import StageRuntime
from verify.timing import UnitClock

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
    page_faults: tuple[int, ...] | None = None
    """Per rank process, the minor page faults of the measured step; None where not
    counted (every rank in one process, or a platform without ``resource``)."""
    wire_bytes: tuple[int, ...] | None = None
    """Per rank process, the payload bytes it sent through the process group in the step
    (headers excluded); None where every rank ran in one process."""
    wire_dtypes: tuple[str, ...] = ()
    """The dtypes of those payloads (``bfloat16`` for a bf16 model)."""
    step_makespans_ns: tuple[int, ...] = ()
    """One per measured step, its makespan (first start to last end, ns); the run's
    timings are those of the median one. Empty where not recorded."""
    grad_trace: tuple[tuple[tuple[str, tuple[Tensor | None, ...]], ...], ...] = ()
    """Per stage, after each B or W, the action and every parameter's gradient so far
    (before the final division); empty unless the run was asked to trace them."""


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
                # A GPU asked for and missing: the environment, not the input (exit status 3).
                raise ExactnessError(
                    f"device {name!r} is not present (CUDA devices here: {present}); use one "
                    "of them or cpu"
                )
            device = torch.device("cuda", index)
        else:
            raise VerifyError(f"device {name!r} is not supported; use cpu or cuda:N")
        devices.append(device)
    return tuple(devices)


def execution_order(schedule: Schedule, /) -> tuple[Work, ...]:
    """The global order the executor runs ``schedule``'s work in (validates first):
    :func:`pipesim.comms.global_order`, the order the multi-process executor's
    messages follow too.

    >>> from pipesim.schedules import generate
    >>> [str(w) for w in execution_order(generate("gpipe", n_ranks=2, n_microbatches=2))]
    ['0F0', '1F0', '0F1', '1F1', '1B0', '0B0', '1B1', '0B1']
    """
    return global_order(schedule)


def run_schedule(
    schedule: Schedule,
    stages: Sequence[nn.Module],
    /,
    *,
    devices: Sequence[torch.device | str],
    inputs: Sequence[Tensor],
    targets: Sequence[Tensor] | None = None,
    loss_fn: Callable[[Tensor, Tensor], Tensor] | None = None,
    trace_grads: bool = False,
) -> LocalRun:
    """Run one step of ``schedule`` with ``stages`` (one module per stage) on ``devices``
    (one per rank); ``inputs`` and ``targets`` are the micro-batches.

    Each stage module is moved to its rank's device (in place: stages that
    share modules with a model move that model's modules). Existing ``.grad``
    of the stages' parameters are cleared first, as ``zero_grad(set_to_none=True)``.
    Training schedules need ``targets`` and ``loss_fn``. ``trace_grads`` keeps a CPU copy
    of the gradients after every B and W (``LocalRun.grad_trace``).
    """
    order = execution_order(schedule)
    _check_run_arguments(schedule, stages, devices=devices, inputs=inputs, targets=targets)
    rank_device = tuple(torch.device(d) for d in devices)
    stage_device = _place_stages(schedule, stages, rank_device)
    runtime = StageRuntime(
        schedule,
        dict(enumerate(stages)),
        devices=stage_device,
        inputs=inputs,
        targets=targets,
        loss_fn=loss_fn,
        trace_grads=trace_grads,
    )
    timed = _execute(schedule, order, runtime, rank_device=rank_device, stage_device=stage_device)
    if len(runtime.outputs) != schedule.n_microbatches:
        raise VerifyError("the schedule did not run the last stage's forward of every micro-batch")
    return _local_run(schedule, order, runtime, timed, trace_grads=trace_grads)


def _check_run_arguments(
    schedule: Schedule,
    stages: Sequence[nn.Module],
    /,
    *,
    devices: Sequence[torch.device | str],
    inputs: Sequence[Tensor],
    targets: Sequence[Tensor] | None,
) -> None:
    """Refuse stage modules, devices or micro-batches that do not fit ``schedule``."""
    n_mb = schedule.n_microbatches
    n_stages = schedule.n_stages
    if len(stages) != n_stages:
        raise VerifyError(
            f"the schedule has {n_stages} stages but {len(stages)} stage modules were given; "
            f"partition the model into {n_stages} stages"
        )
    if len(devices) != schedule.n_ranks:
        raise VerifyError(f"{len(devices)} devices for {schedule.n_ranks} ranks; give one per rank")
    if len(inputs) != n_mb:
        raise VerifyError(f"{len(inputs)} input micro-batches for n_microbatches={n_mb}")
    if targets is not None and len(targets) != n_mb:
        raise VerifyError(f"{len(targets)} target micro-batches for n_microbatches={n_mb}")


def _place_stages(
    schedule: Schedule, stages: Sequence[nn.Module], rank_device: tuple[torch.device, ...], /
) -> dict[int, torch.device]:
    """Move each stage module to its rank's device; per stage, that device."""
    stage_device = {s: rank_device[schedule.rank_of(s)] for s in range(schedule.n_stages)}
    for stage, module in enumerate(stages):
        module.to(stage_device[stage])
    return stage_device


@dataclass(frozen=True, slots=True, kw_only=True)
class _Timed:
    """The spans one run measured, each sorted by start, and its host wall time."""

    actions: tuple[ActionTiming, ...]
    transfers: tuple[TransferTiming, ...]
    wall_ns: int


def _execute(
    schedule: Schedule,
    order: tuple[Work, ...],
    runtime: StageRuntime,
    /,
    *,
    rank_device: tuple[torch.device, ...],
    stage_device: dict[int, torch.device],
) -> _Timed:
    """Run ``order`` on ``runtime``, handing each message over right after its producer ran,
    and time every unit of work and every transfer between ranks."""
    hand_overs = messages(schedule)
    sent_by = {m.producer: m for m in hand_overs}
    needed_by = {m.consumer: m for m in hand_overs}
    inbox: dict[Message, Tensor] = {}
    action_times: list[ActionTiming] = []
    transfer_times: list[TransferTiming] = []
    clock = UnitClock(rank_device)  # CUDA events, read once at the end of the step

    def hand_over(message: Message, tensor: Tensor) -> None:
        """In one process a message is a copy to the consumer's device."""
        src = rank_device[message.src_rank]
        start = clock.mark(src)
        inbox[message] = tensor.to(stage_device[message.consumer.stage])
        end = clock.mark(src)
        if message.crosses_ranks:
            clock.span(src, start, end, _transfer_recorder(transfer_times, message, tensor))

    host_start = time.perf_counter_ns()
    for work in order:
        rank = schedule.rank_of(work.parts[0].stage)
        device = rank_device[rank]
        start = clock.mark(device)
        for action in work.parts:
            needed = needed_by.get(action)
            handed = runtime.run(action, None if needed is None else inbox.pop(needed))
            message = sent_by.get(action)
            if message is not None and handed is not None:
                hand_over(message, handed)
        end = clock.mark(device)
        clock.span(device, start, end, _action_recorder(action_times, rank, work))
    clock.finish()
    wall_ns = time.perf_counter_ns() - host_start
    action_times.sort(key=lambda t: (t.start_ns, t.rank))
    transfer_times.sort(key=lambda t: (t.start_ns, t.src_rank))
    return _Timed(actions=tuple(action_times), transfers=tuple(transfer_times), wall_ns=wall_ns)


def _action_recorder(
    action_times: list[ActionTiming], rank: int, work: Work, /
) -> Callable[[int, int], None]:
    """What :meth:`UnitClock.span` calls with the span of ``work`` on ``rank``."""

    def done(start_ns: int, end_ns: int) -> None:
        action_times.append(ActionTiming(rank=rank, work=work, start_ns=start_ns, end_ns=end_ns))

    return done


def _transfer_recorder(
    transfer_times: list[TransferTiming], message: Message, tensor: Tensor, /
) -> Callable[[int, int], None]:
    """What :meth:`UnitClock.span` calls with the span of ``message`` carrying ``tensor``."""

    def done(start_ns: int, end_ns: int) -> None:
        transfer_times.append(
            TransferTiming(
                src_rank=message.src_rank,
                dst_rank=message.dst_rank,
                producer=message.producer,
                consumer=message.consumer,
                n_bytes=tensor.numel() * tensor.element_size(),
                start_ns=start_ns,
                end_ns=end_ns,
            )
        )

    return done


def _local_run(
    schedule: Schedule,
    order: tuple[Work, ...],
    runtime: StageRuntime,
    timed: _Timed,
    /,
    *,
    trace_grads: bool,
) -> LocalRun:
    """The :class:`LocalRun` of a finished run: ``runtime``'s results and ``timed``'s spans."""
    n_mb = schedule.n_microbatches
    n_stages = schedule.n_stages
    return LocalRun(
        schedule=schedule,
        executed=order,
        outputs=tuple(runtime.outputs[k] for k in range(n_mb)),
        losses=tuple(runtime.losses[k] for k in sorted(runtime.losses)),
        actions=timed.actions,
        transfers=timed.transfers,
        transfer_bytes=transfer_table(runtime.transfer_bytes, n_stages=n_stages, n_mb=n_mb),
        activation_bytes=tuple(runtime.activation_bytes[s] for s in range(n_stages)),
        accumulation_orders=tuple(tuple(runtime.accumulated[s]) for s in range(n_stages)),
        wall_ns=timed.wall_ns,
        grad_trace=tuple(tuple(runtime.grad_trace[s]) for s in range(n_stages))
        if trace_grads
        else (),
    )


def transfer_table(
    sizes: dict[tuple[int, int], int], /, *, n_stages: int, n_mb: int
) -> tuple[tuple[int, ...], ...]:
    """Per stage boundary ``s -> s+1``, the bytes of each micro-batch's activation (0 where
    none crosses it) from ``{(stage, microbatch): bytes}``."""
    return tuple(tuple(sizes.get((s, mb), 0) for mb in range(n_mb)) for s in range(n_stages - 1))
