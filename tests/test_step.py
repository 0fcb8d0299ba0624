"""The compiled step (pipesim.step and the modules it is built from: structure, wiring,
dependencies, cost_tables, deadlock) and the memory model (pipesim.step.memory), by hand."""

from __future__ import annotations

from fractions import Fraction

from pipesim.actions import Action, Op, parse_action
from pipesim.costs import CostModel, Link, StageCost
from pipesim.errors import DeadlockError
from pipesim.schedule import Schedule
from pipesim.schedules import generate
from pipesim.step import compile_step
from pipesim.step.cost_tables import cost_tables, message_bytes
from pipesim.step.deadlock import deadlock_error
from pipesim.step.dependencies import prerequisites
from pipesim.step.memory import Effect, op_effects, work_effect
from pipesim.step.structure import step_structure


def act(text: str) -> Action:
    action = parse_action(text)
    assert isinstance(action, Action)
    return action


def test_message_bytes() -> None:
    costs = CostModel(
        stages=(StageCost(output_bytes=100), StageCost(output_bytes=30), StageCost(output_bytes=7))
    )
    # An activation has the producer's output size.
    assert message_bytes(costs, act("1F0")) == 30
    # The gradient w.r.t. stage s's input has the shape of stage s-1's output.
    assert message_bytes(costs, act("2B0")) == 30
    assert message_bytes(costs, act("1I0")) == 100
    assert message_bytes(costs, act("0B0")) == 0


def test_prerequisites_stay_inside_a_model_copy() -> None:
    # Two copies of 2 stages: stage 2 is copy 1's first (reads input), stage 1 copy 0's last.
    assert prerequisites(2, Op.F, 0, per_copy=2) == ()
    assert prerequisites(3, Op.F, 5, per_copy=2) == ((2, Op.F, 5),)
    assert prerequisites(1, Op.B, 0, per_copy=2) == ((1, Op.F, 0),)
    assert prerequisites(3, Op.W, 1, per_copy=2) == ((3, Op.I, 1),)


def test_one_f_one_b_messages_by_count_and_rank() -> None:
    p, m = 4, 6
    s = step_structure(generate("1f1b", n_ranks=p, n_microbatches=m))
    # Each of the p-1 boundaries carries m activations forward and m gradients back.
    assert len(s.messages) == 2 * (p - 1) * m
    assert not s.signals
    for message in s.messages:
        assert abs(message.src_rank - message.dst_rank) == 1
        assert s.works[message.producer_node] == message.producer
        assert s.works[message.consumer_node] == message.consumer
        assert s.pairs[s.pair_of[s.messages.index(message)]] == (
            message.src_rank,
            message.dst_rank,
        )
    assert len(s.pairs) == 2 * (p - 1)
    assert s.reads_input(0) and not s.reads_input(1) and s.computes_loss(p - 1)


def test_topological_order_puts_every_prerequisite_first() -> None:
    s = step_structure(generate("interleaved-1f1b", n_ranks=4, n_microbatches=8, virtual=2))
    assert s.topological is not None
    where = {node: i for i, node in enumerate(s.topological)}
    assert sorted(where) == list(range(s.n_nodes))
    for producer, consumer, _, _ in s.data_edges():
        assert where[producer] < where[consumer]
    for order in s.orders:
        assert [where[n] for n in order] == sorted(where[n] for n in order)


def test_deadlock_has_no_order_and_one_error() -> None:
    s = step_structure(Schedule.from_orders([["0B0", "0F0"], ["1F0", "1B0"]]))
    assert s.topological is None
    error = deadlock_error(s, blocked=[s.orders[0][0], s.orders[1][1]])
    assert isinstance(error, DeadlockError)
    assert "ranks [0, 1] blocked at ['0B0', '1B0']" in str(error)
    assert len(error.cycle) >= 2


def test_compile_step_columns_by_hand() -> None:
    schedule = generate("gpipe", n_ranks=2, n_microbatches=1)  # 0F0 1F0 | 1B0 0B0
    costs = CostModel.uniform(
        forward=2,
        backward=3,
        activation_bytes=10,
        output_bytes=6,
        link=Link(latency=1, bandwidth_bytes_per_s=4),
    )
    step = compile_step(schedule, costs)
    s = step.structure
    node = s.node_of(act("0F0"))
    assert step.durations[node] == 2
    assert step.effects[node] == Effect(10, 1, 0, 0)
    assert step.effects[s.node_of(act("0B0"))] == Effect(0, 0, -10, -1)
    # 6 bytes over 4 bytes per unit hold the link 3/2 and arrive 1 later.
    assert step.message_bytes == (6, 6)
    assert step.occupancy == (Fraction(3, 2), Fraction(3, 2))
    assert step.latency == (1, 1)
    row = step.row(node)
    assert (row.rank, row.position, row.waits_for) == (0, 0, ())
    assert [s.messages[i].consumer for i in row.sends] == [act("1F0")]


def test_memory_effects_of_a_split_backward_and_an_overlap() -> None:
    cost = StageCost(activation_bytes=10, weight_grad_bytes=4)
    f, b, i, w = op_effects(cost, forward_only=False)
    assert (f, b) == (Effect(10, 1, 0, 0), Effect(0, 0, -10, -1))
    # I frees 10 - 4, W the 4 it kept; the count drops with the last byte, at W.
    assert (i, w) == (Effect(0, 0, -6, 0), Effect(0, 0, -4, -1))
    table = [op_effects(cost, forward_only=False)] * 2
    pair = parse_action("(0F1;1B0)OVERLAP_F_B")
    assert work_effect(table, pair) == Effect(10, 1, -10, -1)
    # Inference: F frees its own activations when it ends.
    assert op_effects(cost, forward_only=True)[0] == Effect(10, 1, -10, -1)


def test_cost_tables_sizes_follow_the_message_rule() -> None:
    costs = CostModel(stages=(StageCost(output_bytes=5), StageCost(output_bytes=9)))
    tables = cost_tables(costs, n_stages=2, forward_only=False)
    assert tables.forward_bytes == [5, 9]
    assert tables.gradient_bytes == [0, 5]


def test_refuses_nothing_itself() -> None:
    # The structure is built before validation, so out-of-range input must not crash it.
    s = step_structure(Schedule.from_orders([["0F0", "5F0"]], placement=[0]))
    assert s.n_nodes == 2
