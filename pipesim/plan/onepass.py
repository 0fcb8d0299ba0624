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
from dataclasses import dataclass, field

from pipesim.actions import OP_INDEX, Action, Overlap, Work
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
    """The evaluation, one cut at a time when ``steady`` extrapolates (None: whole)."""
    wiring = _wiring(schedule, costs)
    if wiring is None:
        return None
    orders = schedule.orders
    n_ranks = len(orders)
    state = _State(
        positions=[0] * n_ranks,
        clock=[0] * n_ranks,
        held=[0] * n_ranks,
        count=[0] * n_ranks,
        peaks=[0] * n_ranks,
        peak_counts=[0] * n_ranks,
        busy=[0] * n_ranks,
        readers=dict(wiring.readers),
        runnable=list(range(n_ranks - 1, -1, -1)),
    )
    lengths = [len(order) for order in orders]
    limits = lengths if steady is None else steady.limits()
    while True:
        _run_ranks(wiring, state, orders, limits)
        if steady is None:
            break
        # every rank is at its cut or asleep: record the state, or jump once it repeats
        cut_limits, state.makespan = steady.at_cut(
            positions=state.positions,
            clock=state.clock,
            held=state.held,
            count=state.count,
            busy=state.busy,
            avail=state.avail,
            sleeping=state.sleeping,
            slots=state.slots,
            makespan=state.makespan,
        )
        if cut_limits is None:
            steady, limits = None, lengths
        else:
            limits = cut_limits
        asleep = set(state.sleeping.values())
        state.runnable = [r for r in range(n_ranks - 1, -1, -1) if r not in asleep]
    if any(state.positions[r] < lengths[r] for r in range(n_ranks)):
        return None
    return StepResult(
        makespan=state.makespan,
        busy=tuple(state.busy),
        peak_activation_bytes=tuple(state.peaks),
        peak_inflight=tuple(state.peak_counts),
    )


_Send = tuple[Time, Time, bool, int, Time]
"""A stage's send: link occupancy, latency, free link?, capacity, send overhead."""


@dataclass(frozen=True, slots=True, kw_only=True)
class _Wiring:
    """What the evaluator reads per action: costs by action code, and who sends what to
    whom (pipesim.step.dependencies' rules; a message exists only between two ranks).

    Message keys: F output of stage s for micro-batch mb ``s * width + mb``; gradient
    ``g_base + s * width + mb``; a ``happens_before`` signal ``s_base + action key``."""

    durations: list[Time]
    effects: list[tuple[int, int, int, int]]
    width: int
    read_base: list[int]
    """Per action code: the key of the message it reads less its micro-batch (-1: none)."""
    send_to: list[int]
    """Per action code: the rank its message goes to (-1: none)."""
    send_base: list[int]
    """Per action code: the key of the message it sends less its micro-batch."""
    send_link: list[_Send]
    """Per action code: how its message is sent."""
    s_base: int
    blocking_sends: bool
    signal_of: dict[int, list[int]]
    """happens_before: key of b -> keys of the a it waits for."""
    signal_src: set[int]
    readers: dict[int, int]
    """happens_before: key of a -> how many b wait for it."""
    overlap_keys: dict[tuple[int, ...], int]
    """An overlapped work's part codes -> its cost key (after the actions')."""
    consumers: dict[int, tuple[int, int, int]]
    """Overlapped schedules: message key -> where its reader runs (rank, position, part),
    the order in which one work's messages take a link (pipesim.step.wiring numbers
    messages by their reader)."""


def _wiring(schedule: Schedule, costs: CostModel) -> _Wiring | None:
    """The tables of ``schedule`` under ``costs``; None for what this evaluator does not
    run (signals between overlapped works)."""
    n_stages = schedule.n_stages
    costs = costs.for_stages(n_stages)
    require_eager(costs, evaluator="the one-pass evaluator (pipesim.plan.onepass)")
    placement = schedule.placement
    overlaps = _overlap_kinds(schedule)
    if overlaps and schedule.happens_before:
        return None
    # Durations, memory effects and message sizes: the shared tables (pipesim.step.cost_tables).
    tables = cost_tables(
        costs,
        n_stages=n_stages,
        forward_only=schedule.forward_only,
        overlaps=list(overlaps.values()),
        placement=placement,
        n_copies=schedule.n_copies,
    )
    per_copy = n_stages // schedule.n_copies
    f_src = [forward_source(s, per_copy=per_copy) for s in range(n_stages)]
    g_src = [gradient_source(s, per_copy=per_copy) for s in range(n_stages)]
    f_waits = [src is not None and placement[src] != placement[s] for s, src in enumerate(f_src)]
    g_waits = [src is not None and placement[src] != placement[s] for s, src in enumerate(g_src)]
    f_pair = [-1] * n_stages
    g_pair = [-1] * n_stages
    for s in range(n_stages):
        if f_waits[s]:
            f_pair[f_src[s]] = placement[s]  # type: ignore[index]
        if g_waits[s]:
            g_pair[g_src[s]] = placement[s]  # type: ignore[index]
    width = schedule.n_microbatches
    g_base = n_stages * width
    s_base = 2 * g_base
    f_send = _sends(costs, placement, f_pair, tables.forward_bytes)
    g_send = _sends(costs, placement, g_pair, tables.gradient_bytes)
    # Per action code (4 * stage + OP_INDEX[op]): F reads its source stage's F output and
    # sends its own; B and I read and send gradients; W neither.
    read_base, send_to, send_base, send_link = [], [], [], []
    for s in range(n_stages):
        f_read = f_src[s] * width if f_waits[s] else -1  # type: ignore[operator]
        g_read = g_base + g_src[s] * width if g_waits[s] else -1  # type: ignore[operator]
        read_base += [f_read, g_read, g_read, -1]
        send_to += [f_pair[s], g_pair[s], g_pair[s], -1]
        send_base += [s * width, g_base + s * width, g_base + s * width, 0]
        send_link += [f_send[s], g_send[s], g_send[s], g_send[s]]
    signal_of: dict[int, list[int]] = {}
    signal_src: set[int] = set()
    readers: dict[int, int] = {}
    for a, b in schedule.happens_before:
        if placement[a.stage] != placement[b.stage]:
            a_key, b_key = s_base + action_key(a, width), s_base + action_key(b, width)
            signal_of.setdefault(b_key, []).append(a_key)
            signal_src.add(a_key)
            readers[a_key] = readers.get(a_key, 0) + 1
    wiring = _Wiring(
        durations=tables.durations,
        effects=tables.effects,  # type: ignore[arg-type]
        width=width,
        read_base=read_base,
        send_to=send_to,
        send_base=send_base,
        send_link=send_link,
        s_base=s_base,
        blocking_sends=costs.blocking_sends,
        signal_of=signal_of,
        signal_src=signal_src,
        readers=readers,
        overlap_keys={kind: 4 * n_stages + j for j, kind in enumerate(overlaps)},
        consumers={},
    )
    if overlaps:
        _find_consumers(schedule, wiring)
    return wiring


def _overlap_kinds(schedule: Schedule) -> dict[tuple[int, ...], Overlap]:
    """One overlapped work of each kind (its parts' action codes), in order of appearance:
    a kind's duration and memory effect depend on its parts' stages and ops alone."""
    kinds: dict[tuple[int, ...], Overlap] = {}
    for order in schedule.orders:
        if set(map(type, order)) <= {Action}:
            continue
        for work in order:
            if type(work) is Overlap:
                kind = tuple(4 * a.stage + OP_INDEX[a.op] for a in work.parts)
                kinds.setdefault(kind, work)
    return kinds


def _read_key(wiring: _Wiring, action: Action) -> int:
    """The message ``action`` reads (-1: none)."""
    base = wiring.read_base[4 * action.stage + OP_INDEX[action.op]]
    return base + action.microbatch if base >= 0 else -1


def _find_consumers(schedule: Schedule, wiring: _Wiring) -> None:
    for rank, order in enumerate(schedule.orders):
        for position, work in enumerate(order):
            for part, action in enumerate(work.parts):
                key = _read_key(wiring, action)
                if key >= 0:
                    wiring.consumers[key] = (rank, position, part)


@dataclass(slots=True, kw_only=True)
class _State:
    """Everything a later action reads; per rank lists, and the messages in flight: sent
    and not yet read, with their arrival times (a message has one reader, a signal
    ``readers[key]``), so what is left is what pipesim.plan.steady keeps at a cut."""

    positions: list[int]
    clock: list[Time]
    held: list[int]
    count: list[int]
    peaks: list[int]
    peak_counts: list[int]
    busy: list[Time]
    readers: dict[int, int]
    runnable: list[int]
    avail: dict[int, Time] = field(default_factory=dict)
    sleeping: dict[int, int] = field(default_factory=dict)
    """Message key -> the rank waiting for it."""
    slots: dict[tuple[int, int], list[Time]] = field(default_factory=dict)
    """Per (sender, receiver) link: when each of its slots is next free (a heap)."""
    makespan: Time = 0


def _run_ranks(
    wiring: _Wiring, state: _State, orders: tuple[tuple[Work, ...], ...], limits: list[int]
) -> None:
    """Run every runnable rank in program order up to its limit, each until it waits for a
    message not yet sent (it then sleeps until that message is sent).

    The hot loop of the planner: one function, every table a local, the per-action work
    inlined (action_code, the link queue, the memory peaks), as a Python call per action
    costs measurably (docs/planner-speed.md, "The evaluator's shape"). Rarer work has its
    own functions: overlapped works (:func:`_run_overlap`) and ``happens_before`` signals
    (:func:`_take_signals`, :func:`_post_signal`). tests/test_plan_fastsim.py holds this
    loop equal to the compiled evaluator and the SimPy engine.
    """
    durations, effects, width, s_base = (
        wiring.durations,
        wiring.effects,
        wiring.width,
        wiring.s_base,
    )
    read_base, send_to, send_base, send_link = (
        wiring.read_base,
        wiring.send_to,
        wiring.send_base,
        wiring.send_link,
    )
    blocking_sends, signal_of, signal_src = (
        wiring.blocking_sends,
        wiring.signal_of,
        wiring.signal_src,
    )
    avail, sleeping, slots, runnable = state.avail, state.sleeping, state.slots, state.runnable
    positions, clock, held, count = state.positions, state.clock, state.held, state.count
    peaks, peak_counts, busy = state.peaks, state.peak_counts, state.busy
    makespan = state.makespan
    while runnable:
        rank = runnable.pop()
        order = orders[rank]
        k, end_k = positions[rank], limits[rank]
        t_free, h, c = clock[rank], held[rank], count[rank]
        peak, peak_c, spent = peaks[rank], peak_counts[rank], busy[rank]
        while k < end_k:
            work = order[k]
            if type(work) is not Action:
                state.makespan = makespan
                ran = _run_overlap(wiring, state, rank, work, (t_free, h, c, peak, peak_c, spent))
                if ran is None:
                    break
                t_free, h, c, peak, peak_c, spent = ran
                makespan = state.makespan
                k += 1
                continue
            mb = work.microbatch
            code = 4 * work.stage + OP_INDEX[work.op]  # actions.action_code, inlined
            t = t_free
            read = read_base[code]  # the message this action reads, once it runs
            if read >= 0:
                read += mb
                arrival = avail.get(read)
                if arrival is None:
                    sleeping[read] = rank
                    break
                if arrival > t:
                    t = arrival
            if signal_of:
                signalled = _take_signals(wiring, state, rank, s_base + code * width + mb, t)
                if signalled is None:
                    break
                t = signalled
            if read >= 0:
                del avail[read]
            duration = durations[code]
            end = t + duration
            spent += duration
            if end > makespan:
                makespan = end
            # memory: the work's effect at its start, then at its end (pipesim.step.memory)
            start_bytes, start_count, end_bytes, end_count = effects[code]
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
            after = end
            dst = send_to[code]
            if dst >= 0:
                key = send_base[code] + mb
                occupancy, latency, free, capacity, _ = send_link[code]
                if free:
                    arrival = end
                else:
                    queue = slots.get((rank, dst))
                    if queue is None:
                        queue = slots[(rank, dst)] = [0] * capacity
                    begin = queue[0] if queue[0] > end else end
                    heapq.heapreplace(queue, begin + occupancy)
                    arrival = begin + occupancy + latency
                    if blocking_sends and arrival > after:
                        after = arrival
                avail[key] = arrival
                waiter = sleeping.pop(key, None)
                if waiter is not None:
                    runnable.append(waiter)
            if signal_src:
                _post_signal(wiring, state, s_base + code * width + mb, end)
            t_free = after
            k += 1
        positions[rank] = k
        clock[rank], held[rank], count[rank] = t_free, h, c
        peaks[rank], peak_counts[rank], busy[rank] = peak, peak_c, spent
    state.makespan = makespan


def _take_signals(wiring: _Wiring, state: _State, rank: int, own: int, t: Time) -> Time | None:
    """The time the action of signal key ``own`` may start on ``rank`` (``t`` or later), once
    every ``happens_before`` signal it waits for has arrived; those it then reads. None: one
    has not (``rank`` sleeps on it)."""
    waits_for = wiring.signal_of.get(own, ())
    for a_key in waits_for:
        arrival = state.avail.get(a_key)
        if arrival is None:
            state.sleeping[a_key] = rank
            return None
        if arrival > t:
            t = arrival
    for a_key in waits_for:
        state.readers[a_key] -= 1
        if not state.readers[a_key]:
            del state.avail[a_key]
    return t


def _post_signal(wiring: _Wiring, state: _State, own: int, end: Time) -> None:
    """Send the ``happens_before`` signal of key ``own`` at ``end``, if some action waits for
    it, and wake the rank asleep on it."""
    if own in wiring.signal_src:
        state.avail[own] = end
        waiter = state.sleeping.pop(own, None)
        if waiter is not None:
            state.runnable.append(waiter)


_Clocks = tuple[Time, int, int, int, int, Time]
"""A running rank's free time, bytes and micro-batches held, their peaks, busy time."""


def _run_overlap(
    wiring: _Wiring, state: _State, rank: int, work: Work, clocks: _Clocks
) -> _Clocks | None:
    """Run an overlapped work (DualPipe's F&B pair) as :func:`pipesim.plan.fastsim.evaluate`
    does: it starts once every part's message has arrived, lasts its own duration, and
    sends its parts' messages, each leaving the send overheads of the later parts' before
    its end (pipesim.step.compile.send_leads), in the order they leave (the earliest
    first, then by reader: pipesim.step.compile.send_order). None: it waits (asleep)."""
    t_free, h, c, peak, peak_c, spent = clocks
    avail, sleeping = state.avail, state.sleeping
    parts = work.parts
    t = t_free
    reads = []
    for action in parts:
        key = _read_key(wiring, action)
        if key < 0:
            continue
        arrival = avail.get(key)
        if arrival is None:
            sleeping[key] = rank
            return None
        if arrival > t:
            t = arrival
        reads.append(key)
    for key in reads:
        del avail[key]
    cost_key = wiring.overlap_keys[tuple(4 * a.stage + OP_INDEX[a.op] for a in parts)]
    duration = wiring.durations[cost_key]
    end = t + duration
    spent += duration
    if end > state.makespan:
        state.makespan = end
    start_bytes, start_count, end_bytes, end_count = wiring.effects[cost_key]
    peak, peak_c = max(peak, h + start_bytes), max(peak_c, c + start_count)
    h, c = h + start_bytes + end_bytes, c + start_count + end_count
    peak, peak_c = max(peak, h), max(peak_c, c)
    after = end
    for lead, key, dst, send in _overlap_sends(wiring, parts):
        occupancy, latency, free, capacity, _ = send
        leaves = end - lead
        if free:
            arrival = leaves
        else:
            queue = state.slots.get((rank, dst))
            if queue is None:
                queue = state.slots[(rank, dst)] = [0] * capacity
            begin = queue[0] if queue[0] > leaves else leaves
            heapq.heapreplace(queue, begin + occupancy)
            arrival = begin + occupancy + latency
            if wiring.blocking_sends and arrival > after:
                after = arrival
        avail[key] = arrival
        waiter = sleeping.pop(key, None)
        if waiter is not None:
            state.runnable.append(waiter)
    return after, h, c, peak, peak_c, spent


def _overlap_sends(
    wiring: _Wiring, parts: tuple[Action, ...]
) -> list[tuple[Time, int, int, _Send]]:
    """The messages of an overlapped work's parts as (lead, key, receiving rank, send), in
    the order they take their links."""
    sends = []
    for action in parts:
        code = 4 * action.stage + OP_INDEX[action.op]
        if wiring.send_to[code] >= 0:
            key = wiring.send_base[code] + action.microbatch
            sends.append((key, wiring.send_to[code], wiring.send_link[code]))
    leads: list[Time] = []
    later: Time = 0
    for _, _, send in reversed(sends):
        leads.append(later)
        later += send[4]
    leads.reverse()
    by_reader = sorted(
        zip(
            leads,
            (k for k, _, _ in sends),
            (d for _, d, _ in sends),
            (s for _, _, s in sends),
            strict=True,
        ),
        key=lambda item: wiring.consumers.get(item[1], (-1, -1, -1)),
    )
    early = sorted((item for item in by_reader if item[0]), key=lambda item: -item[0])
    return early + [item for item in by_reader if not item[0]]


def _sends(
    costs: CostModel, placement: tuple[int, ...], dst_of: list[int], sizes: list[int]
) -> list[_Send]:
    """Per producing stage, its send; each stage sends over one rank pair's link
    (CostModel.link_between)."""
    sends: list[_Send] = []
    for stage, dst in enumerate(dst_of):
        link = costs.link_between(placement[stage], dst) if dst >= 0 else costs.link
        sends.append(
            (
                link.occupancy(sizes[stage]),
                link.latency,
                link.is_free,
                link.max_concurrent,
                link.send_overhead,
            )
        )
    return sends
