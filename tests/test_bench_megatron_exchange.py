"""benchmarks/bench_megatron_exchange.py: Megatron's steady-state pairs, worked by hand."""

from __future__ import annotations

from helpers import load_benchmark

from pipesim.actions import Overlap
from pipesim.costs import CostModel, Link
from pipesim.engine import simulate
from pipesim.schedules import generate


def test_each_forward_followed_by_a_backward_becomes_one_unit() -> None:
    bench = load_benchmark("bench_megatron_exchange")
    schedule = generate("interleaved-1f1b", n_ranks=2, n_microbatches=4, virtual=2)
    paired = bench.megatron_pairs(schedule)
    # rank 1: (p - r - 1) 2 + (v - 1) p = 2 warm-up forwards, then forward-backward pairs
    # (1F0 1F1 | 3F0 3B0 | 3F1 3B1 | 1F2 1B0 | ...), then the cool-down
    for before, after in zip(schedule.orders, paired.orders, strict=True):
        flat = [a for w in after for a in (w.parts if isinstance(w, Overlap) else (w,))]
        assert [str(a) for a in flat] == [str(a) for a in before]  # every action, in order
        for work in after:
            if isinstance(work, Overlap):
                assert [p.op.name for p in work.parts] == ["F", "B"]
    rank1 = [str(w) for w in paired.orders[1]]
    # 3F0 3B0 and 3F1 3B1 (the last stage's own micro-batches) stay two units each
    assert rank1[:7] == ["1F0", "1F1", "3F0", "3B0", "3F1", "3B1", "(1F2;1B0)OVERLAP_F_B"]


def test_a_pair_starts_on_both_inputs_and_sends_at_its_end_by_hand() -> None:
    # 1f1b on 2 ranks, 2 micro-batches, F = 1, B = 2, links of latency 1, paired: rank 0
    # runs 0F0, (0F1;0B0), 0B1; rank 1 (the last stage: each backward needs the forward
    # before it) keeps four units. 0F0 0..1, its output at rank 1 at 2; 1F0 2..3, 1B0
    # 3..5, its gradient at rank 0 at 6; (0F1;0B0) waits for it: 6..9, and 0F1's output
    # leaves only at the pair's end: at rank 1 at 10; 1F1 10..11, 1B1 11..13, its
    # gradient at 14; 0B1 14..16. Unpaired the schedule takes 11 (0F1's output leaves at
    # 2, 1B1's gradient arrives at 9).
    bench = load_benchmark("bench_megatron_exchange")
    schedule = generate("1f1b", n_ranks=2, n_microbatches=2)
    paired = bench.megatron_pairs(schedule)
    assert [[str(w) for w in order] for order in paired.orders] == [
        ["0F0", "(0F1;0B0)OVERLAP_F_B", "0B1"],
        ["1F0", "1B0", "1F1", "1B1"],
    ]
    costs = CostModel.uniform(forward=1, backward=2, link=Link(latency=1))
    assert simulate(paired, costs=costs).metrics.makespan == 16
    assert simulate(schedule, costs=costs).metrics.makespan == 11
