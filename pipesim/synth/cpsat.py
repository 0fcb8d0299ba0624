"""The exact search for small problems: OR-Tools CP-SAT, a lower bound and an optimum.

The model (Qi et al. 2024 solve the same problem as an ILP, sec. 3.2):

- one interval per action (F, I, W of every stage and micro-batch), of the
  stage's duration, on the rank that holds the stage; intervals on a rank do
  not overlap;
- F of stage ``s`` starts after F of ``s - 1`` ends plus the message's
  latency and transfer time; I of ``s`` after F of ``s`` and after I of
  ``s + 1`` plus the message; W after I;
- each rank's activation bytes, a reservoir changed at the starts and ends of
  F, I and W exactly as the engine changes them (:func:`pipesim.step.memory.op_effects`);
  the level stays within the limit;
- minimise the makespan, or (``objective="period"``) the steady-state iteration
  period under an optimizer synchronization (:mod:`pipesim.iterations`): the step
  repeated every ``P`` is feasible when each rank's next first action, ``P`` after
  this one's, comes no earlier than its release (its optimizer step's end under the
  rule), so ``P >= release[r] - first_start[r]`` on every rank; the engine runs the
  same orders as early as their inputs allow, never later than that rigid
  repetition, so the period it finds is at most the solver's ``P``.
  Micro-batches are interchangeable (every micro-batch costs the same on a stage), so
  each stage runs its F, its I and its W in micro-batch order: an exchange of two
  passes of one op on one stage keeps every dependency and every memory level,
  so every schedule can be renumbered so (the zero-bubble repository's scheduler,
  ``zerobubble/scheduler/zb.py``, orders them the same way).

Links are modelled without contention and senders never wait, a relaxation of
the engine: the solver's bound is a lower bound for pipesim's makespan of any
schedule that splits its backwards (of any schedule at all when I + W costs no
more than B, :func:`pipesim.synth.bound.split_is_cheapest`), and a solution's
orders simulate to at most its objective. Times are scaled to
integers by the common denominator of the durations, exactly.

Needs ``pip install 'pipesim[exact]'`` (OR-Tools); imported only when used.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

from pipesim.actions import Action, Op, action_code
from pipesim.errors import PipesimError
from pipesim.exact import Time, whole_or_fraction
from pipesim.graph import validate
from pipesim.iterations import DEFAULT_SYNC, check_sync
from pipesim.schedule import Schedule
from pipesim.step.cost_tables import message_bytes
from pipesim.step.memory import op_effects
from pipesim.synth.problem import Problem, durations_of

__all__ = ["MAX_EXACT_ACTIONS", "MAX_SEEDED_ACTIONS", "ExactSolution", "solve_exact"]

#: Beyond this many actions the model is too big to solve or prove in seconds.
MAX_EXACT_ACTIONS = 600
#: With a seed schedule (``hint``) the solver improves on a known schedule within its
#: time limit, never returning a worse one, so larger problems are worth a try.
MAX_SEEDED_ACTIONS = 10_000

_OPS = (Op.F, Op.I, Op.W)


@dataclass(frozen=True, slots=True, kw_only=True)
class ExactSolution:
    """What CP-SAT found within its time limit."""

    schedule: Schedule | None
    """The best schedule found (None if none within the time limit)."""
    makespan: Time | None
    """Its makespan in the solver's model (an upper bound on pipesim's)."""
    bound: Time
    """No schedule of the problem is faster than this."""
    optimal: bool
    """The solver proved ``makespan == bound``."""
    status: str
    wall_s: float
    objective: str = "step"
    """What was minimised: ``step`` (the makespan) or ``period``."""
    period: Time | None = None
    """With ``objective="period"``: the best schedule's period in the solver's model (an
    upper bound on the engine's); ``bound`` is then a bound on the period."""


def solve_exact(
    problem: Problem,
    /,
    *,
    time_limit_s: float = 10.0,
    horizon: Time | None = None,
    workers: int = 1,
    objective: str = "step",
    sync: str = DEFAULT_SYNC,
    hint: Schedule | None = None,
    work_limit: float | None = None,
) -> ExactSolution:
    """Solve ``problem`` with CP-SAT; ``horizon`` (a known makespan) prunes the search.

    ``objective``: ``step`` (the makespan) or ``period`` (the steady-state period under
    the optimizer synchronization ``sync``). ``hint``: a schedule to start from (its
    engine times), which lets problems of up to :data:`MAX_SEEDED_ACTIONS` actions be
    tried. ``work_limit``: CP-SAT's deterministic time limit, so that with one worker
    and its fixed seed the answer does not depend on the machine's speed or load
    (``time_limit_s`` still caps the wall time).

    >>> from pipesim.synth.problem import make_problem
    >>> pb = make_problem(n_ranks=2, n_microbatches=2, memory_limit=2)
    >>> solve_exact(pb).bound  # rank 1 starts after one F, then 6 actions of work
    7
    >>> solve_exact(pb, objective="period", sync="none").period  # rank 0 waits 1 for 1I0
    7
    """
    cp_model = _import_cp_model()
    check_sync(sync)
    if objective not in ("step", "period"):
        raise PipesimError(f"objective must be step or period, got {objective!r}")
    _check_size(problem, seeded=hint is not None)
    times = _ScaledTimes.of(problem)
    top = times.serial_total(problem)
    if horizon is not None and objective == "step":
        top = times.to_int(horizon)
    built = _build_model(cp_model, problem, times, top=top, objective=objective, sync=sync)
    if hint is not None:
        _add_hint(built, problem, hint)
    solver = cp_model.CpSolver()
    solver.parameters.max_time_in_seconds = time_limit_s
    if work_limit is not None:
        solver.parameters.max_deterministic_time = work_limit
    solver.parameters.num_workers = workers
    solver.parameters.random_seed = 0
    began = time.perf_counter()
    status = solver.solve(built.model)
    wall = time.perf_counter() - began
    return _solution(cp_model, problem, built, solver, status, wall_s=wall)


def _import_cp_model() -> Any:
    """OR-Tools' CP-SAT module, an optional dependency imported only when used."""
    try:
        from ortools.sat.python import cp_model
    except ImportError:
        raise PipesimError(
            "the exact solver needs OR-Tools: pip install 'pipesim[exact]' (or ortools)"
        ) from None
    return cp_model


def _check_size(problem: Problem, *, seeded: bool = False) -> None:
    """Refuse a problem of more than :data:`MAX_EXACT_ACTIONS` actions
    (:data:`MAX_SEEDED_ACTIONS` with a seed schedule)."""
    n_stages, m = problem.n_stages, problem.n_microbatches
    n_actions = 3 * n_stages * m
    most = MAX_SEEDED_ACTIONS if seeded else MAX_EXACT_ACTIONS
    if n_actions > most:
        raise PipesimError(
            f"the exact solver is for small problems (at most {most} actions), "
            f"this one has {n_actions} (3 x {n_stages} stages x {m} micro-batches); drop "
            "--exact or use fewer micro-batches"
        )


#: ``(stage, op, micro-batch)``: one action of the model.
_Key = tuple[int, Op, int]


def _scaled(t: Time, scale: int) -> int:
    """``t * scale``, which the common denominator makes whole."""
    value = Fraction(t) * scale
    assert value.denominator == 1
    return value.numerator


@dataclass(frozen=True, slots=True, kw_only=True)
class _ScaledTimes:
    """The problem's times (:func:`_times`) as the solver's integers: each multiplied by
    ``scale``, the common denominator, exactly."""

    scale: int
    durations: dict[tuple[int, Op], int]
    delays_f: list[int]
    delays_i: list[int]
    optimizer: list[int]
    """Per rank its optimizer step (its stages' ``optimizer`` times summed)."""
    sync_time: int

    @classmethod
    def of(cls, problem: Problem) -> _ScaledTimes:
        durations, delays_f, delays_i = _times(problem)
        optimizer: list[Time] = [0] * problem.n_ranks
        for stage, rank in enumerate(problem.placement):
            optimizer[rank] += problem.costs.stage(stage).optimizer
        sync_time = problem.costs.sync_time
        every = (*durations.values(), *delays_f, *delays_i, *optimizer, sync_time)
        scale = math.lcm(*(Fraction(t).denominator for t in every))
        return cls(
            scale=scale,
            durations={key: _scaled(d, scale) for key, d in durations.items()},
            delays_f=[_scaled(t, scale) for t in delays_f],
            delays_i=[_scaled(t, scale) for t in delays_i],
            optimizer=[_scaled(t, scale) for t in optimizer],
            sync_time=_scaled(sync_time, scale),
        )

    def to_int(self, t: Time) -> int:
        return _scaled(t, self.scale)

    def to_time(self, value: int) -> Time:
        return whole_or_fraction(Fraction(value, self.scale))

    def serial_total(self, problem: Problem) -> int:
        """Every action and message one after another, then every optimizer step and
        synchronization: no schedule needs a longer horizon, nor a longer period."""
        m = problem.n_microbatches
        work = sum(self.durations.values()) * m + sum((*self.delays_f, *self.delays_i)) * m
        return work + sum(self.optimizer) + self.sync_time * problem.n_ranks


@dataclass(frozen=True, slots=True, kw_only=True)
class _Model:
    """The CP-SAT model and the variables its answer is read from."""

    model: Any
    start: dict[_Key, Any]
    makespan: Any
    top: int
    """The horizon, scaled: every start and the makespan lie within ``[0, top]``."""
    times: _ScaledTimes
    objective: str = "step"
    period: Any = None
    """With the ``period`` objective: the period's variable, which is minimised."""


def _build_model(
    cp_model: Any,
    problem: Problem,
    times: _ScaledTimes,
    *,
    top: int,
    objective: str = "step",
    sync: str = DEFAULT_SYNC,
) -> _Model:
    """The module's model: intervals, data flow, memory, and the makespan (or the
    period) to minimise."""
    model = cp_model.CpModel()
    start, end = _intervals(model, problem, times, top=top)
    _data_flow(model, problem, times, start, end)
    _memory(model, problem, start, end)
    makespan = model.new_int_var(0, top, "makespan")
    model.add_max_equality(makespan, list(end.values()))
    period = None
    if objective == "period":
        period = _period(model, problem, times, start, end, top=top, sync=sync)
        model.minimize(period)
    else:
        model.minimize(makespan)
    return _Model(
        model=model,
        start=start,
        makespan=makespan,
        top=top,
        times=times,
        objective=objective,
        period=period,
    )


def _period(
    model: Any,
    problem: Problem,
    times: _ScaledTimes,
    start: dict[_Key, Any],
    end: dict[_Key, Any],
    *,
    top: int,
    sync: str,
) -> Any:
    """The period ``P``: at least every rank's release (its optimizer step's end under
    ``sync``, the rules of :mod:`pipesim.iterations`) minus its first
    start. In micro-batch order a rank's first action is the F of micro-batch 0 on one
    of its stages and its last the W of the last micro-batch on one of them."""
    last_k = problem.n_microbatches - 1
    model.add(start[0, Op.F, 0] == 0)  # every action follows it: fix the time origin
    first, last = [], []
    for rank in range(problem.n_ranks):
        stages = problem.stages_of(rank)
        first.append(model.new_int_var(0, top, f"first{rank}"))
        model.add_min_equality(first[-1], [start[s, Op.F, 0] for s in stages])
        last.append(model.new_int_var(0, top, f"last{rank}"))
        model.add_max_equality(last[-1], [end[s, Op.W, last_k] for s in stages])
    ready: list[Any] = []
    if sync == "none":
        ready = last
    elif sync == "global":
        every = model.new_int_var(0, top, "all_done")
        model.add_max_equality(every, last)
        ready = [every + times.sync_time] * problem.n_ranks
    else:  # post-validation: the partial reduction passes rank to rank
        for rank, done in enumerate(last):
            if not ready:
                ready.append(done)
                continue
            here = model.new_int_var(0, 2 * top, f"ready{rank}")
            model.add_max_equality(here, [done, ready[-1] + times.sync_time])
            ready.append(here)
    period = model.new_int_var(0, 2 * top, "period")
    for rank in range(problem.n_ranks):
        model.add(period >= ready[rank] + times.optimizer[rank] - first[rank])
    return period


def _add_hint(built: _Model, problem: Problem, hint: Schedule) -> None:
    """Start the search from ``hint``'s engine times (as early as its orders allow)."""
    from pipesim.engine import simulate

    trace = simulate(hint, costs=problem.costs, check=False).trace
    origin = min(record.start for record in trace.actions)
    for record in trace.actions:
        work = record.work
        if isinstance(work, Action) and (work.stage, work.op, work.microbatch) in built.start:
            value = built.times.to_int(record.start - origin)
            built.model.add_hint(built.start[work.stage, work.op, work.microbatch], value)


def _intervals(
    model: Any, problem: Problem, times: _ScaledTimes, *, top: int
) -> tuple[dict[_Key, Any], dict[_Key, Any]]:
    """One interval per action on its stage's rank, none overlapping on a rank; the
    starts and ends by action."""
    start: dict[_Key, Any] = {}
    end: dict[_Key, Any] = {}
    per_rank: list[list[Any]] = [[] for _ in range(problem.n_ranks)]
    for s in range(problem.n_stages):
        for op in _OPS:
            d = times.durations[s, op]
            for k in range(problem.n_microbatches):
                key = (s, op, k)
                start[key] = model.new_int_var(0, top, f"s{s}{op.value}{k}")
                end[key] = start[key] + d
                per_rank[problem.placement[s]].append(
                    model.new_fixed_size_interval_var(start[key], d, f"i{s}{op.value}{k}")
                )
    for intervals in per_rank:
        model.add_no_overlap(intervals)
    return start, end


def _data_flow(
    model: Any,
    problem: Problem,
    times: _ScaledTimes,
    start: dict[_Key, Any],
    end: dict[_Key, Any],
) -> None:
    """F after the previous stage's F and its message, I after F and the next stage's I
    and its message, W after I; each stage runs each op in micro-batch order (symmetry,
    the module docstring)."""
    n_stages, m = problem.n_stages, problem.n_microbatches
    for s in range(n_stages):
        for k in range(m):
            if s > 0:
                model.add(start[s, Op.F, k] >= end[s - 1, Op.F, k] + times.delays_f[s - 1])
            model.add(start[s, Op.I, k] >= end[s, Op.F, k])
            if s + 1 < n_stages:
                model.add(start[s, Op.I, k] >= end[s + 1, Op.I, k] + times.delays_i[s])
            model.add(start[s, Op.W, k] >= end[s, Op.I, k])
    for s in range(n_stages):
        for op in _OPS:
            for k in range(1, m):
                model.add(start[s, op, k] >= end[s, op, k - 1])


def _solution(
    cp_model: Any, problem: Problem, built: _Model, solver: Any, status: Any, *, wall_s: float
) -> ExactSolution:
    """What the solver's run found: the orders of its best solution, if any, and the bound."""
    times = built.times
    name = solver.status_name(status)
    bound = times.to_time(math.ceil(solver.best_objective_bound - 1e-9))
    if status not in (cp_model.OPTIMAL, cp_model.FEASIBLE):
        # Infeasible within the horizon: nothing beats the horizon itself.
        infeasible = status == cp_model.INFEASIBLE and built.objective == "step"
        floor = times.to_time(built.top) if infeasible else 0
        return ExactSolution(
            schedule=None,
            makespan=None,
            bound=max(bound, floor),
            optimal=False,
            status=name,
            wall_s=wall_s,
            objective=built.objective,
        )
    values = {key: solver.value(var) for key, var in built.start.items()}
    schedule = _orders(problem, values, times.durations)
    makespan = times.to_time(solver.value(built.makespan))
    period = None if built.period is None else times.to_time(solver.value(built.period))
    objective = makespan if period is None else period
    return ExactSolution(
        schedule=schedule,
        makespan=makespan,
        bound=objective if status == cp_model.OPTIMAL else bound,
        optimal=status == cp_model.OPTIMAL,
        status=name,
        wall_s=wall_s,
        objective=built.objective,
        period=period,
    )


def _times(problem: Problem) -> tuple[dict[tuple[int, Op], Time], list[Time], list[Time]]:
    """Durations per (stage, op); message delays F: s -> s+1 and I: s+1 -> s."""
    costs, place = problem.costs, problem.placement
    table = durations_of(problem)  # overheads included, as the engine takes them
    durations: dict[tuple[int, Op], Time] = {}
    for s in range(problem.n_stages):
        for op in _OPS:
            durations[s, op] = table[action_code(s, op)]
    delays_f: list[Time] = []
    delays_i: list[Time] = []
    for s in range(problem.n_stages - 1):
        same = place[s] == place[s + 1]
        f_msg = message_bytes(costs, Action(stage=s, op=Op.F, microbatch=0))
        i_msg = message_bytes(costs, Action(stage=s + 1, op=Op.I, microbatch=0))
        delays_f.append(0 if same else costs.link.transfer_time(f_msg))
        delays_i.append(0 if same else costs.link.transfer_time(i_msg))
    return durations, delays_f, delays_i


def _memory(model: Any, problem: Problem, start: dict[Any, Any], end: dict[Any, Any]) -> None:
    """Each rank's activation bytes as a reservoir within its limit (pipesim.step.memory)."""
    mem = problem.memory_costs
    for rank in range(problem.n_ranks):
        times, changes = [], []
        for s in problem.stages_of(rank):
            f, _, i, w = op_effects(mem.stage(s), forward_only=False)
            for k in range(problem.n_microbatches):
                times += [start[s, Op.F, k], start[s, Op.I, k], end[s, Op.I, k], end[s, Op.W, k]]
                changes += [f.start_bytes, i.start_bytes, i.end_bytes, w.end_bytes]
        model.add_reservoir_constraint(times, changes, 0, problem.limit_bytes[rank])


def _orders(
    problem: Problem, starts: dict[tuple[int, Op, int], int], durations: dict[tuple[int, Op], int]
) -> Schedule | None:
    """Per-rank orders by start time; at one instant a zero-length action first (it
    ends there, and the solver's reservoir counts its free before the next start), then
    F, I, W as the data flows."""
    rank_of = problem.placement
    orders: list[list[tuple[int, int, int, int, int, Action]]] = [
        [] for _ in range(problem.n_ranks)
    ]
    op_index = {Op.F: 0, Op.I: 1, Op.W: 2}
    for (s, op, k), t in starts.items():
        tie = s if op is Op.F else -s
        action = Action(stage=s, op=op, microbatch=k)
        orders[rank_of[s]].append((t, t + durations[s, op], op_index[op], tie, k, action))
    schedule = Schedule.from_orders(
        [[entry[-1] for entry in sorted(order)] for order in orders],
        placement=rank_of,
        n_microbatches=problem.n_microbatches,
        name="exact",
    )
    try:
        validate(schedule)
    except PipesimError:  # zero-length actions tied in a way the orders cannot say
        return None
    return schedule
