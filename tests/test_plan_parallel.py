"""Tensor / sequence parallelism, recomputation, distributed optimizer and the whole
iteration: every formula against a hand-computed case, and the planner's answers."""

from __future__ import annotations

import dataclasses
import json
import os
import re
import signal
import subprocess
import sys
import time
import uuid
from fractions import Fraction
from pathlib import Path

import pytest
from helpers import hand_accelerator, interruptible, processes_with

from pipesim.cli import main
from pipesim.errors import PlanError
from pipesim.plan import ModelSpec, plan
from pipesim.plan.collectives import allreduce_s, reduce_scatter_s
from pipesim.plan.frameworks import megatron_args, torchtitan_args
from pipesim.plan.hardware import Accelerator, Interconnect, get_accelerator
from pipesim.plan.iteration import (
    default_bytes_per_param,
    embedding_sync_ns,
    rank_iteration,
    static_bytes,
)
from pipesim.plan.layers import embedding, lm_head, transformer_block
from pipesim.plan.workload import workload_from_model

# s=4, h=8, a=2, f=32, bf16, dropout, no flash: s h = 32, a s^2 = 32
GPT = ModelSpec(n_layers=3, hidden=8, n_heads=2, seq_length=4, vocab_size=10)


@pytest.mark.parametrize(
    ("sequence_parallel", "recompute", "expected"),
    [
        # Korthikanti et al. 2023, Table 2, t = 2: s h (10 + 24/t + 5 a s / (h t))
        (False, "none", 32 * 10 + 32 * 24 // 2 + 5 * 2 * 16 // 2),  # 784
        # s h (34/t + 5 a s / (h t))
        (True, "none", 32 * 34 // 2 + 5 * 2 * 16 // 2),  # 624
        # selective: the 5as/(ht) term goes
        (False, "selective", 32 * 10 + 32 * 24 // 2),  # 704
        (True, "selective", 32 * 34 // 2),  # 544
        # full: only the block input, 2 s h (2 s h / t with sequence parallelism)
        (False, "full", 2 * 32),
        (True, "full", 2 * 32 // 2),
    ],
)
def test_activation_bytes_korthikanti_table_2(
    sequence_parallel: bool, recompute: str, expected: int
) -> None:
    block = transformer_block(
        GPT, tensor=2, sequence_parallel=sequence_parallel, recompute=recompute
    )
    assert block.activation_bytes == expected
    # full recomputation re-creates one block's activations (no recomputation) at a time
    whole = transformer_block(GPT, tensor=2, sequence_parallel=sequence_parallel)
    assert block.transient_bytes == (whole.activation_bytes if recompute == "full" else 0)


def test_flops_with_tensor_parallelism_and_recomputation() -> None:
    one = transformer_block(GPT)
    assert (one.forward_flops, one.input_grad_flops, one.weight_grad_flops) == (6656, 7168, 6144)
    # t = 2 splits every matmul: half of each
    two = transformer_block(GPT, tensor=2)
    assert (two.forward_flops, two.input_grad_flops, two.weight_grad_flops) == (3328, 3584, 3072)
    # full recomputation: four passes instead of three (Narayanan et al. 2021:
    # 96 s l h^2 (1 + s / 6h) per sequence instead of 72 ...)
    full = transformer_block(GPT, recompute="full")
    assert full.flops == 4 * one.forward_flops == 96 * 4 * 64 + 16 * 16 * 8
    # selective: the attention core (4 s^2 h = 512) again
    selective = transformer_block(GPT, recompute="selective")
    assert selective.input_grad_flops == 7168 + 512
    # with flash attention selective recomputation stores the same (no s x s scores to
    # drop) and still runs the attention core again (Megatron-Core checkpoints it):
    # 4 s^2 h = 4 * 16 * 8
    flash = ModelSpec(
        n_layers=1, hidden=8, n_heads=2, seq_length=4, vocab_size=10, flash_attention=True
    )
    plain, again = transformer_block(flash), transformer_block(flash, recompute="selective")
    assert again.activation_bytes == plain.activation_bytes
    assert again.input_grad_flops == plain.input_grad_flops + 4 * 16 * 8


def test_parameters_per_device() -> None:
    # 12 h^2 = 768 weights and the column-parallel biases (QKV 3h = 24, fc1 f = 32) split;
    # the row-parallel biases (2h) and the LayerNorms (4h) replicated
    two = transformer_block(GPT, tensor=2)
    assert two.params == (768 + 24 + 32) // 2 + 6 * 8
    assert transformer_block(GPT).params == 872
    # vocabulary-parallel embedding and head
    assert embedding(GPT, tensor=2).params == 10 * 8 // 2 + 4 * 8
    head = lm_head(GPT, tensor=2)
    assert head.forward_flops == 2 * 4 * 8 * 10 // 2
    assert head.activation_bytes == 64 + 64 + 4 * 4 * 10 // 2


def test_static_memory_and_distributed_optimizer() -> None:
    # Megatron-LM's table: 18 bytes per parameter, 6 + 12/d with the distributed optimizer
    assert static_bytes(1000, data_parallel=1, distributed_optimizer=False) == 18000
    assert static_bytes(1000, data_parallel=4, distributed_optimizer=True) == 9000
    assert static_bytes(1000, data_parallel=8, distributed_optimizer=True) == 7500


LINK = Interconnect(latency_s=1e-6, bandwidth_bytes_per_s=1e9)


def test_ring_collectives_by_hand() -> None:
    # 8 devices, 8 MB: reduce-scatter 7/8 * 8e6 / 1e9 + 7 us = 7 ms + 7 us
    assert reduce_scatter_s(8 * 10**6, n_devices=8, link=LINK) == Fraction(7007, 10**6)
    assert allreduce_s(8 * 10**6, n_devices=8, link=LINK) == Fraction(14014, 10**6)
    assert allreduce_s(8 * 10**6, n_devices=1, link=LINK) == 0


def _accelerator(**changes: object) -> Accelerator:
    return hand_accelerator(**changes)


def test_data_parallel_overlap_and_optimizer_step_by_hand() -> None:
    acc = _accelerator()
    kwargs = dict(
        accelerator=acc, tensor=1, data_parallel=8, grad_bytes_per_param=2, weight_bytes_per_param=2
    )
    # 4e6 params: 8 MB of gradients; all-reduce 14.014 ms, 5 ms of it hidden
    plain = rank_iteration(
        4 * 10**6,
        distributed_optimizer=False,
        last_backward_ns=5_000_000,
        first_forward_ns=1_000_000,
        **kwargs,
    )  # type: ignore[arg-type]
    assert plain.dp_comm_ns == 14_014_000
    assert plain.dp_exposed_ns == 14_014_000 - 5_000_000
    # the optimizer step: 42 bytes per parameter at 3 GB/s (memory efficiency 1)
    assert plain.optimizer_ns == 56_000_000
    # distributed optimizer: reduce-scatter (7.007 ms, hides 5) + all-gather of bf16 weights
    # (7.007 ms, hides behind the 1 ms first forward); the step on 1/8 of the parameters,
    # but the whole gradient buffer zeroed (Megatron-Core's zero_grad_buffer):
    # (42 - 2) x 4e6 / 8 + 2 x 4e6 = 28 MB at 3 GB/s
    zero = rank_iteration(
        4 * 10**6,
        distributed_optimizer=True,
        last_backward_ns=5_000_000,
        first_forward_ns=1_000_000,
        **kwargs,
    )  # type: ignore[arg-type]
    assert zero.dp_comm_ns == 2 * 7_007_000
    assert zero.dp_exposed_ns == 2_007_000 + 6_007_000
    assert zero.optimizer_ns == 9_333_333


def test_the_first_stage_embedding_reduction_and_gather_hide_behind_nothing() -> None:
    # Megatron-Core core_r0.8.0: the input embedding's gradient is the backward's last, so
    # its bucket's reduce-scatter starts after the backward; its all-gather, first in
    # forward order, ends before the forward starts. Hand link: 1 GB/s, 1 us a step.
    acc = _accelerator()
    kwargs = dict(
        accelerator=acc, tensor=1, data_parallel=8, grad_bytes_per_param=2, weight_bytes_per_param=2
    )
    # 4e6 parameters, 100 ms of backward and forward: all hidden without the embedding
    long = dict(last_backward_ns=100_000_000, first_forward_ns=100_000_000)
    none = rank_iteration(4 * 10**6, distributed_optimizer=True, **long, **kwargs)  # type: ignore[arg-type]
    assert none.dp_exposed_ns == 0
    # 8e5 of them the embedding: 1.6 MB, 7/8 x 1.6e6 B / 1e9 B/s + 7 x 1 us = 1.407 ms each way
    edge = rank_iteration(
        4 * 10**6, distributed_optimizer=True, edge_params=8 * 10**5, **long, **kwargs
    )  # type: ignore[arg-type]
    assert edge.dp_exposed_ns == 2 * 1_407_000
    assert edge.dp_comm_ns == none.dp_comm_ns == 2 * 7_007_000
    # without the distributed optimizer: its all-reduce, twice the reduce-scatter
    plain = rank_iteration(
        4 * 10**6, distributed_optimizer=False, edge_params=8 * 10**5, **long, **kwargs
    )  # type: ignore[arg-type]
    assert plain.dp_exposed_ns == 2 * 1_407_000
    # when the reduction outlasts the backward by more, that is what shows (as before):
    # reduce-scatter 7.007 - 5 ms, all-gather 7.007 - 1 ms
    short = dict(last_backward_ns=5_000_000, first_forward_ns=1_000_000)
    busy = rank_iteration(
        4 * 10**6, distributed_optimizer=True, edge_params=8 * 10**5, **short, **kwargs
    )  # type: ignore[arg-type]
    assert busy.dp_exposed_ns == 2_007_000 + 6_007_000
    # without overlap everything is exposed, the embedding no more than once
    off = rank_iteration(
        4 * 10**6,
        distributed_optimizer=True,
        edge_params=8 * 10**5,
        overlap=False,
        **long,
        **kwargs,
    )  # type: ignore[arg-type]
    assert off.dp_exposed_ns == 2 * 7_007_000


def test_data_parallel_ring_across_nodes_drives_the_nics_of_its_members() -> None:
    # 1 GB/s NICs, 4 GB/s NVLink (hand numbers); 8 GPUs a node
    acc = _accelerator(intra_node_bandwidth=4e9)
    kwargs = dict(
        accelerator=acc,
        data_parallel=16,
        distributed_optimizer=True,
        grad_bytes_per_param=4,
        weight_bytes_per_param=2,
        last_backward_ns=0,
        first_forward_ns=0,
    )
    # 16 replicas 8 apart (t = 8): one member a node, one NIC: 15/16 * 4e6 B / 1e9 + 15 us
    one = rank_iteration(10**6, tensor=8, **kwargs)  # type: ignore[arg-type]
    assert one.dp_exposed_ns == 3_750_000 + 15_000 + 1_875_000 + 15_000
    # 2 apart (t = 2): four members a node drive four NICs, 4 GB/s
    four = rank_iteration(10**6, tensor=2, **kwargs)  # type: ignore[arg-type]
    assert four.dp_exposed_ns == 937_500 + 15_000 + 468_750 + 15_000
    # t = 1: eight NICs, 8 GB/s, but no faster than the NVLink ring's 4 GB/s
    eight = rank_iteration(10**6, tensor=1, **kwargs)  # type: ignore[arg-type]
    assert eight.dp_exposed_ns == four.dp_exposed_ns


def test_bf16_gradients_are_reduced_in_fp32() -> None:
    # Megatron-LM's arguments.py: bf16 accumulates and reduces gradients in fp32; fp16
    # in fp16; the distributed optimizer gathers the weights in the model's dtype
    bf16 = workload_from_model(GPT)
    assert (bf16.grad_bytes_per_param, bf16.weight_bytes_per_param) == (4, 2)
    fp16 = workload_from_model(dataclasses.replace(GPT, dtype="fp16"))
    assert (fp16.grad_bytes_per_param, fp16.weight_bytes_per_param) == (2, 2)


def test_an_fp16_optimizer_step_copies_and_unscales_the_gradients() -> None:
    # Megatron-LM's Float16OptimizerWithFloat16Params: the 42 bytes of a bf16 step, + 6
    # (fp16 gradient copied into fp32) + 8 (unscaled in place) - 2 (fp16 buffer zeroed)
    fp16 = workload_from_model(dataclasses.replace(GPT, dtype="fp16"))
    assert workload_from_model(GPT).step_bytes_per_param == 42
    assert fp16.step_bytes_per_param == 54
    it = rank_iteration(
        10**6,
        accelerator=_accelerator(),
        tensor=1,
        data_parallel=1,
        distributed_optimizer=False,
        grad_bytes_per_param=2,
        weight_bytes_per_param=2,
        last_backward_ns=0,
        first_forward_ns=0,
        step_bytes_per_param=fp16.step_bytes_per_param,
    )
    assert it.optimizer_ns == 18_000_000  # 54e6 bytes at 3 GB/s


def test_gradients_kept_in_bf16_halve_their_reduction_and_buffer() -> None:
    # Megatron-LM's --grad-reduce-in-bf16: the gradient buffer and its data-parallel
    # reduction in bf16 (2 bytes), the weights' all-gather unchanged
    spec = dataclasses.replace(GPT, grad_reduce_in_bf16=True)
    halved = workload_from_model(spec)
    assert (halved.grad_bytes_per_param, halved.weight_bytes_per_param) == (2, 2)
    # the step: 42 bytes, + 6 (the distributed optimizer's .float() copy of its gradient
    # shard: reads 2, writes 4) - 2 (a bf16 buffer zeroed)
    assert halved.step_bytes_per_param == 46
    fp8 = workload_from_model(dataclasses.replace(spec, dtype="fp8"))
    assert (fp8.grad_bytes_per_param, fp8.step_bytes_per_param) == (2, 46)
    # at rest: 2 (weights) + 2 (gradients) + 12 (optimizer), where fp32 gradients take 4
    assert default_bytes_per_param(grad_reduce_in_bf16=True) == 16
    assert default_bytes_per_param(grad_reduce_in_bf16=False) == 18
    # an fp16 or fp32 model has no fp32 gradients to halve: refused, naming the fix
    for dtype in ("fp16", "fp32"):
        with pytest.raises(PlanError, match=r"grad_reduce_in_bf16.*drop it"):
            dataclasses.replace(spec, dtype=dtype)
    with pytest.raises(PlanError, match="grad_reduce_in_bf16 must be true or false"):
        dataclasses.replace(GPT, grad_reduce_in_bf16="yes")


def test_a_plan_with_gradients_in_bf16_by_hand() -> None:
    # one pinned configuration planned twice, fp32 and bf16 gradients: the static memory
    # differs by the gradient buffer's 2 bytes a parameter held (distributed optimizer:
    # 2 + g + 12 / d), the data-parallel traffic is less (the gradients' reduce-scatter
    # moves 2 bytes an element, not 4; the bytes themselves are checked above), and
    # Megatron-LM's flags name it
    big = ModelSpec(n_layers=4, hidden=1024, n_heads=8, seq_length=512, vocab_size=4096)
    kwargs = dict(
        devices=8,
        accelerator="h100-sxm",
        global_batch=16,
        tensor=[1],
        pipeline_parallel=[2],
        microbatch_sizes=[1],
        schedules=["1f1b"],
        recompute=["none"],
        sequence_parallel=[False],
        distributed_optimizer=[True],
        virtual=[1],
        overlap_grad_reduce=False,
        workers=1,
    )
    fp32, bf16 = (
        plan(dataclasses.replace(big, grad_reduce_in_bf16=flag), **kwargs)  # type: ignore[arg-type]
        for flag in (False, True)
    )
    a, b = fp32.points[0], bf16.points[0]
    held = workload_from_model(big, tensor=1).layers  # the stages' parameters
    stage_params = [
        sum(layer.params for layer in held[start : start + n])
        for start, n in zip([0, a.layers_per_stage[0]], a.layers_per_stage, strict=True)
    ]
    assert a.static_memory_bytes - b.static_memory_bytes == 2 * max(stage_params)
    # the reduce-scatter of gradients (4 -> 2 bytes) beside the unchanged bf16 all-gather
    assert a.dp_comm_total_ns is not None and b.dp_comm_total_ns is not None
    assert b.dp_comm_total_ns < a.dp_comm_total_ns
    assert "--grad-reduce-in-bf16" in megatron_args(bf16, b)
    assert "--grad-reduce-in-bf16" not in megatron_args(fp32, a)
    # an explicit bytes_per_param is the caller's: the same static memory both ways
    same = [
        plan(dataclasses.replace(big, grad_reduce_in_bf16=flag), bytes_per_param=18, **kwargs)  # type: ignore[arg-type]
        for flag in (False, True)
    ]
    assert same[0].points[0].static_memory_bytes == same[1].points[0].static_memory_bytes


def test_a_pinned_configuration_by_hand() -> None:
    # all dimensions pinned: exactly one configuration, its pipeline time by hand.
    acc = _accelerator(memory_bandwidth=1e30)  # free memory traffic: FLOPs and comm only
    result = plan(
        GPT,
        devices=2,
        accelerator=acc,
        global_batch=1,
        tensor=[2],
        stages=[1],
        microbatch_sizes=[1],
        virtual=[1],
        schedules=["sequential"],
        recompute=["full"],
        sequence_parallel=[True],
        distributed_optimizer=[False],
        memory_headroom=0,
        workers=1,
    )
    (point,) = result.points
    assert (point.tensor, point.sequence_parallel, point.recompute) == (2, True, "full")
    # one stage, one micro-batch: F + B. FLOPs at 1e15/s: 1 ns per 1e6 FLOPs.
    block = transformer_block(GPT, tensor=2, sequence_parallel=True, recompute="full")
    flops = 3 * (block.forward_flops + block.backward_flops) + sum(
        x.flops for x in (embedding(GPT, tensor=2), lm_head(GPT, tensor=2))
    )
    # with sequence parallelism every collective is a reduce-scatter or all-gather of the
    # s h bf16 = 64-byte activation over t = 2: 1/2 * 64 / 1e9 + 1 us each. A block's F
    # has 4 (all-gather and reduce-scatter around attention and MLP), its B the 4
    # backwards, the inputs of qkv and mlp up gathered again for their weight gradients
    # (2) and, recomputed, the 4 again; the embedding one each way, the head one forward
    # and two backward (its input gathered again too)
    per_half = Fraction(32, 10**9) + Fraction(1, 10**6)
    n_halves = 3 * (4 + 8 + 2) + 2 + 3
    # and the loss's three all-reduces of s fp32 = 16 bytes: 2 * 1/2 * 16 / 1e9 + 2 us
    loss = 3 * (Fraction(16, 10**9) + Fraction(2, 10**6))
    comm_ns = (n_halves * per_half + loss) * 10**9
    expected = Fraction(flops, 10**15) * 10**9 + comm_ns
    assert abs(point.pipeline_time_ns - expected) <= 4  # type: ignore[operator]  # roundings
    assert point.tp_comm_time_ns == pytest.approx(float(comm_ns), abs=4)
    assert point.dp_comm_time_ns == 0 and point.data_parallel == 1
    parts = point.parts_s()
    assert parts is not None and parts["step"] == pytest.approx(
        parts["pipeline"] + parts["dp_comm"] + parts["optimizer"]
    )


@pytest.mark.slow
def test_llama2_70b_on_64_h100_is_sensible() -> None:
    # the acceptance case, on a narrowed sweep: tensor parallelism inside a node
    # and pipelining, not a sequential pipeline at a few percent MFU
    result = plan(
        "llama2-70b",
        devices=64,
        accelerator="h100-sxm",
        global_batch=512,
        schedules=["sequential", "1f1b", "interleaved-1f1b"],
        microbatch_sizes=[1],
        virtual=[1, 2],
        workers=2,
    )
    best = result.recommended
    assert best is not None
    assert best.tensor >= 2 and best.pipeline >= 2 and best.schedule != "sequential"
    assert best.mfu is not None and best.mfu > 0.25
    # the winner is explained by its breakdown: against the best that fits at t = 8 it
    # exposes less tensor-parallel traffic, and what that saves outweighs any extra bubble
    wide = min((p for p in result.points if p.fits and p.tensor == 8), key=lambda p: p.step_time_ns)
    ours, theirs = best.parts_s(), wide.parts_s()
    assert ours is not None and theirs is not None
    assert ours["tp_comm"] < theirs["tp_comm"]
    saved = theirs["tp_comm"] - ours["tp_comm"]
    assert saved > ours["bubble"] - theirs["bubble"]
    assert ours["step"] < theirs["step"]
    assert best.peak_memory_bytes <= 0.9 * get_accelerator("h100-sxm").memory_bytes  # type: ignore[operator]  # the headroom
    megatron = megatron_args(result, best)
    assert f"--tensor-model-parallel-size {best.tensor}" in megatron
    assert "--global-batch-size 512" in megatron and "--sequence-parallel" in megatron
    assert f"--parallelism.tensor_parallel_degree {best.tensor}" in torchtitan_args(result, best)
    # the same sweep without tensor parallelism and recomputation: much slower or nothing
    flat = plan(
        "llama2-70b",
        devices=64,
        accelerator="h100-sxm",
        global_batch=512,
        schedules=["sequential", "1f1b"],
        microbatch_sizes=[1],
        virtual=[1],
        tensor=[1],
        recompute=["none"],
        workers=2,
    )
    assert flat.best is None or flat.best.step_time_ns > best.step_time_ns  # type: ignore[operator]


# A 4-layer GPT on 2 GPUs: every planner verb path in a second.
TINY_PLAN = [
    "plan",
    "--layers",
    "4",
    "--hidden",
    "256",
    "--heads",
    "4",
    "--seq-length",
    "128",
    "--vocab",
    "1000",
    "--devices",
    "2",
    "--accelerator",
    "h100-sxm",
    "--global-batch",
    "4",
    "--workers",
    "1",
]


def test_absurd_winners_are_not_crowned(capsys: pytest.CaptureFixture[str]) -> None:
    # a bar no configuration reaches: the fastest that fits is reported, not recommended
    args = [*TINY_PLAN, "--min-mfu", "0.99"]
    assert main(args) == 0  # an answer: exit 1 only for --require-fit
    out = capsys.readouterr().out
    assert "no configuration reaches a sane efficiency" in out and "Megatron-LM:" not in out
    assert main([*args, "--require-fit"]) == 1
    err = capsys.readouterr().err
    assert "--require-fit: configurations fit, but none reaches --min-mfu 99.0%" in err
    assert main([*args[:-1], "0.0"]) == 0
    out = capsys.readouterr().out
    assert "Megatron-LM: --tensor-model-parallel-size" in out and "torchtitan:" in out


def test_nothing_fits_exits_non_zero_with_require_fit(
    capsys: pytest.CaptureFixture[str],
) -> None:
    args = [
        "plan",
        "--model",
        "llama2-70b",
        "--devices",
        "8",
        "--accelerator",
        "h100-sxm",
        "--global-batch",
        "8",
        "--memory-capacity",
        "1e9",
        "--schedules",
        "1f1b",
        "--microbatch-sizes",
        "1",
        "--virtual",
        "1",
        "--workers",
        "1",
    ]
    assert main(args) == 0
    out = capsys.readouterr().out
    # usable: 1e9 less 10% headroom = 9e8 bytes = 858.3 MiB (binary, as every byte count)
    assert f"nothing fits in {9 * 10**8 / 2**20:.0f} MiB per device" in out
    assert "(none fits: the least memory first)" in out  # the nearest misses
    assert main([*args, "--require-fit"]) == 1
    assert "--require-fit: no configuration fits" in capsys.readouterr().err


def test_output_format_follows_the_suffix(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    base = [*TINY_PLAN, "--min-mfu", "0"]
    assert main([*base, "-o", str(tmp_path / "plan.txt")]) == 1
    assert "cannot tell the format from the suffix '.txt'" in capsys.readouterr().err
    assert (
        main(
            [*base, "-o", str(tmp_path / "plan.json"), "--costs-out", str(tmp_path / "costs.json")]
        )
        == 0
    )
    data = json.loads((tmp_path / "plan.json").read_text())
    best = data["best"]
    assert set(best["parts_s"]) >= {"pipeline", "tp_comm", "dp_comm", "optimizer", "bubble"}
    assert data["megatron_args"].startswith("--tensor-model-parallel-size")
    err = capsys.readouterr().err
    assert "pipesim simulate" in err
    # the winner's cost file feeds `pipesim simulate` and gives the plan's pipeline time
    command = err.split("simulate it: ")[1].split()[2:]
    assert main(["simulate", *command, "--json"]) == 0
    simulated = json.loads(capsys.readouterr().out)
    assert simulated["makespan"] == best["pipeline_time_ns"]
    assert simulated["time_unit"] == "ns"  # the file says its unit; no bare "units"
    assert main([*base, "-o", str(tmp_path / "plan.csv")]) == 0
    assert (tmp_path / "plan.csv").read_text().startswith("rank,schedule,")


BIG = [
    "plan",
    "--model",
    "llama2-70b",
    "--devices",
    "512",
    "--accelerator",
    "h100-sxm",
    "--global-batch",
    "4096",
    "--workers",
    "2",
]


_MAIN = "import sys; from pipesim.cli import main; sys.exit(main(sys.argv[1:]))"


def _start(extra: list[str], marker: str) -> subprocess.Popen[str]:
    env = dict(os.environ, PIPESIM_TEST_MARKER=marker)
    return subprocess.Popen(
        [sys.executable, "-c", _MAIN, *BIG, *extra],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        preexec_fn=interruptible,
    )


@pytest.mark.slow
@pytest.mark.skipif(not Path("/proc/self/environ").exists(), reason="needs /proc (Linux)")
def test_timeout_stops_every_worker_and_prints_the_partial_ranking() -> None:
    marker = uuid.uuid4().hex
    start = time.monotonic()
    proc = _start(["--timeout", "4"], marker)
    out, err = proc.communicate(timeout=60)
    elapsed = time.monotonic() - start
    assert proc.returncode == 1, err
    assert elapsed < 4 + 10  # start-up, the sweep's 4 s, stopping within ~2 s
    assert "partial plan" in out and "rank" in out
    assert processes_with(marker) == []


@pytest.mark.slow
@pytest.mark.skipif(not Path("/proc/self/environ").exists(), reason="needs /proc (Linux)")
def test_ctrl_c_stops_every_worker_within_two_seconds() -> None:
    marker = uuid.uuid4().hex
    proc = _start([], marker)
    deadline = time.monotonic() + 30
    while len(processes_with(marker)) < 3 and time.monotonic() < deadline:  # parent + 2 workers
        time.sleep(0.1)
    assert len(processes_with(marker)) >= 3
    time.sleep(1.0)
    sent = time.monotonic()
    proc.send_signal(signal.SIGINT)  # what Ctrl-C sends (to the foreground group)
    out, err = proc.communicate(timeout=30)
    assert time.monotonic() - sent < 5.0  # about 2 s idle; slack for a loaded CI machine
    assert proc.returncode == 130, err
    assert "partial plan (the sweep was interrupted" in out
    assert "Traceback" not in err
    assert processes_with(marker) == []


def test_html_report_has_the_winner_table_front_refusals_and_key(tmp_path: Path) -> None:
    from pipesim.plan.report import COLUMN_KEY, report_html

    result = plan(
        GPT,
        devices=4,
        accelerator="h100-sxm",
        global_batch=8,
        workers=1,
        min_mfu=0,
        memory_headroom=0,
        memory_capacity_bytes=25_000,  # the peaks run from 17 to 41 kB: about half fit
    )
    best = result.recommended
    assert best is not None
    page = report_html(result, cdn=True)
    assert "is the fastest configuration that fits" in page
    assert "--tensor-model-parallel-size" in page and "torchtitan" in page
    assert "Top " in page and best.schedule in page
    assert "Pareto front" in page and "log scale" in page
    # refused: schedule rules and memory, each kind once with its count
    assert "Why configurations were refused" in page
    assert any((p.reason or "").startswith("needs") for p in result.points)
    # 24.41 KiB usable: binary, no headroom (with a 4th digit where the need is as close)
    assert re.search(rf"&gt; {25_000 / 1024:.1f}[0-9]? KiB usable", page)
    assert "GB" not in page.replace("GB/s", "")
    # one binary unit per column and axis, picked for the largest value (41 kB: KiB)
    from pipesim.plan.report import format_table, plan_figure

    assert "<th>memory KiB</th>" in page
    assert plan_figure(result).layout.xaxis.title.text == "peak memory per device (KiB)"
    header, row = format_table(result).splitlines()[2:4]  # columns are right-aligned
    end = header.index("memory KiB") + len("memory KiB")
    assert row[:end].split()[-1] == f"{best.peak_memory_bytes / 1024:.1f}"  # type: ignore[operator]
    for column, _ in COLUMN_KEY:
        assert f"<td>{column}</td>" in page


def test_unknown_presets_suggest_the_closest() -> None:
    from pipesim.errors import UnknownNameError
    from pipesim.plan import get_model

    with pytest.raises(UnknownNameError, match="did you mean 'llama2-70b'"):
        get_model("llama2-70B")
    with pytest.raises(UnknownNameError, match="did you mean 'a100-80gb'"):
        get_accelerator("a100-80")
    with pytest.raises(UnknownNameError) as info:
        get_model("zzz")
    assert "did you mean" not in str(info.value)


def test_full_recomputation_transient_is_in_the_peak() -> None:
    # one stage, one micro-batch: the peak is static + stored inputs + one block re-created
    kwargs = dict(
        devices=1,
        accelerator=_accelerator(),
        global_batch=1,
        tensor=[1],
        stages=[1],
        microbatch_sizes=[1],
        virtual=[1],
        schedules=["sequential"],
        memory_headroom=0,
        workers=1,
    )
    full = plan(GPT, recompute=["full"], **kwargs)  # type: ignore[arg-type]
    (point,) = full.points
    stored = 3 * transformer_block(GPT, recompute="full").activation_bytes + sum(
        x.activation_bytes for x in (embedding(GPT), lm_head(GPT))
    )
    assert point.peak_activation_bytes == stored + transformer_block(GPT).activation_bytes
    none = plan(GPT, recompute=["none"], **kwargs)  # type: ignore[arg-type]
    assert none.points[0].peak_activation_bytes > point.peak_activation_bytes  # type: ignore[operator]


def test_progress_bar_opens_at_once_and_counts(capsys: pytest.CaptureFixture[str]) -> None:
    from pipesim.cli._progress import Progress

    bar = Progress(enabled=True, desc="planning", unit="config")
    bar(0, 40)  # evaluate_points reports 0 done before the first result
    assert bar.bar is not None and bar.bar.total == 40
    assert "planning:   0%" in capsys.readouterr().err  # drawn before any result
    bar(25, 40)
    assert bar.bar.n == 25
    bar.bar.refresh()  # tqdm redraws at most every 0.2 s by itself
    assert "25/40" in capsys.readouterr().err
    bar.close()
    silent = Progress(enabled=False, desc="planning", unit="config")
    silent(1, 2)
    capsys.readouterr()
    silent(2, 2)
    assert silent.bar is None and capsys.readouterr().err == ""


def test_the_winners_pipeline_sends_by_hand() -> None:
    # two stages, one micro-batch: the activation goes 0 -> 1 and its gradient 1 -> 0,
    # both on the critical path. s h bf16 = 64 bytes at 1 GB/s + 1 us latency each.
    result = plan(
        GPT,
        devices=2,
        accelerator=_accelerator(memory_bandwidth=1e30),
        global_batch=1,
        tensor=[1],
        stages=[2],
        microbatch_sizes=[1],
        virtual=[1],
        schedules=["1f1b"],
        recompute=["none"],
        memory_headroom=0,
        workers=1,
    )
    best = result.best
    assert best is not None and best.pipeline == 2
    assert best.pp_comm_time_ns == 2 * (64 + 1000)
    parts = best.parts_s()
    assert parts is not None and parts["pp_comm"] == pytest.approx(2128e-9)
    # only the winner is measured this way: the others say nothing rather than 0
    assert all(p.pp_comm_time_ns is None for p in result.points[1:])


def test_pipeline_sends_block_unless_overlapped() -> None:
    # Megatron-LM waits for each send and receive (p2p_communication._communicate waits
    # on every request): the cost model's sends do not overlap compute unless asked
    from pipesim.plan import configuration

    kwargs = dict(
        devices=4,
        accelerator=_accelerator(memory_bandwidth=1e30, intra_node_bandwidth=1e7),
        global_batch=8,
        tensor=[1],
        stages=[4],
        microbatch_sizes=[1],
        virtual=[1],
        schedules=["1f1b"],
        recompute=["none"],
        memory_headroom=0,
        workers=1,
    )
    waits = plan(GPT, **kwargs)  # type: ignore[arg-type]
    overlaps = plan(GPT, overlap_p2p=True, **kwargs)  # type: ignore[arg-type]
    (a,), (b,) = waits.points, overlaps.points
    assert configuration(waits, a, model=GPT)[1].blocking_sends
    assert not configuration(overlaps, b, model=GPT)[1].blocking_sends
    # slow links: waiting for each message makes the step longer, never shorter
    assert a.pipeline_time_ns > b.pipeline_time_ns  # type: ignore[operator]
    assert "--overlap-p2p-communication" in megatron_args(overlaps, b)
    assert "--overlap-p2p-communication" not in megatron_args(waits, a)


@pytest.mark.parametrize("sequence_parallel", [False, True])
def test_a_pipeline_send_without_sequence_parallelism_is_gathered_by_its_receiver(
    sequence_parallel: bool,
) -> None:
    # Narayanan et al. 2021 section 4.1: each of the t ranks sends 1/t of the s h output
    # (32 of 64 bytes), and without sequence parallelism the receivers all-gather it over
    # their t = 2 group: 1/2 * 64 B / 1 GB/s + 1 us. One micro-batch through 2 stages:
    # two messages (forward, backward), each 1 us + 32 B / 1 GB/s, plus their gathers.
    acc = _accelerator()
    result = plan(
        GPT,
        devices=4,
        accelerator=acc,
        global_batch=1,
        tensor=[2],
        stages=[2],
        microbatch_sizes=[1],
        virtual=[1],
        schedules=["gpipe"],
        recompute=["none"],
        sequence_parallel=[sequence_parallel],
        distributed_optimizer=[False],
        memory_headroom=0,
        workers=1,
    )
    (point,) = result.points
    message = 1_000 + 32
    gather = 0 if sequence_parallel else 1_000 + 32
    assert point.pp_comm_time_ns == 2 * (message + gather)


def test_a_tied_embedding_gradient_is_all_reduced_between_the_end_stages() -> None:
    # Megatron-LM's finalize_model_grads: _allreduce_word_embedding_grads all-reduces the
    # shared table's main_grad (vocab / t x h, fp32 for bf16) between the first and the
    # last stage. GPT: 10 x 8 x 4 B = 320 B; a ring of 2: 2 x (1/2 x 320 B / 1 GB/s + 1 us)
    tied = dataclasses.replace(GPT, tied_embeddings=True)
    acc = _accelerator(inter_node_bandwidth=5e8)
    kwargs = dict(accelerator=acc, tensor=1, stage_devices=1)
    assert embedding_sync_ns(tied, [0, 1], **kwargs) == {0: 2_320, 1: 2_320}  # type: ignore[arg-type]
    assert embedding_sync_ns(GPT, [0, 1], **kwargs) == {}  # type: ignore[arg-type]
    # one rank holds both copies (no pipelining, or a V schedule's first rank)
    assert embedding_sync_ns(tied, [0], **kwargs) == {}  # type: ignore[arg-type]
    assert embedding_sync_ns(tied, [0, 1, 1, 0], **kwargs) == {}  # type: ignore[arg-type]
    # t = 2: 5 rows of the vocabulary each, 160 B; the pipeline of 2 x 8 devices spans two
    # nodes: one NIC of 0.5 GB/s a member, 2 x (1/2 x 160 B / 0.5 GB/s + 1 us)
    across = kwargs | {"tensor": 2, "stage_devices": 8}
    assert embedding_sync_ns(tied, [0, 1], **across) == {0: 2_320, 1: 2_320}  # type: ignore[arg-type]
    # in a pinned plan it is exposed on top of the untied step: the ranks holding the
    # first and the last stage each wait for it, after the (here absent) gradient sync
    plans = [
        plan(
            spec,
            devices=2,
            accelerator=_accelerator(),
            global_batch=2,
            tensor=[1],
            stages=[2],
            microbatch_sizes=[1],
            virtual=[1],
            schedules=["1f1b"],
            recompute=["none"],
            memory_headroom=0,
            workers=1,
        )
        for spec in (GPT, tied)
    ]
    (untied_point,), (tied_point,) = (p.points for p in plans)
    assert tied_point.pipeline_time_ns == untied_point.pipeline_time_ns
    assert tied_point.step_time_ns - untied_point.step_time_ns == 320 + 2_000  # type: ignore[operator]
    # a V schedule puts the first and the last stage on one rank: one copy, nothing to sync
    v_steps = {
        plan(
            spec,
            devices=2,
            accelerator=_accelerator(),
            global_batch=2,
            tensor=[1],
            stages=[2],
            microbatch_sizes=[1],
            virtual=[2],
            schedules=["zbv"],
            recompute=["none"],
            memory_headroom=0,
            workers=1,
        )
        .points[0]
        .step_time_ns
        for spec in (GPT, tied)
    }
    assert len(v_steps) == 1


_THREE_POOLS = """
import threading, time
from pipesim.plan import backends

def evaluate(chunk, context):
    return [(item, item) for item in chunk]

if __name__ == "__main__":
    methods = []
    for _ in range(3):
        methods.append(backends._start_method())
        pool = backends.ProcessPool(object(), evaluate=evaluate, workers=2)
        assert sorted(pool.results([[1], [2]], deadline=time.monotonic() + 60)) == [
            [(1, 1)], [(2, 2)]
        ]
        pool.close()
    print(*methods, threading.active_count())
"""


@pytest.mark.slow
def test_a_closed_pool_leaves_one_thread_so_the_next_sweep_forks(tmp_path: Path) -> None:
    # A closed pool's manager thread must be gone before the next sweep picks its start
    # method: two live threads would send that sweep to forkserver (workers that are not
    # this process's children). A fresh interpreter, since pytest's own may run threads.
    script = tmp_path / "three_pools.py"
    script.write_text(_THREE_POOLS)
    done = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["fork", "fork", "fork", "1"]
