"""The values a sweep passes between its parts: a configuration (:class:`Point`), what
every worker evaluates it with (:class:`SweepContext`), and its outcome
(:class:`Evaluation`)."""

from __future__ import annotations

from dataclasses import dataclass
from fractions import Fraction

from pipesim.errors import PlanError
from pipesim.plan.hardware import Accelerator
from pipesim.plan.iteration import BYTES_PER_PARAM, OPTIMIZER_BYTES_PER_PARAM
from pipesim.plan.workload import Workload, workload_from_model

__all__ = ["Evaluation", "Point", "SweepContext"]


@dataclass(frozen=True, slots=True, kw_only=True)
class Point:
    """One configuration of the sweep."""

    schedule: str
    pipeline: int
    """Pipeline degree p: ranks per pipeline (``--pipeline-parallel``)."""
    virtual: int
    """Stages per rank asked of the schedule."""
    microbatch_size: int
    n_microbatches: int
    data_parallel: int
    tensor: int = 1
    """Tensor-parallel size t (``--tensor-parallel``)."""
    sequence_parallel: bool = False
    recompute: str = "none"
    """Activation recomputation: none, selective or full."""
    distributed_optimizer: bool = False
    """Optimizer state sharded over the data-parallel replicas (ZeRO-1)."""
    context_parallel: int = 1
    """Context-parallel size c (``--context-parallel``): each sequence split over c devices
    (ring attention)."""
    expert_parallel: int = 1
    """Expert-parallel size e (``--expert-parallel``): each expert layer's routed experts
    split over e devices
    (taken from the t c d devices that hold one pipeline stage, as Megatron-Core does)."""
    expert_tensor: int = 1
    """Expert tensor parallelism (``--expert-tensor-parallel``): each routed expert split
    over this many devices (an
    expert group spans e x this of the t c d devices)."""

    @property
    def gradient_group(self) -> int:
        """Devices that hold the same weights and reduce their gradients together: the
        data-parallel and context-parallel ranks (Megatron-Core's dp-cp group), over
        which the distributed optimizer also shards."""
        return self.data_parallel * self.context_parallel

    @property
    def sharding(self) -> tuple[int, bool, str, int, int, int]:
        """The split of the layer costs this point needs: (t, sequence parallel, which
        applies only when t > 1, recomputation, c, e, expert tensor), as
        :attr:`pipesim.plan.workload.Workload.sharding` says a workload's."""
        return (
            self.tensor,
            self.sequence_parallel and self.tensor > 1,
            self.recompute,
            self.context_parallel,
            self.expert_parallel,
            self.expert_tensor,
        )

    @property
    def expert_devices(self) -> int:
        """Devices one expert layer's routed experts are split over: e x expert tensor."""
        return self.expert_parallel * self.expert_tensor


@dataclass(frozen=True, slots=True, kw_only=True)
class SweepContext:
    """Everything a worker needs besides the points."""

    workload: Workload
    """The model at t = 1 without recomputation (other variants are derived from its
    ``spec``; a cost-file workload has only this one)."""
    accelerator: Accelerator
    devices: int
    bytes_per_param: int = BYTES_PER_PARAM
    """Weights + gradients + optimizer state per parameter without the distributed
    optimizer (:mod:`pipesim.plan.iteration`)."""
    optimizer_bytes_per_param: int = OPTIMIZER_BYTES_PER_PARAM
    """The part of ``bytes_per_param`` the distributed optimizer shards."""
    memory_capacity_bytes: int
    engine: str = "fast"
    """``fast`` (pipesim.plan.fastsim) or ``simpy`` (the reference engine)."""
    overlap_grad_reduce: bool = True
    """Hide data-parallel traffic behind the last backward / first forward."""
    tp_comm_overlap: bool = False
    """Hide tensor-parallel collectives under the GEMMs next to them (Megatron-LM's
    ``--tp-comm-overlap``, :mod:`pipesim.plan.gpu`)."""
    overlap_p2p: bool = False
    """Pipeline sends run beside compute (Megatron-Core's ``--overlap-p2p-communication``,
    torch.distributed.pipelining's isend); False, Megatron-LM's default: a rank waits for
    its send and receive to finish (``p2p_communication._communicate`` waits on every
    request before it returns), :attr:`pipesim.costs.CostModel.blocking_sends`."""

    def workload_for(self, point: Point, /) -> Workload:
        """The workload of ``point``'s tensor parallelism and recomputation."""
        w = self.workload
        if point.sharding == w.sharding:
            return w
        if w.spec is None:
            raise PlanError(
                f"{w.name} is a cost file: tensor parallelism and recomputation apply only to "
                "a model given by its shapes (a preset, a model file or --layers/--hidden/...)"
            )
        tensor, sequence_parallel, recompute, context, expert, expert_tensor = point.sharding
        return workload_from_model(
            w.spec,
            tensor=tensor,
            sequence_parallel=sequence_parallel,
            recompute=recompute,
            context=context,
            expert=expert,
            expert_tensor=expert_tensor,
        )


@dataclass(frozen=True, slots=True, kw_only=True)
class Evaluation:
    """A point's outcome: ``reason`` set when infeasible, else the numbers."""

    reason: str | None = None
    stopped: bool = False
    """Not evaluated: the sweep stopped (deadline or Ctrl-C) first."""
    n_stages: int = 0
    layers_per_stage: tuple[int, ...] = ()
    """Per stage of one model copy."""
    makespan_ns: int = 0
    """Pipeline time of one step (tensor-parallel traffic included in F / I)."""
    tp_comm_ns: int = 0
    """Tensor- and context-parallel communication not hidden, inside the pipeline time,
    on the busiest rank over the step."""
    dp_comm_ns: int = 0
    """Data-parallel traffic of the rank with the most (all of it, hidden or not)."""
    dp_exposed_ns: int = 0
    """Data-parallel traffic not hidden, added to the iteration (the largest of any rank)."""
    optimizer_ns: int = 0
    """Optimizer step (the largest of any rank)."""
    allreduce_ns: int = 0
    """What the iteration adds after the pipeline: exposed data-parallel traffic and
    optimizer step, the largest over ranks."""
    bubble: Fraction = Fraction(0)
    """Idle share of ranks x pipeline time (Metrics.bubble_ratio)."""
    peak_memory_bytes: int = 0
    """Largest over ranks of static (params + grads + optimizer) + peak activations."""
    static_bytes: int = 0
    """Static memory of the rank with the peak."""
    activation_bytes: int = 0
    """Peak activations (with any recomputation transient) of the rank with the peak."""
    fingerprint: str = ""
    """Digest of the generated schedule: equal for identical per-rank orders."""
