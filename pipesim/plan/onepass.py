"""The planner's evaluator: one pass over a complete schedule of simple actions.

:func:`quick_step` computes what :func:`pipesim.plan.fastsim.evaluate` computes
(and so what the SimPy engine computes) without first compiling the schedule:
each rank runs its actions in program order until one waits for a message
that has not been produced yet, and sleeps until it is. A sweep evaluates
every schedule once, so skipping the compiled form roughly halves the time
per configuration. Overlapped works (DualPipe) and schedules that cannot
finish return None: use the compiled path, which handles everything.
"""

from __future__ import annotations

import heapq

from pipesim.actions import OP_INDEX, Action, Op
from pipesim.costs import CostModel, require_eager
from pipesim.exact import Time
from pipesim.plan.fastsim import StepResult
from pipesim.plan.steady import Extrapolation, Pattern, Repeat
from pipesim.schedule import Schedule
from pipesim.step.cost_tables import cost_tables
from pipesim.step.dependencies import forward_source, gradient_source
from pipesim.step.numbering import action_key

__all__ = ["quick_step", "quick_step_repeat"]


def quick_step(
    schedule: Schedule, costs: CostModel, /, *, pattern: Pattern | None = None
) -> StepResult | None:
    """:func:`evaluate` in one pass, without compiling: for complete schedules of simple
    actions (what the registry's generators emit; None for anything else).

    Each rank runs its actions in program order until one waits for a message
    not yet produced; it then sleeps until that message is produced. Every
    action sends at most one cross-rank message (F to the next stage's rank,
    B or I to the previous stage's), so a message is keyed by its stage and
    micro-batch and links serve each rank's sends in program order, as in
    :func:`evaluate`. Returns None (use :func:`evaluate`) when the schedule has
    overlapped works or cannot finish (the compiled path then names the cycle).

    With ``pattern`` (:func:`pipesim.plan.steady.find_pattern` of ``schedule``) the
    steady state is extrapolated exactly once it repeats (:mod:`pipesim.plan.steady`):
    the same result, without evaluating every period.

    >>> from pipesim.schedules import generate
    >>> quick_step(generate("1f1b", n_ranks=4, n_microbatches=8), CostModel()).makespan
    33
    >>> from pipesim.plan.steady import find_pattern
    >>> long = generate("1f1b", n_ranks=4, n_microbatches=1000)
    >>> quick_step(long, CostModel(), pattern=find_pattern(long)).makespan  # (m + p - 1) 3
    3009
    """
    return _one_pass(schedule, costs, None if pattern is None else Extrapolation(pattern))


def quick_step_repeat(
    schedule: Schedule, costs: CostModel, pattern: Pattern, /
) -> tuple[StepResult | None, Repeat | None]:
    """:func:`quick_step` with ``pattern``, and the repeat of the steady state it found
    (None: none found, the evaluation was whole).

    >>> from pipesim.schedules import generate
    >>> from pipesim.plan.steady import find_pattern
    >>> s = generate("1f1b", n_ranks=4, n_microbatches=40)
    >>> result, repeat = quick_step_repeat(s, CostModel(), find_pattern(s))
    >>> result.makespan, repeat.periods, repeat.delta  # one micro-batch more: F + B later
    (129, 1, 3)
    """
    steady = Extrapolation(pattern)
    return _one_pass(schedule, costs, steady), steady.repeat


def _one_pass(
    schedule: Schedule, costs: CostModel, steady: Extrapolation | None
) -> StepResult | None:
    n_stages = schedule.n_stages
    costs = costs.for_stages(n_stages)
    require_eager(costs, evaluator="the one-pass evaluator (pipesim.plan.onepass)")
    # Durations, memory effects and message sizes: the shared tables (pipesim.step.cost_tables).
    tables = cost_tables(
        costs,
        n_stages=n_stages,
        forward_only=schedule.forward_only,
        placement=schedule.placement,
        n_copies=schedule.n_copies,
    )
    durations, effects = tables.durations, tables.effects
    placement = schedule.placement
    per_copy = n_stages // schedule.n_copies
    overlap_comm = costs.overlap_comm
    # Which stage's F output F of s reads, and whose gradient B / I of s reads
    # (pipesim.step.dependencies' rules); a message exists only between two ranks.
    f_src = [forward_source(s, per_copy=per_copy) for s in range(n_stages)]
    g_src = [gradient_source(s, per_copy=per_copy) for s in range(n_stages)]
    f_waits = [src is not None and placement[src] != placement[s] for s, src in enumerate(f_src)]
    g_waits = [src is not None and placement[src] != placement[s] for s, src in enumerate(g_src)]
    f_pair = [-1] * n_stages  # per producing stage: the rank its F message goes to
    g_pair = [-1] * n_stages  # per producing stage: the rank its gradient goes to
    for s in range(n_stages):
        if f_waits[s]:
            f_pair[f_src[s]] = placement[s]  # type: ignore[index]
        if g_waits[s]:
            g_pair[g_src[s]] = placement[s]  # type: ignore[index]
    # Per producing stage, its send: (link occupancy, latency, free link?, capacity); each
    # stage sends over one rank pair's link (CostModel.link_between).
    f_send = _sends(costs, placement, f_pair, tables.forward_bytes)
    g_send = _sends(costs, placement, g_pair, tables.gradient_bytes)
    width = schedule.n_microbatches
    g_base = n_stages * width  # key of a gradient message: g_base + s * width + mb
    signal_of: dict[int, list[int]] = {}  # happens_before: key of b -> keys of a
    signal_src: set[int] = set()
    readers: dict[int, int] = {}  # happens_before: key of a -> how many b still wait for it
    s_base = 2 * g_base
    for a, b in schedule.happens_before:
        if placement[a.stage] != placement[b.stage]:
            a_key, b_key = s_base + action_key(a, width), s_base + action_key(b, width)
            signal_of.setdefault(b_key, []).append(a_key)
            signal_src.add(a_key)
            readers[a_key] = readers.get(a_key, 0) + 1
    orders = schedule.orders
    n_ranks = len(orders)
    # message key -> arrival time, for messages sent and not yet read: a message has one
    # reader (the next stage's F, the previous stage's B or I) and a signal readers[key],
    # so what is left here is what later actions read (the state pipesim.plan.steady keeps)
    avail: dict[int, Time] = {}
    sleeping: dict[int, int] = {}  # message key -> the rank waiting for it
    slots: dict[tuple[int, int], list[Time]] = {}
    positions = [0] * n_ranks
    clock: list[Time] = [0] * n_ranks
    held = [0] * n_ranks
    count = [0] * n_ranks
    peaks = [0] * n_ranks
    peak_counts = [0] * n_ranks
    busy: list[Time] = [0] * n_ranks
    makespan: Time = 0
    f_op, w_op = Op.F, Op.W
    runnable = list(range(n_ranks - 1, -1, -1))
    lengths = [len(order) for order in orders]
    limits = lengths if steady is None else steady.limits()
    while True:
        while runnable:
            rank = runnable.pop()
            order = orders[rank]
            k, end_k = positions[rank], limits[rank]
            t_free, h, c, peak, peak_c, spent = (
                clock[rank],
                held[rank],
                count[rank],
                peaks[rank],
                peak_counts[rank],
                busy[rank],
            )
            while k < end_k:
                work = order[k]
                if type(work) is not Action:
                    return None
                stage, op, mb = work.stage, work.op, work.microbatch
                cost_key = 4 * stage + OP_INDEX[op]  # actions.action_code, inlined: per action
                t = t_free
                read = -1  # the message this action reads, once it runs
                if op is f_op:
                    if f_waits[stage]:
                        key = f_src[stage] * width + mb  # type: ignore[operator]
                        arrival = avail.get(key)
                        if arrival is None:
                            sleeping[key] = rank
                            break
                        if arrival > t:
                            t = arrival
                        read = key
                elif op is not w_op and g_waits[stage]:
                    key = g_base + g_src[stage] * width + mb  # type: ignore[operator]
                    arrival = avail.get(key)
                    if arrival is None:
                        sleeping[key] = rank
                        break
                    if arrival > t:
                        t = arrival
                    read = key
                if signal_of:
                    own = s_base + cost_key * width + mb
                    blocked = False
                    for a_key in signal_of.get(own, ()):
                        arrival = avail.get(a_key)
                        if arrival is None:
                            sleeping[a_key] = rank
                            blocked = True
                            break
                        if arrival > t:
                            t = arrival
                    if blocked:
                        break
                    for a_key in signal_of.get(own, ()):
                        readers[a_key] -= 1
                        if not readers[a_key]:
                            del avail[a_key]
                if read >= 0:
                    del avail[read]
                duration = durations[cost_key]
                end = t + duration
                spent += duration
                if end > makespan:
                    makespan = end
                # memory: the work's effect at its start, then at its end (pipesim.step.memory)
                start_bytes, start_count, end_bytes, end_count = effects[cost_key]
                h += start_bytes
                c += start_count
                if h > peak:
                    peak = h
                if c > peak_c:
                    peak_c = c
                h += end_bytes
                c += end_count
                if h > peak:
                    peak = h
                if c > peak_c:
                    peak_c = c
                if op is f_op:
                    dst = f_pair[stage]
                    key = stage * width + mb
                    send = f_send[stage]
                elif op is w_op:
                    dst = -1
                else:
                    dst = g_pair[stage]
                    key = g_base + stage * width + mb
                    send = g_send[stage]
                after = end
                if dst >= 0:
                    occupancy, latency, free, capacity = send
                    if free:
                        arrival = end
                    else:
                        queue = slots.get((rank, dst))
                        if queue is None:
                            queue = slots[(rank, dst)] = [0] * capacity
                        begin = queue[0] if queue[0] > end else end
                        heapq.heapreplace(queue, begin + occupancy)
                        arrival = begin + occupancy + latency
                        if not overlap_comm and arrival > after:
                            after = arrival
                    avail[key] = arrival
                    waiter = sleeping.pop(key, None)
                    if waiter is not None:
                        runnable.append(waiter)
                if signal_src:
                    own = s_base + cost_key * width + mb
                    if own in signal_src:
                        avail[own] = end
                        waiter = sleeping.pop(own, None)
                        if waiter is not None:
                            runnable.append(waiter)
                t_free = after
                k += 1
            positions[rank] = k
            clock[rank], held[rank], count[rank] = t_free, h, c
            peaks[rank], peak_counts[rank], busy[rank] = peak, peak_c, spent
        if steady is None:
            break
        # every rank is at its cut or asleep: record the state, or jump once it repeats
        cut_limits, makespan = steady.at_cut(
            positions=positions,
            clock=clock,
            held=held,
            count=count,
            busy=busy,
            avail=avail,
            sleeping=sleeping,
            slots=slots,
            makespan=makespan,
        )
        if cut_limits is None:
            steady, limits = None, lengths
        else:
            limits = cut_limits
        asleep = set(sleeping.values())
        runnable = [r for r in range(n_ranks - 1, -1, -1) if r not in asleep]
    if any(positions[r] < len(orders[r]) for r in range(n_ranks)):
        return None
    return StepResult(
        makespan=makespan,
        busy=tuple(busy),
        peak_activation_bytes=tuple(peaks),
        peak_inflight=tuple(peak_counts),
    )


def _sends(
    costs: CostModel, placement: tuple[int, ...], dst_of: list[int], sizes: list[int]
) -> list[tuple[Time, Time, bool, int]]:
    sends: list[tuple[Time, Time, bool, int]] = []
    for stage, dst in enumerate(dst_of):
        link = costs.link_between(placement[stage], dst) if dst >= 0 else costs.link
        sends.append(
            (link.occupancy(sizes[stage]), link.latency, link.is_free, link.max_concurrent)
        )
    return sends
