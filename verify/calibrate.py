"""Measured times -> a pipesim Trace, a calibrated CostModel, and predicted vs measured.

Times are integer nanoseconds (CUDA events on GPUs, ``time.perf_counter_ns`` on
the CPU), so the calibrated cost model is exact and its time unit is the
nanosecond; link bandwidth is in bytes per nanosecond.

:func:`calibrate` takes the mean duration of each (stage, op) over the
micro-batches; message bytes, activation bytes and parameter bytes as measured;
and a link fitted to the transfers between distinct devices (latency +
bytes / bandwidth, least squares when several message sizes were seen).

Which prediction to hold against the measurement: the executor is one host
thread, so on the CPU every action runs one after another, and ranks sharing a
CUDA device share its stream. :func:`as_run_schedule` rewrites the schedule
with one rank per execution resource (one for the whole host when any rank is
on the CPU, one per CUDA device otherwise) holding the work in the order it
ran; simulating it predicts the measured step. Simulating the original
schedule with the same costs predicts the step on one device per rank.

>>> from pipesim.schedules import generate
>>> from pipesim.actions import parse_action
>>> s = generate("1f1b", n_ranks=2, n_microbatches=1)
>>> order = [parse_action(a) for a in ("0F0", "1F0", "1B0", "0B0")]
>>> merged = as_run_schedule(s, executed=order, devices=["cpu", "cpu"])
>>> merged.n_ranks, [str(a) for a in merged.orders[0]]
(1, ['0F0', '1F0', '1B0', '0B0'])
"""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Sequence
from fractions import Fraction
from pathlib import Path
from typing import Any

import torch

from pipesim.actions import Action, Op, Work
from pipesim.costs import CostModel, Link, StageCost, costs_to_dict
from pipesim.files import write_text
from pipesim.schedule import Schedule
from pipesim.trace import ActionRecord, Trace, TransferRecord
from verify.local import LocalRun

__all__ = ["as_run_schedule", "calibrate", "measured_trace", "save_costs"]


def measured_trace(run: LocalRun, /) -> Trace:
    """The run's measured times as a pipesim :class:`~pipesim.trace.Trace` (nanoseconds)."""
    return Trace(
        n_ranks=run.schedule.n_ranks,
        actions=tuple(
            ActionRecord(rank=t.rank, work=t.work, start=t.start_ns, end=max(t.end_ns, t.start_ns))
            for t in run.actions
        ),
        transfers=tuple(
            TransferRecord(
                src_rank=t.src_rank,
                dst_rank=t.dst_rank,
                producer=t.producer,
                consumer=t.consumer,
                n_bytes=t.n_bytes,
                start=t.start_ns,
                end=max(t.end_ns, t.start_ns),
            )
            for t in run.transfers
        ),
    )


def _mean(values: Sequence[int], default: int) -> int:
    return round(sum(values) / len(values)) if values else default


def calibrate(
    run: LocalRun,
    /,
    *,
    devices: Sequence[torch.device | str],
    param_bytes: Sequence[int] = (),
) -> CostModel:
    """A pipesim cost model (time unit: ns) from what ``run`` measured.

    ``devices`` (one per rank) tells which transfers crossed between distinct
    devices, the only ones that say anything about a link. An op a stage never
    ran (I and W in a schedule with full backwards) keeps a split of the
    measured B: ``I = W = B / 2``.
    """
    schedule = run.schedule
    durations: dict[tuple[int, Op], list[int]] = defaultdict(list)
    overlaps: dict[int, list[int]] = defaultdict(list)
    for timing in run.actions:
        elapsed = max(timing.end_ns - timing.start_ns, 0)
        if isinstance(timing.work, Action):
            durations[(timing.work.stage, timing.work.op)].append(elapsed)
        else:
            overlaps[timing.work.parts[0].stage].append(elapsed)
    stages = []
    for stage in range(schedule.n_stages):
        forward = _mean(durations[(stage, Op.F)], 0)
        backward = _mean(durations[(stage, Op.B)], 0)
        input_grad = _mean(durations[(stage, Op.I)], 0)
        weight_grad = _mean(durations[(stage, Op.W)], 0)
        if not durations[(stage, Op.B)] and (input_grad or weight_grad):
            backward = input_grad + weight_grad
        if not durations[(stage, Op.I)] and not durations[(stage, Op.W)]:
            input_grad, weight_grad = backward // 2, backward - backward // 2
        output_bytes = max(run.transfer_bytes[stage]) if stage < len(run.transfer_bytes) else 0
        stages.append(
            StageCost(
                forward=forward,
                backward=backward,
                input_grad=input_grad,
                weight_grad=weight_grad,
                overlap=_mean(overlaps[stage], 0) if overlaps[stage] else None,
                activation_bytes=run.activation_bytes[stage],
                output_bytes=output_bytes,
                param_bytes=param_bytes[stage] if stage < len(param_bytes) else 0,
            )
        )
    return CostModel(stages=tuple(stages), link=_fit_link(run, devices), time_unit="ns")


def _fit_link(run: LocalRun, devices: Sequence[torch.device | str]) -> Link:
    """Latency + bytes / bandwidth fitted to transfers between distinct devices."""
    points = [
        (t.n_bytes, max(t.end_ns - t.start_ns, 0))
        for t in run.transfers
        if torch.device(devices[t.src_rank]) != torch.device(devices[t.dst_rank])
    ]
    if not points:
        return Link()
    sizes = {b for b, _ in points}
    total_bytes = sum(b for b, _ in points)
    total_time = sum(t for _, t in points)
    if len(sizes) > 1:
        n = len(points)
        mean_b = Fraction(total_bytes, n)
        mean_t = Fraction(total_time, n)
        var = sum(((b - mean_b) ** 2 for b, _ in points), Fraction(0))
        cov = sum(((b - mean_b) * (t - mean_t) for b, t in points), Fraction(0))
        slope: Fraction = cov / var  # ns per byte
        latency = mean_t - slope * mean_b
        if slope > 0 and latency >= 0:
            return Link(latency=round(latency), bandwidth_bytes_per_s=_rounded(Fraction(1) / slope))
    if total_time == 0:
        return Link()
    return Link(bandwidth_bytes_per_s=_rounded(Fraction(total_bytes, total_time)))


def _rounded(value: Fraction) -> Fraction | int:
    """Four significant decimals are plenty for a bandwidth and keep the JSON readable."""
    text = f"{float(value):.4g}"
    exact = Fraction(text)
    return exact.numerator if exact.denominator == 1 else exact


def as_run_schedule(
    schedule: Schedule, /, *, executed: Sequence[Work], devices: Sequence[torch.device | str]
) -> Schedule:
    """``schedule`` as the single-threaded executor actually ran it on ``devices``.

    Ranks on the CPU all share the host thread, so when any rank is on the CPU
    every rank is merged into one; otherwise ranks on the same CUDA device are
    merged (one stream each). Each merged rank runs its work in ``executed`` order.
    """
    resolved = [torch.device(d) for d in devices]
    if any(d.type == "cpu" for d in resolved):
        resource = [0] * len(resolved)
    else:
        names: dict[torch.device, int] = {}
        resource = [names.setdefault(d, len(names)) for d in resolved]
    n_resources = max(resource) + 1
    orders: list[list[Work]] = [[] for _ in range(n_resources)]
    for work in executed:
        orders[resource[schedule.rank_of(work.parts[0].stage)]].append(work)
    return Schedule(
        orders=tuple(tuple(o) for o in orders),
        placement=tuple(resource[r] for r in schedule.placement),
        n_microbatches=schedule.n_microbatches,
        name=f"{schedule.name} as run",
        happens_before=schedule.happens_before,
        n_copies=schedule.n_copies,
    )


def save_costs(
    costs: CostModel, path: str | Path, /, *, meta: dict[str, Any] | None = None
) -> None:
    """Write ``costs`` as a pipesim cost file (``pipesim simulate --costs FILE``)."""
    data = costs_to_dict(costs)
    data["meta"] = {"time_unit": "ns", "source": "pipesim verify", **(meta or {})}
    write_text(path, json.dumps(data, indent=2) + "\n")  # all or nothing, never half a file
