"""GEMM rates measured by shape (pipesim.plan.gemm_table), worked by hand against the
data file's own entries."""

from __future__ import annotations

import json
import math
from dataclasses import replace
from importlib import resources

import pytest
from helpers import hand_accelerator

from pipesim.errors import PlanError
from pipesim.plan.gemm_table import gemm_table
from pipesim.plan.gpu import gemm_seconds
from pipesim.plan.hardware import accelerator_from_dict, get_accelerator
from pipesim.plan.kernels import Gemm


def _entries(name: str) -> dict[tuple[int, int, int, int], float]:
    raw = json.loads(resources.files("pipesim").joinpath("data/gemm_tables.json").read_text())
    return {(b, m, n, k): float(r) for b, m, n, k, r in raw["tables"][name]["entries"]}


SM90 = _entries("xla-sm90-bf16")


def test_the_h100_table_is_a_whole_grid_below_the_peak() -> None:
    sides = (256, 512, 1024, 2048, 4096)
    grid = {(b, m, n, k) for b in (1, 2, 4) for m in sides for n in sides for k in sides}
    assert set(SM90) == grid
    # every measured rate under the dense bf16 peak of each accelerator that names it
    for name in ("h100-sxm", "h200", "h800"):
        acc = get_accelerator(name)
        assert acc.gemm_table == "xla-sm90-bf16"
        assert max(SM90.values()) < acc.peak_flops


def test_a_gemm_on_the_grid_takes_its_flops_at_the_measured_rate() -> None:
    h100 = get_accelerator("h100-sxm")
    g = Gemm("attention projection", 4096, 2048, 1024)
    assert SM90[(1, 4096, 2048, 1024)] < h100.sustained_matmul_flops  # type: ignore[operator]
    assert gemm_seconds(g, h100, dtype_bytes=2) == pytest.approx(
        2 * 4096 * 2048 * 1024 / SM90[(1, 4096, 2048, 1024)], rel=1e-12
    )


def test_no_gemm_runs_faster_than_the_sustained_rate() -> None:
    # The table's (4096 x 2048) x (2048 x 2048) is 727.5 TFLOP/s, a burst at the boost
    # clock; at the 700 W limit no bf16 GEMM holds more than the measured 708.5.
    h100 = get_accelerator("h100-sxm")
    assert h100.sustained_matmul_flops == 708.5e12
    assert SM90[(1, 4096, 2048, 2048)] == pytest.approx(727.5e12, rel=1e-3)
    g = Gemm("attention projection", 4096, 2048, 2048)
    # 2 x 4096 x 2048 x 2048 = 34,359,738,368 FLOPs / 708.5e12 FLOP/s = 48.497 us
    assert gemm_seconds(g, h100, dtype_bytes=2) == pytest.approx(48.497e-6, rel=1e-4)
    # without the field the table's burst rate stands: 34,359,738,368 / 727.5e12 = 47.2 us
    burst = replace(h100, sustained_matmul_flops=None)
    assert gemm_seconds(g, burst, dtype_bytes=2) == pytest.approx(47.23e-6, rel=1e-3)
    # the cap binds the achievable-rate path too
    a100 = replace(get_accelerator("a100-80gb"), sustained_matmul_flops=200e12)
    g = Gemm("one wave", 12 * 128, 9 * 128, 4096)  # 14,495,514,624 FLOPs
    assert gemm_seconds(g, a100, dtype_bytes=2) == pytest.approx(72.4776e-6, rel=1e-5)


def test_fp8_gemms_have_their_own_sustained_cap() -> None:
    # the H200's FP8 MSMF, 1288.7 TFLOP/s, under the burst share 1979 x 0.709 = 1403.1
    h100 = get_accelerator("h100-sxm")
    assert h100.fp8_sustained_matmul_flops == 1288.7e12
    g = Gemm("one wave", 12 * 128, 11 * 128, 4096)  # 17,716,740,096 FLOPs
    # 17,716,740,096 / 1288.7e12 = 13.748 us; at the burst share it would be 12.627 us
    assert gemm_seconds(g, h100, dtype_bytes=2, fp8=True) == pytest.approx(13.7478e-6, rel=1e-4)
    burst = replace(h100, fp8_sustained_matmul_flops=None)
    assert gemm_seconds(g, burst, dtype_bytes=2, fp8=True) == pytest.approx(12.6268e-6, rel=1e-4)
    # a bf16 GEMM keeps the bf16 cap, not FP8's
    bf16 = Gemm("scores", 4096, 2048, 2048, low_precision=False)
    assert gemm_seconds(bf16, h100, dtype_bytes=2, fp8=True) == pytest.approx(48.497e-6, rel=1e-4)


def test_a_long_side_is_a_batch_of_pieces_and_a_long_k_runs_back_to_back() -> None:
    table = gemm_table("xla-sm90-bf16")
    # 8192 output columns: two pieces of 4096, a batch of 2 (the 1.7B's MLP up GEMM)
    assert table.rate(4096, 8192, 2048) == pytest.approx(SM90[(2, 4096, 4096, 2048)])
    # 12288 rows and 8192 columns: six pieces, past the grid's batch of 4: its rate
    assert table.rate(12288, 8192, 1024) == pytest.approx(SM90[(4, 4096, 4096, 1024)])
    # k = 8192: two GEMMs of k = 4096 accumulating
    assert table.rate(4096, 2048, 8192) == pytest.approx(SM90[(1, 4096, 2048, 4096)])
    # 6144 columns: two pieces of 3072, between 2048 and 4096 in log: a weighted
    # geometric mean of the two batch-2 rates, w = log(3072 / 2048) / log 2
    w = math.log2(3072 / 2048)
    lo, hi = SM90[(2, 4096, 2048, 2048)], SM90[(2, 4096, 4096, 2048)]
    assert table.rate(4096, 6144, 2048) == pytest.approx(lo ** (1 - w) * hi**w)
    # a side under 256 costs what 256 costs: 128 rows take the time of 256
    t128 = 2 * 128 * 512 * 512 / table.rate(128, 512, 512)
    assert t128 == pytest.approx(2 * 256 * 512 * 512 / SM90[(1, 256, 512, 512)])


def test_fp8_gemms_and_accelerators_without_a_table_keep_the_peak_share() -> None:
    # outputs of exactly one wave of 128 x 128 tiles (132 SMs: 12 x 11; 108: 12 x 9)
    h100 = replace(get_accelerator("h100-sxm"), fp8_sustained_matmul_flops=None)
    g = Gemm("one wave", 12 * 128, 11 * 128, 4096)
    fp8 = gemm_seconds(g, h100, dtype_bytes=2, fp8=True)
    assert fp8 == pytest.approx(g.flops / (h100.fp8_flops * h100.fp8_matmul_share))
    a100 = get_accelerator("a100-80gb")
    assert a100.gemm_table is None
    g = Gemm("one wave", 12 * 128, 9 * 128, 4096)
    burst = replace(a100, sustained_matmul_flops=None)
    assert gemm_seconds(g, burst, dtype_bytes=2) == pytest.approx(
        g.flops / (a100.peak_flops * a100.matmul_efficiency)
    )


def test_a100_gemms_are_capped_at_the_rate_measured_with_random_operands() -> None:
    # 312 x 0.869 = 271.1 TFLOP/s at a full wave (the burst MAMF), above the 257 an
    # 8192-cube GEMM of torch.randn operands holds at the power limit
    a100 = get_accelerator("a100-80gb")
    assert a100.sustained_matmul_flops == 257e12
    g = Gemm("one wave", 12 * 128, 9 * 128, 4096)  # 14,495,514,624 FLOPs
    # 14,495,514,624 / 257e12 = 56.403 us (at the burst 271.1: 53.46 us)
    assert gemm_seconds(g, a100, dtype_bytes=2) == pytest.approx(56.403e-6, rel=1e-4)
    # a GEMM the wave utilization already holds under the cap keeps its rate: 13 x 9
    # tiles on 108 SMs take two waves, 117 / 216 of the slots: 146.9 TFLOP/s
    g = Gemm("two waves", 13 * 128, 9 * 128, 4096)
    assert gemm_seconds(g, a100, dtype_bytes=2) == pytest.approx(
        g.flops / (312e12 * 0.869 * 117 / 216), rel=1e-9
    )


def test_an_unknown_table_is_refused_by_name() -> None:
    with pytest.raises(PlanError, match=r"unknown gemm_table 'xla-sm9'.*xla-sm90-bf16"):
        hand_accelerator(gemm_table="xla-sm9")
    data = hand_accelerator().to_dict() | {"gemm_table": 90}
    with pytest.raises(PlanError, match="gemm_table must be the name"):
        accelerator_from_dict(data)


def test_b200_gemms_are_capped_at_its_measured_sustained_rates() -> None:
    # the B200's MSMF (bf16 1456.3, FP8 2795.7 TFLOP/s at ~1335 MHz and 1000 W) under its
    # burst shares (2250 x 0.776 = 1746.0, 4500 x 0.763 = 3433.5)
    b200 = get_accelerator("b200")
    assert (b200.sustained_matmul_flops, b200.fp8_sustained_matmul_flops) == (1456.3e12, 2795.7e12)
    g = Gemm("one wave", 37 * 128, 4 * 128, 4096)  # 148 tiles of 128 x 128 on 148 SMs
    # 19,864,223,744 FLOPs / 1456.3e12 = 13.640 us (at the burst share: 11.377 us)
    assert gemm_seconds(g, b200, dtype_bytes=2) == pytest.approx(13.6402e-6, rel=1e-4)
    # / 2795.7e12 = 7.105 us (at the burst share: 5.785 us)
    assert gemm_seconds(g, b200, dtype_bytes=2, fp8=True) == pytest.approx(7.1053e-6, rel=1e-4)
