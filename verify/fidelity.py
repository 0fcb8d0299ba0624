"""Calibrate once on real ranks, then predict other schedules and sizes from the cost file.

:func:`calibrate_cut` runs one calibration schedule with one process per rank
(:func:`verify.dist.verify_distributed`, gloo on the CPU) several times, each
after untimed warm-up steps, and fits a cost model with
:func:`pipesim.calibration.fit_costs`: per stage and op medians (F, B, I and W
all measured, see :func:`calibration_schedule`), per-message send and receive
overheads, link latency and a per-action dispatch overhead. Intra-op threads
per rank are set explicitly (ranks sharing cores with more than one thread each
run 3-12x slower when they overlap) and recorded with the rest of the
provenance in the cost file's ``meta``.

:func:`measure` runs any schedule the same way and returns the median
measured step and its spread; :func:`pipesim.calibration.predict` gives
pipesim's prediction of the same span (first compute start to last compute
end) from a cost file. A cost file describes one cut of the model (its stage
count); DualPipe's two model copies reuse the one-copy cut
(:func:`pipesim.calibration.costs_for`).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import torch

from pipesim.calibration import (
    MeasuredStep,
    calibration_schedule,
    fit_costs,
    measured_makespan,
    median,
)
from pipesim.costs import CostModel
from pipesim.exact import Time
from pipesim.schedule import Schedule
from verify.calibrate import calibration_meta
from verify.dist import verify_distributed
from verify.errors import VerifyError

__all__ = [
    "Measurement",
    "calibrate_cut",
    "measure",
    "threads_per_rank",
]


@contextmanager
def threads_per_rank(n_threads: int) -> Iterator[None]:
    """Rank processes take the parent's intra-op thread count: set it for the block."""
    if n_threads < 1:
        raise VerifyError(f"threads per rank must be at least 1, got {n_threads}")
    before = torch.get_num_threads()
    torch.set_num_threads(n_threads)
    try:
        yield
    finally:
        torch.set_num_threads(before)


@dataclass(frozen=True, slots=True, kw_only=True)
class Measurement:
    """Several measured steps of one schedule, each in fresh rank processes."""

    schedule: Schedule
    steps: tuple[MeasuredStep, ...]
    makespans_ns: tuple[Time, ...]
    """First compute start to last compute end of each step."""
    stage_bytes: tuple[Any, ...]
    """Per stage, the byte fields verify measured (a StageCost each)."""

    @property
    def median_ns(self) -> Time:
        """The median step."""
        return median(self.makespans_ns)

    @property
    def spread(self) -> float:
        """(slowest - fastest) / median: the run-to-run spread."""
        return float((max(self.makespans_ns) - min(self.makespans_ns)) / self.median_ns)


def measure(
    schedule: Schedule,
    /,
    *,
    model: str = "gpt",
    model_options: Mapping[str, int] | None = None,
    microbatch_size: int = 8,
    repeats: int = 3,
    threads: int = 1,
    warmup: int = 1,
    timeout_s: float = 300.0,
) -> Measurement:
    """Run ``schedule`` ``repeats`` times with one process per rank (each run after
    ``warmup`` untimed steps, ``threads`` intra-op threads per rank) and keep every
    measured step. A run that is not bit-identical is an error: it measured something
    else than the schedule."""
    steps, spans = [], []
    stage_bytes: tuple[Any, ...] = ()
    with threads_per_rank(threads):
        for _ in range(max(repeats, 1)):
            report = verify_distributed(
                schedule,
                model=model,
                model_options=dict(model_options or {}),
                batch_size=microbatch_size * schedule.n_microbatches,
                timeout_s=timeout_s,
                warmup=warmup,
            )
            if not report.bit_identical:
                raise VerifyError(
                    f"the run of {schedule.name!r} is not bit-identical to the unsplit model: "
                    + "; ".join(report.mismatches[:3])
                )
            steps.append(MeasuredStep(schedule=schedule, trace=report.trace))
            spans.append(measured_makespan(report.trace))
            stage_bytes = report.costs.stages
    return Measurement(
        schedule=schedule,
        steps=tuple(steps),
        makespans_ns=tuple(spans),
        stage_bytes=stage_bytes,
    )


def calibrate_cut(
    *,
    model: str = "gpt",
    model_options: Mapping[str, int] | None = None,
    n_ranks: int = 2,
    virtual: int = 1,
    n_microbatches: int = 4,
    microbatch_size: int = 8,
    repeats: int = 3,
    threads: int = 1,
    warmup: int = 1,
    timeout_s: float = 300.0,
) -> tuple[CostModel, dict[str, Any]]:
    """Calibrate the cut into ``n_ranks * virtual`` stages; returns the cost model
    (time unit: ns) and the ``meta`` a cost file keeps with it (provenance)."""
    schedule = calibration_schedule(n_ranks=n_ranks, n_microbatches=n_microbatches, virtual=virtual)
    measured = measure(
        schedule,
        model=model,
        model_options=model_options,
        microbatch_size=microbatch_size,
        repeats=repeats,
        threads=threads,
        warmup=warmup,
        timeout_s=timeout_s,
    )
    fit = fit_costs(measured.steps, stage_bytes=measured.stage_bytes, time_unit="ns")
    meta = calibration_meta(
        fit,
        source="pipesim calibrate (verify --dist)",
        schedule=schedule.name,
        model=model,
        model_options=dict(model_options or {}),
        n_ranks=n_ranks,
        virtual=virtual,
        n_stages=schedule.n_stages,
        n_microbatches=n_microbatches,
        microbatch_size=microbatch_size,
        threads_per_rank=threads,
        repeats=len(measured.steps),
        warmup_steps=warmup,
        measured_makespans_ns=[int(t) for t in measured.makespans_ns],
    )
    return fit.costs, meta
