"""Exact lower bounds on a sweep point's step time and peak memory, without simulating it.

The planner's branch and bound (:mod:`pipesim.plan.prune`) skips a configuration only
when a bound proves it cannot appear in what the plan prints. The bounds here hold
for every complete schedule of simple or overlapped actions under the planner's
cost model (``docs/planner-speed.md`` has the proof):

- **Work.** A rank runs its work one unit at a time, so from the start of its first
  unit to the end of its last it spends at least its total duration: each of its
  stages runs F and B (or I and W) once per micro-batch of its model copy. Durations
  are read from :func:`pipesim.step.cost_tables.cost_tables` (overheads included), and an
  overlapped pair lasts the sum of its parts (less one dispatch per extra part) when
  the stages give no ``overlap`` time, as :meth:`pipesim.costs.CostModel.duration`
  prices it.
- **Fill and drain.** A rank's first unit cannot start before the chain of work one
  micro-batch needs before it (the forwards of the stages before it), and after its
  last unit the chain that depends on it still runs (the rest of that micro-batch's
  backward). The chains follow :func:`pipesim.step.dependencies.prerequisites`; sends only
  ever add time, so links are left out.
- **Memory.** Static memory (weights, gradients, optimizer state, sharded as the
  sweep shards it, routed experts over their own group) and the
  recomputation transient are the sweep's own numbers; activations held never go
  below zero, so a rank's peak is at least what any one of its units holds.

What a family's schedule looks like at pipeline degree p and v stages per rank
(placement, which ops each rank runs, how many per micro-batch) is read once from a
small instance of the same family (:func:`shape`); that it does not change with the
micro-batch count is checked for every family by ``tests/test_plan_bounds.py``.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, replace
from fractions import Fraction
from itertools import accumulate

from pipesim.actions import OP_INDEX, Action, Op
from pipesim.errors import PipesimError
from pipesim.exact import Time
from pipesim.plan import evaluation, ranks, stage_costs
from pipesim.plan.cost_aware import get_cost_aware
from pipesim.plan.point import Point, SweepContext
from pipesim.schedules import generate
from pipesim.step.cost_tables import cost_tables
from pipesim.step.dependencies import prerequisites
from pipesim.step.memory import Effect, byte_peaks, stage_effects, work_effect

__all__ = ["Bound", "Shape", "bound", "shape"]

_Key = tuple[int, Op]


@dataclass(frozen=True, slots=True)
class Shape:
    """A family's schedule at (p, v), independent of the micro-batch count."""

    placement: tuple[int, ...]
    """Stage -> rank."""
    n_copies: int
    per_microbatch: tuple[tuple[tuple[_Key, Fraction], ...], ...]
    """Per rank: each (stage, F) and (stage, B) it runs and how many times per
    micro-batch, a (stage, B) standing for one gradient: a B, or an I and its W."""
    n_overlaps: tuple[Fraction, ...]
    """Per rank: overlapped units per micro-batch."""
    n_microbatches: int
    """The micro-batches of the instance read."""
    warmup: tuple[tuple[object, ...], ...]
    """Per rank: its order before its first backward unit (all of it when it has none),
    which every instance with at least ``n_microbatches`` begins with."""
    gradients: tuple[frozenset[Op], ...]
    """Per stage: how it computes gradients, B, I (then W) or some of each (DualPipe)."""


@dataclass(frozen=True, slots=True)
class Bound:
    """Lower bounds for one point: no schedule of its family can do better."""

    step_ns: Time
    """Pipeline time bound plus the exact time the iteration adds after it."""
    memory_bytes: int
    """Lower bound on the largest per-device memory (static + activations)."""


_SHAPES: dict[tuple[str, int, int, int], Shape | None] = {}


def shape(name: str, pipeline: int, virtual: int, n_microbatches: int) -> Shape | None:
    """The shape of ``name`` at ``pipeline`` x ``virtual``, read from the smallest
    instance the family accepts with p, 2p or 4p micro-batches (else with
    ``n_microbatches``); None when none is accepted or the family is made from the
    costs."""
    if get_cost_aware(name) is not None:
        return None
    key = (name, pipeline, virtual, 0)
    if key not in _SHAPES:
        _SHAPES[key] = _first_accepted(
            name, pipeline, virtual, (pipeline, 2 * pipeline, 4 * pipeline)
        )
    if _SHAPES[key] is not None:
        return _SHAPES[key]
    key = (name, pipeline, virtual, n_microbatches)
    if key not in _SHAPES:
        _SHAPES[key] = _first_accepted(name, pipeline, virtual, (n_microbatches,))
    return _SHAPES[key]


def _first_accepted(name: str, pipeline: int, virtual: int, tries: tuple[int, ...]) -> Shape | None:
    for m in tries:
        try:
            schedule = generate(name, n_ranks=pipeline, n_microbatches=m, virtual=virtual)
        except PipesimError:
            continue
        found = _shape_of(schedule)
        # keep the warm-up only where a larger instance begins with it too (the test
        # checks every family at many more micro-batch counts)
        for larger in (m + 1, m + 2, 2 * m):
            try:
                other = generate(name, n_ranks=pipeline, n_microbatches=larger, virtual=virtual)
            except PipesimError:
                continue
            if any(
                order[: len(w)] != w for order, w in zip(other.orders, found.warmup, strict=True)
            ):
                return replace(found, warmup=tuple(() for _ in found.warmup))
            return found
        return replace(found, warmup=tuple(() for _ in found.warmup))
    return None


def _shape_of(schedule: object) -> Shape:
    from pipesim.schedule import Schedule

    assert isinstance(schedule, Schedule)
    m = schedule.n_microbatches
    per_rank = []
    overlaps = []
    warmup = []
    variants: dict[int, set[Op]] = {}
    for order in schedule.orders:
        first_backward = next((k for k, work in enumerate(order) if _is_backward(work)), len(order))
        warmup.append(tuple(order[:first_backward]))
        runs: Counter[_Key] = Counter()
        n_over = 0
        for work in order:
            parts = (work,) if isinstance(work, Action) else work.parts
            if not isinstance(work, Action):
                n_over += 1
            for a in parts:
                variants.setdefault(a.stage, set()).add(a.op)
                if a.op is not Op.W:  # a gradient is a B, or an I (with its W)
                    runs[(a.stage, Op.F if a.op is Op.F else Op.B)] += 1
        per_rank.append(tuple((k, Fraction(n, m)) for k, n in sorted(runs.items(), key=_order_key)))
        overlaps.append(Fraction(n_over, m))
    return Shape(
        placement=schedule.placement,
        n_copies=schedule.n_copies,
        per_microbatch=tuple(per_rank),
        n_overlaps=tuple(overlaps),
        n_microbatches=m,
        warmup=tuple(warmup),
        gradients=tuple(
            frozenset(variants.get(s, set()) & {Op.B, Op.I}) for s in range(schedule.n_stages)
        ),
    )


def _is_backward(work: object) -> bool:
    parts = (work,) if isinstance(work, Action) else work.parts  # type: ignore[attr-defined]
    return any(a.op is not Op.F for a in parts)


def bound(context: SweepContext, point: Point, /) -> Bound | None:
    """Lower bounds on ``point``'s step time and memory; None where none is proven (a
    family made from the costs, one whose shape is unknown, a cost model that prices
    overlapped pairs on its own, too few layers)."""
    try:
        return _bound(context, point)
    except PipesimError:  # refused when simulated too, with the same reason: no bound
        return None


def _bound(context: SweepContext, point: Point) -> Bound | None:
    evaluation.use_context(context)
    found = shape(point.schedule, point.pipeline, point.virtual, point.n_microbatches)
    if found is None:
        return None
    n_stages = len(found.placement)
    workload = evaluation.point_workload(context, point)
    sizes = stage_costs.stage_sizes(context, workload, n_stages // found.n_copies)
    if isinstance(sizes, str):
        return None
    table = stage_costs.stage_table(
        context,
        workload,
        sizes,
        point.microbatch_size,
        stage_costs.pipeline_ranks_per_node(context, point),
        found.n_copies,
    )
    costs = table.costs
    if any(found.n_overlaps) and (
        costs.dispatch_overhead or any(s.overlap is not None for s in costs.stages)
    ):  # an overlapped pair may then take less than its parts
        return None
    tables = cost_tables(
        costs,
        n_stages=n_stages,
        forward_only=False,
        placement=found.placement,
        n_copies=found.n_copies,
    )
    makespan = _makespan_bound(found, tables.durations, point)
    per_stage = stage_effects(costs.for_stages(n_stages), n_stages=n_stages, forward_only=False)
    memory = _memory_bound(context, point, found, table, tables.effects, per_stage)
    return Bound(
        step_ns=makespan + _after_pipeline(context, point, found, table), memory_bytes=memory
    )


def _makespan_bound(found: Shape, durations: list[Time], point: Point) -> Time:
    """max over ranks of fill + work + drain (see the module docstring)."""
    present = {key for rank in found.per_microbatch for key, _ in rank}
    per_copy = len(found.placement) // found.n_copies
    work_of, chain_of = _gradient_durations(found, durations)
    before, after = _chains(present, chain_of, per_copy)
    m = point.n_microbatches
    best: Time = 0
    for runs in found.per_microbatch:
        if not runs:
            continue
        work = sum((work_of[key] * n for key, n in runs), start=Fraction(0))
        head = min(before[key] for key, _ in runs)
        # a W may be the rank's last unit, and no work waits for a W
        ends_with_w = any(Op.I in found.gradients[s] for (s, _op), _ in runs)
        tail = 0 if ends_with_w else min(after[key] for key, _ in runs)
        total = head + work * m + tail
        if total > best:
            best = total
    # durations are integers (ns) in the planner; a rank's busy time is a whole number
    return best if not isinstance(best, Fraction) or best.denominator != 1 else int(best)


def _gradient_durations(
    found: Shape, durations: list[Time]
) -> tuple[dict[_Key, Time], dict[_Key, Time]]:
    """Per (stage, F) and (stage, B): the least time one micro-batch's unit takes on its
    rank (a gradient: B, or I + W, whichever is shorter of those the stage runs) and the
    least it adds to a chain of one micro-batch (B or I: W ends no chain it must)."""
    work: dict[_Key, Time] = {}
    chain: dict[_Key, Time] = {}
    for s, ops in enumerate(found.gradients):
        work[(s, Op.F)] = chain[(s, Op.F)] = durations[4 * s]
        b, i, w = durations[4 * s + 1], durations[4 * s + 2], durations[4 * s + 3]
        costs = [b] * (Op.B in ops) + [i + w] * (Op.I in ops)
        links = [b] * (Op.B in ops) + [i] * (Op.I in ops)
        work[(s, Op.B)] = min(costs, default=0)
        chain[(s, Op.B)] = min(links, default=0)
    return work, chain


def _chains(
    present: set[_Key], dur: dict[_Key, Time], per_copy: int
) -> tuple[dict[_Key, Time], dict[_Key, Time]]:
    """Per (stage, op) of one micro-batch: the longest chain of work that must end before
    it starts, and the longest that can only start after it ends."""
    needs = {
        key: [
            p[:2] for p in prerequisites(key[0], key[1], 0, per_copy=per_copy) if p[:2] in present
        ]
        for key in present
    }
    before: dict[_Key, Time] = {}
    for key in sorted(present, key=_topological):
        before[key] = max((before[k] + dur[k] for k in needs[key]), default=0)
    users: dict[_Key, list[_Key]] = {key: [] for key in present}
    for key, reqs in needs.items():
        for k in reqs:
            users[k].append(key)
    after: dict[_Key, Time] = {}
    for key in sorted(present, key=_topological, reverse=True):
        after[key] = max((dur[u] + after[u] for u in users[key]), default=0)
    return before, after


def _topological(key: _Key) -> tuple[int, int]:
    """An order of one micro-batch's work in which every prerequisite comes first:
    forwards by stage, then gradients from the last stage down, W after its I."""
    stage, op = key
    if op is Op.F:
        return (0, stage)
    return (1, -2 * stage + (1 if op is Op.W else 0))


def _memory_bound(
    context: SweepContext,
    point: Point,
    found: Shape,
    table: stage_costs.StageTable,
    effects: list[Effect],
    per_stage: Sequence[tuple[Effect, ...]],
) -> int:
    """Largest over ranks of static + transient + the activations held at one moment:
    the end of the warm-up the rank's order begins with (when the point has at least
    the shape's micro-batches), else the most any one of its units holds."""
    best = 0
    late = point.n_microbatches >= found.n_microbatches
    warmups = _warmup_peaks(found.warmup, per_stage) if late else None
    rank_params, rank_experts, _ = ranks.placed_params(
        found.placement, table, n_ranks=len(found.per_microbatch)
    )
    for rank, runs in enumerate(found.per_microbatch):
        stages = [s for s, r in enumerate(found.placement) if r == rank]
        held = 0
        for (s, op), _ in runs:
            if op is Op.F:  # what one forward holds, at its start and at its end
                start_bytes, _c, end_bytes, _e = effects[4 * s]
                held = max(held, start_bytes, start_bytes + end_bytes)
        if warmups is not None:
            held = max(held, warmups[rank])
        # the sweep's own static figure: a mixture-of-experts model shards its routed
        # experts over the expert-data-parallel group, not the gradient group
        static = ranks.sharded_static_bytes(context, point, rank_params[rank], rank_experts[rank])
        transient = max((table.transient[s] for s in stages), default=0)
        best = max(best, static + transient + held)
    return best


def _warmup_peaks(
    warmups: Sequence[tuple[object, ...]], per_stage: Sequence[tuple[Effect, ...]]
) -> tuple[int, ...]:
    """Per rank, the most activation bytes held over its warm-up order, from nothing held
    (:func:`pipesim.step.memory.byte_peaks`)."""
    effects = [
        work_effect(per_stage, work)  # type: ignore[arg-type]
        for order in warmups
        for work in order
    ]
    ends = list(accumulate(map(len, warmups)))
    spans = [range(end - len(order), end) for order, end in zip(warmups, ends, strict=True)]
    return byte_peaks(effects, spans)


def _after_pipeline(
    context: SweepContext, point: Point, found: Shape, table: stage_costs.StageTable
) -> int:
    """The data-parallel traffic, tied-embedding sync and optimizer step after the pipeline,
    exactly as :func:`pipesim.plan.evaluation.evaluate_point` adds them (they read only the
    placement), a mixture-of-experts model's routed experts reduced and stepped over their
    own expert-data-parallel group as there."""
    rank_params, rank_experts, first = ranks.placed_params(
        found.placement, table, n_ranks=len(found.per_microbatch)
    )
    workload = evaluation.point_workload(context, point)
    after = ranks.rank_iterations(
        context, workload, point, found.placement, table.costs, rank_params, first, rank_experts
    )
    return max(x.dp_exposed_ns + x.optimizer_ns for x in after)


def _order_key(item: tuple[_Key, int]) -> tuple[int, int]:
    (stage, op), _ = item
    return (stage, OP_INDEX[op])
