"""The SimPy model of one pipeline step: rank processes, link resources, memory.

One SimPy process per rank runs its order: before each unit of work it waits
for the messages that work needs (activations from the previous stage,
gradients from the next, ``happens_before`` signals), then holds the rank for
the work's duration. When work ends, each message it produces for another rank
is sent over that ordered pair's link, a ``simpy.Resource`` holding
``max_concurrent`` messages at once (see :mod:`pipesim.costs` for the link
model). Free links deliver at the producer's end time without a process.

Activation memory per rank is tracked as actions start and end (see
:mod:`pipesim.costs`); forward-only schedules free a forward's activations when
it ends, since no backward will need them.

Times are whatever exact numbers the cost model holds (ints or Fractions);
SimPy only adds and compares them, so results are exact.
"""

from __future__ import annotations

import gc
from dataclasses import dataclass
from operator import attrgetter, itemgetter
from typing import Any

import simpy

from pipesim.actions import Action, Op
from pipesim.costs import CostModel
from pipesim.dependencies import DependencyIndex, index_schedule
from pipesim.errors import DeadlockError
from pipesim.exact import Time
from pipesim.graph import build_graph, check_index, find_deadlock
from pipesim.metrics import Metrics, compute_metrics
from pipesim.schedule import Schedule
from pipesim.trace import ActionRecord, MemoryRecord, Trace, TransferRecord

__all__ = ["Simulation", "run_trace", "simulate"]


@dataclass(frozen=True, slots=True, kw_only=True)
class Simulation:
    """The result of :func:`simulate`: inputs, the trace and its metrics."""

    schedule: Schedule
    costs: CostModel
    trace: Trace
    metrics: Metrics


def simulate(
    schedule: Schedule, /, *, costs: CostModel | None = None, check: bool = True
) -> Simulation:
    """Simulate one step of ``schedule`` under ``costs`` (default: unit forward,
    backward 2, free links).

    ``check`` runs :func:`pipesim.graph.validate` first, so an invalid schedule
    is refused before any simulation; the engine also reports a run that
    cannot finish as a :class:`~pipesim.errors.DeadlockError`.

    >>> from pipesim.schedules import generate
    >>> sim = simulate(generate("1f1b", n_ranks=4, n_microbatches=8))
    >>> sim.metrics.makespan, sim.metrics.bubble_ratio  # (m+p-1)(F+B), (p-1)/(m+p-1)
    (33, Fraction(3, 11))
    """
    costs = (costs or CostModel()).for_stages(schedule.n_stages)
    index = index_schedule(schedule)
    if check:
        check_index(schedule, index)
    trace = _without_gc(schedule, costs, index)
    return Simulation(
        schedule=schedule,
        costs=costs,
        trace=trace,
        metrics=compute_metrics(trace, schedule=schedule, costs=costs),
    )


_Effect = tuple[Time, tuple[int, int], tuple[int, int]]


def _stage_effects(costs: CostModel, *, forward_only: bool) -> list[dict[Op, _Effect]]:
    """Per stage and op: (duration, (bytes, count) allocated at start, freed at end).

    F allocates the stage's activations; B frees them all; I frees all but
    ``weight_grad_bytes`` and W the rest (a micro-batch stays "in flight" until
    the last byte is freed); in a forward-only step F frees its own activations.
    """
    table = []
    for cost in costs.stages:
        act, kept = cost.activation_bytes, cost.weight_grad_bytes
        table.append(
            {
                Op.F: (cost.forward, (act, 1), (act, 1) if forward_only else (0, 0)),
                Op.B: (cost.backward, (0, 0), (act, 1)),
                Op.I: (cost.input_grad, (0, 0), (act - kept, int(kept == 0))),
                Op.W: (cost.weight_grad, (0, 0), (kept, int(kept > 0))),
            }
        )
    return table


@dataclass(slots=True)
class _Message:
    """A cross-rank message; ``waiter`` is created only if its consumer blocks on it."""

    producer: Action
    consumer: Action
    src_rank: int
    dst_rank: int
    n_bytes: int
    arrived: bool = False
    waiter: simpy.Event | None = None
    start: Time = 0
    """When the message got its link."""
    end: Time = 0
    """When it arrived."""


def run_trace(schedule: Schedule, costs: CostModel, /) -> Trace:
    """Run the SimPy model and return the raw :class:`Trace` (no validation)."""
    costs = costs.for_stages(schedule.n_stages)
    return _without_gc(schedule, costs, index_schedule(schedule))


def _without_gc(schedule: Schedule, costs: CostModel, index: DependencyIndex) -> Trace:
    # A step allocates several objects per action and no garbage cycles; the cyclic
    # collector would otherwise rescan the growing trace again and again.
    gc_was_enabled = gc.isenabled()
    gc.disable()
    try:
        return _run(schedule, costs, index)
    finally:
        if gc_was_enabled:
            gc.enable()


def _run(schedule: Schedule, costs: CostModel, index: DependencyIndex) -> Trace:
    env: Any = simpy.Environment()  # typed by simpy as float time; ours is exact
    works, ranks = index.works, index.ranks
    n_nodes = index.n_nodes

    # Per node: messages it must receive before it starts, messages it sends when it ends.
    messages: list[_Message] = []
    inbox: list[list[_Message]] = [[] for _ in range(n_nodes)]
    outbox: list[list[_Message]] = [[] for _ in range(n_nodes)]
    for p_node, c_node, producer, consumer in index.data_edges:
        if ranks[p_node] == ranks[c_node]:
            continue  # program order already covers it in a valid schedule
        message = _Message(
            producer=producer,
            consumer=consumer,
            src_rank=ranks[p_node],
            dst_rank=ranks[c_node],
            n_bytes=costs.message_bytes(producer),
        )
        outbox[p_node].append(message)
        inbox[c_node].append(message)
        messages.append(message)
    signals: list[list[_Message]] = [[] for _ in range(n_nodes)]
    for a_node, b_node in index.extra_edges:
        if ranks[a_node] != ranks[b_node]:
            a_action, b_action = works[a_node].parts[0], works[b_node].parts[0]
            signal = _Message(
                producer=a_action,
                consumer=b_action,
                src_rank=ranks[a_node],
                dst_rank=ranks[b_node],
                n_bytes=0,
            )
            signals[a_node].append(signal)
            inbox[b_node].append(signal)

    # Per node: duration and activation memory effect at start (F allocates) and at end
    # (B frees all, I all but weight_grad_bytes, W the rest; forward-only F frees its own).
    forward_only = schedule.forward_only
    effects = _stage_effects(costs, forward_only=forward_only)
    durations: list[Time] = []
    alloc: list[tuple[int, int]] = []
    release: list[tuple[int, int]] = []
    for work in works:
        if isinstance(work, Action):
            duration, a_effect, r_effect = effects[work.stage][work.op]
            durations.append(duration)
            alloc.append(a_effect)
            release.append(r_effect)
            continue
        durations.append(costs.duration(work))
        a_bytes = a_count = r_bytes = r_count = 0
        for action in work.parts:
            _, (ab, ac), (rb, rc) = effects[action.stage][action.op]
            a_bytes, a_count = a_bytes + ab, a_count + ac
            r_bytes, r_count = r_bytes + rb, r_count + rc
        alloc.append((a_bytes, a_count))
        release.append((r_bytes, r_count))

    link = costs.link
    free_links = link.is_free
    wait_for_sends = not costs.overlap_comm and not free_links
    links: dict[tuple[int, int], simpy.Resource] = {}
    action_log: list[tuple[Time, int, int, Time]] = []
    memory_log: list[tuple[Time, int, int, int]] = []
    progress = [0] * schedule.n_ranks
    timeout = env.timeout

    def deliver(message: _Message, start: Time) -> None:
        message.start = start
        message.end = env.now
        message.arrived = True
        if message.waiter is not None:
            message.waiter.succeed()

    def send(message: _Message) -> Any:
        pair = (message.src_rank, message.dst_rank)
        resource = links.get(pair)
        if resource is None:
            resource = links[pair] = simpy.Resource(env, capacity=link.max_concurrent)
        with resource.request() as request:
            yield request
            start = env.now
            occupancy = link.occupancy(message.n_bytes)
            if occupancy:
                yield timeout(occupancy)
        if link.latency:
            yield timeout(link.latency)
        deliver(message, start)

    # One tuple per node keeps the hot loop to a single list lookup per action.
    steps = [
        (durations[n], *alloc[n], *release[n], inbox[n], outbox[n], signals[n])
        for n in range(n_nodes)
    ]
    log = action_log.append
    remember = memory_log.append
    event = env.event

    def run_rank(rank: int, order: list[int]) -> Any:
        held_bytes = inflight = 0
        for node in order:
            duration, a_bytes, a_count, r_bytes, r_count, needs, sent, signalled = steps[node]
            for message in needs:
                if not message.arrived:
                    message.waiter = event()
                    yield message.waiter
            start = env.now
            if a_count:
                held_bytes += a_bytes
                inflight += a_count
                remember((start, rank, held_bytes, inflight))
            yield timeout(duration)
            end = env.now
            if r_bytes or r_count:
                held_bytes -= r_bytes
                inflight -= r_count
                remember((end, rank, held_bytes, inflight))
            log((start, rank, node, end))
            if free_links:
                for message in sent:
                    message.start = message.end = end
                    message.arrived = True
                    if message.waiter is not None:
                        message.waiter.succeed()
            else:
                sending = [env.process(send(message)) for message in sent]
            for signal in signalled:
                deliver(signal, end)
            if wait_for_sends:
                # Wait on the send processes, not message.waiter: the consumer may own it.
                yield from sending
            progress[rank] += 1

    for rank, order in enumerate(index.orders):
        env.process(run_rank(rank, order))
    env.run()

    stuck = [rank for rank, order in enumerate(schedule.orders) if progress[rank] < len(order)]
    if stuck:
        blocked = [str(schedule.orders[rank][progress[rank]]) for rank in stuck]
        cycle = find_deadlock(build_graph(schedule))
        detail = (" -> ".join((*cycle, cycle[0]))) if cycle else "no cycle found"
        raise DeadlockError(
            f"simulation stopped with ranks {stuck} blocked at {blocked}; wait cycle: {detail}; "
            "reorder the ranks so that each action runs after what it needs",
            cycle=cycle,
        )

    by_time_then_rank = itemgetter(0, 1)  # C-level sort keys: sorting is a hot spot here
    action_log.sort(key=by_time_then_rank)
    actions = tuple(
        ActionRecord(rank=rank, work=works[node], start=start, end=end)
        for start, rank, node, end in action_log
    )
    messages.sort(key=attrgetter("start", "src_rank", "dst_rank"))
    transfers = tuple(
        TransferRecord(
            src_rank=m.src_rank,
            dst_rank=m.dst_rank,
            producer=m.producer,
            consumer=m.consumer,
            n_bytes=m.n_bytes,
            start=m.start,
            end=m.end,
        )
        for m in messages
    )
    memory_log.sort(key=by_time_then_rank)
    memory = tuple(
        MemoryRecord(rank=rank, time=time, activation_bytes=n_bytes, inflight=inflight)
        for time, rank, n_bytes, inflight in memory_log
    )
    return Trace(
        n_ranks=schedule.n_ranks,
        actions=actions,
        transfers=transfers,
        memory=memory,
    )
