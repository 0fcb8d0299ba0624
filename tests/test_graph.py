"""Dependency graph, validation refusals, deadlock cycles and the critical path."""

from __future__ import annotations

from fractions import Fraction
from itertools import pairwise

import networkx as nx
import pytest

from pipesim.actions import Action, Op, parse_action
from pipesim.costs import CostModel, Link, StageCost
from pipesim.errors import DeadlockError, ScheduleError
from pipesim.graph import build_graph, critical_path, data_dependencies, find_deadlock, validate
from pipesim.schedule import Schedule
from pipesim.schedules import generate


def act(text: str) -> Action:
    action = parse_action(text)
    assert isinstance(action, Action)
    return action


def edges_of_kind(graph: nx.DiGraph, kind: str) -> set[tuple[str, str]]:
    return {(str(u), str(v)) for u, v, k in graph.edges(data="kind") if k == kind}


# -- data dependencies and the graph ----------------------------------------------------------
def test_data_dependencies_full_backward() -> None:
    s = Schedule.from_orders([["0F0", "0B0"], ["1F0", "1B0"], ["2F0", "2B0"]])
    deps = {(str(d.producer), str(d.consumer)) for d in data_dependencies(s)}
    assert deps == {
        ("0F0", "1F0"),
        ("1F0", "2F0"),  # forwards flow down the stages
        ("2F0", "2B0"),  # the last stage's backward starts from its own forward (the loss)
        ("2B0", "1B0"),
        ("1B0", "0B0"),  # gradients flow back up
        ("1F0", "1B0"),
        ("0F0", "0B0"),  # a backward needs its own forward's activations
    }


def test_data_dependencies_split_backward() -> None:
    s = Schedule.from_orders([["0F0", "0I0", "0W0"], ["1F0", "1I0", "1W0"]])
    deps = {(str(d.producer), str(d.consumer)) for d in data_dependencies(s)}
    assert deps == {
        ("0F0", "1F0"),
        ("1F0", "1I0"),
        ("1I0", "0I0"),
        ("0F0", "0I0"),
        ("0I0", "0W0"),
        ("1I0", "1W0"),  # W needs its I
    }


def test_build_graph_edges_and_attributes() -> None:
    s = generate("gpipe", n_ranks=2, n_microbatches=2)
    costs = CostModel(
        stages=(
            StageCost(forward=1, backward=2, output_bytes=100),
            StageCost(forward=3, backward=4, output_bytes=7),
        ),
        link=Link(latency=Fraction(1, 2), bandwidth_bytes_per_s=50),
    )
    g = build_graph(s, costs=costs)
    assert g.number_of_nodes() == 8
    assert edges_of_kind(g, "order") == {
        ("0F0", "0F1"),
        ("0F1", "0B0"),
        ("0B0", "0B1"),
        ("1F0", "1F1"),
        ("1F1", "1B0"),
        ("1B0", "1B1"),
    }
    assert edges_of_kind(g, "data") == {
        ("0F0", "1F0"),
        ("0F1", "1F1"),
        ("1B0", "0B0"),
        ("1B1", "0B1"),
        ("1F0", "1B0"),
        ("1F1", "1B1"),
        ("0F0", "0B0"),
        ("0F1", "0B1"),
    }
    assert g.nodes[act("1B0")] == {"rank": 1, "duration": 4}
    # Activation 0 -> 1: stage 0's output, 100 bytes, 1/2 + 100/50.
    forward_edge = g.edges[act("0F0"), act("1F0")]
    assert forward_edge["n_bytes"] == 100
    assert forward_edge["transfer_time"] == Fraction(5, 2)
    # The gradient sent back has the shape of stage 0's output too.
    assert g.edges[act("1B1"), act("0B1")]["n_bytes"] == 100
    # Same-rank data edges carry nothing.
    assert g.edges[act("1F0"), act("1B0")]["n_bytes"] == 0
    assert g.edges[act("1F0"), act("1B0")]["transfer_time"] == 0


def test_build_graph_happens_before_edges() -> None:
    s = generate("sequential", n_ranks=2, n_microbatches=3, forward_only=True)
    g = build_graph(s)
    assert edges_of_kind(g, "extra") == {("1F0", "0F1"), ("1F1", "0F2")}


def test_build_graph_overlap_is_one_node() -> None:
    s = Schedule.from_orders(
        [
            ["0F0", "0F1", "(0F2;0B0)OVERLAP_F_B", "0B1", "0B2"],
            ["1F0", "1B0", "1F1", "1B1", "1F2", "1B2"],
        ]
    )
    g = build_graph(s, costs=CostModel())
    overlap = parse_action("(0F2;0B0)OVERLAP_F_B")
    assert g.nodes[overlap]["duration"] == 3  # F + B by default
    assert g.has_edge(overlap, act("1F2")) and g.has_edge(act("1B0"), overlap)
    validate(s)


# -- validation refusals --------------------------------------------------------------------
def refusal(schedule: Schedule) -> str:
    with pytest.raises(ScheduleError) as info:
        validate(schedule)
    assert not isinstance(info.value, DeadlockError)
    return str(info.value)


def test_missing_actions() -> None:
    message = refusal(Schedule.from_orders([["0F0", "0F1", "0B0"]]))
    assert "missing actions 0B1" in message
    assert "every stage must run F and B (or I and W) for each of the 2 micro-batches" in message


def test_missing_forward_only() -> None:
    message = refusal(Schedule.from_orders([["0F0"]], n_microbatches=2))
    assert "missing actions 0F1" in message
    assert "(or I and W)" not in message


def test_missing_half_of_a_split_backward() -> None:
    assert "missing actions 0W0" in refusal(Schedule.from_orders([["0F0", "0I0"]]))
    assert "missing actions 0I0" in refusal(Schedule.from_orders([["0F0", "0W0"]]))


def test_many_missing_are_summarised() -> None:
    message = refusal(Schedule.from_orders([["0F0"]], n_microbatches=12))
    assert "missing actions 0F1, 0F2, 0F3, 0F4, 0F5, 0F6, 0F7, 0F8 and 3 more" in message


def test_duplicate_action() -> None:
    message = refusal(Schedule.from_orders([["0F0", "0F0", "0B0"]]))
    assert "duplicate action 0F0 (rank 0 position 0 and rank 0 position 1); keep one" in message


def test_out_of_range_stage() -> None:
    s = Schedule.from_orders([["0F0", "0B0", "1F0"]], placement=[0], n_microbatches=1)
    message = refusal(s)
    assert "1F0 on rank 0: stage 1 is out of range (the schedule has 1 stages, 0..0)" in message


def test_out_of_range_microbatch() -> None:
    s = Schedule.from_orders([["0F0", "0B0", "0F1", "0B1"]], n_microbatches=1)
    message = refusal(s)
    assert "0F1 on rank 0: micro-batch 1 is out of range (n_microbatches=1, 0..0)" in message


def test_backward_before_forward() -> None:
    message = refusal(Schedule.from_orders([["0F0", "0B1", "0F1", "0B0"]]))
    assert (
        "backward before forward on rank 0: 0B1 at position 1 runs before 0F1 at position 2; "
        "move the backward after its forward"
    ) in message


def test_w_before_i() -> None:
    message = refusal(Schedule.from_orders([["0F0", "0W0", "0I0"]]))
    assert (
        "W before I on rank 0: 0W0 at position 1 runs before 0I0 at position 2; "
        "move the W after its I"
    ) in message


def test_stage_on_two_ranks() -> None:
    # Inferred placement refuses at construction; an explicit one is refused by validate.
    with pytest.raises(ScheduleError) as info:
        Schedule.from_orders([["0F0", "0B0", "1B0"], ["1F0"]])
    assert "stage 1 is placed on two ranks (0 and 1): action 1F0 appears on rank 1" in str(
        info.value
    )
    s = Schedule.from_orders([["0F0", "0B0", "1B0"], ["1F0"]], placement=[0, 1])
    message = refusal(s)
    assert "1B0 runs on rank 0 but stage 1 is placed on rank 1" in message
    assert "move the action or fix the placement" in message


def test_full_and_split_backward_together() -> None:
    message = refusal(Schedule.from_orders([["0F0", "0B0", "0I0", "0W0"]]))
    assert "both a full and a split backward: 0B0 with 0I0" in message


def test_happens_before_names_missing_action() -> None:
    s = Schedule.from_orders(
        [["0F0", "0B0"]], happens_before=[(act("0F0"), act("0F5"))], n_microbatches=1
    )
    assert "happens_before names 0F5, which no rank runs" in refusal(s)


def test_happens_before_self_loop_is_refused() -> None:
    """An action ordered before itself waits for itself: 0F0 -> 0F0 would never start."""
    s = Schedule.from_orders(
        [["0F0", "0B0"]], happens_before=[(act("0F0"), act("0F0"))], n_microbatches=1
    )
    assert "happens_before orders 0F0 before itself" in refusal(s)


def test_every_problem_is_named_up_to_a_limit() -> None:
    orders = [[f"0F{mb}" for mb in range(10)] * 2]
    message = refusal(Schedule.from_orders(orders, n_microbatches=10))
    assert message.startswith("invalid schedule: duplicate action 0F0")
    assert "; and 2 more problems" in message


# -- deadlocks --------------------------------------------------------------------------
def assert_real_cycle(schedule: Schedule, cycle: tuple[str, ...]) -> None:
    """Each action of ``cycle`` is a prerequisite of the next (the next waits on it)."""
    graph = build_graph(schedule)
    assert len(cycle) >= 2
    for before, after in zip(cycle, cycle[1:] + cycle[:1], strict=True):
        assert graph.has_edge(parse_action(before), parse_action(after)), (before, after)


def test_deadlock_is_reported_with_its_cycle() -> None:
    # Rank 1 wants micro-batch 1 first, but rank 0 sends it only after 0B0, which needs 1B0.
    s = Schedule.from_orders([["0F0", "0B0", "0F1", "0B1"], ["1F1", "1F0", "1B0", "1B1"]])
    with pytest.raises(DeadlockError) as info:
        validate(s)
    cycle = info.value.cycle
    assert set(cycle) == {"0B0", "0F1", "1F1", "1F0", "1B0"}
    assert_real_cycle(s, cycle)
    message = str(info.value)
    assert message.startswith("schedule deadlocks: these actions wait on each other in a cycle: ")
    assert " -> ".join((*cycle, cycle[0])) in message
    assert "reorder the ranks" in message


def test_same_rank_stage_order_deadlock() -> None:
    # Two stages on one rank, the later stage's forward listed first.
    s = Schedule.from_orders([["1F0", "0F0"]], placement=[0, 0])
    with pytest.raises(DeadlockError) as info:
        validate(s)
    assert sorted(info.value.cycle) == ["0F0", "1F0"]
    assert_real_cycle(s, info.value.cycle)


def test_happens_before_cycle_is_a_deadlock() -> None:
    s = Schedule.from_orders([["0F0"], ["1F0"]], happens_before=[(act("1F0"), act("0F0"))])
    with pytest.raises(DeadlockError) as info:
        validate(s)
    assert sorted(info.value.cycle) == ["0F0", "1F0"]
    assert_real_cycle(s, info.value.cycle)


def test_find_deadlock_on_acyclic_graph_is_empty() -> None:
    assert find_deadlock(build_graph(generate("1f1b", n_ranks=4, n_microbatches=6))) == ()


# -- critical path -----------------------------------------------------------------------
@pytest.mark.parametrize("name", ["gpipe", "1f1b"])
@pytest.mark.parametrize(("forward", "backward"), [(1, 2), (Fraction(1, 3), Fraction(7, 5))])
def test_critical_path_closed_form(name: str, forward: object, backward: object) -> None:
    p, m = 3, 5
    costs = CostModel.uniform(forward=forward, backward=backward)
    path = critical_path(generate(name, n_ranks=p, n_microbatches=m), costs=costs)
    assert path.length == (m + p - 1) * (Fraction(forward) + Fraction(backward))  # type: ignore[arg-type]


def test_critical_path_is_a_chain_of_edges_summing_to_its_length() -> None:
    s = generate("1f1b", n_ranks=3, n_microbatches=4)
    costs = CostModel(
        stages=(
            StageCost(forward=1, backward=2),
            StageCost(forward=2, backward=5),
            StageCost(forward=1, backward=1),
        )
    )
    path = critical_path(s, costs=costs)
    g = build_graph(s, costs=costs)
    for u, v in pairwise(path.works):
        assert g.has_edge(u, v)
    assert sum(costs.duration(w) for w in path.works) == path.length  # free links


def test_critical_path_with_latency_and_bandwidth() -> None:
    # Forward-only fill-drain, p=2, m=1: F(1) + latency 3 + 10 bytes / 5 per unit + F(1).
    s = generate("gpipe", n_ranks=2, n_microbatches=1, forward_only=True)
    costs = CostModel.uniform(output_bytes=10, link=Link(latency=3, bandwidth_bytes_per_s=5))
    assert critical_path(s, costs=costs).length == 1 + 3 + 2 + 1


def test_critical_path_without_overlapped_sends() -> None:
    # The sender waits for its message to arrive (1 + 2) before its next forward.
    s = generate("gpipe", n_ranks=2, n_microbatches=2, forward_only=True)
    link = Link(latency=1, bandwidth_bytes_per_s=5)
    overlapped = CostModel.uniform(output_bytes=10, link=link)
    blocking = CostModel.uniform(output_bytes=10, link=link, blocking_sends=True)
    assert critical_path(s, costs=overlapped).length == 2 + 3 + 1  # 0F1 ends at 2, arrives 5
    assert critical_path(s, costs=blocking).length == 1 + 3 + 1 + 3 + 1


def test_critical_path_validates_first() -> None:
    with pytest.raises(ScheduleError, match="missing actions"):
        critical_path(Schedule.from_orders([["0F0", "0F1"]], n_microbatches=3))


def test_zero_bubble_style_split_schedule_is_valid() -> None:
    s = Schedule.from_orders(
        [
            ["0F0", "0F1", "0I0", "0F2", "0I1", "0W0", "0I2", "0W1", "0W2"],
            ["1F0", "1I0", "1F1", "1I1", "1W0", "1F2", "1I2", "1W1", "1W2"],
        ]
    )
    validate(s)
    assert s.split_backward
    assert critical_path(s, costs=CostModel()).length > 0
    assert Op.W in {a.op for a in s.actions()}


def test_happens_before_on_a_data_edge_keeps_the_transfer_time() -> None:
    # 0F0 -> 1F0 is both a data edge (latency 1) and a happens_before constraint; the
    # constraint must not erase the message's transfer time: 1 + 1 + 1.
    s = Schedule.from_orders([["0F0"], ["1F0"]], happens_before=[(act("0F0"), act("1F0"))])
    costs = CostModel.uniform(link=Link(latency=1))
    assert critical_path(s, costs=costs).length == 3


def test_happens_before_on_an_order_edge_keeps_the_senders_wait() -> None:
    # Blocking sends: rank 0 waits for 0F0's activation (arrives at 2) before 0F1, also
    # when a happens_before repeats the program order 0F0 -> 0F1. 0F1 [2,3] arrives at 4,
    # 1F1 [4,5].
    s = Schedule.from_orders(
        [["0F0", "0F1"], ["1F0", "1F1"]], happens_before=[(act("0F0"), act("0F1"))]
    )
    costs = CostModel.uniform(link=Link(latency=1), blocking_sends=True)
    assert critical_path(s, costs=costs).length == 5


def test_w_right_after_its_i_keeps_the_senders_wait() -> None:
    # Blocking sends, latency 1. Rank 1 runs 1I0 [3,4], whose gradient arrives at 5, so
    # 1W0 waits until 5: [5,10]. The I -> W data edge doubles as rank 1's order edge.
    s = Schedule.from_orders([["0F0", "0I0", "0W0"], ["1F0", "1I0", "1W0"]])
    costs = CostModel(
        stages=(StageCost(weight_grad=1), StageCost(weight_grad=5)),
        link=Link(latency=1),
        blocking_sends=True,
    )
    assert critical_path(s, costs=costs).length == 10
