"""The op-level GPU model: each kernel priced by hand, and a layer as the sum of its parts.

Oracles: the FLOP formulas of Narayanan et al. 2021 / Qi et al. 2024 (``pipesim.plan.layers``,
closed forms checked against the papers in test_plan_model), the ring bus-bandwidth
formulas worked by hand, tile and wave counts worked by hand.
"""

from __future__ import annotations

import dataclasses

import pytest
from helpers import TINY_LLAMA as LLAMA
from helpers import hand_accelerator, load_benchmark

from pipesim.errors import PlanError
from pipesim.plan.gpu import (
    collective_seconds,
    gemm_seconds,
    kernel_seconds,
    layer_times,
    price_layer,
    wave_utilization,
)
from pipesim.plan.hardware import Accelerator, get_accelerator
from pipesim.plan.kernels import (
    Attention,
    Collective,
    Gemm,
    Kernel,
    Shard,
    Streaming,
    block_kernels,
    embedding_kernels,
    head_kernels,
)
from pipesim.plan.layers import embedding, lm_head, transformer_block
from pipesim.plan.model import ModelSpec

# s=64, h=32, a=4, f=128, bf16, dropout, unfused attention (GPT shapes)
GPT = ModelSpec(n_layers=2, hidden=32, n_heads=4, seq_length=64, vocab_size=100)


def _device(**changes: object) -> Accelerator:
    return hand_accelerator(
        **(
            dict(
                intra_node_bandwidth=1e11,
                inter_node_latency=1e-5,
                inter_node_bandwidth=1e10,
                memory_bandwidth=1e12,
            )
            | changes
        )
    )


def _gemm_flops(kernels: tuple[object, ...]) -> int:
    return sum(k.flops for k in kernels if isinstance(k, Gemm))


@pytest.mark.parametrize("tensor", [1, 2, 4])
@pytest.mark.parametrize("recompute", ["none", "selective", "full"])
def test_gemm_flops_of_a_block_are_narayanan_and_qi(tensor: int, recompute: str) -> None:
    # the kernels' GEMMs (unfused attention: two batched GEMMs) are exactly the FLOPs
    # of the closed forms: F = 24sh^2 + 4s^2h, I = F's weight matmuls + 8s^2h, W = 24sh^2
    k = block_kernels(GPT, Shard(tensor=tensor, recompute=recompute))
    formula = transformer_block(GPT, tensor=tensor, recompute=recompute)
    assert _gemm_flops(k.forward) == formula.forward_flops
    assert _gemm_flops(k.input_grad) == formula.input_grad_flops
    assert _gemm_flops(k.weight_grad) == formula.weight_grad_flops


def test_gemm_flops_scale_with_the_microbatch_and_the_head_is_2shv() -> None:
    one = block_kernels(GPT, Shard())
    four = block_kernels(GPT, Shard(microbatch_size=4))
    assert _gemm_flops(four.forward) == 4 * _gemm_flops(one.forward)
    head = head_kernels(GPT, Shard(tensor=2))
    for kernels in (head.forward, head.input_grad, head.weight_grad):
        assert _gemm_flops(kernels) == lm_head(GPT, tensor=2).forward_flops == 64 * 32 * 100
    assert _gemm_flops(embedding_kernels(GPT, Shard()).forward) == embedding(GPT).forward_flops


def test_the_loss_moves_the_bytes_of_megatrons_unfused_cross_entropy() -> None:
    # VocabParallelCrossEntropy, line by line over T x V/t logits of d bytes: to fp32
    # (d + 4), max (4), -= max (8), exp (8), sum (4), div_ (8); backward: mul_ (8) and
    # autograd's cast back to d (4 + d)
    s, v, d = GPT.seq_length, GPT.vocab_size, 2
    head = head_kernels(GPT, Shard(tensor=2, microbatch_size=3))
    elems = 3 * s * (v // 2)

    def loss_bytes(kernels: tuple[Kernel, ...]) -> int:
        return sum(
            k.bytes_moved
            for k in kernels
            if isinstance(k, Streaming) and k.name.startswith("cross entropy")
        )

    assert loss_bytes(head.forward) == elems * (d + 4 + 4 + 8 + 8 + 4 + 8)
    assert loss_bytes(head.input_grad) == elems * (8 + 4 + d)


def test_flash_attention_counts_the_causal_half_and_a_backward_of_five_matmuls() -> None:
    # FlashAttention-2 (Dao 2023): causal skips the upper triangle; the backward
    # recomputes the scores: 5 matmuls against the forward's 2
    s, h = LLAMA.seq_length, LLAMA.hidden
    k = block_kernels(LLAMA, Shard(microbatch_size=2))
    (fwd,) = [x for x in k.forward if isinstance(x, Attention)]
    (bwd,) = [x for x in k.input_grad if isinstance(x, Attention)]
    assert fwd.flops == 2 * (4 * s * s * h) // 2
    assert bwd.flops == fwd.flops * 5 // 2 and bwd.backward
    # GQA: the QKV GEMM's width is h + 2 kv (kv = 64 / 8 * 2 = 16); SwiGLU: two up matrices
    qkv = next(x for x in k.forward if isinstance(x, Gemm) and x.name == "qkv")
    up = next(x for x in k.forward if isinstance(x, Gemm) and x.name == "mlp up")
    assert (qkv.m, qkv.n, qkv.k) == (2 * s, h + 2 * 16, h)
    assert (up.m, up.n, up.k) == (2 * s, 2 * 160, h)


def test_wave_and_tile_utilization_by_hand() -> None:
    # 4 SMs. 256x256: four 128x128 tiles fill one wave exactly
    assert wave_utilization(256, 256, sm_count=4) == 1.0
    # 256x384: six 128x128 tiles (2 waves, 8 slots), three 256x128 (1 wave, 4 slots),
    # four 128x256 (the last half empty): every choice fills 3/4
    assert wave_utilization(256, 384, sm_count=4) == 0.75
    # 100x100 on one SM: the best tile (128x128) is 10000 / 16384 full
    assert wave_utilization(100, 100, sm_count=1) == pytest.approx(10000 / 16384)
    assert wave_utilization(7, 9, sm_count=None) == 1.0  # unknown SMs: not modeled


def test_a_gemm_is_its_flops_at_the_achieved_rate_or_its_bytes() -> None:
    acc = _device(matmul_efficiency=0.8, sm_count=4, memory_bandwidth=1e15)
    g = Gemm("g", 256, 384, 1000)
    # (1.5 MB of operands at 1e15 B/s is far below the compute time)
    # 2 m n k FLOPs at 0.8 x 1e15 x 0.75 (wave utilization)
    assert gemm_seconds(g, acc, dtype_bytes=2) == pytest.approx(
        2 * 256 * 384 * 1000 / (1e15 * 0.8 * 0.75)
    )
    # k = 1: reading and writing the operands bounds it: (m k + k n + m n) x 2 bytes
    thin = Gemm("thin", 4096, 4096, 1)
    by_bytes = (4096 + 4096 + 4096 * 4096) * 2 / (1e12 * 0.5)
    assert gemm_seconds(thin, _device(memory_efficiency=0.5), dtype_bytes=2) == pytest.approx(
        by_bytes
    )
    # FP8 on the linear layers: the FP8 peak and 1-byte operands
    fp8 = _device(fp8_peak_flops=2e15, memory_bandwidth=1e15)
    assert gemm_seconds(g, fp8, dtype_bytes=2, fp8=True) == pytest.approx(g.flops / 2e15)
    bmm = dataclasses.replace(g, low_precision=False)  # attention's batched GEMMs stay bf16
    assert gemm_seconds(bmm, fp8, dtype_bytes=2, fp8=True) == pytest.approx(g.flops / 1e15)
    with pytest.raises(PlanError, match="no FP8 tensor cores"):
        gemm_seconds(g, acc, dtype_bytes=2, fp8=True)


def test_streaming_and_attention_kernels_by_hand() -> None:
    acc = _device(memory_efficiency=0.8, attention_forward_efficiency=0.5,
                  attention_backward_efficiency=0.25)  # fmt: skip
    shard = Shard()
    # 8 GB at 1e12 B/s x 0.8
    assert kernel_seconds(
        Streaming("x", 8 * 10**9), acc, shard=shard, dtype_bytes=2
    ) == pytest.approx(0.01)
    assert kernel_seconds(Attention("a", 10**15), acc, shard=shard, dtype_bytes=2) == pytest.approx(
        2.0
    )
    assert kernel_seconds(
        Attention("b", 10**15, backward=True), acc, shard=shard, dtype_bytes=2
    ) == pytest.approx(4.0)


def test_norm_and_residual_bytes_by_hand() -> None:
    # GPT block at b = 1, t = 1, bf16: LayerNorm reads x and writes y (2 s h d), its
    # backward reads x, dy, writes dx and reads x, dy again (5 s h d); the fused bias +
    # dropout + residual add reads two, writes one and the 1-byte mask (3 s h d + s h)
    s, h, d = 64, 32, 2
    k = block_kernels(GPT, Shard())
    by_name = {x.name: x for x in (*k.forward, *k.input_grad) if isinstance(x, Streaming)}
    assert by_name["norm 1"].bytes_moved == 2 * s * h * d
    assert by_name["norm 1 (backward)"].bytes_moved == 5 * s * h * d
    assert by_name["residual 1"].bytes_moved == 3 * s * h * d + s * h
    # softmax over a s^2 scores: read and write (4 heads, 64 x 64)
    assert by_name["softmax"].bytes_moved == 2 * 4 * s * s * d
    # with sequence parallelism the norms see s / t tokens
    sp = block_kernels(GPT, Shard(tensor=2, sequence_parallel=True))
    norm = next(x for x in sp.forward if x.name == "norm 1")
    assert isinstance(norm, Streaming) and norm.bytes_moved == 2 * (s // 2) * h * d


def _kinds(kernels: tuple[object, ...]) -> list[str]:
    return [x.kind for x in kernels if isinstance(x, Collective)]


def test_tensor_parallel_collectives_of_a_block() -> None:
    # Narayanan et al. 2021: two all-reduces forward, two backward; with sequence
    # parallelism (Korthikanti et al. 2023) each becomes a reduce-scatter + all-gather,
    # and each column-parallel linear (qkv, mlp up) all-gathers its input once more in
    # the backward for its weight gradient (Megatron-LM's tensor_parallel/layers.py)
    kinds = _kinds
    plain = block_kernels(GPT, Shard(tensor=2))
    assert kinds(plain.forward) == ["all-reduce"] * 2
    assert kinds(plain.input_grad) == ["all-reduce"] * 2
    sp = block_kernels(GPT, Shard(tensor=2, sequence_parallel=True))
    assert kinds(sp.forward) == ["all-gather", "reduce-scatter"] * 2
    # per half: the backward of the reduce-scatter (an all-gather), the input's
    # all-gather again, the backward of the forward all-gather (a reduce-scatter)
    assert kinds(sp.input_grad) == ["all-gather", "all-gather", "reduce-scatter"] * 2
    full = block_kernels(GPT, Shard(tensor=2, recompute="full"))
    assert kinds(full.input_grad) == ["all-reduce"] * 4  # the forward's again
    assert kinds(block_kernels(GPT, Shard()).forward) == []
    sizes = {x.size_bytes for x in sp.forward if isinstance(x, Collective)}
    assert sizes == {64 * 32 * 2}  # the whole s h bf16 activation


def test_sequence_parallel_backward_gathers_each_column_parallel_input_again() -> None:
    # the all-gather runs just before the input-gradient GEMM of the linear it feeds
    # (Megatron-LM launches it there), the same bytes as the forward's: s h d
    s, h, d = GPT.seq_length, GPT.hidden, 2
    sp = block_kernels(GPT, Shard(tensor=2, sequence_parallel=True))
    names = [k.name for k in sp.input_grad]
    for gather, gemm in (
        ("all-gather before mlp (again, for the weight gradient)", "mlp up (input grad)"),
        ("all-gather before qkv (again, for the weight gradient)", "qkv (input grad)"),
    ):
        i = names.index(gather)
        assert names[i + 1] == gemm
        assert sp.input_grad[i].size_bytes == s * h * d
    head = head_kernels(GPT, Shard(tensor=2, sequence_parallel=True))
    head_names = [k.name for k in head.input_grad]
    i = head_names.index("all-gather before head (again, for the weight gradient)")
    assert head_names[i + 1] == "lm head (input grad)"
    # without sequence parallelism the input is whole: nothing to gather
    assert "all-gather" not in _kinds(block_kernels(GPT, Shard(tensor=2)).input_grad)
    # exposed without comm overlap: on a 1e11 B/s link (x 0.5) each costs (n-1)/n S / bw
    acc = _device(intra_node_efficiency=0.5)
    shard = Shard(tensor=2, sequence_parallel=True)
    plain = price_layer(sp, acc, shard=shard, dtype_bytes=2)
    one = (1 / 2) * s * h * d / 5e10 + 1e-6
    gathers = 4 * one  # two backwards of the reduce-scatters, two gathers again
    scatters = 2 * one
    assert plain.input_grad.tp_comm_s == pytest.approx(gathers + scatters)
    # with --tp-comm-overlap each all-gather hides under the input-gradient GEMM it
    # feeds, each reduce-scatter under the GEMM that made it (for the column-parallel
    # input gradient: the same GEMM, standing for Transformer Engine's bulk overlap of it
    # with the weight-gradient GEMM of the same FLOPs)
    slow = _device(intra_node_bandwidth=1e9)
    hidden = price_layer(sp, slow, shard=shard, dtype_bytes=2, tp_comm_overlap=True)
    secs = {k.name: kernel_seconds(k, slow, shard=shard, dtype_bytes=2) for k in sp.input_grad}
    comm = 1 / 2 * s * h * d / 1e9 + 1e-6  # every collective of the pass: the same size
    hosts = (
        "mlp down (input grad)",  # the backward of the reduce-scatter after it
        "mlp up (input grad)",  # its input gathered again
        "mlp up (input grad)",  # the reduce-scatter of its output
        "attention projection (input grad)",
        "qkv (input grad)",
        "qkv (input grad)",
    )
    expected = sum(max(0.0, comm - secs[gemm]) for gemm in hosts)
    assert hidden.input_grad.tp_exposed_s == pytest.approx(expected)
    assert hidden.input_grad.tp_exposed_s > 0


def test_tensor_parallel_overlap_takes_sms_from_the_gemm_it_hides_under() -> None:
    # Transformer Engine's userbuffers: reduce-scatters ("pipeline", "bulk") and the
    # weight gradient's all-gather ("bulk") keep 16 SMs; ring-exchange all-gathers none.
    # On 132 SMs the GEMM that hides one runs 132 / 116 as long.
    acc = _device(sm_count=132)
    shard = Shard(tensor=2, sequence_parallel=True)
    kernels = block_kernels(GPT, shard)
    plain = price_layer(kernels, acc, shard=shard, dtype_bytes=2)
    hidden = price_layer(kernels, acc, shard=shard, dtype_bytes=2, tp_comm_overlap=True)
    for part, slowed in (
        ("forward", ("attention projection", "mlp down")),
        ("input_grad", ("mlp up (input grad)", "qkv (input grad)")),
    ):
        gemms = getattr(kernels, part)
        extra = sum(
            kernel_seconds(k, acc, shard=shard, dtype_bytes=2) * (132 / 116 - 1)
            for k in gemms
            if k.name in slowed
        )
        got = getattr(hidden, part).compute_s - getattr(plain, part).compute_s
        assert got == pytest.approx(extra)
    assert hidden.weight_grad.compute_s == plain.weight_grad.compute_s


def test_collectives_on_the_link_of_their_group() -> None:
    acc = _device(intra_node_efficiency=0.5)
    reduce = Collective("r", "all-reduce", "tensor", 8 * 10**6)
    # ring all-reduce over 4: 2 (n-1)/n S / busbw + 2 (n-1) latency, busbw 1e11 x 0.5
    expected = 2 * 3 / 4 * 8e6 / 5e10 + 6 * 1e-6
    assert collective_seconds(reduce, acc, shard=Shard(tensor=4)) == pytest.approx(expected)
    # a tensor-parallel group wider than a node uses the inter-node link, at the NICs of
    # its 8 members in a node (8 x 1e10), no more than the NVLink ring (5e10)
    wide = collective_seconds(reduce, acc, shard=Shard(tensor=16))
    assert wide == pytest.approx(2 * 15 / 16 * 8e6 / 5e10 + 30 * 1e-5)
    # a context-parallel group t = 8 apart has one member a node: one NIC
    gather = Collective("g", "all-gather", "context", 8 * 10**6)
    across = collective_seconds(gather, acc, shard=Shard(tensor=8, context=2))
    assert across == pytest.approx(1 / 2 * 8e6 / 1e10 + 1e-5)
    # ... and 4 apart, two a node: two NICs
    two = collective_seconds(gather, acc, shard=Shard(tensor=4, context=4))
    assert two == pytest.approx(3 / 4 * 8e6 / 2e10 + 3 * 1e-5)
    # the context-parallel ring: c - 1 messages of one chunk
    ring = Collective("kv", "ring", "context", 10**6, steps=3)
    assert collective_seconds(ring, acc, shard=Shard(context=4)) == pytest.approx(
        3 * (1e-6 + 1e6 / 5e10)
    )


def test_a_layer_is_the_sum_of_its_kernels() -> None:
    acc = get_accelerator("h100-sxm")
    for spec, shard in (
        (GPT, Shard(tensor=2, microbatch_size=2)),
        (GPT, Shard(tensor=2, sequence_parallel=True, recompute="selective")),
        (LLAMA, Shard(tensor=2, context=2, sequence_parallel=True)),
    ):
        kernels = block_kernels(spec, shard)
        priced = price_layer(kernels, acc, shard=shard, dtype_bytes=2)
        for name, part in kernels.passes().items():
            seconds = [kernel_seconds(k, acc, shard=shard, dtype_bytes=2) for k in part]
            compute = sum(
                t for k, t in zip(part, seconds, strict=True) if not isinstance(k, Collective)
            )
            comm = sum(t for k, t in zip(part, seconds, strict=True) if isinstance(k, Collective))
            got = getattr(priced, name)
            assert got.compute_s == pytest.approx(compute)
            assert got.tp_comm_s + got.cp_comm_s == pytest.approx(comm)
            # no overlap asked: tensor-parallel comm is all exposed
            assert got.tp_exposed_s == pytest.approx(got.tp_comm_s)
            assert got.total_s == pytest.approx(compute + got.tp_exposed_s + got.cp_exposed_s)


def test_tensor_parallel_overlap_hides_each_collective_under_its_gemm() -> None:
    acc = _device(intra_node_bandwidth=1e9)  # slow links: comm longer than the GEMMs
    shard = Shard(tensor=2, sequence_parallel=True)
    kernels = block_kernels(GPT, shard)
    hidden = price_layer(kernels, acc, shard=shard, dtype_bytes=2, tp_comm_overlap=True)
    seconds = {k.name: kernel_seconds(k, acc, shard=shard, dtype_bytes=2) for k in kernels.forward}
    # all-gathers under the GEMM they feed, reduce-scatters under the GEMM that made them
    expected = (
        max(0.0, seconds["all-gather before qkv"] - seconds["qkv"])
        + max(0.0, seconds["after attention projection"] - seconds["attention projection"])
        + max(0.0, seconds["all-gather before mlp"] - seconds["mlp up"])
        + max(0.0, seconds["after mlp down"] - seconds["mlp down"])
    )
    assert hidden.forward.tp_exposed_s == pytest.approx(expected)
    assert 0 < hidden.forward.tp_exposed_s < hidden.forward.tp_comm_s


def test_context_parallel_splits_the_sequence_and_rings_keys_and_values() -> None:
    s, kv, d = LLAMA.seq_length, 16, 2
    one = block_kernels(LLAMA, Shard())
    two = block_kernels(LLAMA, Shard(context=2))
    attention = [x.flops for x in one.forward if isinstance(x, Attention)]
    assert [x.flops for x in two.forward if isinstance(x, Attention)] == [attention[0] // 2]
    (ring,) = [x for x in two.forward if isinstance(x, Collective)]
    assert (ring.kind, ring.steps, ring.size_bytes) == ("ring", 1, 2 * (s // 2) * kv * d)
    # the exchange hides under the attention it feeds: only what is longer is exposed
    acc = _device(intra_node_bandwidth=1e6)  # a slow ring
    priced = price_layer(two, acc, shard=Shard(context=2), dtype_bytes=2)
    attention_s = kernel_seconds(
        next(x for x in two.forward if isinstance(x, Attention)), acc, shard=Shard(), dtype_bytes=2
    )
    assert priced.forward.cp_exposed_s == pytest.approx(priced.forward.cp_comm_s - attention_s)
    with pytest.raises(PlanError, match="needs fused \\(flash\\) attention"):
        block_kernels(GPT, Shard(context=2))
    with pytest.raises(PlanError, match="2 x 3 equal chunks"):
        block_kernels(LLAMA, Shard(context=3))


def test_fp8_prices_the_linear_gemms_at_the_fp8_peak() -> None:
    h100 = get_accelerator("h100-sxm")
    shard = Shard(tensor=2)
    bf16 = layer_times(LLAMA, shard, h100)["block"]
    fp8 = layer_times(dataclasses.replace(LLAMA, dtype="fp8"), shard, h100)["block"]
    assert fp8.weight_grad.compute_s < bf16.weight_grad.compute_s
    # attention is unchanged: the difference is the GEMMs, less the bytes Transformer
    # Engine's FP8 casts add to the streaming kernels (their bytes: tests/test_plan_fp8.py)
    fp8_spec = dataclasses.replace(LLAMA, dtype="fp8")
    gemms = [k for k in block_kernels(LLAMA, shard).forward if isinstance(k, Gemm)]
    saved = sum(
        gemm_seconds(g, h100, dtype_bytes=2) - gemm_seconds(g, h100, dtype_bytes=2, fp8=True)
        for g in gemms
    )
    streamed = [
        sum(k.bytes_moved for k in block_kernels(spec, shard).forward if isinstance(k, Streaming))
        for spec in (LLAMA, fp8_spec)
    ]
    cast_s = (streamed[1] - streamed[0]) / h100.achieved_memory_bandwidth
    assert cast_s > 0
    assert bf16.forward.compute_s - fp8.forward.compute_s == pytest.approx(saved - cast_s)


def test_no_accelerator_number_comes_from_a_published_run_it_is_checked_against() -> None:
    # The presets are the hardware's, from datasheets and microbenchmarks: a number taken
    # from (or fitted to) the runs bench_published.py predicts would make that check
    # circular. Every source names where it comes from; none may name those runs.
    import json
    from importlib import resources

    # the tables of benchmarks/bench_published.py, by author, title and file, and
    # the throughput benchmarks/bench_moe_published.py checks (DeepSeek-V3's GPU hours;
    # the H800's link figures come from the same report's hardware sections), and NVIDIA's
    # measured runs (the Megatron-Bridge and NeMo performance summaries), and Transformer
    # Engine's Getting Started layer (the benchmark's direct H100 check)
    words = ("Korthikanti", "Narayanan", "Reducing Activation Recomputation",
             "Efficient Large-Scale", "model_table", "weak scaling", "weak-scaling",
             "GPU hours", "GPU-hours", "180K",
             "Grattafiori", "Dubey", "Herd of Models", "2407.21783",
             "performance-summary", "performance_summary", "performance summary",
             "Megatron-Bridge", "DGX Cloud Benchmarking", "NeMo",
             "getting_started", "Getting Started")  # fmt: skip
    data = json.loads(resources.files("pipesim").joinpath("data/accelerators.json").read_text())
    tables = json.loads(resources.files("pipesim").joinpath("data/gemm_tables.json").read_text())
    sources = [
        *(
            (f"{name}.{key}", text)
            for name, entry in data["accelerators"].items()
            for key, text in entry.items()
            if key.endswith("_source")
        ),
        *((f"gemm table {name}", entry["source"]) for name, entry in tables["tables"].items()),
    ]
    for where, text in sources:
        assert text.strip(), where
        found = [w for w in words if w.lower() in text.lower()]
        assert not found, f"{where} cites a checked run: {found}"


@pytest.mark.slow
def test_every_published_run_fits_pipesim_memory_model() -> None:
    # The runs of benchmarks/bench_published.py trained on their GPUs as configured:
    # pipesim must find each configuration fits (no headroom: the run did fit), and
    # simulate it. (How close the times are is the benchmark's to report, not a test's.)
    bench = load_benchmark("bench_published")
    for table in bench.TABLES:
        if not table.must_fit:  # a gap the benchmark prints and docs/planner-model.md names
            continue
        for run in table.runs:
            point = bench.predict(table, run)
            assert point.fits, f"{table.title}: {run.name}: {point.reason}"
            assert point.step_time_ns and point.step_time_ns > 0


def test_recomputation_adds_to_the_backward_the_forward_it_repeats_by_hand() -> None:
    # Korthikanti et al. 2023, Table 4 prices the 22B's layer in each mode; the rules
    # behind pipesim's rows, on GPT at t = 2 (2 heads a device, s = 64, head size 8, bf16,
    # dropout, unfused attention): full recomputation runs the whole forward again before
    # the backward; selective the core attention only (the scores GEMM, softmax, attention
    # dropout, context GEMM and the permute back), worked out here kernel by kernel
    acc = _device()
    s, h, d, heads, dh = 64, 32, 2, 2, 8
    times = {
        mode: layer_times(GPT, Shard(tensor=2, recompute=mode), acc)["block"]
        for mode in ("none", "full", "selective")
    }
    none, full, selective = times["none"], times["full"], times["selective"]
    for mode in (full, selective):  # recomputation leaves F and W as they are
        assert mode.forward == none.forward
        assert mode.weight_grad == none.weight_grad
    assert full.input_grad.total_s == pytest.approx(none.input_grad.total_s + none.forward.total_s)
    scores = heads * s * s  # the s x s probabilities of the device's heads
    streamed = (2 * scores * d) + (2 * scores * d + scores) + 2 * (s * h // 2) * d
    hand = (
        gemm_seconds(Gemm("scores", s, s, dh, heads), acc, dtype_bytes=d)
        + gemm_seconds(Gemm("context", s, dh, s, heads), acc, dtype_bytes=d)
        + streamed / (acc.memory_bandwidth * acc.memory_efficiency)
    )
    assert selective.input_grad.total_s - none.input_grad.total_s == pytest.approx(hand)


def test_the_benchmark_prices_table4_on_the_22b_block_of_table3() -> None:
    # benchmarks/bench_published.py's direct check of the layer model prices each Table 4
    # row on the 22B block as Table 3 runs it (t = 8, micro-batch 4), in the row's mode
    bench = load_benchmark("bench_published")
    run = bench.TABLE4_RUN
    assert (run.name, run.hidden, run.heads, run.tensor, run.microbatch) == (
        "22B full",
        6144,
        64,
        8,
        4,
    )
    for row in bench.TABLE4:
        spec = bench.TABLES[0].model(run)
        shard = Shard(tensor=8, microbatch_size=4, recompute=row.recompute,
                      sequence_parallel=row.sequence_parallel)  # fmt: skip
        expected = layer_times(spec, shard, get_accelerator("a100-80gb"))["block"]
        assert bench.layer_time(row) == expected


def test_the_benchmark_prices_the_te_getting_started_layer_as_its_script_builds_it() -> None:
    # benchmarks/bench_published.py's direct H100 check: Transformer Engine v2.12's
    # docs/getting_started/getting_started_pytorch.py times one GPT layer of hidden 4096,
    # ffn 16384, 32 heads, sequence 2048, batch 8 on one GPU; its bf16 row with dropout
    # 0.1, its te.TransformerLayer row in FP8 with dropout 0
    bench = load_benchmark("bench_published")
    assert Shard(microbatch_size=8, tensor=1) == bench.TE_GETTING_STARTED_SHARD
    rows = {(row.dtype, row.dropout) for row in bench.TE_GETTING_STARTED}
    assert rows == {("bf16", True), ("fp8", False)}
    for row in bench.TE_GETTING_STARTED:
        spec = bench.te_getting_started_model(row)
        assert (spec.hidden, spec.ffn_hidden, spec.n_heads, spec.seq_length) == (
            4096,
            16384,
            32,
            2048,
        )
        assert spec.flash_attention and spec.bias and not spec.gated_mlp
        assert (spec.dtype, spec.dropout, spec.fp8_recipe) == (row.dtype, row.dropout, "delayed")
