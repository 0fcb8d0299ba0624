"""Mixture-of-experts blocks: the kernels and per-sequence costs of an expert MLP.

A block whose MLP is a mixture of experts (Fedus et al. 2022, "Switch Transformers";
DeepSeek-AI, "DeepSeek-V3 Technical Report", arXiv 2412.19437, section 2.1.2) runs, per
token: a router (a ``h x experts`` matmul, then the gate scores and the top-k choice),
its ``top_k`` routed experts and its ``shared_experts``; the routed outputs are summed
with the gate weights. With expert parallelism ``e`` the routed experts are split over
``e`` devices, ``experts / e`` whole experts each (expert tensor parallelism 1, as
DeepSeek-V3 trains, section 3.2: "64-way Expert Parallelism"), and every MoE layer
exchanges the tokens (Megatron-Core's ``MoEAlltoAllTokenDispatcher``; DeepSeek's
dispatch and combine kernels, section 3.2.2):

- F: permute the token copies into expert order, **dispatch** them (all-to-all), run
  the local experts as one grouped GEMM per matrix, **combine** the outputs back
  (all-to-all), unpermute and sum with the gate weights;
- I: the reverse, with the two all-to-alls carrying gradients (combine's backward is a
  dispatch, dispatch's a combine); W: the experts' and the router's weight gradients.

Load (documented assumption): each device routes its tokens' ``top_k`` copies evenly
over the experts, so a local expert runs ``tokens * top_k * e / experts`` tokens, times
:attr:`~pipesim.plan.model.MoESpec.load_factor` -- the capacity factor when experts are
padded to capacity, 1 for dropless routing (DeepSeek-V3's auxiliary-loss-free balancing
keeps experts balanced, section 2.1.2; a real step's busiest expert is somewhat above
the mean, which this does not price). The dispatch sends FP8 activations when the model
trains in fp8 (DeepSeek-V3 section 3.3.1, "we quantize the activation before MoE
up-projections into FP8 and then apply dispatch components"), the combine bf16.

With tensor parallelism each device routes only its sequence-parallel share of the
tokens (Megatron-Core requires sequence parallelism with MoE and tensor parallelism);
the shared experts are split t ways as a dense MLP.

Expert tensor parallelism ``et`` (Megatron-Core's ``--expert-tensor-parallel-size``)
splits each routed expert's matrices ``et`` ways (the up projection by columns, the
down projection by rows): after the dispatch the ``et`` devices of a group all-gather
their tokens, each runs its slice of the experts on all of them, and a reduce-scatter
sums the partial outputs before the combine (Megatron-Core's
``MoEAlltoAllTokenDispatcher``); an expert group then spans ``e x et`` devices, ``et``
apart.

>>> from pipesim.plan.kernels import Gemm, Shard, layer_kernels
>>> from pipesim.plan.model import get_model
>>> mixtral = get_model("mixtral-8x7b")
>>> k = layer_kernels(mixtral, "moe block", Shard(expert=8))
>>> up = next(g for g in k.forward if isinstance(g, Gemm) and g.name == "expert up")
>>> # 8 devices route 32768 tokens x 2 copies each to 8 experts, one expert a device
>>> (up.m, up.n, up.k, up.batch)
(65536, 28672, 4096, 1)
"""

from __future__ import annotations

import math
from fractions import Fraction
from typing import TYPE_CHECKING

from pipesim.errors import PlanError
from pipesim.plan.kernels import (
    FP32,
    BlockHalf,
    Collective,
    Gemm,
    Kernel,
    Shard,
    Streaming,
    _activation,
    _backward_of,
    _from_model_parallel,
    _input_grad,
    _norm,
    _regathered,
    _residual,
    _to_model_parallel,
    _weight_grad,
)
from pipesim.plan.layers import BlockTerms, LayerCost, attention_terms, block_cost, check_shard
from pipesim.plan.model import ModelSpec, MoESpec

if TYPE_CHECKING:
    from pipesim.plan.kernels import _Dims

__all__ = ["check_expert_parallel", "dispatch_bytes", "moe_block", "moe_half", "moe_terms"]


def _moe(spec: ModelSpec) -> MoESpec:
    if spec.moe is None:
        raise PlanError(f"model {spec.name} has no expert layers (its moe is null)")
    return spec.moe


def check_expert_parallel(
    spec: ModelSpec,
    e: int,
    /,
    *,
    tensor: int = 1,
    sp: bool = True,
    expert_tensor: int = 1,
) -> None:
    """PlanError unless ``e`` experts-parallel devices (and ``expert_tensor`` devices per
    expert) can split ``spec``'s experts: whole numbers dividing the routed experts and
    the expert width (1 for a dense model), and with tensor parallelism, sequence
    parallelism on."""
    for name, value in (("expert parallel", e), ("expert tensor parallel", expert_tensor)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise PlanError(f"{name} size must be a whole number >= 1, got {value!r}")
    if spec.moe is None:
        if e > 1 or expert_tensor > 1:
            raise PlanError(
                f"expert parallel size {e} (expert tensor parallel {expert_tensor}) needs a "
                f"model with expert layers; {spec.name} is dense: use 1"
            )
        return
    if spec.moe.expert_ffn_hidden % expert_tensor:
        raise PlanError(
            f"expert tensor parallel size {expert_tensor} must divide the expert width "
            f"{spec.moe.expert_ffn_hidden} of {spec.name}; pick a divisor"
        )
    if spec.moe.experts % e:
        raise PlanError(
            f"expert parallel size {e} must divide the {spec.moe.experts} routed experts of "
            f"{spec.name}; pick a divisor"
        )
    if tensor > 1 and not sp:
        raise PlanError(
            f"tensor parallel {tensor} with expert layers needs sequence parallelism, as "
            "Megatron-Core requires; turn --sequence-parallel on"
        )


def dispatch_bytes(spec: ModelSpec, /) -> int:
    """Bytes per element the dispatch sends: 1 when training in fp8 (DeepSeek-V3 section
    3.3.1), else the storage dtype's."""
    return 1 if spec.dtype == "fp8" else spec.dtype_bytes


def _load(spec: ModelSpec) -> Fraction:
    return Fraction(repr(_moe(spec).load_factor))


def moe_terms(spec: ModelSpec, /, *, expert: int = 1, expert_tensor: int = 1) -> BlockTerms:
    """Parameters, FLOPs and stored bytes of one expert MLP half per sequence (routed
    experts split over ``expert`` devices, each over ``expert_tensor``; tokens split t
    ways by sequence parallelism)."""
    et = expert_tensor
    moe = _moe(spec)
    s, h, d = spec.seq_length, spec.hidden, spec.dtype_bytes
    n_in = 2 if spec.gated_mlp else 1
    fe, k, n, ns = moe.expert_ffn_hidden, moe.top_k, moe.experts, moe.shared_experts
    one_expert = (n_in + 1) * h * fe
    rho = _load(spec)
    copies = rho * k * s  # routed token copies this device routes, per sequence
    # the gathered input (et devices' copies), up output and down input (their 1/et
    # slices of all of them), the output
    routed_stored = copies * d * (et * h + n_in * fe + fe + h)
    return BlockTerms(
        split_params=ns * one_expert,
        replicated_params=n * h + (3 * h if spec.bias else h),  # router, norm
        local_params=Fraction(n * one_expert, expert * et),
        # router, shared experts and the top-k routed experts of every token (balanced)
        weighted_flops=2 * s * h * n + 2 * s * (ns + k) * one_expert,
        seq_bytes=2 * d * s * h,  # norm input, router and shared-expert input [W]
        # the shared experts' activation input(s) and second input [W], the fp32 gate
        # scores, the routed tokens' activations
        head_bytes=math.ceil(ns * (n_in + 1) * d * s * fe + FP32 * s * n + routed_stored),
        wgrad_seq=d * s * h,
        wgrad_replicated=d * s * h if ns else 0,  # the shared experts' output gradient
        # shared experts' inputs and gradients, the routed experts' inputs and I's
        # gradients of their outputs, the router's logits gradient
        wgrad_split=math.ceil(
            ns * (n_in + 1) * d * s * fe + copies * d * (et * h + fe + n_in * fe + h) + FP32 * s * n
        ),
        # the dispatch's send and receive buffers of one layer (and the gathered tokens)
        transient_bytes=2 * copies * h * dispatch_bytes(spec)
        + (et * copies * h * d if et > 1 else 0),
    )


def moe_block(
    spec: ModelSpec,
    /,
    *,
    tensor: int = 1,
    sequence_parallel: bool = False,
    recompute: str = "none",
    expert: int = 1,
    expert_tensor: int = 1,
) -> LayerCost:
    """One block whose MLP is a mixture of experts, on one of ``tensor`` devices and one
    of ``expert`` expert-parallel devices (each expert over ``expert_tensor``)."""
    check_shard(spec, tensor, recompute)
    check_expert_parallel(spec, expert, expert_tensor=expert_tensor)
    if spec.mla is not None:
        from pipesim.plan.mla import mla_terms

        attention = mla_terms(spec)
    else:
        attention = attention_terms(spec)
    cost = block_cost(
        spec,
        (attention, moe_terms(spec, expert=expert, expert_tensor=expert_tensor)),
        name="moe block",
        tensor=tensor,
        sequence_parallel=sequence_parallel,
        recompute=recompute,
    )
    return cost


def moe_half(spec: ModelSpec, shard: Shard, x: _Dims, sp: bool, /) -> BlockHalf:
    """The kernels of one expert MLP half (F, I, W) on one device."""
    moe = _moe(spec)
    e, et = shard.expert, shard.expert_tensor
    check_expert_parallel(spec, e, tensor=x.t, sp=sp, expert_tensor=et)
    n_in = 2 if spec.gated_mlp else 1
    fe, k, n, ns = moe.expert_ffn_hidden, moe.top_k, moe.experts, moe.shared_experts
    tokens = x.Ts  # the tokens this device routes (its sequence-parallel share)
    local = n // e
    per_expert = math.ceil(_load(spec) * tokens * k * e / n)  # tokens this device receives
    gathered = per_expert * et  # the expert-tensor group's tokens, each a slice of experts
    h, d = x.h, x.d
    norm2, norm2_b = _norm(spec, x, "norm 2")
    res2, res2_b = _residual(spec, x, "residual 2")
    router = Gemm("router", tokens, n, h, low_precision=False)
    gate = Streaming("gate scores and top-k", tokens * n * (d + 2 * FP32))
    permute = Streaming("token permute", 2 * tokens * k * h * d)
    unpermute = Streaming("token unpermute and gate sum", (k + 1) * tokens * h * d)

    def exchange(name: str, elem_bytes: int) -> Collective:
        size = tokens * k * h * elem_bytes
        return Collective(name, "all-to-all", "expert", size, fanout=k, node_limit=moe.node_limit)

    up = Gemm("expert up", gathered, n_in * fe // et, h, batch=local)
    down = Gemm("expert down", gathered, h, fe // et, batch=local)
    act, act_b = _activation(spec, gathered * local * fe // et, d, "expert ")
    gather: tuple[Collective, ...] = ()
    scatter: tuple[Collective, ...] = ()
    if et > 1:  # Megatron's gather_from / reduce_scatter_to the expert-tensor group
        size = gathered * local * h * d  # the whole gathered buffer
        gather = (Collective("expert tokens all-gather", "all-gather", "expert tensor", size),)
        scatter = (
            Collective("expert output reduce-scatter", "reduce-scatter", "expert tensor", size),
        )
    shared_f: tuple[Kernel, ...] = ()
    shared_b: tuple[Kernel, ...] = ()
    shared_w: tuple[Kernel, ...] = ()
    if ns:  # as a dense MLP of ns experts' width, split t ways
        s_up = Gemm("shared expert up", x.T, n_in * ns * fe // x.t, h)
        s_down = Gemm("shared expert down", x.T, h, ns * fe // x.t)
        s_act, s_act_b = _activation(spec, x.T * ns * fe // x.t, d, "shared expert ")
        # their own names: the routed experts' gather / scatter above stay as they are
        s_gather = _to_model_parallel(x, sp, "all-gather before shared experts")
        s_scatter = _from_model_parallel(x, sp, "after shared experts")
        shared_f = (*s_gather, s_up, s_act, s_down, *s_scatter)
        shared_b = (
            *_backward_of(s_scatter, x, sp), _input_grad(s_down), s_act_b,
            *_regathered(s_gather), _input_grad(s_up), *_backward_of(s_gather, x, sp),
        )  # fmt: skip
        shared_w = (_weight_grad(s_down), _weight_grad(s_up))
    forward: tuple[Kernel, ...] = (
        norm2, router, gate, permute, exchange("moe dispatch", dispatch_bytes(spec)),
        *gather, up, act, down, *scatter, exchange("moe combine", d), unpermute, *shared_f,
        res2,
    )  # fmt: skip
    backward: tuple[Kernel, ...] = (
        res2_b, *shared_b, Streaming("token unpermute (backward)", (k + 1) * tokens * h * d),
        exchange("moe combine (backward)", d), *_swapped(scatter), _input_grad(down), act_b,
        _input_grad(up), *_swapped(gather), exchange("moe dispatch (backward)", d),
        Streaming("token permute (backward)", 2 * tokens * k * h * d),
        Streaming("gate scores (backward)", tokens * n * (d + 2 * FP32)), _input_grad(router),
        norm2_b,
    )  # fmt: skip
    weight = (_weight_grad(down), _weight_grad(up), _weight_grad(router), *shared_w)
    return BlockHalf(forward, backward, weight)


def _swapped(collectives: tuple[Collective, ...]) -> tuple[Collective, ...]:
    """The backward of an all-gather is a reduce-scatter, and back."""
    swap = {"all-gather": "reduce-scatter", "reduce-scatter": "all-gather"}
    return tuple(
        Collective(c.name + " (backward)", swap[c.kind], c.group, c.size_bytes) for c in collectives
    )
