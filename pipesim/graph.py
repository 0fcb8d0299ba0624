"""Schedule + costs -> dependency graph; validation; deadlock cycles; critical path.

The graph has one node per unit of work (an :class:`~pipesim.actions.Action`
or :class:`~pipesim.actions.Overlap`) and three kinds of edge:

- ``data``: the forward of stage s+1 needs the forward of stage s; the
  backward (B or I) of stage s needs the backward of stage s+1 and its own
  forward; W needs I of the same stage and micro-batch. A data edge between
  two ranks carries ``n_bytes`` (the activation or gradient message).
- ``order``: each rank runs its actions in the listed order.
- ``extra``: the schedule's ``happens_before`` constraints.

Node attributes: ``rank`` and ``duration`` (when costs are given). The longest
path through this graph, node durations on the out-edges, is the makespan of a
step on uncontended links, the oracle the SimPy engine is tested against.

>>> from pipesim.actions import parse_action
>>> from pipesim.schedules import generate
>>> g = build_graph(generate("gpipe", n_ranks=2, n_microbatches=2))
>>> g.number_of_nodes(), g.edges[parse_action("0F0"), parse_action("1F0")]["kind"]
(8, 'data')
"""

from __future__ import annotations

import itertools
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING

import networkx as nx

from pipesim.actions import N_OPS, Action, Comm, Op, Work, action_code, code_parts
from pipesim.costs import CostModel, require_eager
from pipesim.errors import ScheduleError, and_more, summarise
from pipesim.exact import Time
from pipesim.schedule import Schedule
from pipesim.step import CompiledStep, compile_step
from pipesim.step.deadlock import deadlock_error
from pipesim.step.structure import StepStructure, step_structure

if TYPE_CHECKING:  # pipesim.comms validates with this module: imported where used
    from pipesim.comms import CommSchedule

__all__ = [
    "CriticalPath",
    "DataDependency",
    "build_graph",
    "comms_path",
    "critical_path",
    "data_dependencies",
    "find_deadlock",
    "validate",
]

_MAX_LISTED = 8  # problems named in one error message before "... and N more"


@dataclass(frozen=True, slots=True, kw_only=True)
class DataDependency:
    """``consumer`` needs what ``producer`` computed."""

    producer: Action
    consumer: Action


def data_dependencies(schedule: Schedule, /) -> Iterator[DataDependency]:
    """Every data dependency between the actions the schedule actually contains
    (rules in :mod:`pipesim.step.dependencies`)."""
    for _, _, producer, consumer in step_structure(schedule).data_edges():
        yield DataDependency(producer=producer, consumer=consumer)


def build_graph(schedule: Schedule, /, *, costs: CostModel | None = None) -> nx.DiGraph:
    """The dependency graph of ``schedule`` (see module docstring).

    With ``costs``, nodes carry ``duration`` and cross-rank data edges carry
    ``n_bytes`` and ``transfer_time``. The schedule is not validated here; a
    cyclic graph is returned as is (see :func:`find_deadlock`).
    """
    index = step_structure(schedule)
    step = compile_step(index, costs) if costs is not None else None
    works, ranks = index.works, index.ranks
    graph = nx.DiGraph(n_ranks=schedule.n_ranks, n_stages=schedule.n_stages)
    for node, work in enumerate(works):
        attrs: dict[str, object] = {"rank": ranks[node]}
        if step is not None:
            attrs["duration"] = step.durations[node]
        graph.add_node(work, **attrs)
    for order in index.orders:
        for a, b in itertools.pairwise(order):
            graph.add_edge(works[a], works[b], kind="order", n_bytes=0, transfer_time=0)
    message = 0  # cross-rank data edges are the messages, in the same order
    for p_node, c_node, producer, consumer in index.data_edges():
        n_bytes = 0
        transfer: Time = 0
        lead: Time = 0
        if ranks[p_node] != ranks[c_node]:
            if step is not None:
                n_bytes = step.message_bytes[message]
                transfer = step.latency[message] + step.occupancy[message]
                lead = step.leads.get(message, 0)
            message += 1
        old = graph.get_edge_data(works[p_node], works[c_node])
        later = old is not None and old["kind"] == "data"
        if later and old["transfer_time"] - old["lead"] >= transfer - lead:
            continue  # two messages between one pair of works: keep the later
        graph.add_edge(
            works[p_node],
            works[c_node],
            kind="data",
            n_bytes=n_bytes,
            transfer_time=transfer,
            lead=lead,
            producer=producer,
            consumer=consumer,
        )
    for a, b in index.extra_edges:
        if not graph.has_edge(works[a], works[b]):  # never erase a data edge's transfer time
            graph.add_edge(works[a], works[b], kind="extra", n_bytes=0, transfer_time=0)
    return graph


def find_deadlock(graph: nx.DiGraph, /) -> tuple[str, ...]:
    """One cycle of the graph as action strings (empty when it has none)."""
    try:
        cycle = nx.find_cycle(graph)
    except nx.NetworkXNoCycle:
        return ()
    return tuple(str(u) for u, _ in cycle)


def validate(schedule: Schedule, /) -> None:
    """Refuse a schedule that cannot run correctly; return None when it can.

    Checks, naming the offending actions and the fix: stages and micro-batches
    in range; every action on the rank its stage is placed on; no duplicates;
    nothing missing (every stage runs F of every micro-batch and, when
    training, either B or both I and W); no backward before its forward or W
    before its I on the same rank; ``happens_before`` naming real actions; and
    no deadlock (a cycle of waits, reported as a DeadlockError with the cycle).

    >>> from pipesim.schedules import generate
    >>> validate(generate("1f1b", n_ranks=4, n_microbatches=8)) is None
    True
    >>> validate(Schedule.from_orders([["0B0", "0F0"]]))
    Traceback (most recent call last):
    ...
    pipesim.errors.ScheduleError: invalid schedule: backward before forward on rank 0: 0B0 \
at position 0 runs before 0F0 at position 1; move the backward after its forward
    """
    check_structure(schedule, step_structure(schedule))


def check_structure(
    schedule: Schedule, structure: StepStructure, /, *, cycles: bool = True
) -> None:
    """:func:`validate`, reusing the step structure the caller already built (the engine
    does): the structural checks, then a cycle of waits (no topological order). With
    ``cycles=False`` only a cycle through some rank's program order is looked for; any
    other is left to the caller: the engine finds one by running into it."""
    problems = _structural_problems(schedule, structure)
    if problems:
        raise ScheduleError(summarise("invalid schedule", problems, limit=_MAX_LISTED))
    if structure.back_edge or (cycles and structure.topological is None):
        raise deadlock_error(structure)


_Key = tuple[int, Op, int]


def _well_placed(schedule: Schedule, structure: StepStructure) -> bool:
    """The common case, checked in bulk: every action in range, unique, on its stage's
    rank, in a single model copy. False means: look action by action."""
    n_stages, n_mb = schedule.n_stages, schedule.n_microbatches
    if schedule.n_copies != 1 or structure.width > n_mb:
        return False
    n_parts = len(structure.works) + sum(len(w.parts) - 1 for w in structure.overlaps)
    if n_parts != structure.n_keys:  # a duplicate
        return False
    placement = schedule.placement
    if structure.overlaps:
        return all(
            a.stage < n_stages and placement[a.stage] == rank
            for work, rank in zip(structure.works, structure.ranks, strict=True)
            for a in work.parts
        )
    if max(structure.keys, default=0) >= N_OPS * n_stages:
        return False  # a stage out of range
    # A rank's nodes are consecutive: the distinct action codes it runs, in bulk.
    keys = structure.keys
    return all(
        placement[code_parts(code)[0]] == rank
        for rank, order in enumerate(structure.orders)
        for code in set(keys[order.start : order.stop])
    )


def _structural_problems(schedule: Schedule, structure: StepStructure) -> list[str]:
    problems: list[str] = []
    if not _well_placed(schedule, structure):
        problems = _placement_problems(schedule)
        if problems:
            return problems
    problems += _missing(schedule, structure)
    if structure.back_edge:  # else no work runs before one it needs on its rank
        problems += _same_rank_order(structure)
    for a, b in schedule.happens_before:
        for x in (a, b):
            if structure.node_of(x) is None:
                problems.append(f"happens_before names {x}, which no rank runs")
        if a == b:  # the graph would drop a self-loop, hiding an action that waits for itself
            problems.append(
                f"happens_before orders {a} before itself: it would wait for itself forever; "
                "drop that entry"
            )
    for work in structure.overlaps:
        problems += _dependent_parts(work)
    return problems


def _placement_problems(schedule: Schedule) -> list[str]:
    problems: list[str] = []
    n_stages, n_mb = schedule.n_stages, schedule.n_microbatches
    seen: dict[_Key, tuple[int, int]] = {}
    for rank, order in enumerate(schedule.orders):
        for position, work in enumerate(order):
            for action in work.parts:
                if action.stage >= n_stages:
                    problems.append(
                        f"{action} on rank {rank}: stage {action.stage} is out of range "
                        f"(the schedule has {n_stages} stages, 0..{n_stages - 1})"
                    )
                    continue
                if action.microbatch >= n_mb:
                    problems.append(
                        f"{action} on rank {rank}: micro-batch {action.microbatch} is out of "
                        f"range (n_microbatches={n_mb}, 0..{n_mb - 1})"
                    )
                elif schedule.n_copies > 1:
                    stages, mbs = schedule.copy_bounds(action.stage)
                    if action.microbatch not in mbs:
                        problems.append(
                            f"{action} on rank {rank}: stages {stages.start}..{stages.stop - 1} "
                            f"form a model copy that processes micro-batches "
                            f"{mbs.start}..{mbs.stop - 1}, not {action.microbatch}"
                        )
                home = schedule.placement[action.stage]
                if home != rank:
                    problems.append(
                        f"{action} runs on rank {rank} but stage {action.stage} is placed on "
                        f"rank {home}; a stage lives on one rank: move the action or fix the "
                        "placement"
                    )
                key = (action.stage, action.op, action.microbatch)
                if key in seen:
                    problems.append(
                        f"duplicate action {action} (rank {seen[key][0]} position "
                        f"{seen[key][1]} and rank {rank} position {position}); keep one"
                    )
                else:
                    seen[key] = (rank, position)
    return problems


def _dependent_parts(work: Work) -> list[str]:
    """An overlapped unit cannot contain an action and something it waits for."""
    inner = Schedule.from_orders(
        [list(work.parts)],
        placement=(0,) * (1 + max(a.stage for a in work.parts)),
        n_microbatches=1 + max(a.microbatch for a in work.parts),
    )
    return [
        f"overlapped unit {work} holds {producer} and {consumer}, which needs it; "
        "an overlapped pair must be independent work"
        for _, _, producer, consumer in step_structure(inner).data_edges()
    ]


def _missing(schedule: Schedule, structure: StepStructure) -> list[str]:
    """Missing and mixed backward actions. The work follows the actions given, not the
    stage and micro-batch counts: the missing ones are counted from the actions present
    (all in range and unique here), per stage and op, and only the first few are looked
    for; micro-batch by micro-batch only in a stage that runs I or W."""
    training = not schedule.forward_only
    # (stage, micro-batch) cells: each stage runs the micro-batches of its model copy
    n_cells = schedule.n_stages * (schedule.n_microbatches // schedule.n_copies)
    counts = _code_counts(structure)
    has_f = has_b = has_iw = 0
    mixed: list[tuple[int, str]] = []  # (node, text): named in the order the ranks run them
    for stage in range(schedule.n_stages):
        has_f += counts[action_code(stage, Op.F)]
        has_b += counts[action_code(stage, Op.B)]
        if counts[action_code(stage, Op.I)] or counts[action_code(stage, Op.W)]:
            split, mixed_here = _split_backward(structure, stage)
            has_iw += split
            mixed += mixed_here
    n_missing = n_cells - has_f + (n_cells - has_b - has_iw if training else 0)
    problems = []
    if n_missing:
        missing = list(itertools.islice(_missing_actions(schedule, structure), _MAX_LISTED))
        problems.append(
            f"missing actions {', '.join(missing)}{and_more(len(missing), n_missing)}: every "
            "stage must run F "
            + ("and B (or I and W) " if training else "")
            + f"for each of the {schedule.n_microbatches} micro-batches"
        )
    for _, text in sorted(mixed):
        problems.append(f"both a full and a split backward: {text}; use B or I+W, not both")
    return problems


def _code_counts(structure: StepStructure) -> Counter[int]:
    """How many actions present have each action code (the actions are unique here: one
    node each)."""
    counts = Counter(structure.keys)  # an overlap's key is past every action code
    for work in structure.overlaps:
        counts.update(action_code(a.stage, a.op) for a in work.parts)
    return counts


def _split_backward(structure: StepStructure, stage: int) -> tuple[int, list[tuple[int, str]]]:
    """In ``stage``: how many micro-batches run as I and W (no B), and each B that also
    has an I or a W, as (node, text)."""
    # The table has room past the largest key (StepStructure.node_at): no bounds to check.
    table, width = structure.node_at, structure.width
    b_key, i_key, w_key = (action_code(stage, op) * width for op in (Op.B, Op.I, Op.W))
    rows = zip(
        map(table.__getitem__, range(b_key, i_key)),
        map(table.__getitem__, range(i_key, w_key)),
        map(table.__getitem__, range(w_key, w_key + width)),
        strict=True,
    )
    split, mixed = 0, []
    for mb, (b_node, i_node, w_node) in enumerate(rows):
        if b_node < 0:
            if i_node >= 0 and w_node >= 0:
                split += 1
        elif i_node >= 0 or w_node >= 0:
            mixed.append((b_node, f"{stage}B{mb} with {stage}{'I' if i_node >= 0 else 'W'}{mb}"))
    return split, mixed


def _missing_actions(schedule: Schedule, structure: StepStructure) -> Iterator[str]:
    """The missing actions in stage, micro-batch order, lazily: a caller taking k of them
    looks at no more than k cells beyond those the actions present fill."""
    training = not schedule.forward_only
    has, width = structure.has_key, structure.width
    for stage in range(schedule.n_stages):
        # the first action key of each op of this stage (pipesim.step.numbering.action_key)
        f_code, b_code, i_code, w_code = (action_code(stage, op) * width for op in Op)
        for mb in schedule.copy_bounds(stage)[1]:
            inside = mb < width
            if not inside or not has(f_code + mb):
                yield f"{stage}F{mb}"
            if not training or (inside and has(b_code + mb)):
                continue
            split_i = inside and has(i_code + mb)
            split_w = inside and has(w_code + mb)
            if split_i and not split_w:
                yield f"{stage}W{mb}"
            elif split_w and not split_i:
                yield f"{stage}I{mb}"
            elif not split_i:
                yield f"{stage}B{mb}"


def _same_rank_order(structure: StepStructure) -> list[str]:
    problems = []
    ranks, positions = structure.ranks, structure.positions
    for producer, consumer, need, action in structure.data_edges():
        if action.stage != need.stage or ranks[producer] != ranks[consumer]:
            continue  # only an action's own earlier op (F before B / I, I before W)
        if positions[producer] > positions[consumer]:
            what = "W before I" if action.op is Op.W else "backward before forward"
            later, earlier = ("W", "I") if action.op is Op.W else ("backward", "forward")
            problems.append(
                f"{what} on rank {ranks[consumer]}: {action} at position "
                f"{positions[consumer]} runs before {need} at position {positions[producer]}; "
                f"move the {later} after its {earlier}"
            )
    return problems


@dataclass(frozen=True, slots=True, kw_only=True)
class CriticalPath:
    """The longest chain of dependent work: its length and the work on it (with a comms
    schedule, its sends and receives too)."""

    length: Time
    works: tuple[Work | Comm, ...]


def critical_path(
    schedule: Schedule | CommSchedule,
    /,
    *,
    costs: CostModel | None = None,
    blocking_receives: bool = True,
) -> CriticalPath:
    """The longest path through the dependency graph, node durations included.

    It equals the simulated makespan when no two messages contend for a link
    (in particular with free links): every action then starts exactly when
    the last thing it waits for is done. ``networkx.dag_longest_path`` weighs
    edges, so each node's duration (plus a message's transfer time, and with
    ``blocking_sends`` the sender's wait) sits on its out-edges, and a sink
    collects every node.

    >>> from pipesim.schedules import generate
    >>> critical_path(generate("gpipe", n_ranks=4, n_microbatches=8)).length  # (m+p-1)(F+B)
    33

    A comms schedule's path runs through its sends and receives (:func:`comms_path`).
    """
    if not isinstance(schedule, Schedule):
        return comms_path(schedule, costs=costs, blocking_receives=blocking_receives)
    costs = (costs or CostModel()).for_stages(schedule.n_stages)
    require_eager(costs, evaluator="the longest path")
    validate(schedule)
    graph = build_graph(schedule, costs=costs)
    sink = "__end__"
    weighted = nx.DiGraph()
    for node, attrs in graph.nodes(data=True):
        weighted.add_edge(node, sink, weight=attrs["duration"])
    # Program order by rank adjacency: an order edge may also be a data edge (I -> W).
    next_on_rank = {a: b for order in schedule.orders for a, b in itertools.pairwise(order)}
    for u, v, attrs in graph.edges(data=True):
        weight = graph.nodes[u]["duration"]
        if attrs["kind"] == "data":  # (an overlapped pair's first message leaves early)
            weight += attrs["transfer_time"] - attrs["lead"]
        if costs.blocking_sends and next_on_rank.get(u) == v:
            # The sender waits for its own messages to arrive before its next action.
            weight += max(
                (
                    d["transfer_time"] - d["lead"]
                    for _, w, d in graph.out_edges(u, data=True)
                    if d["kind"] == "data" and graph.nodes[w]["rank"] != graph.nodes[u]["rank"]
                ),
                default=0,
            )
        weighted.add_edge(u, v, weight=weight)
    path = nx.dag_longest_path(weighted, weight="weight")
    length = nx.dag_longest_path_length(weighted, weight="weight")
    return CriticalPath(length=length, works=tuple(w for w in path if w != sink))


def comms_path(
    comms: CommSchedule,
    /,
    *,
    costs: CostModel | None = None,
    blocking_receives: bool = True,
) -> CriticalPath:
    """The longest path through a comms schedule's nodes (work, sends, receives).

    Edges: each rank's program order; each message from its send to the node that waits
    for it (its receive when receives block, else its consumer), weighted with the
    send's duration plus the message's latency and link occupancy; each
    ``happens_before`` signal. With ``blocking_sends`` a send holds its rank until its
    message arrives, so its program-order edge carries the transfer too. On links no two
    messages contend for, this is the makespan :func:`pipesim.engine.simulate` finds.

    >>> from pipesim.comms import lower_comms
    >>> from pipesim.costs import Link
    >>> from pipesim.schedules import generate
    >>> costs = CostModel.uniform(link=Link(send_overhead=1, receive_overhead=1))
    >>> path = comms_path(lower_comms(generate("gpipe", n_ranks=2, n_microbatches=1)), costs=costs)
    >>> path.length, [str(w) for w in path.works]  # F+S+R+F+B+S+R+B = 1+1+1+1+2+1+1+2
    (10, ['0F0', '0SEND_F0', '1RECV_F0', '1F0', '1B0', '1SEND_B0', '0RECV_B0', '0B0'])
    """
    from pipesim.comms import validate_comms  # pipesim.comms imports this module

    validate_comms(comms)
    schedule = comms.schedule
    costs = (costs or CostModel()).for_stages(schedule.n_stages)
    require_eager(costs, evaluator="the longest path")
    structure = step_structure(
        schedule, programs=comms.programs, blocking_receives=blocking_receives
    )
    step = compile_step(structure, costs)
    weighted = _comms_graph(step)
    path = nx.dag_longest_path(weighted, weight="weight")
    length = nx.dag_longest_path_length(weighted, weight="weight")
    return CriticalPath(length=length, works=tuple(structure.step(n) for n in path if n != _SINK))


_SINK = -1


def _comms_graph(step: CompiledStep) -> nx.DiGraph:
    """Node ids of ``step`` weighted as :func:`comms_path` says, and a sink after all."""
    structure = step.structure
    durations, n_messages = step.durations, len(structure.messages)

    def transfer(arrival: int) -> Time:
        if arrival >= n_messages:
            return 0  # a happens_before signal arrives when its work ends
        return step.latency[arrival] + step.occupancy[arrival]

    waits_for = {a: node for node, ins in enumerate(structure.inputs) for a in ins}
    graph = nx.DiGraph()
    for program in structure.programs:
        for node in program:
            graph.add_edge(node, _SINK, weight=durations[node])
        for u, v in itertools.pairwise(program):
            held = durations[u]
            if step.costs.blocking_sends:
                held += max((transfer(a) for a in structure.outputs[u]), default=0)
            graph.add_edge(u, v, weight=held)
    for node, outs in enumerate(structure.outputs):
        for arrival in outs:
            target = waits_for.get(arrival)
            if target is None:
                continue
            weight = durations[node] + transfer(arrival)
            old = graph.get_edge_data(node, target)
            if old is None or old["weight"] < weight:
                graph.add_edge(node, target, weight=weight)
    return graph
