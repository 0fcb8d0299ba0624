"""Multi-head latent attention (MLA): its kernels and its per-sequence costs.

DeepSeek-AI, "DeepSeek-V2", arXiv 2405.04434, section 2.1.2, and "DeepSeek-V3 Technical
Report", arXiv 2412.19437, section 2.1.1 (equations 1-11): the block input ``x`` (width
h) is projected down to a query latent of ``q_lora_rank`` and a key/value latent of
``kv_lora_rank`` (plus one rotary key of ``qk_rope_head_dim`` shared by all heads), each
latent RMS-normalised and projected up to the heads: per head a query and key of
``qk_nope_head_dim + qk_rope_head_dim`` and a value of ``v_head_dim``. The attention
runs over those heads (a fused kernel of query/key width ``dqk`` and value width
``dv``), and the output projection maps ``heads * dv`` back to h.

With tensor parallelism the up projections and the output projection are split by heads
(Megatron-Core's ``MLASelfAttention``: column-parallel ``linear_q_up_proj`` /
``linear_kv_up_proj``, row-parallel ``linear_proj``); the down projections are held
whole on every device and run on all the tokens, so the latents' gradients, partial
over the device's heads, are summed over the group in the backward.

>>> from pipesim.plan.model import get_model
>>> ds = get_model("deepseek-v3")
>>> t = mla_terms(ds)
>>> t.split_params + t.replicated_params   # 187.1M per layer: DeepSeek-V3's MLA
187114496
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from pipesim.plan.kernels import (
    Attention,
    BlockHalf,
    Collective,
    Gemm,
    Kernel,
    Streaming,
    _backward_of,
    _from_model_parallel,
    _in_grad,
    _input_grad,
    _norm,
    _regathered,
    _residual,
    _to_model_parallel,
    _weight_grad,
)
from pipesim.plan.layers import BlockTerms
from pipesim.plan.model import MLASpec, ModelSpec

if TYPE_CHECKING:
    from pipesim.plan.kernels import _Dims

__all__ = ["mla_half", "mla_terms"]


def _mla(spec: ModelSpec) -> MLASpec:
    assert spec.mla is not None
    return spec.mla


def mla_terms(spec: ModelSpec, /) -> BlockTerms:
    """Parameters, FLOPs and stored bytes of one MLA attention half, per sequence."""
    m = _mla(spec)
    s, h, a, d = spec.seq_length, spec.hidden, spec.n_heads, spec.dtype_bytes
    dqk, dv = m.qk_nope_head_dim + m.qk_rope_head_dim, m.v_head_dim
    qr, kvr, dr = m.q_lora_rank, m.kv_lora_rank, m.qk_rope_head_dim
    down = h * qr + h * (kvr + dr)  # W^DQ, and W^DKV with W^KR: held whole
    up = qr * a * dqk + kvr * a * (m.qk_nope_head_dim + dv)  # W^UQ with W^QR; W^UK, W^UV
    proj = a * dv * h
    return BlockTerms(
        split_params=up + proj,
        # the down projections, and RMSNorm gains of the block input and both latents
        replicated_params=down + h + qr + kvr,
        weighted_flops=2 * s * (down + up + proj),
        attention_flops=2 * s * s * a * dqk + 2 * s * s * a * dv,  # Q K^T, scores x V
        seq_bytes=2 * d * s * h,  # norm input, down-projection input [W]
        # the latents (norm inputs and up-projection inputs [W]) and the rotary key
        replicated_bytes=d * s * (2 * qr + 2 * kvr + dr),
        # queries, keys, values, output projection input [W]
        head_bytes=d * s * a * (2 * dqk + dv) + d * s * a * dv,
        score_bytes=4 * a * s,  # the fp32 log-sum-exp per row (fused attention)
        wgrad_seq=d * s * h,
        # the latents for W, and I's gradients of the down projections' outputs
        wgrad_replicated=d * s * (qr + kvr) + d * s * (qr + kvr + dr) + d * s * h,
        wgrad_split=d * s * a * dv + d * s * a * (dqk + m.qk_nope_head_dim + dv),
    )


def mla_half(spec: ModelSpec, x: _Dims, sp: bool, /) -> BlockHalf:
    """The kernels of one MLA attention half (F, I, W) on one device."""
    m = _mla(spec)
    t, heads = x.t, x.heads
    dqk, dv = m.qk_nope_head_dim + m.qk_rope_head_dim, m.v_head_dim
    qr, kvr, dr = m.q_lora_rank, m.kv_lora_rank, m.qk_rope_head_dim
    q_down = Gemm("q down", x.T, qr, x.h)
    kv_down = Gemm("kv down", x.T, kvr + dr, x.h)
    q_up = Gemm("q up", x.T, heads * dqk, qr)
    kv_up = Gemm("kv up", x.T, heads * (m.qk_nope_head_dim + dv), kvr)
    proj = Gemm("attention projection", x.T, x.h, heads * dv)
    norm1, norm1_b = _norm(spec, x, "norm 1")
    res1, res1_b = _residual(spec, x, "residual 1")
    q_norm = Streaming("q latent norm", 2 * x.T * qr * x.d)
    kv_norm = Streaming("kv latent norm", 2 * x.T * kvr * x.d)
    rope_elems = x.T * (heads * dr + dr)  # the rotary query parts and the shared key
    rope = Streaming("rotary embedding", 2 * rope_elems * x.d)
    b_local = x.T * x.c // spec.seq_length
    q_tokens = x.T // b_local
    # causal: half of the s x s products (FlashAttention-2 section 4.1), per head
    # 2 s s dqk for Q K^T and 2 s s dv for scores x V
    forward_flops = b_local * heads * q_tokens * spec.seq_length * (dqk + dv)
    core = Attention("flash attention", forward_flops)
    core_b = Attention("flash attention (backward)", forward_flops * 5 // 2, backward=True)
    ag1 = _to_model_parallel(x, sp, "all-gather before qkv")
    out1 = _from_model_parallel(x, sp, "after attention projection")
    latent_sum: tuple[Collective, ...] = ()
    if t > 1:  # each device's heads give a part of the latents' gradients
        latent_sum = (
            Collective("latent grads", "all-reduce", "tensor", x.T * (qr + kvr + dr) * x.d),
        )
    forward: tuple[Kernel, ...] = (
        norm1, *ag1, q_down, q_norm, q_up, kv_down, kv_norm, kv_up, rope, core, proj, *out1,
        res1,
    )  # fmt: skip
    backward: tuple[Kernel, ...] = (
        res1_b, *_backward_of(out1, x, sp), _input_grad(proj), core_b,
        Streaming("rotary embedding (backward)", 2 * rope_elems * x.d),
        _input_grad(kv_up), _input_grad(q_up), *latent_sum,
        Streaming("kv latent norm (backward)", 5 * x.T * kvr * x.d), *_regathered(ag1),
        _input_grad(kv_down),
        Streaming("q latent norm (backward)", 5 * x.T * qr * x.d), _input_grad(q_down),
        *(_backward_of(ag1, x, sp) or _in_grad(x, sp)), norm1_b,
    )  # fmt: skip
    weight = tuple(_weight_grad(g) for g in (proj, kv_up, q_up, kv_down, q_down))
    # selective recomputation re-runs the core attention (Megatron-Core's MLA is an
    # ``Attention``: its ``checkpoint_core_attention``)
    return BlockHalf(forward, backward, weight, (core,))
