"""Import a schedule from ``torch.distributed.pipelining`` without a process group.

:func:`schedule_from_torch` asks a torch schedule class for the per-rank
order it will run and returns it as a pipesim :class:`~pipesim.schedule.Schedule`,
so what torch (or torchtitan) runs can be simulated and plotted as is. No
process group is started and no model is built: torch's classes accept
stand-in stages (torch's own tests do the same).

- Multi-stage classes (``ScheduleInterleaved1F1B``, ``ScheduleLoopedBFS``,
  ``ScheduleInterleavedZeroBubble``, ``ScheduleZBVZeroBubble``,
  ``ScheduleDualPipeV``, or any ``_PipelineScheduleRuntime`` subclass) compute
  ``pipeline_order`` for every rank in their constructor; that list, without
  its idle (``None``) steps, is exactly the compute order the runtime
  executes.
- Single-stage classes (``Schedule1F1B``, ``ScheduleGPipe``) execute
  ``_step_microbatches``; their ``pipeline_order`` is only a drawing aid (in
  torch 2.13 ``Schedule1F1B``'s numbers the last rank's micro-batches from 1,
  e.g. ``2F1 .. 2F4`` for four micro-batches). pipesim therefore records the
  calls that ``_step_microbatches`` makes on a stand-in stage, rank by rank:
  the order torch really runs.

:func:`schedule_from_pipeline_order` converts any ``{rank: [action, ...]}``
mapping whose actions print like torch's ``_Action`` (``0F3``,
``(0F3;3B1)OVERLAP_F_B``), e.g. the ``pipeline_order`` of a schedule a user
filled with ``_load_csv``; it needs no torch at all.

Parity with torch 2.13 (``tests/test_torch_parity.py``): pipesim's own
``1f1b``, ``gpipe``, ``looped-bfs``, ``interleaved-zb``, ``zb-h1`` (= torch's
interleaved zero bubble on one chunk), ``zbv`` and ``dualpipev`` produce
exactly torch's per-rank compute orders. Deliberate differences:

1. ``Schedule1F1B.pipeline_order`` draws the last rank's micro-batches as
   ``1..m`` instead of ``0..m-1``; torch runs ``_step_microbatches``, whose
   order is pipesim's ``1f1b`` (and what this module imports).
2. ``interleaved-1f1b`` keeps Megatron-LM's micro-batch groups (size ``N``,
   default ``p``, the last group taking the remainder: for p=2, v=2, N=3, m=5
   the forwards run micro-batches 0 1 2 0 1 2 3 4 3 4 on chunks
   0 0 0 1 1 1 0 0 1 1). Torch's ``ScheduleInterleaved1F1B`` picks
   ``N = m // max(1, m // p)`` and refuses ``m`` it does not divide; with
   ``group_size=N`` pipesim gives torch's order.

``pipesim`` never imports torch at module import time; torch is imported
inside :func:`schedule_from_torch` only (install it with the ``verify`` extra).

>>> order = {0: ["0F0", None, "0B0"], 1: [None, "1F0", "1B0"]}
>>> [[str(a) for a in rank] for rank in schedule_from_pipeline_order(order).orders]
[['0F0', '0B0'], ['1F0', '1B0']]
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from pipesim.actions import Action, Op, Work, parse_action
from pipesim.errors import ParseError, PipesimError, ScheduleError, UnknownNameError
from pipesim.schedule import Schedule

__all__ = ["schedule_from_pipeline_order", "schedule_from_torch", "torch_schedule_names"]

# torch's action types that are not computation: dropped from an imported order.
_COMMUNICATION = ("UNSHARD", "RESHARD", "SEND_F", "RECV_F", "SEND_B", "RECV_B", "REDUCE_GRAD")


def schedule_from_pipeline_order(
    pipeline_order: Mapping[int, Sequence[object | None]],
    /,
    *,
    n_microbatches: int | None = None,
    name: str = "torch",
) -> Schedule:
    """A Schedule from torch's ``{rank: [action or None, ...]}`` (compute actions only).

    ``None`` (an idle step) and communication actions (``1SEND_F0``,
    ``0REDUCE_GRAD``, ...) are dropped; anything else must print as a pipesim
    action. The placement is inferred from which rank runs each stage.
    """
    if not isinstance(pipeline_order, Mapping) or not pipeline_order:
        raise ParseError(
            f"pipeline_order must be a non-empty mapping rank -> list of actions, got "
            f"{type(pipeline_order).__name__}"
        )
    ranks = sorted(pipeline_order)
    if ranks != list(range(len(ranks))):
        raise ParseError(f"pipeline_order ranks must be 0..n-1, got {ranks}")
    orders: list[list[Work]] = []
    for rank in ranks:
        order: list[Work] = []
        for position, action in enumerate(pipeline_order[rank]):
            if action is None:
                continue
            text = str(action)
            if any(kind in text for kind in _COMMUNICATION):
                continue
            try:
                order.append(parse_action(text))
            except ParseError as exc:
                raise ParseError(
                    f"pipeline_order rank {rank}, position {position}: {exc}"
                ) from None
        orders.append(order)
    return Schedule.from_orders(orders, n_microbatches=n_microbatches, name=name)


def torch_schedule_names() -> tuple[str, ...]:
    """The schedule classes of the installed torch that :func:`schedule_from_torch` knows."""
    schedules = _torch_schedules()
    return tuple(
        sorted(
            name
            for name, value in vars(schedules).items()
            if name.startswith("Schedule")
            and isinstance(value, type)
            and issubclass(value, schedules._PipelineSchedule)
        )
    )


def schedule_from_torch(
    schedule_class: str | type,
    /,
    *,
    n_ranks: int,
    n_microbatches: int,
    virtual: int | None = None,
) -> Schedule:
    """The order torch's ``schedule_class`` runs on ``n_ranks`` ranks.

    ``schedule_class`` is a class or its name (``"ScheduleZBVZeroBubble"``, or
    torch's short name ``"ZBVZeroBubble"``). ``virtual`` is the stages per
    rank of a multi-stage class (default 2; 1 for single-stage classes). The
    stage -> rank placement is the one torch uses (looped, or V-shaped for
    ZB-V and DualPipeV). Torch's refusals become ScheduleErrors.
    """
    for label, value in (("n_ranks", n_ranks), ("n_microbatches", n_microbatches)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ScheduleError(f"{label} must be a whole number >= 1, got {value!r}")
    schedules = _torch_schedules()
    cls = _resolve(schedules, schedule_class)
    label = cls.__name__
    if issubclass(cls, schedules.PipelineScheduleSingle):
        if virtual not in (None, 1):
            raise ScheduleError(
                f"torch's {label} runs one stage per rank, got virtual={virtual}; drop --virtual"
            )
        orders = [
            _record_single(schedules, cls, rank, n_ranks, n_microbatches) for rank in range(n_ranks)
        ]
        return Schedule.from_orders(
            orders, placement=tuple(range(n_ranks)), n_microbatches=n_microbatches, name=label
        )
    v = 2 if virtual is None else virtual
    if isinstance(v, bool) or not isinstance(v, int) or v < 1:
        raise ScheduleError(f"virtual must be a whole number >= 1, got {v!r}")
    stages = [
        _StandInStage(stage=c * n_ranks, n_stages=n_ranks * v, n_ranks=n_ranks) for c in range(v)
    ]
    # The compute order is ready before the constructor lowers it with send / recv
    # actions for the runtime; skip that lowering, which pipesim does not need.
    compute_only = type(cls.__name__, (cls,), {"_prepare_schedule_with_comms": _skip_lowering})
    try:
        instance = compute_only(stages, n_microbatches)
    except (ValueError, RuntimeError, AssertionError) as exc:
        raise ScheduleError(
            f"torch's {label} refuses {n_ranks} ranks x {v} stages with {n_microbatches} "
            f"micro-batches: {exc}"
        ) from None
    order = getattr(instance, "pipeline_order", None)
    if not order:
        raise ScheduleError(
            f"torch's {label} has no built-in order (pipeline_order is empty); write its "
            "order as a CSV and load that instead"
        )
    return schedule_from_pipeline_order(order, n_microbatches=n_microbatches, name=label)


def _skip_lowering(self: object, actions: object, format: str = "compute_only") -> None:
    return None


def _torch_schedules() -> Any:
    try:
        from torch.distributed.pipelining import schedules
    except ImportError:
        raise PipesimError(
            "importing a torch schedule needs torch, which is not installed; install the "
            "verify extra: pip install 'pipesim[verify]'"
        ) from None
    return schedules


def _resolve(schedules: Any, schedule_class: str | type) -> type:
    if isinstance(schedule_class, type):
        if not issubclass(schedule_class, schedules._PipelineSchedule):
            raise UnknownNameError(f"{schedule_class!r} is not a torch pipeline schedule class")
        return schedule_class
    value = getattr(schedules, schedule_class, None)
    if value is None:
        value = getattr(schedules, "Schedule" + schedule_class, None)
    if not (isinstance(value, type) and issubclass(value, schedules._PipelineSchedule)):
        raise UnknownNameError(
            f"unknown torch schedule class {schedule_class!r}; torch "
            f"{_torch_version()} has: {', '.join(torch_schedule_names())}"
        )
    return value


def _torch_version() -> str:
    import torch

    return str(torch.__version__)


class _StandInStage:
    """What torch's schedule constructors read from a stage, and nothing more."""

    def __init__(self, *, stage: int, n_stages: int, n_ranks: int) -> None:
        self.stage_index = stage
        self.num_stages = n_stages
        self.group_size = n_ranks
        self.group_rank = stage % n_ranks
        self.submod = None  # not a module: torch skips its torch.compile check
        self.stage_index_to_group_rank: dict[int, int] = {}
        # Never the last stage: no loss is computed, so no targets are needed.
        self.is_first = stage == 0
        self.is_last = False


class _RecordingStage(_StandInStage):
    """A stand-in stage for single-stage classes that records what torch runs on it."""

    def __init__(self, *, stage: int, n_stages: int) -> None:
        super().__init__(stage=stage, n_stages=n_stages, n_ranks=n_stages)
        self.has_backward = False
        self.ran: list[Action] = []

    def forward_one_chunk(self, microbatch: int, *args: object, **kwargs: object) -> None:
        self.ran.append(Action(stage=self.stage_index, op=Op.F, microbatch=microbatch))

    def backward_one_chunk(self, microbatch: int, *args: object, **kwargs: object) -> None:
        full = kwargs.get("full_backward", True)
        op = Op.B if full else Op.I
        self.ran.append(Action(stage=self.stage_index, op=op, microbatch=microbatch))

    def backward_weight_one_chunk(self, microbatch: int, *args: object, **kwargs: object) -> None:
        self.ran.append(Action(stage=self.stage_index, op=Op.W, microbatch=microbatch))

    def _no_ops(self, *args: object, **kwargs: object) -> list[object]:
        return []

    get_fwd_recv_ops = get_fwd_send_ops = get_bwd_recv_ops = get_bwd_send_ops = _no_ops

    def perform_reduce_grad(self, *args: object, **kwargs: object) -> None:
        return None

    def clear_runtime_states(self) -> None:
        return None


def _record_single(schedules: Any, cls: type, rank: int, n_ranks: int, m: int) -> list[Work]:
    stage = _RecordingStage(stage=rank, n_stages=n_ranks)
    label = cls.__name__
    try:
        instance = cls(stage, m)
        # The stand-in needs no shape inference: mark the stage initialised.
        instance._stage_forward_initialized = True
        instance._stage_backward_initialized = False
        instance._step_microbatches([()] * m, [{}] * m)
    except (ValueError, RuntimeError, AssertionError, TypeError) as exc:
        raise ScheduleError(
            f"torch's {label} refuses {n_ranks} ranks with {m} micro-batches: {exc}"
        ) from None
    if not stage.ran:
        raise ScheduleError(f"torch's {label} ran nothing on a stand-in stage")
    return list(stage.ran)
