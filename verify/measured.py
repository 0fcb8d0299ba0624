"""The measured step as a pipesim trace file, for ``pipesim plot --measured``.

``pipesim verify --trace-out FILE`` writes it (:func:`write_measured_trace`):
the measured times of every action and transfer (ns) in the ranks of the
schedule *as it ran* (:attr:`verify.report.VerifyReport.as_run`: on the CPU
one host thread runs every rank, so they are one rank here), with that
schedule and the calibrated costs. Simulating that schedule with those costs
is the prediction ``verify`` reports its makespan error against, so
``pipesim plot --measured FILE`` draws the same comparison, rank by rank.

The JSON report (``pipesim verify --json [-o FILE]``) embeds the same object as
``measured_trace`` (:func:`measured_step_dict`), so ``pipesim plot --measured``
reads the report as well: one file keeps the verdict and the timeline together.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pipesim.schedule import Schedule
from pipesim.trace import ActionRecord, Trace, TransferRecord
from pipesim.trace_io import save_trace, step_to_dict
from verify.report import VerifyReport

__all__ = ["as_run_trace", "measured_step_dict", "write_measured_trace"]


def as_run_trace(report: VerifyReport, /) -> tuple[Schedule, Trace]:
    """The schedule as run and the measured trace renumbered into its ranks."""
    schedule = report.as_run
    if schedule is None:
        raise ValueError("the report does not say how the schedule ran (as_run is None)")
    trace = report.trace
    return schedule, Trace(
        n_ranks=schedule.n_ranks,
        actions=tuple(
            ActionRecord(
                rank=schedule.rank_of(r.work.parts[0].stage), work=r.work, start=r.start, end=r.end
            )
            for r in sorted(trace.actions, key=lambda r: (r.start, r.end))
        ),
        transfers=tuple(
            TransferRecord(
                src_rank=schedule.rank_of(t.producer.stage),
                dst_rank=schedule.rank_of(t.consumer.stage),
                producer=t.producer,
                consumer=t.consumer,
                n_bytes=t.n_bytes,
                start=t.start,
                end=t.end,
            )
            for t in trace.transfers
        ),
    )


def _meta(report: VerifyReport) -> dict[str, Any]:
    return {
        "source": "pipesim verify",
        "schedule": report.schedule,
        "model": report.model,
        "devices": list(report.devices),
        "bit_identical": report.bit_identical,
        "makespan_error_percent": report.makespan_error_percent,
    }


def measured_step_dict(report: VerifyReport, /) -> dict[str, Any]:
    """The trace file's object (:func:`pipesim.trace_io.step_to_dict`) of the measured
    step: what ``pipesim verify --json`` embeds as ``measured_trace``."""
    schedule, trace = as_run_trace(report)
    return step_to_dict(trace, schedule=schedule, costs=report.costs, meta=_meta(report))


def write_measured_trace(report: VerifyReport, path: str | Path, /) -> Path:
    """Write the measured step of ``report`` as a pipesim trace file (times in ns)."""
    schedule, trace = as_run_trace(report)
    return save_trace(trace, path, schedule=schedule, costs=report.costs, meta=_meta(report))
