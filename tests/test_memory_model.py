"""The memory model (pipesim/step/memory.py) worked by hand on ZB-H1 p=2 m=2, checked against
Qi et al. 2024's closed form and read back from every evaluator.

Timeline (F = I = W = 1, free links), worked from the two orders below: rank 0 runs
0F0 [0,1] 0F1 [1,2] 0I0 [3,4] 0W0 [4,5] 0I1 [5,6] 0W1 [6,7]; rank 1 runs 1F0 [1,2]
1I0 [2,3] 1F1 [3,4] 1I1 [4,5] 1W0 [5,6] 1W1 [6,7]. The makespan is 7.
"""

from __future__ import annotations

import random

import pytest

from pipesim import CostModel, StageCost, generate, simulate
from pipesim.plan.fastsim import compile_schedule, evaluate
from pipesim.plan.fasttrace import fast_trace
from pipesim.plan.onepass import quick_step
from pipesim.step.memory import Effect, byte_peaks, rank_peaks
from pipesim.synth import synthesize
from pipesim.trace import Trace

ORDERS = [
    ["0F0", "0F1", "0I0", "0W0", "0I1", "0W1"],
    ["1F0", "1I0", "1F1", "1I1", "1W0", "1W1"],
]


def costs(act: int, kept: int) -> CostModel:
    return CostModel.uniform(
        forward=1, input_grad=1, weight_grad=1, activation_bytes=act, weight_grad_bytes=kept
    )


def curve(trace: Trace, rank: int) -> list[tuple[int, int, int]]:
    """(time, bytes, in flight) after each change of ``rank``, repeats dropped."""
    rows: list[tuple[int, int, int]] = []
    for r in trace.memory:
        if r.rank == rank:
            row = (int(r.time), r.activation_bytes, r.inflight)
            if not rows or rows[-1][1:] != row[1:]:
                rows.append(row)
    return rows


def every_evaluator(model: CostModel) -> list[tuple[tuple[int, ...], tuple[int, ...]]]:
    """(peak bytes, peak in flight) per rank from the engine, fastsim, onepass, fasttrace."""
    schedule = generate("zb-h1", n_ranks=2, n_microbatches=2)
    engine = simulate(schedule, costs=model).metrics
    fast = evaluate(compile_schedule(schedule), model)
    one = quick_step(schedule, model)
    assert one is not None
    traced = fast_trace(schedule, model).totals()
    return [
        (
            tuple(r.peak_activation_bytes for r in engine.ranks),
            tuple(r.peak_inflight for r in engine.ranks),
        ),
        (fast.peak_activation_bytes, fast.peak_inflight),
        (one.peak_activation_bytes, one.peak_inflight),
        (tuple(traced.peak_activation_bytes), tuple(traced.peak_inflight)),
    ]


def test_the_orders_are_zb_h1() -> None:
    schedule = generate("zb-h1", n_ranks=2, n_microbatches=2)
    assert [[str(w) for w in order] for order in schedule.orders] == ORDERS
    assert simulate(schedule, costs=costs(34, 32)).metrics.makespan == 7


def test_zb_h1_transformer_bytes_by_hand() -> None:
    # One transformer layer per stage, in units of sbh with flash attention (Qi et al. 2024,
    # Table 1): F stores M_B = 34; W needs M_W = 32, the 14 of matmul inputs F stored plus
    # the 18 of output gradients I computes. I frees 34 - 32 = 2 at its end, W the 32.
    model = costs(34, 32)
    sim = simulate(generate("zb-h1", n_ranks=2, n_microbatches=2), costs=model)
    # rank 0: 0F0 +34, 0F1 +34, 0I0 ends -2, 0W0 ends -32 (mb 0 leaves), 0I1 -2, 0W1 -32
    assert curve(sim.trace, 0) == [
        (0, 34, 1),
        (1, 68, 2),
        (4, 66, 2),
        (5, 34, 1),
        (6, 32, 1),
        (7, 0, 0),
    ]
    # rank 1: 1F0 +34, 1I0 ends -2, 1F1 +34, 1I1 ends -2, 1W0 ends -32, 1W1 ends -32
    assert curve(sim.trace, 1) == [
        (1, 34, 1),
        (3, 32, 1),
        (3, 66, 2),
        (5, 64, 2),
        (6, 32, 1),
        (7, 0, 0),
    ]
    # Qi et al. 2024, section 2: worker i (from 1) of ZB-H1 holds (p-i+1) M_B + (i-1) M_W:
    # 2*34 = 68 on the first, 34 + 32 = 66 on the second; the peak p M_B is the first's.
    p, m_b, m_w = 2, 34, 32
    closed = tuple((p - i + 1) * m_b + (i - 1) * m_w for i in (1, 2))
    assert closed == (68, 66)
    for peaks in every_evaluator(model):
        assert peaks == (closed, (2, 2))


def test_zb_h1_output_gradients_above_the_activations_by_hand() -> None:
    # W needs 4 bytes of inputs and 8 of output gradients: 12 > the 10 F stored (a layer
    # with wide outputs, or full recomputation). I adds the 2 extra at its start and frees
    # nothing at its end; W frees the 12.
    model = costs(10, 12)
    sim = simulate(generate("zb-h1", n_ranks=2, n_microbatches=2), costs=model)
    # rank 0: 0F0 +10, 0F1 +10, 0I0 starts +2 at 3, 0W0 ends -12 and 0I1 starts +2 at 5
    # (10 then 12), 0W1 ends -12 at 7
    assert curve(sim.trace, 0) == [
        (0, 10, 1),
        (1, 20, 2),
        (3, 22, 2),
        (5, 10, 1),
        (5, 12, 1),
        (7, 0, 0),
    ]
    # rank 1: 1F0 +10 at 1, 1I0 starts +2 at 2, 1F1 +10 at 3, 1I1 starts +2 at 4 (both
    # micro-batches hold 12), 1W0 ends -12 at 6, 1W1 at 7
    assert curve(sim.trace, 1) == [
        (1, 10, 1),
        (2, 12, 1),
        (3, 22, 2),
        (4, 24, 2),
        (6, 12, 1),
        (7, 0, 0),
    ]
    for peaks in every_evaluator(model):
        assert peaks == ((22, 24), (2, 2))
    # Qi et al.'s p M_B (= 20) assumes M_W <= M_B; here rank 1 peaks at 24 = p * max(M_B,
    # M_W), the unit a limit in micro-batches counts (pipesim.step.memory.microbatch_peak): at
    # limit p ZB-H1 fits, so the synthesizer never does worse than it.
    result = synthesize(n_ranks=2, n_microbatches=2, memory_limit=2, costs=model)
    assert result.problem.limit_bytes == (24, 24)
    zb_h1 = next(c for c in result.candidates if c.name == "zb-h1")
    assert zb_h1.fits and zb_h1.peak_activation_bytes == (22, 24)
    assert result.metrics.makespan <= 7


@pytest.mark.parametrize(("act", "kept"), [(34, 32), (10, 12)])
def test_fused_backward_frees_everything_at_its_end(act: int, kept: int) -> None:
    # 1F1B p=2 m=2 (F = 1, B = 2): rank 0 0F0 [0,1] 0F1 [1,2] 0B0 [4,6] 0B1 [7,9] (after 1B1);
    # rank 1 1F0 [1,2] 1B0 [2,4] 1F1 [4,5] 1B1 [5,7]. B frees all F stored and nothing of
    # weight_grad_bytes ever exists: the curve depends on act only.
    model = CostModel.uniform(forward=1, backward=2, activation_bytes=act, weight_grad_bytes=kept)
    sim = simulate(generate("1f1b", n_ranks=2, n_microbatches=2), costs=model)
    assert curve(sim.trace, 0) == [(0, act, 1), (1, 2 * act, 2), (6, act, 1), (9, 0, 0)]
    assert curve(sim.trace, 1) == [(1, act, 1), (4, 0, 0), (4, act, 1), (7, 0, 0)]


def test_1f1b_peaks_by_hand_from_the_engine_and_from_its_records() -> None:
    # 1F1B p=3 m=5, 7 bytes per forward: rank r runs p - r forwards before its first
    # backward (Narayanan et al. 2021), so it holds 3, 2 and 1 micro-batches at its peak.
    model = CostModel(stages=(StageCost(activation_bytes=7),))
    trace = simulate(generate("1f1b", n_ranks=3, n_microbatches=5), costs=model).trace
    expected = ((21, 14, 7), (3, 2, 1))
    totals = trace.totals()
    assert (totals.peak_activation_bytes, totals.peak_inflight) == expected
    # The same peaks from the records alone, as for a trace read from a file.
    rebuilt = Trace(n_ranks=3, actions=trace.actions, memory=trace.memory).totals()
    assert (rebuilt.peak_activation_bytes, rebuilt.peak_inflight) == expected


def test_forward_only_peaks_at_one_microbatch() -> None:
    # Inference: each F frees its own activations when it ends, so a rank never holds
    # more than one micro-batch, however many pass through it.
    model = CostModel(stages=(StageCost(activation_bytes=7),))
    schedule = generate("gpipe", n_ranks=2, n_microbatches=4, forward_only=True)
    totals = simulate(schedule, costs=model).trace.totals()
    assert (totals.peak_activation_bytes, totals.peak_inflight) == ((7, 7), (1, 1))


def test_byte_peaks_are_the_bytes_of_rank_peaks() -> None:
    """byte_peaks, which the synthesizer, the V-Half/V-Min generators and the planner's
    bounds read, is the first half of rank_peaks on random effects and orders (repeated
    nodes, levels below zero and empty orders included)."""
    rng = random.Random(29)
    for _ in range(400):
        effects = [
            Effect(rng.randint(-5, 9), rng.randint(-1, 1), rng.randint(-9, 5), rng.randint(-1, 1))
            for _ in range(rng.randint(1, 8))
        ]
        orders = [
            [rng.randrange(len(effects)) for _ in range(rng.randint(0, 30))]
            for _ in range(rng.randint(1, 5))
        ]
        assert byte_peaks(effects, orders) == rank_peaks(effects, orders)[0]
