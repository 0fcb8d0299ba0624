"""Calibrate once on real ranks, then predict other schedules and sizes from the cost file.

:func:`calibrate_cut` runs one calibration schedule with one process per rank
(:func:`verify.dist.verify_distributed`, gloo on the CPU) several times, each
after untimed warm-up steps, and fits a cost model with
:func:`pipesim.calibration.fit_costs`: per stage and op medians (F, B, I and W
all measured, see :func:`calibration_schedule`), per-message send and receive
overheads, link latency and a per-action dispatch overhead. Intra-op threads
per rank are set explicitly (ranks sharing cores with more than one thread each
slow each other down: docs/guide/calibrate.md) and recorded with the rest of the
provenance in the cost file's ``meta``, with each run's own compute times per stage
and op (``compute_samples_ns``, one mapping per run) and how far the runs' medians
spread (``compute_run_spread_pct``), from which :func:`pipesim.band.predict_band`
draws a band around the prediction.

:func:`measure` runs any schedule the same way and returns the median
measured step and its spread; :func:`pipesim.calibration.predict` gives
pipesim's prediction of the same span (first compute start to last compute
end) from a cost file. A cost file describes one cut of the model (its stage
count); DualPipe's two model copies reuse the one-copy cut
(:func:`pipesim.calibration.costs_for`).
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import torch

from pipesim.band import compute_samples, samples_meta
from pipesim.calibration import (
    MeasuredStep,
    calibration_schedule,
    fit_costs,
    measured_makespan,
    median,
    term_stability,
)
from pipesim.costs import CostModel
from pipesim.exact import Time
from pipesim.schedule import Schedule
from verify.allocator import configure_allocator
from verify.calibrate import calibration_meta
from verify.dist import verify_distributed_all
from verify.errors import VerifyError

__all__ = [
    "BURN_IN",
    "COPIES",
    "MAX_REPEATS",
    "MIN_SAMPLES",
    "Measurement",
    "burn_in_steps",
    "calibrate_cut",
    "fit_cut",
    "measure",
    "measure_all",
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


# Untimed steps the first schedule in fresh rank processes runs beyond ``warmup``.
# A fresh process keeps faulting in memory pages it never touched in its 2nd and 3rd
# steps, so the schedule that came first in a round ran slow, and calibrating from those
# runs alone put the grid off (the counts and figures: docs/fidelity.md, "The first
# schedule in fresh processes").
BURN_IN = 2


def burn_in_steps(warmup: int, burn_in: int = BURN_IN) -> int:
    """The untimed steps the first schedule in fresh processes runs beyond ``warmup``:
    ``burn_in`` when a warm-up is asked for at all, none when ``warmup`` is 0 (the very
    first step, as asked).

    >>> burn_in_steps(1), burn_in_steps(0), burn_in_steps(3, 5)
    (2, 0, 5)
    """
    return burn_in if warmup > 0 else 0


@dataclass(frozen=True, slots=True, kw_only=True)
class Measurement:
    """Several measured steps of one schedule, each in fresh rank processes."""

    schedule: Schedule
    steps: tuple[MeasuredStep, ...]
    makespans_ns: tuple[Time, ...]
    """First compute start to last compute end of each step."""
    stage_bytes: tuple[Any, ...]
    """Per stage, the byte fields verify measured (a StageCost each)."""
    page_faults: tuple[int | None, ...] = ()
    """Per step, the most minor page faults a rank process took in it (None: not counted);
    thousands mean its ops paid for first touches of memory (``VerifyReport.page_faults``)."""

    @property
    def median_ns(self) -> Time:
        """The median step."""
        return median(self.makespans_ns)

    @property
    def spread(self) -> float:
        """(slowest - fastest) / median: the run-to-run spread."""
        return float((max(self.makespans_ns) - min(self.makespans_ns)) / self.median_ns)


def measure_all(
    schedules: Sequence[Schedule],
    /,
    *,
    model: str = "gpt",
    model_options: Mapping[str, Any] | None = None,
    microbatch_size: int | Sequence[int] = 8,
    repeats: int = 3,
    threads: int = 1,
    warmup: int = 1,
    timeout_s: float = 300.0,
    on_round: Callable[[int, float], None] | None = None,
    first_round: int = 0,
    burn_in: int = BURN_IN,
) -> tuple[Measurement, ...]:
    """Run every schedule of ``schedules`` (one rank count) ``repeats`` times: each round
    runs them all, one after the other, in one fresh set of rank processes (each after
    ``warmup`` untimed steps, ``threads`` intra-op threads per rank; with ``warmup`` > 0
    the round's first schedule ``burn_in`` more, while ``warmup`` 0 measures the fresh
    processes' very first step as asked), so every schedule is measured once in each of
    ``repeats`` process sets, at interleaved times.
    ``microbatch_size`` is rows per micro-batch, one for all or one per schedule;
    ``timeout_s`` bounds each schedule's run (the round's deadline adds the burn-in
    steps' share on top); ``on_round(round, seconds)`` hears each round's end. Rounds are
    numbered from ``first_round`` (each number seeds its order), so a caller that runs one
    round at a time (say, alternating CPU allocators between rounds) keeps the orders of
    one call. A run that is not bit-identical is an error: it measured something else
    than the schedule."""
    sizes = (
        list(microbatch_size)
        if isinstance(microbatch_size, Sequence)
        else [microbatch_size] * len(schedules)
    )
    steps: list[list[MeasuredStep]] = [[] for _ in schedules]
    faults: list[list[int | None]] = [[] for _ in schedules]
    stage_bytes: list[tuple[Any, ...]] = [() for _ in schedules]
    extra = burn_in_steps(warmup, burn_in)
    with threads_per_rank(threads):
        for round_ in range(first_round, first_round + max(repeats, 1)):
            start = time.perf_counter()
            # Each round in its own order (seeded), the first too: a slow start or end of
            # the processes, or a slow spell of the machine, falls on different schedules
            # each round instead of always on the same ones.
            order = list(range(len(schedules)))
            random.Random(round_).shuffle(order)
            reports = verify_distributed_all(
                [schedules[k] for k in order],
                model=model,
                model_options=dict(model_options or {}),
                batch_size=[sizes[k] * schedules[k].n_microbatches for k in order],
                # A run is warmup + 1 steps; the burn-in adds that share of one.
                timeout_s=timeout_s * (len(schedules) + extra / (warmup + 1)),
                wait_timeout_s=timeout_s,
                warmup=warmup,
                burn_in=extra,
            )
            for k, report in sorted(zip(order, reports, strict=True), key=lambda kr: kr[0]):
                schedule = schedules[k]
                if not report.bit_identical:
                    raise VerifyError(
                        f"the run of {schedule.name!r} is not bit-identical to the unsplit "
                        "model: " + "; ".join(report.mismatches[:3])
                    )
                steps[k].append(MeasuredStep(schedule=schedule, trace=report.trace))
                faults[k].append(max(report.page_faults) if report.page_faults else None)
                stage_bytes[k] = report.costs.stages
            if on_round is not None:
                on_round(round_ - first_round, time.perf_counter() - start)
    return tuple(
        Measurement(
            schedule=schedule,
            steps=tuple(found),
            makespans_ns=tuple(measured_makespan(s.trace) for s in found),
            stage_bytes=sb,
            page_faults=tuple(f),
        )
        for schedule, found, sb, f in zip(schedules, steps, stage_bytes, faults, strict=True)
    )


def measure(
    schedule: Schedule,
    /,
    *,
    model: str = "gpt",
    model_options: Mapping[str, Any] | None = None,
    microbatch_size: int = 8,
    repeats: int = 3,
    threads: int = 1,
    warmup: int = 1,
    timeout_s: float = 300.0,
) -> Measurement:
    """:func:`measure_all` of one schedule: ``repeats`` runs, each in fresh rank processes."""
    (found,) = measure_all(
        [schedule],
        model=model,
        model_options=model_options,
        microbatch_size=microbatch_size,
        repeats=repeats,
        threads=threads,
        warmup=warmup,
        timeout_s=timeout_s,
    )
    return found


COPIES = 3
"""Calibration steps per round (fresh process set), each at its own place in the round:
more samples per process start-up, and no figure resting on one slow spell."""

MIN_SAMPLES = 20
"""The samples each fitted figure should rest on; :func:`calibrate_cut` runs more rounds
(up to ``max_repeats``) while a figure has fewer."""

MAX_REPEATS = 8
"""The most rounds :func:`calibrate_cut` runs to reach ``min_samples``."""


def _pooled(found: Sequence[Measurement]) -> Measurement:
    """Measurements of one schedule as one (their steps in order)."""
    return Measurement(
        schedule=found[0].schedule,
        steps=tuple(s for m in found for s in m.steps),
        makespans_ns=tuple(t for m in found for t in m.makespans_ns),
        stage_bytes=found[-1].stage_bytes,
        page_faults=tuple(f for m in found for f in m.page_faults),
    )


def calibrate_cut(
    *,
    model: str = "gpt",
    model_options: Mapping[str, Any] | None = None,
    n_ranks: int = 2,
    virtual: int = 1,
    n_microbatches: int = 4,
    microbatch_size: int = 8,
    repeats: int = 3,
    threads: int = 1,
    warmup: int = 1,
    timeout_s: float = 300.0,
    send_mode: str = "eager",
    copies: int = COPIES,
    min_samples: int = MIN_SAMPLES,
    max_repeats: int = MAX_REPEATS,
) -> tuple[CostModel, dict[str, Any]]:
    """Calibrate the cut into ``n_ranks * virtual`` stages; returns the cost model
    (time unit: ns) and the ``meta`` a cost file keeps with it (provenance).
    ``send_mode`` chooses the message rule the overheads are fitted for
    (``CostModel.send_mode``; gloo's sends are a rendezvous, :mod:`pipesim.engine`).
    ``repeats`` rounds run, each in fresh rank processes with ``copies`` calibration
    steps; while a fitted figure has fewer than ``min_samples`` samples, one more round,
    up to ``max_repeats`` rounds in all."""
    schedule = calibration_schedule(n_ranks=n_ranks, n_microbatches=n_microbatches, virtual=virtual)
    found: list[Measurement] = []

    def run_rounds(count: int) -> None:
        found.extend(
            measure_all(
                [schedule] * max(copies, 1),
                model=model,
                model_options=model_options,
                microbatch_size=microbatch_size,
                repeats=count,
                threads=threads,
                warmup=warmup,
                timeout_s=timeout_s,
                first_round=len(found) // max(copies, 1),
            )
        )

    run_rounds(repeats)
    rounds = max(repeats, 1)
    while rounds < max_repeats:
        fit = fit_costs(_pooled(found).steps, send_mode=send_mode)
        if all(t.samples >= min_samples or not t.samples for t in fit.terms.values()):
            break
        run_rounds(1)
        rounds += 1
    measured = _pooled(found)
    costs, meta = fit_cut(
        measured,
        model=model,
        model_options=model_options,
        microbatch_size=microbatch_size,
        threads=threads,
        warmup=warmup,
        send_mode=send_mode,
    )
    # The first of each round's steps ran after the burn-in steps of fresh processes.
    meta["burn_in_steps"] = burn_in_steps(warmup)
    meta |= {"rounds": rounds, "copies_per_round": max(copies, 1), "min_samples": min_samples}
    return costs, meta


def fit_cut(
    measured: Measurement,
    /,
    *,
    model: str = "gpt",
    model_options: Mapping[str, Any] | None = None,
    microbatch_size: int = 8,
    threads: int = 1,
    warmup: int = 1,
    send_mode: str = "eager",
) -> tuple[CostModel, dict[str, Any]]:
    """The cost model of the measured calibration schedule's cut (time unit: ns) and the
    ``meta`` a cost file keeps with it (provenance): :func:`calibrate_cut`'s fit, for
    calibration runs measured along with other schedules (:func:`measure_all`)."""
    schedule = measured.schedule
    fit = fit_costs(
        measured.steps, stage_bytes=measured.stage_bytes, time_unit="ns", send_mode=send_mode
    )
    # How far one step moves each figure: what calibrate --check warns about.
    fit = term_stability(measured.steps, fit, send_mode=send_mode)
    meta = calibration_meta(
        fit,
        source="pipesim calibrate (verify --dist)",
        schedule=schedule.name,
        model=model,
        model_options=dict(model_options or {}),
        n_ranks=schedule.n_ranks,
        virtual=schedule.n_stages // schedule.n_ranks,
        n_stages=schedule.n_stages,
        n_microbatches=schedule.n_microbatches,
        microbatch_size=microbatch_size,
        threads_per_rank=threads,
        cpu_allocator=configure_allocator(apply=False),
        repeats=len(measured.steps),
        warmup_steps=warmup,
        measured_makespans_ns=[int(t) for t in measured.makespans_ns],
    )
    # Each run's own compute times (fresh rank processes each): how far the runs spread,
    # and what pipesim.band.predict_band draws from.
    meta |= samples_meta(compute_samples(measured.steps))
    # Per run, the most page faults a rank took in its measured step (None: not counted):
    # thousands mean first touches of memory inflated the ops (VerifyReport.page_faults).
    meta["measured_step_page_faults"] = list(measured.page_faults)
    return fit.costs, meta
