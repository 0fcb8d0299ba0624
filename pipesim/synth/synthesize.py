"""``synthesize``: the fastest schedule pipesim can make for these costs and this memory.

Every greedy policy of :mod:`pipesim.synth.heuristic` proposes an order; so do
the built-in schedules that fit the placement (``zb-h1``, ``zb-h2``, ``1f1b``,
``zbv``, ...) and, on request, the exact solver. Each candidate is evaluated
with pipesim's exact evaluator (:mod:`pipesim.plan.fastsim`, identical to the
SimPy engine), candidates whose peak activation bytes exceed the limit on any
rank are dropped, and the fastest one left wins. So by construction the
result is never slower than a built-in schedule that fits the same limit, and
:attr:`SynthesisResult.winner` says honestly which candidate it was.

>>> from pipesim import generate, simulate
>>> result = synthesize(n_ranks=4, n_microbatches=8, memory_limit=4,
...                     costs=CostModel.uniform(forward=2, input_grad=2, weight_grad=1,
...                                             backward=3, activation_bytes=4,
...                                             weight_grad_bytes=1))
>>> result.metrics.makespan <= simulate(generate("zb-h1", n_ranks=4, n_microbatches=8),
...     costs=result.problem.costs).metrics.makespan
True
>>> max(result.peak_activation_bytes) <= 16
True
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from fractions import Fraction
from typing import Any

from pipesim.actions import OP_INDEX, Action, Overlap, Work, action_code
from pipesim.costs import CostModel
from pipesim.errors import PipesimError, ScheduleError
from pipesim.exact import Time, as_number
from pipesim.graph import validate
from pipesim.iterations import (
    DEFAULT_SYNC,
    Iterations,
    check_sync,
    simulate_iterations,
    steady_period,
)
from pipesim.metrics import Metrics
from pipesim.plan.fastsim import StepResult, compile_schedule, evaluate, metrics_of
from pipesim.schedule import Schedule
from pipesim.schedules import generate, get_spec, schedule_names
from pipesim.step.memory import byte_peaks, stage_effects, work_effect
from pipesim.synth.bound import lower_bound, split_is_cheapest
from pipesim.synth.heuristic import greedy_run, links_never_queue
from pipesim.synth.policies import Policy, policies
from pipesim.synth.problem import MemoryLimit, Problem, make_problem

__all__ = [
    "Candidate",
    "SynthesisResult",
    "builtin_candidates",
    "greedy_candidates",
    "order_peaks",
    "synthesize",
]


@dataclass(frozen=True, slots=True, kw_only=True)
class Candidate:
    """One schedule tried, with its makespan and memory under the problem's costs."""

    name: str
    """``greedy[...]`` for a heuristic policy, ``exact`` for the solver, else the built-in name."""
    builtin: bool
    schedule: Schedule
    makespan: Time
    peak_activation_bytes: tuple[int, ...]
    fits: bool
    """Whether every rank's peak is within the limit."""
    period: Time | None = None
    """The steady-state iteration period (:mod:`pipesim.iterations`), when the objective
    is ``period``."""


#: What synthesis minimizes: one step's makespan, or the steady-state iteration period
#: under an optimizer synchronization (:mod:`pipesim.iterations`).
OBJECTIVES = ("step", "period")


@dataclass(frozen=True, slots=True, kw_only=True)
class SynthesisResult:
    """The synthesized schedule, its metrics, and how it compares."""

    problem: Problem
    schedule: Schedule
    """The winner, renamed ``synthesized``."""
    metrics: Metrics
    """Under the problem's costs (identical to ``simulate(schedule, costs=...)``)."""
    peak_activation_bytes: tuple[int, ...]
    """Per rank, in the memory model the limit is checked in."""
    winner: str
    """Which candidate won (a greedy policy, ``exact``, or a built-in's name)."""
    lower_bound: Time
    """No schedule of this problem is faster (closed form, or the solver's bound)."""
    optimal: bool
    """True when the exact solver proved the winner optimal."""
    candidates: tuple[Candidate, ...]
    best_builtin: Candidate | None
    """The fastest built-in schedule that fits the limit (None if none does)."""
    best_builtin_metrics: Metrics | None
    """Its metrics under the problem's costs."""
    objective: str = "step"
    """What was minimized (:data:`OBJECTIVES`)."""
    iterations: Iterations | None = None
    """With the ``period`` objective: the winner's iterations re-simulated by the engine
    under the synchronization asked for (its period and the bubble against it)."""
    period_lower_bound: Time | None = None
    """With the ``period`` objective and the exact solver: its proven bound on the period
    (of schedules that split every backward; None where a full B could be cheaper)."""

    @property
    def gap(self) -> Fraction:
        """``makespan / lower_bound - 1``: how far from the bound, at most."""
        if not self.lower_bound:
            return Fraction(0)
        return Fraction(self.metrics.makespan) / Fraction(self.lower_bound) - 1

    def to_dict(self) -> dict[str, Any]:
        """``simulate --json``'s object plus the synthesis fields."""
        data = self.metrics.to_dict()
        data.update(
            {
                "lower_bound": as_number(self.lower_bound),
                "gap": float(self.gap),
                "optimal": self.optimal,
                "winner": self.winner,
                "placement": self.problem.placement_name,
                "overlap_fb": self.problem.overlap_fb,
                "virtual": self.problem.virtual,
                "memory_limit": str(self.problem.limit),
                "memory_limit_bytes": list(self.problem.limit_bytes),
                "limit_peak_bytes": list(self.peak_activation_bytes),
                "best_builtin": None
                if self.best_builtin_metrics is None
                else self.best_builtin_metrics.to_dict(),
                "candidates": [
                    {"name": c.name, "makespan": as_number(c.makespan), "fits": c.fits}
                    | ({} if c.period is None else {"period": as_number(c.period)})
                    for c in self.candidates
                ],
                "objective": self.objective,
            }
        )
        if self.iterations is not None:
            periods = self.iterations.to_dict()
            data["optimizer_sync"] = self.iterations.sync
            data["period"] = periods["period"]
            data["period_bubble_ratio"] = periods["period_bubble_ratio"]
            data["period_lower_bound"] = (
                None if self.period_lower_bound is None else as_number(self.period_lower_bound)
            )
        return data


def synthesize(
    *,
    n_ranks: int,
    n_microbatches: int,
    memory_limit: str | int | Fraction | MemoryLimit,
    costs: CostModel | None = None,
    virtual: int = 1,
    placement: str = "looped",
    exact: bool = False,
    exact_time_limit_s: float = 10.0,
    builtins: bool = True,
    quick: bool = False,
    overlap_fb: bool = False,
    progress: Callable[[int, int], None] | None = None,
    objective: str = "step",
    sync: str = DEFAULT_SYNC,
) -> SynthesisResult:
    """Make a schedule for these costs that holds at most ``memory_limit`` per rank.

    ``memory_limit``: micro-batches of each rank's activations (``8``, ``"16/3"``) or
    bytes with a unit (``"20GiB"``), see :mod:`pipesim.synth.problem`. ``exact`` adds the
    CP-SAT solver (needs ``pip install 'pipesim[exact]'``; small problems only), whose
    proven bound tightens :attr:`SynthesisResult.lower_bound`. ``quick`` tries only the
    greedy policies that win most often (the planner's sweep uses it). ``overlap_fb``
    (the V placement) also tries greedy policies that run a forward and the other chunk's
    full backward as one overlapped unit (DualPipe's F&B pair, priced by
    ``StageCost.overlap``); the candidates without pairs stay, so it is never slower.
    ``progress(done, total)`` is called as each candidate (greedy policy, registered
    schedule, the exact solver) is done, e.g. for the CLI's progress bar. ``objective``
    ``period`` ranks the candidates by their steady-state iteration period under the
    optimizer synchronization ``sync`` (:mod:`pipesim.iterations`) instead of one step's
    makespan: with ``post-validation`` the next iteration's work fills a step's fill and
    drain, so the longest per-rank span counts, as the zero-bubble paper's scheduler does.
    With ``period`` and ``exact`` the solver minimizes the period itself, seeded with the
    best candidate's schedule, within a deterministic work limit (``exact_time_limit_s``
    x :data:`WORK_PER_SECOND`, one worker, a fixed seed: the same answer on any machine
    that does that work within :data:`WALL_FACTOR` x ``exact_time_limit_s`` of wall time).
    """
    if objective not in OBJECTIVES:
        raise PipesimError(
            f"objective must be one of {', '.join(OBJECTIVES)}, got {objective!r}: step (one "
            "step's makespan) or period (the steady-state iteration period)"
        )
    check_sync(sync)
    problem = make_problem(
        n_ranks=n_ranks,
        n_microbatches=n_microbatches,
        costs=costs,
        memory_limit=memory_limit,
        virtual=virtual,
        placement=placement,
        overlap_fb=overlap_fb,
    )
    pool = _candidate_pool(
        problem,
        exact=exact,
        exact_time_limit_s=exact_time_limit_s,
        builtins=builtins,
        quick=quick,
        progress=progress,
        objective=objective,
        sync=sync,
    )
    result = _result(problem, pool, _choose(problem, pool.candidates))
    if objective == "step":
        return result
    iterations = simulate_iterations(result.schedule, costs=problem.costs, sync=sync)
    return replace(result, objective=objective, iterations=iterations)


def _with_periods(problem: Problem, candidates: list[Candidate], sync: str) -> list[Candidate]:
    """The fitting candidates with their steady-state periods (the others are dropped)."""
    return [
        replace(
            c,
            period=steady_period(c.schedule, costs=problem.costs, sync=sync, check=False).period,
        )
        for c in candidates
        if c.fits
    ]


@dataclass(frozen=True, slots=True, kw_only=True)
class _Pool:
    """Every candidate tried, the best lower bound known, and whether the solver proved
    its schedule optimal (in its model, which ignores link contention)."""

    candidates: list[Candidate]
    bound: Time
    optimal: bool
    period_bound: Time | None = None
    """With the period objective and the solver: no schedule's period is shorter."""


def _candidate_pool(
    problem: Problem,
    *,
    exact: bool,
    exact_time_limit_s: float,
    builtins: bool,
    quick: bool,
    progress: Callable[[int, int], None] | None,
    objective: str = "step",
    sync: str = DEFAULT_SYNC,
) -> _Pool:
    """The greedy policies', the built-ins' and the solver's candidates, each ticked off
    on ``progress`` as it is done; with the ``period`` objective only those that fit,
    each with its period, and the solver minimizing the period."""
    total = len(policies(problem, quick=quick))
    total += (len(schedule_names()) if builtins else 0) + (1 if exact else 0)
    tick = _Ticks(progress, total=total)
    candidates = greedy_candidates(problem, quick=quick, tick=tick)
    if builtins:
        candidates += builtin_candidates(problem, tick=tick)
    bound = lower_bound(problem)
    if objective == "period":
        candidates = _with_periods(problem, candidates, sync)
    if not exact:
        return _Pool(candidates=candidates, bound=bound, optimal=False)
    if objective == "period":
        pool = _with_exact_period(
            problem, candidates, bound=bound, sync=sync, time_limit_s=exact_time_limit_s
        )
    else:
        pool = _with_exact(problem, candidates, bound=bound, time_limit_s=exact_time_limit_s)
    tick()
    return pool


#: CP-SAT's deterministic work limit per second of ``exact_time_limit_s`` for the period
#: objective: with one worker and a fixed seed the answer is then the same on every
#: machine and under any load, as long as the wall limit (:data:`WALL_FACTOR` times
#: ``exact_time_limit_s``, a guard) is not reached first.
WORK_PER_SECOND = 0.1
WALL_FACTOR = 3


def _with_exact_period(
    problem: Problem,
    candidates: list[Candidate],
    *,
    bound: Time,
    sync: str,
    time_limit_s: float,
) -> _Pool:
    """``candidates`` plus the solver's schedule minimizing the period under ``sync``,
    seeded with the best candidate's (so larger problems can be tried, and the solver's
    schedule is kept only if the engine finds its period no longer). The solver's bound is
    on the period, not the makespan: ``bound`` stays the makespan's."""
    from pipesim.synth.cpsat import solve_exact

    seed = min(candidates, key=_rank, default=None)
    solution = solve_exact(
        problem,
        objective="period",
        sync=sync,
        hint=None if seed is None else seed.schedule,
        time_limit_s=time_limit_s * WALL_FACTOR,
        work_limit=time_limit_s * WORK_PER_SECOND,
    )
    if solution.schedule is not None:
        found = evaluate_candidate(problem, solution.schedule, name="exact")
        if found.fits:
            found = _with_periods(problem, [found], sync)[0]
            candidates = [*candidates, found]
    # A bound on the period of every schedule that splits its backwards and repeats every
    # iteration (its steady iteration is one of the solver's rigid repetitions); links
    # without contention, so it holds for the engine's period too.
    period_bound = solution.bound if split_is_cheapest(problem) else None
    return _Pool(
        candidates=candidates, bound=bound, optimal=solution.optimal, period_bound=period_bound
    )


def _with_exact(
    problem: Problem, candidates: list[Candidate], *, bound: Time, time_limit_s: float
) -> _Pool:
    """``candidates`` plus the solver's schedule, if it finds one within the fastest
    fitting candidate's makespan, and the bound tightened by the solver's where it holds."""
    from pipesim.synth.cpsat import solve_exact

    best_so_far = min((c.makespan for c in candidates if c.fits), default=None)
    solution = solve_exact(problem, time_limit_s=time_limit_s, horizon=best_so_far)
    if split_is_cheapest(problem):  # the solver's bound covers B and F&B schedules too
        bound = max(bound, solution.bound)
    if solution.schedule is not None:
        candidates = [*candidates, evaluate_candidate(problem, solution.schedule, name="exact")]
    return _Pool(candidates=candidates, bound=bound, optimal=solution.optimal)


@dataclass(frozen=True, slots=True, kw_only=True)
class _Choice:
    """The winner, its evaluation, and the candidates it was chosen from."""

    best: Candidate
    step: StepResult
    """``best`` under the problem's costs (the exact evaluator)."""
    candidates: list[Candidate]
    fitting: list[Candidate]
    """Those of ``candidates`` within the memory limit."""


def _choose(problem: Problem, candidates: list[Candidate]) -> _Choice:
    """The fastest candidate that fits (ties: less memory, then a synthesised one before a
    built-in), checked against the exact evaluator."""
    fitting = [c for c in candidates if c.fits]
    if not fitting:
        raise PipesimError(
            f"no schedule found within the memory limit {problem.limit} "
            f"({', '.join(f'{b:,}' for b in problem.limit_bytes)} bytes per rank); raise "
            "--memory-limit"
        )
    best = min(fitting, key=_rank)
    step = evaluate(compile_schedule(best.schedule), problem.costs)
    if step.makespan != best.makespan:
        # The greedy's own run disagreed with the evaluator, which links_never_queue
        # should rule out: evaluate every candidate and choose again.
        candidates = [
            c
            if c.builtin or c.name == "exact"
            else replace(evaluate_candidate(problem, c.schedule, name=c.name), period=c.period)
            for c in candidates
        ]
        fitting = [c for c in candidates if c.fits]
        best = min(fitting, key=_rank)
        step = evaluate(compile_schedule(best.schedule), problem.costs)
    return _Choice(best=best, step=step, candidates=candidates, fitting=fitting)


def _result(problem: Problem, pool: _Pool, choice: _Choice) -> SynthesisResult:
    """The winner renamed ``synthesized``, its metrics, and the best built-in's."""
    best = choice.best
    schedule = replace(best.schedule, name="synthesized")
    validate(schedule)
    metrics = metrics_of(schedule, problem.costs, choice.step)
    # The solver's optimum ignores link contention: proven only if met here.
    if pool.period_bound is None:
        optimal = pool.optimal and metrics.makespan == pool.bound
    else:
        optimal = best.period == pool.period_bound
    builtin = [c for c in choice.fitting if c.builtin]
    best_builtin = min(builtin, key=_rank) if builtin else None
    builtin_metrics = None
    if best_builtin is not None:
        step = evaluate(compile_schedule(best_builtin.schedule), problem.costs)
        builtin_metrics = metrics_of(best_builtin.schedule, problem.costs, step)
    return SynthesisResult(
        problem=problem,
        schedule=schedule,
        metrics=metrics,
        peak_activation_bytes=best.peak_activation_bytes,
        winner=best.name,
        lower_bound=pool.bound,
        optimal=optimal,
        candidates=tuple(choice.candidates),
        best_builtin=best_builtin,
        best_builtin_metrics=builtin_metrics,
        period_lower_bound=pool.period_bound,
    )


class _Ticks:
    """Counts finished candidates for a ``progress(done, total)`` callback, which hears
    0 done at once, so that a bar shows before the first (slowest) candidate is in."""

    def __init__(self, progress: Callable[[int, int], None] | None, *, total: int) -> None:
        self.progress = progress
        self.total = total
        self.done = 0
        if progress is not None:
            progress(0, total)

    def __call__(self) -> None:
        self.done += 1
        if self.progress is not None:
            self.progress(self.done, self.total)


def for_planner(
    *,
    n_ranks: int,
    n_microbatches: int,
    virtual: int,
    costs: CostModel,
    memory_limit_bytes: int,
    sync: str = DEFAULT_SYNC,
) -> Schedule:
    """The planner's builder (:mod:`pipesim.plan.cost_aware`): the synthesized schedule
    for this configuration, within the device memory left for activations, chosen by the
    steady-state period under ``sync``. (The sweep prices the optimizer step after the
    pipeline, so ``costs`` carry none: under ``global`` the period is then the step's
    makespan, and the step objective gives the same schedule for less work.)"""
    return synthesize(
        n_ranks=n_ranks,
        n_microbatches=n_microbatches,
        memory_limit=MemoryLimit(n_bytes=memory_limit_bytes),
        costs=costs,
        virtual=virtual,
        quick=True,
        objective="step" if sync == "global" else "period",
        sync=sync,
    ).schedule


def greedy_candidates(
    problem: Problem, *, quick: bool = False, tick: Callable[[], None] = lambda: None
) -> list[Candidate]:
    """Every greedy policy's schedule with its makespan and memory peaks.

    Where no message ever queues for a link (:func:`links_never_queue`), an unpaced
    policy's run starts every action as soon as its rank and inputs allow, as the
    engine does, so its makespan is the engine's and, with :func:`order_peaks`, the
    candidate needs no re-run (``tests/test_synth.py`` checks the identity with
    Hypothesis); policies that may hold a pass back or that pair F and B
    (:attr:`~pipesim.synth.policies.Policy.timed_by_the_evaluator`) and every policy on
    links that queue are evaluated with the exact evaluator.
    """
    trusted = links_never_queue(problem)
    out = []
    for policy in policies(problem, quick=quick):
        candidate = _greedy_candidate(problem, policy, trusted=trusted)
        if candidate is not None:
            out.append(candidate)
        tick()
    return out


def _greedy_candidate(problem: Problem, policy: Policy, *, trusted: bool) -> Candidate | None:
    run = greedy_run(problem, policy)
    if run is None:
        return None
    schedule = Schedule.from_orders(
        run.orders, placement=problem.placement, n_microbatches=problem.n_microbatches
    )
    if not trusted or policy.timed_by_the_evaluator:
        return evaluate_candidate(problem, schedule, name=policy.name)
    peaks = order_peaks(problem, run.orders)
    return Candidate(
        name=policy.name,
        builtin=False,
        schedule=schedule,
        makespan=run.makespan,
        peak_activation_bytes=peaks,
        fits=_fits(problem, peaks),
    )


def order_peaks(problem: Problem, orders: Sequence[Sequence[Work]]) -> tuple[int, ...]:
    """Per rank, the most bytes held (``memory_costs``): each action's effects
    (:mod:`pipesim.step.memory`, an overlapped unit's summed) at its start and its end in
    program order, as the evaluator applies them; no timing needed."""
    table = stage_effects(problem.memory_costs, n_stages=problem.n_stages, forward_only=False)
    # an action's row is its action code; an overlapped unit's summed effect gets a row
    # of its own after them
    effects = [effect for row in table for effect in row]
    codes = {op: [action_code(s, op) for s in range(len(table))] for op in OP_INDEX}
    numbered = []
    for order in orders:
        ids = []
        for work in order:
            if isinstance(work, Action):
                ids.append(codes[work.op][work.stage])
            else:
                ids.append(len(effects))
                effects.append(work_effect(table, work))
        numbered.append(ids)
    return byte_peaks(effects, numbered)


def _fits(problem: Problem, peaks: tuple[int, ...]) -> bool:
    return all(b <= limit for b, limit in zip(peaks, problem.limit_bytes, strict=True))


def _rank(candidate: Candidate) -> tuple[Time, Time, int, bool]:
    """Period first where known (the ``period`` objective), then makespan, memory, and a
    synthesized schedule before a built-in."""
    period = candidate.makespan if candidate.period is None else candidate.period
    return (period, candidate.makespan, max(candidate.peak_activation_bytes), candidate.builtin)


def evaluate_candidate(problem: Problem, schedule: Schedule, *, name: str) -> Candidate:
    """Makespan and memory peaks of ``schedule`` under the problem's costs."""
    step = evaluate(compile_schedule(schedule), problem.memory_costs)
    peaks = step.peak_activation_bytes
    return Candidate(
        name=name,
        builtin=name in schedule_names(),
        schedule=schedule,
        makespan=step.makespan,
        peak_activation_bytes=peaks,
        fits=_fits(problem, peaks),
    )


def builtin_candidates(
    problem: Problem, *, tick: Callable[[], None] = lambda: None
) -> list[Candidate]:
    """Every registered training schedule with the problem's placement, evaluated; one
    made of overlapped F&B pairs (``dualpipev``) only with ``Problem.overlap_fb``, so that
    the bound, which counts pairs only then, holds for every candidate. ``tick`` is
    called once per registered schedule, tried or not."""
    out = []
    for name in schedule_names():
        candidate = _builtin_candidate(problem, name)
        if candidate is not None:
            out.append(candidate)
        tick()
    return out


def _builtin_candidate(problem: Problem, name: str) -> Candidate | None:
    spec = get_spec(name)
    if spec.virtual_values is not None and problem.virtual not in spec.virtual_values:
        return None
    try:
        schedule = generate(
            name,
            n_ranks=problem.n_ranks,
            n_microbatches=problem.n_microbatches,
            virtual=problem.virtual,
        )
    except ScheduleError:
        return None  # the family's rules refuse these sizes
    if schedule.placement != problem.placement or schedule.n_copies != 1:
        return None
    if not problem.overlap_fb and any(
        isinstance(work, Overlap) for order in schedule.orders for work in order
    ):
        return None  # overlapped pairs (dualpipev) only where the problem allows them
    return evaluate_candidate(problem, schedule, name=name)
