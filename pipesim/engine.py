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

from dataclasses import dataclass
from typing import Any

import simpy

from pipesim.actions import Action, Op, Work
from pipesim.costs import CostModel
from pipesim.errors import DeadlockError
from pipesim.exact import Time
from pipesim.graph import build_graph, data_dependencies, find_deadlock, validate
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
    if check:
        validate(schedule)
    trace = run_trace(schedule, costs)
    return Simulation(
        schedule=schedule,
        costs=costs,
        trace=trace,
        metrics=compute_metrics(trace, schedule=schedule, costs=costs),
    )


@dataclass(slots=True)
class _Message:
    producer: Action
    consumer: Action
    src_rank: int
    dst_rank: int
    n_bytes: int
    arrived: simpy.Event


def run_trace(schedule: Schedule, costs: CostModel, /) -> Trace:
    """Run the SimPy model and return the raw :class:`Trace` (no validation)."""
    costs = costs.for_stages(schedule.n_stages)
    env = simpy.Environment()
    owner: dict[Action, tuple[Work, int]] = {}
    for rank, order in enumerate(schedule.orders):
        for work in order:
            for action in work.parts:
                owner[action] = (work, rank)

    waits: dict[Work, list[simpy.Event]] = {}
    sends: dict[Work, list[_Message]] = {}
    for dep in data_dependencies(schedule):
        p_work, p_rank = owner[dep.producer]
        c_work, c_rank = owner[dep.consumer]
        if p_rank == c_rank:
            continue  # program order already covers it in a valid schedule
        message = _Message(
            producer=dep.producer,
            consumer=dep.consumer,
            src_rank=p_rank,
            dst_rank=c_rank,
            n_bytes=costs.message_bytes(dep.producer),
            arrived=env.event(),
        )
        sends.setdefault(p_work, []).append(message)
        waits.setdefault(c_work, []).append(message.arrived)
    signals: dict[Work, list[simpy.Event]] = {}
    for a, b in schedule.happens_before:
        (a_work, a_rank), (b_work, b_rank) = owner[a], owner[b]
        if a_rank != b_rank:
            event = env.event()
            signals.setdefault(a_work, []).append(event)
            waits.setdefault(b_work, []).append(event)

    link = costs.link
    free_links = link.is_free
    links: dict[tuple[int, int], simpy.Resource] = {}
    action_log: list[tuple[Time, int, Work, Time]] = []
    transfer_log: list[TransferRecord] = []
    memory_log: list[MemoryRecord] = []
    progress = [0] * schedule.n_ranks
    forward_only = schedule.forward_only
    stage_costs = costs.stages

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
                yield env.timeout(occupancy)
        if link.latency:
            yield env.timeout(link.latency)
        _deliver(message, start)

    def _deliver(message: _Message, start: Time) -> None:
        transfer_log.append(
            TransferRecord(
                src_rank=message.src_rank,
                dst_rank=message.dst_rank,
                producer=message.producer,
                consumer=message.consumer,
                n_bytes=message.n_bytes,
                start=start,
                end=env.now,
            )
        )
        message.arrived.succeed()

    def run_rank(rank: int, order: tuple[Work, ...]) -> Any:
        held_bytes = 0
        inflight = 0
        for work in order:
            for event in waits.get(work, ()):
                if not event.processed:
                    yield event
            start = env.now
            parts = work.parts
            changed = False
            for action in parts:
                if action.op is Op.F:
                    held_bytes += stage_costs[action.stage].activation_bytes
                    inflight += 1
                    changed = True
            if changed:
                memory_log.append(
                    MemoryRecord(rank=rank, time=start, activation_bytes=held_bytes,
                                 inflight=inflight)
                )
            yield env.timeout(costs.duration(work))
            changed = False
            for action in parts:
                cost = stage_costs[action.stage]
                op = action.op
                if op is Op.B or (op is Op.F and forward_only):
                    held_bytes -= cost.activation_bytes
                    inflight -= 1
                elif op is Op.I:
                    held_bytes -= cost.activation_bytes - cost.weight_grad_bytes
                    inflight -= cost.weight_grad_bytes == 0
                elif op is Op.W:
                    held_bytes -= cost.weight_grad_bytes
                    inflight -= cost.weight_grad_bytes > 0
                else:
                    continue
                changed = True
            if changed:
                memory_log.append(
                    MemoryRecord(rank=rank, time=env.now, activation_bytes=held_bytes,
                                 inflight=inflight)
                )
            action_log.append((start, rank, work, env.now))
            pending = []
            for message in sends.get(work, ()):
                if free_links:
                    _deliver(message, env.now)
                else:
                    env.process(send(message))
                    if not costs.overlap_comm:
                        pending.append(message.arrived)
            for event in signals.get(work, ()):
                event.succeed()
            for event in pending:
                if not event.processed:
                    yield event
            progress[rank] += 1

    for rank, order in enumerate(schedule.orders):
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

    action_log.sort(key=lambda row: (row[0], row[1]))
    actions = tuple(
        ActionRecord(rank=rank, work=work, start=start, end=end)
        for start, rank, work, end in action_log
    )
    transfer_log.sort(key=lambda t: (t.start, t.src_rank, t.dst_rank))
    memory_log.sort(key=lambda m: (m.time, m.rank))
    return Trace(
        n_ranks=schedule.n_ranks,
        actions=actions,
        transfers=tuple(transfer_log),
        memory=tuple(memory_log),
    )
