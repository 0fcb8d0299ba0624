"""A cost model as small tables per cost key and stage: what each unit of work costs
(duration, with the overheads it pays for its messages), its memory effect
(:mod:`pipesim.step.memory`), and the message-size rule: F sends its stage's
``output_bytes``; the gradient B or I of stage s sends back has the shape of stage
s-1's output. The engine's compiled step (:func:`pipesim.step.compile_step`), the
planner's evaluators and the synthesizer read these tables.

>>> from pipesim.costs import StageCost
>>> costs = CostModel(stages=(StageCost(output_bytes=3), StageCost(output_bytes=5)))
>>> message_bytes(costs, Action(stage=1, op=Op.F, microbatch=0))
5
>>> tables = cost_tables(costs, n_stages=2, forward_only=False)
>>> tables.forward_bytes, tables.gradient_bytes
([3, 5], [0, 3])
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from pipesim.actions import Action, Op, Overlap, action_code
from pipesim.costs import CostModel, Link
from pipesim.exact import Time
from pipesim.step.dependencies import forward_source, gradient_source
from pipesim.step.memory import Effect, stage_effects, work_effect
from pipesim.step.structure import StepStructure

__all__ = [
    "CostTables",
    "comm_durations",
    "comm_overhead",
    "cost_tables",
    "message_bytes",
    "overhead_tables",
    "post_times",
]

_F, _B = Op.F, Op.B


# -- the message-size rule -------------------------------------------------------------
def message_bytes(costs: CostModel, producer: Action, /) -> int:
    """Bytes ``producer`` sends: F its stage's ``output_bytes``; B or I of stage s a
    gradient shaped like stage s-1's output (0 for the first stage).

    >>> from pipesim.costs import StageCost
    >>> costs = CostModel(stages=(StageCost(output_bytes=3), StageCost(output_bytes=5)))
    >>> message_bytes(costs, Action(stage=1, op=Op.F, microbatch=0))
    5
    >>> message_bytes(costs, Action(stage=1, op=Op.I, microbatch=0))
    3
    """
    if producer.op is _F:
        return costs.stage(producer.stage).output_bytes
    return costs.stage(producer.stage - 1).output_bytes if producer.stage > 0 else 0


# -- the tables -----------------------------------------------------------------------
@dataclass(frozen=True, slots=True, kw_only=True)
class CostTables:
    """A cost model as small tables indexed by cost key (``StepStructure.keys``) and stage."""

    durations: list[Time]
    """Per cost key: how long that work runs."""
    effects: list[Effect]
    """Per cost key: its memory effect (:mod:`pipesim.step.memory`)."""
    forward_bytes: list[int]
    """Per stage: bytes its F sends (:func:`message_bytes`)."""
    gradient_bytes: list[int]
    """Per stage: bytes its B or I sends."""


def overhead_tables(
    costs: CostModel,
    /,
    *,
    placement: Sequence[int],
    n_copies: int = 1,
    explicit_comms: bool = False,
    posted_receives: bool = False,
) -> list[Time]:
    """Per cost key (:func:`pipesim.actions.action_code`; overlaps after), the time a unit
    of work holds its rank beyond its compute: ``dispatch_overhead`` once,
    ``send_overhead`` per cross-rank message it sends and ``receive_overhead`` per
    cross-rank message it takes (:mod:`pipesim.costs`).
    With ``explicit_comms`` (a comms schedule) the sends and receives are nodes of their
    own that pay the message overheads (:func:`comm_durations`), so work pays its dispatch
    only; with ``posted_receives`` too, a RECV only posts and the work that takes the
    message pays its ``receive_overhead``, once it has arrived, as in a compute schedule.
    A rank is busy for the same total every way.

    Which messages cross ranks follows from the dependency rules and the placement
    alone: F of s sends to the stage that reads it, s + 1, and takes from s - 1;
    B or I of s sends the input gradient to s - 1 and takes s + 1's; W neither.

    >>> from pipesim.costs import Link
    >>> costs = CostModel.uniform(link=Link(send_overhead=3, receive_overhead=5),
    ...                           dispatch_overhead=1).for_stages(2)
    >>> overhead_tables(costs, placement=(0, 1))  # F, B, I, W of stage 0, then of stage 1
    [4, 6, 6, 1, 6, 4, 4, 1]
    """
    n_stages = len(placement)
    per_copy = n_stages // n_copies
    dispatch = costs.dispatch_overhead
    if explicit_comms and not posted_receives:
        return [dispatch] * (4 * n_stages)
    sends = not explicit_comms
    overheads: list[Time] = []
    for s in range(n_stages):
        here = placement[s]
        reads = forward_source(s, per_copy=per_copy)
        takes_f = reads is not None and placement[reads] != here
        sends_f = s + 1 < n_stages and forward_source(s + 1, per_copy=per_copy) == s
        sends_f = sends_f and placement[s + 1] != here
        grad = gradient_source(s, per_copy=per_copy)
        takes_g = grad is not None and placement[grad] != here
        sends_g = s > 0 and gradient_source(s - 1, per_copy=per_copy) == s
        sends_g = sends_g and placement[s - 1] != here
        # Each message pays the overheads of the link it takes (CostModel.link_between).
        forward = dispatch
        if sends and sends_f:
            forward += comm_overhead(costs.link_between(here, placement[s + 1]), send=True)
        if takes_f:
            forward += comm_overhead(costs.link_between(placement[reads], here), send=False)  # type: ignore[index]
        backward = dispatch
        if sends and sends_g:
            backward += comm_overhead(costs.link_between(here, placement[s - 1]), send=True)
        if takes_g:
            backward += comm_overhead(costs.link_between(placement[grad], here), send=False)  # type: ignore[index]
        overheads += [forward, backward, backward, dispatch]
    return overheads


def comm_overhead(link: Link, /, *, send: bool) -> Time:
    """The time one cross-rank message over ``link`` holds the rank that sends it
    (``send``) or takes it: the link's ``send_overhead`` or ``receive_overhead``.

    >>> comm_overhead(Link(send_overhead=3, receive_overhead=5), send=False)
    5
    """
    return link.send_overhead if send else link.receive_overhead


def comm_durations(structure: StepStructure, pair_links: Sequence[Link], /) -> list[Time]:
    """Per send or receive node of a comms schedule, how long it holds its rank: the
    overhead of its message's link (:func:`comm_overhead`; 0 when it names no message),
    and a receive its ``post_overhead`` too (:func:`post_times`). A posted receive
    (``blocking_receives`` off) holds it for its posting alone: the receive overhead is
    the cost of *taking* a message that has arrived, which the work that needs it pays
    (:func:`overhead_tables`), as ``verify``'s transport posts an ``irecv`` at the RECV
    and waits and checks the header where the message is used. How long the rank then
    waits for a message to arrive is the engine's to find."""
    durations: list[Time] = []
    pair_of = structure.pair_of
    posted = not structure.blocking_receives
    for comm, message in zip(structure.comms, structure.comm_messages, strict=True):
        if message < 0:
            durations.append(0)
            continue
        link = pair_links[pair_of[message]]
        if comm.op.is_send:
            durations.append(comm_overhead(link, send=True))
        elif posted:
            durations.append(link.post_overhead)
        else:
            durations.append(link.post_overhead + comm_overhead(link, send=False))
    return durations


def post_times(structure: StepStructure, pair_links: Sequence[Link], /) -> tuple[Time, ...]:
    """Per message, how long its receiving rank spends posting its receive: its link's
    ``post_overhead``. In a compute schedule the rank pays it after the work (and that
    work's sends) where :func:`pipesim.comms.lower_comms` places the ``RECV``
    (:func:`pipesim.comms.receive_posts`), in a comms schedule at the ``RECV`` itself
    (:func:`comm_durations`): ``verify``'s transport allocates the buffer and calls
    ``irecv`` there (about 0.2 ms a receive with gloo on CPU ranks:
    ``docs/results/gloo-transport.md``)."""
    pair_of = structure.pair_of
    return tuple(pair_links[pair_of[m]].post_overhead for m in range(structure.n_messages))


def cost_tables(
    costs: CostModel,
    /,
    *,
    n_stages: int,
    forward_only: bool,
    overlaps: Sequence[Overlap] = (),
    placement: Sequence[int] | None = None,
    n_copies: int = 1,
    explicit_comms: bool = False,
    posted_receives: bool = False,
) -> CostTables:
    """The tables of ``costs`` for a schedule of ``n_stages`` (and these overlaps) whose
    stages sit on ranks ``placement`` (default: one rank per stage).

    Durations include the overheads of :func:`overhead_tables` (``explicit_comms``: see
    there); an overlapped pair pays one dispatch and its parts' message overheads.

    >>> tables = cost_tables(CostModel.uniform(backward=3), n_stages=2, forward_only=False)
    >>> tables.durations  # F, B, I, W of stage 0, then of stage 1
    [1, 3, 1, 1, 1, 3, 1, 1]
    """
    costs = costs.for_stages(n_stages)
    where = tuple(range(n_stages)) if placement is None else tuple(placement)
    extra = overhead_tables(
        costs,
        placement=where,
        n_copies=n_copies,
        explicit_comms=explicit_comms,
        posted_receives=posted_receives,
    )
    durations: list[Time] = []
    for cost in costs.stages:
        durations += [cost.forward, cost.backward, cost.input_grad, cost.weight_grad]
    durations = [d + e if e else d for d, e in zip(durations, extra, strict=True)]
    for work in overlaps:
        parts = sum((extra[action_code(a.stage, a.op)] for a in work.parts), start=0)
        parts -= (len(work.parts) - 1) * costs.dispatch_overhead  # one dispatch per unit
        durations.append(costs.duration(work) + parts)
    per_stage = stage_effects(costs, n_stages=n_stages, forward_only=forward_only)
    effects = [effect for row in per_stage for effect in row]
    effects += [work_effect(per_stage, work) for work in overlaps]
    forward_bytes, gradient_bytes = [], []
    for s in range(n_stages):
        forward_bytes.append(message_bytes(costs, Action(stage=s, op=_F, microbatch=0)))
        gradient_bytes.append(message_bytes(costs, Action(stage=s, op=_B, microbatch=0)))
    return CostTables(
        durations=durations,
        effects=effects,
        forward_bytes=forward_bytes,
        gradient_bytes=gradient_bytes,
    )
