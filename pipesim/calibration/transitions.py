"""The measured steps as the fit reads them: per rank each pair of consecutive units of
work, with the messages between them and when their sends and receives were posted."""

from __future__ import annotations

import itertools
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import NamedTuple

from pipesim.calibration.measured import MeasuredStep, _records_by_node
from pipesim.comms import receive_posts
from pipesim.exact import Time
from pipesim.schedule import Schedule
from pipesim.step.structure import StepStructure, step_structure
from pipesim.trace import ActionRecord


@dataclass(frozen=True, slots=True)
class _Counts:
    structure: StepStructure
    sent: tuple[int, ...]
    taken: tuple[int, ...]


def _counts(schedule: Schedule) -> _Counts:
    structure = step_structure(schedule)
    n_messages = len(structure.messages)
    sent = tuple(sum(1 for a in out if a < n_messages) for out in structure.outputs)
    taken = tuple(sum(1 for a in ins if a < n_messages) for ins in structure.inputs)
    return _Counts(structure, sent, taken)


class _Source(NamedTuple):
    """A message's producer, as measured."""

    end: Time
    """Its compute end."""
    sent: int
    """How many messages it sends (its send overheads come before this one leaves)."""


class _Post(NamedTuple):
    """Where a message's receive is posted: after a node of the receiving rank and its sends
    (:func:`pipesim.comms.receive_posts`)."""

    end: Time
    """That node's compute end."""
    sent: int
    """How many messages that node sends."""
    ahead: int
    """How many receives its rank posts there before this one."""
    node: int
    """The node."""


class _Span(NamedTuple):
    """One node of a sending rank, as measured: to tell whether the rank was computing, or
    waking up for the node, when a receive was posted to it."""

    start: Time
    """Compute start."""
    end: Time
    """Compute end."""
    taken: int
    """Messages it takes."""
    sent: int
    """Messages it sends."""
    takes_from: frozenset[int]
    """The nodes whose messages it takes."""


@dataclass(frozen=True, slots=True)
class _Transition:
    step: int
    """Which measured step (its index) the transition is in."""
    gap: Time
    """Compute end of ``a`` to compute start of ``b``."""
    start_a: Time
    end_a: Time
    start_b: Time
    sent_a: int
    taken_b: int
    sources: tuple[_Source, ...]
    """Per message ``b`` takes: its producer."""
    posts_a: int
    """Receives ``a``'s rank posts after ``a`` (and its sends), before ``b``."""
    late_posts_a: int
    """Of those, the receives whose messages had been sent when ``a`` ended."""
    posts: tuple[_Post | None, ...]
    """Per message ``b`` takes: where its receive is posted (None: before the rank's
    first node)."""
    senders: tuple[tuple[_Span, ...], ...]
    """Per message ``b`` takes: its sending rank's nodes in order."""
    sent_pairs: frozenset[tuple[int, int]]
    """The (source, destination) rank pairs of the messages ``a`` sends."""
    taken_pairs: frozenset[tuple[int, int]]
    """The rank pairs of the messages ``b`` takes."""
    posted_pairs: frozenset[tuple[int, int]]
    """The rank pairs of the receives posted between ``a`` and ``b``."""


class _Posting(NamedTuple):
    """Per node of one measured step, the receives its rank posts after it."""

    posts: list[_Post | None]
    """Per message, where its receive is posted."""
    ahead: dict[int, int]
    """Per node, how many receives are posted after it."""
    late: dict[int, int]
    """Per node, how many of those are for messages sent before it ended."""
    pairs: dict[int, set[tuple[int, int]]]
    """Per node, the rank pairs of those receives."""


def _posting(counts: _Counts, records: Sequence[ActionRecord]) -> _Posting:
    structure = counts.structure
    found = _Posting([], defaultdict(int), defaultdict(int), defaultdict(set))
    for message, node in zip(structure.messages, receive_posts(structure), strict=True):
        found.posts.append(
            None
            if node < 0
            else _Post(records[node].end, counts.sent[node], found.ahead[node], node)
        )
        found.ahead[node] += 1
        found.pairs[node].add((message.src_rank, message.dst_rank))
        if node >= 0 and records[message.producer_node].end < records[node].end:
            found.late[node] += 1
    return found


def _spans(counts: _Counts, records: Sequence[ActionRecord]) -> list[tuple[_Span, ...]]:
    """Per rank its nodes as :class:`_Span`\\ s, in order."""
    structure = counts.structure
    n_messages = len(structure.messages)
    return [
        tuple(
            _Span(
                records[n].start,
                records[n].end,
                counts.taken[n],
                counts.sent[n],
                frozenset(
                    structure.messages[i].producer_node
                    for i in structure.inputs[n]
                    if i < n_messages
                ),
            )
            for n in order
        )
        for order in structure.orders
    ]


def _transitions(steps: Sequence[MeasuredStep]) -> list[_Transition]:
    """Every pair of consecutive units of work ``a -> b`` of a rank, in every step."""
    found = []
    for index, step in enumerate(steps):
        counts = _counts(step.schedule)
        structure = counts.structure
        records = _records_by_node(structure, step.trace)
        posting = _posting(counts, records)
        spans = _spans(counts, records)
        n_messages = len(structure.messages)
        for order in structure.orders:
            for a, b in itertools.pairwise(order):
                taken = [i for i in structure.inputs[b] if i < n_messages]
                ins = [structure.messages[i] for i in taken]
                outs = [structure.messages[i] for i in structure.outputs[a] if i < n_messages]
                found.append(
                    _Transition(
                        step=index,
                        gap=records[b].start - records[a].end,
                        start_a=records[a].start,
                        end_a=records[a].end,
                        start_b=records[b].start,
                        sent_a=counts.sent[a],
                        taken_b=counts.taken[b],
                        posts_a=posting.ahead[a],
                        late_posts_a=posting.late[a],
                        sources=tuple(
                            _Source(records[m.producer_node].end, counts.sent[m.producer_node])
                            for m in ins
                        ),
                        posts=tuple(posting.posts[i] for i in taken),
                        senders=tuple(spans[m.src_rank] for m in ins),
                        sent_pairs=frozenset((m.src_rank, m.dst_rank) for m in outs),
                        taken_pairs=frozenset((m.src_rank, m.dst_rank) for m in ins),
                        posted_pairs=frozenset(posting.pairs[a]),
                    )
                )
    return found
