"""Communication as schedule actions: the messages of a step, and the order they travel in.

A compute schedule says what each rank computes; between ranks, activations and
gradients travel as point-to-point messages. Without tags (NCCL matches sends
and receives by their order alone, pytorch issues #94819, #125079) both ends of
every pair of ranks must issue their sends and receives in *one* order that both
derive from the schedule. pipesim's rule:

1. **One global order.** :func:`global_order` is a topological order of the
   schedule's dependency graph (each rank's order, every data dependency, the
   ``happens_before`` constraints), ties broken by (position in the rank's
   order, rank): the ranks step in lock-step like a clock. The in-process
   executor runs exactly this order.
2. **Every message is sent and received at one point of that order.** Walking
   the global order, a unit of work is followed on its rank by a ``SEND`` of
   each message it produces, and the receiving rank gets the matching ``RECV``
   at the same moment (:func:`lower_comms`). This is torch's own lowering,
   ``_add_send_recv`` in ``torch/distributed/pipelining/schedules.py``, which
   lets "a sender on another rank put our recv ops in place" so that the
   ordering is "sane (non-hanging)".

Each rank's program is then a projection of one global sequence in which every
send sits next to its receive, so between any two ranks all messages (both
directions) are issued in the same order on both ends, and no blocking
semantics can deadlock it: by induction along the global sequence, the next
item can always run, because everything before it on both ranks it involves has
run (a send and its receive meet). That covers rendezvous sends (NCCL's
``ncclSend`` blocks until the peer posts the receive), blocking receives (gloo)
and per-pair FIFO streams. Moving receives later, as torch's
``_defer_recv_ops`` does, needs care: receiving in rank-parity order only after
pytorch issue #172668 showed the circular wait it otherwise creates.
:func:`validate_comms` checks any comms schedule (a torch CSV too) for exactly
these hazards before anything runs: every cross-rank message sent once after
its producer and received once before its consumer, the same order of messages
on both ends of every direction, and no cycle of waits when every send and
receive blocks until its peer arrives (the cycle is named).

Spelling follows torch: ``1SEND_F0`` is stage 1 sending micro-batch 0's
activation, ``2RECV_F0`` stage 2 receiving it; ``2SEND_B0`` / ``1RECV_B0`` the
gradient going back.

>>> from pipesim.schedules import generate
>>> comms = lower_comms(generate("1f1b", n_ranks=2, n_microbatches=2))
>>> [str(x) for x in comms.programs[1]]
['1RECV_F0', '1F0', '1RECV_F1', '1B0', '1SEND_B0', '1F1', '1B1', '1SEND_B1']
"""

from __future__ import annotations

import csv
import heapq
import io
import re
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TypeAlias

import networkx as nx

from pipesim.actions import Action, Comm, CommOp, Op, Work, parse_action
from pipesim.csv_rows import check_last_row, read_rows
from pipesim.errors import DeadlockError, ParseError, ScheduleError, summarise
from pipesim.graph import check_structure, validate
from pipesim.schedule import Schedule
from pipesim.step.structure import StepStructure, step_structure

__all__ = [
    "Comm",
    "CommOp",
    "CommSchedule",
    "Instruction",
    "Message",
    "Step",
    "comm_schedule_from_programs",
    "comms_from_csv",
    "comms_to_csv",
    "global_order",
    "is_comms_csv",
    "lower_comms",
    "messages",
    "parse_instruction",
    "parse_step",
    "receive_posts",
    "validate_comms",
]


#: One instruction of a rank's program in a comms schedule: compute work or a send /
#: receive. (A *step* is a training iteration's work, never a program entry.)
Instruction: TypeAlias = Work | Comm
#: The old name of :data:`Instruction`, still importable.
Step: TypeAlias = Instruction

_COMM = re.compile(r"(\d+)(SEND_F|RECV_F|SEND_B|RECV_B)(\d+)")
# torch's lowering also adds FSDP actions (_add_unshard_reshard, _add_reduce_grad); they move
# no pipeline data, so a comms schedule read from torch leaves them out.
_FSDP = re.compile(r"\d+(UNSHARD|RESHARD|REDUCE_GRAD)\d*")


def parse_instruction(text: str) -> Instruction | None:
    """Parse ``"1SEND_F0"`` or a compute action; ``None`` for torch's FSDP-only actions.

    >>> parse_instruction("3RECV_B2"), parse_instruction("0REDUCE_GRAD")
    (Comm(stage=3, op=<CommOp.RECV_B: 'RECV_B'>, microbatch=2), None)
    """
    match = _COMM.fullmatch(text)
    if match is not None:
        return Comm(stage=int(match[1]), op=CommOp(match[2]), microbatch=int(match[3]))
    if _FSDP.fullmatch(text):
        return None
    try:
        return parse_action(text)
    except ParseError:
        raise ParseError(
            f"cannot parse {text!r}: write a compute action ('0F3', '(0F3;3B1)OVERLAP_F_B') or "
            "a send / receive ('1SEND_F0', '2RECV_F0', '2SEND_B0', '1RECV_B0')"
        ) from None


#: The old name of :func:`parse_instruction`, still importable.
parse_step = parse_instruction


@dataclass(frozen=True, slots=True, kw_only=True)
class Message:
    """An activation or gradient handed from one stage to another.

    ``index`` is its place in the step's global send order (see the module
    docstring); messages between stages of one rank stay in that rank.
    """

    producer: Action
    consumer: Action
    src_rank: int
    dst_rank: int
    index: int

    @property
    def crosses_ranks(self) -> bool:
        """True when the message travels between two ranks."""
        return self.src_rank != self.dst_rank

    @property
    def is_forward(self) -> bool:
        """True for an activation (F to F), False for a gradient (B/I to B/I)."""
        return self.producer.op is Op.F

    @property
    def send(self) -> Comm:
        """The send half, torch's spelling (``1SEND_F0``)."""
        return Comm.send_of(self.producer)

    @property
    def recv(self) -> Comm:
        """The receive half, torch's spelling (``2RECV_F0``)."""
        return Comm.recv_of(self.producer, self.consumer)

    def __str__(self) -> str:
        return f"{self.producer} -> {self.consumer} (rank {self.src_rank} -> {self.dst_rank})"


def global_order(schedule: Schedule, /) -> tuple[Work, ...]:
    """The one order of all the schedule's work that its messages follow (validates first).

    >>> from pipesim.schedules import generate
    >>> [str(w) for w in global_order(generate("gpipe", n_ranks=2, n_microbatches=2))]
    ['0F0', '1F0', '0F1', '1F1', '1B0', '0B0', '1B1', '0B1']
    """
    structure = step_structure(schedule)
    check_structure(schedule, structure)
    return _global_order(structure)


def _global_order(structure: StepStructure) -> tuple[Work, ...]:
    """:func:`global_order` of a validated structure: ready work by (position in its
    rank's order, rank), a heap-ordered topological sort.

    networkx's ``lexicographical_topological_sort`` with that key gives the same order,
    but building its graph makes lowering (:func:`lower_comms`, which every rendezvous
    run and comms validation goes through) about twice as slow on a large schedule."""
    succ = structure.successors()
    indegree = [0] * structure.n_nodes
    for targets in succ:
        for t in targets:
            indegree[t] += 1
    positions, ranks = structure.positions, structure.ranks
    ready = [(positions[n], ranks[n], n) for n, d in enumerate(indegree) if d == 0]
    heapq.heapify(ready)
    order: list[Work] = []
    while ready:
        _, _, node = heapq.heappop(ready)
        order.append(structure.works[node])
        for t in succ[node]:
            indegree[t] -= 1
            if indegree[t] == 0:
                heapq.heappush(ready, (positions[t], ranks[t], t))
    return tuple(order)


def messages(schedule: Schedule, /) -> tuple[Message, ...]:
    """Every hand-over between two stages, in the global send order.

    >>> from pipesim.schedules import generate
    >>> [str(m) for m in messages(generate("gpipe", n_ranks=2, n_microbatches=1))]
    ['0F0 -> 1F0 (rank 0 -> 1)', '1B0 -> 0B0 (rank 1 -> 0)']
    """
    structure = step_structure(schedule)
    check_structure(schedule, structure)
    return _messages(schedule, structure, _global_order(structure))


def _messages(
    schedule: Schedule, structure: StepStructure, order: Sequence[Work]
) -> tuple[Message, ...]:
    """:func:`messages` from a validated structure and its global order."""
    by_producer: dict[Action, list[Action]] = defaultdict(list)
    # The dependency rules are pipesim.step.dependencies'; a hand-over is a data edge
    # between two stages.
    for _, _, producer, consumer in structure.data_edges():
        if producer.stage != consumer.stage:
            by_producer[producer].append(consumer)
    found: list[Message] = []
    for work in order:
        for part in work.parts:
            for consumer in by_producer.get(part, ()):
                found.append(
                    Message(
                        producer=part,
                        consumer=consumer,
                        src_rank=schedule.rank_of(part.stage),
                        dst_rank=schedule.rank_of(consumer.stage),
                        index=len(found),
                    )
                )
    return tuple(found)


@dataclass(frozen=True, slots=True, kw_only=True)
class CommSchedule:
    """A compute schedule with each rank's sends and receives placed in its program."""

    schedule: Schedule
    """The compute schedule (each program without its sends and receives)."""
    programs: tuple[tuple[Instruction, ...], ...]
    """Per rank, its compute work, sends and receives in order."""

    @property
    def name(self) -> str:
        """The compute schedule's name."""
        return self.schedule.name


def lower_comms(schedule: Schedule, /) -> CommSchedule:
    """Place a SEND after each producer and its RECV at the same point of the global order
    (torch's ``_add_send_recv``); see the module docstring for why this cannot deadlock."""
    structure = step_structure(schedule)  # built and validated once for the whole lowering
    check_structure(schedule, structure)
    order = _global_order(structure)
    produced: dict[Action, list[Message]] = defaultdict(list)
    for message in _messages(schedule, structure, order):
        if message.crosses_ranks:
            produced[message.producer].append(message)
    programs: list[list[Instruction]] = [[] for _ in range(schedule.n_ranks)]
    for work in order:
        programs[schedule.rank_of(work.parts[0].stage)].append(work)
        for part in work.parts:
            for message in produced.get(part, ()):
                programs[message.src_rank].append(message.send)
                programs[message.dst_rank].append(message.recv)
    return CommSchedule(schedule=schedule, programs=tuple(tuple(p) for p in programs))


def receive_posts(structure: StepStructure, /) -> tuple[int, ...]:
    """Per message of ``structure``, the node after which its receiving rank posts its
    receive (-1: before its first node): where the comms schedule places the RECV, or for a
    compute schedule where :func:`lower_comms` places it (what ``pipesim verify`` and
    torch's runtime run). A rendezvous send (:mod:`pipesim.engine`) leaves no earlier.

    >>> from pipesim.schedules import generate
    >>> s = step_structure(generate("gpipe", n_ranks=2, n_microbatches=2))
    >>> [(str(m.producer), str(s.works[p]) if p >= 0 else None)
    ...  for m, p in zip(s.messages, receive_posts(s))]
    [('1B0', '0F1'), ('1B1', '0B0'), ('0F0', None), ('0F1', '1F0')]
    """
    posts = [-1] * structure.n_messages
    if structure.explicit_comms:
        n_works = structure.n_nodes
        for program in structure.programs:
            before = -1
            for node in program:
                if node >= n_works:
                    message = structure.comm_messages[node - n_works]
                    comm = structure.comms[node - n_works]
                    if message >= 0 and not comm.op.is_send:
                        posts[message] = before
                before = node
        return tuple(posts)
    ids = {Comm.recv_of(m.producer, m.consumer): i for i, m in enumerate(structure.messages)}
    for lowered in lower_comms(structure.schedule).programs:
        after = -1
        for instruction in lowered:
            if isinstance(instruction, Comm):
                message = ids.get(instruction, -1)
                if message >= 0 and not instruction.op.is_send:
                    posts[message] = after
            else:
                work_node = structure.node_of(instruction.parts[0])
                assert work_node is not None
                after = work_node
    return tuple(posts)


def comm_schedule_from_programs(
    programs: list[list[Instruction]], /, *, name: str = "custom", n_microbatches: int | None = None
) -> CommSchedule:
    """Build a CommSchedule from per-rank programs; the compute schedule is their compute part."""
    orders = [[s for s in program if not isinstance(s, Comm)] for program in programs]
    schedule = Schedule.from_orders(orders, n_microbatches=n_microbatches, name=name)
    return CommSchedule(schedule=schedule, programs=tuple(tuple(p) for p in programs))


def validate_comms(comms: CommSchedule, /) -> None:
    """Refuse a comms schedule whose sends and receives would pair wrong tensors or hang.

    Raises ScheduleError (a message sent or received twice, never, on the wrong
    rank, before its producer or after its consumer, or in different orders on
    the two ends) or DeadlockError with one cycle of waits, where every send and
    receive blocks until its peer has reached it.
    """
    schedule = comms.schedule
    validate(schedule)
    wanted = {m.send: m for m in messages(schedule) if m.crosses_ranks}
    wanted_recv = {m.recv: m for m in wanted.values()}
    problems: list[str] = []
    sends: dict[Message, tuple[int, int]] = {}
    recvs: dict[Message, tuple[int, int]] = {}
    done: dict[Action, tuple[int, int]] = {}
    for rank, program in enumerate(comms.programs):
        for position, instruction in enumerate(program):
            if not isinstance(instruction, Comm):
                for part in instruction.parts:
                    done[part] = (rank, position)
                continue
            table, seen = (wanted, sends) if instruction.op.is_send else (wanted_recv, recvs)
            message = table.get(instruction)
            side = "src_rank" if instruction.op.is_send else "dst_rank"
            if message is None or getattr(message, side) != rank:
                problems.append(
                    f"rank {rank} position {position}: {instruction} matches no message between "
                    "ranks of this schedule; remove it"
                )
            elif message in seen:
                problems.append(f"rank {rank}: {instruction} appears twice; keep one")
            else:
                seen[message] = (rank, position)
    problems += _placement_problems(wanted.values(), sends, recvs, done)
    problems += _order_problems(comms, sends, recvs)
    if problems:
        raise ScheduleError(summarise("invalid comms schedule", problems))
    cycle = _wait_cycle(comms, sends, recvs)
    if cycle:
        raise DeadlockError(
            "the sends and receives deadlock when each blocks until its peer arrives: "
            + " -> ".join(cycle)
            + " -> (back to the start); move the receive before the work that waits on it",
            cycle=cycle,
        )


def _placement_problems(
    wanted: object,
    sends: dict[Message, tuple[int, int]],
    recvs: dict[Message, tuple[int, int]],
    done: dict[Action, tuple[int, int]],
) -> list[str]:
    problems = []
    for message in wanted:  # type: ignore[attr-defined]
        if message not in sends:
            problems.append(f"{message.send} is missing on rank {message.src_rank} ({message})")
        elif sends[message][1] < done[message.producer][1]:
            problems.append(f"{message.send} comes before {message.producer}, which produces it")
        if message not in recvs:
            problems.append(f"{message.recv} is missing on rank {message.dst_rank} ({message})")
        elif recvs[message][1] > done[message.consumer][1]:
            problems.append(f"{message.recv} comes after {message.consumer}, which needs it")
    return problems


def _order_problems(
    comms: CommSchedule,
    sends: dict[Message, tuple[int, int]],
    recvs: dict[Message, tuple[int, int]],
) -> list[str]:
    """Untagged messages pair up by order: the k-th send from a to b meets b's k-th receive
    from a. Different orders on the two ends would pair the wrong tensors."""
    out: dict[tuple[int, int], list[Message]] = defaultdict(list)
    into: dict[tuple[int, int], list[Message]] = defaultdict(list)
    for m in sorted(sends, key=sends.__getitem__):
        out[(m.src_rank, m.dst_rank)].append(m)
    for m in sorted(recvs, key=recvs.__getitem__):
        into[(m.src_rank, m.dst_rank)].append(m)
    problems = []
    for pair, sent in sorted(out.items()):
        for k, (a, b) in enumerate(zip(sent, into.get(pair, []), strict=False)):
            if a != b:
                problems.append(
                    f"rank {pair[0]} sends {a.send} as its message {k} to rank {pair[1]}, which "
                    f"receives {b.recv} there: without tags they would pair the wrong tensors; "
                    "receive in the order the peer sends"
                )
                break
    return problems


def _wait_cycle(
    comms: CommSchedule,
    sends: dict[Message, tuple[int, int]],
    recvs: dict[Message, tuple[int, int]],
) -> tuple[str, ...]:
    """A cycle of waits when every program runs in order and a send and its receive happen
    together (both block until the other is reached); empty when there is none."""
    graph = nx.DiGraph()
    node_at: dict[tuple[int, int], object] = {}
    for message, at in sends.items():
        node_at[at] = ("msg", message)
    for message, at in recvs.items():
        node_at[at] = ("msg", message)
    for rank, program in enumerate(comms.programs):
        previous = None
        for position in range(len(program)):
            node = node_at.get((rank, position), ("work", rank, position))
            if previous is not None:
                graph.add_edge(previous, node)
            previous = node
    try:
        cycle = nx.find_cycle(graph)
    except nx.NetworkXNoCycle:
        return ()

    def name(node: object) -> str:
        assert isinstance(node, tuple)
        if node[0] == "msg":
            return f"{node[1].send}/{node[1].recv}"
        return str(comms.programs[node[1]][node[2]])

    return tuple(name(u) for u, _ in cycle)


def comms_to_csv(comms: CommSchedule, /) -> str:
    """``comms`` in torch's "compute_comms" CSV (``_dump_csv(format="compute_comms")``):
    one row per rank, one action per cell, sends and receives included.

    >>> from pipesim.schedules import generate
    >>> print(comms_to_csv(lower_comms(generate("gpipe", n_ranks=2, n_microbatches=1))), end="")
    0F0,0SEND_F0,0RECV_B0,0B0
    1RECV_F0,1F0,1B0,1SEND_B0
    """
    check_last_row(comms.programs, name=comms.schedule.name)
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    for program in comms.programs:
        writer.writerow([str(instruction) for instruction in program])
    return buffer.getvalue()


def comms_from_csv(
    text: str, /, *, name: str = "custom", n_microbatches: int | None = None, source: str = "csv"
) -> CommSchedule:
    """Read a "compute_comms" CSV, torch's own included (its FSDP actions ``UNSHARD``,
    ``RESHARD`` and ``REDUCE_GRAD`` move no pipeline data and are left out). Not validated:
    see :func:`validate_comms`."""
    programs: list[list[Instruction]] = []
    for line, row in enumerate(read_rows(text, source=source), start=1):
        program: list[Instruction] = []
        for column, cell in enumerate(row, start=1):
            cell = cell.strip()
            if not cell:
                continue
            try:
                instruction = parse_instruction(cell)
            except ParseError as exc:
                raise ParseError(f"{source}: line {line}, column {column}: {exc}") from None
            if instruction is not None:
                program.append(instruction)
        programs.append(program)
    return comm_schedule_from_programs(programs, name=name, n_microbatches=n_microbatches)


def is_comms_csv(text: str, /) -> bool:
    """Whether a CSV holds sends or receives (torch's "compute_comms" format).

    >>> is_comms_csv("0F0,0SEND_F0"), is_comms_csv("0F0,0B0")
    (True, False)
    """
    return _COMM.search(text) is not None
