"""Overlapped F&B pairs (DualPipe's) as a building block of synthesis on the V placement.

Oracles: a case worked by hand, the SimPy engine (memory peaks, makespan), the dependency
graph's longest path, and synthesis of the same problem without pairs.
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from test_synth import stage_costs

from pipesim import CostModel, critical_path, load_schedule, simulate, validate
from pipesim.actions import Overlap
from pipesim.cli import main
from pipesim.errors import ScheduleError
from pipesim.synth import lower_bound, make_problem, synthesize
from pipesim.synth.bound import split_is_cheapest


def _v(p: int, m: int, limit: object, costs: CostModel, *, pairs: bool):  # type: ignore[no-untyped-def]
    return synthesize(
        n_ranks=p,
        n_microbatches=m,
        memory_limit=limit,  # type: ignore[arg-type]
        costs=costs,
        virtual=2,
        placement="v",
        overlap_fb=pairs,
    )


def test_one_rank_two_microbatches_by_hand() -> None:
    # One rank holding both chunks of a V (stages 0 and 1), F = I = W = 1, B = 2, an F&B
    # pair 2 (cheaper than F + B = 3). Without pairs the rank does all its work: 2 x 2 x 3
    # = 12. With pairs: 0F0 [0,1], 1F0 [1,2]; then 1B0 is ready (1F0 ended) with 0F1:
    # pair [2,4]; then 0B0 (its gradient came with the pair) with 1F1: pair [4,6]; then
    # micro-batch 1's backwards, 2 each: 10. Optimal: 0F0 and 1F0 can pair with nothing
    # (no backward is ready before 1F0 ends), at most two pairs take the other two
    # forwards, and the two backwards left cost 2 each: 1 + 1 + 2 + 2 + 2 + 2.
    costs = CostModel.uniform(
        forward=1, input_grad=1, weight_grad=1, backward=2, overlap=2,
        activation_bytes=1, weight_grad_bytes=1,
    )  # fmt: skip
    plain = _v(1, 2, 4, costs, pairs=False)
    paired = _v(1, 2, 4, costs, pairs=True)
    assert plain.metrics.makespan == 12
    assert paired.metrics.makespan == 10
    order = [str(work) for work in paired.schedule.orders[0]]
    assert order[:4] == ["0F0", "1F0", "(0F1;1B0)OVERLAP_F_B", "(1F1;0B0)OVERLAP_F_B"]
    # The bound counts each forward-backward couple at the pair's 2: 2 x 2 x 2 = 8.
    assert paired.lower_bound == 8 <= paired.metrics.makespan
    assert plain.lower_bound == 12 == plain.metrics.makespan


@st.composite
def paired_costs(draw: st.DrawFn, n_stages: int, *, latency: bool) -> CostModel:
    """:func:`tests.test_synth.stage_costs` with an F&B pair duration per stage, from far
    below the sum of the parts to above it."""
    costs = draw(stage_costs(n_stages, latency=latency))
    return replace(
        costs,
        stages=tuple(
            replace(c, overlap=draw(st.integers(1, c.forward + c.backward + 2)))
            for c in costs.stages
        ),
    )


@settings(max_examples=60, deadline=None)
@given(
    data=st.data(),
    p=st.integers(1, 4),
    m=st.integers(1, 8),
    latency=st.booleans(),
    limit=st.sampled_from(["1", "p/2", "p", "2p"]),
)
@pytest.mark.slow
def test_pairs_validate_fit_follow_the_critical_path_and_never_lose(
    data: st.DataObject, p: int, m: int, latency: bool, limit: str
) -> None:
    costs = data.draw(paired_costs(2 * p, latency=latency))
    memory = {"1": 1, "p/2": max(1, p // 2), "p": p, "2p": 2 * p}[limit]
    result = _v(p, m, memory, costs, pairs=True)
    schedule, pb = result.schedule, result.problem
    validate(schedule)
    sim = simulate(schedule, costs=pb.memory_costs)
    for rank in sim.metrics.ranks:  # within the limit in the engine's own simulation
        assert rank.peak_activation_bytes <= pb.limit_bytes[rank.rank]
    assert sim.metrics.makespan == result.metrics.makespan
    assert result.metrics.makespan >= result.lower_bound
    if not latency:  # free links: every unit starts when what it waits for ends
        assert result.metrics.makespan == critical_path(schedule, costs=costs).length
    plain = _v(p, m, memory, costs, pairs=False)
    assert result.metrics.makespan <= plain.metrics.makespan
    # Without pairs allowed no candidate holds one (dualpipev included), so the bound,
    # which counts pairs only when they are allowed, holds for the result.
    assert not any(isinstance(w, Overlap) for order in plain.schedule.orders for w in order)
    assert plain.metrics.makespan >= plain.lower_bound


def test_pairs_pay_where_they_are_cheap() -> None:
    # An F&B pair of 8 against F + B = 4 + 7: with room for more than p micro-batches the
    # pairing greedy beats every candidate without pairs (zbv, v-half, v-min, greedy).
    costs = CostModel.uniform(
        forward=4, input_grad=4, weight_grad=3, backward=7, overlap=8,
        activation_bytes=10, weight_grad_bytes=4,
    )  # fmt: skip
    paired = _v(4, 8, 8, costs, pairs=True)
    plain = _v(4, 8, 8, costs, pairs=False)
    assert paired.metrics.makespan < plain.metrics.makespan
    assert any(isinstance(w, Overlap) for order in paired.schedule.orders for w in order)


def test_the_bound_without_the_solver_when_pairs_are_allowed() -> None:
    costs = CostModel.uniform(forward=2, input_grad=2, weight_grad=1, backward=3, overlap=3)
    pb = make_problem(
        n_ranks=2, n_microbatches=4, memory_limit=2, costs=costs, virtual=2, placement="v",
        overlap_fb=True,
    )  # fmt: skip
    # The solver schedules split backwards only: its bound cannot bound pair schedules.
    assert not split_is_cheapest(pb)
    # Rank 0 (stages 0 and 3): 4 micro-batches x (pair 3 + pair 3) = 24, after no head;
    # rank 1 starts after stage 0's forward (2): 26.
    assert lower_bound(pb) == 26


def test_pairs_need_the_v_placement() -> None:
    with pytest.raises(ScheduleError, match="--placement v"):
        make_problem(n_ranks=2, n_microbatches=2, memory_limit=2, overlap_fb=True)


_PAIR_COSTS = [
    "--forward-time", "2", "--input-grad-time", "2", "--weight-grad-time", "1",
    "--overlap-time", "3",
]  # fmt: skip


def test_cli_overlap_fb_writes_pairs_that_validate(tmp_path: Path, capsys) -> None:  # type: ignore[no-untyped-def]
    out = tmp_path / "pairs.json"
    argv = ["synthesize", "-p", "2", "-m", "4", "--placement", "v", "--memory-limit", "2"]
    assert main([*argv, *_PAIR_COSTS, "--overlap-fb", "--json", "-o", str(out)]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["overlap_fb"] is True and "pair" in data["winner"]
    schedule = load_schedule(out)
    validate(schedule)
    assert any(isinstance(w, Overlap) for order in schedule.orders for w in order)
    assert main([*argv, *_PAIR_COSTS, "--json"]) == 0
    plain = json.loads(capsys.readouterr().out)
    assert data["makespan"] < plain["makespan"]
    assert main(["synthesize", "-p", "2", "-m", "4", "--memory-limit", "2", "--overlap-fb"]) == 1
    assert "--placement v" in capsys.readouterr().err


@pytest.mark.torch
def test_verify_replays_pairs_bit_identical(tmp_path: Path, capsys) -> None:  # type: ignore[no-untyped-def]
    pytest.importorskip("torch")
    out = tmp_path / "pairs.json"
    argv = ["synthesize", "-p", "2", "-m", "4", "--placement", "v", "--memory-limit", "2"]
    assert main([*argv, *_PAIR_COSTS, "--overlap-fb", "-o", str(out)]) == 0
    assert any(isinstance(w, Overlap) for order in load_schedule(out).orders for w in order)
    capsys.readouterr()
    status = main(["verify", str(out), "--json", "--warmup", "0", "--devices", "cpu,cpu"])
    data = json.loads(capsys.readouterr().out)
    assert status == 0 and data["bit_identical"] is True and data["order_followed"] is True
