"""A fast evaluator of one pipeline step: the SimPy engine's model without SimPy.

The planner simulates thousands of configurations; :func:`pipesim.engine.simulate`
stays the reference, and this module computes the *same* numbers faster:

- The start of each unit of work depends only on things that finish before it
  (its rank's previous work, the messages it waits for, ``happens_before``
  signals), so one pass over the work in a topological order of the dependency
  graph computes every start and end: a longest-path computation with the
  link model folded in.
- A link (one per ordered pair of ranks, ``max_concurrent`` messages at a time,
  first come first served) only carries messages from one sending rank, which
  sends them in its program order at non-decreasing times; so each message
  starts on the link at ``max(send time, earliest free slot)``, exactly when the
  SimPy ``Resource`` grants it.
- Memory changes only at a rank's own starts and ends, in its program order, so
  the peaks do not depend on timing at all.

The topological order and the message wiring depend only on the schedule, so
:func:`compile_schedule` computes them once and :func:`evaluate` reuses them for
any cost model. Arithmetic is whatever exact numbers the costs hold (ints or
Fractions), as in the engine: results are identical, not merely close
(``tests/test_plan_fastsim.py`` checks every record of the trace on random
schedules and random durations).

>>> from pipesim.engine import simulate
>>> from pipesim.schedules import generate
>>> sched = generate("1f1b", n_ranks=4, n_microbatches=8)
>>> fast_metrics(sched) == simulate(sched).metrics
True
>>> fast_metrics(sched).makespan  # (m + p - 1)(F + B)
33
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass

from pipesim.actions import Action, Op, Overlap, Work
from pipesim.costs import CostModel
from pipesim.dependencies import index_schedule
from pipesim.errors import DeadlockError
from pipesim.exact import Time
from pipesim.graph import build_graph, find_deadlock, validate
from pipesim.metrics import Metrics, metrics_from_totals
from pipesim.schedule import Schedule

__all__ = [
    "CompiledSchedule",
    "StepResult",
    "compile_schedule",
    "evaluate",
    "fast_metrics",
    "metrics_of",
]

_OP_INDEX = {Op.F: 0, Op.B: 1, Op.I: 2, Op.W: 3}
_SIGNAL = -1  # pair id of a happens_before signal: arrives when its work ends, no link


@dataclass(frozen=True, slots=True, kw_only=True)
class CompiledSchedule:
    """What :func:`evaluate` needs of a schedule, independent of costs.

    ``steps`` lists every unit of work in a topological order of the
    dependency graph as ``(work index, rank, duration key, input message ids,
    outputs)``; an output is ``(message id, link pair id, size key)``.
    """

    schedule: Schedule
    works: tuple[Work, ...]
    """Every unit of work, indexed as in ``steps``."""
    steps: tuple[tuple[int, int, int, list[int], list[tuple[int, int, int]]], ...]
    messages: tuple[tuple[Action, Action, int, int], ...]
    """Per message id: (producer, consumer, source rank, destination rank)."""
    pairs: tuple[tuple[int, int], ...]
    """Per link pair id: (source rank, destination rank)."""
    overlaps: tuple[Overlap, ...]
    """Overlapped works; duration key ``4 * n_stages + j`` is ``overlaps[j]``."""
    rank_keys: tuple[tuple[int, ...], ...]
    """Per rank, the duration keys of its works in program order (for busy time)."""
    memory: tuple[tuple[tuple[tuple[int, ...], tuple[tuple[int, int], ...]], ...], ...]
    """Per rank, per work in program order: (stages F allocates, (stage, op) frees)."""
    n_arrivals: int
    """Messages plus cross-rank ``happens_before`` signals."""


def compile_schedule(schedule: Schedule, /) -> CompiledSchedule:
    """The cost-independent part of evaluating ``schedule`` (no validation).

    The dependency rules and the order in which messages are wired come from
    :func:`pipesim.dependencies.index_schedule`, exactly as the engine takes
    them. A schedule whose waits form a cycle is a DeadlockError showing the
    cycle.
    """
    n_stages = schedule.n_stages
    index = index_schedule(schedule)
    works, rank_of, orders = index.works, index.ranks, index.orders
    overlaps: list[Overlap] = []
    keys: list[int] = []  # duration key per work: 4 * stage + op, or an overlap's slot
    for work in works:
        if isinstance(work, Action):
            keys.append(4 * work.stage + _OP_INDEX[work.op])
        else:
            keys.append(4 * n_stages + len(overlaps))
            overlaps.append(work)

    # Cross-rank data messages, in index_schedule's edge order (the engine's send order).
    # Only cross-rank edges carry messages: the engine relies on program order in a rank.
    inputs: list[list[int]] = [[] for _ in works]
    outputs: list[list[tuple[int, int, int]]] = [[] for _ in works]
    messages: list[tuple[Action, Action, int, int]] = []
    pair_ids: dict[tuple[int, int], int] = {}
    for p_node, c_node, producer, consumer in index.data_edges:
        src, dst = rank_of[p_node], rank_of[c_node]
        if src == dst:
            continue
        pair = pair_ids.setdefault((src, dst), len(pair_ids))
        # CostModel.message_bytes: F sends its stage's output, B / I the previous stage's.
        if producer.op is Op.F:
            size_key = producer.stage
        else:
            size_key = producer.stage - 1 if producer.stage > 0 else n_stages
        message = len(messages)
        messages.append((producer, consumer, src, dst))
        outputs[p_node].append((message, pair, size_key))
        inputs[c_node].append(message)
    n_arrivals = len(messages)
    for a_node, b_node in index.extra_edges:
        if rank_of[a_node] != rank_of[b_node]:
            outputs[a_node].append((n_arrivals, _SIGNAL, 0))
            inputs[b_node].append(n_arrivals)
            n_arrivals += 1

    topological = _topological_order(orders, inputs, outputs, n_arrivals)
    if topological is None:
        cycle = find_deadlock(build_graph(schedule))
        detail = " -> ".join((*cycle, cycle[0])) if cycle else "no cycle found"
        raise DeadlockError(
            f"schedule deadlocks: these actions wait on each other in a cycle: {detail}; "
            "reorder the ranks so that each action runs after what it needs",
            cycle=cycle,
        )
    steps = tuple([(i, rank_of[i], keys[i], inputs[i], outputs[i]) for i in topological])
    rank_keys = tuple(tuple([keys[i] for i in nodes]) for nodes in orders)
    forward_only = schedule.forward_only
    effects: dict[int, tuple[tuple[int, ...], tuple[tuple[int, int], ...]]] = {}

    def effect(work: Work) -> tuple[tuple[int, ...], tuple[tuple[int, int], ...]]:
        allocs = tuple(a.stage for a in work.parts if a.op is Op.F)
        frees = tuple(
            (a.stage, _OP_INDEX[a.op]) for a in work.parts if a.op is not Op.F or forward_only
        )
        return allocs, frees

    memory_rows = []
    for nodes in orders:
        row = []
        for i in nodes:
            key = keys[i]
            if key < 4 * n_stages:  # a simple action: its effect depends on (stage, op) only
                known = effects.get(key)
                if known is None:
                    known = effects[key] = effect(works[i])
                row.append(known)
            else:
                row.append(effect(works[i]))
        memory_rows.append(tuple(row))
    return CompiledSchedule(
        schedule=schedule,
        works=tuple(works),
        steps=steps,
        messages=tuple(messages),
        pairs=tuple(pair_ids),
        overlaps=tuple(overlaps),
        rank_keys=rank_keys,
        memory=tuple(memory_rows),
        n_arrivals=n_arrivals,
    )


def _topological_order(
    orders: list[list[int]],
    inputs: list[list[int]],
    outputs: list[list[tuple[int, int, int]]],
    n_arrivals: int,
) -> list[int] | None:
    """Work in an order where everything a work waits for comes first; None on a cycle.

    Sweeps the ranks, advancing each as far as its next work's messages have
    been produced, until all work is placed (or a sweep makes no progress).
    """
    produced = bytearray(n_arrivals)
    positions = [0] * len(orders)
    order: list[int] = []
    progress = True
    while progress:
        progress = False
        for rank, nodes in enumerate(orders):
            k = start = positions[rank]
            end = len(nodes)
            while k < end:
                node = nodes[k]
                for message in inputs[node]:
                    if not produced[message]:
                        break
                else:
                    order.append(node)
                    for message, _, _ in outputs[node]:
                        produced[message] = 1
                    k += 1
                    continue
                break
            if k != start:
                positions[rank] = k
                progress = True
    return order if len(order) == len(inputs) else None


# -- evaluation --------------------------------------------------------------------------
@dataclass(frozen=True, slots=True, kw_only=True)
class StepResult:
    """What :func:`evaluate` computes: enough for :class:`~pipesim.metrics.Metrics`."""

    makespan: Time
    busy: tuple[Time, ...]
    """Per rank."""
    peak_activation_bytes: tuple[int, ...]
    """Per rank."""
    peak_inflight: tuple[int, ...]
    """Per rank."""


def _tables(compiled: CompiledSchedule, costs: CostModel) -> tuple[list[Time], list[Time]]:
    """Durations by duration key; link occupancy by message size key."""
    n_stages = compiled.schedule.n_stages
    durations: list[Time] = []
    for stage in range(n_stages):
        cost = costs.stage(stage)
        durations += [cost.forward, cost.backward, cost.input_grad, cost.weight_grad]
    durations += [costs.duration(work) for work in compiled.overlaps]
    link = costs.link
    occupancy = [link.occupancy(costs.stage(s).output_bytes) for s in range(n_stages)]
    occupancy.append(0)  # size key n_stages: the first stage's input gradient, 0 bytes
    return durations, occupancy


def evaluate(compiled: CompiledSchedule, costs: CostModel, /) -> StepResult:
    """Makespan, busy time and memory peaks per rank of one step.

    >>> from pipesim.schedules import generate
    >>> compiled = compile_schedule(generate("gpipe", n_ranks=2, n_microbatches=2))
    >>> evaluate(compiled, CostModel.uniform(forward=1, backward=2)).makespan
    9
    """
    schedule = compiled.schedule
    costs = costs.for_stages(schedule.n_stages)
    durations, occupancy = _tables(compiled, costs)
    link = costs.link
    free = link.is_free
    latency = link.latency
    capacity = link.max_concurrent
    overlap_comm = costs.overlap_comm
    arrival: list[Time] = [0] * compiled.n_arrivals
    ready: list[Time] = [0] * schedule.n_ranks
    slots: list[list[Time]] = [[0] * capacity for _ in compiled.pairs]
    makespan: Time = 0
    for _, rank, key, ins, outs in compiled.steps:
        t = ready[rank]
        for message in ins:
            a = arrival[message]
            if a > t:
                t = a
        end = t + durations[key]
        after = end
        for message, pair, size in outs:
            if pair == _SIGNAL or free:
                arrival[message] = end
                continue
            free_slots = slots[pair]
            begin = free_slots[0] if free_slots[0] > end else end
            heapq.heapreplace(free_slots, begin + occupancy[size])
            arrived = begin + occupancy[size] + latency
            arrival[message] = arrived
            if not overlap_comm and arrived > after:
                after = arrived
        ready[rank] = after
        if end > makespan:
            makespan = end
    busy = tuple(sum((durations[k] for k in keys), start=0) for keys in compiled.rank_keys)
    peaks, inflight = _memory_peaks(compiled, costs)
    return StepResult(
        makespan=makespan, busy=busy, peak_activation_bytes=peaks, peak_inflight=inflight
    )


def _memory_peaks(
    compiled: CompiledSchedule, costs: CostModel
) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """Per rank: the most activation bytes and stage-micro-batches held at once.

    The engine's memory model (see :mod:`pipesim.costs`): F allocates its
    stage's activations at its start; B frees them at its end, I all but
    ``weight_grad_bytes``, W the rest; forward-only, F frees at its end.
    """
    n_stages = compiled.schedule.n_stages
    act = [costs.stage(s).activation_bytes for s in range(n_stages)]
    wgb = [costs.stage(s).weight_grad_bytes for s in range(n_stages)]
    peaks: list[int] = []
    peak_counts: list[int] = []
    for events in compiled.memory:
        held = count = peak = peak_count = 0
        for allocs, frees in events:
            if allocs:
                for stage in allocs:
                    held += act[stage]
                    count += 1
                if held > peak:
                    peak = held
                if count > peak_count:
                    peak_count = count
            for stage, op in frees:
                if op == 0 or op == 1:  # F (forward-only) or B: everything
                    held -= act[stage]
                    count -= 1
                elif op == 2:  # I: all but what W still needs
                    held -= act[stage] - wgb[stage]
                    count -= wgb[stage] == 0
                else:  # W
                    held -= wgb[stage]
                    count -= wgb[stage] > 0
        peaks.append(peak)
        peak_counts.append(peak_count)
    return tuple(peaks), tuple(peak_counts)


def metrics_of(schedule: Schedule, costs: CostModel, result: StepResult, /) -> Metrics:
    """The :class:`~pipesim.metrics.Metrics` that ``compute_metrics`` gives for this step."""
    return metrics_from_totals(
        schedule=schedule,
        costs=costs,
        makespan=result.makespan,
        busy=result.busy,
        peak_activation_bytes=result.peak_activation_bytes,
        peak_inflight=result.peak_inflight,
    )


def fast_metrics(
    schedule: Schedule, /, *, costs: CostModel | None = None, check: bool = True
) -> Metrics:
    """``simulate(schedule, costs=costs, check=check).metrics``, computed fast.

    >>> from pipesim.schedules import generate
    >>> fast_metrics(generate("gpipe", n_ranks=4, n_microbatches=8)).bubble_ratio
    Fraction(3, 11)
    """
    costs = (costs or CostModel()).for_stages(schedule.n_stages)
    if check:
        validate(schedule)
    compiled = compile_schedule(schedule)
    return metrics_of(schedule, costs, evaluate(compiled, costs))
