"""Pricing a layer's kernels on an accelerator: each by what bounds it.

:mod:`pipesim.plan.kernels` says what a layer runs; this module says how long that
takes on one :class:`~pipesim.plan.hardware.Accelerator`, from its data file
(``pipesim/data/accelerators.json``, every number with its public source):

- a GEMM runs at the rate measured for its shape where the accelerator names a GEMM
  table (:mod:`pipesim.plan.gemm_table`: the H100 family, from OpenXLA's measured
  table); otherwise at the accelerator's *achievable* matmul rate (``matmul_efficiency``
  of the dense peak: the largest rate a measured sweep of GEMM shapes reached), less what
  its shape wastes: cuBLAS cuts the output into tiles, one thread block per tile, and
  the tiles run in *waves* of one per SM, so a shape that leaves tiles partly filled
  (tile quantization) or the last wave partly full (wave quantization) loses that share
  (NVIDIA, "Matrix Multiplication Background User's Guide", Deep Learning Performance
  documentation: sections "Tile Quantization" and "Wave Quantization"). cuBLAS picks
  the tile that wastes least; :data:`TILES` are the tile shapes that guide names. A
  GEMM also cannot beat reading its operands and writing its result at the achievable
  HBM rate (a roofline), nor, in bf16 / fp16, the accelerator's sustained matmul rate
  (``sustained_matmul_flops``: the steady rate at the power limit, where the table and
  the achievable rate are short bursts);
- fused attention at its measured share of peak, forward and backward apart (the
  FlashAttention-2 / -3 papers' figures);
- a streaming (memory-bound) kernel moves its bytes at the achievable HBM rate
  (``memory_bandwidth x memory_efficiency``);
- a collective by the NCCL ring formulas of :mod:`pipesim.plan.collectives` on the
  link its group uses (a tensor-parallel group inside a node when it fits there, the
  devices ordered tp-cp-dp-pp as Megatron-Core's ``parallel_state`` orders them), at
  the link's measured bus bandwidth; the context-parallel ring as point-to-point
  messages.

Communication runs on its own stream where the framework overlaps it: ring attention's
K/V exchange under the attention of the chunk in hand (Megatron-Core, Transformer
Engine's ``AttnFuncWithCPAndKVP2P``), and with ``tp_comm_overlap`` (Transformer
Engine's userbuffers, Megatron-LM's ``--tp-comm-overlap``) each tensor-parallel
all-gather under the GEMM it feeds and each reduce-scatter under the GEMM that makes
it. Only the part longer than what hides it adds to the pass. Without that option
Megatron-LM runs tensor-parallel collectives between the kernels, fully exposed.

>>> from pipesim.plan.hardware import get_accelerator
>>> from pipesim.plan.kernels import Gemm
>>> a100 = get_accelerator("a100-80gb")
>>> g = Gemm("square", 8192, 8192, 8192)
>>> round(gemm_seconds(g, a100, dtype_bytes=2) * 1e3, 2)   # 1.1 TFLOP at the capped 257 TFLOP/s
4.28
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from pipesim.plan.collectives import all_gather_s, all_to_all_s, allreduce_s, reduce_scatter_s
from pipesim.plan.gemm_table import gemm_table
from pipesim.plan.hardware import Accelerator
from pipesim.plan.kernels import (
    Attention,
    Collective,
    Gemm,
    Kernel,
    LayerKernels,
    Shard,
    Streaming,
    layer_kernels,
    layer_kinds,
)
from pipesim.plan.model import ModelSpec

__all__ = [
    "TILES",
    "LayerTime",
    "PassTime",
    "collective_seconds",
    "gemm_seconds",
    "kernel_seconds",
    "layer_times",
    "price_layer",
    "scatter_gather_seconds",
    "wave_utilization",
]

#: Output tile shapes (rows x columns) cuBLAS chooses among for large half-precision
#: GEMMs, as NVIDIA's "Matrix Multiplication Background User's Guide" describes them
#: (its tile quantization section: "256x128 ... 128x128 ... 64x128" tiles, larger tiles
#: reusing more data).
TILES = ((256, 128), (128, 256), (128, 128))


def wave_utilization(m: int, n: int, *, batch: int = 1, sm_count: int | None) -> float:
    """The share of the SMs' tile slots a GEMM's output fills, for the best tile:
    ``m n batch / (waves * SMs * tile area)``; 1 when the SM count is unknown.

    >>> wave_utilization(256, 128, sm_count=1)
    1.0
    >>> wave_utilization(256, 384, sm_count=4)   # 6 tiles of 128x128 in 2 waves of 4
    0.75
    """
    if sm_count is None:
        return 1.0
    best = 0.0
    for tm, tn in TILES:
        tiles = math.ceil(m / tm) * math.ceil(n / tn) * batch
        waves = math.ceil(tiles / sm_count)
        best = max(best, m * n * batch / (waves * sm_count * tm * tn))
    return best


def gemm_seconds(
    gemm: Gemm, accelerator: Accelerator, /, *, dtype_bytes: int, fp8: bool = False
) -> float:
    """Seconds of one GEMM: its FLOPs at the rate the accelerator's measured GEMM table
    gives its shape (:mod:`pipesim.plan.gemm_table`), or without one at the achievable
    matmul rate times its wave utilization; never faster than the accelerator's
    sustained matmul rate of its precision (both sources are short bursts, a rate a GPU
    at its power limit does not hold); never less than its operands' bytes at the
    achievable HBM rate."""
    low = fp8 and gemm.low_precision
    if accelerator.gemm_table is not None and not low:  # the tables hold bf16 GEMMs
        table = gemm_table(accelerator.gemm_table)
        rate = table.rate(gemm.m, gemm.n, gemm.k, batch=gemm.batch)
    else:
        peak, share = accelerator.peak_flops, accelerator.matmul_efficiency
        if low:
            peak, share = accelerator.fp8_flops, accelerator.fp8_matmul_share
        utilization = wave_utilization(
            gemm.m, gemm.n, batch=gemm.batch, sm_count=accelerator.sm_count
        )
        rate = peak * share * utilization
    sustained = (
        accelerator.fp8_sustained_matmul_flops if low else accelerator.sustained_matmul_flops
    )
    if sustained is not None:
        rate = min(rate, sustained)
    compute = gemm.flops / rate
    operand_bytes = gemm.operand_bytes(1 if low else dtype_bytes)
    return max(compute, operand_bytes / accelerator.achieved_memory_bandwidth)


def collective_seconds(
    collective: Collective, accelerator: Accelerator, /, *, shard: Shard
) -> float:
    """Seconds of a tensor-, context- or expert-parallel collective on its group's link."""
    if collective.group == "expert":
        return _all_to_all_seconds(collective, accelerator, shard=shard)
    if collective.group == "expert tensor":
        n, link = shard.expert_tensor, accelerator.group_link(shard.expert_tensor)
    elif collective.group == "tensor":
        n, link = shard.tensor, accelerator.group_link(shard.tensor)
    else:
        n, link = (
            shard.context,
            accelerator.group_link(shard.tensor * shard.context, apart=shard.tensor),
        )
    if n == 1:
        return 0.0
    size = collective.size_bytes
    if collective.kind == "all-reduce":
        return float(allreduce_s(size, n_devices=n, link=link))
    if collective.kind == "reduce-scatter":
        return float(reduce_scatter_s(size, n_devices=n, link=link))
    if collective.kind == "all-gather":
        return float(all_gather_s(size, n_devices=n, link=link))
    # the ring: each step sends one chunk to the next device while receiving one
    return collective.steps * (link.latency_s + size / link.bandwidth_bytes_per_s)


def scatter_gather_seconds(
    message_bytes: int, accelerator: Accelerator, /, *, tensor: int, sequence_parallel: bool
) -> float:
    """What the receiving rank of a pipeline send spends gathering it: Narayanan et al.
    2021's scatter/gather optimization (section 4.1) sends ``1/t`` of a stage's output
    from each of the ``t`` tensor-parallel ranks (the ``message_bytes`` each sends) and
    all-gathers the ``t`` parts over the receivers' tensor-parallel group (Megatron-LM's
    ``--scatter-gather-tensors-in-pipeline``, on by default). Nothing with sequence
    parallelism: the output is already split by sequence, each rank sends its own.

    >>> from pipesim.plan.hardware import get_accelerator
    >>> a100 = get_accelerator("a100-80gb")
    >>> scatter_gather_seconds(10**6, a100, tensor=8, sequence_parallel=True)
    0.0
    >>> ring = a100.group_link(8)   # 8 MB gathered over 8: 7/8 of it at the 8 MB busbw
    >>> got = scatter_gather_seconds(10**6, a100, tensor=8, sequence_parallel=False)
    >>> got == 7 / 8 * 8e6 / ring.bandwidth_at(8e6) + 7 * ring.latency_s
    True
    """
    if tensor == 1 or sequence_parallel:
        return 0.0
    return float(
        all_gather_s(message_bytes * tensor, n_devices=tensor, link=accelerator.group_link(tensor))
    )


def _all_to_all_seconds(collective: Collective, accelerator: Accelerator, *, shard: Shard) -> float:
    """The expert-parallel token exchange over ``e`` devices ``expert_tensor`` apart
    (Megatron-Core orders expert ranks expert-tensor innermost, then expert parallel),
    as many to a node as fit there."""
    g, n, apart = accelerator.gpus_per_node, shard.expert, shard.expert_tensor
    span = n * apart
    return float(
        all_to_all_s(
            collective.size_bytes,
            n_devices=n,
            per_node=n if span <= g and g % span == 0 else max(1, g // apart),
            intra=accelerator.link(inter_node=False),
            inter=accelerator.link(inter_node=True),
            fanout=collective.fanout,
            node_limit=collective.node_limit,
        )
    )


def kernel_seconds(
    kernel: Kernel,
    accelerator: Accelerator,
    /,
    *,
    shard: Shard,
    dtype_bytes: int,
    fp8: bool = False,
) -> float:
    """Seconds of any one kernel (see the module docstring)."""
    if isinstance(kernel, Gemm):
        return gemm_seconds(kernel, accelerator, dtype_bytes=dtype_bytes, fp8=fp8)
    if isinstance(kernel, Attention):
        share = (
            accelerator.attention_backward_efficiency
            if kernel.backward
            else accelerator.attention_forward_efficiency
        )
        return kernel.flops / (accelerator.peak_flops * share)
    if isinstance(kernel, Streaming):
        return kernel.bytes_moved / accelerator.achieved_memory_bandwidth
    return collective_seconds(kernel, accelerator, shard=shard)


@dataclass(frozen=True, slots=True)
class PassTime:
    """One pass (F, I or W) of a layer: seconds."""

    compute_s: float
    """GEMMs, attention and streaming kernels."""
    tp_comm_s: float
    """Tensor-parallel collectives, all of them."""
    tp_exposed_s: float
    """The part of them not hidden under a GEMM (all of it without comm overlap)."""
    cp_comm_s: float = 0.0
    """Context-parallel K/V exchange, all of it."""
    cp_exposed_s: float = 0.0
    """The part of it longer than the attention it runs under."""
    ep_comm_s: float = 0.0
    """Expert-parallel dispatch and combine (all-to-all), all of it: exposed, unless a
    schedule's overlapped F&B pair hides it (:mod:`pipesim.plan.overlap`)."""

    @property
    def total_s(self) -> float:
        """What the pass takes: compute and exposed communication."""
        return self.compute_s + self.tp_exposed_s + self.cp_exposed_s + self.ep_comm_s


@dataclass(frozen=True, slots=True)
class LayerTime:
    """A layer's F, I and W on one device."""

    forward: PassTime
    input_grad: PassTime
    weight_grad: PassTime


def _price_pass(
    kernels: tuple[Kernel, ...],
    accelerator: Accelerator,
    *,
    shard: Shard,
    dtype_bytes: int,
    fp8: bool,
    tp_comm_overlap: bool,
) -> PassTime:
    seconds = [
        kernel_seconds(k, accelerator, shard=shard, dtype_bytes=dtype_bytes, fp8=fp8)
        for k in kernels
    ]
    hosts = _overlap_hosts(kernels, accelerator, seconds) if tp_comm_overlap else {}
    compute = tp = tp_exposed = cp = ep = 0.0
    attention = 0.0
    for i, (kernel, time) in enumerate(zip(kernels, seconds, strict=True)):
        if not isinstance(kernel, Collective):
            compute += time
            if isinstance(kernel, Attention):  # context parallelism needs fused attention
                attention += time
        elif kernel.group == "context":
            cp += time
        elif kernel.group == "expert":
            ep += time
        else:
            tp += time
            j = hosts.get(i)
            tp_exposed += max(0.0, time - (0.0 if j is None else seconds[j]))
    return PassTime(
        compute_s=compute,
        tp_comm_s=tp,
        tp_exposed_s=tp_exposed,
        cp_comm_s=cp,
        cp_exposed_s=max(0.0, cp - attention),
        ep_comm_s=ep,
    )


#: SMs Transformer Engine's userbuffers leave to a collective it overlaps with a GEMM
#: by its "pipeline" and "bulk" methods (the GEMM runs on the rest: ``set_sm_margin``):
#: ``initialize_ub``'s defaults in ``transformer_engine/pytorch/module/base.py``,
#: ``"num_sm": 1 if method == "ring_exchange" else 16``. Its ring-exchange all-gathers
#: (before qkv and mlp up, and the backward's before the row-parallel input gradients)
#: copy with the copy engines and leave the GEMM every SM.
TP_OVERLAP_SMS = 16


def _overlap_hosts(
    kernels: tuple[Kernel, ...], accelerator: Accelerator, seconds: list[float]
) -> dict[int, int]:
    """With ``tp_comm_overlap``: for each tensor-parallel collective, the index of the GEMM
    it hides under; each GEMM that gives SMs to one (a reduce-scatter, Transformer
    Engine's "pipeline" and "bulk" methods, or the weight gradient's all-gather again,
    "bulk") runs on ``SMs - TP_OVERLAP_SMS`` of them, its time scaled in ``seconds``."""
    hosts: dict[int, int] = {}
    margin: set[int] = set()
    for i, kernel in enumerate(kernels):
        if not isinstance(kernel, Collective) or kernel.group in ("context", "expert"):
            continue
        j = _overlapping_gemm(kernels, i)
        if j is None:
            continue
        hosts[i] = j
        if kernel.kind == "reduce-scatter" or kernel.regathered:
            margin.add(j)
    sms = accelerator.sm_count
    if sms is not None and sms > TP_OVERLAP_SMS:
        for j in margin:
            seconds[j] *= sms / (sms - TP_OVERLAP_SMS)
    return hosts


def _overlapping_gemm(kernels: tuple[Kernel, ...], index: int) -> int | None:
    """Index of the GEMM a tensor-parallel collective overlaps with: the next one for
    an all-gather (it feeds it), the previous one otherwise (it made its input); None
    when another collective comes first."""
    kernel = kernels[index]
    assert isinstance(kernel, Collective)
    step = 1 if kernel.kind == "all-gather" else -1
    j = index + step
    while 0 <= j < len(kernels):
        if isinstance(kernels[j], Gemm):
            return j
        if isinstance(kernels[j], Collective):
            return None
        j += step
    return None


def price_layer(
    kernels: LayerKernels,
    accelerator: Accelerator,
    /,
    *,
    shard: Shard,
    dtype_bytes: int,
    fp8: bool = False,
    tp_comm_overlap: bool = False,
) -> LayerTime:
    """F, I and W of a layer's kernels on ``accelerator``."""
    priced = {
        name: _price_pass(
            pass_kernels,
            accelerator,
            shard=shard,
            dtype_bytes=dtype_bytes,
            fp8=fp8,
            tp_comm_overlap=tp_comm_overlap,
        )
        for name, pass_kernels in kernels.passes().items()
    }
    return LayerTime(**priced)


def layer_times(
    spec: ModelSpec, shard: Shard, accelerator: Accelerator, /, *, tp_comm_overlap: bool = False
) -> dict[str, LayerTime]:
    """Each layer kind's F, I and W (embedding, block, head, and moe block for a model
    with expert layers) for ``shard``; the model trains its GEMMs in FP8 when
    ``spec.dtype`` is ``fp8``."""
    return {
        kind: price_layer(
            layer_kernels(spec, kind, shard),
            accelerator,
            shard=shard,
            dtype_bytes=spec.dtype_bytes,
            fp8=spec.dtype == "fp8",
            tp_comm_overlap=tp_comm_overlap,
        )
        for kind in layer_kinds(spec)
    }
