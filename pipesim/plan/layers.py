"""Per-layer parameters, FLOPs and activation bytes of a transformer.

Everything here is *per sequence* (micro-batch size 1): every term is linear in
the micro-batch size b, so a stage of micro-batch b costs b times as much. The
layers are the embedding, ``n_layers`` transformer blocks, and the LM head; the
planner puts the embedding on the first stage and the head on the last.

FLOPs (Narayanan et al., "Efficient Large-Scale Language Model Training on GPU
Clusters Using Megatron-LM", SC 2021, section 5.1 / appendix): a matrix
multiply of (m x k) by (k x n) is 2mkn FLOPs. One block's forward is
``24 s h^2 + 4 s^2 h`` for GPT shapes (QKV 6sh^2, scores QK^T 2s^2h, scores
times V 2s^2h, output projection 2sh^2, MLP 16sh^2); the head's is 2shV; the
backward is twice the forward. The backward split follows Qi et al., "Zero
Bubble Pipeline Parallelism", ICLR 2024, Table 1: the input gradient I costs
as much as the forward for every weight matmul and twice as much for the two
attention matmuls (both of their operands need a gradient); the weight
gradient W costs as much as the forward of the weight matmuls only. So
``I = 24sh^2 + 8s^2h`` and ``W = 24sh^2`` for a GPT block.

Activation bytes (Korthikanti et al., "Reducing Activation Recomputation in
Large Transformer Models", MLSys 2023, section 4.1, no tensor parallelism, no
recomputation): a GPT block stores ``s h (34 + 5 a s / h)`` bytes with 16-bit
activations and 1-byte dropout masks: attention 11sh + 5as^2, MLP 19sh, two
LayerNorms 4sh. What W still needs after I are the inputs of the four weight
matmuls (QKV input, output-projection input, both MLP inputs: ``14 s h`` for
GPT); I frees the rest. The output gradients that I hands to W are not
counted: the cost model allocates memory only at F.

>>> from pipesim.plan.model import ModelSpec
>>> gpt = ModelSpec(n_layers=1, hidden=1024, n_heads=16, seq_length=2048, vocab_size=50000)
>>> block = transformer_block(gpt)
>>> block.forward_flops == 24 * 2048 * 1024**2 + 4 * 2048**2 * 1024
True
>>> block.activation_bytes == 2048 * 1024 * 34 + 5 * 16 * 2048**2
True
"""

from __future__ import annotations

from dataclasses import dataclass

from pipesim.plan.model import ModelSpec

__all__ = [
    "LayerCost",
    "embedding",
    "lm_head",
    "model_flops_per_sequence",
    "model_layers",
    "transformer_block",
]


@dataclass(frozen=True, slots=True, kw_only=True)
class LayerCost:
    """One layer's costs for one sequence (micro-batch size 1)."""

    name: str
    params: int
    """Parameters held by this layer."""
    forward_flops: int
    input_grad_flops: int
    """FLOPs of the input-gradient half of the backward (I)."""
    weight_grad_flops: int
    """FLOPs of the weight-gradient half of the backward (W)."""
    activation_bytes: int
    """Bytes the forward stores for the backward."""
    weight_grad_bytes: int
    """The part of ``activation_bytes`` that W still needs after I."""

    @property
    def backward_flops(self) -> int:
        """A full backward B: I + W."""
        return self.input_grad_flops + self.weight_grad_flops

    @property
    def flops(self) -> int:
        """Forward and backward: the layer's model FLOPs per sequence."""
        return self.forward_flops + self.backward_flops


def transformer_block(spec: ModelSpec, /) -> LayerCost:
    """One transformer block (attention + MLP + two norms)."""
    s, h, a, f = spec.seq_length, spec.hidden, spec.n_heads, spec.ffn
    kv = spec.kv_hidden
    d = spec.dtype_bytes
    n_mlp_in = 2 if spec.gated_mlp else 1  # gate and up projections, or one fc1
    # -- parameters: QKV, output projection, MLP, two norms (GPT: 12h^2 + 13h)
    params = h * (h + 2 * kv) + h * h + (n_mlp_in + 1) * h * f
    if spec.bias:
        params += (h + 2 * kv) + h + n_mlp_in * f + h + 2 * 2 * h  # biases + LayerNorm (g, b)
    else:
        params += 2 * h  # RMSNorm gains
    # -- FLOPs (Narayanan et al. 2021): weight matmuls and the two s x s attention matmuls
    weighted = 2 * s * h * (h + 2 * kv) + 2 * s * h * h + 2 * s * h * f * (n_mlp_in + 1)
    attention = 2 * s * s * h + 2 * s * s * h  # Q K^T and scores x V, over all heads
    forward = weighted + attention
    input_grad = weighted + 2 * attention  # Qi et al. 2024, Table 1
    weight_grad = weighted
    # -- activation bytes (Korthikanti et al. 2023, section 4.1), d bytes per element
    mask = 1 if spec.dropout else 0  # dropout masks: one byte per element
    attention_bytes = (
        d * s * h  # LayerNorm 1 input
        + d * s * h  # QKV input (LayerNorm 1 output)      [W]
        + d * s * (h + kv)  # Q and K, for Q K^T
        + d * s * kv  # V, for scores x V
        + d * s * h  # output projection input              [W]
        + mask * s * h  # attention dropout mask
    )
    if spec.flash_attention:
        attention_bytes += 4 * a * s  # only the fp32 log-sum-exp per row (Dao et al. 2022)
    else:
        attention_bytes += d * a * s * s  # softmax output
        attention_bytes += mask * a * s * s + (d * a * s * s if spec.dropout else 0)  # mask, out
    mlp_bytes = (
        d * s * h  # LayerNorm 2 input
        + d * s * h  # first MLP input (LayerNorm 2 output) [W]
        + n_mlp_in * d * s * f  # activation-function input(s): GeLU input, or gate and up
        + d * s * f  # second MLP input (activation output)  [W]
        + mask * s * h  # MLP dropout mask
    )
    weight_grad_bytes = 3 * d * s * h + d * s * f
    return LayerCost(
        name="block",
        params=params,
        forward_flops=forward,
        input_grad_flops=input_grad,
        weight_grad_flops=weight_grad,
        activation_bytes=attention_bytes + mlp_bytes,
        weight_grad_bytes=weight_grad_bytes,
    )


def embedding(spec: ModelSpec, /) -> LayerCost:
    """Token (and learned position) embedding: a lookup, no multiply-adds.

    Stores its dropout mask (Korthikanti et al. 2023, section 4.3) and the token
    ids, which W needs to scatter the embedding gradient (8 bytes each, int64).
    """
    s, h = spec.seq_length, spec.hidden
    params = spec.vocab_size * h + (s * h if spec.learned_positions else 0)
    ids = 8 * s
    return LayerCost(
        name="embedding",
        params=params,
        forward_flops=0,
        input_grad_flops=0,
        weight_grad_flops=0,
        activation_bytes=ids + (s * h if spec.dropout else 0),
        weight_grad_bytes=ids,
    )


def lm_head(spec: ModelSpec, /) -> LayerCost:
    """Final norm, output projection to the vocabulary and the cross-entropy loss.

    FLOPs 2shV each for F, I and W (Narayanan et al. 2021's logit term); stores
    the norm input, the projection input (W needs it) and the fp32 logits for
    the loss, 4sV bytes (Korthikanti et al. 2023, section 4.3).
    """
    s, h, v = spec.seq_length, spec.hidden, spec.vocab_size
    d = spec.dtype_bytes
    matmul = 2 * s * h * v
    return LayerCost(
        name="head",
        params=v * h + (2 * h if spec.bias else h),
        forward_flops=matmul,
        input_grad_flops=matmul,
        weight_grad_flops=matmul,
        activation_bytes=d * s * h + d * s * h + 4 * s * v,
        weight_grad_bytes=d * s * h,
    )


def model_layers(spec: ModelSpec, /) -> tuple[LayerCost, ...]:
    """Embedding, ``n_layers`` blocks, head: the units the partitioner splits."""
    block = transformer_block(spec)
    return (embedding(spec), *([block] * spec.n_layers), lm_head(spec))


def model_flops_per_sequence(spec: ModelSpec, /) -> int:
    """Forward + backward FLOPs of one sequence: Narayanan et al. 2021's
    ``72 s l h^2 (1 + s / 6h + V / 12hl)`` per sequence for GPT shapes.

    >>> from pipesim.plan.model import get_model
    >>> spec = get_model("gpt3-175b")
    >>> s, l, h, V = 2048, 96, 12288, 50257
    >>> model_flops_per_sequence(spec) == 72 * s * l * h**2 + 12 * s * s * l * h + 6 * s * h * V
    True
    """
    return sum(layer.flops for layer in model_layers(spec))
