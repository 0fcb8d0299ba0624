"""Long schedules priced from short ones of their family, exactly.

For the families in :data:`SPLICED_FAMILIES`, the order of a schedule of ``m``
micro-batches is the order of a shorter one of ``m0`` micro-batches (its **base**) with
whole periods inserted into its steady run: every rank's repeating run
(:class:`pipesim.plan.steady.Pattern`) is ``(m - m0) / q`` periods longer, the actions
after it are the same with their micro-batches ``m - m0`` higher, the placement is the
same (:func:`spliced_orders`). This is a property of each family's generator, not of
the evaluator: ``tests/test_plan_splice.py`` checks it against the real generator for
every ``p``, ``v`` and ``m`` within :data:`MAX_SPLICED_RANKS`,
:data:`MAX_SPLICED_VIRTUAL` and :data:`MAX_SPLICED_MICROBATCHES`, the only sizes this
module is used for.

With it, a long schedule need not be generated, nor evaluated. The one-pass evaluator
(:func:`pipesim.plan.onepass.quick_step_repeat`) runs an instance ``m1`` of the base's
class (``m0 <= m1 < m``, ``m1 = m0 + i q``) until its state at a cut repeats an earlier
one ``c`` periods before (:class:`pipesim.plan.steady.Repeat`: a rise ``delta`` of every
time, ``busy[r]`` of each rank's busy time). The instance ``m`` is ``m1`` with
``(m - m1) / q`` more periods in the same run, so its evaluation is the same up to that
cut, where it jumps ``(m - m1) / (c q)`` cycles further than ``m1``'s (when ``c q``
divides ``m - m1``) and then evaluates the same drain shifted: its makespan is ``m1``'s
plus ``(m - m1) / (c q)`` deltas, its busy times likewise, its peaks the same
(the jump's proof: docs/planner-speed.md, "Steady-state extrapolation").

The plan's twins (identical schedules listed once) need a digest of the orders that a
spliced schedule gets without its orders: :func:`order_form` describes the orders by
their run (prefix, first period, run length, suffix counted from the last
micro-batch), which splicing changes only in the run lengths.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import TypeVar

from pipesim.actions import Action, Overlap, Work, trusted_action
from pipesim.costs import CostModel
from pipesim.errors import ScheduleError
from pipesim.exact import Time
from pipesim.plan.fastsim import StepResult
from pipesim.plan.onepass import quick_step_repeat
from pipesim.plan.steady import Pattern, Repeat, find_pattern, work_keys
from pipesim.schedule import Schedule
from pipesim.schedules import generate

__all__ = [
    "MAX_SPLICED_MICROBATCHES",
    "MAX_SPLICED_RANKS",
    "MAX_SPLICED_VIRTUAL",
    "SPLICED_FAMILIES",
    "Instance",
    "base_instance",
    "extended",
    "extrapolated_step",
    "instance_form",
    "note_generated",
    "order_form",
    "spliced",
    "spliced_orders",
    "spliced_schedule",
    "works_of",
]

SPLICED_FAMILIES = frozenset(
    {"sequential", "1f1b", "zb-h1", "zb-h2", "zbv", "v-half", "v-min", "dualpipev"}
)
"""Families whose longer orders are their bases' with periods inserted (tested), and
which accept every micro-batch count from their bases' on (the interleaved families and
DualPipe refuse some, by rules that only their generators apply; DualPipe's second copy
also starts at the micro-batch count's half, so its prefix moves too)."""
MAX_SPLICED_RANKS = 16
MAX_SPLICED_VIRTUAL = 4
MAX_SPLICED_MICROBATCHES = 128
"""The sizes the splice property is tested for; larger schedules are generated."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Instance:
    """A generated schedule of simple actions with a repeating run."""

    schedule: Schedule
    keys: list[list[int]]
    """:func:`pipesim.plan.steady.work_keys` of ``schedule``."""
    pattern: Pattern


_INSTANCES: dict[tuple[str, int, int, int], Instance] = {}
_PRICED: dict[tuple[int, int], tuple[Instance, CostModel, StepResult | None, Repeat | None]] = {}
_MAX_CACHED = 1024


def spliced(name: str, n_ranks: int, virtual: int, n_microbatches: int, /) -> bool:
    """Whether this module prices the schedule (family and sizes within the tested ones)."""
    return (
        name in SPLICED_FAMILIES
        and n_ranks <= MAX_SPLICED_RANKS
        and virtual <= MAX_SPLICED_VIRTUAL
        and n_microbatches <= MAX_SPLICED_MICROBATCHES
    )


def _instance(name: str, n_ranks: int, virtual: int, n_microbatches: int) -> Instance | None:
    """The generated schedule, if the family accepts these sizes and it has a run (and no
    ``happens_before``, which splicing would have to shift too)."""
    key = (name, n_ranks, virtual, n_microbatches)
    found = _INSTANCES.get(key)
    if found is not None:
        return found
    try:
        schedule = generate(name, n_ranks=n_ranks, n_microbatches=n_microbatches, virtual=virtual)
    except ScheduleError:
        return None
    if schedule.happens_before:
        return None
    keys = work_keys(schedule)
    pattern = None if keys is None else find_pattern(schedule, keys=keys)
    if keys is None or pattern is None:
        return None
    found = Instance(schedule=schedule, keys=keys, pattern=pattern)
    if len(_INSTANCES) >= _MAX_CACHED:  # the oldest first: bases stay in their searches
        _INSTANCES.pop(next(iter(_INSTANCES)))
    _INSTANCES[key] = found
    return found


def base_instance(name: str, n_ranks: int, virtual: int, n_microbatches: int, /) -> Instance | None:
    """The base of the schedule of ``n_microbatches``: the generated instance of the
    fewest micro-batches ``m0 < n_microbatches`` with a run whose shift divides
    ``n_microbatches - m0``; None if there is none.

    >>> base = base_instance("1f1b", 4, 1, 100)
    >>> base.schedule.n_microbatches, base.pattern.shift  # the first with four periods
    (8, 1)
    """
    search = _SEARCHES.setdefault((name, n_ranks, virtual), _Search())
    for found in search.found:
        m0 = found.schedule.n_microbatches
        if m0 < n_microbatches and (n_microbatches - m0) % found.pattern.shift == 0:
            return found
    while search.searched + 1 < n_microbatches:
        search.searched += 1
        generated = _instance(name, n_ranks, virtual, search.searched)
        if generated is not None:
            search.found.append(generated)
            if (n_microbatches - search.searched) % generated.pattern.shift == 0:
                return generated
    return None


def note_generated(
    name: str,
    n_ranks: int,
    virtual: int,
    n_microbatches: int,
    found: tuple[Schedule, list[list[int]] | None, Pattern | None] | None,
    /,
) -> None:
    """Tell :func:`base_instance` of a schedule its caller generated (``found``: it, its
    keys and its run; None: refused), so that a sweep over the micro-batch counts does
    not generate the short ones twice."""
    if not spliced(name, n_ranks, virtual, n_microbatches):
        return
    search = _SEARCHES.setdefault((name, n_ranks, virtual), _Search())
    if n_microbatches != search.searched + 1:
        return
    search.searched = n_microbatches
    if found is None:
        return
    schedule, keys, pattern = found
    if keys is not None and pattern is not None and not schedule.happens_before:
        instance = Instance(schedule=schedule, keys=keys, pattern=pattern)
        search.found.append(instance)
        _INSTANCES[(name, n_ranks, virtual, n_microbatches)] = instance


@dataclass(slots=True)
class _Search:
    """How far :func:`base_instance` has looked for one family and size, what it found."""

    searched: int = 0
    """Micro-batch counts 1..searched are generated."""
    found: list[Instance] = field(default_factory=list)
    """The instances among them with a run, fewest micro-batches first."""


_SEARCHES: dict[tuple[str, int, int], _Search] = {}


def extended(pattern: Pattern, periods: int, /) -> Pattern:
    """``pattern`` with every rank's run ``periods`` periods longer."""
    return replace(
        pattern,
        ends=tuple(e + periods * n for e, n in zip(pattern.ends, pattern.lengths, strict=True)),
    )


W = TypeVar("W")
"""A unit of work of an order being spliced (:data:`Parts` or a :class:`Work`)."""

Parts = tuple[tuple[int, int], ...]
"""A work as its parts' ``(action code, micro-batch)`` pairs (an action: one)."""


def works_of(keys: list[list[int]], width: int, n_stages: int, /) -> list[list[Parts]]:
    """Each rank's order of :func:`pipesim.plan.steady.work_keys` ints (stride ``width``)
    as :data:`Parts`.

    >>> from pipesim.schedules import generate
    >>> s = generate("dualpipev", n_ranks=1, n_microbatches=4)
    >>> works_of(work_keys(s), 4, 2)[0][4]  # (1F1;0B0): stage 1's F, stage 0's B
    ((4, 1), (1, 0))
    """
    span = 4 * n_stages * width
    orders = []
    for order in keys:
        works: list[Parts] = []
        for key in order:
            if key >= 0:
                works.append((divmod(key, width),))
            else:
                first, second = divmod(-key - 1, span)
                works.append((divmod(first, width), divmod(second, width)))
        orders.append(works)
    return orders


def _later_by(work: Parts, microbatches: int) -> Parts:
    return tuple((code, mb + microbatches) for code, mb in work)


def spliced_orders(
    keys: list[list[int]], width: int, n_stages: int, pattern: Pattern, periods: int, /
) -> list[list[Parts]]:
    """Each rank's order of the schedule ``keys`` (:func:`pipesim.plan.steady.work_keys`
    at stride ``width``) with ``periods`` more periods in its run, as :data:`Parts`: up to
    the run's end as it was, then the run continued, then the rest with its micro-batches
    ``periods * shift`` higher.

    >>> from pipesim.schedules import generate
    >>> s = generate("1f1b", n_ranks=1, n_microbatches=5)
    >>> p = find_pattern(s)
    >>> [w for (w,) in spliced_orders(work_keys(s), 5, 1, p, 1)[0]]  # F0 B0 F1 B1 ... F5 B5
    [(0, 0), (1, 0), (0, 1), (1, 1), (0, 2), (1, 2), (0, 3), (1, 3), (0, 4), (1, 4), (0, 5), (1, 5)]
    """
    return _splice_orders(works_of(keys, width, n_stages), pattern, periods, _later_by)


def _splice_orders(
    orders: Sequence[Sequence[W]], pattern: Pattern, periods: int, later: Callable[[W, int], W]
) -> list[list[W]]:
    """The splice itself, for orders of any kind of work (``later(work, k)``: the work ``k``
    micro-batches on): per rank, the works up to the run's end as they were, then the run
    continued ``periods`` periods, then the rest ``periods * shift`` micro-batches on."""
    shift = pattern.shift
    longer_orders = []
    for works, end, length in zip(orders, pattern.ends, pattern.lengths, strict=True):
        longer = list(works[:end])
        for x in range(end, end + periods * length):
            longer.append(later(longer[x - length], shift))
        longer += [later(work, periods * shift) for work in works[end:]]
        longer_orders.append(longer)
    return longer_orders


def spliced_schedule(
    name: str, n_ranks: int, virtual: int, n_microbatches: int, /
) -> tuple[Schedule, Pattern] | None:
    """The schedule of ``n_microbatches`` and its run, built from its base (the orders of
    :func:`spliced_orders`, as works: the base's own up to its run's end, later ones
    shifted) instead of by the family's generator: what the generator gives, by the splice
    property (tested). For a schedule that must be evaluated whole (no shorter instance
    repeats), the generator's search (ZB-H2's, V-Half's) is the costly part. None when
    there is no base.

    >>> s, run = spliced_schedule("1f1b", 2, 1, 12)
    >>> s == generate("1f1b", n_ranks=2, n_microbatches=12) and run == find_pattern(s)
    True
    """
    base = base_instance(name, n_ranks, virtual, n_microbatches)
    if base is None:
        return None
    pattern, schedule = base.pattern, base.schedule
    periods = (n_microbatches - schedule.n_microbatches) // pattern.shift
    orders: list[list[Work]] = _splice_orders(schedule.orders, pattern, periods, _work_later)
    spliced = Schedule.from_orders(
        orders,
        placement=schedule.placement,
        n_microbatches=n_microbatches,
        name=schedule.name,
        n_copies=schedule.n_copies,
    )
    return spliced, extended(pattern, periods)


def _work_later(work: Work, microbatches: int) -> Work:
    if type(work) is Action:
        return trusted_action(work.stage, work.op, work.microbatch + microbatches)
    return Overlap(parts=tuple(_work_later(a, microbatches) for a in work.parts))  # type: ignore[misc]


def order_form(
    keys: list[list[int]], width: int, n_stages: int, pattern: Pattern, /, *, periods: int = 0
) -> tuple[object, ...]:
    """The orders ``keys`` (:func:`pipesim.plan.steady.work_keys` at stride ``width``, run
    ``pattern``) with ``periods`` more periods spliced in, described by their runs: per
    rank the works before the run, its first period, its length and the works after it
    (micro-batches counted down from the last), as :data:`Parts`; and the micro-batch
    count. Equal orders have equal forms (the run is a function of the orders), and the
    form gives the orders back, so it identifies them.

    >>> from pipesim.schedules import generate
    >>> short, long = (generate("1f1b", n_ranks=2, n_microbatches=m) for m in (8, 9))
    >>> def form(s, periods=0):
    ...     return order_form(work_keys(s), s.n_microbatches, 2, find_pattern(s), periods=periods)
    >>> form(short, 1) == form(long) != form(short)
    True
    """
    if periods:
        return _longer_form(order_form(keys, width, n_stages, pattern), pattern, periods)
    ranks = []
    for order, start, end, length in zip(
        keys, pattern.starts, pattern.ends, pattern.lengths, strict=True
    ):
        # only the ends of the order are read: the run is its first period repeated
        prefix, period, suffix = works_of(
            [order[:start], order[start : start + length], order[end + length :]],
            width,
            n_stages,
        )
        ranks.append(
            (
                tuple(prefix),
                tuple(period),
                end - start + periods * length,
                tuple(tuple((c, width - mb) for c, mb in w) for w in suffix),
            )
        )
    return (width + periods * pattern.shift, pattern.shift, tuple(ranks))


def _longer_form(form: tuple[object, ...], pattern: Pattern, periods: int) -> tuple[object, ...]:
    """``form`` (of no periods more) with ``periods`` more: only the run lengths and the
    micro-batch count change."""
    width, shift, ranks = form
    return (
        width + periods * shift,  # type: ignore[operator]
        shift,
        tuple(
            (prefix, period, run + periods * length, suffix)
            for (prefix, period, run, suffix), length in zip(
                ranks,  # type: ignore[call-overload]
                pattern.lengths,
                strict=True,
            )
        ),
    )


_FORMS: dict[int, tuple[Instance, tuple[object, ...]]] = {}


def instance_form(instance: Instance, periods: int, /) -> tuple[object, ...]:
    """:func:`order_form` of ``instance`` with ``periods`` more periods (its own form is
    found once)."""
    found = _FORMS.get(id(instance))
    if found is None or found[0] is not instance:
        schedule = instance.schedule
        form = order_form(
            instance.keys, schedule.n_microbatches, schedule.n_stages, instance.pattern
        )
        if len(_FORMS) >= _MAX_CACHED:
            _FORMS.pop(next(iter(_FORMS)))
        found = _FORMS[id(instance)] = (instance, form)
    return _longer_form(found[1], instance.pattern, periods)


def extrapolated_step(
    name: str, n_ranks: int, virtual: int, n_microbatches: int, costs: CostModel, /
) -> StepResult | None:
    """What :func:`pipesim.plan.onepass.quick_step` gives for the generated schedule of
    ``n_microbatches``, from a shorter instance of its base's class (see the module
    docstring); None when no instance tried repeats within its run (generate it then)."""
    base = base_instance(name, n_ranks, virtual, n_microbatches)
    if base is None:
        return None
    m0, shift = base.schedule.n_microbatches, base.pattern.shift
    for periods in _PROBES:
        m1 = m0 + periods * shift
        if m1 >= n_microbatches:
            return None
        found = _instance_priced(name, n_ranks, virtual, base, periods, costs)
        if found is None:
            return None
        result, repeat = found
        if repeat is None:
            continue
        # every longer instance repeats at the same cut, after as many periods: take the
        # one a whole number of cycles below n_microbatches
        cycle = repeat.periods * shift
        more = (n_microbatches - m1) % cycle // shift
        if more:
            found = _instance_priced(name, n_ranks, virtual, base, periods + more, costs)
            if found is None or found[1] is None or found[1].periods * shift != cycle:
                return None
            m1, (result, repeat) = m1 + more * shift, found
        assert result is not None and repeat is not None, "_instance_priced gives a result"
        return _later(result, repeat, (n_microbatches - m1) // cycle)
    return None


_PROBES = (0, 1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 96)
"""Periods past the base of the instances tried for a repeat, shortest first."""


def _instance_priced(
    name: str, n_ranks: int, virtual: int, base: Instance, periods: int, costs: CostModel
) -> tuple[StepResult | None, Repeat | None] | None:
    """The evaluation (and repeat) of the base's instance ``periods`` periods longer; None
    when it is not the base spliced or cannot finish."""
    m1 = base.schedule.n_microbatches + periods * base.pattern.shift
    instance = base if not periods else _instance(name, n_ranks, virtual, m1)
    # its run is the base's, longer: the cheap part of the splice property (the tests
    # check it whole)
    if instance is None or instance.pattern != extended(base.pattern, periods):
        return None
    result, repeat = _priced(instance, costs)
    return None if result is None else (result, repeat)


def _priced(instance: Instance, costs: CostModel) -> tuple[StepResult | None, Repeat | None]:
    key = (id(instance.schedule), id(costs))
    found = _PRICED.get(key)
    if found is None or found[0] is not instance or found[1] is not costs:
        result, repeat = quick_step_repeat(instance.schedule, costs, instance.pattern)
        if len(_PRICED) >= _MAX_CACHED:
            _PRICED.clear()
        found = _PRICED[key] = (instance, costs, result, repeat)
    return found[2], found[3]


def _later(result: StepResult, repeat: Repeat, cycles: int) -> StepResult:
    """``result`` with ``cycles`` more repeats of ``repeat`` in its run."""
    gone: Time = cycles * repeat.delta
    return StepResult(
        makespan=result.makespan + gone,
        busy=tuple(b + cycles * d for b, d in zip(result.busy, repeat.busy, strict=True)),
        peak_activation_bytes=result.peak_activation_bytes,
        peak_inflight=result.peak_inflight,
    )
