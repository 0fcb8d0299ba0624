"""The ranks' results of a multi-process run, merged and checked against the unsplit model.

Each rank of :mod:`verify.dist`, :mod:`verify.torchrun` or :mod:`verify.crosscheck`
returns a dictionary of CPU tensors and timings (:func:`verify.rank.run_rank`);
:func:`assemble` merges them into the :class:`~verify.local.LocalRun` that the
in-process executor makes, :func:`report_from_results` compares it with the unsplit
model run on the same micro-batches (:func:`verify.compare.build_report`), and
:func:`locate_from_results` names the action where the gradients first differ from a
step run with ``RankSpec.trace_grads`` (:mod:`verify.locate`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor, nn

from pipesim.actions import parse_action
from pipesim.schedule import Schedule
from verify.compare import (
    Reference,
    build_report,
    locate_gradient_mismatch,
    reference_run,
    schedule_accumulation_orders,
    split_microbatches,
)
from verify.local import ActionTiming, LocalRun, transfer_table
from verify.models import VerifyModel
from verify.rank import RankSpec
from verify.report import VerifyReport
from verify.timing import median_step_index

__all__ = ["assemble", "locate_from_results", "median_step", "report_from_results"]


def locate_from_results(
    report: VerifyReport,
    schedule: Schedule,
    reference_model: VerifyModel,
    stages: Sequence[nn.Module],
    spec: RankSpec,
    results: Sequence[dict[str, Any]],
) -> VerifyReport:
    """``report`` with the action where the gradients first differ, from the ranks'
    results of a step run with ``RankSpec.trace_grads`` (verify.locate)."""
    _, ref = _reference(schedule, reference_model, spec, device=torch.device("cpu"))
    return locate_gradient_mismatch(
        report,
        assemble(schedule, results, stages),
        model=reference_model,
        stages=stages,
        ref=ref,
        orders=schedule_accumulation_orders(schedule),
    )


def _reference(
    schedule: Schedule, model: VerifyModel, spec: RankSpec, /, *, device: torch.device
) -> tuple[tuple[Tensor, ...], Reference]:
    """The step's input micro-batches (``spec.batch`` cut as ``schedule`` cuts it) and the
    unsplit model run on them on ``device``: what the ranks' results are checked against."""
    assert spec.batch is not None
    n_mb = schedule.n_microbatches
    xs = split_microbatches(spec.batch[0], n_mb)
    ref = reference_run(
        model.layers,
        inputs=xs,
        targets=split_microbatches(spec.batch[1], n_mb),
        loss_fn=model.loss_fn,
        device=device,
        forward_only=schedule.forward_only,
    )
    return xs, ref


def report_from_results(
    schedule: Schedule,
    reference_model: VerifyModel,
    stages: Sequence[nn.Module],
    spec: RankSpec,
    results: Sequence[dict[str, Any]],
    devices: Sequence[torch.device],
) -> VerifyReport:
    """Compare the ranks' results with the unsplit model run on ``devices[0]``."""
    xs, ref = _reference(schedule, reference_model, spec, device=devices[0])
    run = assemble(schedule, results, stages)
    return build_report(
        schedule,
        model=reference_model,
        stages=stages,
        run=run,
        ref=ref,
        devices=devices,
        microbatch_sizes=tuple(int(t.shape[0]) for t in xs),
        accumulation_orders=schedule_accumulation_orders(schedule),
        as_run=schedule,
    )


def median_step(results: Sequence[dict[str, Any]], /) -> tuple[int, tuple[int, ...]]:
    """Which of the ranks' measured steps to report (:func:`verify.timing.median_step_index`),
    and every measured step's makespan in ns, first start to last end over all ranks (one
    host clock: the ranks share a machine).

    >>> step = lambda *spans: [("0F0", a, b) for a, b in spans]
    >>> ranks = [{"step_timings": [step((0, 5)), step((10, 30)), step((40, 47))]},
    ...          {"step_timings": [step((2, 9)), step((12, 20)), step((41, 50))]}]
    >>> median_step(ranks)
    (2, (9, 20, 10))
    """
    per_rank = [r.get("step_timings") or [r["timings"]] for r in results]
    counts = {len(steps) for steps in per_rank}
    if len(counts) != 1:
        raise AssertionError(f"ranks measured different step counts {sorted(counts)}")
    makespans = []
    for k in range(counts.pop()):
        spans = [(start, end) for steps in per_rank for _, start, end in steps[k]]
        makespans.append(max(e for _, e in spans) - min(s for s, _ in spans) if spans else 0)
    return median_step_index(makespans), tuple(makespans)


def assemble(
    schedule: Schedule, results: Sequence[dict[str, Any]], stages: Sequence[nn.Module]
) -> LocalRun:
    """Merge the ranks' results into a LocalRun; put their gradients on ``stages``. Its
    timings are those of the measured step of median makespan (:func:`median_step`); the
    tensors are the last step's (every step computes the same ones)."""
    n_mb = schedule.n_microbatches
    chosen, makespans = median_step(results)
    results = [{**r, "timings": (r.get("step_timings") or [r["timings"]])[chosen]} for r in results]
    origin = min((t[1] for r in results for t in r["timings"]), default=0)
    outputs: dict[int, Tensor] = {}
    losses: dict[int, Tensor] = {}
    sizes: dict[tuple[int, int], int] = {}
    activation_bytes = [0] * schedule.n_stages
    orders: list[tuple[int, ...]] = [() for _ in range(schedule.n_stages)]
    timings = []
    traced: dict[int, Any] = {}
    for rank, result in enumerate(results):
        traced.update(result.get("grad_trace", {}))
        outputs.update(result["outputs"])
        losses.update(result["losses"])
        sizes.update(result["transfer_bytes"])
        for stage, n_bytes in result["activation_bytes"].items():
            activation_bytes[stage] = n_bytes
        for stage, order in result["accumulated"].items():
            orders[stage] = tuple(order)
        for stage, grads in result["grads"].items():
            for p, g in zip(stages[stage].parameters(), grads, strict=True):
                p.grad = None if g is None else g.to(p.device)
        for text, start, end in result["timings"]:
            timings.append(
                ActionTiming(
                    rank=rank, work=parse_action(text), start_ns=start - origin, end_ns=end - origin
                )
            )
    timings.sort(key=lambda t: (t.start_ns, t.rank))
    return LocalRun(
        schedule=schedule,
        executed=tuple(t.work for t in timings),
        outputs=tuple(outputs[k] for k in range(n_mb)),
        losses=tuple(losses[k] for k in sorted(losses)),
        actions=tuple(timings),
        transfers=(),
        transfer_bytes=transfer_table(sizes, n_stages=schedule.n_stages, n_mb=n_mb),
        activation_bytes=tuple(activation_bytes),
        accumulation_orders=tuple(orders),
        wall_ns=max((t.end_ns for t in timings), default=0),
        page_faults=_measured_step_faults(results, chosen - len(makespans)),
        step_makespans_ns=makespans,
        wire_bytes=tuple(int(r.get("wire_bytes", 0)) for r in results),
        wire_dtypes=tuple(sorted({d for r in results for d in r.get("wire_dtypes", ())})),
        grad_trace=tuple(tuple(traced[s]) for s in range(schedule.n_stages)) if traced else (),
    )


def _measured_step_faults(results: Sequence[dict[str, Any]], step: int) -> tuple[int, ...] | None:
    """Per rank, the page faults of the reported step (``step`` counts from the end of
    each rank's steps, warm-ups first); None unless every rank counted them."""
    faults = [(r.get("step_page_faults") or [None] * -step)[step] for r in results]
    if not faults or any(f is None for f in faults):
        return None
    return tuple(int(f) for f in faults)
