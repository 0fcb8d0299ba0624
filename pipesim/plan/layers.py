"""Per-layer parameters, FLOPs, activation bytes and tensor-parallel traffic of a transformer.

Everything here is *per sequence* (micro-batch size 1) and *per device* of a
tensor-parallel group of ``t`` devices: every term is linear in the
micro-batch size b, so a stage of micro-batch b costs b times as much. The
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
``I = 24sh^2 + 8s^2h`` and ``W = 24sh^2`` for a GPT block. Tensor parallelism
splits every matmul t ways (Megatron's column / row split, Narayanan et al.
2021 section 2.3), so each device does 1/t of the FLOPs.

Recomputation (Korthikanti et al., "Reducing Activation Recomputation in Large
Transformer Models", MLSys 2023, sections 4.3 and 5): ``full`` stores only
each block's input and re-runs its forward before the backward (Narayanan et
al. 2021's ``4`` passes instead of 3: the forward FLOPs are added to I);
``selective`` re-runs only the attention core (the two s x s matmuls, 4s^2h
FLOPs), whose softmax, dropout mask and dropout output are the ``5as^2``
bytes it stops storing. With flash attention those are never stored, so
``selective`` saves no memory, and Megatron-Core still checkpoints the core
attention (``Attention.checkpoint_core_attention``,
``megatron/core/transformer/attention.py``): its forward runs again.

Activation bytes (Korthikanti et al. 2023, Table 2): a GPT block stores ``s h
(34 + 5 a s / h)`` bytes with 16-bit activations and 1-byte dropout masks.
With tensor parallelism ``10 s h`` of them are replicated on every device (the
two LayerNorm inputs, the QKV and first-MLP inputs, the two dropout masks)
and the rest is split t ways: ``s h (10 + 24/t + 5as/(ht))``; sequence
parallelism splits the replicated part too: ``s h (34/t + 5as/(ht))``;
selective recomputation drops the ``5as/(ht)`` term; full recomputation keeps
only the block input, ``2 s h`` bytes (``2sh/t`` with sequence parallelism,
as Megatron-LM checkpoints the sequence-split hidden states), and re-creates
one block's activations at a time in the backward (``LayerCost.transient_bytes``).
What W still needs after I (``weight_grad_bytes``, :mod:`pipesim.step.memory`) are the
inputs of the four weight matmuls (``14 s h`` for GPT at t=1, kept from F) and the
gradients of their outputs, which I computes and hands to W (``18 s h``: QKV
``6sh``, output projection ``2sh``, MLP ``8sh + 2sh``); together Qi et al. 2024's
``M_W = 32sbh`` (Table 1). The output gradients of the column-parallel matmuls
(QKV, first MLP) are split t ways; those of the row-parallel ones (output
projection, second MLP) are whole on every device, as the backward of their
all-reduce (or, with sequence parallelism, reduce-scatter) hands each device the
full gradient (zero-bubble's Megatron keeps ``grad_output`` and the saved input in
its ``WeightGradStore``). With full recomputation I re-creates the inputs, so W
holds the same bytes, more than the block input stored from F.

Time is not priced here: :mod:`pipesim.plan.kernels` lists each layer's kernels (its
tensor-parallel collectives among them) and :mod:`pipesim.plan.gpu` prices them on an
accelerator. The FLOPs here count what MFU counts and balance the pipeline cut.

>>> from pipesim.plan.model import ModelSpec
>>> gpt = ModelSpec(n_layers=1, hidden=1024, n_heads=16, seq_length=2048, vocab_size=50000)
>>> block = transformer_block(gpt)
>>> block.forward_flops == 24 * 2048 * 1024**2 + 4 * 2048**2 * 1024
True
>>> block.activation_bytes == 2048 * 1024 * 34 + 5 * 16 * 2048**2
True
>>> block.weight_grad_bytes == 2048 * 1024 * 32  # Qi et al. 2024, Table 1: M_W = 32sbh
True
>>> sp = transformer_block(gpt, tensor=8, sequence_parallel=True, recompute="selective")
>>> sp.activation_bytes == 2048 * 1024 * 34 // 8
True
"""

from __future__ import annotations

from dataclasses import dataclass
from fractions import Fraction
from typing import Any

from pipesim.errors import PlanError
from pipesim.plan.model import ModelSpec

__all__ = [
    "RECOMPUTE",
    "BlockTerms",
    "LayerCost",
    "attention_terms",
    "block_cost",
    "check_shard",
    "embedding",
    "lm_head",
    "mlp_terms",
    "model_flops_per_sequence",
    "model_layers",
    "transformer_block",
]

Amount = int | Fraction

#: Megatron-LM's ``--recompute-granularity`` values, plus ``none``.
RECOMPUTE = ("none", "selective", "full")


@dataclass(frozen=True, slots=True, kw_only=True)
class LayerCost:
    """One layer's costs for one sequence (micro-batch size 1) on one device of its
    tensor-parallel group."""

    name: str
    params: Amount
    """Parameters held by this layer on one device."""
    forward_flops: Amount
    input_grad_flops: Amount
    """FLOPs of the input-gradient half of the backward (I), recomputation included."""
    weight_grad_flops: Amount
    """FLOPs of the weight-gradient half of the backward (W)."""
    activation_bytes: Amount
    """Bytes the forward stores for the backward."""
    weight_grad_bytes: Amount
    """The part of ``activation_bytes`` that W still needs after I."""
    transient_bytes: Amount = 0
    """Bytes alive during one pass and freed by it: one block re-created for the backward
    (full recomputation), the token dispatch buffers of an expert layer."""
    expert_params: Amount = 0
    """The part of ``params`` that is routed experts, split over expert parallelism (its
    gradients and optimizer state are sharded over the expert-data-parallel group)."""

    @property
    def backward_flops(self) -> Amount:
        """A full backward B: I + W."""
        return self.input_grad_flops + self.weight_grad_flops

    @property
    def flops(self) -> Amount:
        """Forward and backward: the layer's FLOPs per sequence (recomputation included)."""
        return self.forward_flops + self.backward_flops


def _split(value: int, t: int) -> Amount:
    """``value / t`` exactly (an int when it divides)."""
    q, r = divmod(value, t)
    return q if r == 0 else Fraction(value, t)


def check_shard(spec: ModelSpec, tensor: int, recompute: str) -> None:
    """PlanError unless ``tensor`` is a whole number >= 1 dividing the heads and key/value
    heads and ``recompute`` is one of :data:`RECOMPUTE`."""
    if isinstance(tensor, bool) or not isinstance(tensor, int) or tensor < 1:
        raise PlanError(f"tensor parallel size must be a whole number >= 1, got {tensor!r}")
    if spec.n_heads % tensor or spec.kv_heads % tensor:
        raise PlanError(
            f"tensor parallel size {tensor} must divide the attention heads ({spec.n_heads}) "
            f"and key/value heads ({spec.kv_heads}); use a common divisor"
        )
    if recompute not in RECOMPUTE:
        raise PlanError(f"recompute must be one of {', '.join(RECOMPUTE)}, got {recompute!r}")


@dataclass(frozen=True, slots=True, kw_only=True)
class BlockTerms:
    """One half of a block (attention, MLP or experts) per sequence, before the
    tensor-parallel split; :func:`block_cost` adds the halves and splits them."""

    split_params: int = 0
    """Parameters split t ways (column / row-parallel matrices and their biases)."""
    replicated_params: int = 0
    """Parameters every tensor-parallel device holds (norms, row-parallel biases)."""
    local_params: Amount = 0
    """Parameters already per device (routed experts split over expert parallelism)."""
    weighted_flops: int = 0
    """Forward FLOPs of the weight matmuls."""
    attention_flops: int = 0
    """Forward FLOPs of the s x s attention matmuls."""
    seq_bytes: int = 0
    """Stored bytes split by sequence parallelism (replicated without it)."""
    replicated_bytes: int = 0
    """Stored bytes every tensor-parallel device holds whole (MLA's latents)."""
    head_bytes: int = 0
    """Stored bytes split t ways."""
    score_bytes: int = 0
    """Stored attention-score bytes, split t ways (what selective recomputation drops
    unless the attention is fused)."""
    wgrad_seq: int = 0
    """What W needs of ``seq_bytes`` (inputs of the weight matmuls)."""
    wgrad_replicated: int = 0
    """What W needs, whole on every device."""
    wgrad_split: int = 0
    """What W needs, split t ways (inputs, and I's output gradients of column-parallel
    matmuls)."""
    transient_bytes: Amount = 0
    """Bytes per device alive during one pass and freed by it (dispatch buffers)."""


def attention_terms(spec: ModelSpec, /) -> BlockTerms:
    """The attention half of a (grouped-query) multi-head attention block."""
    s, h, a = spec.seq_length, spec.hidden, spec.n_heads
    q, kv, d = spec.q_hidden, spec.kv_hidden, spec.dtype_bytes
    mask = 1 if spec.dropout else 0  # dropout masks: one byte per element
    if spec.flash_attention:
        score = 4 * a * s  # only the fp32 log-sum-exp per row (Dao et al. 2022)
    else:  # softmax output, its dropout mask and the dropout output: 5 a s^2
        score = d * a * s * s + mask * a * s * s + (d * a * s * s if spec.dropout else 0)
    return BlockTerms(
        split_params=h * (q + 2 * kv) + q * h + ((q + 2 * kv) if spec.bias else 0),
        replicated_params=3 * h if spec.bias else h,  # row-parallel bias, LayerNorm (g, b)
        weighted_flops=2 * s * h * (q + 2 * kv) + 2 * s * q * h,
        attention_flops=2 * s * s * q + 2 * s * s * q,  # Q K^T and scores x V, all heads
        # LayerNorm input, QKV input [W], dropout mask
        seq_bytes=2 * d * s * h + mask * s * h,
        # Q and K, V, output projection input [W]
        head_bytes=d * s * (q + kv) + d * s * kv + d * s * q,
        score_bytes=score,
        wgrad_seq=d * s * h,
        # the projection's output gradient is whole on every device (row-parallel)
        wgrad_replicated=d * s * h,
        wgrad_split=d * s * q + d * s * (q + 2 * kv),
    )


def mlp_terms(spec: ModelSpec, /, *, width: int | None = None) -> BlockTerms:
    """The MLP half of a dense block (``width``: the model's MLP width by default)."""
    s, h, d = spec.seq_length, spec.hidden, spec.dtype_bytes
    f = spec.ffn if width is None else width
    n_in = 2 if spec.gated_mlp else 1  # gate and up projections, or one fc1
    mask = 1 if spec.dropout else 0
    return BlockTerms(
        split_params=(n_in + 1) * h * f + (n_in * f if spec.bias else 0),
        replicated_params=3 * h if spec.bias else h,
        weighted_flops=2 * s * h * f * (n_in + 1),
        seq_bytes=2 * d * s * h + mask * s * h,  # LayerNorm input, first MLP input [W]
        head_bytes=n_in * d * s * f + d * s * f,  # activation input(s), second MLP input [W]
        wgrad_seq=d * s * h,
        wgrad_replicated=d * s * h,
        wgrad_split=d * s * f + n_in * d * s * f,
    )


def transformer_block(
    spec: ModelSpec,
    /,
    *,
    tensor: int = 1,
    sequence_parallel: bool = False,
    recompute: str = "none",
) -> LayerCost:
    """One transformer block (attention + MLP + two norms) on one of ``tensor`` devices
    (a model with multi-head latent attention: :mod:`pipesim.plan.mla`'s attention)."""
    check_shard(spec, tensor, recompute)
    if spec.mla is not None:
        from pipesim.plan.mla import mla_terms

        attention = mla_terms(spec)
    else:
        attention = attention_terms(spec)
    return block_cost(
        spec,
        (attention, mlp_terms(spec)),
        name="block",
        tensor=tensor,
        sequence_parallel=sequence_parallel,
        recompute=recompute,
    )


def block_cost(
    spec: ModelSpec,
    halves: tuple[BlockTerms, ...],
    /,
    *,
    name: str,
    tensor: int,
    sequence_parallel: bool,
    recompute: str,
) -> LayerCost:
    """A block's cost from its halves' terms, split over ``tensor`` devices, with the
    recomputation asked for (see the module docstring)."""
    t = tensor

    def total(field: str) -> Any:
        return sum((getattr(x, field) for x in halves), start=0)

    weighted, attention = total("weighted_flops"), total("attention_flops")
    params = _split(total("split_params"), t) + total("replicated_params") + total("local_params")
    forward = weighted + attention
    input_grad = weighted + 2 * attention  # Qi et al. 2024, Table 1
    if recompute == "full":
        input_grad += forward  # the whole forward again (Narayanan et al. 2021, 4 passes)
    elif recompute == "selective":
        input_grad += attention  # the attention core again (Korthikanti et al. 2023, sec. 5)
    recomputable = 0 if spec.flash_attention else total("score_bytes")
    seq_t = t if sequence_parallel else 1
    full_bytes = (
        _split(total("seq_bytes"), seq_t)
        + total("replicated_bytes")
        + _split(total("head_bytes") + total("score_bytes"), t)
    )
    weight_grad_bytes = (
        _split(total("wgrad_seq"), seq_t)
        + _split(total("wgrad_split"), t)
        + total("wgrad_replicated")
    )
    transient: Amount = total("transient_bytes")
    if recompute == "full":
        activation = _split(spec.dtype_bytes * spec.seq_length * spec.hidden, seq_t)
        transient += full_bytes  # one block re-created at a time in the backward
    elif recompute == "selective":
        activation = full_bytes - _split(recomputable, t)
    else:
        activation = full_bytes
    return LayerCost(
        name=name,
        params=params,
        forward_flops=_split(forward, t),
        input_grad_flops=_split(input_grad, t),
        weight_grad_flops=_split(weighted, t),
        activation_bytes=activation,
        weight_grad_bytes=weight_grad_bytes,
        transient_bytes=transient,
        expert_params=total("local_params"),
    )


def embedding(spec: ModelSpec, /, *, tensor: int = 1, sequence_parallel: bool = False) -> LayerCost:
    """Token (and learned position) embedding: a lookup, no multiply-adds.

    The token table is split over the tensor-parallel group by vocabulary
    (Megatron's VocabParallelEmbedding), whose partial lookups one all-reduce
    sums. Stores its dropout mask (Korthikanti et al. 2023, section 4.3) and
    the token ids, which W needs to scatter the embedding gradient (8 bytes
    each, int64), together with the gradient of the embedding's output, which
    the backward hands it whole on every device (``d s h`` bytes).
    """
    check_shard(spec, tensor, "none")
    s, h, t = spec.seq_length, spec.hidden, tensor
    params = _split(spec.vocab_size * h, t) + (s * h if spec.learned_positions else 0)
    ids = 8 * s
    output_grad = spec.dtype_bytes * s * h
    mask = _split(s * h, t if sequence_parallel else 1) if spec.dropout else 0
    return LayerCost(
        name="embedding",
        params=params,
        forward_flops=0,
        input_grad_flops=0,
        weight_grad_flops=0,
        activation_bytes=ids + mask,
        weight_grad_bytes=ids + output_grad,
    )


def lm_head(spec: ModelSpec, /, *, tensor: int = 1, sequence_parallel: bool = False) -> LayerCost:
    """Final norm, output projection to the vocabulary and the cross-entropy loss.

    FLOPs 2shV each for F, I and W (Narayanan et al. 2021's logit term), split
    t ways by vocabulary; stores the norm input, the projection input (W needs
    it) and the fp32 logits for the loss, 4sV/t bytes (Korthikanti et al. 2023,
    section 4.3, with Megatron's vocabulary-parallel cross entropy). W needs the
    projection input and the logits' gradient, ``d s V / t`` bytes, which I
    computes. The input gradient is all-reduced over the tensor-parallel group in
    the backward.
    """
    check_shard(spec, tensor, "none")
    s, h, v, t = spec.seq_length, spec.hidden, spec.vocab_size, tensor
    d = spec.dtype_bytes
    matmul = _split(2 * s * h * v, t)
    inputs = _split(d * s * h, t if sequence_parallel else 1)
    return LayerCost(
        name="head",
        params=_split(v * h, t) + (2 * h if spec.bias else h),
        forward_flops=matmul,
        input_grad_flops=matmul,
        weight_grad_flops=matmul,
        activation_bytes=2 * inputs + _split(4 * s * v, t),
        weight_grad_bytes=inputs + _split(d * s * v, t),
    )


def model_layers(
    spec: ModelSpec,
    /,
    *,
    tensor: int = 1,
    sequence_parallel: bool = False,
    recompute: str = "none",
    expert: int = 1,
    expert_tensor: int = 1,
) -> tuple[LayerCost, ...]:
    """Embedding, ``n_layers`` blocks, head: the units the partitioner splits. A model
    with expert layers has its ``dense_layers`` dense blocks first, then its expert
    blocks (:mod:`pipesim.plan.moe`), their routed experts split over ``expert`` devices."""
    block = transformer_block(
        spec, tensor=tensor, sequence_parallel=sequence_parallel, recompute=recompute
    )
    blocks = [block] * spec.n_layers
    if spec.moe is not None:
        from pipesim.plan.moe import moe_block

        dense = spec.moe.dense_layers
        routed = moe_block(
            spec, tensor=tensor, sequence_parallel=sequence_parallel, recompute=recompute,
            expert=expert, expert_tensor=expert_tensor,
        )  # fmt: skip
        blocks = [block] * dense + [routed] * (spec.n_layers - dense)
    return (
        embedding(spec, tensor=tensor, sequence_parallel=sequence_parallel),
        *blocks,
        lm_head(spec, tensor=tensor, sequence_parallel=sequence_parallel),
    )


def model_flops_per_sequence(spec: ModelSpec, /) -> int:
    """Forward + backward model FLOPs of one sequence, no recomputation (what MFU
    counts, Chowdhery et al. 2022, appendix B): Narayanan et al. 2021's
    ``72 s l h^2 (1 + s / 6h + V / 12hl)`` per sequence for GPT shapes.

    >>> from pipesim.plan.model import get_model
    >>> spec = get_model("gpt3-175b")
    >>> s, l, h, V = 2048, 96, 12288, 50257
    >>> model_flops_per_sequence(spec) == 72 * s * l * h**2 + 12 * s * s * l * h + 6 * s * h * V
    True
    """
    total = sum((layer.flops for layer in model_layers(spec)), start=0)
    assert isinstance(total, int)
    return total
