"""Per-message and per-action overheads that block a rank (pipesim.costs,
pipesim.step.cost_tables)."""

from __future__ import annotations

from fractions import Fraction

import pytest

from pipesim.actions import Action, Op
from pipesim.costs import CostModel, Link, StageCost, costs_from_dict, costs_to_dict
from pipesim.engine import simulate
from pipesim.schedules import generate, schedule_names
from pipesim.step import compile_step
from pipesim.step.cost_tables import cost_tables

_SEND, _TAKE, _DISPATCH = 3, 5, Fraction(1, 2)


def _costs(n_stages: int) -> CostModel:
    return CostModel(
        stages=tuple(
            StageCost(forward=2 + s, backward=4 + s, input_grad=3, weight_grad=1 + s)
            for s in range(n_stages)
        ),
        link=Link(latency=2, send_overhead=_SEND, receive_overhead=_TAKE),
        dispatch_overhead=_DISPATCH,
    )


def test_one_f_one_b_by_hand() -> None:
    """1F1B, 2 ranks, 1 micro-batch, F=1, B=2, latency 2, send 3, receive 5, dispatch 1:
    0F0 holds rank 0 for 1 + 1 + 3 = 5, arrives at 7; 1F0 runs 7..14 (1 + 5 + 1);
    1B0 14..20 (1 + 2 + 3), arrives at 22; 0B0 22..30 (1 + 5 + 2)."""
    costs = CostModel.uniform(
        forward=1,
        backward=2,
        link=Link(latency=2, send_overhead=3, receive_overhead=5),
        dispatch_overhead=1,
    )
    sim = simulate(generate("1f1b", n_ranks=2, n_microbatches=1), costs=costs)
    spans = [(str(r.work), r.start, r.end) for r in sim.trace.actions]
    assert spans == [("0F0", 0, 5), ("1F0", 7, 14), ("1B0", 14, 20), ("0B0", 22, 30)]
    assert sim.metrics.makespan == 30


@pytest.mark.parametrize("name", schedule_names())
@pytest.mark.parametrize("n_ranks", [2, 4])
def test_overheads_follow_the_messages_of_the_compiled_step(name: str, n_ranks: int) -> None:
    """Oracle: each node's duration is its compute plus one dispatch, a send overhead per
    cross-rank message the step's structure says it produces, and a receive overhead per
    one it waits for."""
    schedule = generate(name, n_ranks=n_ranks, n_microbatches=2 * n_ranks)
    costs = _costs(schedule.n_stages)
    plain = compile_step(schedule, CostModel(stages=costs.stages, link=Link(latency=2)))
    step = compile_step(schedule, costs)
    n_messages = len(step.structure.messages)
    for node in range(step.structure.n_nodes):
        sent = sum(1 for a in step.structure.outputs[node] if a < n_messages)
        taken = sum(1 for a in step.structure.inputs[node] if a < n_messages)
        expected = plain.durations[node] + _DISPATCH + _SEND * sent + _TAKE * taken
        assert step.durations[node] == expected, str(step.structure.works[node])
    assert n_messages > 0


def test_without_placement_every_stage_is_its_own_rank() -> None:
    tables = cost_tables(_costs(2), n_stages=2, forward_only=False)
    # stage 0: F sends (3), B / I take the gradient (5); stage 1: F takes, B / I send.
    half = _DISPATCH
    assert tables.durations == [
        2 + half + _SEND,
        4 + half + _TAKE,
        3 + half + _TAKE,
        1 + half,
        3 + half + _TAKE,
        5 + half + _SEND,
        3 + half + _SEND,
        2 + half,
    ]
    same_rank = cost_tables(_costs(2), n_stages=2, forward_only=False, placement=(0, 0))
    assert same_rank.durations == [d + half for d in (2, 4, 3, 1, 3, 5, 3, 2)]


def test_cost_files_keep_the_overheads() -> None:
    costs = _costs(2)
    data = costs_to_dict(costs)
    assert data["link"]["send_overhead"] == _SEND
    assert data["dispatch_overhead"] == "1/2"
    assert costs_from_dict(data) == costs
    plain = costs_to_dict(CostModel())
    assert "dispatch_overhead" not in plain and "send_overhead" not in plain["link"]


def test_negative_overheads_are_refused() -> None:
    with pytest.raises(ValueError, match="send_overhead must be non-negative"):
        Link(send_overhead=-1)
    with pytest.raises(ValueError, match="dispatch_overhead must be non-negative"):
        costs_from_dict({"stage": {}, "dispatch_overhead": -2})


def test_an_action_that_sends_nothing_pays_only_the_dispatch() -> None:
    costs = _costs(2)
    sim = simulate(generate("zb-h1", n_ranks=2, n_microbatches=2), costs=costs)
    w = next(r for r in sim.trace.actions if r.work == Action(stage=0, op=Op.W, microbatch=0))
    assert w.end - w.start == costs.stage(0).weight_grad + _DISPATCH
