"""Metrics: the output contract, idle time, slots, efficiency and memory verdicts.

The pipeline chapter's efficiency table m / (m + s - 1) (seeds/001) is reproduced by
simulating forward-only fill-drain, exactly, and its printed percentages match.
"""

from __future__ import annotations

import json
from fractions import Fraction

import pytest
from helpers import JSON_CONTRACT, RANK_CONTRACT

from pipesim.costs import CostModel, StageCost
from pipesim.engine import simulate
from pipesim.metrics import compute_metrics, idle_intervals, span_metrics
from pipesim.schedules import generate

# The chapter's table, as printed (f"{m / (m + s - 1):>7.0%}").
CHAPTER_PERCENTAGES = {
    1: ("50%", "25%", "12%"),
    2: ("67%", "40%", "22%"),
    4: ("80%", "57%", "36%"),
    8: ("89%", "73%", "53%"),
    16: ("94%", "84%", "70%"),
}


@pytest.mark.parametrize("m", [1, 2, 4, 8, 16])
@pytest.mark.parametrize("s", [2, 4, 8])
def test_chapter_efficiency_table(m: int, s: int) -> None:
    sim = simulate(generate("gpipe", n_ranks=s, n_microbatches=m, forward_only=True))
    assert sim.metrics.efficiency == Fraction(m, m + s - 1)
    assert sim.metrics.makespan == m + s - 1
    assert sim.metrics.idle_slots == s * (s - 1)  # s*(m+s-1) slots, s*m of them busy
    printed = CHAPTER_PERCENTAGES[m][(2, 4, 8).index(s)]
    assert f"{float(sim.metrics.efficiency):.0%}" == printed


def test_json_contract() -> None:
    costs = CostModel.uniform(activation_bytes=1000, param_bytes=5)
    m = simulate(generate("1f1b", n_ranks=4, n_microbatches=8), costs=costs).metrics
    data = json.loads(json.dumps(m.to_dict()))
    assert set(data) >= JSON_CONTRACT
    assert (data["schedule"], data["n_ranks"], data["n_stages"], data["n_microbatches"]) == (
        "1f1b",
        4,
        4,
        8,
    )
    assert data["makespan"] == 33
    assert data["bubble_ratio"] == float(Fraction(3, 11))  # the exact ratio, as JSON float
    assert data["idle_slots"] == 4 * 33 - 4 * 8 * 3  # forward time 1: idle time in slots
    assert [r["rank"] for r in data["ranks"]] == [0, 1, 2, 3]
    for r in data["ranks"]:
        assert set(r) >= RANK_CONTRACT
        assert r["busy"] == 24 and r["idle"] == 9
        assert r["peak_inflight"] == 4 - r["rank"]
        assert r["peak_activation_bytes"] == 1000 * (4 - r["rank"])


def test_json_numbers_are_ints_or_floats() -> None:
    costs = CostModel.uniform(forward=Fraction(1, 3), backward=Fraction(2, 3))
    data = simulate(generate("gpipe", n_ranks=2, n_microbatches=3), costs=costs).metrics.to_dict()
    assert data["makespan"] == 4 and isinstance(data["makespan"], int)
    costs = CostModel.uniform(forward=Fraction(1, 3), backward=Fraction(1, 3))
    data = simulate(generate("gpipe", n_ranks=2, n_microbatches=3), costs=costs).metrics.to_dict()
    assert isinstance(data["makespan"], float) and data["makespan"] == float(Fraction(8, 3))
    json.dumps(data)


def test_idle_slots_use_the_forward_time() -> None:
    s = generate("gpipe", n_ranks=2, n_microbatches=4, forward_only=True)
    m = simulate(s, costs=CostModel.uniform(forward=3)).metrics
    assert (m.makespan, m.idle, m.slot, m.idle_slots) == (15, 6, 3, 2)
    uneven = CostModel(stages=(StageCost(forward=1), StageCost(forward=2)))
    m = simulate(s, costs=uneven).metrics
    # Rank 1 sets the pace: 1 + 4 * 2 = 9; idle 2*9 - (4 + 8) = 6; slot = mean forward 3/2.
    assert (m.makespan, m.idle, m.slot, m.idle_slots) == (9, 6, Fraction(3, 2), 4)


def test_idle_slots_are_undefined_when_forwards_take_no_time() -> None:
    """1F1B on 2 ranks, 2 micro-batches, F = 0 and B = 1: rank 0 runs B0 B1 back to back
    after rank 1's B0, so the makespan is 3 and each rank is busy 2: idle 2 in total.
    There is no slot to count that idle time in, so idle_slots is None, not 0."""
    s = generate("1f1b", n_ranks=2, n_microbatches=2)
    m = simulate(s, costs=CostModel.uniform(forward=0, backward=1)).metrics
    assert (m.makespan, m.idle, m.slot, m.idle_slots) == (3, 2, 0, None)
    assert m.to_dict()["idle_slots"] is None and m.to_dict()["idle"] == 2


def test_idle_intervals() -> None:
    sim = simulate(generate("gpipe", n_ranks=2, n_microbatches=4, forward_only=True))
    assert idle_intervals(sim.trace, 0) == ((4, 5),)
    assert idle_intervals(sim.trace, 1) == ((0, 1),)
    sim = simulate(generate("1f1b", n_ranks=2, n_microbatches=2))
    # Rank 0: F0 [0,1] F1 [1,2] B0 [4,6] B1 [7,9].
    assert idle_intervals(sim.trace, 0) == ((2, 4), (6, 7))
    total = sum(end - start for start, end in idle_intervals(sim.trace, 0))
    assert total == sim.metrics.ranks[0].idle


def test_memory_capacity_verdict() -> None:
    s = generate("gpipe", n_ranks=2, n_microbatches=4)
    costs = CostModel.uniform(activation_bytes=100, param_bytes=50, memory_capacity_bytes=450)
    m = simulate(s, costs=costs).metrics
    assert m.peak_activation_bytes == 400
    assert [r.param_bytes for r in m.ranks] == [50, 50]
    assert m.fits is True  # 400 + 50 <= 450
    tight = CostModel.uniform(activation_bytes=100, param_bytes=51, memory_capacity_bytes=450)
    assert simulate(s, costs=tight).metrics.fits is False
    assert simulate(s).metrics.fits is None
    assert simulate(s, costs=costs).metrics.to_dict()["memory_capacity_bytes"] == 450


def test_param_bytes_sum_over_a_ranks_stages() -> None:
    s = generate("interleaved-1f1b", n_ranks=2, n_microbatches=2, virtual=2)
    costs = CostModel(stages=tuple(StageCost(param_bytes=10**k) for k in range(4)))
    m = simulate(s, costs=costs).metrics
    assert [r.param_bytes for r in m.ranks] == [1 + 100, 10 + 1000]


def test_compute_metrics_recomputes_from_the_trace() -> None:
    sim = simulate(generate("1f1b", n_ranks=3, n_microbatches=5))
    assert compute_metrics(sim.trace, schedule=sim.schedule, costs=sim.costs) == sim.metrics


def test_rank_spans_and_the_zero_bubble_papers_bubble_by_hand() -> None:
    """1F1B, 2 ranks, 1 micro-batch, F = 1, B = 2: rank 0 runs F 0..1 and B 4..6 (span 6),
    rank 1 F 1..2 and B 2..4 (span 3). Busy 3 + 3 against 2 ranks x the longest span 6:
    a bubble of 1/2. The makespan bubble is the same (rank 0's span is the step)."""
    schedule = generate("1f1b", n_ranks=2, n_microbatches=1)
    sim = simulate(schedule, costs=CostModel.uniform(forward=1, backward=2))
    spans = span_metrics(sim.trace)
    assert spans.spans == (6, 3) and spans.longest == 6
    assert spans.bubble_ratio == Fraction(1, 2) == sim.metrics.bubble_ratio


@pytest.mark.parametrize("p", [2, 4, 8])
def test_zb_h2_has_no_bubble_by_the_papers_metric(p: int) -> None:
    # Qi et al. 2024, section 3: with T_F = T_B = T_W and enough micro-batches, ZB-H2's
    # every stage runs without a gap from its first action to its last
    schedule = generate("zb-h2", n_ranks=p, n_microbatches=3 * p)
    sim = simulate(schedule, costs=CostModel.uniform(forward=1, input_grad=1, weight_grad=1))
    spans = span_metrics(sim.trace)
    assert spans.bubble_ratio == 0
    assert set(spans.spans) == {3 * 3 * p}  # each rank: 3p micro-batches of F, I and W
    assert sim.metrics.bubble_ratio > 0  # the whole step still has its fill and drain
