"""Every record of a step, computed without SimPy: :func:`fast_trace`.

The same computation as :func:`pipesim.plan.fastsim.evaluate`, keeping each
action's start and end, each transfer and each memory change, sorted exactly
as :func:`pipesim.engine.run_trace` sorts them; for checking the evaluator
record by record and for plotting large schedules.
"""

from __future__ import annotations

import heapq

from pipesim.costs import CostModel, require_eager
from pipesim.engine import action_records, memory_records
from pipesim.exact import Time
from pipesim.plan.fastsim import compile_schedule
from pipesim.schedule import Schedule
from pipesim.step import compile_step, send_order
from pipesim.trace import Trace, TransferRecord

__all__ = ["fast_trace"]


def fast_trace(schedule: Schedule, costs: CostModel, /) -> Trace:
    """The :class:`~pipesim.trace.Trace` that :func:`pipesim.engine.run_trace` returns.

    Slower than :func:`evaluate` (it builds every record); for checking and plotting.

    >>> from pipesim.schedules import generate
    >>> fast_trace(generate("1f1b", n_ranks=2, n_microbatches=2), CostModel()).makespan
    9
    """
    require_eager(costs, evaluator="the fast trace (pipesim.plan.fasttrace)")
    step = compile_step(compile_schedule(schedule), costs)
    structure = step.structure
    messages = structure.messages
    n_messages = len(messages)
    pair_of = structure.pair_of
    arrival: list[Time] = [0] * structure.n_arrivals
    ready: list[Time] = [0] * schedule.n_ranks
    slots: list[list[Time]] = [[0] * link.max_concurrent for link in step.pair_links]
    starts: list[Time] = [0] * structure.n_nodes
    ends: list[Time] = [0] * structure.n_nodes
    transfers: list[tuple[tuple[Time, int, int], int, TransferRecord]] = []
    early = send_order(structure, step.leads)
    assert structure.topological is not None
    for node in structure.topological:
        rank = structure.ranks[node]
        t = ready[rank]
        for message in structure.inputs[node]:
            t = max(t, arrival[message])
        end = t + step.durations[node]
        starts[node], ends[node] = t, end
        after = end
        for message in early.get(node, structure.outputs[node]):
            if message >= n_messages:  # a happens_before signal
                arrival[message] = end
                continue
            pair = pair_of[message]
            m = messages[message]
            leaves = end - step.leads.get(message, 0)  # pipesim.step.send_leads
            if step.pair_links[pair].is_free:
                begin, arrived = leaves, leaves
            else:
                begin = max(slots[pair][0], leaves)
                heapq.heapreplace(slots[pair], begin + step.occupancy[message])
                arrived = begin + step.occupancy[message] + step.latency[message]
                if step.costs.blocking_sends:
                    after = max(after, arrived)
            arrival[message] = arrived
            record = TransferRecord(
                src_rank=m.src_rank,
                dst_rank=m.dst_rank,
                producer=m.producer,
                consumer=m.consumer,
                n_bytes=step.message_bytes[message],
                start=begin,
                end=arrived,
            )
            # The engine logs a transfer when it arrives; equal keys keep that order.
            transfers.append(((begin, m.src_rank, m.dst_rank), message, record))
        ready[rank] = after
    # The engine sorts transfers by (start, source, destination); ties keep message order.
    transfers.sort(key=lambda row: (row[0], row[1]))
    return Trace(
        n_ranks=schedule.n_ranks,
        actions=action_records(structure, starts, ends),
        transfers=tuple(row[2] for row in transfers),
        memory=memory_records(step, starts, ends),
    )
