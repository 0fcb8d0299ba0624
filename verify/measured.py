"""The measured step as a pipesim trace file, for ``pipesim plot --measured``.

``pipesim verify --trace-out FILE`` writes it (:func:`write_measured_trace`):
the measured times of every action and transfer (ns) in the ranks of the
schedule *as it ran* (:attr:`verify.report.VerifyReport.as_run`: on the CPU
one host thread runs every rank, so they are one rank here), with that
schedule and the calibrated costs. Simulating that schedule with those costs
is the prediction ``verify`` reports its makespan error against, so
``pipesim plot --measured FILE`` draws the same comparison, rank by rank.
"""

from __future__ import annotations

from pathlib import Path

from pipesim.schedule import Schedule
from pipesim.trace import ActionRecord, Trace, TransferRecord
from pipesim.trace_io import save_trace
from verify.report import VerifyReport

__all__ = ["as_run_trace", "write_measured_trace"]


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


def write_measured_trace(report: VerifyReport, path: str | Path, /) -> Path:
    """Write the measured step of ``report`` as a pipesim trace file (times in ns)."""
    schedule, trace = as_run_trace(report)
    meta = {
        "source": "pipesim verify",
        "schedule": report.schedule,
        "model": report.model,
        "devices": list(report.devices),
        "bit_identical": report.bit_identical,
        "makespan_error_percent": report.makespan_error_percent,
    }
    return save_trace(trace, path, schedule=schedule, costs=report.costs, meta=meta)
