"""The SimPy model of one pipeline step: rank processes, link resources, memory.

It reads the compiled step (:mod:`pipesim.step`): one SimPy process per rank
runs its order; before each unit of work it waits for the arrivals that work
needs (activations from the previous stage, gradients from the next,
``happens_before`` signals), then holds the rank for the work's duration. When
work ends, each message it produces for another rank is sent over that ordered
pair's link, a ``simpy.Resource`` holding ``max_concurrent`` messages at once
(see :mod:`pipesim.costs` for the link model). Free links deliver at the
producer's end time without a process.

Activation memory per rank changes by each work's memory effect
(:mod:`pipesim.memory`) when it starts and when it ends.

Times are whatever exact numbers the cost model holds (ints or Fractions);
SimPy only adds and compares them, so results are exact.
"""

from __future__ import annotations

import gc
from dataclasses import dataclass
from operator import itemgetter
from typing import Any

import simpy

from pipesim.costs import CostModel
from pipesim.exact import Time
from pipesim.graph import check_structure
from pipesim.metrics import Metrics, compute_metrics
from pipesim.schedule import Schedule
from pipesim.step import (
    CompiledStep,
    StepStructure,
    compile_step,
    deadlock_error,
    step_structure,
)
from pipesim.trace import ActionRecord, MemoryRecord, Trace, TraceTotals, TransferRecord

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
    structure = step_structure(schedule)
    if check:
        check_structure(schedule, structure)
    trace = _without_gc(compile_step(structure, costs))
    return Simulation(
        schedule=schedule,
        costs=costs,
        trace=trace,
        metrics=compute_metrics(trace, schedule=schedule, costs=costs),
    )


def run_trace(schedule: Schedule, costs: CostModel, /) -> Trace:
    """Run the SimPy model and return the raw :class:`Trace` (no validation)."""
    return _without_gc(compile_step(schedule, costs))


def _without_gc(step: CompiledStep) -> Trace:
    # A step allocates several objects per action and no garbage cycles; the cyclic
    # collector would otherwise rescan the growing trace again and again.
    gc_was_enabled = gc.isenabled()
    gc.disable()
    try:
        return _run(step)
    finally:
        if gc_was_enabled:
            gc.enable()


def _run(step: CompiledStep) -> Trace:
    env: Any = simpy.Environment()  # typed by simpy as float time; ours is exact
    structure = step.structure
    schedule = structure.schedule
    n_messages = len(structure.messages)
    n_arrivals = structure.n_arrivals
    # Per arrival (message or signal): whether it arrived, the event its consumer
    # waits on (made only if it blocks), and for messages when it got its link and arrived.
    arrived = bytearray(n_arrivals)
    waiters: list[Any] = [None] * n_arrivals
    link_start: list[Time] = [0] * n_messages
    link_end: list[Time] = [0] * n_messages
    occupancy, latency, pair_of = step.occupancy, step.latency, structure.pair_of
    free = [link.is_free for link in step.pair_links]
    resources: list[simpy.Resource | None] = [None] * len(structure.pairs)
    overlap_comm = step.costs.overlap_comm
    action_log: list[tuple[Time, int, int, Time]] = []
    memory_log: list[tuple[Time, int, int, int]] = []
    timeout = env.timeout

    def deliver(arrival: int) -> None:
        arrived[arrival] = 1
        waiter = waiters[arrival]
        if waiter is not None:
            waiter.succeed()

    def send(message: int) -> Any:
        pair = pair_of[message]
        resource = resources[pair]
        if resource is None:
            capacity = step.pair_links[pair].max_concurrent
            resource = resources[pair] = simpy.Resource(env, capacity=capacity)
        with resource.request() as request:
            yield request
            start = env.now
            if occupancy[message]:
                yield timeout(occupancy[message])
        if latency[message]:
            yield timeout(latency[message])
        link_start[message] = start
        link_end[message] = env.now
        deliver(message)

    # One tuple per node keeps the hot loop to a single list lookup per action: duration,
    # memory effect (pipesim.memory), arrivals it waits for, messages and signals it sends.
    steps = [
        (
            duration,
            *effect,
            needs,
            tuple([a for a in outs if a < n_messages]),
            tuple([a for a in outs if a >= n_messages]),
        )
        for duration, effect, needs, outs in zip(
            step.durations, step.effects, structure.inputs, structure.outputs, strict=True
        )
    ]
    log = action_log.append
    remember = memory_log.append
    event = env.event

    peaks = [(0, 0)] * schedule.n_ranks
    finish: list[Time] = [0] * schedule.n_ranks
    waiting_at = [-1] * schedule.n_ranks  # the node a rank last blocked at

    def run_rank(rank: int, order: tuple[int, ...]) -> Any:
        held_bytes = inflight = peak_bytes = peak_inflight = 0
        for node in order:
            duration, s_bytes, s_count, e_bytes, e_count, needs, sent, signalled = steps[node]
            for arrival in needs:
                if not arrived[arrival]:
                    waiting_at[rank] = node
                    waiter = waiters[arrival] = event()
                    yield waiter
            start = env.now
            if s_bytes or s_count:
                held_bytes += s_bytes
                inflight += s_count
                if held_bytes > peak_bytes:
                    peak_bytes = held_bytes
                if inflight > peak_inflight:
                    peak_inflight = inflight
                remember((start, rank, held_bytes, inflight))
            yield timeout(duration)
            end = env.now
            if e_bytes or e_count:
                held_bytes += e_bytes
                inflight += e_count
                if held_bytes > peak_bytes:
                    peak_bytes = held_bytes
                if inflight > peak_inflight:
                    peak_inflight = inflight
                remember((end, rank, held_bytes, inflight))
            log((start, rank, node, end))
            sending = None
            for message in sent:
                if free[pair_of[message]]:
                    link_start[message] = link_end[message] = end
                    deliver(message)
                else:
                    if sending is None:
                        sending = []
                    sending.append(env.process(send(message)))
            for signal in signalled:
                deliver(signal)
            if sending and not overlap_comm:
                # Wait on the send processes, not the waiter: the consumer may own it.
                yield from sending
        waiting_at[rank] = -2  # done
        peaks[rank] = (peak_bytes, peak_inflight)
        finish[rank] = end if order else 0

    for rank, order in enumerate(structure.orders):
        env.process(run_rank(rank, order))
    env.run()

    stuck = [rank for rank in range(schedule.n_ranks) if waiting_at[rank] != -2]
    if stuck:
        raise deadlock_error(structure, blocked=[waiting_at[rank] for rank in stuck])
    durations = step.durations
    totals = TraceTotals(
        makespan=max((*finish, *link_end)),
        busy=tuple(sum([durations[n] for n in order], start=0) for order in structure.orders),
        peak_activation_bytes=tuple(p[0] for p in peaks),
        peak_inflight=tuple(p[1] for p in peaks),
    )
    return Trace.deferred(
        n_ranks=schedule.n_ranks,
        actions=lambda: _action_records(structure, action_log),
        transfers=lambda: _transfer_records(step, link_start, link_end),
        memory=lambda: _memory_records(memory_log),
        totals=totals,
    )


# Records are made only when a caller reads them: for a large step, most of the cost
# of a trace. Sorting uses C-level keys (itemgetter); it is the hot spot here.
_BY_TIME_THEN_RANK = itemgetter(0, 1)


def _action_records(
    structure: StepStructure, log: list[tuple[Time, int, int, Time]]
) -> tuple[ActionRecord, ...]:
    log.sort(key=_BY_TIME_THEN_RANK)
    works = structure.works
    return tuple(
        [
            ActionRecord(rank=rank, work=works[node], start=start, end=end)
            for start, rank, node, end in log
        ]
    )


def _transfer_records(
    step: CompiledStep, link_start: list[Time], link_end: list[Time]
) -> tuple[TransferRecord, ...]:
    messages = step.structure.messages
    by_link_start = sorted(
        range(len(messages)),
        key=lambda i: (link_start[i], messages[i].src_rank, messages[i].dst_rank),
    )
    sizes = step.message_bytes
    return tuple(
        [
            TransferRecord(
                src_rank=messages[i].src_rank,
                dst_rank=messages[i].dst_rank,
                producer=messages[i].producer,
                consumer=messages[i].consumer,
                n_bytes=sizes[i],
                start=link_start[i],
                end=link_end[i],
            )
            for i in by_link_start
        ]
    )


def _memory_records(log: list[tuple[Time, int, int, int]]) -> tuple[MemoryRecord, ...]:
    log.sort(key=_BY_TIME_THEN_RANK)
    return tuple(
        [
            MemoryRecord(rank=rank, time=time, activation_bytes=n_bytes, inflight=inflight)
            for time, rank, n_bytes, inflight in log
        ]
    )
