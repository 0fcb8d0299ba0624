"""The rest of a training iteration around the pipeline: static memory, data-parallel
gradient traffic with the overlap Megatron-LM allows, and the optimizer step.

Static memory per device (Megatron-LM, ``docs/source/api-guide/dist_optimizer.md``,
the table of bytes per parameter; Rajbhandari et al., "ZeRO", SC 2020, section
3.1): mixed-precision Adam with bf16 weights and fp32 gradients keeps
``bytes_per_param = 18`` bytes per parameter: 2 (bf16 weights) + 4 (fp32
gradients) + 12 (fp32 master weights, momentum, variance). The distributed
optimizer (ZeRO-1) shards the 12 optimizer bytes over the d data-parallel
replicas: ``6 + 12 / d``.

Data-parallel traffic (each rank of a pipeline reduces its own stages'
gradients with the same rank of the other d - 1 pipelines), ring collectives
of :mod:`pipesim.plan.collectives`:

- without the distributed optimizer, one all-reduce of the gradients;
  Megatron-LM's ``--overlap-grad-reduce`` reduces buckets as the last
  micro-batch's backward produces them, so up to that backward's duration is
  hidden: exposed ``max(0, allreduce - last backward)``;
- with it, a reduce-scatter of the gradients (hidden behind the last backward
  in the same way) and, after the optimizer step, an all-gather of the updated
  bf16 weights, which ``--overlap-param-gather`` hides behind the next
  iteration's first forward: exposed ``max(0, RS - last backward) + max(0, AG -
  first forward)``.

The rank holding the first stage cannot hide the input word embedding's share at all
(Megatron-Core at core_r0.8.0): its gradient is the last the backward produces, so the
bucket holding it (gradient buckets of ``max(40M, 1M d)`` parameters by default, filled
in reverse order of the parameters: ``DistributedDataParallel.__init__``,
``megatron/core/distributed/distributed_data_parallel.py``) starts its reduction
(``Bucket.register_grad_ready``, ``param_and_grad_buffer.py``) only when the backward
has ended; and with ``--overlap-param-gather`` the all-gather of that same bucket, first
in forward order, is dispatched in ``optimizer.zero_grad`` and waited for by the
embedding's forward pre-hook before any compute (``DistributedOptimizer.zero_grad``,
``_make_forward_pre_hook``, ``megatron/core/optimizer/distrib_optimizer.py``). So on
that rank the exposed reduction is at least the embedding's, and so is the exposed
gather: ``max(RS - last backward, RS(embedding))`` and likewise for the gather
(:func:`rank_iteration`'s ``edge_params``; ``vocab / t x h`` parameters, a lower bound:
the bucket may hold more).

Ranks reduce in parallel (different groups), so the iteration adds the
largest exposed time of any rank; the time a rank waits for others to drain
the pipeline is not counted as overlap (an upper bound).

Optimizer step (memory bound, a streaming kernel of :mod:`pipesim.plan.gpu`: the bytes
at the achievable HBM rate), over the parameters held (the 1/d shard with the
distributed optimizer), per parameter: the gradient-norm for clipping reads the fp32
gradient (4 bytes; Megatron-LM's ``clip_grad_norm_fp32``, on by default with
``--clip-grad 1.0``); Adam reads the fp32 gradient, master weight, momentum and
variance and writes the last three (28); the updated master weight is copied into
the bf16 model weight (reads 4, writes 2); the gradient buffer is zeroed for the next
step (writes 4): 42 bytes. The zeroing covers the whole buffer, every parameter of the
rank, even when the distributed optimizer holds a shard (Megatron-Core's
``DistributedDataParallel.zero_grad_buffer`` resets each ``ParamAndGradBuffer``:
``self.grad_data.zero_()``, ``megatron/core/distributed/param_and_grad_buffer.py``).
An fp16 model keeps fp16 gradients and a loss scale (Megatron-LM's
``Float16OptimizerWithFloat16Params``, ``megatron/core/optimizer/optimizer.py``):
``_copy_model_grads_to_main_grads`` copies them into fp32 (reads 2, writes 4),
``_unscale_main_grads_and_check_for_nan`` unscales them in place (reads 4, writes 4),
and the buffer zeroed is fp16 (2): 54 bytes. (With bf16 the main gradient
is already fp32: ``.float()`` returns it, and there is no loss scale.) A bf16 model whose
gradients are reduced in bf16 (``--grad-reduce-in-bf16``,
:attr:`~pipesim.plan.model.ModelSpec.grad_reduce_in_bf16`) keeps a bf16 buffer: 16 bytes
a parameter at rest instead of 18 (the buffer's 2 for 4), half the bytes in the
data-parallel reduction, and a step that copies its shard of the buffer into fp32 first
(the distributed optimizer's ``_copy_model_grads_to_main_grads``:
``shard_main_param.grad = shard_model_grad.float()``, reads 2, writes 4) and zeroes a
bf16 buffer (2): 46 bytes.

Tied word embeddings (the GPT models' default: the LM head reuses the input embedding's
table) live twice with pipelining, on the first and on the last stage, and after the
data-parallel reduction Megatron-LM all-reduces the table's gradient between the two
(``_allreduce_word_embedding_grads`` in ``finalize_model_grads``,
``megatron/core/distributed/finalize_model_grads.py``: the whole ``main_grad`` of the
shared weight over the two-member embedding group, after ``finish_grad_sync`` and
before the optimizer step), so nothing hides it: :func:`embedding_sync_ns`.

Devices are ordered as Megatron-LM orders its groups, tensor parallel
innermost, then data parallel, then pipeline (``megatron/core/parallel_state.py``,
order "tp-dp-pp"): a data-parallel group stays inside a node when ``t d``
divides the GPUs per node, otherwise it uses the inter-node link.

>>> static_bytes(1000, data_parallel=4, distributed_optimizer=True)
9000
>>> static_bytes(1000, data_parallel=4, distributed_optimizer=False)
18000
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from fractions import Fraction

from pipesim.plan.collectives import all_gather_s, allreduce_s, reduce_scatter_s
from pipesim.plan.hardware import Accelerator, Interconnect
from pipesim.plan.model import ModelSpec
from pipesim.units import NS_PER_S

__all__ = [
    "ADAM_STEP_BYTES_PER_PARAM",
    "BF16_GRAD_ADAM_STEP_BYTES_PER_PARAM",
    "BF16_GRAD_BYTES_PER_PARAM",
    "BYTES_PER_PARAM",
    "FP16_ADAM_STEP_BYTES_PER_PARAM",
    "OPTIMIZER_BYTES_PER_PARAM",
    "RankIteration",
    "data_parallel_link",
    "default_bytes_per_param",
    "embedding_sync_ns",
    "optimizer_step_bytes",
    "rank_iteration",
    "static_bytes",
]

#: bf16 weights (2) + fp32 gradients (4) + fp32 master, momentum, variance (12).
BYTES_PER_PARAM = 18
#: ... with the gradients kept and reduced in bf16 (``--grad-reduce-in-bf16``): the
#: gradient buffer's 2 bytes for 4.
BF16_GRAD_BYTES_PER_PARAM = BYTES_PER_PARAM - 2
#: The part of BYTES_PER_PARAM the distributed optimizer shards over data parallel.
OPTIMIZER_BYTES_PER_PARAM = 12
#: Bytes the optimizer step moves per parameter held (see the module docstring): norm 4,
#: Adam 16 + 12, copy to the bf16 weights 4 + 2, zeroing the gradient buffer 4.
ADAM_STEP_BYTES_PER_PARAM = 42
#: ... for an fp16 model: + 6 (copy the fp16 gradient into fp32) + 8 (unscale it) - 2
#: (its zeroed buffer is fp16).
FP16_ADAM_STEP_BYTES_PER_PARAM = ADAM_STEP_BYTES_PER_PARAM + 6 + 8 - 2
#: ... for a bf16 gradient buffer: + 6 (copy the bf16 gradient into fp32) - 2 (its zeroed
#: buffer is bf16).
BF16_GRAD_ADAM_STEP_BYTES_PER_PARAM = ADAM_STEP_BYTES_PER_PARAM + 6 - 2


def optimizer_step_bytes(dtype: str, /, *, grad_reduce_in_bf16: bool = False) -> int:
    """Bytes the optimizer step moves per parameter held for a model trained in ``dtype``
    (see the module docstring), its gradients kept in bf16 if ``grad_reduce_in_bf16``.

    >>> optimizer_step_bytes("bf16"), optimizer_step_bytes("fp16")
    (42, 54)
    >>> optimizer_step_bytes("bf16", grad_reduce_in_bf16=True)
    46
    """
    if dtype == "fp16":
        return FP16_ADAM_STEP_BYTES_PER_PARAM
    if grad_reduce_in_bf16:
        return BF16_GRAD_ADAM_STEP_BYTES_PER_PARAM
    return ADAM_STEP_BYTES_PER_PARAM


def default_bytes_per_param(*, grad_reduce_in_bf16: bool) -> int:
    """Weights, gradients and optimizer state per parameter without the distributed
    optimizer, as Megatron-LM keeps them: :data:`BYTES_PER_PARAM`, or
    :data:`BF16_GRAD_BYTES_PER_PARAM` with a bf16 gradient buffer."""
    return BF16_GRAD_BYTES_PER_PARAM if grad_reduce_in_bf16 else BYTES_PER_PARAM


def static_bytes(
    params: int | float | Fraction,
    /,
    *,
    data_parallel: int,
    distributed_optimizer: bool,
    bytes_per_param: int = BYTES_PER_PARAM,
    optimizer_bytes_per_param: int = OPTIMIZER_BYTES_PER_PARAM,
) -> int:
    """Weights, gradients and optimizer state of ``params`` parameters on one device
    (an int, a Fraction, or a float taken exactly, as a notebook's ``n / (t * p)`` is).

    >>> static_bytes(10**9 / 8, data_parallel=8, distributed_optimizer=True)  # 6 + 12 / 8 a param
    937500000
    """
    shard = data_parallel if distributed_optimizer else 1
    optimizer = min(optimizer_bytes_per_param, bytes_per_param)
    # ceil(params (bytes - optimizer) + params optimizer / shard), in integers (an int or
    # a Fraction count has a numerator and a denominator): a sweep asks this per stage
    exact = params if isinstance(params, int | Fraction) else Fraction(params)
    n, d = exact.numerator, exact.denominator
    return -(-(n * ((bytes_per_param - optimizer) * shard + optimizer)) // (d * shard))


def data_parallel_link(
    accelerator: Accelerator, *, tensor: int, data_parallel: int
) -> Interconnect:
    """The link a data-parallel group uses (see the module docstring for the order)."""
    return accelerator.group_link(tensor * data_parallel, apart=tensor)


def embedding_sync_ns(
    spec: ModelSpec | None,
    placement: Sequence[int],
    /,
    *,
    accelerator: Accelerator,
    tensor: int,
    stage_devices: int,
) -> dict[int, int]:
    """Nanoseconds of the tied word embedding's gradient all-reduce (see the module
    docstring) on each pipeline rank that holds a copy: the ranks of the first and the
    last of the stages ``placement`` puts on ranks; none without tied embeddings or when
    one rank holds both (a V schedule's rank 0). ``vocab / t x h`` gradient elements in
    the data-parallel reduction's dtype, a ring of two devices, inside a node only when
    the whole pipeline group of ``ranks x stage_devices`` devices is (devices ordered
    tp-cp-dp-pp).

    >>> from pipesim.plan.hardware import get_accelerator
    >>> from pipesim.plan.model import ModelSpec
    >>> gpt = ModelSpec(n_layers=2, hidden=1024, n_heads=8, seq_length=512,
    ...     vocab_size=32000, tied_embeddings=True)
    >>> a100 = get_accelerator("a100-80gb")
    >>> embedding_sync_ns(gpt, [0, 1, 1, 0], accelerator=a100, tensor=1, stage_devices=1)
    {}
    """
    first, last = placement[0], placement[-1]
    if spec is None or not spec.tied_embeddings or first == last:
        return {}
    n_bytes = spec.vocab_rows(tensor) * spec.hidden * spec.grad_reduce_bytes
    inter = (max(placement) + 1) * stage_devices > accelerator.gpus_per_node
    seconds = allreduce_s(n_bytes, n_devices=2, link=accelerator.link(inter_node=inter))
    return dict.fromkeys((first, last), round(seconds * NS_PER_S))


@dataclass(frozen=True, slots=True, kw_only=True)
class RankIteration:
    """One rank's work after its pipeline part, integer nanoseconds."""

    dp_comm_ns: int
    """The whole data-parallel traffic (all-reduce, or reduce-scatter + all-gather),
    with the tied embedding's gradient all-reduce on the ranks that hold a copy."""
    dp_exposed_ns: int
    """The part not hidden behind the last backward / first forward."""
    optimizer_ns: int


def rank_iteration(
    params: int | Fraction,
    /,
    *,
    accelerator: Accelerator,
    tensor: int,
    data_parallel: int,
    distributed_optimizer: bool,
    grad_bytes_per_param: int,
    weight_bytes_per_param: int,
    last_backward_ns: int,
    first_forward_ns: int,
    overlap: bool = True,
    expert_params: int | Fraction = 0,
    expert_parallel: int = 1,
    expert_tensor: int = 1,
    step_bytes_per_param: int = ADAM_STEP_BYTES_PER_PARAM,
    embedding_sync: int = 0,
    edge_params: int | Fraction = 0,
) -> RankIteration:
    """Data-parallel traffic and optimizer step of a rank holding ``params`` parameters.

    ``expert_params`` of them are routed experts split over ``expert_parallel`` devices
    (each over ``expert_tensor``): their gradients are reduced (and, with the distributed
    optimizer, sharded) over the ``tensor x data_parallel / (expert_parallel x
    expert_tensor)`` devices that hold the same experts
    (Megatron-Core's expert data parallelism; here ``data_parallel`` counts d c), the
    two groups' traffic back to back behind the same backward and forward.
    ``embedding_sync``: nanoseconds of the tied embedding's all-reduce on this rank
    (:func:`embedding_sync_ns`), exposed after the gradients' reduction. ``edge_params``:
    the first stage's input word embedding, whose traffic nothing hides (module docstring).

    >>> from pipesim.plan.hardware import get_accelerator
    >>> h100 = get_accelerator("h100-sxm")
    >>> it = rank_iteration(10**9, accelerator=h100, tensor=8,
    ...     data_parallel=1, distributed_optimizer=False, grad_bytes_per_param=2,
    ...     weight_bytes_per_param=2, last_backward_ns=0, first_forward_ns=0)
    >>> it.dp_comm_ns   # no replicas
    0
    >>> it.optimizer_ns == round(42e9 / h100.achieved_memory_bandwidth * 1e9)  # 42 GB
    True
    >>> sharded = rank_iteration(10**9, accelerator=h100, tensor=8,
    ...     data_parallel=4, distributed_optimizer=True, grad_bytes_per_param=4,
    ...     weight_bytes_per_param=2, last_backward_ns=0, first_forward_ns=0)
    >>> sharded.optimizer_ns == round((38e9 / 4 + 4e9) / h100.achieved_memory_bandwidth * 1e9)
    True
    """
    groups = _replica_groups(
        params,
        expert_params,
        tensor=tensor,
        data_parallel=data_parallel,
        expert_span=expert_parallel * expert_tensor,
    )
    reduce, gather = _reduction_ns(
        groups,
        accelerator,
        distributed_optimizer=distributed_optimizer,
        grad_bytes_per_param=grad_bytes_per_param,
        weight_bytes_per_param=weight_bytes_per_param,
    )
    total = exposed = reduce + gather + embedding_sync
    if overlap:  # the embedding's reduction and gather hide behind nothing
        edge_reduce, edge_gather = _reduction_ns(
            [(Fraction(edge_params), data_parallel, tensor)] if edge_params else [],
            accelerator,
            distributed_optimizer=distributed_optimizer,
            grad_bytes_per_param=grad_bytes_per_param,
            weight_bytes_per_param=weight_bytes_per_param,
        )
        exposed -= min(max(0, reduce - edge_reduce), last_backward_ns)
        exposed -= min(max(0, gather - edge_gather), first_forward_ns)
    # the distributed optimizer holds each group's share of its parameters
    held = sum((n / r for n, r, _ in groups), Fraction(0)) if distributed_optimizer else params
    # the step over the parameters held, the zeroing of the gradient buffer over them all
    step_bytes = held * (step_bytes_per_param - grad_bytes_per_param)
    step_bytes += Fraction(params) * grad_bytes_per_param
    seconds = step_bytes / Fraction(repr(accelerator.achieved_memory_bandwidth))
    optimizer = round(seconds * NS_PER_S)
    return RankIteration(dp_comm_ns=total, dp_exposed_ns=exposed, optimizer_ns=optimizer)


def _replica_groups(
    params: int | Fraction,
    expert_params: int | Fraction,
    *,
    tensor: int,
    data_parallel: int,
    expert_span: int,
) -> list[tuple[Fraction, int, int]]:
    """The groups a rank's gradients are reduced over, as (parameters, replicas, devices
    apart): the dense part over the d replicas ``tensor`` apart; the routed experts over
    the t d / e devices holding the same experts, e = ``expert_span`` (expert x expert
    tensor parallel) apart within the t d devices."""
    groups = [(Fraction(params) - Fraction(expert_params), data_parallel, tensor)]
    if expert_params:
        replicas = max(1, tensor * data_parallel // expert_span)
        groups.append((Fraction(expert_params), replicas, expert_span))
    return groups


def _reduction_ns(
    groups: list[tuple[Fraction, int, int]],
    accelerator: Accelerator,
    *,
    distributed_optimizer: bool,
    grad_bytes_per_param: int,
    weight_bytes_per_param: int,
) -> tuple[int, int]:
    """Nanoseconds of the gradients' reduction and of the weights' gather after the step
    (0 without the distributed optimizer, whose gradients are all-reduced) over ``groups``
    (:func:`_replica_groups`), back to back."""
    reduce = gather = 0
    for n_params, replicas, apart in groups:
        link = data_parallel_link(accelerator, tensor=apart, data_parallel=replicas)
        grads = n_params * grad_bytes_per_param
        if distributed_optimizer:
            reduce += round(reduce_scatter_s(grads, n_devices=replicas, link=link) * NS_PER_S)
            weights = n_params * weight_bytes_per_param
            gather += round(all_gather_s(weights, n_devices=replicas, link=link) * NS_PER_S)
        else:
            reduce += round(allreduce_s(grads, n_devices=replicas, link=link) * NS_PER_S)
    return reduce, gather
