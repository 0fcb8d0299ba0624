"""The compiled step: one pipeline step as tables every evaluator, view and executor reads.

This module holds the model's rules, each written once:

- **dependencies** (torch.distributed.pipelining's stage semantics): F of stage
  s needs F of stage s-1 (same micro-batch); B or I of stage s needs F of
  stage s (its saved activations) and, below the last stage, the input
  gradient of stage s+1 (its B or I); W of stage s needs I of stage s. With
  ``Schedule.n_copies > 1`` "s-1" and "s+1" stay inside one model copy: a
  copy's first stage reads the input, its last computes the loss
  (:func:`forward_source`, :func:`gradient_source`, :func:`prerequisites`);
- **message sizes**: F sends its stage's ``output_bytes``; the gradient B or I
  of stage s sends back has the shape of stage s-1's output
  (:func:`message_bytes`);
- **memory**: :mod:`pipesim.memory`;
- **the deadlock error** (:func:`deadlock_error`).

Two layers, so that the planner builds the first once per schedule and
reuses it for many cost models:

- :func:`step_structure` -> :class:`StepStructure`, independent of costs: the
  units of work as integer nodes (rank, position, per-rank orders), every data
  edge, the cross-rank messages in the order their producers send them (as
  columns), the cross-rank ``happens_before`` signals, per node the arrivals it
  waits for and produces, and on demand a topological order (None when the waits
  form a cycle);
- :func:`compile_step` -> :class:`CompiledStep`, one row per unit of work:
  duration and memory effect, and per message its bytes, link, occupancy and
  latency.

>>> from pipesim.costs import CostModel
>>> from pipesim.schedules import generate
>>> structure = step_structure(generate("1f1b", n_ranks=2, n_microbatches=2))
>>> [str(structure.works[n]) for n in structure.orders[1]]
['1F0', '1B0', '1F1', '1B1']
>>> [(str(m.producer), str(m.consumer), m.src_rank, m.dst_rank) for m in structure.messages]
[('1B0', '0B0', 1, 0), ('1B1', '0B1', 1, 0), ('0F0', '1F0', 0, 1), ('0F1', '1F1', 0, 1)]
>>> step = compile_step(structure, CostModel.uniform(output_bytes=8))
>>> step.row(structure.messages[2].producer_node)
StepRow(node=0, rank=0, position=0, duration=1, waits_for=(), sends=(2,), \
effect=Effect(start_bytes=0, start_count=1, end_bytes=0, end_count=0))
>>> step.message_bytes[2], step.message_bytes[0]  # 0F0's output; 1B0's gradient, shaped alike
(8, 8)
"""

from __future__ import annotations

import itertools
from array import array
from collections import deque
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import NamedTuple, Protocol, cast, overload

import networkx as nx

from pipesim.actions import OP_INDEX, Action, Comm, Op, Overlap, Work
from pipesim.costs import CostModel, Link
from pipesim.errors import DeadlockError
from pipesim.exact import Time
from pipesim.memory import NO_EFFECT, Effect, stage_effects, work_effect
from pipesim.schedule import Schedule

__all__ = [
    "CompiledStep",
    "CostTables",
    "Message",
    "StepRow",
    "StepStructure",
    "comm_durations",
    "comm_overhead",
    "compile_step",
    "cost_tables",
    "deadlock_error",
    "find_cycle",
    "forward_source",
    "gradient_source",
    "message_bytes",
    "message_columns",
    "overhead_tables",
    "prerequisites",
    "step_structure",
]

_Key = tuple[int, Op, int]
_F, _B, _I, _W = Op.F, Op.B, Op.I, Op.W
_OPS = (_F, _B, _I, _W)  # by OP_INDEX


# -- the dependency rules --------------------------------------------------------------
def forward_source(stage: int, /, *, per_copy: int) -> int | None:
    """The stage whose output F of ``stage`` reads; None for a copy's first stage
    (it reads the input micro-batch).

    >>> forward_source(0, per_copy=4), forward_source(5, per_copy=4), forward_source(4, per_copy=4)
    (None, 4, None)
    """
    return stage - 1 if stage % per_copy else None


def gradient_source(stage: int, /, *, per_copy: int) -> int | None:
    """The stage whose input gradient B or I of ``stage`` reads; None for a copy's last
    stage (it computes the loss).

    >>> gradient_source(2, per_copy=4), gradient_source(3, per_copy=4)
    (3, None)
    """
    return stage + 1 if (stage + 1) % per_copy else None


def prerequisites(stage: int, op: Op, microbatch: int, /, *, per_copy: int) -> tuple[_Key, ...]:
    """The actions ``(stage, op, microbatch)`` waits for, as ``(stage, op, microbatch)``
    keys; a gradient is named both as B and I of the next stage (a schedule runs one).

    >>> prerequisites(1, Op.I, 0, per_copy=3)
    ((1, <Op.F: 'F'>, 0), (2, <Op.B: 'B'>, 0), (2, <Op.I: 'I'>, 0))
    """
    if op is _F:
        source = forward_source(stage, per_copy=per_copy)
        return () if source is None else ((source, _F, microbatch),)
    if op is _W:
        return ((stage, _I, microbatch),)
    grad = gradient_source(stage, per_copy=per_copy)
    if grad is None:
        return ((stage, _F, microbatch),)
    return ((stage, _F, microbatch), (grad, _B, microbatch), (grad, _I, microbatch))


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


# -- the structure ---------------------------------------------------------------------
class Message(NamedTuple):
    """A cross-rank data message: ``consumer`` (on ``dst_rank``) needs ``producer``'s
    output (on ``src_rank``). Its id is its index in ``StepStructure.messages``."""

    producer: Action
    consumer: Action
    producer_node: int
    consumer_node: int
    src_rank: int
    dst_rank: int


class KeyTable(Protocol):
    """Action key -> node, -1 for a key no rank runs (see ``StepStructure.node_at``)."""

    def __getitem__(self, key: int, /) -> int: ...  # pragma: no cover

    def __len__(self) -> int: ...  # pragma: no cover


class _Sparse(dict[int, int]):
    """A :class:`KeyTable` for keys too spread out for a dense array (a mistyped
    micro-batch of 10**6 in a four-action file): a dict answering -1 for an absent key."""

    __slots__ = ()

    def __missing__(self, key: int) -> int:
        return -1


@dataclass(frozen=True, slots=True, kw_only=True)
class StepStructure:
    """The cost-independent part of a step (see the module docstring).

    Nodes are integers: node ``n`` is ``works[n]``, at ``positions[n]`` in the
    order of rank ``ranks[n]``. Arrivals are what a node can wait for: ids
    ``0 .. len(messages) - 1`` are the messages, the next ``len(signals)`` the
    cross-rank ``happens_before`` signals (they arrive when their work ends).
    Large columns are ``array`` objects (8 bytes an entry), so a step of a million
    actions stays small.
    """

    schedule: Schedule
    works: tuple[Work, ...]
    ranks: tuple[int, ...]
    positions: Sequence[int]
    """Per node, its index in its rank's order."""
    orders: tuple[range, ...]
    """Per rank, its node ids in program order: a rank's nodes are numbered consecutively."""
    width: int
    """Micro-batch stride of the action keys: ``n_microbatches``, or one more than the
    largest micro-batch named when that is larger."""
    node_at: KeyTable
    """Action key ``(4 * stage + OP_INDEX[op]) * width + microbatch`` -> the node running
    that action (the first if duplicated), -1 if none; see :meth:`node_of`. A dense table
    has room for 8 codes past the largest key present (every prerequisite key of a key
    present can be read without a bounds check); keys past its end are absent too."""
    n_keys: int
    """How many distinct action keys the works hold (fewer than their parts: a duplicate)."""
    extra_edges: tuple[tuple[int, int], ...]
    """``happens_before`` constraints between nodes (actions no rank runs are skipped)."""
    producers: Sequence[int]
    """Per message (cross-rank data edge, in ``data_edges`` order, so grouped by consumer),
    the node that sends it; a producer sends its messages in increasing id."""
    consumers: Sequence[int]
    """Per message, the node that waits for it."""
    message_parts: Mapping[int, tuple[Action, Action]]
    """Per message whose producer or consumer is an overlapped unit, the (producer,
    consumer) actions it joins; any other message joins the two works themselves."""
    signals: tuple[tuple[int, int], ...]
    """Cross-rank ``happens_before`` edges (node, node); arrival id ``len(messages) + j``."""
    inputs: tuple[tuple[int, ...], ...]
    """Per node, the arrival ids it waits for before it starts."""
    outputs: tuple[tuple[int, ...], ...]
    """Per node, the arrival ids it produces when it ends (messages first, in send order)."""
    keys: Sequence[int]
    """Per node, its cost key: ``4 * stage + OP_INDEX[op]`` for an action,
    ``4 * n_stages + j`` for ``overlaps[j]`` (see :class:`CostTables`)."""
    overlaps: tuple[Overlap, ...]
    pairs: tuple[tuple[int, int], ...]
    """The ordered rank pairs (source, destination) that carry messages, by pair id."""
    pair_of: Sequence[int]
    """Per message, the id of its rank pair."""
    back_edge: bool
    """Whether some work waits for later work of its own rank (a cycle through program
    order; :func:`pipesim.graph.validate` names it)."""
    programs: tuple[Sequence[int], ...]
    """Per rank, every node it runs in program order: ``orders``, with a comms schedule's
    send and receive nodes in their places (see :func:`step_structure`)."""
    comms: tuple[Comm, ...] = ()
    """The sends and receives of a comms schedule: node ``n_nodes + j`` is ``comms[j]``."""
    comm_ranks: tuple[int, ...] = ()
    """Per send or receive, its rank."""
    comm_messages: tuple[int, ...] = ()
    """Per send or receive, the id of the message it sends or receives (-1: none)."""
    explicit_comms: bool = False
    """True when built from a comms schedule: its messages leave at their SEND nodes, not
    at the end of the work that produces them."""
    blocking_receives: bool = False
    """True when a comms schedule's RECV nodes wait for their messages (else the work
    that needs a message waits for it, the RECV only posting it)."""
    _order: list[Sequence[int] | None] = field(
        default_factory=list, init=False, repr=False, compare=False
    )

    @property
    def topological(self) -> Sequence[int] | None:
        """Every node after everything it waits for; None when the waits form a cycle.
        Computed when first read (the engine needs none: a run finds a cycle itself)."""
        if not self._order:
            order = None
            if not self.back_edge:
                order = _topological_order(
                    self.programs, self.inputs, self.outputs, self.n_arrivals
                )
            self._order.append(order)
        return self._order[0]

    @property
    def n_nodes(self) -> int:
        """Number of units of work (sends and receives not counted)."""
        return len(self.works)

    @property
    def n_messages(self) -> int:
        """Number of cross-rank data messages."""
        return len(self.producers)

    @property
    def n_steps(self) -> int:
        """Number of nodes: units of work, then sends and receives."""
        return len(self.works) + len(self.comms)

    def step(self, node: int, /) -> Work | Comm:
        """What ``node`` runs: a unit of work, a send or a receive."""
        n_works = len(self.works)
        return self.works[node] if node < n_works else self.comms[node - n_works]

    def rank_of_node(self, node: int, /) -> int:
        """The rank that runs ``node``."""
        n_works = len(self.works)
        return self.ranks[node] if node < n_works else self.comm_ranks[node - n_works]

    @property
    def n_arrivals(self) -> int:
        """Messages plus signals."""
        return len(self.producers) + len(self.signals)

    @property
    def messages(self) -> Sequence[Message]:
        """The messages as :class:`Message` rows, made when read (the step keeps columns)."""
        return _Messages(self)

    @property
    def per_copy(self) -> int:
        """Stages per model copy (``n_stages`` unless ``Schedule.n_copies > 1``)."""
        return self.schedule.n_stages // self.schedule.n_copies

    def node_of(self, action: Action, /) -> int | None:
        """The node that runs ``action`` (None if no rank does)."""
        if action.microbatch >= self.width:
            return None
        key = (4 * action.stage + OP_INDEX[action.op]) * self.width + action.microbatch
        return self.node_at[key] if self.has_key(key) else None

    def has_key(self, key: int, /) -> bool:
        """Whether some node runs the action with this key (see ``node_at``)."""
        table = self.node_at
        return (type(table) is _Sparse or 0 <= key < len(table)) and table[key] >= 0

    def present_keys(self) -> Iterator[int]:
        """The action keys some node runs, in increasing order."""
        table = self.node_at
        if type(table) is _Sparse:
            return iter(sorted(table))
        dense = cast("array[int]", table)
        return itertools.compress(range(len(dense)), map((-1).__ne__, dense))

    def reads_input(self, stage: int, /) -> bool:
        """Whether F of ``stage`` reads the input micro-batch (a copy's first stage)."""
        return forward_source(stage, per_copy=self.per_copy) is None

    def computes_loss(self, stage: int, /) -> bool:
        """Whether ``stage`` computes the loss (a copy's last stage)."""
        return gradient_source(stage, per_copy=self.per_copy) is None

    def data_edges(self) -> Iterator[tuple[int, int, Action, Action]]:
        """Every data dependency present, same rank or not, as (producer node, consumer
        node, producer, consumer); cross-rank ones are the messages, in the same order."""
        numbering = _numbering_of(self)
        wiring = _wire(
            self.schedule, self.works, self.orders, self.ranks, numbering, keep_edges=True
        )
        edges, works = wiring.edges, self.works
        assert edges is not None
        for e, (source, node) in enumerate(zip(edges.sources, edges.consumers, strict=True)):
            parts = edges.parts.get(e)
            if parts is None:
                yield source, node, works[source], works[node]  # type: ignore[misc]
            else:
                yield source, node, parts[0], parts[1]

    def successors(self) -> list[list[int]]:
        """Adjacency lists over order, data and extra edges (may repeat an edge)."""
        succ: list[list[int]] = [[] for _ in self.works]
        for order in self.orders:
            for a, b in itertools.pairwise(order):
                succ[a].append(b)
        for producer, consumer, _, _ in self.data_edges():
            if producer != consumer:
                succ[producer].append(consumer)
        for a, b in self.extra_edges:
            succ[a].append(b)
        return succ


class _Messages(Sequence[Message]):
    """``StepStructure.messages``: rows made from the message columns when read."""

    __slots__ = ("_s",)

    def __init__(self, structure: StepStructure) -> None:
        self._s = structure

    def __len__(self) -> int:
        return len(self._s.producers)

    @overload
    def __getitem__(self, index: int) -> Message: ...

    @overload
    def __getitem__(self, index: slice) -> Sequence[Message]: ...

    def __getitem__(self, index: int | slice) -> Message | Sequence[Message]:
        if isinstance(index, slice):
            return [self[i] for i in range(len(self))[index]]
        s = self._s
        source, node = s.producers[index], s.consumers[index]
        return _message_row(s.works, s.ranks, s.message_parts, index % len(self), source, node)

    def __iter__(self) -> Iterator[Message]:
        return (self[i] for i in range(len(self)))


def _message_row(
    works: Sequence[Work],
    ranks: Sequence[int],
    message_parts: Mapping[int, tuple[Action, Action]],
    message: int,
    source: int,
    node: int,
) -> Message:
    """Message ``message`` from node ``source`` to node ``node`` as a row."""
    parts = message_parts.get(message)
    producer, consumer = (works[source], works[node]) if parts is None else parts
    return Message(producer, consumer, source, node, ranks[source], ranks[node])  # type: ignore[arg-type]


# -- building the structure --------------------------------------------------------------
_DENSE_SLOTS = 8  # a dense key table may take this many slots per action before a dict


@dataclass(frozen=True, slots=True, kw_only=True)
class _Numbering:
    """Each work's action key(s) and the key -> node table (while building a structure)."""

    width: int
    keys: array[int]
    """Per node, its cost key (see ``StepStructure.keys``)."""
    action_keys: array[int]
    """Per node, its action key; -1 for an overlapped unit (its parts: ``overlap_keys``)."""
    overlap_keys: dict[int, tuple[int, ...]]
    """Per overlapped node, the action keys of its parts, in order."""
    overlaps: tuple[Overlap, ...]
    table: KeyTable
    n_keys: int


def _numbering_of(structure: StepStructure) -> _Numbering:
    """The numbering a built structure came from (for :meth:`StepStructure.data_edges`)."""
    width, table = structure.width, structure.node_at
    keys = array("l", structure.keys)
    action_keys = array("l", [-1]) * len(keys)
    overlap_keys: dict[int, tuple[int, ...]] = {}
    for node, work in enumerate(structure.works):
        if type(work) is Action:
            action_keys[node] = (4 * work.stage + OP_INDEX[work.op]) * width + work.microbatch
        else:
            overlap_keys[node] = _part_keys(work, width)
    return _Numbering(
        width=width,
        keys=keys,
        action_keys=action_keys,
        overlap_keys=overlap_keys,
        overlaps=structure.overlaps,
        table=table,
        n_keys=structure.n_keys,
    )


def _part_keys(work: Work, width: int) -> tuple[int, ...]:
    return tuple((4 * a.stage + OP_INDEX[a.op]) * width + a.microbatch for a in work.parts)


def _number(schedule: Schedule, works: Sequence[Work]) -> _Numbering:
    """Give every work its cost key and action key(s), and index the keys."""
    if not set(map(type, works)) <= {Action}:
        widest = max((a.microbatch for work in works for a in work.parts), default=0)
        return _number_each(schedule, works, max(schedule.n_microbatches, 1 + widest))
    actions = cast("Sequence[Action]", works)
    microbatches = [action.microbatch for action in actions]
    # A micro-batch past n_microbatches (an invalid schedule) widens the stride.
    width = max(schedule.n_microbatches, 1 + max(microbatches, default=0))
    # The codes 4 * stage + OP_INDEX[op] and keys code * width + micro-batch, in bulk.
    op_index = OP_INDEX
    codes = [4 * action.stage + op_index[action.op] for action in actions]
    keys = array("l", codes)
    action_keys = array("l", [c * width + mb for c, mb in zip(codes, microbatches, strict=True)])
    size = _table_size(action_keys, {}, width)
    table: array[int] | _Sparse
    if size:
        table = array("l", [-1]) * size
        # Assigned last to first, so that the first node of a duplicated key keeps it.
        deque(map(table.__setitem__, reversed(action_keys), range(len(works) - 1, -1, -1)), 0)
        n_keys = size - table.count(-1)
    else:
        table = _Sparse(zip(reversed(action_keys), range(len(works) - 1, -1, -1), strict=True))
        n_keys = len(table)
    return _Numbering(
        width=width,
        keys=keys,
        action_keys=action_keys,
        overlap_keys={},
        overlaps=(),
        table=table,
        n_keys=n_keys,
    )


def _number_each(schedule: Schedule, works: Sequence[Work], width: int) -> _Numbering:
    """:func:`_number` work by work, for a schedule with overlapped units."""
    keys, action_keys = array("l"), array("l")
    overlaps: list[Overlap] = []
    overlap_keys: dict[int, tuple[int, ...]] = {}
    overlap_base, op_index = 4 * schedule.n_stages, OP_INDEX
    for node, work in enumerate(works):
        if type(work) is Action:
            code = 4 * work.stage + op_index[work.op]
            keys.append(code)
            action_keys.append(code * width + work.microbatch)
            continue
        keys.append(overlap_base + len(overlaps))
        action_keys.append(-1)
        overlaps.append(work)  # type: ignore[arg-type]
        overlap_keys[node] = _part_keys(work, width)
    size = _table_size(action_keys, overlap_keys, width)
    table: array[int] | _Sparse = array("l", [-1]) * size if size else _Sparse()
    n_keys = 0
    for node, key in enumerate(action_keys):
        for part_key in overlap_keys[node] if key < 0 else (key,):
            if table[part_key] < 0:
                table[part_key] = node
                n_keys += 1
    return _Numbering(
        width=width,
        keys=keys,
        action_keys=action_keys,
        overlap_keys=overlap_keys,
        overlaps=tuple(overlaps),
        table=table,
        n_keys=n_keys,
    )


def _table_size(
    action_keys: array[int], overlap_keys: Mapping[int, tuple[int, ...]], width: int
) -> int:
    """The size of a dense key table, with room past the largest key for every
    prerequisite key (a prerequisite's code is less than 8 above); 0 when the keys are
    too spread out for one (a dict then)."""
    largest = max((max(k) for k in overlap_keys.values()), default=-1)
    largest = max(largest, max(action_keys, default=-1))
    size = (largest // width + 8) * width
    n_parts = len(action_keys) + sum(len(k) - 1 for k in overlap_keys.values())
    return size if size <= _DENSE_SLOTS * n_parts + 4096 else 0


@dataclass(frozen=True, slots=True, kw_only=True)
class _Edges:
    """Every data edge present, in :meth:`StepStructure.data_edges` order."""

    sources: array[int]
    consumers: array[int]
    parts: dict[int, tuple[Action, Action]]
    """Per edge that touches an overlapped unit, the (producer, consumer) actions."""


def _need_offsets(schedule: Schedule, numbering: _Numbering) -> list[tuple[int, ...]]:
    """Per action code ``4 * stage + op index``: the key offsets of what it waits for
    (:func:`prerequisites`, same micro-batch), in prerequisite order."""
    per_copy = schedule.n_stages // schedule.n_copies
    width = numbering.width
    largest = max(numbering.action_keys, default=-1) // width
    for keys in numbering.overlap_keys.values():
        largest = max(largest, *(k // width for k in keys))
    offsets = []
    for code in range(largest + 1):
        stage, column = divmod(code, 4)
        needs = prerequisites(stage, _OPS[column], 0, per_copy=per_copy)
        offsets.append(tuple((4 * s + OP_INDEX[op] - code) * width for s, op, _ in needs))
    return offsets


def _part(work: Work, key: int, width: int) -> Action:
    """The part of ``work`` with this action key."""
    code, microbatch = divmod(key, width)
    for action in work.parts:
        if 4 * action.stage + OP_INDEX[action.op] == code and action.microbatch == microbatch:
            return action
    raise AssertionError(f"{work} has no part with key {key}")  # pragma: no cover


def step_structure(
    schedule: Schedule,
    /,
    *,
    programs: Sequence[Sequence[Work | Comm]] | None = None,
    blocking_receives: bool = True,
) -> StepStructure:
    """Number the schedule's work, derive every dependency and message, and order the
    nodes topologically (no validation: see :func:`pipesim.graph.validate`).

    ``programs`` (a comms schedule's, :class:`pipesim.comms.CommSchedule`): per rank the
    schedule's work with sends and receives placed among it. Each send or receive becomes
    a node; the message it names leaves at the send instead of at the end of its producer.
    With ``blocking_receives`` the receive waits for it instead of its consumer, which
    runs after the receive in program order (a blocking ``recv``); without, the receive
    only posts (``irecv``) and the consumer waits for the message when it starts, as
    torch's ``_PipelineScheduleRuntime`` does (validation:
    :func:`pipesim.comms.validate_comms`; semantics: :mod:`pipesim.engine`).

    >>> from pipesim.comms import lower_comms
    >>> from pipesim.schedules import generate
    >>> comms = lower_comms(generate("gpipe", n_ranks=2, n_microbatches=1))
    >>> s = step_structure(comms.schedule, programs=comms.programs)
    >>> [str(s.step(n)) for n in s.programs[0]]
    ['0F0', '0SEND_F0', '0RECV_B0', '0B0']
    >>> s.inputs[s.node_of(Action(stage=1, op=Op.F, microbatch=0))]  # its RECV waits instead
    ()
    """
    works = tuple(itertools.chain.from_iterable(schedule.orders))
    ranks: list[int] = []
    positions = array("l")
    orders: list[range] = []
    for rank, order in enumerate(schedule.orders):
        first = len(ranks)
        ranks += [rank] * len(order)
        positions.extend(range(len(order)))
        orders.append(range(first, len(ranks)))
    numbering = _number(schedule, works)
    wiring = _wire(schedule, works, orders, ranks, numbering)
    back_edge = wiring.back_edge
    extra_edges: list[tuple[int, int]] = []
    signals: list[tuple[int, int]] = []
    for a, b in schedule.happens_before:
        a_node, b_node = _node_of(numbering, a), _node_of(numbering, b)
        if a_node is None or b_node is None:
            continue
        extra_edges.append((a_node, b_node))
        if ranks[a_node] == ranks[b_node]:
            back_edge = back_edge or positions[a_node] > positions[b_node]
            continue
        arrival = len(wiring.producers) + len(signals)
        signals.append((a_node, b_node))
        wiring.outputs[a_node] += (arrival,)
        wiring.inputs[b_node] += (arrival,)
    programs_of: tuple[Sequence[int], ...] = tuple(orders)
    comms: tuple[Comm, ...] = ()
    comm_ranks: tuple[int, ...] = ()
    comm_messages: tuple[int, ...] = ()
    if programs is not None:
        rows = [
            _message_row(works, ranks, wiring.message_parts, m, source, node)
            for m, (source, node) in enumerate(zip(wiring.producers, wiring.consumers, strict=True))
        ]
        programs_of, comms, comm_ranks, comm_messages = _place_comms(
            programs,
            orders,
            rows,
            wiring.inputs,
            wiring.outputs,
            blocking_receives=blocking_receives,
        )
    inputs, outputs = tuple(wiring.inputs), tuple(wiring.outputs)
    return StepStructure(
        schedule=schedule,
        works=works,
        ranks=tuple(ranks),
        positions=positions,
        orders=tuple(orders),
        width=numbering.width,
        node_at=numbering.table,
        n_keys=numbering.n_keys,
        extra_edges=tuple(extra_edges),
        producers=wiring.producers,
        consumers=wiring.consumers,
        message_parts=wiring.message_parts,
        signals=tuple(signals),
        inputs=inputs,
        outputs=outputs,
        keys=numbering.keys,
        overlaps=numbering.overlaps,
        pairs=wiring.pairs,
        pair_of=wiring.pair_of,
        back_edge=back_edge,
        programs=programs_of,
        comms=comms,
        comm_ranks=comm_ranks,
        comm_messages=comm_messages,
        explicit_comms=programs is not None,
        blocking_receives=programs is not None and blocking_receives,
    )


def _node_of(numbering: _Numbering, action: Action) -> int | None:
    if action.microbatch >= numbering.width:
        return None
    key = (4 * action.stage + OP_INDEX[action.op]) * numbering.width + action.microbatch
    table = numbering.table
    node = table[key] if type(table) is _Sparse or key < len(table) else -1
    return None if node < 0 else node


def _place_comms(
    programs: Sequence[Sequence[Work | Comm]],
    orders: Sequence[range],
    messages: Sequence[Message],
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


@dataclass(frozen=True, slots=True, kw_only=True)
class _Wiring:
    """The messages among the data edges, and what each node waits for and sends."""

    producers: array[int]
    consumers: array[int]
    message_parts: dict[int, tuple[Action, Action]]
    pairs: tuple[tuple[int, int], ...]
    pair_of: array[int]
    inputs: list[tuple[int, ...]]
    outputs: list[tuple[int, ...]]
    back_edge: bool
    edges: _Edges | None
    """Every data edge, same rank or not (when asked for: :meth:`StepStructure.data_edges`)."""


def _wire(
    schedule: Schedule,
    works: Sequence[Work],
    orders: Sequence[range],
    ranks: Sequence[int],
    numbering: _Numbering,
    *,
    keep_edges: bool = False,
) -> _Wiring:
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
    edges = _Edges(sources=array("l"), consumers=array("l"), parts={}) if keep_edges else None
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
                            need = _part(works[source], part_key + offset, width)
                            parts = (need, _part(works[node], part_key, width))
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
    return _Wiring(
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


def _topological_order(
    orders: Sequence[Sequence[int]],
    inputs: Sequence[Sequence[int]],
    outputs: Sequence[Sequence[int]],
    n_arrivals: int,
) -> Sequence[int] | None:
    """Sweep the ranks, advancing each as far as its next work's arrivals have been
    produced, until all work is placed; None when a sweep makes no progress."""
    produced = bytearray(n_arrivals)
    positions = [0] * len(orders)
    order = array("l")
    progress = True
    while progress:
        progress = False
        for rank, nodes in enumerate(orders):
            k = start = positions[rank]
            end = len(nodes)
            while k < end:
                node = nodes[k]
                for arrival in inputs[node]:
                    if not produced[arrival]:
                        break
                else:
                    order.append(node)
                    for arrival in outputs[node]:
                        produced[arrival] = 1
                    k += 1
                    continue
                break
            if k != start:
                positions[rank] = k
                progress = True
    return order if len(order) == len(inputs) else None


# -- deadlocks -------------------------------------------------------------------------
def find_cycle(structure: StepStructure, /) -> tuple[str, ...]:
    """One wait cycle as action strings, each a prerequisite of the next (empty if none).

    Kahn's algorithm leaves exactly the nodes on or behind a cycle; networkx's
    ``find_cycle`` names one cycle among them.
    """
    succ = structure.successors()
    indegree = [0] * structure.n_nodes
    for targets in succ:
        for t in targets:
            indegree[t] += 1
    ready = [n for n, d in enumerate(indegree) if d == 0]
    while ready:
        node = ready.pop()
        for t in succ[node]:
            indegree[t] -= 1
            if indegree[t] == 0:
                ready.append(t)
    left = {n for n, d in enumerate(indegree) if d > 0}
    if not left:
        return ()
    sub = nx.DiGraph()
    for node in left:
        sub.add_edges_from((node, t) for t in succ[node] if t in left)
    return tuple(str(structure.works[u]) for u, _ in nx.find_cycle(sub))


def deadlock_error(structure: StepStructure, /, *, blocked: Sequence[int] = ()) -> DeadlockError:
    """The one error for a step that cannot finish: the wait cycle, and where ranks
    stopped when an engine ran into it (``blocked``: the node each stuck rank waits at).
    """
    cycle = find_cycle(structure)
    detail = " -> ".join((*cycle, cycle[0])) if cycle else "no cycle found"
    stuck = ""
    if blocked:
        stuck_ranks = [structure.rank_of_node(n) for n in blocked]
        stuck = f"; ranks {stuck_ranks} blocked at {[str(structure.step(n)) for n in blocked]}"
    return DeadlockError(
        f"schedule deadlocks: these actions wait on each other in a cycle: {detail}{stuck}; "
        "reorder the ranks so that each action runs after what it needs",
        cycle=cycle,
    )


# -- costs -----------------------------------------------------------------------------
@dataclass(frozen=True, slots=True, kw_only=True)
class CostTables:
    """A cost model as small tables indexed by cost key (``StepStructure.keys``) and stage."""

    durations: list[Time]
    """Per cost key: how long that work runs."""
    effects: list[Effect]
    """Per cost key: its memory effect (:mod:`pipesim.memory`)."""
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
) -> list[Time]:
    """Per cost key (``4 * stage + OP_INDEX[op]``), the time a unit of work holds its rank
    beyond its compute: ``dispatch_overhead`` once, ``send_overhead`` per cross-rank message
    it sends and ``receive_overhead`` per cross-rank message it takes (:mod:`pipesim.costs`).
    With ``explicit_comms`` (a comms schedule) the sends and receives are nodes of their
    own that pay the message overheads (:func:`comm_durations`), so work pays its dispatch
    only: a rank is busy for the same total either way.

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
    if explicit_comms:
        return [dispatch] * (4 * n_stages)
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
        if sends_f:
            forward += comm_overhead(costs.link_between(here, placement[s + 1]), send=True)
        if takes_f:
            forward += comm_overhead(costs.link_between(placement[reads], here), send=False)  # type: ignore[index]
        backward = dispatch
        if sends_g:
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
    overhead of its message's link (:func:`comm_overhead`; 0 when it names no message).
    How long the rank then waits for a message to arrive is the engine's to find."""
    durations: list[Time] = []
    pair_of = structure.pair_of
    for comm, message in zip(structure.comms, structure.comm_messages, strict=True):
        if message < 0:
            durations.append(0)
            continue
        durations.append(comm_overhead(pair_links[pair_of[message]], send=comm.op.is_send))
    return durations


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
        costs, placement=where, n_copies=n_copies, explicit_comms=explicit_comms
    )
    durations: list[Time] = []
    for cost in costs.stages:
        durations += [cost.forward, cost.backward, cost.input_grad, cost.weight_grad]
    durations = [d + e if e else d for d, e in zip(durations, extra, strict=True)]
    for work in overlaps:
        parts = sum((extra[4 * a.stage + OP_INDEX[a.op]] for a in work.parts), start=0)
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


class StepRow(NamedTuple):
    """One unit of work of a compiled step (see :meth:`CompiledStep.row`)."""

    node: int
    rank: int
    position: int
    duration: Time
    waits_for: tuple[int, ...]
    """Arrival ids (messages, then signals) it needs before it starts."""
    sends: tuple[int, ...]
    """Arrival ids it produces when it ends."""
    effect: Effect


@dataclass(frozen=True, slots=True, kw_only=True)
class CompiledStep:
    """A step under one cost model: per node and per message, everything an engine needs.

    Columns are indexed by node (``durations``, ``effects``; a comms schedule's sends and
    receives follow the work, ``StepStructure.n_steps`` in all), by message id
    (``message_bytes``, ``occupancy``, ``latency``) or by rank pair id
    (``pair_links``); :meth:`row` reads one node as a :class:`StepRow`.
    """

    structure: StepStructure
    costs: CostModel
    """The cost model, one entry per stage."""
    tables: CostTables
    durations: tuple[Time, ...]
    effects: tuple[Effect, ...]
    message_bytes: tuple[int, ...]
    pair_links: tuple[Link, ...]
    """Per rank pair id (``structure.pairs``): the link between the two ranks."""
    occupancy: tuple[Time, ...]
    """Per message: how long it holds its link (bytes / bandwidth)."""
    latency: tuple[Time, ...]
    """Per message: from leaving the link to arrival."""

    def row(self, node: int, /) -> StepRow:
        """Everything about ``node``."""
        s = self.structure
        rank = s.rank_of_node(node)
        position = s.positions[node] if node < s.n_nodes else list(s.programs[rank]).index(node)
        return StepRow(
            node=node,
            rank=rank,
            position=position,
            duration=self.durations[node],
            waits_for=s.inputs[node],
            sends=s.outputs[node],
            effect=self.effects[node],
        )


def message_columns(
    structure: StepStructure, costs: CostModel, tables: CostTables, /
) -> tuple[tuple[int, ...], tuple[Time, ...], tuple[Time, ...], tuple[Link, ...]]:
    """Per message its bytes, link occupancy and latency; per rank pair its link."""
    sizes = _message_sizes(structure, tables)
    pair_links = tuple(costs.link_between(src, dst) for src, dst in structure.pairs)
    n_messages = len(sizes)
    if all(link.is_free and type(link.latency) is int for link in pair_links):
        return sizes, (0,) * n_messages, (0,) * n_messages, pair_links  # what the loop gives
    known: dict[tuple[int, int], Time] = {}
    occupancy = []
    latency = []
    for n_bytes, pair in zip(sizes, structure.pair_of, strict=True):
        link = pair_links[pair]
        time = known.get((pair, n_bytes))
        if time is None:
            time = known[(pair, n_bytes)] = link.occupancy(n_bytes)
        occupancy.append(time)
        latency.append(link.latency)
    return sizes, tuple(occupancy), tuple(latency), pair_links


def _message_sizes(structure: StepStructure, tables: CostTables) -> tuple[int, ...]:
    """Per message, the bytes its producer sends (:func:`message_bytes`, via the tables)."""
    by_code = []  # per action code 4 * stage + op index; W sends nothing (nothing needs it)
    for forward, gradient in zip(tables.forward_bytes, tables.gradient_bytes, strict=True):
        by_code += [forward, gradient, gradient, gradient]
    by_code += [0] * len(structure.overlaps)  # an overlap's key: its part's size, below
    sizes = list(map(by_code.__getitem__, map(structure.keys.__getitem__, structure.producers)))
    for message, (producer, _) in structure.message_parts.items():
        sizes[message] = by_code[4 * producer.stage + OP_INDEX[producer.op]]
    return tuple(sizes)


def compile_step(schedule: Schedule | StepStructure, costs: CostModel, /) -> CompiledStep:
    """The step of ``schedule`` (or of an already built structure) under ``costs``."""
    structure = schedule if isinstance(schedule, StepStructure) else step_structure(schedule)
    sched = structure.schedule
    costs = costs.for_stages(sched.n_stages)
    tables = cost_tables(
        costs,
        n_stages=sched.n_stages,
        forward_only=sched.forward_only,
        overlaps=structure.overlaps,
        placement=sched.placement,
        n_copies=sched.n_copies,
        explicit_comms=structure.explicit_comms,
    )
    durations, effects = tables.durations, tables.effects
    sizes, occupancy, latency, pair_links = message_columns(structure, costs, tables)
    node_durations = list(map(durations.__getitem__, structure.keys))
    node_effects = list(map(effects.__getitem__, structure.keys))
    if structure.comms:  # sends and receives hold no memory (pipesim.memory)
        node_durations += comm_durations(structure, pair_links)
        node_effects += [NO_EFFECT] * len(structure.comms)
    return CompiledStep(
        structure=structure,
        costs=costs,
        tables=tables,
        durations=tuple(node_durations),
        effects=tuple(node_effects),
        message_bytes=sizes,
        pair_links=pair_links,
        occupancy=occupancy,
        latency=latency,
    )
