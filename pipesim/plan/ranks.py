"""Per pipeline rank of one configuration: what its stages put on it (parameters,
recomputation transient, tensor-parallel traffic), its static memory under the point's
sharding, and the iteration around the pipeline (data-parallel traffic, tied-embedding
sync, optimizer step: :mod:`pipesim.plan.iteration`).

- Data-parallel gradient traffic (over the d c devices that hold the same weights),
  its overlap and the optimizer step come after the pipeline.
- Full recomputation re-creates one block's activations at a time in the
  backward: the largest such transient on a rank is added to its peak.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

from pipesim.costs import CostModel
from pipesim.metrics import Metrics
from pipesim.plan.iteration import (
    RankIteration,
    embedding_sync_ns,
    rank_iteration,
    static_bytes,
)
from pipesim.plan.point import Point, SweepContext
from pipesim.plan.stage_costs import StageTable
from pipesim.plan.workload import Workload
from pipesim.schedule import Schedule

__all__ = ["RankLoads", "clear_caches", "rank_iterations", "rank_loads", "sharded_static_bytes"]

# -- per-process cache (a worker keeps it for its lifetime) ------------------------------
_ITERATIONS: dict[tuple[Any, ...], RankIteration] = {}


def clear_caches() -> None:
    """Forget every rank's iteration (a new sweep context)."""
    _ITERATIONS.clear()


@dataclass(frozen=True, slots=True)
class RankLoads:
    """Per rank what the schedule places on it, and the rank with the peak memory."""

    rank_params: list[int | Fraction]
    """Per rank: parameters of its stages."""
    rank_experts: list[int | Fraction]
    """Per rank: the routed experts' part of ``rank_params``."""
    first_stage: list[int | None]
    """Per rank: its first stage (None: it holds none)."""
    tp_ns: int
    """Tensor-parallel traffic of the busiest rank over the step."""
    peak_bytes: int
    """Largest over ranks of static memory + peak activations."""
    static_bytes: int
    """Static memory of the rank with the peak."""
    activation_bytes: int
    """Peak activations (with any recomputation transient) of the rank with the peak."""


def placed_params(
    placement: Sequence[int], table: StageTable, /, *, n_ranks: int
) -> tuple[list[int | Fraction], list[int | Fraction], list[int | None]]:
    """Per rank of ``n_ranks``: the parameters of the stages ``placement`` puts on it, the
    routed experts' part of them, and its first stage (None: it holds none)."""
    rank_params: list[int | Fraction] = [0] * n_ranks
    rank_experts: list[int | Fraction] = [0] * n_ranks
    first_stage: list[int | None] = [None] * n_ranks
    for stage, rank in enumerate(placement):
        rank_params[rank] += table.params[stage]
        if table.expert_params is not None:
            rank_experts[rank] += table.expert_params[stage]
        if first_stage[rank] is None:
            first_stage[rank] = stage
    return rank_params, rank_experts, first_stage


def rank_loads(
    context: SweepContext, point: Point, schedule: Schedule, table: StageTable, metrics: Metrics
) -> RankLoads:
    """Sum the stages' parameters, transients and tensor-parallel traffic onto the ranks
    that hold them, and find the rank with the most memory."""
    n_ranks = schedule.n_ranks
    rank_params, rank_experts, first_stage = placed_params(
        schedule.placement, table, n_ranks=n_ranks
    )
    rank_transient = [0] * n_ranks
    rank_tp = [0] * n_ranks
    for stage, rank in enumerate(schedule.placement):
        rank_transient[rank] = max(rank_transient[rank], table.transient[stage])
        rank_tp[rank] += table.tp_ns[stage] * point.n_microbatches
    static = [
        sharded_static_bytes(context, point, rank_params[r], rank_experts[r])
        for r in range(n_ranks)
    ]
    activation = [r.peak_activation_bytes + rank_transient[r.rank] for r in metrics.ranks]
    peak, peak_rank = max((static[r] + activation[r], -r) for r in range(n_ranks))
    peak_rank = -peak_rank
    return RankLoads(
        rank_params=rank_params,
        rank_experts=rank_experts,
        first_stage=first_stage,
        tp_ns=max(rank_tp),
        peak_bytes=peak,
        static_bytes=static[peak_rank],
        activation_bytes=activation[peak_rank],
    )


def sharded_static_bytes(
    context: SweepContext, point: Point, params: int | Fraction, expert_params: int | Fraction
) -> int:
    """Weights, gradients and optimizer state of ``params`` on one device: the
    distributed optimizer shards them over the gradient group, and the routed experts'
    part over the expert-data-parallel group, the ``t c d / e`` devices that hold the
    same experts (Megatron-Core's expert data parallelism)."""

    def sharded(n: int | Fraction, group: int) -> int:
        return static_bytes(
            n,
            data_parallel=group,
            distributed_optimizer=point.distributed_optimizer,
            bytes_per_param=context.bytes_per_param,
            optimizer_bytes_per_param=context.optimizer_bytes_per_param,
        )

    if not expert_params:
        return sharded(params, point.gradient_group)
    edp = max(1, point.gradient_group * point.tensor // point.expert_devices)
    return sharded(params - expert_params, point.gradient_group) + sharded(expert_params, edp)


def rank_iterations(
    context: SweepContext,
    workload: Workload,
    point: Point,
    placement: Sequence[int],
    costs: CostModel,
    rank_params: Sequence[int | Fraction],
    first_stage: Sequence[int | None],
    rank_experts: Sequence[int | Fraction] | None = None,
) -> list[RankIteration]:
    """Per rank, the iteration around the pipeline (:func:`pipesim.plan.iteration.rank_iteration`)
    of the ``rank_params`` its stages hold (``rank_experts`` of them routed experts; None:
    none counted), its first stage's F and backward, and the tied-embedding sync of
    ``placement``; the rank holding the first stage also the input word embedding's
    ``vocab / t x h`` parameters, whose reduction and gather nothing hides."""
    sync = _embedding_syncs(context, workload, point, placement)
    spec = workload.spec
    embedding = 0 if spec is None else spec.vocab_rows(point.tensor) * spec.hidden
    return [
        _rank_iteration(
            context,
            workload,
            point,
            rank_params[r],
            costs,
            first,
            expert_params=0 if rank_experts is None else rank_experts[r],
            embedding_sync=sync.get(r, 0),
            edge_params=embedding if r == placement[0] else 0,
        )
        for r, first in enumerate(first_stage)
    ]


def _embedding_syncs(
    context: SweepContext, workload: Workload, point: Point, placement: Sequence[int]
) -> dict[int, int]:
    """Per end rank, the tied word-embedding gradient all-reduce after the pipeline
    (:func:`pipesim.plan.iteration.embedding_sync_ns`), for ``point``'s placement."""
    return embedding_sync_ns(
        workload.spec,
        placement,
        accelerator=context.accelerator,
        tensor=point.tensor,
        stage_devices=point.tensor * point.gradient_group,
    )


def _rank_iteration(
    context: SweepContext,
    workload: Workload,
    point: Point,
    params: int | Fraction,
    costs: CostModel,
    first_stage: int | None,
    *,
    expert_params: int | Fraction = 0,
    embedding_sync: int = 0,
    edge_params: int = 0,
) -> RankIteration:
    stage = costs.stage(first_stage if first_stage is not None else 0)
    # ranks of equal stages (most of a pipeline's middle) give the same answer
    key = (
        params,
        expert_params,
        point.expert_parallel,
        point.expert_tensor,
        point.tensor,
        point.gradient_group,
        point.distributed_optimizer,
        workload.grad_bytes_per_param,
        workload.weight_bytes_per_param,
        workload.step_bytes_per_param,
        stage.backward,
        stage.forward,
        embedding_sync,
        edge_params,
        context.overlap_grad_reduce,
        context.accelerator,
    )
    found = _ITERATIONS.get(key)
    if found is not None:
        return found
    if len(_ITERATIONS) > 4096:
        _ITERATIONS.clear()
    found = _ITERATIONS[key] = rank_iteration(
        params,
        accelerator=context.accelerator,
        tensor=point.tensor,
        data_parallel=point.gradient_group,
        distributed_optimizer=point.distributed_optimizer,
        grad_bytes_per_param=workload.grad_bytes_per_param,
        weight_bytes_per_param=workload.weight_bytes_per_param or workload.grad_bytes_per_param,
        last_backward_ns=int(stage.backward),
        first_forward_ns=int(stage.forward),
        overlap=context.overlap_grad_reduce,
        expert_params=expert_params,
        expert_parallel=point.expert_parallel,
        expert_tensor=point.expert_tensor,
        step_bytes_per_param=workload.step_bytes_per_param,
        embedding_sync=embedding_sync,
        edge_params=edge_params,
    )
    return found
