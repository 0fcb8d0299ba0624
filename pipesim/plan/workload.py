"""What the planner splits into stages: a sequence of indivisible layers with costs.

A :class:`Workload` comes from a :class:`~pipesim.plan.model.ModelSpec` (costs
in FLOPs, turned into time by the accelerator) or from a pipesim cost file,
such as the one ``pipesim calibrate`` or ``pipesim verify --costs-out`` writes
(each stage of the file becomes one indivisible layer).

A model's layer costs are per sequence; a stage of micro-batch size b costs b times as
much. A cost file's stages are priced from the file itself at each micro-batch size
(:mod:`pipesim.plan.measured`: a fixed overhead plus a cost per row, fitted from two
measured sizes, :mod:`pipesim.scaling`); its layers' per-sequence costs (the
measurement divided by its rows) only balance the cut.

>>> from pipesim.plan.model import get_model
>>> w = workload_from_model(get_model("llama2-7b"))
>>> len(w.layers), w.layers[0].name, w.layers[-1].name   # embedding, 32 blocks, head
(34, 'embedding', 'head')
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from fractions import Fraction
from typing import Any

from pipesim.costs import CostModel, StageCost
from pipesim.errors import ParseError, PlanError
from pipesim.plan.iteration import ADAM_STEP_BYTES_PER_PARAM, optimizer_step_bytes
from pipesim.plan.kernels import check_context_parallel
from pipesim.plan.layers import model_flops_per_sequence, model_layers
from pipesim.plan.measured import MeasuredCosts
from pipesim.plan.model import DTYPE_BYTES, ModelSpec
from pipesim.plan.moe import check_expert_parallel
from pipesim.units import NS_PER_S, SECONDS_PER_UNIT

__all__ = ["Layer", "Workload", "workload_from_costs", "workload_from_model"]

Amount = int | Fraction

#: Seconds per unit of the ``time_unit`` a cost file's ``meta`` may name (one table for all
#: of pipesim: :data:`pipesim.units.SECONDS_PER_UNIT`).
TIME_UNITS = SECONDS_PER_UNIT


@dataclass(frozen=True, slots=True, kw_only=True)
class Layer:
    """One indivisible slice of the model; costs per sequence."""

    name: str
    forward: Amount
    """F work: FLOPs for a model given by its shapes (they balance the cut; time is priced
    kernel by kernel, :mod:`pipesim.plan.gpu`), seconds for a cost file's layers."""
    backward: Amount
    """Full backward B work."""
    input_grad: Amount
    """I work."""
    weight_grad: Amount
    """W work."""
    activation_bytes: Amount
    weight_grad_bytes: Amount
    params: Amount
    """Parameters on one device (static memory is ``params * bytes_per_param``)."""
    transient_bytes: Amount = 0
    """Bytes alive during one pass and freed by it (full recomputation's re-created
    block, an expert layer's dispatch buffers)."""
    expert_params: Amount = 0
    """The part of ``params`` that is routed experts (sharded over expert data parallel)."""

    @property
    def work(self) -> Amount:
        """F + B: what the partitioner balances."""
        return self.forward + self.backward


@dataclass(frozen=True, slots=True, kw_only=True)
class Workload:
    """Layers in model order, plus what the metrics need."""

    name: str
    layers: tuple[Layer, ...]
    message_bytes: Amount
    """Bytes of the activation passed between stages, per sequence."""
    grad_bytes_per_param: int
    """Bytes per gradient element in the data-parallel all-reduce."""
    weight_bytes_per_param: int | None = None
    """Bytes per weight element in the distributed optimizer's all-gather (None: the
    gradient's)."""
    step_bytes_per_param: int = ADAM_STEP_BYTES_PER_PARAM
    """Bytes the optimizer step moves per parameter held (:func:`optimizer_step_bytes`)."""
    seq_length: int | None
    """Tokens per sequence, for tokens/s (None if unknown)."""
    flops_per_sequence: int | None
    """Model FLOPs of forward + backward of one sequence, for MFU (None if unknown)."""
    spec: ModelSpec | None = None
    tensor: int = 1
    """Tensor-parallel size t the layer costs are per device of."""
    sequence_parallel: bool = False
    recompute: str = "none"
    """Activation recomputation: none, selective or full."""
    context: int = 1
    """Context-parallel size c the layer costs are per device of (each holds s / c of
    every sequence)."""
    expert: int = 1
    """Expert-parallel size e the layer costs are per device of (each holds experts / e
    of every expert layer's routed experts)."""
    expert_tensor: int = 1
    """Expert tensor parallelism: each routed expert's matrices split this many ways."""
    measured: MeasuredCosts | None = None
    """A cost file's own model: what the sweep prices each micro-batch size from."""

    @property
    def sharding(self) -> tuple[int, bool, str, int, int, int]:
        """How the layer costs are split: (t, sequence parallel, recomputation, c, e,
        expert tensor), as :attr:`pipesim.plan.point.Point.sharding` asks for them."""
        return (
            self.tensor,
            self.sequence_parallel,
            self.recompute,
            self.context,
            self.expert,
            self.expert_tensor,
        )


def workload_from_model(
    spec: ModelSpec,
    /,
    *,
    tensor: int = 1,
    sequence_parallel: bool = False,
    recompute: str = "none",
    context: int = 1,
    expert: int = 1,
    expert_tensor: int = 1,
) -> Workload:
    """Embedding, blocks and head of ``spec`` with Narayanan / Korthikanti FLOPs and
    memory, per device of a ``tensor``-way tensor-parallel and ``context``-way
    context-parallel group (see :mod:`pipesim.plan.layers`).

    Between pipeline stages Megatron-LM sends each device's 1/t of the activation
    (Narayanan et al. 2021, section 4.1, scatter/gather optimisation; with sequence
    parallelism the activation is split anyway), so ``message_bytes`` is ``s h / t``
    elements; a context-parallel device holds and sends s / c of each sequence, and
    stores the activations of s / c tokens (the flash attention context parallelism
    needs stores nothing of size s x s).

    >>> from pipesim.plan.model import get_model
    >>> w = workload_from_model(get_model("llama2-7b"), tensor=4)
    >>> w.message_bytes == 4096 * 4096 * 2 // 4
    True
    >>> workload_from_model(get_model("llama2-7b"), context=2).message_bytes == 2048 * 4096 * 2
    True
    """
    if sequence_parallel and tensor == 1:
        sequence_parallel = False  # nothing to split: the same configuration
    local = spec
    check_context_parallel(spec, context)
    check_expert_parallel(spec, expert, expert_tensor=expert_tensor)
    if context > 1:
        local = replace(spec, seq_length=spec.seq_length // context)
    layers = tuple(
        Layer(
            name=layer.name,
            forward=layer.forward_flops,
            backward=layer.backward_flops,
            input_grad=layer.input_grad_flops,
            weight_grad=layer.weight_grad_flops,
            activation_bytes=layer.activation_bytes,
            weight_grad_bytes=layer.weight_grad_bytes,
            params=layer.params,
            transient_bytes=layer.transient_bytes,
            expert_params=layer.expert_params,
        )
        for layer in model_layers(
            local,
            tensor=tensor,
            sequence_parallel=sequence_parallel,
            recompute=recompute,
            expert=expert,
            expert_tensor=expert_tensor,
        )
    )
    payload = local.seq_length * spec.hidden * spec.dtype_bytes
    return Workload(
        name=spec.name,
        layers=layers,
        message_bytes=Fraction(payload, tensor) if payload % tensor else payload // tensor,
        grad_bytes_per_param=spec.grad_reduce_bytes,
        weight_bytes_per_param=spec.dtype_bytes,
        step_bytes_per_param=optimizer_step_bytes(
            spec.dtype, grad_reduce_in_bf16=spec.grad_reduce_in_bf16
        ),
        seq_length=spec.seq_length,
        flops_per_sequence=model_flops_per_sequence(spec),
        spec=spec,
        tensor=tensor,
        sequence_parallel=sequence_parallel,
        recompute=recompute,
        context=context,
        expert=expert,
        expert_tensor=expert_tensor,
    )


def workload_from_costs(
    costs: CostModel,
    /,
    *,
    meta: dict[str, Any] | None = None,
    name: str = "costs",
    microbatch_size: int | None = None,
    repeat: int | None = None,
) -> Workload:
    """Each stage of a pipesim cost model becomes one layer.

    ``meta`` is the cost file's ``meta`` object; the planner reads
    ``time_unit`` (s, ms, us, ns; default: the cost model's own unit when it has one,
    else s; verify writes ns),
    ``microbatch_size`` (sequences per measured micro-batch, default 1) and
    ``microbatch_scaling`` (a second measured size: :mod:`pipesim.scaling`),
    ``dtype`` of the parameters whose bytes the file lists (default fp32, what
    verify runs), ``seq_length`` (for tokens/s) and ``n_layers`` (how many
    times a single uniform ``stage`` entry repeats). Keyword arguments override.

    >>> from pipesim.costs import CostModel, StageCost
    >>> w = workload_from_costs(CostModel.uniform(forward=1, backward=2), repeat=4)
    >>> len(w.layers), w.layers[0].work == 3
    (4, True)
    """
    meta = dict(meta or {})
    seconds = _seconds_per_unit(costs, meta, name)
    b0 = microbatch_size if microbatch_size is not None else meta.get("microbatch_size", 1)
    if isinstance(b0, bool) or not isinstance(b0, int) or b0 < 1:
        raise ParseError(f"{name}: microbatch_size must be a whole number >= 1, got {b0!r}")
    dtype = meta.get("dtype", "fp32")
    if dtype not in DTYPE_BYTES:
        raise ParseError(f"{name}: meta.dtype must be one of {', '.join(DTYPE_BYTES)}")
    copies = repeat if repeat is not None else meta.get("n_layers")
    stages = _repeated_stages(costs, copies, name)
    layers = _unit_layers(stages, per_time=seconds / b0, b0=b0, param_bytes=DTYPE_BYTES[dtype])
    # the size rule reads meta.microbatch_size: the resolved one (given, meta or 1)
    measured = MeasuredCosts(
        costs=costs,
        meta={**meta, "microbatch_size": b0},
        repeat=1 if copies is None else copies,
        ns_per_unit=seconds * NS_PER_S,
    )
    measured.at(b0, source=name)  # a malformed meta.microbatch_scaling is refused here
    seq = meta.get("seq_length")
    return Workload(
        name=name,
        layers=layers,
        message_bytes=Fraction(max(c.output_bytes for c in stages), b0),
        grad_bytes_per_param=DTYPE_BYTES[dtype],
        seq_length=seq if isinstance(seq, int) and seq > 0 else None,
        flops_per_sequence=None,
        measured=measured,
    )


def _seconds_per_unit(costs: CostModel, meta: dict[str, Any], name: str) -> Fraction:
    """Seconds per unit of the file's times: ``meta.time_unit``, else the cost model's own
    unit when it has one, else seconds."""
    unit_name = meta.get("time_unit", costs.time_unit if costs.time_unit in TIME_UNITS else "s")
    if unit_name not in TIME_UNITS:
        raise ParseError(
            f"{name}: meta.time_unit must be one of {', '.join(TIME_UNITS)}, got {unit_name!r}"
        )
    return TIME_UNITS[unit_name]


def _repeated_stages(costs: CostModel, copies: object, name: str) -> tuple[StageCost, ...]:
    """The file's stages; with ``copies`` (``n_layers``), its single stage that many times."""
    stages = costs.stages
    if copies is not None:
        if isinstance(copies, bool) or not isinstance(copies, int) or copies < 1:
            raise ParseError(f"{name}: n_layers must be a whole number >= 1, got {copies!r}")
        if len(stages) != 1:
            raise PlanError(
                f"{name}: n_layers repeats a single uniform 'stage' entry, but the file lists "
                f"{len(stages)} stages; drop n_layers or give one entry"
            )
        stages = stages * copies
    return stages


def _unit_layers(
    stages: tuple[StageCost, ...], *, per_time: Fraction, b0: int, param_bytes: int
) -> tuple[Layer, ...]:
    """One layer per stage, its costs per sequence of a ``b0``-sequence measurement: times
    by ``per_time`` (seconds per unit and sequence), bytes by ``b0``; parameters from
    their bytes at ``param_bytes`` each."""
    return tuple(
        Layer(
            name=f"unit {i}",
            forward=Fraction(cost.forward) * per_time,
            backward=Fraction(cost.backward) * per_time,
            input_grad=Fraction(cost.input_grad) * per_time,
            weight_grad=Fraction(cost.weight_grad) * per_time,
            activation_bytes=Fraction(cost.activation_bytes, b0),
            weight_grad_bytes=Fraction(cost.weight_grad_bytes, b0),
            params=cost.param_bytes // param_bytes,
        )
        for i, cost in enumerate(stages)
    )
