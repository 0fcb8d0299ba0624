"""The SimPy engine against oracles: closed forms, hand-worked cases, the dependency graph.

Independent oracles used here:
- closed forms: GPipe / 1F1B makespan (m+p-1)(F+B), bubble (p-1)/(m+p-1), peak in-flight
  m and min(p-r, m) (Narayanan et al. 2021); interleaved m(F+B) + (p-1)(F+B)/v (Megatron-LM,
  Narayanan et al. SC 2021, with a whole rank's F and B split over its v chunks);
- hand-worked timelines for links (latency, bandwidth, one message per direction at once,
  blocking sends) and memory (full and split backward);
- for random schedules, an as-soon-as-possible timeline computed here from the dependency
  rules alone, and pipesim.graph.critical_path.
"""

from __future__ import annotations

import random
from collections.abc import Iterable
from dataclasses import dataclass
from fractions import Fraction
from itertools import pairwise

import pytest
from hypothesis import event, given, settings
from hypothesis import strategies as st

from pipesim.actions import Action, Op, parse_action
from pipesim.costs import CostModel, Link, StageCost
from pipesim.engine import run_trace, simulate
from pipesim.errors import DeadlockError, ScheduleError
from pipesim.graph import build_graph, critical_path, validate
from pipesim.schedule import Schedule
from pipesim.schedules import generate
from pipesim.trace import Trace

Time = int | Fraction


def act(text: str) -> Action:
    action = parse_action(text)
    assert isinstance(action, Action)
    return action


def timeline(trace: Trace) -> dict[str, tuple[Time, Time]]:
    return {str(r.work): (r.start, r.end) for r in trace.actions}


# == closed forms ============================================================================
DURATIONS = [
    (1, 2),
    (2, 1),
    (1, 1),
    (3, 7),
    (Fraction(1, 3), Fraction(2, 7)),
    (Fraction(5, 2), Fraction(9, 4)),
]


@pytest.mark.parametrize("name", ["gpipe", "1f1b"])
@pytest.mark.parametrize(("forward", "backward"), DURATIONS)
def test_gpipe_and_1f1b_closed_forms(name: str, forward: Time, backward: Time) -> None:
    for p in range(1, 6):
        for m in range(1, 9):
            costs = CostModel.uniform(forward=forward, backward=backward, activation_bytes=7)
            metrics = simulate(generate(name, n_ranks=p, n_microbatches=m), costs=costs).metrics
            assert metrics.makespan == (m + p - 1) * (forward + backward), (p, m)
            assert metrics.bubble_ratio == Fraction(p - 1, m + p - 1), (p, m)
            assert metrics.busy == p * m * (forward + backward)
            for rank in metrics.ranks:
                # GPipe holds every micro-batch at its peak; 1F1B at most p - r of them.
                expected = m if name == "gpipe" else min(p - rank.rank, m)
                assert rank.peak_inflight == expected, (p, m, rank.rank)
                assert rank.peak_activation_bytes == 7 * expected


@pytest.mark.parametrize(
    ("forward", "backward"), [(1, 2), (3, 3), (Fraction(3, 2), Fraction(5, 3))]
)
def test_interleaved_closed_form_when_megatron_rules_hold(forward: Time, backward: Time) -> None:
    checked = 0
    for p in range(1, 5):
        for v in range(1, 4):
            for m in range(p, 11):
                for n in range(p, m + 1):
                    if m % n and m % n < p:
                        continue  # Megatron refuses these (tested in test_schedules.py)
                    schedule = generate(
                        "interleaved-1f1b",
                        n_ranks=p,
                        n_microbatches=m,
                        virtual=v,
                        options={"group_size": n},
                    )
                    # F and B are a whole rank's times: each of its v chunks takes F/v, B/v.
                    chunk = CostModel.uniform(
                        forward=Fraction(forward) / v, backward=Fraction(backward) / v
                    )
                    makespan = simulate(schedule, costs=chunk).metrics.makespan
                    whole = forward + backward
                    assert makespan == m * whole + Fraction((p - 1) * whole, v), (p, v, m, n)
                    checked += 1
    assert checked > 100


@pytest.mark.parametrize(("forward", "backward"), [(1, 2), (Fraction(2, 3), Fraction(1, 5))])
def test_sequential_closed_form(forward: Time, backward: Time) -> None:
    costs = CostModel.uniform(forward=forward, backward=backward)
    for p in range(1, 5):
        for m in range(1, 5):
            train = simulate(generate("sequential", n_ranks=p, n_microbatches=m), costs=costs)
            assert train.metrics.makespan == m * p * (forward + backward)
            infer = generate("sequential", n_ranks=p, n_microbatches=m, forward_only=True)
            assert simulate(infer, costs=costs).metrics.makespan == m * p * forward


def test_forward_only_fill_drain() -> None:
    for p in range(1, 6):
        for m in range(1, 9):
            s = generate("gpipe", n_ranks=p, n_microbatches=m, forward_only=True)
            metrics = simulate(s, costs=CostModel.uniform(forward=Fraction(3, 2))).metrics
            assert metrics.makespan == (m + p - 1) * Fraction(3, 2)
            assert metrics.efficiency == Fraction(m, m + p - 1)


# == links ===============================================================================
def test_latency_and_bandwidth() -> None:
    s = generate("gpipe", n_ranks=2, n_microbatches=1, forward_only=True)
    costs = CostModel.uniform(output_bytes=10, link=Link(latency=3, bandwidth_bytes_per_s=5))
    trace = simulate(s, costs=costs).trace
    # 0F0 ends at 1; the message holds the link 10/5 = 2, arrives 3 later: at 6.
    assert timeline(trace) == {"0F0": (0, 1), "1F0": (6, 7)}
    (transfer,) = trace.transfers
    assert (transfer.src_rank, transfer.dst_rank, transfer.n_bytes) == (0, 1, 10)
    assert (str(transfer.producer), str(transfer.consumer)) == ("0F0", "1F0")
    assert (transfer.start, transfer.end) == (1, 6)
    assert trace.makespan == 7


def test_latency_applies_to_empty_messages() -> None:
    s = generate("gpipe", n_ranks=2, n_microbatches=1, forward_only=True)
    trace = simulate(s, costs=CostModel.uniform(link=Link(latency=Fraction(1, 2)))).trace
    assert timeline(trace) == {"0F0": (0, 1), "1F0": (Fraction(3, 2), Fraction(5, 2))}


def test_one_message_at_a_time_per_link_direction() -> None:
    s = generate("gpipe", n_ranks=2, n_microbatches=2, forward_only=True)
    costs = CostModel.uniform(output_bytes=10, link=Link(bandwidth_bytes_per_s=5))
    trace = simulate(s, costs=costs).trace
    # The second activation waits for the first to leave the link (at 3).
    assert [(t.start, t.end) for t in trace.transfers] == [(1, 3), (3, 5)]
    assert timeline(trace) == {"0F0": (0, 1), "0F1": (1, 2), "1F0": (3, 4), "1F1": (5, 6)}
    # The critical path ignores contention, so the engine is slower here.
    assert critical_path(s, costs=costs).length == 5 < trace.makespan == 6


def test_max_concurrent_lifts_contention() -> None:
    s = generate("gpipe", n_ranks=2, n_microbatches=2, forward_only=True)
    costs = CostModel.uniform(output_bytes=10, link=Link(bandwidth_bytes_per_s=5, max_concurrent=2))
    trace = simulate(s, costs=costs).trace
    assert [(t.start, t.end) for t in trace.transfers] == [(1, 3), (2, 4)]
    assert trace.makespan == critical_path(s, costs=costs).length == 5


def test_directions_do_not_contend() -> None:
    # 1F1B, p=2, m=2; every message holds its link 30/10 = 3.
    s = generate("1f1b", n_ranks=2, n_microbatches=2)
    costs = CostModel.uniform(
        forward=1, backward=1, output_bytes=30, link=Link(bandwidth_bytes_per_s=10)
    )
    trace = simulate(s, costs=costs).trace
    transfers = {(str(t.producer), str(t.consumer)): (t.start, t.end) for t in trace.transfers}
    assert transfers == {
        ("0F0", "1F0"): (1, 4),
        ("0F1", "1F1"): (4, 7),  # waits for the 0 -> 1 link
        ("1B0", "0B0"): (6, 9),  # 1 -> 0 is free although 0 -> 1 is busy until 7
        ("1B1", "0B1"): (9, 12),
    }
    assert timeline(trace) == {
        "0F0": (0, 1),
        "0F1": (1, 2),
        "0B0": (9, 10),
        "0B1": (12, 13),
        "1F0": (4, 5),
        "1B0": (5, 6),
        "1F1": (7, 8),
        "1B1": (8, 9),
    }
    assert all(t.n_bytes == 30 for t in trace.transfers)


@pytest.mark.parametrize(
    ("blocking_sends", "expected"),
    [
        (False, {"0F0": (0, 1), "0F1": (1, 2), "1F0": (4, 5), "1F1": (6, 7)}),
        # Blocking sends: rank 0 waits for its activation to arrive before the next forward.
        (True, {"0F0": (0, 1), "0F1": (4, 5), "1F0": (4, 5), "1F1": (8, 9)}),
    ],
)
def test_blocking_sends(blocking_sends: bool, expected: dict[str, tuple[int, int]]) -> None:
    s = generate("gpipe", n_ranks=2, n_microbatches=2, forward_only=True)
    costs = CostModel.uniform(
        output_bytes=10,
        link=Link(latency=1, bandwidth_bytes_per_s=5),
        blocking_sends=blocking_sends,
    )
    trace = simulate(s, costs=costs).trace
    assert timeline(trace) == expected
    assert trace.makespan == max(end for _, end in expected.values())


# == memory =================================================================================
def memory_of(trace: Trace, rank: int) -> list[tuple[Time, int, int]]:
    """(time, bytes, in flight) after each change; repeated values dropped."""
    rows: list[tuple[Time, int, int]] = []
    for record in trace.memory:
        if record.rank != rank:
            continue
        row = (record.time, record.activation_bytes, record.inflight)
        if not rows or rows[-1][1:] != row[1:]:
            rows.append(row)
    return rows


def test_memory_full_backward() -> None:
    s = generate("1f1b", n_ranks=2, n_microbatches=3)
    costs = CostModel(
        stages=(StageCost(activation_bytes=100), StageCost(activation_bytes=10)),
    )
    sim = simulate(s, costs=costs)
    # Rank 0: 0F0 [0,1] 0F1 [1,2] 0B0 [4,6] 0F2 [6,7] 0B1 [7,9] 0B2 [10,12]; F allocates
    # at its start, B frees at its end.
    assert memory_of(sim.trace, 0) == [
        (0, 100, 1),
        (1, 200, 2),
        (6, 100, 1),
        (6, 200, 2),
        (9, 100, 1),
        (12, 0, 0),
    ]
    assert [r.peak_activation_bytes for r in sim.metrics.ranks] == [200, 10]
    assert [r.peak_inflight for r in sim.metrics.ranks] == [2, 1]
    assert sim.metrics.peak_activation_bytes == 200


@pytest.mark.parametrize(
    ("order", "kept", "bytes_after_each_change", "peak"),
    [
        # I frees activation_bytes - weight_grad_bytes (70), W the remaining 30.
        (["0F0", "0F1", "0I0", "0I1", "0W0", "0W1"], 30, [100, 200, 130, 60, 30, 0], 200),
        (["0F0", "0I0", "0F1", "0W0", "0I1", "0W1"], 30, [100, 30, 130, 100, 30, 0], 130),
        # W holds 130 (its inputs and the output gradients I computes): I adds 30 at its
        # start and frees nothing at its end, W frees the 130.
        (["0F0", "0F1", "0I0", "0I1", "0W0", "0W1"], 130, [100, 200, 230, 260, 130, 0], 260),
        (["0F0", "0I0", "0F1", "0W0", "0I1", "0W1"], 130, [100, 130, 230, 100, 130, 0], 230),
    ],
)
def test_memory_split_backward(
    order: list[str], kept: int, bytes_after_each_change: list[int], peak: int
) -> None:
    s = Schedule.from_orders([order])
    costs = CostModel.uniform(activation_bytes=100, weight_grad_bytes=kept)
    sim = simulate(s, costs=costs)
    assert [b for _, b, _ in memory_of(sim.trace, 0)] == bytes_after_each_change
    assert sim.metrics.ranks[0].peak_activation_bytes == peak
    # A micro-batch stays in flight until its W ends.
    assert sim.metrics.ranks[0].peak_inflight == 2


def test_memory_split_backward_without_weight_grad_bytes() -> None:
    # Without weight_grad_bytes, W keeps 16/17 of the activations (Qi et al. 2024, Table 1:
    # 32sbh of 34sbh per layer): 100 * 16 // 17 = 94. I frees 6, W the 94; both micro-batches
    # stay in flight until their W ends.
    s = Schedule.from_orders([["0F0", "0F1", "0I0", "0I1", "0W0", "0W1"]])
    sim = simulate(s, costs=CostModel.uniform(activation_bytes=100))
    assert [(b, n) for _, b, n in memory_of(sim.trace, 0)] == [
        (100, 1),
        (200, 2),
        (194, 2),
        (188, 2),
        (94, 1),
        (0, 0),
    ]


def test_memory_forward_only_frees_after_each_forward() -> None:
    s = generate("gpipe", n_ranks=2, n_microbatches=4, forward_only=True)
    sim = simulate(s, costs=CostModel.uniform(activation_bytes=64))
    assert [(r.peak_activation_bytes, r.peak_inflight) for r in sim.metrics.ranks] == [
        (64, 1),
        (64, 1),
    ]
    assert memory_of(sim.trace, 0)[-1][1:] == (0, 0)


def test_overlapped_pair() -> None:
    # Rank 0 runs 0F1 and 0B0 as one unit of work (DualPipe-style F&B overlap).
    s = Schedule.from_orders(
        [
            ["0F0", "(0F1;0B0)OVERLAP_F_B", "0B1"],
            ["1F0", "1B0", "1F1", "1B1"],
        ]
    )
    explicit = CostModel(stages=(StageCost(overlap=2, activation_bytes=10), StageCost()))
    trace = simulate(s, costs=explicit).trace
    assert timeline(trace) == {
        "0F0": (0, 1),
        "1F0": (1, 2),
        "1B0": (2, 4),
        "(0F1;0B0)OVERLAP_F_B": (4, 6),
        "1F1": (6, 7),
        "1B1": (7, 9),
        "0B1": (9, 11),
    }
    # The pair allocates 0F1's activations at its start and frees 0B0's at its end.
    assert memory_of(trace, 0) == [(0, 10, 1), (4, 20, 2), (6, 10, 1), (11, 0, 0)]
    default = simulate(s).trace  # the pair lasts F + B = 3
    assert timeline(default)["(0F1;0B0)OVERLAP_F_B"] == (4, 7)
    assert default.makespan == 12


# == exactness ==============================================================================
def test_exact_identities_with_awkward_fractions() -> None:
    costs = CostModel(
        stages=(
            StageCost(forward=Fraction(1, 3), backward=Fraction(2, 7)),
            StageCost(forward=Fraction(1, 10), backward=Fraction(3, 11)),
            StageCost(forward="0.1", backward="0.2"),
        ),
        link=Link(latency=Fraction(1, 13)),
    )
    sim = simulate(generate("1f1b", n_ranks=3, n_microbatches=5), costs=costs)
    m = sim.metrics
    busy = sum(costs.duration(w) for order in sim.schedule.orders for w in order)
    assert m.busy == busy
    assert m.idle == m.n_ranks * m.makespan - busy
    assert sum(r.idle for r in m.ranks) == m.idle
    assert m.bubble_ratio == Fraction(m.idle) / (m.n_ranks * m.makespan)
    for value in (m.makespan, m.busy, m.idle, *(r.idle for r in m.ranks)):
        assert isinstance(value, int | Fraction)
    assert critical_path(sim.schedule, costs=costs).length == m.makespan


# == deadlocks and refusals in the engine ======================================================
def test_engine_reports_a_deadlock_without_validation() -> None:
    s = Schedule.from_orders([["0F0", "0B0", "0F1", "0B1"], ["1F1", "1F0", "1B0", "1B1"]])
    for run in (lambda: simulate(s, check=False), lambda: run_trace(s, CostModel())):
        with pytest.raises(DeadlockError) as info:
            run()
        message = str(info.value)
        assert "ranks [0, 1] blocked at ['0B0', '1F1']" in message
        assert_real_cycle(s, info.value.cycle)


def test_simulate_validates_first() -> None:
    with pytest.raises(ScheduleError, match="missing actions 0B1"):
        simulate(Schedule.from_orders([["0F0", "0F1", "0B0"]]))


def test_simulation_keeps_its_inputs() -> None:
    s = generate("gpipe", n_ranks=2, n_microbatches=2)
    sim = simulate(s, costs=CostModel.uniform(forward=2))
    assert sim.schedule is s
    assert sim.costs.stage(1).forward == 2
    assert len(sim.trace.actions) == 8
    assert {r.rank for r in sim.trace.actions} == {0, 1}


# == properties: random schedules ==========================================================
@dataclass(frozen=True)
class Case:
    schedule: Schedule
    costs: CostModel


def prerequisites(action: Action, present: set[Action], last_stage: int) -> list[Action]:
    """What ``action`` needs, from the rules in docs/architecture.md (not from pipesim)."""
    s, mb = action.stage, action.microbatch
    if action.op is Op.F:
        candidates = [Action(stage=s - 1, op=Op.F, microbatch=mb)] if s > 0 else []
    elif action.op is Op.W:
        candidates = [Action(stage=s, op=Op.I, microbatch=mb)]
    else:  # B or I: own forward, and the gradient from the next stage (its B or I)
        candidates = [Action(stage=s, op=Op.F, microbatch=mb)]
        if s < last_stage:
            candidates += [Action(stage=s + 1, op=op, microbatch=mb) for op in (Op.B, Op.I)]
    return [c for c in candidates if c in present]


def random_topological_order(
    nodes: Iterable[Action], edges: dict[Action, list[Action]], rng: random.Random
) -> list[Action] | None:
    """A random linear extension of ``edges`` (node -> prerequisites); None if cyclic."""
    nodes = sorted(nodes, key=str)
    waiting = {n: len(edges.get(n, [])) for n in nodes}
    users: dict[Action, list[Action]] = {n: [] for n in nodes}
    for n in nodes:
        for pre in edges.get(n, []):
            users[pre].append(n)
    ready = [n for n in nodes if waiting[n] == 0]
    order = []
    while ready:
        node = ready.pop(rng.randrange(len(ready)))
        order.append(node)
        for user in users[node]:
            waiting[user] -= 1
            if waiting[user] == 0:
                ready.append(user)
    return order if len(order) == len(nodes) else None


times = st.one_of(
    st.integers(min_value=0, max_value=5),
    st.fractions(min_value=0, max_value=5, max_denominator=7),
)


@st.composite
def random_cases(
    draw: st.DrawFn, *, link: Link | None = None, blocking_sends: bool = False
) -> Case:
    n_stages = draw(st.integers(1, 8))
    n_ranks = draw(st.integers(1, min(4, n_stages)))
    if draw(st.booleans()):  # round-robin: ranks hold stages r, r + p, ... (interleaved)
        placement = [stage % n_ranks for stage in range(n_stages)]
    else:
        placement = draw(
            st.lists(st.integers(0, n_ranks - 1), min_size=n_stages, max_size=n_stages)
        )
    m = draw(st.integers(1, 5))
    training = draw(st.booleans())
    actions: set[Action] = set()
    for stage in range(n_stages):
        for mb in range(m):
            actions.add(Action(stage=stage, op=Op.F, microbatch=mb))
            if training:
                split = draw(st.booleans())
                ops = (Op.I, Op.W) if split else (Op.B,)
                actions |= {Action(stage=stage, op=op, microbatch=mb) for op in ops}
    deps = {a: prerequisites(a, actions, n_stages - 1) for a in actions}
    rng = draw(st.randoms(use_true_random=False))
    order = random_topological_order(actions, deps, rng)
    assert order is not None
    orders: list[list[Action]] = [[] for _ in range(n_ranks)]
    for action in order:
        orders[placement[action.stage]].append(action)
    # A few extra cross-rank constraints consistent with the global order.
    happens_before = []
    for _ in range(draw(st.integers(0, 2))):
        i, j = sorted(draw(st.lists(st.integers(0, len(order) - 1), min_size=2, max_size=2)))
        if i != j:
            happens_before.append((order[i], order[j]))
    stages = tuple(
        StageCost(
            forward=draw(times),
            backward=draw(times),
            input_grad=draw(times),
            weight_grad=draw(times),
            output_bytes=draw(st.integers(0, 40)),
            activation_bytes=(a := draw(st.integers(0, 50))),
            # what W holds may exceed the activations (the output gradients I adds)
            weight_grad_bytes=draw(st.integers(0, 2 * a)),
        )
        for _ in range(n_stages)
    )
    schedule = Schedule.from_orders(
        orders, placement=placement, n_microbatches=m, happens_before=happens_before
    )
    costs = CostModel(stages=stages, link=link or Link(), blocking_sends=blocking_sends)
    return Case(schedule=schedule, costs=costs)


def message_bytes(producer: Action, costs: CostModel) -> int:
    # An activation has the producer stage's output size; the gradient w.r.t. stage s's
    # input has the shape of stage s-1's output.
    if producer.op is Op.F:
        return costs.stage(producer.stage).output_bytes
    return costs.stage(producer.stage - 1).output_bytes


def transfer_time(producer: Action, costs: CostModel) -> Time:
    """Uncontended send-to-arrival time: latency + bytes / bandwidth."""
    n_bytes = message_bytes(producer, costs)
    bandwidth = costs.link.bandwidth_bytes_per_s
    occupancy = Fraction(n_bytes) / bandwidth if bandwidth is not None else 0
    return costs.link.latency + occupancy


def asap_timeline(case: Case) -> tuple[dict[Action, tuple[Time, Time]], Time]:
    """Every action as early as its prerequisites allow, on uncontended links; and the
    makespan (the last end or arrival). Simple actions only."""
    schedule, costs = case.schedule, case.costs
    present = set(schedule.actions())
    last = schedule.n_stages - 1
    rank_of = {a: r for r, order in enumerate(schedule.orders) for a in order}
    needs = {a: prerequisites(a, present, last) for a in present}
    previous = {b: a for order in schedule.orders for a, b in pairwise(order)}
    extra: dict[Action, list[Action]] = {a: [] for a in present}
    for a, b in schedule.happens_before:
        extra[b].append(a)
    sends: dict[Action, list[Time]] = {a: [] for a in present}
    for consumer in present:
        for producer in needs[consumer]:
            if rank_of[producer] != rank_of[consumer]:
                sends[producer].append(transfer_time(producer, costs))
    waits_on = {a: needs[a] + extra[a] + ([previous[a]] if a in previous else []) for a in present}
    topo = random_topological_order(present, waits_on, random.Random(0))
    assert topo is not None
    times: dict[Action, tuple[Time, Time]] = {}
    arrivals: list[Time] = []
    for action in topo:
        start: Time = 0
        for producer in needs[action]:
            ready = times[producer][1]
            if rank_of[producer] != rank_of[action]:
                ready += transfer_time(producer, costs)
                arrivals.append(ready)
            start = max(start, ready)
        for before in extra[action]:
            start = max(start, times[before][1])
        if action in previous:
            before = previous[action]
            free_at = times[before][1]
            if costs.blocking_sends:  # the rank waits for its own sends to arrive
                free_at += max(sends[before], default=0)
            start = max(start, free_at)
        times[action] = (start, start + costs.duration(action))
    makespan = max([end for _, end in times.values()] + arrivals, default=0)
    return times, makespan


def memory_peaks(schedule: Schedule, costs: CostModel) -> list[tuple[int, int]]:
    """Per rank (peak bytes, peak in flight), walking its order: F allocates at its start
    and the micro-batch is in flight; B frees all at its end; I leaves weight_grad_bytes
    held (what W needs, output gradients included), adding at its start what that is
    more than the activations and freeing at its end what it is less; W frees them; the
    micro-batch leaves flight when B or W ends; forward-only F frees at its end.
    Independent of timing: a rank's changes happen in its program order."""
    peaks = []
    for order in schedule.orders:
        held = inflight = peak_bytes = peak_inflight = 0
        for work in order:
            for a in work.parts:
                cost = costs.stage(a.stage)
                if a.op is Op.F:
                    held += cost.activation_bytes
                    inflight += 1
                elif a.op is Op.I and cost.weight_grad_bytes > cost.activation_bytes:
                    held += cost.weight_grad_bytes - cost.activation_bytes
            peak_bytes, peak_inflight = max(peak_bytes, held), max(peak_inflight, inflight)
            for a in work.parts:
                cost = costs.stage(a.stage)
                if a.op is Op.B or (a.op is Op.F and schedule.forward_only):
                    held -= cost.activation_bytes
                    inflight -= 1
                elif a.op is Op.I and cost.weight_grad_bytes < cost.activation_bytes:
                    held -= cost.activation_bytes - cost.weight_grad_bytes
                elif a.op is Op.W:
                    held -= cost.weight_grad_bytes
                    inflight -= 1
        assert held == inflight == 0
        peaks.append((peak_bytes, peak_inflight))
    return peaks


def check_against_oracles(case: Case) -> None:
    schedule, costs = case.schedule, case.costs
    event(f"{sum(len(o) for o in schedule.orders) // 10 * 10}+ actions")
    validate(schedule)
    sim = simulate(schedule, costs=costs)
    expected, makespan = asap_timeline(case)
    assert sim.metrics.makespan == makespan
    assert critical_path(schedule, costs=costs).length == makespan
    assert {r.work: (r.start, r.end) for r in sim.trace.actions} == expected
    # Every rank runs its order one action at a time.
    for rank, order in enumerate(schedule.orders):
        records = sorted(sim.trace.rank_actions(rank), key=lambda r: (r.start, order.index(r.work)))
        assert [r.work for r in records] == list(order)
    # Exactness: idle = n_ranks * makespan - busy, with busy from the cost model.
    m = sim.metrics
    busy = [sum((costs.duration(w) for w in order), start=0) for order in schedule.orders]
    assert m.busy == sum(busy)
    assert m.idle == m.n_ranks * m.makespan - sum(busy)
    assert [r.idle for r in m.ranks] == [m.makespan - b for b in busy]
    if m.makespan:
        assert m.bubble_ratio == Fraction(m.idle) / (m.n_ranks * m.makespan)
    assert [(r.peak_activation_bytes, r.peak_inflight) for r in m.ranks] == memory_peaks(
        schedule, costs
    )
    # The engine's totals (what the metrics read) are those of its own records.
    t = sim.trace
    rebuilt = Trace(n_ranks=t.n_ranks, actions=t.actions, transfers=t.transfers, memory=t.memory)
    assert rebuilt.totals() == t.totals()
    assert rebuilt == t


@pytest.mark.slow
@settings(max_examples=80)
@given(random_cases())
def test_random_schedules_free_links(case: Case) -> None:
    check_against_oracles(case)


@settings(max_examples=60)
@given(
    st.builds(
        Link,
        latency=times,
        bandwidth_bytes_per_s=st.one_of(
            st.none(), st.integers(1, 20), st.fractions(1, 9, max_denominator=16)
        ),
        max_concurrent=st.just(10_000),  # never contended: the critical path is exact
    ).flatmap(lambda link: random_cases(link=link, blocking_sends=False)),
)
@pytest.mark.slow
def test_random_schedules_uncontended_links(case: Case) -> None:
    check_against_oracles(case)


@settings(max_examples=60)
@given(
    st.builds(
        Link,
        latency=times,
        bandwidth_bytes_per_s=st.one_of(st.none(), st.integers(1, 20)),
        max_concurrent=st.just(10_000),
    ).flatmap(lambda link: random_cases(link=link, blocking_sends=True)),
)
@pytest.mark.slow
def test_random_schedules_blocking_sends(case: Case) -> None:
    check_against_oracles(case)


def assert_real_cycle(schedule: Schedule, cycle: tuple[str, ...]) -> None:
    """Each action of ``cycle`` is a prerequisite of the next, and the last of the first."""
    graph = build_graph(schedule)
    assert len(cycle) >= 2
    for before, after in zip(cycle, cycle[1:] + cycle[:1], strict=True):
        assert graph.has_edge(parse_action(before), parse_action(after)), (before, after)


def is_cyclic(schedule: Schedule, *, same_rank_waits: bool = True) -> bool:
    """Whether the waits form a cycle; without ``same_rank_waits``, data dependencies and
    happens_before constraints within one rank are left to program order (as the engine
    does)."""
    present = set(schedule.actions())
    last = schedule.n_stages - 1
    rank_of = {a: r for r, order in enumerate(schedule.orders) for a in order}
    waits_on = {
        a: [
            p
            for p in prerequisites(a, present, last)
            if same_rank_waits or rank_of[p] != rank_of[a]
        ]
        for a in present
    }
    for order in schedule.orders:
        for a, b in pairwise(order):
            waits_on[b].append(a)
    for a, b in schedule.happens_before:
        if same_rank_waits or rank_of[a] != rank_of[b]:
            waits_on[b].append(a)
    return random_topological_order(present, waits_on, random.Random(0)) is None


@pytest.mark.slow
@settings(max_examples=100)
@given(random_cases(), st.randoms(use_true_random=False))
def test_random_reorderings_deadlock_with_a_real_cycle(case: Case, rng: random.Random) -> None:
    # Shuffle every rank's order, keeping only each micro-batch's own F -> B / I -> W order
    # on its stage (so that validate's structural checks pass): some orders now deadlock.
    orders = []
    for order in case.schedule.orders:
        own = {
            a: [p for p in prerequisites(a, set(order), 10**9) if p.stage == a.stage] for a in order
        }
        shuffled = random_topological_order(order, own, rng)
        assert shuffled is not None
        orders.append(shuffled)
    schedule = Schedule.from_orders(
        orders,
        placement=case.schedule.placement,
        n_microbatches=case.schedule.n_microbatches,
        happens_before=case.schedule.happens_before,
    )
    cyclic = is_cyclic(schedule)
    event("deadlock" if cyclic else "no deadlock")
    if not cyclic:
        check_against_oracles(Case(schedule=schedule, costs=case.costs))
        return
    with pytest.raises(DeadlockError) as info:
        validate(schedule)
    assert_real_cycle(schedule, info.value.cycle)
    with pytest.raises(DeadlockError) as info:
        simulate(schedule, costs=case.costs)
    assert_real_cycle(schedule, info.value.cycle)
    # The engine itself, unvalidated, stops and names the blocked actions and a cycle
    # whenever ranks wait on each other (it trusts program order within a rank).
    if not is_cyclic(schedule, same_rank_waits=False):
        event("deadlock within one rank only")
        return
    with pytest.raises(DeadlockError) as info:
        run_trace(schedule, case.costs)
    assert "blocked at" in str(info.value)
    assert_real_cycle(schedule, info.value.cycle)
