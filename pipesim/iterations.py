"""Several training iterations in one simulation: the optimizer step between them, its
synchronization, and the steady-state iteration period (docs/steady-state.md).

Words: a *step* is one pass of a schedule (the compiled step of :mod:`pipesim.step`,
what :func:`pipesim.engine.simulate` runs); a training *iteration* is one step followed
by each rank's optimizer step. The command line counts iterations with ``--steps K``.

Between iterations each rank steps its optimizer: the sum of its stages'
``StageCost.optimizer`` times, after its last unit of work. When it may start is the
synchronization rule (``sync``):

- ``global`` (Megatron-LM's default: the optimizer computes the gradient norm for
  clipping and the inf/nan check with an all-reduce over the model-parallel ranks
  before it updates): every rank's optimizer starts ``CostModel.sync_time`` after the
  last rank's last work ends.
- ``post-validation`` (the zero-bubble paper's optimizer post-validation, as its
  runtime does it: ``megatron/core/optimizer/optimizer.py`` of
  sail-sg/zero-bubble-pipeline-parallelism, ``pre_step``): rank r receives the
  partially reduced norm and inf flag from rank r-1, merges its own, sends them on to
  r+1 and steps its optimizer at once; the fully reduced state comes back from the last
  rank during the next iteration's warm-up and is checked there (a rollback, which
  this model assumes never happens, redoes the step). So rank r's optimizer starts at
  ``ready[r] = max(end[r], ready[r-1] + sync_time)``, ``ready[0] = end[0]``.
- ``none``: each rank steps its optimizer when its own work ends.

Rank r's next iteration may start when its optimizer step ends. Every dependency of an
iteration's work lies inside that iteration and each rank runs its iterations one after
the other, so iteration k+1 depends on iteration k only through these per-rank release
times: each iteration is one engine run of the compiled step from its release times
(:func:`pipesim.engine.run_compiled`), exactly as the run of all K unrolled into one
schedule (``tests/test_iterations.py`` checks it against that run). A link's messages of
two iterations could meet only on a link that costs time; :func:`simulate_iterations`
checks that they do not, and refuses the run where they would.

The steady-state period is found exactly: the release times map to the next ones by a
function that commutes with a shift of time (every time is a max or sum of the times
before), so once some iteration's release times are an earlier one's shifted by the
same ``c`` on every rank, all later iterations repeat the same way, and the period is
``c`` over the number of iterations between them.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

from pipesim.actions import Action, Overlap, Work
from pipesim.costs import CostModel
from pipesim.engine import Simulation, run_compiled
from pipesim.errors import PipesimError, brief
from pipesim.exact import Time, as_number
from pipesim.graph import validate
from pipesim.metrics import compute_metrics
from pipesim.nogc import paused_gc
from pipesim.schedule import Schedule
from pipesim.step import CompiledStep, compile_step
from pipesim.trace import ActionRecord, MemoryRecord, Trace, TransferRecord

# The constants (SYNCS, DEFAULT_SYNC, MAX_PERIOD_ITERATIONS) are imported from here.
__all__ = [
    "Iterations",
    "OptimizerRecord",
    "Period",
    "check_sync",
    "microbatch_of",
    "simulate_iterations",
    "steady_period",
    "unrolled",
]

#: The optimizer synchronization rules (module docstring).
SYNCS = ("global", "none", "post-validation")
#: Megatron-LM's: the gradient-norm all-reduce before any rank's optimizer step.
DEFAULT_SYNC = "global"
#: Iterations :func:`steady_period` runs at most before it says the pattern did not repeat.
MAX_PERIOD_ITERATIONS = 256


@dataclass(frozen=True, slots=True, kw_only=True)
class OptimizerRecord:
    """One rank's optimizer step after ``iteration``: from ``start`` to ``end``; its
    work had ended at ``ready``, so it waited ``start - ready`` for the synchronization."""

    rank: int
    iteration: int
    ready: Time
    start: Time
    end: Time


@dataclass(frozen=True, slots=True, kw_only=True)
class Period:
    """The steady-state iteration period and how it was found."""

    period: Time
    """Time between consecutive iterations' starts on every rank, in the steady state
    (averaged over ``cycle`` iterations when the pattern repeats every ``cycle``)."""
    first: int
    """The first iteration (0-based) of the repeating pattern."""
    cycle: int
    """Iterations after which the pattern repeats, shifted by ``cycle * period``."""
    iterations: int
    """Iterations simulated to find it."""

    def describe(self) -> str:
        """How it was found, in words."""
        every = "each iteration" if self.cycle == 1 else f"every {self.cycle} iterations"
        return (
            f"from iteration {self.first} every rank's start repeats {every}, shifted by "
            f"the same time (found after {self.iterations} simulated "
            f"iteration{'s' if self.iterations != 1 else ''}; exact)"
        )


@dataclass(frozen=True, slots=True, kw_only=True)
class Iterations:
    """K iterations of a schedule with their optimizer steps."""

    schedule: Schedule
    """One iteration's schedule."""
    costs: CostModel
    sync: str
    traces: tuple[Trace, ...]
    """Per iteration its step's trace, in absolute time (micro-batches as in ``schedule``)."""
    optimizer: tuple[OptimizerRecord, ...]
    """Per iteration and rank its optimizer step, in (iteration, rank) order."""
    simulation: Simulation
    """All K steps as one: the schedule unrolled (:func:`unrolled`), its trace and metrics
    (the optimizer steps are in ``optimizer``, not in the trace)."""
    period: Period | None
    """The steady-state period; None when it did not repeat (``no_period`` says why)."""
    no_period: str = ""

    @property
    def steps(self) -> int:
        """The iteration count K."""
        return len(self.traces)

    @property
    def makespan(self) -> Time:
        """End of the last work or optimizer step."""
        return max([self.simulation.trace.makespan, *(o.end for o in self.optimizer)])

    def starts(self, iteration: int, /) -> tuple[Time, ...]:
        """Per rank, the start of its first work in ``iteration``."""
        return _first_starts(self.traces[iteration])

    def step_makespan(self, iteration: int, /) -> Time:
        """First start to last end of ``iteration``'s step (its work and messages): for
        iteration 0, the makespan of one step."""
        trace = self.traces[iteration]
        return trace.makespan - min(self.starts(iteration))

    def period_bubble_ratio(self) -> Fraction | None:
        """Idle share of ranks x the period: ``1 - busy / (n_ranks * period)``, busy one
        iteration's work and optimizer steps on every rank (None without a period)."""
        if self.period is None:
            return None
        busy = sum(self.traces[0].totals().busy, start=0)
        busy += sum((o.end - o.start for o in self.optimizer if o.iteration == 0), start=0)
        capacity = self.schedule.n_ranks * self.period.period
        return Fraction(0) if not capacity else 1 - Fraction(busy) / Fraction(capacity)

    def _period_dict(self) -> dict[str, Any]:
        period = self.period
        return {
            "period": None if period is None else as_number(period.period),
            "period_first_iteration": None if period is None else period.first,
            "period_cycle": None if period is None else period.cycle,
            "period_found": self.no_period if period is None else period.describe(),
            "period_bubble_ratio": _no_none(self.period_bubble_ratio()),
        }

    def to_dict(self) -> dict[str, Any]:
        """The ``iterations`` object of ``simulate --json`` (docs/steady-state.md)."""
        return {
            "steps": self.steps,
            "optimizer_sync": self.sync,
            "step_makespans": [as_number(self.step_makespan(k)) for k in range(self.steps)],
            "iteration_starts": [[as_number(t) for t in self.starts(k)] for k in range(self.steps)],
            **self._period_dict(),
            "makespan": as_number(self.makespan),
            "optimizer_steps": [
                {
                    "rank": o.rank,
                    "iteration": o.iteration,
                    "ready": as_number(o.ready),
                    "start": as_number(o.start),
                    "end": as_number(o.end),
                }
                for o in self.optimizer
            ],
        }


def _no_none(value: Fraction | None) -> float | None:
    return None if value is None else float(value)


def check_sync(sync: str, /) -> str:
    """``sync`` if it names a rule, else a :class:`PipesimError` listing them."""
    if sync not in SYNCS:
        raise PipesimError(
            f"optimizer sync must be one of {', '.join(SYNCS)}, got {brief(sync)}; "
            f"{DEFAULT_SYNC} is Megatron-LM's"
        )
    return sync


def simulate_iterations(
    schedule: Schedule,
    /,
    *,
    costs: CostModel | None = None,
    steps: int = 1,
    sync: str = DEFAULT_SYNC,
    check: bool = True,
) -> Iterations:
    """``steps`` training iterations of ``schedule`` under ``costs``, each followed by the
    optimizer steps and ``sync`` (module docstring), and the steady-state period.

    >>> from pipesim.schedules import generate
    >>> s = generate("1f1b", n_ranks=2, n_microbatches=2)
    >>> it = simulate_iterations(s, costs=CostModel.uniform(optimizer=1), steps=3)
    >>> it.step_makespan(0), it.period.period   # a step of 9, then the optimizer
    (9, 10)
    >>> zb = generate("zb-h2", n_ranks=4, n_microbatches=8)   # F = I = W = 1
    >>> [steady_period(zb, sync=sync).period for sync in ("global", "post-validation")]
    [27, 24]
    """
    check_sync(sync)
    if type(steps) is not int or steps < 1:
        raise PipesimError(f"steps must be a whole number of iterations >= 1, got {brief(steps)}")
    costs = (costs or CostModel()).for_stages(schedule.n_stages)
    if check:
        validate(schedule)
    with paused_gc():
        runs, period, why = _run(compile_step(schedule, costs), sync, steps, MAX_PERIOD_ITERATIONS)
    traces = tuple(trace for trace, _ in runs)
    optimizer = tuple(o for _, steps_of in runs for o in steps_of)
    _check_links(traces, costs)
    unrolled_schedule = unrolled(schedule, steps)
    combined = _combined(traces, schedule)
    simulation = Simulation(
        schedule=unrolled_schedule,
        costs=costs,
        trace=combined,
        metrics=compute_metrics(combined, schedule=unrolled_schedule, costs=costs),
    )
    return Iterations(
        schedule=schedule,
        costs=costs,
        sync=sync,
        traces=traces,
        optimizer=optimizer,
        simulation=simulation,
        period=period,
        no_period=why,
    )


def steady_period(
    schedule: Schedule,
    /,
    *,
    costs: CostModel | None = None,
    sync: str = DEFAULT_SYNC,
    max_iterations: int = MAX_PERIOD_ITERATIONS,
    check: bool = True,
) -> Period:
    """The steady-state iteration period of ``schedule`` under ``costs`` and ``sync``:
    iterations are simulated until some iteration's release times are an earlier one's
    shifted by one time on every rank (module docstring); a :class:`PipesimError` if
    that takes more than ``max_iterations`` (the error says each rank's last iteration).

    >>> from pipesim.schedules import generate
    >>> steady_period(generate("1f1b", n_ranks=2, n_microbatches=2)).period
    9
    """
    check_sync(sync)
    costs = (costs or CostModel()).for_stages(schedule.n_stages)
    if check:
        validate(schedule)
    with paused_gc():
        _, period, why = _run(compile_step(schedule, costs), sync, 0, max_iterations)
    if period is None:
        raise PipesimError(why)
    return period


def _run(
    step: CompiledStep, sync: str, keep: int, max_iterations: int
) -> tuple[list[tuple[Trace, tuple[OptimizerRecord, ...]]], Period | None, str]:
    """The first ``keep`` iterations, the period (None if it did not repeat within
    ``max_iterations``) and, then, why: iterations are run until both are known."""
    schedule = step.structure.schedule
    releases: list[tuple[Time, ...]] = [(0,) * schedule.n_ranks]
    kept: list[tuple[Trace, tuple[OptimizerRecord, ...]]] = []
    period: Period | None = None
    why = ""
    for count, (trace, optimizer) in enumerate(_iterate(step, sync), start=1):
        if len(kept) < keep:
            kept.append((trace, optimizer))
        if period is None and not why:
            releases.append(tuple(o.end for o in optimizer))
            found = _repeat(releases)
            if found is not None:
                first, cycle, shift = found
                exact = Fraction(shift) / cycle
                value: Time = exact.numerator if exact.denominator == 1 else exact
                period = Period(period=value, first=first, cycle=cycle, iterations=count)
            elif count >= max_iterations:
                last = [as_number(a - b) for a, b in zip(releases[-1], releases[-2], strict=True)]
                why = (
                    f"the iterations of {schedule.name!r} did not repeat within "
                    f"{max_iterations} iterations (every rank's start shifted by one time): "
                    f"the last iteration took {last} per rank, so some ranks run at a rate of "
                    "their own (a rank no later one waits for, as in a forward-only "
                    "pipeline without a sync); the period is not known"
                )
        if (period is not None or why) and len(kept) >= keep:
            return kept, period, why
    raise AssertionError("unreachable: _iterate never ends")


def _repeat(releases: Sequence[tuple[Time, ...]]) -> tuple[int, int, Time] | None:
    """``(first, cycle, shift)`` when the last release vector is the one ``cycle`` before
    it shifted by ``shift`` on every rank (the earliest such ``cycle``), else None."""
    last = releases[-1]
    for cycle in range(1, len(releases)):
        before = releases[-1 - cycle]
        shift = last[0] - before[0]
        if all(a - b == shift for a, b in zip(last, before, strict=True)):
            return len(releases) - 1 - cycle, cycle, shift
    return None


def _iterate(step: CompiledStep, sync: str) -> Any:
    """Yield per iteration its trace and optimizer records, forever."""
    n_ranks = step.structure.schedule.n_ranks
    optimizer_times = _optimizer_times(step)
    sync_time = step.costs.sync_time
    release: tuple[Time, ...] = (0,) * n_ranks
    iteration = 0
    while True:
        trace = run_compiled(step, release=release)
        ends = _last_ends(trace, release)
        starts = _optimizer_starts(ends, sync, sync_time)
        records = tuple(
            OptimizerRecord(
                rank=r,
                iteration=iteration,
                ready=ends[r],
                start=starts[r],
                end=starts[r] + optimizer_times[r],
            )
            for r in range(n_ranks)
        )
        yield trace, records
        release = tuple(o.end for o in records)
        iteration += 1


def _optimizer_starts(ends: Sequence[Time], sync: str, sync_time: Time) -> list[Time]:
    """Per rank when its optimizer step starts, its work having ended at ``ends``: the
    one place the synchronization rules are written (module docstring)."""
    if sync == "none":
        return list(ends)
    if sync == "global":
        return [max(ends) + sync_time] * len(ends)
    ready: list[Time] = []
    for end in ends:  # post-validation: the partial reduction passes rank to rank
        ready.append(end if not ready else max(end, ready[-1] + sync_time))
    return ready


def _optimizer_times(step: CompiledStep) -> list[Time]:
    """Per rank the sum of its stages' optimizer step times (it steps all its chunks)."""
    schedule = step.structure.schedule
    times: list[Time] = [0] * schedule.n_ranks
    for stage, rank in enumerate(schedule.placement):
        times[rank] += step.costs.stage(stage).optimizer
    return times


def _last_ends(trace: Trace, release: Sequence[Time]) -> list[Time]:
    """Per rank the end of its last work (its release time when it has none)."""
    ends = list(release)
    for record in trace.actions:
        if record.end > ends[record.rank]:
            ends[record.rank] = record.end
    return ends


def _first_starts(trace: Trace) -> tuple[Time, ...]:
    starts: list[Time | None] = [None] * trace.n_ranks
    for record in trace.actions:
        seen = starts[record.rank]
        if seen is None or record.start < seen:
            starts[record.rank] = record.start
    return tuple(0 if s is None else s for s in starts)


def _check_links(traces: Sequence[Trace], costs: CostModel) -> None:
    """Refuse a run where a message of one iteration would queue on its link behind one of
    the previous iteration (each iteration's engine run starts with its links free); only
    a message that occupies its link (bytes over a bandwidth) can queue."""

    def occupies(t: TransferRecord) -> bool:
        return bool(costs.link_between(t.src_rank, t.dst_rank).occupancy(t.n_bytes))

    for k in range(1, len(traces)):
        last: dict[tuple[int, int], Time] = {}
        for t in traces[k - 1].transfers:
            if occupies(t):
                pair = (t.src_rank, t.dst_rank)
                last[pair] = max(last.get(pair, t.end), t.end)
        for t in traces[k].transfers:
            pair = (t.src_rank, t.dst_rank)
            if pair in last and t.start < last[pair] and occupies(t):
                raise PipesimError(
                    f"iteration {k}'s message {t.producer} -> {t.consumer} leaves on link "
                    f"{pair[0]}->{pair[1]} at {as_number(t.start)}, before iteration {k - 1}'s "
                    f"last message there arrives ({as_number(last[pair])}); pipesim simulates "
                    "iterations with their links free at the start: use --optimizer-sync "
                    "global, or links without a bandwidth limit"
                )


def microbatch_of(schedule: Schedule, steps: int, iteration: int, microbatch: int, /) -> int:
    """The micro-batch ``microbatch`` of ``iteration`` in the schedule of ``steps``
    iterations unrolled: each model copy's micro-batches stay one block (Schedule.n_copies).

    >>> from pipesim.schedules import generate
    >>> microbatch_of(generate("1f1b", n_ranks=2, n_microbatches=4), 3, 2, 1)
    9
    """
    per = schedule.n_microbatches // schedule.n_copies
    copy, index = divmod(microbatch, per)
    return copy * steps * per + iteration * per + index


def unrolled(schedule: Schedule, steps: int, /) -> Schedule:
    """``steps`` iterations of ``schedule`` as one schedule: each rank runs iteration k's
    work (micro-batches renumbered by :func:`microbatch_of`) after iteration k-1's."""
    orders = tuple(
        tuple(_renamed(w, schedule, steps, k) for k in range(steps) for w in order)
        for order in schedule.orders
    )
    before = tuple(
        (_renamed(a, schedule, steps, k), _renamed(b, schedule, steps, k))
        for k in range(steps)
        for a, b in schedule.happens_before
    )
    return Schedule(
        orders=orders,
        placement=schedule.placement,
        n_microbatches=schedule.n_microbatches * steps,
        name=schedule.name,
        happens_before=before,
        n_copies=schedule.n_copies,
    )


def _renamed(work: Work, schedule: Schedule, steps: int, iteration: int) -> Any:
    if isinstance(work, Overlap):
        return Overlap(parts=tuple(_renamed(p, schedule, steps, iteration) for p in work.parts))
    assert isinstance(work, Action)
    mb = microbatch_of(schedule, steps, iteration, work.microbatch)
    return Action(stage=work.stage, op=work.op, microbatch=mb)


def _combined(traces: Sequence[Trace], schedule: Schedule) -> Trace:
    """One trace of all iterations, micro-batches renumbered as :func:`unrolled` does;
    each rank's memory carries over: what it holds at the end of an iteration is added
    to the next's records."""
    steps = len(traces)
    actions: list[ActionRecord] = []
    transfers: list[TransferRecord] = []
    memory: list[MemoryRecord] = []
    held = [(0, 0)] * schedule.n_ranks
    for k, trace in enumerate(traces):
        actions += [
            ActionRecord(
                rank=a.rank, work=_renamed(a.work, schedule, steps, k), start=a.start, end=a.end
            )
            for a in trace.actions
        ]
        transfers += [
            TransferRecord(
                src_rank=t.src_rank,
                dst_rank=t.dst_rank,
                producer=_renamed(t.producer, schedule, steps, k),
                consumer=_renamed(t.consumer, schedule, steps, k),
                n_bytes=t.n_bytes,
                start=t.start,
                end=t.end,
            )
            for t in trace.transfers
        ]
        carried = list(held)
        for m in trace.memory:
            base_bytes, base_count = carried[m.rank]
            sample = MemoryRecord(
                rank=m.rank,
                time=m.time,
                activation_bytes=m.activation_bytes + base_bytes,
                inflight=m.inflight + base_count,
            )
            memory.append(sample)
            held[m.rank] = (sample.activation_bytes, sample.inflight)
    actions.sort(key=lambda r: (r.start, r.rank))
    transfers.sort(key=lambda t: (t.start, t.src_rank, t.dst_rank))
    memory.sort(key=lambda m: (m.time, m.rank))
    return Trace(n_ranks=schedule.n_ranks, actions=actions, transfers=transfers, memory=memory)
