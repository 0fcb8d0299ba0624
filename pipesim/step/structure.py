"""The cost-independent part of a pipeline step, :class:`StepStructure`, and
:func:`step_structure`, which builds it from a schedule: the units of work as integer
nodes (rank, position, per-rank orders), every data edge, the cross-rank messages in
the order their producers send them (as columns), the cross-rank ``happens_before``
signals, per node the arrivals it waits for and produces, and on demand a topological
order (None when the waits form a cycle). The planner builds it once per schedule and
prices it under many cost models (:func:`pipesim.step.compile_step`).

Built from :mod:`pipesim.step.numbering` (keys and the key -> node table) and
:mod:`pipesim.step.wiring` (edges, messages, a comms schedule's sends and receives).

>>> from pipesim.schedules import generate
>>> structure = step_structure(generate("1f1b", n_ranks=2, n_microbatches=2))
>>> [str(structure.works[n]) for n in structure.orders[1]]
['1F0', '1B0', '1F1', '1B1']
>>> [(str(m.producer), str(m.consumer), m.src_rank, m.dst_rank) for m in structure.messages]
[('1B0', '0B0', 1, 0), ('1B1', '0B1', 1, 0), ('0F0', '1F0', 0, 1), ('0F1', '1F1', 0, 1)]
"""

from __future__ import annotations

import itertools
from array import array
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import cast, overload

from pipesim.actions import Action, Comm, Overlap, Work
from pipesim.schedule import Schedule
from pipesim.step.dependencies import forward_source, gradient_source
from pipesim.step.numbering import (
    KeyTable,
    Numbering,
    SparseKeys,
    action_key,
    node_of_action,
    number_works,
    part_keys,
)
from pipesim.step.wiring import Edges, MessageRow, Wiring, message_row, place_comms, wire

__all__ = ["StepStructure", "step_structure"]


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
    """Action key (:func:`pipesim.step.numbering.action_key`) -> the node running
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
    """Per node, its cost key: the action code (:func:`pipesim.actions.action_code`) for an
    action, ``4 * n_stages + j`` for ``overlaps[j]`` (see :class:`CostTables`)."""
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
    _edges: list[Edges] = field(default_factory=list, init=False, repr=False, compare=False)

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
    def messages(self) -> Sequence[MessageRow]:
        """Every message as a :class:`MessageRow`, made when read (the step keeps columns)."""
        return _Messages(self)

    @property
    def per_copy(self) -> int:
        """Stages per model copy (``n_stages`` unless ``Schedule.n_copies > 1``)."""
        return self.schedule.n_stages // self.schedule.n_copies

    def node_of(self, action: Action, /) -> int | None:
        """The node that runs ``action`` (None if no rank does)."""
        if action.microbatch >= self.width:
            return None
        key = action_key(action, self.width)
        return self.node_at[key] if self.has_key(key) else None

    def has_key(self, key: int, /) -> bool:
        """Whether some node runs the action with this key (see ``node_at``)."""
        table = self.node_at
        return (type(table) is SparseKeys or 0 <= key < len(table)) and table[key] >= 0

    def present_keys(self) -> Iterator[int]:
        """The action keys some node runs, in increasing order."""
        table = self.node_at
        if type(table) is SparseKeys:
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
        edges, works = self._edge_list(), self.works
        for e, (source, node) in enumerate(zip(edges.sources, edges.consumers, strict=True)):
            parts = edges.parts.get(e)
            if parts is None:
                yield source, node, works[source], works[node]  # type: ignore[misc]
            else:
                yield source, node, parts[0], parts[1]

    def _edge_list(self) -> Edges:
        """The wiring's data edges, wired when first asked for and kept."""
        if not self._edges:
            wiring = wire(
                self.schedule,
                self.works,
                self.orders,
                self.ranks,
                _numbering_of(self),
                keep_edges=True,
            )
            assert wiring.edges is not None
            self._edges.append(wiring.edges)
        return self._edges[0]

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


class _Messages(Sequence[MessageRow]):
    """``StepStructure.messages``: rows made from the message columns when read."""

    __slots__ = ("_s",)

    def __init__(self, structure: StepStructure) -> None:
        self._s = structure

    def __len__(self) -> int:
        return len(self._s.producers)

    @overload
    def __getitem__(self, index: int) -> MessageRow: ...

    @overload
    def __getitem__(self, index: slice) -> Sequence[MessageRow]: ...

    def __getitem__(self, index: int | slice) -> MessageRow | Sequence[MessageRow]:
        if isinstance(index, slice):
            return [self[i] for i in range(len(self))[index]]
        s = self._s
        source, node = s.producers[index], s.consumers[index]
        return message_row(s.works, s.ranks, s.message_parts, index % len(self), source, node)

    def __iter__(self) -> Iterator[MessageRow]:
        return (self[i] for i in range(len(self)))


def _numbering_of(structure: StepStructure) -> Numbering:
    """The numbering a built structure came from (for :meth:`StepStructure.data_edges`)."""
    width, table = structure.width, structure.node_at
    keys = array("l", structure.keys)
    action_keys = array("l", [-1]) * len(keys)
    overlap_keys: dict[int, tuple[int, ...]] = {}
    for node, work in enumerate(structure.works):
        if type(work) is Action:
            action_keys[node] = action_key(work, width)
        else:
            overlap_keys[node] = part_keys(work, width)
    return Numbering(
        width=width,
        keys=keys,
        action_keys=action_keys,
        overlap_keys=overlap_keys,
        overlaps=structure.overlaps,
        table=table,
        n_keys=structure.n_keys,
    )


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

    >>> from pipesim.actions import Op
    >>> from pipesim.comms import lower_comms
    >>> from pipesim.schedules import generate
    >>> comms = lower_comms(generate("gpipe", n_ranks=2, n_microbatches=1))
    >>> s = step_structure(comms.schedule, programs=comms.programs)
    >>> [str(s.step(n)) for n in s.programs[0]]
    ['0F0', '0SEND_F0', '0RECV_B0', '0B0']
    >>> s.inputs[s.node_of(Action(stage=1, op=Op.F, microbatch=0))]  # its RECV waits instead
    ()
    """
    works, ranks, positions, orders = _rank_layout(schedule)
    numbering = number_works(schedule, works)
    wiring = wire(schedule, works, orders, ranks, numbering)
    extra_edges, signals, back_edge = _happens_before(schedule, numbering, wiring, ranks, positions)
    programs_of: tuple[Sequence[int], ...] = tuple(orders)
    comms: tuple[Comm, ...] = ()
    comm_ranks: tuple[int, ...] = ()
    comm_messages: tuple[int, ...] = ()
    if programs is not None:
        rows = [
            message_row(works, ranks, wiring.message_parts, m, source, node)
            for m, (source, node) in enumerate(zip(wiring.producers, wiring.consumers, strict=True))
        ]
        programs_of, comms, comm_ranks, comm_messages = place_comms(
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
        back_edge=back_edge or wiring.back_edge,
        programs=programs_of,
        comms=comms,
        comm_ranks=comm_ranks,
        comm_messages=comm_messages,
        explicit_comms=programs is not None,
        blocking_receives=programs is not None and blocking_receives,
    )


def _rank_layout(
    schedule: Schedule,
) -> tuple[tuple[Work, ...], list[int], array[int], list[range]]:
    """Every unit of work in rank order, with its rank and position, and each rank's run
    of nodes."""
    works = tuple(itertools.chain.from_iterable(schedule.orders))
    ranks: list[int] = []
    positions = array("l")
    orders: list[range] = []
    for rank, order in enumerate(schedule.orders):
        first = len(ranks)
        ranks += [rank] * len(order)
        positions.extend(range(len(order)))
        orders.append(range(first, len(ranks)))
    return works, ranks, positions, orders


def _happens_before(
    schedule: Schedule,
    numbering: Numbering,
    wiring: Wiring,
    ranks: Sequence[int],
    positions: Sequence[int],
) -> tuple[list[tuple[int, int]], list[tuple[int, int]], bool]:
    """The schedule's ``happens_before`` pairs as edges; a cross-rank one is also a signal
    (an arrival its target waits for, added to the wiring's inputs and outputs). Returns
    the edges, the signals, and whether one orders a rank's work against its order."""
    extra_edges: list[tuple[int, int]] = []
    signals: list[tuple[int, int]] = []
    back_edge = False
    for a, b in schedule.happens_before:
        a_node, b_node = node_of_action(numbering, a), node_of_action(numbering, b)
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
    return extra_edges, signals, back_edge


def _topological_order(
    orders: Sequence[Sequence[int]],
    inputs: Sequence[Sequence[int]],
    outputs: Sequence[Sequence[int]],
    n_arrivals: int,
) -> Sequence[int] | None:
    """Sweep the ranks, advancing each as far as its next work's arrivals have been
    produced, until all work is placed; None when a sweep makes no progress.

    Written out rather than networkx's ``topological_sort``: it reads the arrivals as
    they are, where networkx needs a graph of every dependency edge built first (an order
    of magnitude more time and memory on a large step); the wait cycle, when there is
    one, is networkx's (:func:`pipesim.step.deadlock.find_cycle`)."""
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
