"""The compiled step's tables under a cost model: :func:`compile_step` turns a
:class:`~pipesim.step.structure.StepStructure` into a :class:`CompiledStep`, one row per
unit of work and one column set per message (see :mod:`pipesim.step` for the cluster).

>>> from pipesim.costs import CostModel
>>> from pipesim.schedules import generate
>>> structure = step_structure(generate("1f1b", n_ranks=2, n_microbatches=2))
>>> step = compile_step(structure, CostModel.uniform(output_bytes=8))
>>> step.row(structure.messages[2].producer_node)
StepRow(node=0, rank=0, position=0, duration=1, waits_for=(), sends=(2,), \
effect=Effect(start_bytes=0, start_count=1, end_bytes=0, end_count=0))
>>> step.message_bytes[2], step.message_bytes[0]  # 0F0's output; 1B0's gradient, shaped alike
(8, 8)
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import NamedTuple

from pipesim.actions import Overlap, action_code
from pipesim.costs import CostModel, Link
from pipesim.exact import Time
from pipesim.schedule import Schedule
from pipesim.step.cost_tables import (
    CostTables,
    comm_durations,
    cost_tables,
    post_times,
)
from pipesim.step.memory import NO_EFFECT, Effect
from pipesim.step.structure import StepStructure, step_structure

__all__ = [
    "CompiledStep",
    "StepRow",
    "compile_step",
    "message_columns",
    "send_leads",
    "send_order",
    "structure_tables",
]


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
    leads: Mapping[int, Time] = field(default_factory=dict)
    """Per message that leaves before its producer's end, by how much (:func:`send_leads`;
    a comms schedule's messages leave at their SEND nodes instead)."""
    posting: tuple[Time, ...] = ()
    """Per message of a compute schedule, how long its receiver spends posting its
    receive (:func:`post_times`); empty when none costs anything, and for a comms
    schedule, whose RECV nodes hold it (:func:`comm_durations`)."""

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
    by_code = []  # per action code (F, B, I, W of each stage); W sends nothing: nothing needs it
    for forward, gradient in zip(tables.forward_bytes, tables.gradient_bytes, strict=True):
        by_code += [forward, gradient, gradient, gradient]
    by_code += [0] * len(structure.overlaps)  # an overlap's key: its part's size, below
    sizes = list(map(by_code.__getitem__, map(structure.keys.__getitem__, structure.producers)))
    for message, (producer, _) in structure.message_parts.items():
        sizes[message] = by_code[action_code(producer.stage, producer.op)]
    return tuple(sizes)


def structure_tables(structure: StepStructure, costs: CostModel, /) -> tuple[CostModel, CostTables]:
    """``costs`` sized for ``structure``'s schedule, and their :func:`cost_tables`: where
    the engine's compiled step and the planner's fast evaluator both start."""
    schedule = structure.schedule
    costs = costs.for_stages(schedule.n_stages)
    tables = cost_tables(
        costs,
        n_stages=schedule.n_stages,
        forward_only=schedule.forward_only,
        overlaps=structure.overlaps,
        placement=schedule.placement,
        n_copies=schedule.n_copies,
        explicit_comms=structure.explicit_comms,
        posted_receives=structure.explicit_comms and not structure.blocking_receives,
    )
    return costs, tables


def send_leads(structure: StepStructure, pair_links: Sequence[Link], /) -> dict[int, Time]:
    """Per message that leaves before its producer's end, by how much (others: absent).

    A unit of work pays each message's ``send_overhead`` after its compute
    (:func:`overhead_tables`); a unit that sends two messages (an overlapped F&B pair)
    posts them one after the other, each leaving once its own overhead is paid:
    ``verify``'s and torch's runtimes post one ``isend`` per SEND, in the order
    :func:`pipesim.comms.lower_comms` places them, the pair's parts in order. So a
    message leaves the send overheads of the pair's later messages before the end.

    >>> from pipesim.costs import Link
    >>> from pipesim.schedule import Schedule
    >>> s = Schedule.from_orders([["0F0", "0F1", "0B0", "0B1"],
    ...                           ["1F0", "(1F1;1B0)OVERLAP_F_B", "1B1"],
    ...                           ["2F0", "2B0", "2F1", "2B1"]])
    >>> structure = step_structure(s)
    >>> leads = send_leads(structure, [Link(send_overhead=3)] * len(structure.pairs))
    >>> [(str(structure.messages[m].producer), lead) for m, lead in leads.items()]
    [('1F1', 3)]
    """
    if not structure.overlaps:
        return {}
    works, producers, parts = structure.works, structure.producers, structure.message_parts
    by_node: dict[int, list[tuple[int, int]]] = {}
    for message, (producer, _) in parts.items():
        node = producers[message]
        work = works[node]
        if isinstance(work, Overlap):
            by_node.setdefault(node, []).append((work.parts.index(producer), message))
    leads: dict[int, Time] = {}
    for sent in by_node.values():
        later: Time = 0
        for _, message in sorted(sent, reverse=True):
            if later:
                leads[message] = later
            later += pair_links[structure.pair_of[message]].send_overhead
    return leads


def send_order(structure: StepStructure, leads: Mapping[int, Time], /) -> dict[int, list[int]]:
    """Per node that sends a message early (``leads``, :func:`send_leads`), its outputs
    in the order they leave: the earliest first, then those that leave at its end."""
    order: dict[int, list[int]] = {}
    for message in leads:
        order.setdefault(structure.producers[message], [])
    for node, sent in order.items():
        outputs = structure.outputs[node]
        sent += sorted((a for a in outputs if a in leads), key=lambda a: -leads[a])
        sent += [a for a in outputs if a not in leads]
    return order


def compile_step(schedule: Schedule | StepStructure, costs: CostModel, /) -> CompiledStep:
    """The step of ``schedule`` (or of an already built structure) under ``costs``."""
    structure = schedule if isinstance(schedule, StepStructure) else step_structure(schedule)
    costs, tables = structure_tables(structure, costs)
    durations, effects = tables.durations, tables.effects
    sizes, occupancy, latency, pair_links = message_columns(structure, costs, tables)
    node_durations = list(map(durations.__getitem__, structure.keys))
    node_effects = list(map(effects.__getitem__, structure.keys))
    if structure.comms:  # sends and receives hold no memory (pipesim.step.memory)
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
        leads={} if structure.explicit_comms else send_leads(structure, pair_links),
        posting=_posting(structure, pair_links),
    )


def _posting(structure: StepStructure, pair_links: Sequence[Link]) -> tuple[Time, ...]:
    """:attr:`CompiledStep.posting`: the receive posting times of a compute schedule."""
    if structure.explicit_comms or not any(link.post_overhead for link in pair_links):
        return ()
    return post_times(structure, pair_links)
