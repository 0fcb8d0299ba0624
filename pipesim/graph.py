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

from collections.abc import Iterator
from dataclasses import dataclass

import networkx as nx

from pipesim.actions import Action, Op, Work
from pipesim.costs import CostModel
from pipesim.errors import DeadlockError, ScheduleError
from pipesim.exact import Time
from pipesim.schedule import Schedule

__all__ = [
    "CriticalPath",
    "DataDependency",
    "build_graph",
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
    """Every data dependency between the actions the schedule actually contains.

    The rules (see the module docstring) follow torch.distributed.pipelining's
    stage semantics: the last stage's backward starts from its own forward
    (the loss), and a split backward's W needs its I.
    """
    present = {a for a in schedule.actions()}
    last = schedule.n_stages - 1
    for action in present:
        stage, mb = action.stage, action.microbatch
        preds: list[Action] = []
        if action.op is Op.F:
            if stage > 0:
                preds.append(Action(stage=stage - 1, op=Op.F, microbatch=mb))
        elif action.op in (Op.B, Op.I):
            preds.append(Action(stage=stage, op=Op.F, microbatch=mb))
            if stage < last:
                for op in (Op.B, Op.I):
                    grad = Action(stage=stage + 1, op=op, microbatch=mb)
                    if grad in present:
                        preds.append(grad)
        else:  # W
            preds.append(Action(stage=stage, op=Op.I, microbatch=mb))
        for pred in preds:
            if pred in present:
                yield DataDependency(producer=pred, consumer=action)


def _owners(schedule: Schedule) -> dict[Action, tuple[Work, int, int]]:
    """Simple action -> (unit of work holding it, rank, position in the rank's order)."""
    owners: dict[Action, tuple[Work, int, int]] = {}
    for rank, order in enumerate(schedule.orders):
        for position, work in enumerate(order):
            for action in work.parts:
                owners.setdefault(action, (work, rank, position))
    return owners


def build_graph(schedule: Schedule, /, *, costs: CostModel | None = None) -> nx.DiGraph:
    """The dependency graph of ``schedule`` (see module docstring).

    With ``costs``, nodes carry ``duration`` and cross-rank data edges carry
    ``n_bytes`` and ``transfer_time``. The schedule is not validated here; a
    cyclic graph is returned as is (see :func:`find_deadlock`).
    """
    if costs is not None:
        costs = costs.for_stages(schedule.n_stages)
    owners = _owners(schedule)
    graph = nx.DiGraph(n_ranks=schedule.n_ranks, n_stages=schedule.n_stages)
    for rank, order in enumerate(schedule.orders):
        for work in order:
            attrs: dict[str, object] = {"rank": rank}
            if costs is not None:
                attrs["duration"] = costs.duration(work)
            graph.add_node(work, **attrs)
        for before, after in zip(order, order[1:]):
            graph.add_edge(before, after, kind="order", n_bytes=0, transfer_time=0)
    for dep in data_dependencies(schedule):
        producer, p_rank, _ = owners[dep.producer]
        consumer, c_rank, _ = owners[dep.consumer]
        n_bytes = 0
        transfer: Time = 0
        if p_rank != c_rank and costs is not None:
            n_bytes = costs.message_bytes(dep.producer)
            transfer = costs.link.transfer_time(n_bytes)
        graph.add_edge(
            producer,
            consumer,
            kind="data",
            n_bytes=n_bytes,
            transfer_time=transfer,
            producer=dep.producer,
            consumer=dep.consumer,
        )
    for a, b in schedule.happens_before:
        if a in owners and b in owners:
            graph.add_edge(owners[a][0], owners[b][0], kind="extra", n_bytes=0, transfer_time=0)
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
    problems = _structural_problems(schedule)
    if problems:
        raise ScheduleError(_summarise("invalid schedule", problems))
    graph = build_graph(schedule)
    cycle = find_deadlock(graph)
    if cycle:
        raise DeadlockError(
            "schedule deadlocks: these actions wait on each other in a cycle: "
            + " -> ".join((*cycle, cycle[0]))
            + "; reorder the ranks so that each action runs after what it needs",
            cycle=cycle,
        )


def _structural_problems(schedule: Schedule) -> list[str]:
    problems: list[str] = []
    n_stages, n_mb = schedule.n_stages, schedule.n_microbatches
    seen: dict[Action, tuple[int, int]] = {}
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
                home = schedule.placement[action.stage]
                if home != rank:
                    problems.append(
                        f"{action} runs on rank {rank} but stage {action.stage} is placed on "
                        f"rank {home}; a stage lives on one rank: move the action or fix the "
                        "placement"
                    )
                if action in seen:
                    problems.append(
                        f"duplicate action {action} (rank {seen[action][0]} position "
                        f"{seen[action][1]} and rank {rank} position {position}); keep one"
                    )
                else:
                    seen[action] = (rank, position)
    if problems:
        return problems
    problems += _missing(schedule, seen)
    problems += _same_rank_order(seen)
    for a, b in schedule.happens_before:
        for x in (a, b):
            if x not in seen:
                problems.append(f"happens_before names {x}, which no rank runs")
    return problems


def _missing(schedule: Schedule, seen: dict[Action, tuple[int, int]]) -> list[str]:
    training = not schedule.forward_only
    missing: list[str] = []
    mixed: list[str] = []
    for stage in range(schedule.n_stages):
        for mb in range(schedule.n_microbatches):
            def has(op: Op, stage: int = stage, mb: int = mb) -> bool:
                return Action(stage=stage, op=op, microbatch=mb) in seen

            if not has(Op.F):
                missing.append(f"{stage}F{mb}")
            if not training:
                continue
            full, split_i, split_w = has(Op.B), has(Op.I), has(Op.W)
            if full and (split_i or split_w):
                mixed.append(f"{stage}B{mb} with {stage}{'I' if split_i else 'W'}{mb}")
            elif not full and not (split_i and split_w):
                if split_i:
                    missing.append(f"{stage}W{mb}")
                elif split_w:
                    missing.append(f"{stage}I{mb}")
                else:
                    missing.append(f"{stage}B{mb}")
    problems = []
    if missing:
        shown = ", ".join(missing[:_MAX_LISTED])
        more = f" and {len(missing) - _MAX_LISTED} more" if len(missing) > _MAX_LISTED else ""
        problems.append(
            f"missing actions {shown}{more}: every stage must run F "
            + ("and B (or I and W) " if training else "")
            + f"for each of the {schedule.n_microbatches} micro-batches"
        )
    for text in mixed:
        problems.append(f"both a full and a split backward: {text}; use B or I+W, not both")
    return problems


def _same_rank_order(seen: dict[Action, tuple[int, int]]) -> list[str]:
    problems = []
    for action, (rank, position) in seen.items():
        if action.op is Op.F:
            continue
        need_op = Op.I if action.op is Op.W else Op.F
        need = Action(stage=action.stage, op=need_op, microbatch=action.microbatch)
        if need in seen and seen[need][0] == rank and seen[need][1] > position:
            what = "W before I" if action.op is Op.W else "backward before forward"
            problems.append(
                f"{what} on rank {rank}: {action} at position {position} runs before "
                f"{need} at position {seen[need][1]}; move the "
                f"{'W' if action.op is Op.W else 'backward'} after its "
                f"{'I' if action.op is Op.W else 'forward'}"
            )
    return problems


def _summarise(headline: str, problems: list[str]) -> str:
    shown = problems[:_MAX_LISTED]
    more = len(problems) - len(shown)
    text = f"{headline}: " + "; ".join(shown)
    return text + (f"; and {more} more problems" if more else "")


@dataclass(frozen=True, slots=True, kw_only=True)
class CriticalPath:
    """The longest chain of dependent work: its length and the work on it."""

    length: Time
    works: tuple[Work, ...]


def critical_path(schedule: Schedule, /, *, costs: CostModel | None = None) -> CriticalPath:
    """The longest path through the dependency graph, node durations included.

    It equals the simulated makespan when no two messages contend for a link
    (in particular with free links): every action then starts exactly when
    the last thing it waits for is done. ``networkx.dag_longest_path`` weighs
    edges, so each node's duration (plus a message's transfer time, and with
    ``overlap_comm`` off the sender's wait) sits on its out-edges, and a sink
    collects every node.

    >>> from pipesim.schedules import generate
    >>> critical_path(generate("gpipe", n_ranks=4, n_microbatches=8)).length  # (m+p-1)(F+B)
    33
    """
    costs = (costs or CostModel()).for_stages(schedule.n_stages)
    validate(schedule)
    graph = build_graph(schedule, costs=costs)
    sink = "__end__"
    weighted = nx.DiGraph()
    for node, attrs in graph.nodes(data=True):
        weighted.add_edge(node, sink, weight=attrs["duration"])
    for u, v, attrs in graph.edges(data=True):
        weight = graph.nodes[u]["duration"]
        if attrs["kind"] == "data":
            weight += attrs["transfer_time"]
        elif attrs["kind"] == "order" and not costs.overlap_comm:
            # The sender waits for its own messages to arrive before its next action.
            weight += max(
                (
                    d["transfer_time"]
                    for _, w, d in graph.out_edges(u, data=True)
                    if d["kind"] == "data" and graph.nodes[w]["rank"] != graph.nodes[u]["rank"]
                ),
                default=0,
            )
        weighted.add_edge(u, v, weight=weight)
    path = nx.dag_longest_path(weighted, weight="weight")
    length = nx.dag_longest_path_length(weighted, weight="weight")
    return CriticalPath(length=length, works=tuple(w for w in path if w != sink))

