"""The sweep's evaluations scored into a :class:`~pipesim.plan.result.PlanResult`: each
configuration's step time, throughput, MFU and fit, identical twins dropped, the winner's
sends priced, ranked (:func:`~pipesim.plan.result.rank_points`), and ranked again by the
steady-state period under another optimizer synchronization."""

from __future__ import annotations

import math
from dataclasses import fields, replace

from pipesim.iterations import DEFAULT_SYNC
from pipesim.plan.evaluation import pipeline_comm_ns
from pipesim.plan.hardware import Accelerator
from pipesim.plan.point import Evaluation, Point, SweepContext
from pipesim.plan.result import PlanPoint, PlanResult, from_plan_point, rank_points, to_plan_point
from pipesim.plan.settings import Settings
from pipesim.plan.workload import Workload
from pipesim.units import NS_PER_S, format_bytes

__all__ = [
    "by_period",
    "plan_result",
    "twin_key",
    "twin_preference",
    "unranked_beyond",
]


def by_period(
    result: PlanResult, context: SweepContext, *, sync: str, candidates: int
) -> PlanResult:
    """``result`` ranked by the steady-state period under ``sync``. Under ``global`` that
    is the sweep's step time already. Otherwise the ``candidates`` fastest that fit are
    re-simulated under ``sync`` (:func:`pipesim.plan.period.period_ns`) and every point
    ranked again: a period under ``post-validation`` or ``none`` is never longer than under
    ``global`` (each rank is released no later), so the others keep an upper bound."""
    if sync == DEFAULT_SYNC:
        return replace(result, optimizer_sync=sync)
    from pipesim.plan.period import period_ns

    chosen = {id(p) for p in result.fitting[:candidates]}
    points = []
    for point in result.points:
        if id(point) in chosen:
            assert point.allreduce_time_ns is not None
            ns = period_ns(
                context, from_plan_point(point), after_ns=point.allreduce_time_ns, sync=sync
            )
            tokens, mfu = _throughput(
                ns,
                workload=context.workload,
                accelerator=context.accelerator,
                devices=context.devices,
                global_batch=result.global_batch,
            )
            point = replace(point, step_time_ns=ns, tokens_per_s=tokens, mfu=mfu, period_sync=sync)
        points.append(point)
    ranked = _with_winner_sends(context, rank_points(points))
    return replace(result, points=ranked, optimizer_sync=sync, period_candidates=len(chosen))


def unranked_beyond(result: PlanResult, exact_below: float) -> PlanResult:
    """``result`` with no rank on the points that fit at or past ``exact_below`` ns, where
    pruned configurations may come before them (their Pareto marks stay exact)."""
    if exact_below == math.inf:
        return result
    points = tuple(
        replace(p, rank=None) if p.rank is not None and (p.step_time_ns or 0) >= exact_below else p
        for p in result.points
    )
    return replace(result, points=points)


def plan_result(
    context: SweepContext,
    settings: Settings,
    global_batch: int,
    points: list[Point],
    evaluations: list[Evaluation],
    refused: list[PlanPoint],
) -> PlanResult:
    """The evaluated configurations, twins dropped, with those refused, ranked."""
    workload = context.workload
    stopped = next((e.reason for e in evaluations if e.stopped), None)
    plan_points, duplicates = _dedupe(
        [
            _plan_point(
                point,
                evaluation,
                workload=workload,
                accelerator=context.accelerator,
                devices=context.devices,
                global_batch=global_batch,
                usable=settings.usable,
            )
            for point, evaluation in zip(points, evaluations, strict=True)
        ],
        [e.fingerprint for e in evaluations],
    )
    spec = workload.spec
    ranked = _with_winner_sends(context, rank_points(plan_points + refused))
    return PlanResult(
        model=workload.name,
        accelerator=context.accelerator,
        devices=context.devices,
        global_batch=global_batch,
        memory_capacity_bytes=settings.capacity,
        memory_headroom=settings.headroom,
        min_mfu=settings.min_mfu,
        points=ranked,
        engine=settings.engine,
        stopped=None if stopped is None else stopped.removeprefix("not evaluated: "),
        n_duplicates=duplicates,
        # counted here, not where ranks are cleared: a plan whose pruning leaves every
        # rank exact (nothing pruned was faster than a fitting point) skips that step
        n_pruned=sum((p.reason or "").startswith("pruned:") for p in ranked),
        n_layers=0 if spec is None else spec.n_layers,
        seq_length=workload.seq_length,
        tp_comm_overlap=context.tp_comm_overlap,
        overlap_p2p=context.overlap_p2p,
        dtype=None if spec is None else spec.dtype,
        grad_reduce_in_bf16=spec is not None and spec.grad_reduce_in_bf16,
        fp8_recipe=spec.fp8_recipe if spec is not None and spec.dtype == "fp8" else None,
    )


def _with_winner_sends(
    context: SweepContext, ranked: tuple[PlanPoint, ...]
) -> tuple[PlanPoint, ...]:
    """``ranked`` with what the winner's sends cost (one more simulation), once."""
    if not ranked or not ranked[0].fits or ranked[0].pp_comm_time_ns is not None:
        return ranked
    best = ranked[0]
    assert best.pipeline_time_ns is not None
    sends = pipeline_comm_ns(context, from_plan_point(best), makespan_ns=best.pipeline_time_ns)
    return (replace(best, pp_comm_time_ns=sends), *ranked[1:])


#: Which name an identical configuration keeps: the schedules frameworks run by name.
_PREFERRED = ("1f1b", "interleaved-1f1b", "gpipe")


def twin_preference(schedule: str, /) -> int:
    """Where a schedule comes among identical twins: the one kept is named 1f1b,
    interleaved-1f1b or gpipe if one of them is among them (1F1B at p = 1 is also
    "sequential"), else the first in registry order (a stable sort keeps it)."""
    return _PREFERRED.index(schedule) if schedule in _PREFERRED else len(_PREFERRED)


def twin_key(point: Point | PlanPoint, fingerprint: str, /) -> tuple[object, ...]:
    """What two configurations share when they are twins: the same generated per-rank
    orders (``fingerprint``) and every other choice of a :class:`Point` but the schedule's
    name and the stages per rank asked of it, which the orders already say."""
    return (
        fingerprint,
        *(getattr(point, f.name) for f in fields(Point) if f.name not in _NAMED_BY_THE_ORDERS),
    )


_NAMED_BY_THE_ORDERS = frozenset({"schedule", "virtual"})


def _dedupe(points: list[PlanPoint], fingerprints: list[str]) -> tuple[list[PlanPoint], int]:
    """Drop configurations identical to another (:func:`twin_key`: the same simulation);
    the one kept is the first by :func:`twin_preference`."""
    order = sorted(range(len(points)), key=lambda i: twin_preference(points[i].schedule))
    seen: set[tuple[object, ...]] = set()
    dropped: set[int] = set()
    for i in order:
        point, fingerprint = points[i], fingerprints[i]
        if not (point.feasible and fingerprint):
            continue
        key = twin_key(point, fingerprint)
        if key in seen:
            dropped.add(i)
        seen.add(key)
    kept = [p for i, p in enumerate(points) if i not in dropped]
    return kept, len(dropped)


def _digits_apart(need: int, usable: int) -> int:
    """Significant digits (3 to 6) at which ``need`` and ``usable`` bytes read apart, so a
    refusal never says "needs 71.7 GiB > 71.7 GiB usable"."""
    for digits in range(3, 6):
        if format_bytes(need, digits=digits) != format_bytes(usable, digits=digits):
            return digits
    return 6


def _plan_point(
    point: Point,
    evaluation: Evaluation,
    *,
    workload: Workload,
    accelerator: Accelerator,
    devices: int,
    global_batch: int,
    usable: int,
) -> PlanPoint:
    base = to_plan_point(point)
    if evaluation.reason is not None:
        return replace(base, reason=evaluation.reason, evaluated=not evaluation.stopped)
    step_ns = evaluation.makespan_ns + evaluation.allreduce_ns
    tokens, mfu = _throughput(
        step_ns,
        workload=workload,
        accelerator=accelerator,
        devices=devices,
        global_batch=global_batch,
    )
    fits = evaluation.peak_memory_bytes <= usable
    return replace(
        base,
        n_stages=evaluation.n_stages,
        layers_per_stage=evaluation.layers_per_stage,
        step_time_ns=step_ns,
        pipeline_time_ns=evaluation.makespan_ns,
        tp_comm_time_ns=evaluation.tp_comm_ns,
        dp_comm_time_ns=evaluation.dp_exposed_ns,
        dp_comm_total_ns=evaluation.dp_comm_ns,
        optimizer_time_ns=evaluation.optimizer_ns,
        allreduce_time_ns=evaluation.allreduce_ns,
        bubble=evaluation.bubble,
        tokens_per_s=tokens,
        mfu=mfu,
        peak_memory_bytes=evaluation.peak_memory_bytes,
        static_memory_bytes=evaluation.static_bytes,
        peak_activation_bytes=evaluation.activation_bytes,
        fits=fits,
        reason=None if fits else _memory_reason(evaluation, usable),
    )


def _throughput(
    step_ns: float,
    *,
    workload: Workload,
    accelerator: Accelerator,
    devices: int,
    global_batch: int,
) -> tuple[float | None, float | None]:
    """Tokens per second and model FLOPs utilisation of a step of ``step_ns``; None where
    the workload lacks the sequence length or FLOPs per sequence (or the step is 0)."""
    seconds = step_ns / NS_PER_S
    tokens = None
    if workload.seq_length is not None and step_ns:
        tokens = global_batch * workload.seq_length / seconds
    mfu = None
    if workload.flops_per_sequence is not None and step_ns:
        mfu = (
            workload.flops_per_sequence
            * global_batch
            / (seconds * devices * accelerator.peak_flops)
        )
    return tokens, mfu


def _memory_reason(evaluation: Evaluation, usable: int) -> str:
    """Why a point does not fit: its peak per device, split, against ``usable``."""
    peak = evaluation.peak_memory_bytes
    digits = _digits_apart(peak, usable)
    return (
        f"needs {format_bytes(peak, digits=digits)} per device "
        f"({format_bytes(evaluation.static_bytes)} params, grads and optimizer + "
        f"{format_bytes(evaluation.activation_bytes)} activations) > "
        f"{format_bytes(usable, digits=digits)} usable"
    )
