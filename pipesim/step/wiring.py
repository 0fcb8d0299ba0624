"""Wiring a step: apply the dependency rules (:mod:`pipesim.step.dependencies`) to every
action present, turn each cross-rank data edge into a message between two ranks (per
ordered rank pair, a link), and record per node the arrivals it waits for and sends;
for a comms schedule, move each message's departure to its SEND node and (blocking
receives) its arrival to its RECV node.

Messages are numbered in edge order (by consumer node, then prerequisite order), so a
producer sends its messages in increasing id.

>>> from pipesim.step.numbering import number_works
>>> from pipesim.schedules import generate
>>> schedule = generate("gpipe", n_ranks=2, n_microbatches=1)
>>> works = [w for order in schedule.orders for w in order]
>>> wiring = wire(schedule, works, (range(0, 2), range(2, 4)), (0, 0, 1, 1),
...               number_works(schedule, works))
>>> list(wiring.producers), list(wiring.consumers), wiring.pairs  # by consumer: 0B0 first
([3, 0], [1, 2], ((1, 0), (0, 1)))
>>> wiring.inputs, wiring.outputs
([(), (0,), (1,), ()], [(1,), (), (), (0,)])
"""

from __future__ import annotations

from array import array
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import NamedTuple

from pipesim.actions import Action, Comm, Work, action_code, code_parts
from pipesim.schedule import Schedule
from pipesim.step.dependencies import prerequisites
from pipesim.step.numbering import Numbering, part_of

__all__ = ["Edges", "MessageRow", "Wiring", "message_row", "place_comms", "wire"]


class MessageRow(NamedTuple):
    """A cross-rank data message as the compiled step numbers it: ``consumer`` (on
    ``dst_rank``) needs ``producer``'s output (on ``src_rank``), with both nodes. Its id is
    its index in ``StepStructure.messages``. (:class:`pipesim.comms.Message` is the same
    hand-over as a schedule names it, with its SEND and RECV.)"""

    producer: Action
    consumer: Action
    producer_node: int
    consumer_node: int
    src_rank: int
    dst_rank: int


def message_row(
    works: Sequence[Work],
    ranks: Sequence[int],
    message_parts: Mapping[int, tuple[Action, Action]],
    message: int,
    source: int,
    node: int,
) -> MessageRow:
    """Message ``message`` from node ``source`` to node ``node`` as a row."""
    parts = message_parts.get(message)
    producer, consumer = (works[source], works[node]) if parts is None else parts
    return MessageRow(producer, consumer, source, node, ranks[source], ranks[node])  # type: ignore[arg-type]


@dataclass(frozen=True, slots=True, kw_only=True)
class Edges:
    """Every data edge present, in :meth:`StepStructure.data_edges` order."""

    sources: array[int]
    consumers: array[int]
    parts: dict[int, tuple[Action, Action]]
    """Per edge that touches an overlapped unit, the (producer, consumer) actions."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Wiring:
    """The messages among the data edges, and what each node waits for and sends."""

    producers: array[int]
    consumers: array[int]
    message_parts: dict[int, tuple[Action, Action]]
    pairs: tuple[tuple[int, int], ...]
    pair_of: array[int]
    inputs: list[tuple[int, ...]]
    outputs: list[tuple[int, ...]]
    back_edge: bool
    edges: Edges | None
    """Every data edge, same rank or not (when asked for: :meth:`StepStructure.data_edges`)."""


def wire(
    schedule: Schedule,
    works: Sequence[Work],
    orders: Sequence[range],
    ranks: Sequence[int],
    numbering: Numbering,
    *,
    keep_edges: bool = False,
) -> Wiring:
    """Apply :func:`prerequisites` to every action present, in node order (an overlapped
    unit's parts in their order; a duplicated action waits only as its first node), in
    one pass: a cross-rank edge becomes a message, numbered in edge order; a same-rank
    edge is covered by program order, unless it points back (a cycle)."""
    width, table, action_keys = numbering.width, numbering.table, numbering.action_keys
    offsets = _need_offsets(schedule, numbering)
    overlapped = numbering.overlap_keys
    unique = numbering.n_keys == len(works) + sum(len(k) - 1 for k in overlapped.values())
    empty: tuple[int, ...] = ()
    inputs: list[tuple[int, ...]] = [empty] * len(works)
    outputs: list[tuple[int, ...]] = [empty] * len(works)
    producers, consumers, pair_of = array("l"), array("l"), array("l")
    add_producer, add_consumer, add_pair = producers.append, consumers.append, pair_of.append
    pair_at: dict[int, int] = {}  # src * n_ranks + dst -> pair id, numbered by first use
    pair_get, n_ranks = pair_at.get, schedule.n_ranks
    message_parts: dict[int, tuple[Action, Action]] = {}
    edges = Edges(sources=array("l"), consumers=array("l"), parts={}) if keep_edges else None
    back_edge = False
    message = 0
    slow = bool(overlapped) or edges is not None  # parts to name, or every edge to keep
    parts = None
    for rank, order in enumerate(orders):
        first, stop = order.start, order.stop  # a rank's nodes are consecutive
        for node, key in zip(order, action_keys[first:stop], strict=True):
            for part_key in (key,) if key >= 0 else overlapped[node]:
                if not unique and table[part_key] != node:
                    continue
                for offset in offsets[part_key // width]:
                    source = table[part_key + offset]
                    if source < 0:
                        continue
                    if slow:
                        parts = None
                        if overlapped and (key < 0 or source in overlapped):
                            need = part_of(works[source], part_key + offset, width)
                            parts = (need, part_of(works[node], part_key, width))
                        if edges is not None:
                            if parts is not None:
                                edges.parts[len(edges.sources)] = parts
                            edges.sources.append(source)
                            edges.consumers.append(node)
                    if first <= source < stop:  # same rank: program order covers it
                        if source > node:
                            back_edge = True
                        continue
                    pair_key = ranks[source] * n_ranks + rank
                    pair = pair_get(pair_key)
                    if pair is None:
                        pair = pair_at[pair_key] = len(pair_at)
                    if parts is not None:
                        message_parts[message] = parts
                    add_producer(source)
                    add_consumer(node)
                    add_pair(pair)
                    single = (message,)  # shared: () + single is single itself, no copy
                    outputs[source] += single
                    inputs[node] += single
                    message += 1
    return Wiring(
        producers=producers,
        consumers=consumers,
        message_parts=message_parts,
        pairs=tuple(divmod(key, n_ranks) for key in pair_at),
        pair_of=pair_of,
        inputs=inputs,
        outputs=outputs,
        back_edge=back_edge,
        edges=edges,
    )


def _need_offsets(schedule: Schedule, numbering: Numbering) -> list[tuple[int, ...]]:
    """Per action code (:func:`~pipesim.actions.action_code`): the key offsets of what it waits for
    (:func:`prerequisites`, same micro-batch), in prerequisite order."""
    per_copy = schedule.n_stages // schedule.n_copies
    width = numbering.width
    largest = max(numbering.action_keys, default=-1) // width
    for keys in numbering.overlap_keys.values():
        largest = max(largest, *(k // width for k in keys))
    offsets = []
    for code in range(largest + 1):
        stage, op = code_parts(code)
        needs = prerequisites(stage, op, 0, per_copy=per_copy)
        offsets.append(tuple((action_code(s, need) - code) * width for s, need, _ in needs))
    return offsets


def place_comms(
    programs: Sequence[Sequence[Work | Comm]],
    orders: Sequence[range],
    messages: Sequence[MessageRow],
    inputs: list[tuple[int, ...]],
    outputs: list[tuple[int, ...]],
    *,
    blocking_receives: bool,
) -> tuple[tuple[Sequence[int], ...], tuple[Comm, ...], tuple[int, ...], tuple[int, ...]]:
    """Number the sends and receives after the work and move each message's departure to
    its send node and, with ``blocking_receives``, its arrival to its receive node
    (``inputs`` and ``outputs`` are extended in place). A send or receive naming no
    message gets none; a message no program sends or receives keeps leaving at its
    producer or arriving at its consumer."""
    if len(programs) != len(orders):
        raise AssertionError(f"{len(programs)} programs for {len(orders)} ranks")
    send_of = {Comm.send_of(m.producer): k for k, m in enumerate(messages)}
    recv_of = {Comm.recv_of(m.producer, m.consumer): k for k, m in enumerate(messages)}
    n_works = len(inputs)
    comms: list[Comm] = []
    comm_ranks: list[int] = []
    comm_messages: list[int] = []
    placed: list[Sequence[int]] = []
    for rank, (program, order) in enumerate(zip(programs, orders, strict=True)):
        nodes = iter(order)
        row: list[int] = []
        for step in program:
            if type(step) is not Comm:
                row.append(next(nodes))
                continue
            node = n_works + len(comms)
            message = (send_of if step.op.is_send else recv_of).get(step, -1)
            comms.append(step)
            comm_ranks.append(rank)
            comm_messages.append(message)
            inputs.append(())
            outputs.append(())
            row.append(node)
        placed.append(tuple(row))
    for node, message in enumerate(comm_messages, start=n_works):
        if message < 0:
            continue
        if comms[node - n_works].op.is_send:
            producer = messages[message].producer_node
            outputs[producer] = tuple(a for a in outputs[producer] if a != message)
            outputs[node] = (message,)
        elif blocking_receives:
            consumer = messages[message].consumer_node
            inputs[consumer] = tuple(a for a in inputs[consumer] if a != message)
            inputs[node] = (message,)
    return tuple(placed), tuple(comms), tuple(comm_ranks), tuple(comm_messages)
