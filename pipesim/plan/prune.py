"""Best-first branch and bound over a sweep: simulate only what the plan can print.

:func:`evaluate_best_first` returns, for the same points, what
:func:`pipesim.plan.sweep.evaluate_points` returns, except that a point is left
unsimulated (``Evaluation.reason`` starts with ``pruned:``) when its lower bounds
(:mod:`pipesim.plan.bounds`) prove it cannot be in the printed plan:

- the ``keep`` fastest configurations that fit (the table and the HTML report),
- the next ``keep`` points of the step-time / memory Pareto front,
- for each value of t, p, recomputation, schedule and b, the fastest that fits
  (the alternatives that explain the winner),

with their ranks and Pareto marks. Points are simulated in order of their step-time
bound, a batch at a time; after each batch let T be the least bound of the points
not yet simulated. Every simulated point faster than T is final: nothing unsimulated
can come before it. The search stops when every row above lies below T, or when no
point left can be on the front (its memory bound is at least the least memory of a
fitting point faster than T) or enter an alternative (it provably does not fit).
Points whose memory bound exceeds the usable memory provably do not fit: they are
never simulated (unless nothing fits, when the plan shows the least memory-hungry
points, and every point is simulated). ``docs/planner-speed.md`` has the argument.
"""

from __future__ import annotations

import bisect
import itertools
import math
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from pipesim.plan.bounds import Bound, bound
from pipesim.plan.point import Evaluation, Point, SweepContext
from pipesim.plan.scoring import twin_key, twin_preference
from pipesim.plan.sweep import evaluate_points
from pipesim.units import NS_PER_S, format_bytes

__all__ = ["DEFAULT_KEEP", "Searched", "evaluate_best_first"]

DEFAULT_KEEP = 15
"""Rows the plan prints exactly: the HTML report's table (the text table shows 10)."""

_BATCH = 32
"""The fewest points a batch simulates. Batches never depend on the worker count, so a
plan prunes the same points on any number of workers."""

_FIELDS = ("tensor", "pipeline", "recompute", "schedule", "microbatch_size")
"""The dimensions whose fastest alternatives the plan prints (pipesim.plan.result)."""


@dataclass(frozen=True, slots=True)
class _Known:
    """A simulated point that fits: its place in the ranking."""

    index: int
    step_ns: int
    memory: int


@dataclass(frozen=True, slots=True)
class Searched:
    """What :func:`evaluate_best_first` found."""

    evaluations: list[Evaluation]
    """Per point, in order: simulated, or pruned (``reason`` says by which bound)."""
    exact_below_ns: float
    """Every configuration with a step time below this was simulated: the ranks of the
    points faster than it are exact, those of slower ones count only the simulated."""


def evaluate_best_first(
    context: SweepContext,
    points: Sequence[Point],
    /,
    *,
    keep: int = DEFAULT_KEEP,
    workers: int | None = None,
    timeout_s: float = 600.0,
    progress: Callable[[int, int], None] | None = None,
    partial: bool = False,
) -> Searched:
    """:func:`evaluate_points`, simulating only what the plan prints (module docstring)."""
    started = time.monotonic()
    deadline = started + timeout_s
    # the bounds may take half the time; past that the sweep goes on exhaustively, the
    # cheapest configurations first, so that a deadline still ranks what it reached
    try:
        bounds = _bounds(context, points, started + timeout_s / 2)
    except KeyboardInterrupt:
        if not partial:
            raise
        note = Evaluation(stopped=True, reason="not evaluated: the sweep was interrupted")
        return Searched([note] * len(points), math.inf)
    if bounds is None:
        left = max(deadline - time.monotonic(), 1e-3)
        evaluations = evaluate_points(
            context, points, workers=workers, timeout_s=left, progress=progress, partial=partial
        )
        return Searched(evaluations, math.inf)
    search = _Search(context, points, bounds, keep, workers, deadline, partial)
    total = len(points)
    queue = search.queue
    first = True
    while search.position < len(queue):  # the table and the alternatives
        if first:  # the most promising points give the first incumbents
            upto = min(len(queue), max(4 * keep, _BATCH))
            first = False
        else:  # then as far as the points known so far say the search must go
            upto = search.enough()
        if not search.run(queue[search.position : upto]):
            return search.stopped()
        search.position = upto
        if progress is not None:
            progress(search.position, total)
        if search.position < len(queue) and search.settled(search.threshold()):
            break
    while True:  # the Pareto front: simulate what no known point dominates
        open_ = [i for i in queue[search.position :] if not search.dominated(i)]
        if not open_:  # then every Pareto mark is exact, of every point
            break
        batch = open_[: max(_BATCH, len(open_) // 4)]
        if not search.run(batch):
            return search.stopped()
        done = set(batch)
        queue[search.position :] = [i for i in queue[search.position :] if i not in done]
        queue[search.position : search.position] = batch
        search.position += len(batch)
    if not search.counted_faster():
        return search.stopped()
    if progress is not None:
        progress(total, total)
    return Searched(search.finish(), search.threshold())


class _Search:
    """The state of one best-first search: bounds, results, the queue by step bound."""

    def __init__(
        self,
        context: SweepContext,
        points: Sequence[Point],
        bounds: list[Bound | None],
        keep: int,
        workers: int | None,
        deadline: float,
        partial: bool,
    ) -> None:
        self.context, self.points, self.keep = context, points, keep
        self.workers, self.partial = workers, partial
        self.deadline = deadline
        self.threads = threading.active_count()
        self.bounds = bounds
        self.usable = context.memory_capacity_bytes
        self.results: list[Evaluation | None] = [None] * len(points)
        bounds, usable = self.bounds, self.usable
        self.never_fits = [
            i for i, b in enumerate(bounds) if b is not None and b.memory_bytes > usable
        ]
        self.queue = sorted(
            (i for i, b in enumerate(bounds) if b is None or b.memory_bytes <= usable),
            key=lambda i: _step_bound(bounds[i]),
        )
        self.position = 0
        self.halted: Evaluation | None = None
        self._known: list[_Known] | None = None
        self._steps: list[int] = []
        self._least: list[int] = []

    def known(self) -> list[_Known]:
        """The simulated points that fit, in ranked order, twins dropped (cached until
        the next simulation)."""
        if self._known is None:
            self._known = _distinct(self.points, self.results, self.usable)
            self._steps = [k.step_ns for k in self._known]
            self._least = list(itertools.accumulate((k.memory for k in self._known), min))
        return self._known

    def threshold(self) -> float:
        """The least step bound of the points not simulated (inf: none is left)."""
        if self.position >= len(self.queue):
            return math.inf
        return _step_bound(self.bounds[self.queue[self.position]])

    def run(self, chunk: list[int]) -> bool:
        """Simulate the points ``chunk``; False when the sweep stopped first."""
        if not chunk:
            return True
        # The last batch's pool stops its manager thread just after it returns; a new
        # pool forks only from a single-threaded process (pipesim.plan.backends's
        # _start_method), so wait for that thread rather than take the forkserver.
        wait_until = time.monotonic() + 2.0
        while threading.active_count() > self.threads and time.monotonic() < wait_until:
            time.sleep(0.005)
        evaluated = evaluate_points(
            self.context,
            [self.points[i] for i in chunk],
            workers=self.workers,
            timeout_s=max(self.deadline - time.monotonic(), 1e-3),
            partial=self.partial,
        )
        for i, evaluation in zip(chunk, evaluated, strict=True):
            self.results[i] = evaluation
        self._known = None
        self.halted = next((e for e in evaluated if e.stopped), None)
        return self.halted is None

    def stopped(self) -> Searched:
        note = self.halted
        assert note is not None
        return Searched([note if r is None else r for r in self.results], 0)

    def enough(self) -> int:
        """Where the next batch should end: the first place in the queue from which, by
        what is known now, the table and alternatives would be settled."""
        queue = self.queue
        low, high = self.position + 1, len(queue)
        while low < high:  # settledness grows (mostly) with the threshold: bisect
            middle = (low + high) // 2
            if self.settled(_step_bound(self.bounds[queue[middle]]), waiting_from=middle):
                high = middle
            else:
                low = middle + 1
        # nothing known settles it yet: double the points simulated, best first
        step = max(_BATCH, self.position // 2)
        return max(min(low, self.position + step), min(len(queue), self.position + 8))

    def settled(self, threshold: float, waiting_from: int | None = None) -> bool:
        """Whether the ``keep`` fastest that fit and the two alternatives the plan names
        are known exactly, ``threshold`` being the least step bound not simulated."""
        waiting = self.queue[self.position if waiting_from is None else waiting_from :]
        final = [k for k in self.known() if k.step_ns < threshold]
        if len(final) < self.keep:
            return False
        # the plan names the two fastest alternatives: the fastest that fits with another
        # value of t, p, recomputation, schedule or b than the winner's
        points = self.points
        winner = points[final[0].index]
        seen: dict[str, set[object]] = {f: {getattr(winner, f)} for f in _FIELDS}
        listed: set[int] = set()
        for k in final:
            for field in _FIELDS:
                value = getattr(points[k.index], field)
                if value not in seen[field]:
                    seen[field].add(value)
                    listed.add(k.index)
        return len(listed) >= 2 or all(
            getattr(points[i], f) in seen[f] for i in waiting for f in _FIELDS
        )

    def dominated(self, i: int) -> bool:
        """Whether a simulated point that fits is faster than point ``i`` can be and
        needs no more memory than it at least needs: then ``i`` is not on the front."""
        found = self.bounds[i]
        if found is None:
            return False
        self.known()
        faster = bisect.bisect_left(self._steps, _step_bound(found))
        return faster > 0 and self._least[faster - 1] <= found.memory_bytes

    def counted_faster(self) -> bool:
        """Simulate the points that provably do not fit but could be faster than the
        winner (the plan counts them); with nothing fitting, every such point (the plan
        then shows the least memory-hungry). False when the sweep stopped first."""
        steps = [k.step_ns for k in self.known()]
        best = min(steps, default=None)
        more = [i for i in self.never_fits if best is None or _step_bound(self.bounds[i]) < best]
        return self.run(more)

    def finish(self) -> list[Evaluation]:
        """Every point's evaluation: pruned ones say which bound ruled them out."""
        out = []
        for i, r in enumerate(self.results):
            if r is not None:
                out.append(r)
                continue
            found = self.bounds[i]
            assert found is not None
            if found.memory_bytes > self.usable:
                why = (
                    f"pruned: needs at least {format_bytes(found.memory_bytes)} per device > "
                    f"{format_bytes(self.usable)} usable (not simulated)"
                )
            else:
                why = (
                    f"pruned: step time at least {float(found.step_ns) / NS_PER_S:.4g} s, behind "
                    "every configuration printed (not simulated)"
                )
            out.append(Evaluation(reason=why))
        return out


def _bounds(
    context: SweepContext, points: Sequence[Point], deadline: float
) -> list[Bound | None] | None:
    """Every point's bounds; None when ``deadline`` (``time.monotonic()``) passes first."""
    out = []
    for point in points:
        if time.monotonic() > deadline:
            return None
        out.append(bound(context, point))
    return out


def _step_bound(found: Bound | None) -> int:
    return 0 if found is None else int(found.step_ns)


def _distinct(
    points: Sequence[Point], results: list[Evaluation | None], usable: int
) -> list[_Known]:
    """The simulated points that fit, in ranked order, twins dropped as the plan drops
    them (:func:`pipesim.plan.scoring.twin_key`, :func:`~pipesim.plan.scoring.twin_preference`)."""
    fits = [i for i, e in enumerate(results) if e is not None and _fits(e, usable)]
    fits.sort(key=lambda i: twin_preference(points[i].schedule))
    seen: set[tuple[object, ...]] = set()
    kept = []
    for i in fits:
        e, p = results[i], points[i]
        assert e is not None
        key = twin_key(p, e.fingerprint)
        if e.fingerprint and key in seen:
            continue
        seen.add(key)
        kept.append(_Known(i, e.makespan_ns + e.allreduce_ns, e.peak_memory_bytes))
    return sorted(kept, key=lambda k: (k.step_ns, k.memory))


def _fits(evaluation: Evaluation, usable: int) -> bool:
    return evaluation.reason is None and evaluation.peak_memory_bytes <= usable
