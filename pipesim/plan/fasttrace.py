"""Every record of a step, computed without SimPy: :func:`fast_trace`.

The same computation as :func:`pipesim.plan.fastsim.evaluate`, keeping each
action's start and end, each transfer and each memory change, sorted exactly
as :func:`pipesim.engine.run_trace` sorts them; for checking the evaluator
record by record and for plotting large schedules.
"""

from __future__ import annotations

import heapq

from pipesim.costs import CostModel
from pipesim.exact import Time
from pipesim.plan.fastsim import _SIGNAL, _tables, compile_schedule
from pipesim.schedule import Schedule
from pipesim.trace import ActionRecord, MemoryRecord, Trace, TransferRecord

__all__ = ["fast_trace"]


def fast_trace(schedule: Schedule, costs: CostModel, /) -> Trace:
    """The :class:`~pipesim.trace.Trace` that :func:`pipesim.engine.run_trace` returns.

    Slower than :func:`evaluate` (it builds every record); for checking and plotting.

    >>> from pipesim.schedules import generate
    >>> fast_trace(generate("1f1b", n_ranks=2, n_microbatches=2), CostModel()).makespan
    9
    """
    costs = costs.for_stages(schedule.n_stages)
    compiled = compile_schedule(schedule)
    durations, occupancy = _tables(compiled, costs)
    link = costs.link
    arrival: list[Time] = [0] * compiled.n_arrivals
    ready: list[Time] = [0] * schedule.n_ranks
    slots: list[list[Time]] = [[0] * link.max_concurrent for _ in compiled.pairs]
    starts: list[Time] = [0] * len(compiled.works)
    ends: list[Time] = [0] * len(compiled.works)
    transfers: list[tuple[tuple[Time, int, int], int, TransferRecord]] = []
    for index, rank, key, ins, outs in compiled.steps:
        t = ready[rank]
        for message in ins:
            t = max(t, arrival[message])
        end = t + durations[key]
        starts[index], ends[index] = t, end
        after = end
        for message, pair, size in outs:
            if pair == _SIGNAL:
                arrival[message] = end
                continue
            producer, consumer, src, dst = compiled.messages[message]
            if link.is_free:
                begin, arrived = end, end
            else:
                begin = max(slots[pair][0], end)
                heapq.heapreplace(slots[pair], begin + occupancy[size])
                arrived = begin + occupancy[size] + link.latency
                if not costs.overlap_comm:
                    after = max(after, arrived)
            arrival[message] = arrived
            record = TransferRecord(
                src_rank=src,
                dst_rank=dst,
                producer=producer,
                consumer=consumer,
                n_bytes=costs.message_bytes(producer),
                start=begin,
                end=arrived,
            )
            # The engine logs a transfer when it arrives; equal keys keep that order.
            transfers.append(((begin, src, dst), message, record))
        ready[rank] = after
    actions: list[tuple[Time, int, int]] = []
    memory: list[MemoryRecord] = []
    index = 0
    for rank in range(schedule.n_ranks):
        held = inflight = 0
        for allocs, frees in compiled.memory[rank]:
            # The engine records a change only when there is one (see its effect tables).
            if allocs:
                for stage in allocs:
                    held += costs.stage(stage).activation_bytes
                    inflight += 1
                memory.append(
                    MemoryRecord(
                        rank=rank, time=starts[index], activation_bytes=held, inflight=inflight
                    )
                )
            freed_bytes = freed_count = 0
            for stage, op in frees:
                cost = costs.stage(stage)
                if op in (0, 1):
                    freed_bytes += cost.activation_bytes
                    freed_count += 1
                elif op == 2:
                    freed_bytes += cost.activation_bytes - cost.weight_grad_bytes
                    freed_count += cost.weight_grad_bytes == 0
                else:
                    freed_bytes += cost.weight_grad_bytes
                    freed_count += cost.weight_grad_bytes > 0
            if freed_bytes or freed_count:
                held -= freed_bytes
                inflight -= freed_count
                memory.append(
                    MemoryRecord(
                        rank=rank, time=ends[index], activation_bytes=held, inflight=inflight
                    )
                )
            actions.append((starts[index], rank, index))
            index += 1
    actions.sort(key=lambda row: (row[0], row[1]))
    # The engine sorts transfers by (start, source, destination); ties keep message order.
    transfers.sort(key=lambda row: (row[0], row[1]))
    memory.sort(key=lambda m: (m.time, m.rank))
    return Trace(
        n_ranks=schedule.n_ranks,
        actions=tuple(
            ActionRecord(rank=rank, work=compiled.works[i], start=start, end=ends[i])
            for start, rank, i in actions
        ),
        transfers=tuple(row[2] for row in transfers),
        memory=tuple(memory),
    )
