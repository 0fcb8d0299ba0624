"""Zero-bubble family (zb-h1, zb-h2, zbv, interleaved-zb) and looped BFS: rules,
closed forms from Qi et al. 2024, and makespan = longest path of the graph."""

from __future__ import annotations

import pytest

from pipesim.cli import main
from pipesim.costs import CostModel
from pipesim.engine import Simulation, simulate
from pipesim.errors import ScheduleError
from pipesim.graph import critical_path, validate
from pipesim.schedules import generate

ZB_NAMES = ("zb-h1", "zb-h2", "zbv", "interleaved-zb", "looped-bfs")


def split_costs(f: int, i: int, w: int) -> CostModel:
    """Uniform stages, free links; W frees 1 of each micro-batch's 4 activation bytes."""
    return CostModel.uniform(
        forward=f,
        input_grad=i,
        weight_grad=w,
        backward=i + w,
        activation_bytes=4,
        weight_grad_bytes=1,
    )


def gapless_ranks(sim: Simulation) -> list[int]:
    """Per rank: idle time between its first and last action (Qi et al.'s bubble)."""
    gaps = []
    for rank in range(sim.trace.n_ranks):
        records = sim.trace.rank_actions(rank)
        span = max(r.end for r in records) - min(r.start for r in records)
        gaps.append(span - sim.metrics.ranks[rank].busy)
    return gaps


# -- every generator emits valid schedules, I and W split where promised ---------------
@pytest.mark.parametrize("name", ZB_NAMES)
@pytest.mark.parametrize("p", [1, 2, 3, 5])
@pytest.mark.parametrize("m", [1, 2, 4, 7, 10])
def test_valid_and_makespan_is_longest_path(name: str, p: int, m: int) -> None:
    try:
        schedule = generate(name, n_ranks=p, n_microbatches=m)
    except ScheduleError:
        assert name == "interleaved-zb"  # only torch's rounds rule refuses sizes here
        rounds = max(1, m // p)
        assert m % rounds
        return
    validate(schedule)
    assert schedule.split_backward == (name != "looped-bfs")
    costs = split_costs(3, 2, 1)
    assert (
        simulate(schedule, costs=costs).metrics.makespan
        == critical_path(schedule, costs=costs).length
    )


@pytest.mark.parametrize(("name", "virtual"), [("zb-h1", 2), ("zb-h2", 3), ("zbv", 1), ("zbv", 3)])
def test_wrong_virtual_is_refused_with_the_fix(name: str, virtual: int) -> None:
    with pytest.raises(ScheduleError, match=f"virtual={virtual}"):
        generate(name, n_ranks=2, n_microbatches=4, virtual=virtual)


def test_interleaved_zb_rounds_rule_names_good_counts() -> None:
    # p = 4, m = 9: rounds = 2 does not divide 9; torch refuses too.
    with pytest.raises(ScheduleError, match=r"use 8 or 10 micro-batches"):
        generate("interleaved-zb", n_ranks=4, n_microbatches=9)


@pytest.mark.parametrize("name", ZB_NAMES)
def test_forward_only_refused(name: str) -> None:
    with pytest.raises(ScheduleError, match="forward-only"):
        generate(name, n_ranks=2, n_microbatches=4, forward_only=True)


# -- ZB-H1 ---------------------------------------------------------------------------
@pytest.mark.parametrize(("f", "i", "w"), [(1, 1, 1), (3, 2, 1), (2, 3, 2), (2, 2, 1), (5, 4, 4)])
@pytest.mark.parametrize("p", [2, 3, 4, 6])
def test_zb_h1_makespan_closed_form_when_w_at_most_f_and_i(f: int, i: int, w: int, p: int) -> None:
    # Qi et al. 2024, sec. 3.1: m(F+I+W) + (p-1)(F+I-W), holding when W <= min(F, I).
    assert w <= min(f, i)
    for m in (p, p + 1, 2 * p, 3 * p + 1):
        sim = simulate(generate("zb-h1", n_ranks=p, n_microbatches=m), costs=split_costs(f, i, w))
        assert sim.metrics.makespan == m * (f + i + w) + (p - 1) * (f + i - w)
        # 1F1B's memory: p micro-batches held (until their W) on every rank, rank r
        # holding p - r like 1F1B plus the r whose W it defers.
        assert [r.peak_inflight for r in sim.metrics.ranks] == [p] * p


@pytest.mark.parametrize(("f", "i", "w"), [(1, 2, 3), (3, 1, 2)])
def test_zb_h1_outside_the_condition_the_deferred_w_costs_more(f: int, i: int, w: int) -> None:
    # W > min(F, I): a deferred W no longer fits the slot it was meant to fill and the
    # formula undershoots; the longest path of the graph still gives the makespan.
    p, m = 4, 8
    schedule = generate("zb-h1", n_ranks=p, n_microbatches=m)
    sim = simulate(schedule, costs=split_costs(f, i, w))
    formula = m * (f + i + w) + (p - 1) * (f + i - w)
    assert sim.metrics.makespan > formula
    assert sim.metrics.makespan == critical_path(schedule, costs=split_costs(f, i, w)).length


@pytest.mark.parametrize(
    "costs",
    [
        CostModel.uniform(),  # no bytes at all
        CostModel.uniform(activation_bytes=8, weight_grad_bytes=0),  # W keeps nothing
        CostModel.uniform(activation_bytes=8),  # W keeps the default 16/17
    ],
)
def test_zb_h1_holds_p_microbatches_on_every_rank_whatever_the_bytes(costs: CostModel) -> None:
    # A micro-batch is in flight from its F until its W ends. ZB-H1 keeps 1F1B's
    # p - r - 1 warm-up forwards on rank r and defers r of its W's (Qi et al. 2024, sec.
    # 2.1), so rank r holds (p - r) + r = p: 4 on every rank at p = 4, m = 8.
    sim = simulate(generate("zb-h1", n_ranks=4, n_microbatches=8), costs=costs)
    assert [r.peak_inflight for r in sim.metrics.ranks] == [4, 4, 4, 4]


def test_zb_h1_memory_frees_part_at_i_and_the_rest_at_w() -> None:
    # One rank: F0 I0 W0 in order. 4 bytes held from F, 1 left after I, 0 after W.
    sim = simulate(generate("zb-h1", n_ranks=1, n_microbatches=1), costs=split_costs(1, 1, 1))
    assert [(s.time, s.activation_bytes) for s in sim.trace.memory] == [(0, 4), (2, 1), (3, 0)]


def test_zb_h1_beats_1f1b_by_the_w_it_moves() -> None:
    p, m, f, i, w = 4, 8, 2, 2, 1
    zb = simulate(generate("zb-h1", n_ranks=p, n_microbatches=m), costs=split_costs(f, i, w))
    one = simulate(generate("1f1b", n_ranks=p, n_microbatches=m), costs=split_costs(f, i, w))
    assert one.metrics.makespan == (m + p - 1) * (f + i + w)  # B = I + W
    assert one.metrics.makespan - zb.metrics.makespan == (p - 1) * 2 * w


# -- ZB-H2 ---------------------------------------------------------------------------
@pytest.mark.parametrize("p", [2, 3, 4, 6])
def test_zb_h2_no_gap_on_any_rank_when_f_i_w_equal_and_m_at_least_2p_minus_1(p: int) -> None:
    for m in (2 * p - 1, 2 * p, 3 * p + 2):
        sim = simulate(generate("zb-h2", n_ranks=p, n_microbatches=m), costs=split_costs(1, 1, 1))
        assert gapless_ranks(sim) == [0] * p  # the paper's bubble: 0
        # A parallelogram: rank r starts after r forwards and runs 3m slots; pipesim's
        # whole-step idle is the ramp p(p-1) that no schedule avoids.
        assert sim.metrics.makespan == 3 * m + p - 1
        assert sim.metrics.idle == p * (p - 1)
        # Up to 2p - 1 micro-batches held (the paper's (2p - 1) M_B, Table 2).
        assert max(r.peak_inflight for r in sim.metrics.ranks) == min(m, 2 * p - 1)


def test_zb_h2_matches_the_hand_drawn_parallelogram() -> None:
    # p = 3, m = 6, one slot per action, drawn by hand from the paper's rules (sec. 3.1):
    # a ready I first, else a forward while fewer than 2p - 1 = 5 micro-batches are held,
    # else the oldest W. Rank r starts at slot r and never waits.
    drawn = [
        "F0 F1 F2 F3 F4 I0 W0 I1 F5 I2 W1 I3 W2 I4 W3 W4 I5 W5",
        "F0 F1 F2 I0 F3 I1 F4 I2 W0 I3 F5 I4 W1 W2 I5 W3 W4 W5",
        "F0 I0 F1 I1 F2 I2 F3 I3 F4 I4 W0 F5 I5 W1 W2 W3 W4 W5",
    ]
    schedule = generate("zb-h2", n_ranks=3, n_microbatches=6)
    assert [" ".join(str(a)[1:] for a in order) for order in schedule.orders] == drawn
    sim = simulate(schedule, costs=split_costs(1, 1, 1))
    starts = [sorted(r.start for r in sim.trace.rank_actions(rank)) for rank in range(3)]
    assert starts == [list(range(rank, rank + 18)) for rank in range(3)]


@pytest.mark.parametrize(("f", "i", "w"), [(10, 10, 7), (10, 12, 7), (10, 8, 5), (4, 4, 4)])
def test_zb_h2_bubble_is_the_papers_formula_under_unequal_costs(f: int, i: int, w: int) -> None:
    # Qi et al. 2024, Table 2: ZB-H2's bubble is (p - 1)(T_F + T_B - 2 T_W) (T_B is I here)
    # for W <= min(F, I); rank r, p - 1 - r hops from the end of the chain, idles
    # (p - 1 - r) of that share between its first and last action.
    p, m = 4, 12
    sim = simulate(generate("zb-h2", n_ranks=p, n_microbatches=m), costs=split_costs(f, i, w))
    assert gapless_ranks(sim) == [(p - 1 - r) * (f + i - 2 * w) for r in range(p)]
    # Rank p - 1 starts after p - 1 forwards and never waits: the makespan is that
    # rank's start plus its work, the lower bound no schedule beats.
    assert sim.metrics.makespan == (p - 1) * f + m * (f + i + w)


def test_zb_h2_warmup_is_2_p_minus_r_minus_1_forwards() -> None:
    p = 4
    schedule = generate("zb-h2", n_ranks=p, n_microbatches=12)
    for rank, order in enumerate(schedule.orders):
        ops = "".join(a.op.value for a in order)
        assert ops.index("I") == 2 * (p - rank) - 1


@pytest.mark.parametrize("p", [2, 4])
def test_zb_h2_with_too_few_microbatches_leaves_gaps(p: int) -> None:
    # m < 2p - 1: rank 0 runs out of forwards before the first I arrives.
    m = 2 * p - 2
    sim = simulate(generate("zb-h2", n_ranks=p, n_microbatches=m), costs=split_costs(1, 1, 1))
    assert gapless_ranks(sim)[0] > 0


def test_zb_h2_with_unequal_times_keeps_its_order_and_gaps_appear() -> None:
    # F = I = W is the condition; with F=2, I=1, W=1 the order (made for unit times) is
    # kept, ranks wait between actions, and the makespan is the graph's longest path.
    schedule = generate("zb-h2", n_ranks=4, n_microbatches=12)
    costs = split_costs(2, 1, 1)
    sim = simulate(schedule, costs=costs)
    assert max(gapless_ranks(sim)) > 0
    assert sim.metrics.makespan == critical_path(schedule, costs=costs).length


# -- ZB-V ----------------------------------------------------------------------------
@pytest.mark.parametrize("p", [2, 3, 4, 5])
def test_zbv_no_gap_when_f_i_w_equal_and_memory_within_1f1b(p: int) -> None:
    for m in (2 * p - 1, 2 * p, 4 * p):
        schedule = generate("zbv", n_ranks=p, n_microbatches=m)
        assert schedule.placement == tuple(range(p)) + tuple(reversed(range(p)))
        # Each of the 2p chunks is half a 1F1B stage: 1 byte of activation vs 2.
        chunk = CostModel.uniform(
            forward=1, input_grad=1, weight_grad=1, activation_bytes=1, weight_grad_bytes=1
        )
        sim = simulate(schedule, costs=chunk)
        assert gapless_ranks(sim) == [0] * p
        one = simulate(
            generate("1f1b", n_ranks=p, n_microbatches=m),
            costs=CostModel.uniform(forward=2, backward=4, activation_bytes=2),
        )
        assert sim.metrics.peak_activation_bytes <= one.metrics.peak_activation_bytes
        assert [r.peak_inflight for r in sim.metrics.ranks] == [min(2 * p, 2 * m)] * p


@pytest.mark.parametrize("p", [2, 3, 4])
def test_zbv_with_fewer_than_2p_minus_1_microbatches_has_gaps(p: int) -> None:
    sim = simulate(generate("zbv", n_ranks=p, n_microbatches=2 * p - 2), costs=split_costs(1, 1, 1))
    assert max(gapless_ranks(sim)) > 0


# -- looped BFS ----------------------------------------------------------------------
@pytest.mark.parametrize("p", [2, 3, 4])
@pytest.mark.parametrize("v", [1, 2, 3])
def test_looped_bfs_makespan(p: int, v: int) -> None:
    f, b = 1, 2
    costs = CostModel.uniform(forward=f, backward=b)
    for m in range(1, 3 * p):
        sim = simulate(generate("looped-bfs", n_ranks=p, n_microbatches=m, virtual=v), costs=costs)
        if m >= p:  # fill and drain once: (vm + p - 1)(F + B)
            assert sim.metrics.makespan == (v * m + p - 1) * (f + b)
        else:  # each loop waits for micro-batch 0 to come round: (vp + m - 1)(F + B)
            assert sim.metrics.makespan == (v * p + m - 1) * (f + b)


# -- CLI -----------------------------------------------------------------------------
@pytest.mark.parametrize("name", ZB_NAMES)
def test_cli_simulate_accepts_every_new_schedule(
    name: str, capsys: pytest.CaptureFixture[str]
) -> None:
    status = main(["simulate", name, "--stages", "4", "--microbatches", "8", "--json"])
    assert status == 0
    assert f'"schedule": "{name}"' in capsys.readouterr().out
