"""Model presets, per-layer formulas (hand-computed cases) and accelerator presets."""

from __future__ import annotations

import json
from importlib import resources

import pytest

from pipesim.errors import ParseError, PlanError, UnknownNameError
from pipesim.plan.hardware import (
    EFFICIENCIES,
    accelerator_names,
    get_accelerator,
    load_accelerator,
)
from pipesim.plan.layers import (
    embedding,
    lm_head,
    model_flops_per_sequence,
    model_layers,
    transformer_block,
)
from pipesim.plan.model import ModelSpec, get_model, model_from_dict, model_names

# A tiny GPT-style model worked by hand: s=4, h=8, a=2, V=10, f=4h=32, bf16, dropout.
GPT = ModelSpec(n_layers=3, hidden=8, n_heads=2, seq_length=4, vocab_size=10)
# A tiny Llama-style model: GQA (4 heads, 2 KV heads: kv width 4), f=12, SwiGLU,
# no biases (RMSNorm), rotary positions, no dropout, flash attention.
LLAMA = ModelSpec(
    n_layers=2,
    hidden=8,
    n_heads=4,
    n_kv_heads=2,
    ffn_hidden=12,
    seq_length=4,
    vocab_size=10,
    gated_mlp=True,
    bias=False,
    learned_positions=False,
    dropout=False,
    flash_attention=True,
)


def test_gpt_block_by_hand() -> None:
    block = transformer_block(GPT)
    # params 12 h^2 + 13 h = 768 + 104 (Narayanan et al. 2021)
    assert block.params == 872
    # F = 24 s h^2 + 4 s^2 h = 6144 + 512; I adds the attention term again; W = 24 s h^2
    assert block.forward_flops == 6656
    assert block.input_grad_flops == 6144 + 1024
    assert block.weight_grad_flops == 6144
    assert block.backward_flops == 2 * block.forward_flops  # Narayanan: backward = 2 forward
    # Korthikanti et al. 2023: s h (34 + 5 a s / h) = 4*8*34 + 5*2*16 = 1088 + 160
    assert block.activation_bytes == 1248
    # what W still needs: inputs of QKV, out-proj, fc1 (2sh each) and fc2 (2sf) = 14 s h
    # = 448, and the output gradients I hands it: QKV 2*s*3h = 192, out-proj 2sh = 64,
    # fc1 2*s*4h = 256, fc2 2sh = 64 -> 576 = 18 s h; 32 s h, Qi et al. 2024's M_W
    assert block.weight_grad_bytes == 448 + 576 == 32 * 4 * 8


def test_llama_block_by_hand() -> None:
    block = transformer_block(LLAMA)
    # params: QKV 8*(8+2*4)=128, out 64, MLP 3*8*12=288, two RMSNorms 16
    assert block.params == 496
    # weight matmuls: QKV 2*4*8*16=1024, out 2*4*64=512, MLP 3*2*4*8*12=2304 -> 3840;
    # attention: 4 s^2 h = 512
    assert block.forward_flops == 3840 + 512
    assert block.input_grad_flops == 3840 + 1024
    assert block.weight_grad_flops == 3840
    # attention: LN in 64, QKV in 64, Q and K 2*4*(8+4)=96, V 2*4*4=32, out-proj in 64,
    # flash log-sum-exp 4*a*s=64 -> 384; MLP: LN in 64, fc1 in 64, gate and up 2*2*4*12=192,
    # fc2 in 2*4*12=96 -> 416
    assert block.activation_bytes == 384 + 416
    # W: inputs QKV, out-proj, fc1 64 each, fc2 96 = 288; output gradients: QKV
    # 2*4*(8+2*4) = 128, out-proj 64, gate and up 2*2*4*12 = 192, fc2 64 -> 448
    assert block.weight_grad_bytes == 3 * 64 + 96 + 128 + 64 + 192 + 64 == 736


def test_full_recomputation_w_holds_more_than_f_stored() -> None:
    # GPT block, t=2 with sequence parallelism, full recomputation: F stores the block
    # input only, 2sh/2 = 32 bytes; I re-creates the forward, so W holds its matmul
    # inputs (QKV and fc1 inputs 2*2sh/2 = 64; out-proj and fc2 inputs (2sh + 2*s*4h)/2
    # = 160) and the output gradients (column-parallel QKV and fc1 (2*s*3h + 2*s*4h)/2 =
    # 224; row-parallel out-proj and fc2 whole, 2*2sh = 128): 576 bytes, 18x what F kept.
    block = transformer_block(GPT, tensor=2, sequence_parallel=True, recompute="full")
    assert block.activation_bytes == 32
    assert block.weight_grad_bytes == 64 + 160 + 224 + 128 == 576


def test_embedding_and_head_by_hand() -> None:
    emb, head = embedding(GPT), lm_head(GPT)
    assert emb.params == 10 * 8 + 4 * 8  # tokens + learned positions
    assert emb.forward_flops == emb.input_grad_flops == emb.weight_grad_flops == 0
    assert emb.activation_bytes == 8 * 4 + 4 * 8  # int64 ids + dropout mask
    assert emb.weight_grad_bytes == 32 + 2 * 4 * 8  # ids + the output gradient (bf16 s h)
    assert head.params == 10 * 8 + 2 * 8  # projection + final LayerNorm
    assert head.forward_flops == head.input_grad_flops == head.weight_grad_flops == 2 * 4 * 8 * 10
    # final-norm input 64 + projection input 64 + fp32 logits 4*s*V = 160
    assert head.activation_bytes == 288
    # projection input 64 + the logits' gradient (bf16) 2*s*V = 80
    assert head.weight_grad_bytes == 64 + 80
    layers = model_layers(GPT)
    assert [x.name for x in layers] == ["embedding", "block", "block", "block", "head"]


def test_model_flops_match_narayanan_closed_form() -> None:
    for name in ("gpt3-1.3b", "gpt3-13b", "gpt3-175b"):
        spec = get_model(name)
        s, l, h, v = spec.seq_length, spec.n_layers, spec.hidden, spec.vocab_size
        # 72 B s l h^2 (1 + s/(6h) + V/(12 h l)) with B = 1
        assert model_flops_per_sequence(spec) == 72 * s * l * h * h + 12 * s * s * l * h + (
            6 * s * h * v
        )


def test_gpt3_175b_activation_matches_korthikanti() -> None:
    spec = get_model("gpt3-175b")
    s, h, a = spec.seq_length, spec.hidden, spec.n_heads
    assert transformer_block(spec).activation_bytes == s * h * 34 + 5 * a * s * s


@pytest.mark.parametrize(
    ("name", "billions"),
    [
        ("gpt3-1.3b", 1.3),
        ("gpt3-2.7b", 2.7),
        ("gpt3-6.7b", 6.7),
        ("gpt3-13b", 13),
        ("gpt3-175b", 175),
        ("llama2-7b", 7),
        ("llama2-13b", 13),
        ("llama2-70b", 70),
        ("llama3-8b", 8),
        ("llama3-70b", 70),
    ],
)
def test_presets_have_the_parameter_count_they_are_named_by(name: str, billions: float) -> None:
    assert abs(get_model(name).n_params / (billions * 1e9) - 1) < 0.04
    assert get_model(name).name == name


def test_every_preset_number_carries_a_source() -> None:
    data = resources.files("pipesim").joinpath("data")
    models = json.loads(data.joinpath("models.json").read_text())["models"]
    assert set(models) == set(model_names())
    for entry in models.values():
        assert len(entry["source"]) > 20
    accelerators = json.loads(data.joinpath("accelerators.json").read_text())["accelerators"]
    assert set(accelerators) == set(accelerator_names()) >= {"a100-80gb", "h100-sxm", "h200"}
    for name, entry in accelerators.items():
        numbers = [k for k, v in entry.items() if isinstance(v, int | float)]
        # every field the planner prices with is there, each with its source
        required = {"peak_flops", "memory_bytes", "memory_bandwidth", "gpus_per_node"}
        assert required | set(EFFICIENCIES) <= set(numbers), name
        for key in numbers:
            assert len(entry[f"{key}_source"]) > 10, (name, key)


def test_accelerator_presets() -> None:
    h100 = get_accelerator("h100-sxm")
    assert h100.peak_flops == 989e12
    # Capacity as the driver reports it (NVML total in MiB, published per GPU in the
    # preset's source), not the datasheet's round "80GB" read as 10**9 bytes.
    assert h100.memory_bytes == 81_559 * 2**20 != 80 * 10**9
    # the link at NCCL's measured bus bandwidth: the datasheet's times the measured share
    assert h100.inter_node_bandwidth == 50e9
    assert h100.link(inter_node=True).bandwidth_bytes_per_s == 50e9 * h100.inter_node_efficiency
    assert get_accelerator("h200").memory_bytes == 143_771 * 2**20
    assert get_accelerator("a100-80gb").memory_bytes == 80 * 2**30
    assert get_accelerator("a100-40gb").memory_bytes == 40 * 2**30


def test_custom_accelerator_file(tmp_path) -> None:  # type: ignore[no-untyped-def]
    entry = get_accelerator("a100-80gb").to_dict() | {"name": "mine", "memory_bytes": 24e9}
    path = tmp_path / "acc.json"
    path.write_text(json.dumps(entry))
    assert load_accelerator(path).memory_bytes == 24 * 10**9
    path.write_text(json.dumps(entry | {"matmul_efficiency": 1.5}))
    with pytest.raises(
        PlanError, match="matmul_efficiency is a measured share of a peak, between 0 and 1"
    ):
        load_accelerator(path)
    # a file written for the one-efficiency model is refused, naming what replaced it
    old = {k: v for k, v in entry.items() if k not in EFFICIENCIES} | {"efficiency": 0.5}
    path.write_text(json.dumps(old))
    with pytest.raises(ParseError, match=r"'efficiency' .* is gone.*matmul_efficiency"):
        load_accelerator(path)
    # a size curve out of order or past 1 names the values
    for curve, message in (
        ([[2e6, 0.5], [1e6, 1.0]], r"strictly ascending bytes, got \[2000000.0, 1000000.0\]"),
        ([[1e6, 0.5], [2e6, 1.5]], r"between 0 and 1 .*got \[0.5, 1.5\]"),
        ("fast", "a list of \\[bytes, share\\] pairs, got 'fast'"),
    ):
        path.write_text(json.dumps(entry | {"intra_node_size_curve": curve}))
        with pytest.raises(PlanError, match=message):
            load_accelerator(path)
    # a sustained rate above its peak, or an FP8 one without an FP8 peak, is refused
    for extra, message in (
        ({"sustained_matmul_flops": 400e12}, r"is 4e\+14 FLOP/s, above peak_flops 3\.12e\+14"),
        ({"fp8_sustained_matmul_flops": 500e12}, "fp8_peak_flops is not; set both or neither"),
    ):
        path.write_text(json.dumps(entry | extra))
        with pytest.raises(PlanError, match=message):
            load_accelerator(path)
    # fp8 on an accelerator without FP8 tensor cores names the fix
    with pytest.raises(PlanError, match="a100-80gb has no FP8 tensor cores"):
        _ = get_accelerator("a100-80gb").fp8_flops


def test_unknown_presets_list_the_valid_ones() -> None:
    with pytest.raises(UnknownNameError, match="llama2-7b"):
        get_model("gpt-5")
    with pytest.raises(UnknownNameError, match="h100-sxm"):
        get_accelerator("tpu")


def test_bad_model_fields_are_refused() -> None:
    with pytest.raises(PlanError, match="n_layers"):
        ModelSpec(n_layers=0, hidden=8, n_heads=2, seq_length=4, vocab_size=10)
    with pytest.raises(PlanError, match="divide"):
        ModelSpec(n_layers=1, hidden=8, n_heads=4, n_kv_heads=3, seq_length=4, vocab_size=10)
    with pytest.raises(PlanError, match="dtype"):
        ModelSpec(n_layers=1, hidden=8, n_heads=2, seq_length=4, vocab_size=10, dtype="int4")
    with pytest.raises(ParseError, match="unknown model fields"):
        model_from_dict({"n_layers": 1, "width": 3})
    with pytest.raises(ParseError, match="missing"):
        model_from_dict({"n_layers": 1})
