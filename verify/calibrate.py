"""Measured times -> a pipesim Trace, a calibrated CostModel, and predicted vs measured.

Times are integer nanoseconds (CUDA events on GPUs, ``time.perf_counter_ns`` on
the CPU), so the calibrated cost model is exact and its time unit is the
nanosecond.

:func:`calibrate` fits the cost model exactly as ``pipesim calibrate`` does
(:func:`pipesim.calibration.fit_costs`, one code path): per stage and op the
median over the micro-batches, the per-action dispatch and per-message send and
receive overheads and the link latency from the gaps between units of work;
message bytes, activation bytes and parameter bytes as measured.
:func:`calibration_meta` is the provenance a cost file keeps in its ``meta``.

Which prediction to hold against the measurement: the executor is one host
thread, so on the CPU every action runs one after another, and ranks sharing a
CUDA device share its stream. :func:`as_run_schedule` rewrites the schedule
with one rank per execution resource (one for the whole host when any rank is
on the CPU, one per CUDA device otherwise) holding the work in the order it
ran; simulating it predicts the measured step, and the fit reads its gaps
there. Simulating the original schedule with the same costs predicts the step
on one device per rank.

>>> from pipesim.schedules import generate
>>> from pipesim.actions import parse_action
>>> s = generate("1f1b", n_ranks=2, n_microbatches=1)
>>> order = [parse_action(a) for a in ("0F0", "1F0", "1B0", "0B0")]
>>> merged = as_run_schedule(s, executed=order, devices=["cpu", "cpu"])
>>> merged.n_ranks, [str(a) for a in merged.orders[0]]
(1, ['0F0', '1F0', '1B0', '0B0'])
"""

from __future__ import annotations

import datetime
import json
import os
import socket
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import torch

from pipesim.actions import Work
from pipesim.band import compute_samples, samples_meta
from pipesim.calibration import (
    CalibrationFit,
    MeasuredStep,
    fit_costs,
    fit_meta,
    measured_makespan,
)
from pipesim.costs import CostModel, StageCost, costs_to_dict
from pipesim.files import write_text
from pipesim.schedule import Schedule
from pipesim.trace import ActionRecord, Trace, TransferRecord
from verify.allocator import configure_allocator
from verify.local import LocalRun
from verify.report import VerifyReport

__all__ = [
    "as_run_schedule",
    "calibrate",
    "calibration_fit",
    "calibration_meta",
    "cost_file",
    "measured_trace",
    "save_costs",
    "stage_bytes",
]


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


def stage_bytes(run: LocalRun, /, *, param_bytes: Sequence[int] = ()) -> tuple[StageCost, ...]:
    """Per stage the byte fields as measured: activation bytes held, the largest message
    the stage sent, and ``param_bytes``; times left at their defaults."""
    stages = []
    for stage in range(run.schedule.n_stages):
        output_bytes = max(run.transfer_bytes[stage]) if stage < len(run.transfer_bytes) else 0
        stages.append(
            StageCost(
                activation_bytes=run.activation_bytes[stage],
                output_bytes=output_bytes,
                param_bytes=param_bytes[stage] if stage < len(param_bytes) else 0,
            )
        )
    return tuple(stages)


def calibration_fit(
    trace: Trace, /, *, as_run: Schedule, stage_bytes: Sequence[StageCost]
) -> CalibrationFit:
    """:func:`pipesim.calibration.fit_costs` over the measured step ``trace`` of the
    schedule as it ran (``as_run``): the same fit ``pipesim calibrate`` makes."""
    step = MeasuredStep(schedule=as_run, trace=trace)
    return fit_costs([step], stage_bytes=stage_bytes, time_unit="ns")


def calibrate(
    run: LocalRun,
    /,
    *,
    devices: Sequence[torch.device | str],
    param_bytes: Sequence[int] = (),
    as_run: Schedule | None = None,
) -> CostModel:
    """A pipesim cost model (time unit: ns) from what ``run`` measured, fitted as
    ``pipesim calibrate`` fits one (:func:`pipesim.calibration.fit_costs`): per stage and
    op the median over the micro-batches (an op a stage never ran, such as I and W in a
    schedule with full backwards, is filled from the others: ``I = W = B / 2``), the
    overheads that block a rank (dispatch, send, receive) and the link latency from the
    gaps between the units of work of the schedule *as it ran* (``as_run``, default
    :func:`as_run_schedule` of ``run`` on ``devices``), and the bytes as measured.
    """
    if as_run is None:
        as_run = as_run_schedule(run.schedule, executed=run.executed, devices=devices)
    measured = stage_bytes(run, param_bytes=param_bytes)
    return calibration_fit(measured_trace(run), as_run=as_run, stage_bytes=measured).costs


def calibration_meta(fit: CalibrationFit, /, **provenance: Any) -> dict[str, Any]:
    """The ``meta`` of a calibrated cost file: its unit, where it came from
    (``provenance``: schedule, model, sizes, ...), the fit's sample counts and
    assumptions, the message costs per direction, and the machine it ran on."""
    return {
        "time_unit": "ns",
        **provenance,
        **fit_meta(fit),
        "host": socket.gethostname(),
        "cpus": os.cpu_count(),
        "load_average": [round(x, 2) for x in os.getloadavg()],
        "torch": torch.__version__,
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
    }


def cost_file(
    report: VerifyReport,
    schedule: Schedule,
    /,
    *,
    source: str = "pipesim verify",
    model_options: Mapping[str, Any] | None = None,
    warmup: int = 1,
    rank_processes: bool = False,
) -> tuple[CostModel, dict[str, Any]]:
    """The cost file of a verify run: the report's cost model refitted from its measured
    step by :func:`calibration_fit` (the fit ``pipesim calibrate`` makes, so the same
    numbers) and its ``meta``, with the provenance ``pipesim calibrate`` records.
    ``rank_processes``: the run's ranks were processes of their own (``--dist``,
    torchrun), which apply ``$PIPESIM_CPU_ALLOCATOR``; an in-process run does not."""
    as_run = report.as_run if report.as_run is not None else schedule
    fit = calibration_fit(report.trace, as_run=as_run, stage_bytes=report.costs.stages)
    provenance: dict[str, Any] = {
        "source": source,
        "schedule": schedule.name,
        "model": report.model,
        "model_options": dict(model_options or {}),
        "n_ranks": schedule.n_ranks,
        "virtual": schedule.n_stages // (schedule.n_ranks * schedule.n_copies),
        "n_stages": schedule.n_stages,
        "n_microbatches": schedule.n_microbatches,
        "devices": list(report.devices),
    }
    if len(set(report.microbatch_sizes)) == 1:
        # Rows per measured micro-batch: `pipesim plan --model costs.json` scales from it.
        provenance["microbatch_size"] = report.microbatch_sizes[0]
    provenance |= {
        "threads_per_rank": torch.get_num_threads(),
        "cpu_allocator": configure_allocator(apply=False) if rank_processes else "system",
        "repeats": 1,
        "warmup_steps": warmup,
        "measured_makespans_ns": [int(measured_makespan(report.trace))],
    }
    if len(report.step_makespans) > 1:  # --timed-steps: the fit read the median step
        provenance["timed_steps_makespans_ns"] = [round(t * 1e9) for t in report.step_makespans]
    meta = calibration_meta(fit, **provenance)
    if schedule.n_copies == 1:
        # The step's own compute samples, as pipesim calibrate keeps its runs': pipesim
        # simulate --costs draws its band from them. Samples key the stages of one model
        # copy's cut, so a DualPipe run (two copies) keeps none.
        meta |= samples_meta(compute_samples([MeasuredStep(schedule=as_run, trace=report.trace)]))
    return fit.costs, meta


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
