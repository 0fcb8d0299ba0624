"""What one layer runs on one GPU: its kernels, pass by pass, with their shapes.

The planner prices a layer as the sum of its kernels (:mod:`pipesim.plan.gpu`), each
by what bounds it, instead of one FLOP count at one efficiency. This module only
*describes* the kernels of one micro-batch on one device; it knows nothing of any
accelerator. Three passes, as the schedules split the work (Qi et al., "Zero Bubble
Pipeline Parallelism", ICLR 2024, Table 1): the forward F, the input gradient I and
the weight gradient W (a full backward B is I + W).

Kinds of kernel:

- :class:`Gemm`: ``(m x k) @ (k x n)``, ``batch`` times (2mnk FLOPs each). A linear
  layer ``Y = X W`` of ``m`` tokens has the forward GEMM ``(m, n, k)``, the input
  gradient ``dX = dY W^T``: ``(m, k, n)`` and the weight gradient ``dW = X^T dY``:
  ``(k, n, m)``, the same FLOPs in a different shape.
- :class:`Attention`: a fused (flash) attention kernel, its FLOPs counted as the
  kernel does the work (causal masking skips the upper triangle, Dao 2023,
  "FlashAttention-2", section 4.1, and the backward recomputes the scores: 5 matmuls
  against the forward's 2, section 3.1.2 and Algorithm 2). Unfused attention
  (Megatron-LM's ``baddbmm`` / softmax / ``bmm`` path) is two batched GEMMs and the
  streaming kernels between them, with the full s x s matrices.
- :class:`Streaming`: a memory-bound kernel (norms, activation functions, dropout,
  residual adds, rotary embedding, softmax, the cross-entropy), priced by the bytes it
  reads and writes. Which elementwise kernels Megatron-LM fuses into one (bias + GeLU,
  bias + dropout + residual add, scale + mask + softmax: ``megatron/core/fusions``)
  decides those bytes; each kernel below names what it reads and writes.
- :class:`Collective`: tensor-parallel all-reduce / reduce-scatter / all-gather of the
  activations (Megatron's ``f`` and ``g`` operators, Narayanan et al. 2021 section
  2.3; with sequence parallelism each all-reduce becomes a reduce-scatter and an
  all-gather, Korthikanti et al. 2023 section 4.2.2), and the context-parallel ring
  exchange of keys and values (Megatron-Core's ``AttnFuncWithCPAndKVP2P``, in
  Transformer Engine: C - 1 steps of one K/V chunk, overlapped with the attention of
  the chunk in hand).

Shapes: ``b`` sequences of ``s`` tokens, tensor parallel ``t``, context parallel
``c``; a device holds ``T = b s / c`` tokens of the sequence dimension; the
sequence-parallel regions (norms, dropout, residual) hold ``T / t`` of them with
sequence parallelism, all ``T`` without. Bytes are of the model's storage dtype
``d`` (2 for bf16, fp16 and for fp8 training, where Transformer Engine keeps
activations between GEMMs in bf16); dropout masks are 1 byte an element (Korthikanti
et al. 2023, section 4.1).

Recomputation adds the forward kernels it repeats to I: ``full`` the whole block
(Megatron-LM's ``--recompute-granularity full``), ``selective`` the attention core
(Korthikanti et al. 2023, section 5; Megatron-Core checkpoints it with a fused
attention kernel too, so its forward runs again).

>>> from pipesim.plan.model import ModelSpec
>>> gpt = ModelSpec(n_layers=1, hidden=1024, n_heads=16, seq_length=2048, vocab_size=50000)
>>> k = block_kernels(gpt, Shard())
>>> [g.name for g in k.forward if isinstance(g, Gemm)]
['qkv', 'scores', 'context', 'attention projection', 'mlp up', 'mlp down']
>>> gemm_flops = sum(g.flops for g in k.forward if isinstance(g, Gemm))
>>> gemm_flops == 24 * 2048 * 1024**2 + 4 * 2048**2 * 1024
True
"""

from __future__ import annotations

from dataclasses import dataclass

from pipesim.errors import PlanError
from pipesim.plan.layers import check_shard
from pipesim.plan.model import ModelSpec

__all__ = [
    "Attention",
    "BlockHalf",
    "Collective",
    "Gemm",
    "Kernel",
    "LayerKernels",
    "Shard",
    "Streaming",
    "assemble_block",
    "attention_half",
    "block_kernels",
    "check_context_parallel",
    "embedding_kernels",
    "head_kernels",
    "layer_kernels",
    "layer_kinds",
    "mlp_half",
    "moe_block_kernels",
]

#: Bytes of a dropout mask element (Korthikanti et al. 2023, section 4.1).
MASK_BYTES = 1
#: Bytes of an fp32 element (the loss's logits, LayerNorm statistics).
FP32 = 4


@dataclass(frozen=True, slots=True)
class Gemm:
    """``batch`` matrix multiplies of ``(m x k) @ (k x n)``."""

    name: str
    m: int
    n: int
    k: int
    batch: int = 1
    low_precision: bool = True
    """Runs at the FP8 rate when the model trains in fp8 (Transformer Engine casts the
    linear layers' GEMMs, not the attention's batched ones)."""

    @property
    def flops(self) -> int:
        return 2 * self.m * self.n * self.k * self.batch

    def operand_bytes(self, dtype_bytes: int) -> int:
        """Bytes the GEMM must read and write at least: both inputs and the output."""
        return (self.m * self.k + self.k * self.n + self.m * self.n) * self.batch * dtype_bytes


@dataclass(frozen=True, slots=True)
class Attention:
    """A fused attention kernel (forward or backward) doing ``flops`` of matmul work."""

    name: str
    flops: int
    backward: bool = False


@dataclass(frozen=True, slots=True)
class Streaming:
    """A memory-bound kernel moving ``bytes_moved`` bytes through HBM."""

    name: str
    bytes_moved: int


#: Collective kinds: the NCCL operations, the context-parallel point-to-point ring and
#: the expert-parallel token exchange.
COLLECTIVES = ("all-reduce", "reduce-scatter", "all-gather", "ring", "all-to-all")


@dataclass(frozen=True, slots=True)
class Collective:
    """A collective over a group of devices: ``group`` is ``"tensor"`` (t devices),
    ``"context"`` (c devices), ``"expert"`` (e devices) or ``"expert tensor"``.
    ``size_bytes`` is the whole buffer (the all-gathered output, the reduce-scattered
    input, what one device sends in an all-to-all), or for ``ring`` one message of its
    ``steps`` (C - 1 messages of one K/V chunk)."""

    name: str
    kind: str
    group: str
    size_bytes: int
    steps: int = 1
    fanout: int = 1
    """All-to-all: copies of each token in ``size_bytes`` (top-k routing)."""
    node_limit: int | None = None
    """All-to-all: nodes a token is sent to at most (node-limited routing)."""
    regathered: bool = False
    """An all-gather a column-parallel linear's backward runs again for its weight
    gradient (:func:`_regathered`)."""


Kernel = Gemm | Attention | Streaming | Collective


@dataclass(frozen=True, slots=True)
class LayerKernels:
    """The kernels of one layer's F, I and W, in the order they run."""

    forward: tuple[Kernel, ...]
    input_grad: tuple[Kernel, ...]
    weight_grad: tuple[Kernel, ...]

    def passes(self) -> dict[str, tuple[Kernel, ...]]:
        return {
            "forward": self.forward,
            "input_grad": self.input_grad,
            "weight_grad": self.weight_grad,
        }


@dataclass(frozen=True, slots=True, kw_only=True)
class Shard:
    """How one micro-batch of a layer is split over devices."""

    microbatch_size: int = 1
    tensor: int = 1
    context: int = 1
    sequence_parallel: bool = False
    recompute: str = "none"
    expert: int = 1
    """Expert-parallel size e: the routed experts of an MoE layer split over e devices."""
    expert_tensor: int = 1
    """Expert tensor parallelism: each routed expert's matrices split over this many
    devices (Megatron-Core's ``--expert-tensor-parallel-size``)."""


def _check(spec: ModelSpec, shard: Shard) -> None:
    # the tensor-parallel size and recomputation: the same rule as the layer formulas'
    check_shard(spec, shard.tensor, shard.recompute)
    value = shard.microbatch_size
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise PlanError(f"micro-batch size must be a whole number >= 1, got {value!r}")
    check_context_parallel(spec, shard.context)


def check_context_parallel(spec: ModelSpec, c: int, /) -> None:
    """PlanError unless ``spec`` can split its sequences ``c`` ways as Megatron-Core does:
    fused attention, and 2c equal chunks of the sequence."""
    if isinstance(c, bool) or not isinstance(c, int) or c < 1:
        raise PlanError(f"context parallel size must be a whole number >= 1, got {c!r}")
    if c > 1 and spec.mla is not None:
        raise PlanError(
            f"context parallel size {c} is not modelled for multi-head latent attention; "
            "use context parallel 1 for this model"
        )
    if c > 1 and not spec.flash_attention:
        raise PlanError(
            f"context parallel size {c} needs fused (flash) attention: Megatron-Core runs "
            "context parallelism only through Transformer Engine's fused attention; use "
            "context parallel 1 for this model, or a model with flash_attention true"
        )
    if spec.seq_length % (2 * c) and c > 1:
        raise PlanError(
            f"context parallel size {c} needs the sequence ({spec.seq_length} tokens) to split "
            f"into 2 x {c} equal chunks (Megatron-Core balances causal attention that way); "
            "pick a divisor of half the sequence"
        )


@dataclass(frozen=True, slots=True)
class _Dims:
    """The shapes every kernel of a block is written in."""

    T: int  # tokens on a device (sequence split by context parallelism)
    Ts: int  # tokens in the sequence-parallel regions
    h: int
    q: int  # query width (= h unless the heads have their own width)
    kv: int  # key (and value) width
    f: int
    heads: int  # attention heads on a device
    d: int  # bytes per element
    t: int
    c: int


def _dims(spec: ModelSpec, shard: Shard) -> _Dims:
    _check(spec, shard)
    t, c = shard.tensor, shard.context
    tokens = shard.microbatch_size * spec.seq_length // c
    return _Dims(
        T=tokens,
        Ts=tokens // t if shard.sequence_parallel and t > 1 else tokens,
        h=spec.hidden,
        q=spec.q_hidden,
        kv=spec.kv_hidden,
        f=spec.ffn,
        heads=spec.n_heads // t,
        d=spec.dtype_bytes,
        t=t,
        c=c,
    )


def _to_model_parallel(
    x: _Dims, sp: bool, name: str, elem_bytes: int | None = None
) -> tuple[Collective, ...]:
    """Entering a column-parallel linear: all-gather of the sequence-split input with
    sequence parallelism (``elem_bytes`` an element, default the model's: 1 where it
    gathers FP8, :func:`_fp8_bytes`); nothing without (Megatron's ``f`` is the identity
    forward)."""
    if x.t == 1 or not sp:
        return ()
    size = x.T * x.h * (x.d if elem_bytes is None else elem_bytes)
    return (Collective(name, "all-gather", "tensor", size),)


def _from_model_parallel(x: _Dims, sp: bool, name: str) -> tuple[Collective, ...]:
    """Leaving a row-parallel linear: reduce-scatter with sequence parallelism, else an
    all-reduce (Megatron's ``g``)."""
    if x.t == 1:
        return ()
    return (Collective(name, "reduce-scatter" if sp else "all-reduce", "tensor", x.T * x.h * x.d),)


def _backward_of(
    collectives: tuple[Collective, ...], x: _Dims, sp: bool, gather_bytes: int | None = None
) -> tuple[Collective, ...]:
    """The backward of ``f`` / ``g``: an all-gather's is a reduce-scatter (of the
    model's dtype) and back (an all-gather of ``gather_bytes`` an element, default the
    model's); an all-reduce after a row-parallel linear has an identity backward, and the
    identity before a column-parallel linear an all-reduce (Narayanan et al. 2021,
    Figure 4)."""
    swap = {"all-gather": "reduce-scatter", "reduce-scatter": "all-gather"}
    elems = x.T * x.h
    sizes = {"all-gather": elems * x.d, "reduce-scatter": elems * (gather_bytes or x.d)}
    return tuple(
        Collective(c.name + " (backward)", swap[c.kind], c.group, sizes[c.kind])
        for c in collectives
        if c.kind in swap
    )


def _regathered(collectives: tuple[Collective, ...]) -> tuple[Collective, ...]:
    """The all-gather a column-parallel linear with sequence parallelism runs again in its
    backward: Megatron-LM keeps only the sequence-split input, so
    ``LinearWithGradAccumulationAndAsyncCommunication.backward``
    (``megatron/core/tensor_parallel/layers.py``) all-gathers it once more for the weight
    gradient, launched before the input-gradient GEMM (Korthikanti et al. 2023, section
    4.2.2). Placed just before that GEMM, which is the one it hides under with
    ``tp_comm_overlap`` (Transformer Engine's bulk all-gather overlap with the dgrad GEMM)."""
    return tuple(
        Collective(
            c.name + " (again, for the weight gradient)",
            c.kind,
            c.group,
            c.size_bytes,
            regathered=True,
        )
        for c in collectives
        if c.kind == "all-gather"
    )


def _norm(
    spec: ModelSpec, x: _Dims, name: str, out_bytes: int | None = None
) -> tuple[Streaming, Streaming]:
    """Forward and backward of a LayerNorm / RMSNorm over ``Ts`` tokens: forward reads
    x and writes y (``out_bytes`` an element, default the model's: 1 where Transformer
    Engine's norm writes FP8, :class:`_Fp8Casts`); backward reads x and dy and writes
    dx, then reads x and dy again for the gain (and bias) gradients (Apex's fused layer
    norm: ``cuComputeGradInput`` and ``cuComputePartGradGammaBeta`` are two kernels over
    the same tensors)."""
    elems = x.Ts * x.h
    out = x.d if out_bytes is None else out_bytes
    return Streaming(name, elems * (x.d + out)), Streaming(name + " (backward)", 5 * elems * x.d)


@dataclass(frozen=True, slots=True)
class _Fp8Casts:
    """Transformer Engine's quantization kernels around one FP8 linear layer (nothing
    unless the model trains in fp8): ``forward`` before its forward GEMM (before the
    all-gather of its input with sequence parallelism), ``output_grad`` before its
    input-gradient GEMM, ``weight_grad`` before its weight-gradient GEMM; ``norm_bytes``
    the bytes an element of the norm fused into it (``LayerNormLinear``) writes."""

    forward: tuple[Streaming, ...] = ()
    output_grad: tuple[Streaming, ...] = ()
    weight_grad: tuple[Streaming, ...] = ()
    norm_bytes: int | None = None


def _fp8_bytes(spec: ModelSpec, x: _Dims) -> int:
    """Bytes an element of the tensor-parallel all-gathers feeding an FP8 GEMM: 1 when
    training in fp8 (Transformer Engine quantizes the local shard and all-gathers FP8:
    ``_all_gather_fp8`` in ``transformer_engine/pytorch/distributed.py``), else the
    model's."""
    return 1 if spec.dtype == "fp8" else x.d


def _fp8_casts(
    spec: ModelSpec, x: _Dims, name: str, shape: tuple[int, int], /, *, column: bool, sp: bool,
    norm: bool = False,
) -> _Fp8Casts:  # fmt: skip
    """The FP8 casts of a linear layer of ``shape`` (in, out features on this device), as
    Transformer Engine runs them (``_Linear`` and ``_LayerNormLinear`` in
    ``transformer_engine/pytorch/module/linear.py`` and ``layernorm_linear.py`` at v2.9,
    Megatron-Bridge v0.2.0's, to v2.12, v0.3.0's; v1.7 moves the same bytes but for a
    row-parallel input with sequence parallelism, which it casts row-wise and transposes
    in the backward: ``n`` bytes more, not priced). Per tensor scaling quantizes a bf16
    tensor of ``n`` elements by reading ``d n`` and writing ``n`` (the row-wise FP8
    copy the GEMM reads) and, where the weight gradient needs it, ``n`` more (the
    transposed copy: Hopper's FP8 GEMMs take only the "TN" layout); ``tensorwise``
    (current scaling) first reads the tensor once for its amax
    (``Float8CurrentScalingQuantizer::quantize_impl``: ``nvte_compute_amax`` then
    ``nvte_quantize_v2``); ``delayed`` scales by the amax history and updates it in the
    cast itself. A sequence-split input (column-parallel, ``sp``) or output gradient
    (row-parallel, ``sp``) is cast row-wise only before its FP8 all-gather; the
    gathered FP8 tensor is transposed for the weight gradient (read ``n``, write ``n``).
    A fused norm (``norm``) writes FP8 itself with ``delayed`` (``Impl::FULLY_FUSED``
    in ``csrc/extensions/normalization.cpp``; a separate FP8 transpose,
    ``nvte_transpose`` in ``common/normalization``) and bf16 and its amax with
    ``tensorwise`` (``FUSED_NORM_AMAX_FP8``: then the cast without the amax pass).
    The weight's cast runs on the first micro-batch of a step only (Megatron-Core passes
    ``is_first_microbatch``; ``get_weight_workspace`` caches it), not priced here."""
    if spec.dtype != "fp8":
        return _Fp8Casts()
    d, n_in, n_out = x.d, *shape
    current = spec.fp8_recipe == "tensorwise"
    split_in, split_out = column and sp, not column and sp
    x_elems = (x.Ts if split_in else x.T) * n_in
    dy_elems = (x.Ts if split_out else x.T) * n_out
    both = "cast" if split_in else "cast + transpose"
    forward: tuple[Streaming, ...]
    if norm and not current:  # the norm writes FP8; the transposed copy apart
        transpose = Streaming(f"{name} input transpose (fp8)", 2 * x_elems)
        forward = () if split_in else (transpose,)
    else:
        amax = (Streaming(f"{name} input amax", d * x_elems),) if current and not norm else ()
        cast = Streaming(f"{name} input {both} (fp8)", (d + 1 + (not split_in)) * x_elems)
        forward = (*amax, cast)
    grad = "cast" if split_out else "cast + transpose"
    output_grad = (
        *((Streaming(f"{name} output grad amax", d * dy_elems),) if current else ()),
        Streaming(f"{name} output grad {grad} (fp8)", (d + 1 + (not split_out)) * dy_elems),
    )
    # the FP8 tensor all-gathered row-wise (a column-parallel layer's input, a
    # row-parallel layer's output gradient), transposed for the weight gradient
    what, width = (f"{name} input", n_in) if column else (f"{name} output grad", n_out)
    weight_grad = (Streaming(f"{what} transpose (fp8)", 2 * x.T * width),) if sp else ()
    return _Fp8Casts(forward, output_grad, weight_grad, 1 if norm and not current else None)


def _residual(spec: ModelSpec, x: _Dims, name: str) -> tuple[Streaming, Streaming]:
    """Bias + dropout + residual add, fused (``bias_dropout_add_fused_train``): reads
    the branch output and the residual, writes the sum and the mask; backward reads
    the mask and dy, writes the branch's gradient (the residual's is dy itself)."""
    elems = x.Ts * x.h
    mask = MASK_BYTES * elems if spec.dropout else 0
    forward = 3 * elems * x.d + mask
    backward = (2 * elems * x.d + mask) if spec.dropout else 0  # no dropout: dy passes through
    kernels = Streaming(name, forward), Streaming(name + " (backward)", backward)
    return kernels


def _rotary(spec: ModelSpec, x: _Dims) -> tuple[tuple[Kernel, ...], tuple[Kernel, ...]]:
    """Rotary embedding of q and k (read and write both), forward and backward; none
    with learned positions."""
    if spec.learned_positions:
        return (), ()
    qk = x.T * (x.q + x.kv) // x.t
    return (
        (Streaming("rotary embedding", 2 * qk * x.d),),
        (Streaming("rotary embedding (backward)", 2 * qk * x.d),),
    )


def _attention_core(spec: ModelSpec, x: _Dims) -> tuple[tuple[Kernel, ...], tuple[Kernel, ...]]:
    """The core attention between the rotary embedding and the output projection:
    forward and I kernels (what selective recomputation repeats, Korthikanti et al. 2023
    section 5: Megatron-LM's ``CoreAttention``)."""
    s_kv = spec.seq_length  # every query attends over the whole sequence
    b_local = x.T * x.c // spec.seq_length  # sequences in the micro-batch
    q_tokens = x.T // b_local  # query tokens per sequence on this device
    dh = spec.head_size
    if spec.flash_attention:
        # causal: half the s x s products; FlashAttention-2 sec. 4.1 counts them so
        full = 4 * b_local * x.heads * q_tokens * s_kv * dh
        forward_flops = full // 2
        return (Attention("flash attention", forward_flops),), (
            Attention("flash attention (backward)", forward_flops * 5 // 2, backward=True),
        )
    batch = b_local * x.heads
    scores = x.heads * b_local * q_tokens * s_kv
    mask = MASK_BYTES * scores if spec.dropout else 0
    # the context comes out [batch*heads, s, dh] and is permuted back to [s, b, h/t] with a
    # copy (Megatron-LM's ``context_layer.permute(...).contiguous()``), and the backward of
    # splitting the fused QKV output into q, k, v concatenates their gradients
    context_elems = x.T * x.q // x.t
    qkv_elems = x.T * (x.q + 2 * x.kv) // x.t
    fwd = (
        Gemm("scores", q_tokens, s_kv, dh, batch, low_precision=False),
        # scale + mask + softmax, fused: read the scores, write the probabilities
        Streaming("softmax", 2 * scores * x.d),
        *((Streaming("attention dropout", 2 * scores * x.d + mask),) if spec.dropout else ()),
        Gemm("context", q_tokens, dh, s_kv, batch, low_precision=False),
        Streaming("context permute", 2 * context_elems * x.d),
    )
    bwd = (
        Streaming("context permute (backward)", 2 * context_elems * x.d),
        # d(probs) = d(context) V^T and dV = probs^T d(context)
        Gemm("context (input grad)", q_tokens, s_kv, dh, batch, low_precision=False),
        Gemm("context (value grad)", s_kv, dh, q_tokens, batch, low_precision=False),
        *(
            (Streaming("attention dropout (backward)", 2 * scores * x.d + mask),)
            if spec.dropout
            else ()
        ),
        # softmax backward reads the probabilities and their gradient, writes the scores'
        Streaming("softmax (backward)", 3 * scores * x.d),
        Gemm("scores (query grad)", q_tokens, dh, s_kv, batch, low_precision=False),
        Gemm("scores (key grad)", s_kv, dh, q_tokens, batch, low_precision=False),
        Streaming("qkv split (backward)", 2 * qkv_elems * x.d),
    )
    return fwd, bwd


def _context_exchange(
    spec: ModelSpec, x: _Dims
) -> tuple[tuple[Collective, ...], tuple[Collective, ...]]:
    """Ring attention's K/V exchange: C - 1 steps of this device's K and V chunk forward;
    backward sends K/V again and their gradients (twice the bytes)."""
    if x.c == 1:
        return (), ()
    chunk = 2 * x.T * x.kv // x.t * x.d  # K and V of this device's tokens
    return (
        (Collective("context-parallel K/V", "ring", "context", chunk, steps=x.c - 1),),
        (
            Collective(
                "context-parallel K/V and grads", "ring", "context", 2 * chunk, steps=x.c - 1
            ),
        ),
    )


@dataclass(frozen=True, slots=True)
class BlockHalf:
    """The attention or the MLP half of a block: F, I and W kernels in the order they run,
    what selective recomputation repeats, and its bias elements per token."""

    forward: tuple[Kernel, ...]
    input_grad: tuple[Kernel, ...]
    weight_grad: tuple[Kernel, ...]
    recomputed: tuple[Kernel, ...] = ()
    bias_width: int = 0
    """Bias elements per token whose gradients W reduces (0 without biases)."""


def _in_grad(x: _Dims, sp: bool) -> tuple[Collective, ...]:
    """Identity forward, all-reduce backward before a column-parallel linear without
    sequence parallelism (Megatron's ``f``)."""
    if sp or x.t == 1:
        return ()
    return (Collective("input grad", "all-reduce", "tensor", x.T * x.h * x.d),)


def attention_half(spec: ModelSpec, x: _Dims, sp: bool, /) -> BlockHalf:
    """Norm, QKV, rotary embedding, core attention, output projection and residual of a
    (grouped-query) multi-head attention block (with their FP8 casts, :func:`_fp8_casts`:
    the QKV is Megatron-Core's ``TELayerNormColumnParallelLinear``, the projection its
    ``TERowParallelLinear``)."""
    t = x.t
    qkv = Gemm("qkv", x.T, (x.q + 2 * x.kv) // t, x.h)
    proj = Gemm("attention projection", x.T, x.h, x.q // t)
    c_qkv = _fp8_casts(spec, x, "qkv", (x.h, qkv.n), column=True, sp=sp, norm=True)
    c_proj = _fp8_casts(spec, x, "attention projection", (proj.k, x.h), column=False, sp=sp)
    norm1, norm1_b = _norm(spec, x, "norm 1", c_qkv.norm_bytes)
    res1, res1_b = _residual(spec, x, "residual 1")
    rope, rope_b = _rotary(spec, x)
    core, core_b = _attention_core(spec, x)
    ring, ring_b = _context_exchange(spec, x)
    fp8 = _fp8_bytes(spec, x)
    ag1 = _to_model_parallel(x, sp, "all-gather before qkv", fp8)
    out1 = _from_model_parallel(x, sp, "after attention projection")
    forward: tuple[Kernel, ...] = (
        norm1, *c_qkv.forward, *ag1, qkv, *rope, *ring, *core, *c_proj.forward, proj, *out1,
        res1,
    )  # fmt: skip
    backward: tuple[Kernel, ...] = (
        res1_b, *c_proj.output_grad, *_backward_of(out1, x, sp, fp8), _input_grad(proj),
        *ring_b, *core_b, *rope_b, *c_qkv.output_grad, *_regathered(ag1), _input_grad(qkv),
        *(_backward_of(ag1, x, sp) or _in_grad(x, sp)), norm1_b,
    )  # fmt: skip
    weight: tuple[Kernel, ...] = (
        *c_proj.weight_grad, _weight_grad(proj), *c_qkv.weight_grad, _weight_grad(qkv),
    )  # fmt: skip
    # selective recomputation checkpoints the core attention whatever its kernel, a fused
    # (flash) one and its context-parallel ring included: Megatron-Core's
    # ``Attention.checkpoint_core_attention`` (``recompute_granularity == 'selective'``,
    # ``megatron/core/transformer/attention.py``) re-runs ``self.core_attention`` forward
    # in the backward
    recomputed = (*ring, *core)
    bias = x.h + (x.q + 2 * x.kv) // t if spec.bias else 0
    return BlockHalf(forward, backward, weight, recomputed, bias)


def mlp_half(spec: ModelSpec, x: _Dims, sp: bool, /, *, width: int | None = None) -> BlockHalf:
    """Norm, MLP (``width``, default the model's) and residual of a dense block, with
    their FP8 casts (MLP up is a ``TELayerNormColumnParallelLinear``, down a
    ``TERowParallelLinear``)."""
    t = x.t
    f = x.f if width is None else width
    n_in = 2 if spec.gated_mlp else 1
    up = Gemm("mlp up", x.T, n_in * f // t, x.h)
    down = Gemm("mlp down", x.T, x.h, f // t)
    c_up = _fp8_casts(spec, x, "mlp up", (x.h, up.n), column=True, sp=sp, norm=True)
    c_down = _fp8_casts(spec, x, "mlp down", (down.k, x.h), column=False, sp=sp)
    norm2, norm2_b = _norm(spec, x, "norm 2", c_up.norm_bytes)
    res2, res2_b = _residual(spec, x, "residual 2")
    act, act_b = _activation(spec, x.T * f // t, x.d, "")
    fp8 = _fp8_bytes(spec, x)
    ag2 = _to_model_parallel(x, sp, "all-gather before mlp", fp8)
    out2 = _from_model_parallel(x, sp, "after mlp down")
    forward: tuple[Kernel, ...] = (
        norm2, *c_up.forward, *ag2, up, act, *c_down.forward, down, *out2, res2,
    )  # fmt: skip
    backward: tuple[Kernel, ...] = (
        res2_b, *c_down.output_grad, *_backward_of(out2, x, sp, fp8), _input_grad(down), act_b,
        *c_up.output_grad, *_regathered(ag2), _input_grad(up),
        *(_backward_of(ag2, x, sp) or _in_grad(x, sp)), norm2_b,
    )  # fmt: skip
    weight: tuple[Kernel, ...] = (
        *c_down.weight_grad, _weight_grad(down), *c_up.weight_grad, _weight_grad(up),
    )  # fmt: skip
    return BlockHalf(forward, backward, weight, (), x.h + n_in * f // t if spec.bias else 0)


def _activation(spec: ModelSpec, elems: int, d: int, prefix: str) -> tuple[Streaming, Streaming]:
    """The MLP's activation function over ``elems`` outputs, forward and backward."""
    if spec.gated_mlp:  # SwiGLU: read gate and up, write the product
        return (
            Streaming(prefix + "swiglu", 3 * elems * d),
            Streaming(prefix + "swiglu (backward)", 5 * elems * d),  # read 3, write 2 grads
        )
    # bias + GeLU, fused (bias_gelu_impl): read, write
    return Streaming(prefix + "gelu", 2 * elems * d), Streaming(
        prefix + "gelu (backward)", 3 * elems * d
    )


def assemble_block(
    spec: ModelSpec, shard: Shard, x: _Dims, attention: BlockHalf, mlp: BlockHalf, /
) -> LayerKernels:
    """A block from its halves: attention then MLP forward, the reverse backward, with
    the recomputation ``shard`` asks for and one bias-gradient reduction."""
    forward = attention.forward + mlp.forward
    backward = mlp.input_grad + attention.input_grad
    if shard.recompute == "full":
        backward = forward + backward
    elif shard.recompute == "selective":
        backward = attention.recomputed + mlp.recomputed + backward
    weight: list[Kernel] = [*mlp.weight_grad, *attention.weight_grad]
    if spec.bias:  # bias gradients: a reduction over the tokens of each output gradient
        weight.append(Streaming("bias grads", (mlp.bias_width + attention.bias_width) * x.T * x.d))
    return LayerKernels(forward=forward, input_grad=backward, weight_grad=tuple(weight))


def block_kernels(spec: ModelSpec, shard: Shard, /) -> LayerKernels:
    """The kernels of one transformer block's F, I and W on one device (the dense MLP of
    a model with expert layers among its first blocks)."""
    x = _dims(spec, shard)
    sp = shard.sequence_parallel and x.t > 1
    return assemble_block(spec, shard, x, _attention(spec, x, sp), mlp_half(spec, x, sp))


def _attention(spec: ModelSpec, x: _Dims, sp: bool) -> BlockHalf:
    """The attention half the model has: multi-head latent attention or (grouped-query)
    multi-head attention."""
    if spec.mla is not None:
        from pipesim.plan.mla import mla_half

        return mla_half(spec, x, sp)
    return attention_half(spec, x, sp)


def moe_block_kernels(spec: ModelSpec, shard: Shard, /) -> LayerKernels:
    """The kernels of one block whose MLP is a mixture of experts (:mod:`pipesim.plan.moe`)."""
    from pipesim.plan.moe import moe_half

    x = _dims(spec, shard)
    sp = shard.sequence_parallel and x.t > 1
    return assemble_block(spec, shard, x, _attention(spec, x, sp), moe_half(spec, shard, x, sp))


def _input_grad(g: Gemm) -> Gemm:
    """``dX = dY W^T`` of a linear layer's forward GEMM ``g``."""
    return Gemm(g.name + " (input grad)", g.m, g.k, g.n, g.batch, g.low_precision)


def _weight_grad(g: Gemm) -> Gemm:
    """``dW = X^T dY`` of a linear layer's forward GEMM ``g``."""
    return Gemm(g.name + " (weight grad)", g.k, g.n, g.m, g.batch, g.low_precision)


def embedding_kernels(spec: ModelSpec, shard: Shard, /) -> LayerKernels:
    """Token (and position) embedding: a gather of rows, the vocabulary-parallel
    all-reduce (reduce-scatter with sequence parallelism), dropout; W scatters the
    gradient into the table and accumulates it into the fp32 main gradient
    (Megatron-LM's ``VocabParallelEmbedding``; torch's embedding backward writes a
    dense table-sized gradient)."""
    x = _dims(spec, shard)
    sp = shard.sequence_parallel and x.t > 1
    elems = x.T * x.h
    forward: list[Kernel] = [Streaming("embedding lookup", 2 * elems * x.d)]
    forward += _from_model_parallel(x, sp, "embedding")
    if spec.learned_positions:
        forward.append(Streaming("position embedding add", 3 * x.Ts * x.h * x.d))
    if spec.dropout:
        forward.append(
            Streaming("embedding dropout", 2 * x.Ts * x.h * x.d + MASK_BYTES * x.Ts * x.h)
        )
    table = spec.vocab_size * x.h // x.t
    backward: list[Kernel] = []
    if spec.dropout:
        backward.append(
            Streaming(
                "embedding dropout (backward)", 2 * x.Ts * x.h * x.d + MASK_BYTES * x.Ts * x.h
            )
        )
    backward += _backward_of(_from_model_parallel(x, sp, "embedding"), x, sp)
    weight = (
        Streaming("embedding grad", elems * x.d + table * x.d),
        Streaming("embedding grad accumulation", table * (x.d + 2 * FP32)),
    )
    return LayerKernels(forward=tuple(forward), input_grad=tuple(backward), weight_grad=weight)


def head_kernels(spec: ModelSpec, shard: Shard, /) -> LayerKernels:
    """Final norm, the vocabulary-parallel LM head and the cross-entropy loss.

    The loss is Megatron-LM's unfused ``vocab_parallel_cross_entropy``
    (``megatron/core/tensor_parallel/cross_entropy.py``, ``VocabParallelCrossEntropy``;
    the jit-fused one is opt-in, ``--cross-entropy-loss-fusion``), one PyTorch kernel
    per line of it over the ``T x V / t`` logits (:func:`_cross_entropy`), with three
    tiny all-reduces over the tensor-parallel group.
    """
    x = _dims(spec, shard)
    sp = shard.sequence_parallel and x.t > 1
    v = spec.vocab_rows(x.t)
    norm, norm_b = _norm(spec, x, "final norm")
    gather = _to_model_parallel(x, sp, "all-gather before head")
    # Megatron-Core's output layer is ``tensor_parallel.ColumnParallelLinear``
    # (``GPTModel.__init__``, ``megatron/core/models/gpt/gpt_model.py``, core_r0.8.0 and
    # after), not a Transformer Engine module: bf16 GEMMs in an fp8 model too
    logits = Gemm("lm head", x.T, v, x.h, low_precision=False)
    loss, loss_b = _cross_entropy(x.T * v, x.d)
    tiny: tuple[Kernel, ...] = ()
    if x.t > 1:
        tiny = tuple(
            Collective(f"loss {what}", "all-reduce", "tensor", x.T * FP32)
            for what in ("max", "sum", "target")
        )
    in_grad = (
        ()
        if sp or x.t == 1
        else (Collective("head input grad", "all-reduce", "tensor", x.T * x.h * x.d),)
    )
    forward: tuple[Kernel, ...] = (norm, *gather, logits, *loss, *tiny)
    backward: tuple[Kernel, ...] = (
        *loss_b,
        *_regathered(gather),
        _input_grad(logits),
        *(_backward_of(gather, x, sp) or in_grad),
        norm_b,
    )
    return LayerKernels(forward=forward, input_grad=backward, weight_grad=(_weight_grad(logits),))


def _cross_entropy(elems: int, d: int) -> tuple[tuple[Streaming, ...], tuple[Streaming, ...]]:
    """The loss's passes over ``elems`` logits of ``d`` bytes, forward and backward, as
    ``VocabParallelCrossEntropy`` runs them (Megatron-LM, ``megatron/core/tensor_parallel/
    cross_entropy.py``): ``.float()`` (read d, write 4), ``max`` over the vocabulary (read
    4), the in-place ``-= logits_max`` (read and write 4), ``torch.exp(out=)`` (read and
    write 4), ``sum`` (read 4) and the in-place ``div_`` into the softmax kept for the
    backward (read and write 4); the backward's in-place ``mul_`` by the loss gradient
    (read and write 4), and autograd's cast of that fp32 gradient back to the logits'
    dtype (read 4, write d). The target's gather and scatter touch one element a token.

    >>> fwd, bwd = _cross_entropy(1, 2)
    >>> sum(k.bytes_moved for k in fwd), sum(k.bytes_moved for k in bwd)
    (38, 14)
    """
    forward = (
        Streaming("cross entropy: to fp32", elems * (d + FP32)),
        Streaming("cross entropy: max", elems * FP32),
        Streaming("cross entropy: subtract max", elems * 2 * FP32),
        Streaming("cross entropy: exp", elems * 2 * FP32),
        Streaming("cross entropy: sum", elems * FP32),
        Streaming("cross entropy: softmax", elems * 2 * FP32),
    )
    backward = (
        Streaming("cross entropy (backward): scale", elems * 2 * FP32),
        Streaming("cross entropy (backward): to logits' dtype", elems * (FP32 + d)),
    )
    return forward, backward


#: Layer kinds of a model given by its shapes, as :mod:`pipesim.plan.layers` names them.
LAYER_KINDS = ("embedding", "block", "head")
#: ... and of a model with mixture-of-experts blocks.
MOE_LAYER_KINDS = ("embedding", "block", "moe block", "head")


def layer_kinds(spec: ModelSpec, /) -> tuple[str, ...]:
    """The layer kinds of ``spec``: :data:`MOE_LAYER_KINDS` with expert layers."""
    return LAYER_KINDS if spec.moe is None else MOE_LAYER_KINDS


def layer_kernels(spec: ModelSpec, kind: str, shard: Shard, /) -> LayerKernels:
    """The kernels of the layer ``kind`` (embedding, block, moe block or head)."""
    build = {
        "embedding": embedding_kernels,
        "block": block_kernels,
        "moe block": moe_block_kernels,
        "head": head_kernels,
    }
    return build[kind](spec, shard)
