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

The topological order and the message wiring depend only on the schedule: they
are the :class:`~pipesim.step.structure.StepStructure` that :func:`compile_schedule`
builds once and :func:`evaluate` reuses for any cost model, reading durations,
memory effects and message sizes from :func:`pipesim.step.cost_tables.cost_tables`.
Arithmetic is whatever exact numbers the costs hold (ints or Fractions), as in
the engine: results are identical, not merely close
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
from collections.abc import Sequence
from dataclasses import dataclass

from pipesim.costs import CostModel, require_eager
from pipesim.exact import Time
from pipesim.graph import validate
from pipesim.metrics import Metrics, metrics_from_totals
from pipesim.schedule import Schedule
from pipesim.step import message_columns, send_leads, send_order, structure_tables
from pipesim.step.deadlock import deadlock_error
from pipesim.step.memory import Effect
from pipesim.step.structure import StepStructure, step_structure

__all__ = [
    "StepResult",
    "compile_schedule",
    "evaluate",
    "fast_metrics",
    "metrics_of",
]


def compile_schedule(schedule: Schedule, /) -> StepStructure:
    """The cost-independent part of evaluating ``schedule`` (no validation): its
    :class:`~pipesim.step.structure.StepStructure`, which the engine reads too. A schedule
    whose waits form a cycle is the DeadlockError of :func:`pipesim.step.deadlock.deadlock_error`.
    """
    structure = step_structure(schedule)
    if structure.topological is None:
        raise deadlock_error(structure)
    return structure


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


def evaluate(structure: StepStructure, costs: CostModel, /) -> StepResult:
    """Makespan, busy time and memory peaks per rank of one step.

    >>> from pipesim.schedules import generate
    >>> compiled = compile_schedule(generate("gpipe", n_ranks=2, n_microbatches=2))
    >>> evaluate(compiled, CostModel.uniform(forward=1, backward=2)).makespan
    9
    """
    schedule = structure.schedule
    require_eager(costs, evaluator="the fast evaluator (pipesim.plan.fastsim)")
    costs, tables = structure_tables(structure, costs)
    _, occupancy, latency, pair_links = message_columns(structure, costs, tables)
    leads = send_leads(structure, pair_links)
    early = send_order(structure, leads)
    durations = tables.durations
    n_messages = len(structure.messages)
    free = [link.is_free for link in pair_links]
    pair_of = structure.pair_of
    blocking_sends = costs.blocking_sends
    arrival: list[Time] = [0] * structure.n_arrivals
    ready: list[Time] = [0] * schedule.n_ranks
    slots: list[list[Time]] = [[0] * link.max_concurrent for link in pair_links]
    ranks, keys = structure.ranks, structure.keys
    inputs, outputs = structure.inputs, structure.outputs
    makespan: Time = 0
    assert structure.topological is not None, "compile_schedule refuses a deadlock"
    for node in structure.topological:
        rank = ranks[node]
        t = ready[rank]
        for message in inputs[node]:
            a = arrival[message]
            if a > t:
                t = a
        end = t + durations[keys[node]]
        after = end
        # an overlapped pair's messages leave in send order (pipesim.step.send_leads)
        sent = outputs[node] if not leads or node not in early else early[node]
        for message in sent:
            leaves = end - leads[message] if leads and message in leads else end
            if message >= n_messages or free[pair_of[message]]:
                arrival[message] = leaves
                continue
            free_slots = slots[pair_of[message]]
            begin = free_slots[0] if free_slots[0] > leaves else leaves
            heapq.heapreplace(free_slots, begin + occupancy[message])
            arrived = begin + occupancy[message] + latency[message]
            arrival[message] = arrived
            if blocking_sends and arrived > after:
                after = arrived
        ready[rank] = after
        if end > makespan:
            makespan = end
    busy = tuple(sum((durations[keys[n]] for n in order), start=0) for order in structure.orders)
    peaks, inflight = _memory_peaks(structure, tables.effects)
    return StepResult(
        makespan=makespan, busy=busy, peak_activation_bytes=peaks, peak_inflight=inflight
    )


def _memory_peaks(
    structure: StepStructure, effects: Sequence[Effect]
) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """Per rank: the most activation bytes and stage-micro-batches held at once.

    Each work changes its rank's memory by its effect (:mod:`pipesim.step.memory`)
    at its start and at its end, in program order, so timing does not matter.
    """
    keys = structure.keys
    peaks: list[int] = []
    peak_counts: list[int] = []
    for order in structure.orders:
        held = count = peak = peak_count = 0
        for node in order:
            start_bytes, start_count, end_bytes, end_count = effects[keys[node]]
            for d_bytes, d_count in ((start_bytes, start_count), (end_bytes, end_count)):
                held += d_bytes
                count += d_count
                if held > peak:
                    peak = held
                if count > peak_count:
                    peak_count = count
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
