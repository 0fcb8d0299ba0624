"""Transformer Engine's FP8 casts around each FP8 linear layer: the bytes of one layer's
casts worked by hand from what ``_Linear`` / ``_LayerNormLinear`` run (see
``pipesim.plan.kernels._fp8_casts``), for both recipes, with and without sequence
parallelism; a bf16 model's kernels are untouched."""

from __future__ import annotations

import dataclasses

import pytest
from helpers import TINY_LLAMA as LLAMA

from pipesim.errors import PlanError
from pipesim.plan.kernels import Collective, Gemm, Kernel, Shard, block_kernels, head_kernels

FP8 = dataclasses.replace(LLAMA, dtype="fp8")


def _around(kernels: tuple[Kernel, ...], gemm: str) -> list[tuple[str, int]]:
    """The non-GEMM kernels between ``gemm`` and the GEMM before it, with their bytes."""
    names = [k.name for k in kernels]
    end = names.index(gemm)
    start = max((i for i in range(end) if isinstance(kernels[i], Gemm)), default=-1) + 1
    out = []
    for k in kernels[start:end]:
        size = k.size_bytes if isinstance(k, Collective) else getattr(k, "bytes_moved", 0)
        out.append((k.name, size))
    return out


def test_current_scaling_reads_for_the_amax_before_each_cast() -> None:
    k = block_kernels(dataclasses.replace(FP8, fp8_recipe="tensorwise"), Shard())
    # the attention projection, 64 -> 64 features over T = 128 tokens, bf16 (d = 2):
    # amax reads 2 x 128 x 64 = 16384 bytes; the cast + transpose reads 16384 and
    # writes 8192 row-wise and 8192 transposed FP8 bytes = 32768
    proj = [
        n for n in _around(k.forward, "attention projection") if "fp8" in n[0] or "amax" in n[0]
    ]
    assert proj == [
        ("attention projection input amax", 16384),
        ("attention projection input cast + transpose (fp8)", 32768),
    ]
    # its output gradient (128 x 64) the same way before its input-gradient GEMM
    grad = _around(k.input_grad, "attention projection (input grad)")
    assert grad[-2:] == [
        ("attention projection output grad amax", 16384),
        ("attention projection output grad cast + transpose (fp8)", 32768),
    ]
    # the QKV's input comes from the norm, which computes its amax (bf16 norm output,
    # 128 x 64 x (2 + 2) = 32768 bytes as in bf16), then one cast + transpose
    assert _around(k.forward, "qkv") == [
        ("norm 1", 32768),
        ("qkv input cast + transpose (fp8)", 32768),
    ]
    # the weight gradients read what the casts wrote: nothing more without sp
    assert all(isinstance(g, Gemm) for g in k.weight_grad)


def test_delayed_scaling_with_sequence_parallelism_gathers_fp8_and_transposes_it() -> None:
    k = block_kernels(FP8, Shard(tensor=2, sequence_parallel=True))
    # T = 128, Ts = 64, t = 2. The norm writes FP8 itself: 64 x 64 x (2 + 1) = 12288;
    # the all-gather moves 128 x 64 FP8 bytes = 8192 (bf16: 16384)
    assert _around(k.forward, "qkv") == [("norm 1", 12288), ("all-gather before qkv", 8192)]
    # the projection's input (128 x 32, not sequence-split) cast + transposed at once
    assert _around(k.forward, "attention projection")[-1] == (
        "attention projection input cast + transpose (fp8)",
        4 * 128 * 32,
    )
    # its output gradient is cast row-wise on the 64 local tokens (64 x 64 x 3), gathered
    # in FP8 (128 x 64), and the gathered FP8 transposed for the weight gradient (2 x 8192)
    assert _around(k.input_grad, "attention projection (input grad)")[-2:] == [
        ("attention projection output grad cast (fp8)", 12288),
        ("after attention projection (backward)", 8192),
    ]
    assert _around(k.weight_grad, "attention projection (weight grad)") == [
        ("attention projection output grad transpose (fp8)", 16384),
    ]
    # the QKV's output gradient (128 x 48) cast + transposed; its input regathered in FP8
    # and transposed; the reduce-scatter of its input gradient stays bf16 (128 x 64 x 2)
    assert _around(k.input_grad, "qkv (input grad)")[-2:] == [
        ("qkv output grad cast + transpose (fp8)", 4 * 128 * 48),
        ("all-gather before qkv (again, for the weight gradient)", 8192),
    ]
    scatter = [c for c in k.input_grad if c.name == "all-gather before qkv (backward)"]
    assert [(c.kind, c.size_bytes) for c in scatter] == [("reduce-scatter", 16384)]  # type: ignore[union-attr]
    assert _around(k.weight_grad, "qkv (weight grad)") == [("qkv input transpose (fp8)", 16384)]


def test_a_bf16_model_runs_no_casts_and_the_lm_head_stays_bf16() -> None:
    for shard in (Shard(), Shard(tensor=2, sequence_parallel=True), Shard(recompute="full")):
        plain = block_kernels(LLAMA, shard)
        assert block_kernels(dataclasses.replace(LLAMA, fp8_recipe="tensorwise"), shard) == plain
        names = [k.name for p in plain.passes().values() for k in p]
        assert not [n for n in names if "fp8" in n or "amax" in n]
        # the fp8 model runs the same GEMMs, the casts beside them
        fp8 = block_kernels(FP8, shard)
        for a, b in zip(plain.passes().values(), fp8.passes().values(), strict=True):
            assert [g for g in a if isinstance(g, Gemm)] == [g for g in b if isinstance(g, Gemm)]
    # Megatron-Core's output layer is not a Transformer Engine module: bf16 GEMMs
    head = head_kernels(FP8, Shard())
    assert not any(
        g.low_precision for p in head.passes().values() for g in p if isinstance(g, Gemm)
    )
    with pytest.raises(PlanError, match="fp8_recipe must be one of delayed, tensorwise"):
        dataclasses.replace(FP8, fp8_recipe="mxfp8")
