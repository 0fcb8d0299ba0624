"""Running a sweep: many configurations evaluated on all cores (or a Dask cluster).

A point is ``(schedule, pipeline degree p, virtual v, tensor parallel t,
sequence parallel, recomputation, distributed optimizer, micro-batch size b,
micro-batches m, data parallel d)`` (:class:`~pipesim.plan.point.Point`); evaluating one
(:func:`~pipesim.plan.evaluation.evaluate_point`) generates its schedule, cuts the
workload into the schedule's stages and prices them (:mod:`pipesim.plan.stage_costs`),
and simulates one step.

Workers: a backend (:mod:`pipesim.plan.backends`: a local process pool, or a Dask
cluster) evaluates chunks of points; every wait has a deadline, and a sweep
stopped by its deadline or by Ctrl-C stops its workers at once and
returns what was evaluated (unevaluated points carry ``stopped=True``).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from pipesim.errors import PipesimError, PlanError
from pipesim.nogc import sparse_gc
from pipesim.plan.backends import Backend, LostChunk, open_backend
from pipesim.plan.evaluation import build_configuration, evaluate_point, pipeline_comm_ns
from pipesim.plan.point import Evaluation, Point, SweepContext
from pipesim.plan.result import to_plan_point

__all__ = [
    "Evaluation",
    "Point",
    "SweepContext",
    "build_configuration",
    "evaluate_point",
    "evaluate_points",
    "pipeline_comm_ns",
]


def _evaluate_chunk(
    chunk: list[tuple[int, Point]], context: SweepContext
) -> list[tuple[int, Evaluation]]:
    """Evaluate ``chunk`` under ``context`` in this process (a backend's worker, or here);
    a point a generator or cost check refuses is its reason, not an error."""
    out = []
    with sparse_gc():
        for index, point in chunk:
            try:
                out.append((index, evaluate_point(context, point)))
            except PipesimError as exc:  # a generator or cost check refused this point
                out.append((index, Evaluation(reason=f"refused: {exc}")))
    return out


def _cost_estimate(point: Point) -> int:
    return point.pipeline * point.virtual * point.n_microbatches


def evaluate_points(
    context: SweepContext,
    points: Sequence[Point],
    /,
    *,
    workers: int | None = None,
    timeout_s: float = 600.0,
    progress: Callable[[int, int], None] | None = None,
    partial: bool = False,
    cluster: str | None = None,
) -> list[Evaluation]:
    """Evaluate ``points`` (in order) on ``workers`` processes (default: every core), or on
    a Dask ``cluster``: a scheduler's address (``tcp://HOST:8786``, its own workers) or
    ``local`` (a ``distributed.LocalCluster`` of ``workers`` processes); the results are
    the same (:mod:`pipesim.plan.backends`).

    ``progress(done, total)`` is called as results come in. A sweep that is not
    done after ``timeout_s`` seconds, or is interrupted (KeyboardInterrupt),
    terminates its workers at once; then with ``partial`` the points not yet
    evaluated come back as ``Evaluation(stopped=True)`` (their ``reason`` says
    why), without it a timeout raises PlanError and an interrupt propagates.

    >>> from pipesim.plan.hardware import get_accelerator
    >>> from pipesim.plan.model import ModelSpec
    >>> from pipesim.plan.workload import workload_from_model
    >>> spec = ModelSpec(n_layers=4, hidden=256, n_heads=4, seq_length=128, vocab_size=1000)
    >>> ctx = SweepContext(workload=workload_from_model(spec), devices=2,
    ...                    accelerator=get_accelerator("h100-sxm"), memory_capacity_bytes=10**10)
    >>> point = Point(schedule="1f1b", pipeline=2, virtual=1, microbatch_size=1,
    ...               n_microbatches=4, data_parallel=1)
    >>> [e.layers_per_stage for e in evaluate_points(ctx, [point], workers=1)]
    [(3, 3)]
    """
    total = len(points)
    if cluster not in (None, "local") and workers is not None:
        raise PlanError(
            f"workers={workers} (--workers) sizes --cluster local; the workers of the "
            f"scheduler at {cluster} are those started there (`dask worker {cluster}`): "
            "drop --workers"
        )
    workers = _check_workers(workers, timeout_s)
    stop = _Stopping(
        deadline=time.monotonic() + timeout_s,
        timeout_s=timeout_s,
        partial=partial,
        progress=progress,
    )
    # Cheapest first: results (and the progress bar) come from the first second, and a
    # sweep stopped early has ranked the many small configurations, not a few huge ones.
    indexed = sorted(enumerate(points), key=lambda item: _cost_estimate(item[1]))
    results: list[Evaluation | None] = [None] * total
    if progress is not None:
        progress(0, total)  # the bar shows from the first moment
    if cluster is None:
        workers = min(workers, max(1, total // 8))
        if workers == 1:
            return _evaluate_here(context, indexed, results, stop)
    return _evaluate_in_workers(context, indexed, results, stop, workers, cluster)


def _check_workers(workers: int | None, timeout_s: float) -> int:
    """The number of worker processes (None: every core); PlanError unless it is a whole
    number >= 1 and the timeout is positive."""
    if workers is None:
        workers = os.cpu_count() or 1
    if isinstance(workers, bool) or not isinstance(workers, int) or workers < 1:
        raise PlanError(f"workers must be a whole number >= 1, got {workers!r}")
    if timeout_s <= 0:
        raise PlanError(f"timeout must be positive, got {timeout_s!r} seconds")
    return workers


@dataclass(frozen=True, slots=True, kw_only=True)
class _Stopping:
    """When a sweep stops early, what it returns then, and whom it tells its progress."""

    deadline: float
    """``time.monotonic()`` past which the sweep stops."""
    timeout_s: float
    partial: bool
    """On a stop: return the points not evaluated as stopped (else raise)."""
    progress: Callable[[int, int], None] | None


def _stopped_early(results: list[Evaluation | None], why: str) -> list[Evaluation]:
    """``results`` with every point not evaluated marked as stopped for ``why``."""
    note = Evaluation(stopped=True, reason=f"not evaluated: {why}")
    return [note if r is None else r for r in results]


def _evaluate_here(
    context: SweepContext,
    indexed: list[tuple[int, Point]],
    results: list[Evaluation | None],
    stop: _Stopping,
) -> list[Evaluation]:
    """Evaluate the points in this process, one at a time, into ``results``."""
    total = len(results)
    deadline, progress = stop.deadline, stop.progress
    done = 0
    with sparse_gc():  # and each chunk's own, nested, keeps these thresholds
        try:
            for item in indexed:
                if time.monotonic() > deadline:
                    if stop.partial:
                        return _stopped_early(
                            results, f"the sweep stopped at its {stop.timeout_s:g} s deadline"
                        )
                    raise _timed_out(stop.timeout_s, done, total)
                for index, evaluation in _evaluate_chunk([item], context):
                    results[index] = evaluation
                done += 1
                if progress is not None:
                    progress(done, total)
        except KeyboardInterrupt:
            if not stop.partial:
                raise
            return _stopped_early(results, "the sweep was interrupted")
    return [r for r in results if r is not None]


def _evaluate_in_workers(
    context: SweepContext,
    indexed: list[tuple[int, Point]],
    results: list[Evaluation | None],
    stop: _Stopping,
    workers: int,
    cluster: str | None,
) -> list[Evaluation]:
    """Evaluate the points in chunks on a backend (:mod:`pipesim.plan.backends`): a pool
    of ``workers`` processes, or the Dask ``cluster``; into ``results``."""
    total = len(results)
    done = 0
    backend: Backend | None = None
    try:
        backend = open_backend(
            context,
            evaluate=_evaluate_chunk,
            workers=workers,
            cluster=cluster,
            deadline=stop.deadline,
        )
        chunk_size = max(1, min(16, total // (backend.workers * 32)))
        chunks = [indexed[k : k + chunk_size] for k in range(0, total, chunk_size)]
        lost: list[str] = []
        for chunk_results in backend.results(chunks, deadline=stop.deadline):
            if isinstance(chunk_results, LostChunk):
                chunk_results = _lost(chunk_results)
                lost.append(chunk_results[0][1].reason or "")
            for index, evaluation in chunk_results:
                results[index] = evaluation
            done += len(chunk_results)
            if stop.progress is not None:
                stop.progress(done, total)
        if lost and not stop.partial:
            raise PlanError("; ".join(r.removeprefix("not evaluated: ") for r in lost))
    except TimeoutError:
        if stop.partial:
            return _stopped_early(
                results, f"the sweep stopped at its {stop.timeout_s:g} s deadline"
            )
        raise _timed_out(stop.timeout_s, done, total) from None
    except KeyboardInterrupt:
        if not stop.partial:
            raise
        return _stopped_early(results, "the sweep was interrupted")
    finally:  # before any result is returned: nothing keeps running
        if backend is not None:
            backend.close()
    assert all(r is not None for r in results)
    return [r for r in results if r is not None]


def _lost(lost: LostChunk) -> list[tuple[int, Evaluation]]:
    """The points of a chunk that kept killing its workers, marked not evaluated, by name."""
    names = ", ".join(to_plan_point(point).label() for _, point in lost.chunk)
    note = Evaluation(stopped=True, reason=f"not evaluated: {names}: {lost.why}")
    return [(index, note) for index, _ in lost.chunk]


def _timed_out(timeout_s: float, done: int, total: int) -> PlanError:
    return PlanError(
        f"the sweep did not finish within {timeout_s:g} s ({done} of {total} configurations "
        "done); narrow it (--stages, --microbatch-sizes, --virtual, --schedules) or raise "
        "--timeout"
    )
