"""Actions: the unit of work one rank runs, spelled like torch.distributed.pipelining.

An action is ``{stage}{op}{microbatch}``: ``0F3`` is the forward of stage 0 on
micro-batch 3. The ops follow torch's ``_ComputationType`` letters:

- ``F`` forward;
- ``B`` full backward (input gradient and weight gradient together);
- ``I`` input-gradient backward, ``W`` weight-gradient backward: zero-bubble
  schedules split ``B`` into these two (Qi et al., "Zero Bubble Pipeline
  Parallelism", ICLR 2024) so that ``W`` can fill the bubble.

A compound :class:`Overlap` runs several actions as one unit of work on a rank
(DualPipe's overlapped forward + backward pair); torch spells it
``(0F3;3B1)OVERLAP_F_B``.

Parsing is a full match: ``"0F3x"`` or ``" 0F3"`` is refused, never read as
``0F3``.

>>> parse_action("2I1")
Action(stage=2, op=<Op.I: 'I'>, microbatch=1)
>>> str(parse_action("(0F3;3B1)OVERLAP_F_B"))
'(0F3;3B1)OVERLAP_F_B'
"""

from __future__ import annotations

import enum
import re
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass
from itertools import repeat
from typing import Any, TypeAlias, cast

from pipesim.errors import ParseError, brief
from pipesim.limits import MAX_INDEX_DIGITS, MAX_MICROBATCHES, MAX_STAGES, as_int, check_range

__all__ = ["Action", "Comm", "CommOp", "Op", "Overlap", "Work", "parse_action"]


class Op(enum.Enum):
    """The kind of an action. Values are torch's one-letter spellings."""

    F = "F"
    B = "B"
    I = "I"
    W = "W"

    # Members are singletons, so identity hashing agrees with equality; it is a C call,
    # where Enum's default hashes the member name in Python (hot in graph building).
    __hash__ = object.__hash__

    @property
    def is_backward(self) -> bool:
        """True for B, I and W."""
        return self is not Op.F


#: Column of each op in per-stage tables (durations, memory effects): F, B, I, W.
OP_INDEX: dict[Op, int] = {Op.F: 0, Op.B: 1, Op.I: 2, Op.W: 3}
_OP_AT = tuple(OP_INDEX)  # column -> op
N_OPS = len(OP_INDEX)


def action_code(stage: int, op: Op) -> int:
    """The code of ``op`` on ``stage``: ``N_OPS * stage + OP_INDEX[op]``, the row of every
    per-(stage, op) table (costs, memory effects, wiring offsets). Hot loops inline it.

    >>> action_code(2, Op.I), code_parts(10)
    (10, (2, <Op.I: 'I'>))
    """
    return N_OPS * stage + OP_INDEX[op]


def code_parts(code: int) -> tuple[int, Op]:
    """The inverse of :func:`action_code`: ``(stage, op)``."""
    stage, column = divmod(code, N_OPS)
    return stage, _OP_AT[column]


# An action's indices stay within the documented limits, so no schedule can name a stage
# or micro-batch that would make a later check loop over 10**25 of them.
_INDEX_LIMITS = (
    ("stage", MAX_STAGES - 1, "MAX_STAGES"),
    ("microbatch", MAX_MICROBATCHES - 1, "MAX_MICROBATCHES"),
)


@dataclass(frozen=True, slots=True, kw_only=True, order=True)
class Action:
    """One unit of work: ``op`` of ``stage`` on ``microbatch``.

    >>> Action(stage=0, op=Op.F, microbatch=3)
    Action(stage=0, op=<Op.F: 'F'>, microbatch=3)
    >>> str(Action(stage=0, op=Op.F, microbatch=3))
    '0F3'
    """

    stage: int
    op: Op
    microbatch: int

    def __post_init__(self) -> None:
        stage, microbatch = self.stage, self.microbatch
        # The common case in one test: generators build many thousands of actions.
        if (
            type(stage) is int
            and type(microbatch) is int
            and 0 <= stage < MAX_STAGES
            and 0 <= microbatch < MAX_MICROBATCHES
            and type(self.op) is Op
        ):
            return
        for name, maximum, limit in _INDEX_LIMITS:
            value = getattr(self, name)
            if type(value) is not int:  # numpy integers and other __index__ types are fine
                index = as_int(value)
                if index is None:
                    raise ParseError(
                        f"action {name} must be a non-negative integer, got {brief(value)}"
                    )
                object.__setattr__(self, name, index)
                value = index
            if value < 0:
                raise ParseError(
                    f"action {name} must be a non-negative integer, got {brief(value)}"
                )
            if value > maximum:
                check_range(value, name=f"action {name}", maximum=maximum, limit=limit)
        if not isinstance(self.op, Op):
            raise ParseError(f"action op must be one of F, B, I, W, got {brief(self.op)}")

    def __str__(self) -> str:
        return f"{self.stage}{self.op.value}{self.microbatch}"

    @property
    def parts(self) -> tuple[Action, ...]:
        """The simple actions this unit of work is made of: itself."""
        return (self,)


# The slots of Action, set directly by trusted_action (a frozen dataclass refuses setattr).
_NEW = object.__new__
_SET_STAGE, _SET_OP, _SET_MICROBATCH = (
    cast(Any, Action).stage.__set__,
    cast(Any, Action).op.__set__,
    cast(Any, Action).microbatch.__set__,
)


def trusted_action(stage: int, op: Op, microbatch: int, /) -> Action:
    """``Action(stage=stage, op=op, microbatch=microbatch)`` without ``__post_init__``'s
    checks, for schedule generators whose indices are ints in range by construction (a
    :class:`~pipesim.schedule.Schedule` then checks its sizes against the limits). Half
    the cost of the checked constructor, which dominates building a large schedule.

    >>> trusted_action(0, Op.F, 3) == Action(stage=0, op=Op.F, microbatch=3)
    True
    """
    action = _NEW(Action)
    _SET_STAGE(action, stage)
    _SET_OP(action, op)
    _SET_MICROBATCH(action, microbatch)
    return action


def trusted_actions(stage: int, op: Op, microbatches: range, /) -> list[Action]:
    """:func:`trusted_action` for each of ``microbatches``, in bulk (the slots set by
    ``map``, not a Python loop): a generator's actions of one stage and op.

    >>> [str(a) for a in trusted_actions(2, Op.B, range(3))]
    ['2B0', '2B1', '2B2']
    """
    n = len(microbatches)
    actions = list(map(_NEW, repeat(Action, n)))
    deque(map(_SET_STAGE, actions, repeat(stage, n)), 0)
    deque(map(_SET_OP, actions, repeat(op, n)), 0)
    deque(map(_SET_MICROBATCH, actions, microbatches), 0)
    return actions


@dataclass(frozen=True, slots=True, kw_only=True)
class Overlap:
    """Several actions run as one unit of work on one rank (DualPipe's F&B pair).

    Its duration is its own cost parameter (``StageCost.overlap``), defaulting
    to the sum of its parts.

    >>> str(Overlap(parts=(parse_action("0F3"), parse_action("3B1"))))
    '(0F3;3B1)OVERLAP_F_B'
    """

    parts: tuple[Action, ...]

    def __post_init__(self) -> None:
        if len(self.parts) < 2 or not all(isinstance(p, Action) for p in self.parts):
            raise ParseError(
                f"an overlapped action needs two or more simple actions, got {brief(self.parts)}"
            )

    def __str__(self) -> str:
        return "(" + ";".join(str(p) for p in self.parts) + ")OVERLAP_F_B"

    def __iter__(self) -> Iterator[Action]:
        return iter(self.parts)


#: One entry of a rank's order: a simple action or an overlapped group.
Work: TypeAlias = Action | Overlap


class CommOp(enum.Enum):
    """A point-to-point half of a message; values are torch's ``_ComputationType`` spellings.

    The sends and receives of a comms schedule (:mod:`pipesim.comms`).
    """

    SEND_F = "SEND_F"
    RECV_F = "RECV_F"
    SEND_B = "SEND_B"
    RECV_B = "RECV_B"

    __hash__ = object.__hash__

    @property
    def is_send(self) -> bool:
        """True for SEND_F and SEND_B."""
        return self in (CommOp.SEND_F, CommOp.SEND_B)

    @property
    def is_forward(self) -> bool:
        """True for the activation (F) messages."""
        return self in (CommOp.SEND_F, CommOp.RECV_F)


@dataclass(frozen=True, slots=True, kw_only=True, order=True)
class Comm:
    """``op`` of ``stage`` on ``microbatch``: a send names the producing stage, a receive
    the consuming stage, as torch does.

    >>> str(Comm(stage=1, op=CommOp.RECV_F, microbatch=0))
    '1RECV_F0'
    >>> str(Comm.send_of(Action(stage=2, op=Op.I, microbatch=1)))
    '2SEND_B1'
    """

    stage: int
    op: CommOp
    microbatch: int

    def __str__(self) -> str:
        return f"{self.stage}{self.op.value}{self.microbatch}"

    # torch's spelling of a message's two halves (_add_send_recv): an F output travels as
    # SEND_F / RECV_F, an input gradient (from B or I) as SEND_B / RECV_B.
    @classmethod
    def send_of(cls, producer: Action, /) -> Comm:
        """The send of what ``producer`` computed."""
        op = CommOp.SEND_F if producer.op is Op.F else CommOp.SEND_B
        return cls(stage=producer.stage, op=op, microbatch=producer.microbatch)

    @classmethod
    def recv_of(cls, producer: Action, consumer: Action, /) -> Comm:
        """The receive, by ``consumer``, of what ``producer`` computed."""
        op = CommOp.RECV_F if producer.op is Op.F else CommOp.RECV_B
        return cls(stage=consumer.stage, op=op, microbatch=consumer.microbatch)


# ASCII digits only: "\d" would also read Arabic-Indic or full-width digits as numbers.
_ACTION = re.compile(r"([0-9]+)([FBIW])([0-9]+)", re.ASCII)
_OVERLAP = re.compile(r"\(([^()]*)\)OVERLAP_F_B", re.ASCII)


def parse_action(text: str) -> Work:
    """Parse ``"0F3"`` or ``"(0F3;3B1)OVERLAP_F_B"``; anything else is a ParseError.

    >>> parse_action("12W7")
    Action(stage=12, op=<Op.W: 'W'>, microbatch=7)
    >>> parse_action("0F\u0663")
    Traceback (most recent call last):
    ...
    pipesim.errors.ParseError: cannot parse action '0F٣': it has the non-ASCII digit '٣' \
(U+0663) at character 3; write indices with the digits 0-9
    """
    if not isinstance(text, str):
        raise ParseError(f"an action must be a string like '0F3', got {brief(text)}")
    match = _ACTION.fullmatch(text)
    if match is not None:
        return _simple(match)
    match = _OVERLAP.fullmatch(text)
    if match is not None:
        parts = []
        for piece in match[1].split(";"):
            part = _ACTION.fullmatch(piece)
            if part is None:
                raise ParseError(
                    f"bad part {brief(piece)} in overlapped action {brief(text)}: " + _why(piece)
                )
            parts.append(_simple(part))
        return Overlap(parts=tuple(parts))
    raise ParseError(f"cannot parse action {brief(text)}: {_why(text)}")


def _simple(match: re.Match[str]) -> Action:
    for digits, name in ((match[1], "stage"), (match[3], "micro-batch")):
        if len(digits) > MAX_INDEX_DIGITS:  # refused before int() reads 5000 digits
            raise ParseError(
                f"action {brief(match[0])}: the {name} index has {len(digits)} digits, above "
                f"pipesim's limit of {MAX_INDEX_DIGITS} (MAX_INDEX_DIGITS in pipesim.limits)"
            )
    return Action(stage=int(match[1]), op=Op(match[2]), microbatch=int(match[3]))


def _why(text: str) -> str:
    """What is wrong with an action string that does not parse, and the fix."""
    for position, char in enumerate(text, start=1):
        if char.isdigit() and not char.isascii():
            return (
                f"it has the non-ASCII digit {char!r} (U+{ord(char):04X}) at character "
                f"{position}; write indices with the digits 0-9"
            )
    return (
        "write {stage}{op}{microbatch} with op one of F, B, I, W (e.g. '0F3', '2I1'), or "
        "'(0F3;3B1)OVERLAP_F_B' for an overlapped pair"
    )
