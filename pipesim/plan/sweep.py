"""Evaluating sweep points: one configuration -> step time and memory, on all cores.

A point is ``(schedule, pipeline degree p, virtual v, micro-batch size b,
micro-batches m, data parallel d)``. Evaluating it generates the schedule from
the registry (a :class:`~pipesim.errors.ScheduleError` is the point's
infeasibility reason), cuts the workload into the schedule's stages
(:mod:`pipesim.plan.partition`), builds an exact cost model in integer
nanoseconds, and simulates one step with the fast evaluator
(:mod:`pipesim.plan.fastsim`, identical to the SimPy engine, which
``engine="simpy"`` uses instead).

Hardware model (documented assumptions):

- Devices are ordered as Megatron-LM orders its groups (data parallel inside,
  pipeline outside: ``megatron/core/parallel_state.py``, order "tp-dp-pp"):
  a data-parallel group fits in a node when d divides the GPUs per node g, so
  consecutive pipeline ranks share a node g / d at a time (one per node when d
  does not divide g). A hop between two ranks of one node takes the intra-node
  link, a hop between nodes the inter-node link (links per rank pair,
  :class:`pipesim.costs.Links`); a job inside one node uses the intra-node link.
- After the pipeline drains, gradients are all-reduced across the d replicas
  with a ring: ``2 (d-1)/d * bytes / bandwidth + 2 (d-1) * latency`` (Patarasuk
  and Yuan, "Bandwidth optimal all-reduce algorithms for clusters of
  workstations", JPDC 2009), not overlapped with the pipeline.

Workers: a process pool (fork from a single-threaded process,
else forkserver) evaluates chunks
of points; every wait has a deadline, so a sweep never hangs, and one worker
evaluates in this process.
"""

from __future__ import annotations

import math
import multiprocessing
import os
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor, as_completed
from concurrent.futures import TimeoutError as FuturesTimeout
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

from pipesim.costs import CostModel, Link, Links, StageCost
from pipesim.engine import simulate
from pipesim.errors import PipesimError, PlanError, ScheduleError
from pipesim.metrics import Metrics
from pipesim.plan.cost_aware import get_cost_aware
from pipesim.plan.fastsim import compile_schedule, evaluate, metrics_of
from pipesim.plan.hardware import Accelerator, Interconnect
from pipesim.plan.onepass import quick_step
from pipesim.plan.partition import partition
from pipesim.plan.workload import Workload
from pipesim.schedule import Schedule
from pipesim.schedules import generate

__all__ = [
    "Evaluation",
    "Point",
    "SweepContext",
    "build_configuration",
    "evaluate_point",
    "evaluate_points",
]

_NS_PER_S = 10**9


@dataclass(frozen=True, slots=True, kw_only=True)
class Point:
    """One configuration of the sweep."""

    schedule: str
    pipeline: int
    """Pipeline degree p: ranks per pipeline."""
    virtual: int
    """Stages per rank asked of the schedule."""
    microbatch_size: int
    n_microbatches: int
    data_parallel: int


@dataclass(frozen=True, slots=True, kw_only=True)
class SweepContext:
    """Everything a worker needs besides the points."""

    workload: Workload
    accelerator: Accelerator
    devices: int
    bytes_per_param: int = 16
    memory_capacity_bytes: int
    engine: str = "fast"
    """``fast`` (pipesim.plan.fastsim) or ``simpy`` (the reference engine)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Evaluation:
    """A point's outcome: ``reason`` set when infeasible, else the numbers."""

    reason: str | None = None
    n_stages: int = 0
    layers_per_stage: tuple[int, ...] = ()
    """Per stage of one model copy."""
    makespan_ns: int = 0
    """Pipeline time of one step."""
    allreduce_ns: int = 0
    """Data-parallel gradient all-reduce after the pipeline."""
    bubble: Fraction = Fraction(0)
    """Idle share of ranks x pipeline time (Metrics.bubble_ratio)."""
    peak_memory_bytes: int = 0
    """Largest over ranks of static (params + grads + optimizer) + peak activations."""
    static_bytes: int = 0
    """Static memory of the rank with the peak."""
    activation_bytes: int = 0
    """Peak activations of the rank with the peak."""


# -- per-process caches (a worker keeps them for its lifetime) ---------------------------
_CONTEXT: SweepContext | None = None
_SCHEDULES: dict[tuple[str, int, int, int], Schedule | str] = {}
_PARTITIONS: dict[int, tuple[int, ...]] = {}
_COSTS: dict[tuple[int, int, int, int | None], tuple[CostModel, list[int], list[int]]] = {}
_MAX_SCHEDULES = 64
_LAST_COST_AWARE: list[Schedule] = []  # the last schedule built from the costs


def _install(context: SweepContext) -> None:
    global _CONTEXT
    _CONTEXT = context
    _SCHEDULES.clear()
    _PARTITIONS.clear()
    _COSTS.clear()


def _schedule(point: Point) -> Schedule | str:
    key = (point.schedule, point.pipeline, point.n_microbatches, point.virtual)
    found = _SCHEDULES.get(key)
    if found is None:
        try:
            found = generate(
                point.schedule,
                n_ranks=point.pipeline,
                n_microbatches=point.n_microbatches,
                virtual=point.virtual,
            )
        except ScheduleError as exc:
            found = f"schedule rule: {exc}"
        if len(_SCHEDULES) >= _MAX_SCHEDULES:
            _SCHEDULES.pop(next(iter(_SCHEDULES)))
        _SCHEDULES[key] = found
    return found


def _stage_costs(
    context: SweepContext,
    sizes: tuple[int, ...],
    microbatch_size: int,
    ranks_per_node: int | None,
    n_copies: int,
) -> tuple[CostModel, list[int], list[int]]:
    """Cost model of the stages (integer ns), static bytes and parameters per stage;
    ``n_copies`` copies of the model's stages one after the other; pipeline ranks
    ``ranks_per_node`` to a node (None: the whole job in one node)."""
    key = (len(sizes), microbatch_size, n_copies, ranks_per_node)
    found = _COSTS.get(key)
    if found is not None:
        return found
    workload, accelerator = context.workload, context.accelerator
    b = microbatch_size
    if workload.in_flops:
        ns_per_work = Fraction(_NS_PER_S) / (
            Fraction(repr(accelerator.peak_flops)) * Fraction(repr(accelerator.efficiency))
        )
    else:
        ns_per_work = Fraction(_NS_PER_S)
    message_bytes = math.ceil(workload.message_bytes * b)
    stages = []
    static: list[int] = []
    params: list[int] = []
    start = 0
    for size in sizes:
        layers = workload.layers[start : start + size]
        start += size

        def ns(field: str, layers: Sequence[Any] = layers) -> int:
            return round(
                sum((getattr(x, field) for x in layers), start=Fraction(0)) * b * ns_per_work
            )

        stage_params = sum(x.params for x in layers)
        act = math.ceil(sum((x.activation_bytes for x in layers), start=Fraction(0)) * b)
        kept = math.ceil(sum((x.weight_grad_bytes for x in layers), start=Fraction(0)) * b)
        stages.append(
            StageCost(
                forward=ns("forward"),
                backward=ns("backward"),
                input_grad=ns("input_grad"),
                weight_grad=ns("weight_grad"),
                activation_bytes=act,
                weight_grad_bytes=min(kept, act),
                output_bytes=message_bytes,
                param_bytes=stage_params * context.bytes_per_param,
            )
        )
        static.append(stage_params * context.bytes_per_param)
        params.append(stage_params)
    intra = _link(accelerator.link(inter_node=False), message_bytes)
    links = None
    if ranks_per_node is not None:
        inter = _link(accelerator.link(inter_node=True), message_bytes)
        links = Links(ranks_per_node=ranks_per_node, intra_node=intra, inter_node=inter)
    costs = CostModel(
        stages=tuple(stages) * n_copies,
        link=intra,
        links=links,
        memory_capacity_bytes=context.memory_capacity_bytes,
    )
    static, params = static * n_copies, params * n_copies
    found = (costs, static, params)
    _COSTS[key] = found
    return found


def _link(path: Interconnect, message_bytes: int) -> Link:
    """``path`` in integer nanoseconds for messages of ``message_bytes``: the latency and
    the occupancy are rounded to whole nanoseconds so that every time stays an integer."""
    latency = round(Fraction(repr(path.latency_s)) * _NS_PER_S)
    occupancy = round(
        Fraction(message_bytes) * _NS_PER_S / Fraction(repr(path.bandwidth_bytes_per_s))
    )
    return Link(
        latency=latency,
        bandwidth_bytes_per_s=Fraction(message_bytes, occupancy) if occupancy else None,
    )


def _pipeline_ranks_per_node(context: SweepContext, data_parallel: int) -> int | None:
    """Pipeline ranks per node, devices ordered tp-dp-pp; None when the job fits one node."""
    g = context.accelerator.gpus_per_node
    if context.devices <= g:
        return None
    return g // data_parallel if g % data_parallel == 0 else 1


def _allreduce_ns(context: SweepContext, data_parallel: int, params: int) -> int:
    """Ring all-reduce of one rank's gradients over the data-parallel group."""
    d = data_parallel
    if d == 1 or params == 0:
        return 0
    g = context.accelerator.gpus_per_node
    path = context.accelerator.link(inter_node=not (d <= g and g % d == 0))
    n_bytes = params * context.workload.grad_bytes_per_param
    seconds = Fraction(2 * (d - 1), d) * n_bytes / Fraction(repr(path.bandwidth_bytes_per_s))
    seconds += 2 * (d - 1) * Fraction(repr(path.latency_s))
    return round(seconds * _NS_PER_S)


def evaluate_point(context: SweepContext, point: Point, /) -> Evaluation:
    """Simulate one configuration (see the module docstring for the model)."""
    if _CONTEXT is not context:
        _install(context)
    cost_aware = get_cost_aware(point.schedule)  # built after the costs (synthesized)
    schedule = _schedule(point) if cost_aware is None else None
    if isinstance(schedule, str):
        return Evaluation(reason=schedule)
    n_stages = point.pipeline * point.virtual if schedule is None else schedule.n_stages
    n_copies = 1 if schedule is None else schedule.n_copies
    # DualPipe keeps n_copies copies of the model: each copy is the whole model.
    per_copy = n_stages // n_copies
    n_layers = len(context.workload.layers)
    if per_copy > n_layers:
        return Evaluation(
            reason=f"{per_copy} stages but the model has only {n_layers} layers (embedding "
            "and head included); use fewer stages or less virtual pipelining"
        )
    sizes = _PARTITIONS.get(per_copy)
    if sizes is None:
        work = [layer.work for layer in context.workload.layers]
        sizes = _PARTITIONS[per_copy] = partition(work, n_stages=per_copy)
    ranks_per_node = _pipeline_ranks_per_node(context, point.data_parallel)
    costs, static, params = _stage_costs(
        context, sizes, point.microbatch_size, ranks_per_node, n_copies
    )
    if schedule is None:
        assert cost_aware is not None
        # Activations may use what weights, gradients and optimizer state leave (looped).
        most_static = max(sum(static[point.pipeline * c + r] for c in range(point.virtual))
                          for r in range(point.pipeline))  # fmt: skip
        if most_static >= context.memory_capacity_bytes:
            return Evaluation(
                reason=f"weights, gradients and optimizer state ({most_static:,} bytes) leave "
                f"no memory for activations on a {context.memory_capacity_bytes:,}-byte device"
            )
        try:
            schedule = cost_aware.build()(
                n_ranks=point.pipeline,
                n_microbatches=point.n_microbatches,
                virtual=point.virtual,
                costs=costs,
                memory_limit_bytes=context.memory_capacity_bytes - most_static,
            )
        except PipesimError as exc:
            return Evaluation(reason=f"refused: {exc}")
        _LAST_COST_AWARE[:] = [schedule]
    metrics: Metrics
    if context.engine == "simpy":
        metrics = simulate(schedule, costs=costs, check=False).metrics
    else:
        step = quick_step(schedule, costs)
        if step is None:  # overlapped works (DualPipe): the compiled path
            step = evaluate(compile_schedule(schedule), costs)
        metrics = metrics_of(schedule, costs, step)
    rank_static = [0] * schedule.n_ranks
    rank_params = [0] * schedule.n_ranks
    for stage, rank in enumerate(schedule.placement):
        rank_static[rank] += static[stage]
        rank_params[rank] += params[stage]
    peak, peak_rank = max(
        (rank_static[r.rank] + r.peak_activation_bytes, -r.rank) for r in metrics.ranks
    )
    peak_rank = -peak_rank
    makespan = metrics.makespan
    assert isinstance(makespan, int)  # integer nanoseconds in, integer out
    return Evaluation(
        n_stages=n_stages,
        layers_per_stage=sizes,
        makespan_ns=makespan,
        allreduce_ns=_allreduce_ns(context, point.data_parallel, max(rank_params)),
        bubble=metrics.bubble_ratio,
        peak_memory_bytes=peak,
        static_bytes=rank_static[peak_rank],
        activation_bytes=metrics.ranks[peak_rank].peak_activation_bytes,
    )


def build_configuration(context: SweepContext, point: Point, /) -> tuple[Schedule, CostModel]:
    """The schedule and cost model (integer nanoseconds) that ``point`` is simulated with,
    e.g. to simulate it with the SimPy engine or plot it; ScheduleError if refused."""
    if get_cost_aware(point.schedule) is not None:  # made from the costs: evaluate builds it
        _install(context)
        evaluated = evaluate_point(context, point)
        if evaluated.reason is not None:
            raise ScheduleError(evaluated.reason)
        schedule = _LAST_COST_AWARE[0]
    else:
        schedule = generate(
            point.schedule,
            n_ranks=point.pipeline,
            n_microbatches=point.n_microbatches,
            virtual=point.virtual,
        )
    per_copy = schedule.n_stages // schedule.n_copies
    work = [layer.work for layer in context.workload.layers]
    sizes = partition(work, n_stages=per_copy)
    _install(context)  # fresh caches for this context
    ranks_per_node = _pipeline_ranks_per_node(context, point.data_parallel)
    costs, _, _ = _stage_costs(
        context, sizes, point.microbatch_size, ranks_per_node, schedule.n_copies
    )
    return schedule, costs


def _evaluate_chunk(
    chunk: list[tuple[int, Point]], context: SweepContext | None = None
) -> list[tuple[int, Evaluation]]:
    ctx = context if context is not None else _CONTEXT
    assert ctx is not None, "worker started without a sweep context"
    out = []
    for index, point in chunk:
        try:
            out.append((index, evaluate_point(ctx, point)))
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
) -> list[Evaluation]:
    """Evaluate ``points`` (in order) on ``workers`` processes (default: every core).

    ``progress(done, total)`` is called as results come in. A sweep that is not
    done after ``timeout_s`` seconds stops its workers and raises PlanError.

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
    if workers is None:
        workers = os.cpu_count() or 1
    if isinstance(workers, bool) or not isinstance(workers, int) or workers < 1:
        raise PlanError(f"workers must be a whole number >= 1, got {workers!r}")
    if timeout_s <= 0:
        raise PlanError(f"timeout must be positive, got {timeout_s!r} seconds")
    deadline = time.monotonic() + timeout_s
    # Costliest first, so that the last chunks to finish are short ones.
    indexed = sorted(enumerate(points), key=lambda item: -_cost_estimate(item[1]))
    results: list[Evaluation | None] = [None] * total
    done = 0
    workers = min(workers, max(1, total // 8))
    if workers == 1:
        for item in indexed:
            if time.monotonic() > deadline:
                raise _timed_out(timeout_s, done, total)
            for index, evaluation in _evaluate_chunk([item], context):
                results[index] = evaluation
            done += 1
            if progress is not None:
                progress(done, total)
    else:
        chunk_size = max(1, min(64, total // (workers * 16)))
        chunks = [indexed[k : k + chunk_size] for k in range(0, total, chunk_size)]
        # concurrent.futures, not multiprocessing.Pool: when a worker dies (killed, out of
        # memory) the executor fails every pending future at once, where a Pool would
        # silently wait for the lost chunk until the deadline.
        executor = ProcessPoolExecutor(
            max_workers=workers,
            mp_context=multiprocessing.get_context(_start_method()),
            initializer=_install,
            initargs=(context,),
        )
        try:
            futures = [executor.submit(_evaluate_chunk, chunk) for chunk in chunks]
            try:
                for future in as_completed(futures, timeout=max(deadline - time.monotonic(), 0)):
                    chunk_results = future.result()
                    for index, evaluation in chunk_results:
                        results[index] = evaluation
                    done += len(chunk_results)
                    if progress is not None:
                        progress(done, total)
            except FuturesTimeout:
                raise _timed_out(timeout_s, done, total) from None
            except BrokenProcessPool:
                raise PlanError(
                    f"a sweep worker process died (killed, or out of memory?) after {done} of "
                    f"{total} configurations; rerun with --workers 1 to evaluate in this "
                    "process and see the cause"
                ) from None
        finally:
            executor.shutdown(wait=False, cancel_futures=True)
    assert all(r is not None for r in results)
    return [r for r in results if r is not None]


def _start_method() -> str:
    """``fork`` (workers start at once) from a single-threaded process; otherwise
    (a Jupyter kernel runs threads, and forking them can deadlock a child)
    ``forkserver``, or ``spawn`` where neither exists."""
    methods = multiprocessing.get_all_start_methods()
    if "fork" in methods and threading.active_count() == 1:
        return "fork"
    return "forkserver" if "forkserver" in methods else "spawn"


def _timed_out(timeout_s: float, done: int, total: int) -> PlanError:
    return PlanError(
        f"the sweep did not finish within {timeout_s:g} s ({done} of {total} configurations "
        "done); narrow it (--stages, --microbatch-sizes, --virtual, --schedules) or raise "
        "--timeout"
    )
