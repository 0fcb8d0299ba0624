"""Measured steps -> a cost model: per stage and op, plus the overheads that block a rank.

An executor (``pipesim verify``) times the *compute* of each unit of work, not
the waits, sends and receives around it. In pipesim's model
(:mod:`pipesim.costs`) a unit of work holds its rank for ``dispatch + receive
overheads + compute + send overheads``, and its messages arrive ``latency``
after its sends are posted. :func:`fit_costs` inverts that from one or more
measured steps (any schedules on one cut of the model, any micro-batch counts):

1. **compute**: per (stage, op) the median over every micro-batch of every
   step; an op never run falls back (B = I + W when only split backwards ran,
   I = W = B / 2 when only full ones), and the fit says so in ``assumed``;
2. **dispatch d and send overhead s**: from each rank's consecutive units
   ``a -> b`` where ``b`` takes no cross-rank message, the gap between ``a``'s
   compute end and ``b``'s compute start is ``s * (messages a sends) + d``;
3. **latency L**: where a message ``b`` takes was sent after ``a``'s node ended
   (so the rank waited for it), ``b``'s compute starts at
   ``last send + L + d + r * taken``; the median of those ``L + r * taken``
   bounds L from above;
4. **receive overhead r**: where every message ``b`` takes had arrived when the
   rank became free (sent early enough by that bound; without one, sent before
   ``a`` started), the gap is ``s * sent + d + r * taken``; then L follows from 3.

5. **rendezvous sends** (``send_mode="rendezvous"``, :mod:`pipesim.engine`): a message
   leaves when its receive is posted too (after the node the receiving rank runs
   before the RECV, :func:`pipesim.comms.receive_posts`) and, if that came second while
   the sender was inside a node (or waking up for the node that takes a message of the
   node the receive was posted after), answered; rules 3-4 use that departure (the sender's
   answer left out), the latency comes from the messages that left at once, and the
   **handshake** ``h`` from those waited for (a receive posted right before the work
   that needs it counts) that arrived before the sender's node ended: there ``b``'s
   compute starts ``h + L + d + r * taken`` after the receive was posted. Whether the
   sender was inside a node uses the receive overhead, so the fit runs twice. This model
   also charges **posting a receive** (``Link.post_overhead`` ``p``, paid after the sends
   of the node the lowering puts the RECV after): the dispatch comes from gaps with no
   receive posted, ``p`` from gaps with only receives posted, and the gaps of rules 2-4
   pay ``p`` per receive posted in them. A receive posted after its message was sent can
   stall its rank for milliseconds (gloo; 3.3-4.1 ms at one such post of the 6x256
   interleaved calibration in each of three runs), which no overhead of the rank's own
   describes: rules 2 (dispatch, post, send) leave such gaps out.

Compute times are medians over every micro-batch, which keeps a noisy
neighbour's stalls out. The overheads 2-5 are *medians of means* (:func:`robust`: the
mean of each measured step's samples, then the median over the steps; with fewer than
three steps, over three blocks of the samples): a step's makespan adds every overhead
up and their distribution has a tail that repeats from step to step (on gloo a message
the receiver had not posted for yet is often delivered only when the sender next
enters the library), which each step's mean keeps and a median of all samples would
leave out (replaying measured steps with their own compute times, median-fitted
overheads came out 3.0% short on average, mean-fitted 0.7%); while one slow step, or
one late message among a step's few, moves the median over the steps no further than
the next step's mean (a plain mean of the five samples of one calibration once put the
receive overhead at 2.46 ms per message, most of them well under one, and every
predicted step 15-33% long: docs/fidelity.md). The latency bound of rule 3 only sorts
transitions and stays a median of all, and so does the latency of rendezvous sends
(rule 5): it rests on a message or two per step, and in some process pairs gloo
delivers one of them only after the sender's step has ended. How far each figure can
be trusted is :attr:`CalibrationFit.terms`: its sample count, the spread of its
samples, and how far leaving out any one measured step moves it
(:func:`term_stability`). Times keep the trace's unit (verify: ns) and
are rounded to whole units. :func:`compute_only` is the converse: what an
executor would measure of a simulated step, so predictions and measurements
are compared on the same span (:func:`measured_makespan`, :func:`predict`).

>>> from pipesim.costs import CostModel, Link
>>> from pipesim.engine import answers_at_node_end, run_compiled, simulate
>>> from pipesim.schedules import generate
>>> truth = CostModel.uniform(forward=40, backward=90, input_grad=50, weight_grad=45,
...                           link=Link(latency=3, send_overhead=2, receive_overhead=4),
...                           dispatch_overhead=1)
>>> steps = []
>>> for name in ("1f1b", "zb-h1"):
...     schedule = generate(name, n_ranks=2, n_microbatches=4)
...     trace = compute_only(simulate(schedule, costs=truth).trace, schedule, truth)
...     steps.append(MeasuredStep(schedule=schedule, trace=trace))
>>> fit = fit_costs(steps)
>>> fit.costs.stage(1).weight_grad, fit.costs.link.receive_overhead, fit.costs.dispatch_overhead
(45, 4, 1)
"""

from __future__ import annotations

import itertools
from collections import defaultdict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from fractions import Fraction
from operator import attrgetter
from typing import Any, NamedTuple

from pipesim.actions import Action, Op, Overlap, Work
from pipesim.comms import receive_posts
from pipesim.cost_tables import comm_overhead
from pipesim.costs import CostModel, Link, StageCost, costs_to_dict
from pipesim.engine import answers_at_node_end, run_compiled, simulate
from pipesim.errors import CostError
from pipesim.exact import Time
from pipesim.schedule import Schedule
from pipesim.schedules import generate
from pipesim.step import compile_step
from pipesim.structure import StepStructure, step_structure
from pipesim.trace import ActionRecord, Trace

__all__ = [
    "BLOCKS",
    "CalibrationFit",
    "MeasuredStep",
    "Sample",
    "TermStats",
    "calibration_schedule",
    "compute_only",
    "compute_span",
    "costs_for",
    "cut_stages",
    "fit_costs",
    "fit_meta",
    "mean",
    "measured_makespan",
    "median",
    "median_of_means",
    "predict",
    "replay",
    "robust",
    "term_stability",
    "unstable_terms",
]


@dataclass(frozen=True, slots=True, kw_only=True)
class MeasuredStep:
    """One measured step: the schedule that ran and its compute-only action records."""

    schedule: Schedule
    trace: Trace


@dataclass(frozen=True, slots=True, kw_only=True)
class CalibrationFit:
    """What :func:`fit_costs` found."""

    costs: CostModel
    assumed: tuple[str, ...]
    """Ops not measured and filled from others, e.g. ``"stage 0: I = W = B / 2"``."""
    samples: Mapping[str, int]
    """How many measurements each figure is the median of (``"0F"``, ``"dispatch"``, ...)."""
    pair_links: Mapping[tuple[int, int], Link]
    """The message costs fitted per direction (ordered rank pair), from the transitions
    whose messages all use that pair (the others' figures where it has none)."""
    terms: Mapping[str, TermStats] = field(default_factory=dict)
    """Per fitted figure (the keys of ``samples``) its samples' statistics; with two or
    more steps also how far leaving out one step moves it (:func:`term_stability`)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class TermStats:
    """How one fitted figure came about: ``value`` (what the cost model holds, in the
    steps' time unit), the ``samples`` behind it and the measured ``steps`` they come
    from, their p10 and p90, and ``step_shift``: the most the figure moves when any one
    measured step is left out of the fit (None: fewer than two steps)."""

    value: Time
    samples: int
    steps: int = 0
    p10: Time = 0
    p90: Time = 0
    step_shift: Time | None = None

    @property
    def spread(self) -> float | None:
        """(p90 - p10) / value: how far the samples lie apart (None for a zero value)."""
        return float((self.p90 - self.p10) / self.value) if self.value else None

    def to_dict(self) -> dict[str, float | int | None]:
        """The JSON a cost file's ``meta.terms`` keeps (times as whole units)."""
        spread = self.spread
        return {
            "value": round(self.value),
            "samples": self.samples,
            "steps": self.steps,
            "p10": round(self.p10),
            "p90": round(self.p90),
            "spread_pct": None if spread is None else round(spread * 100, 1),
            "step_shift": None if self.step_shift is None else round(self.step_shift),
        }


def median(values: Sequence[Time], /) -> Time:
    """The exact median (the mean of the middle two for an even count).

    >>> median([3, 1, 2]), median([1, 2, 3, 5])
    (2, Fraction(5, 2))
    """
    if not values:
        raise ValueError("median of no values")
    ordered = sorted(values)
    half = len(ordered) // 2
    if len(ordered) % 2:
        return ordered[half]
    middle = Fraction(ordered[half - 1] + ordered[half], 2)
    return middle.numerator if middle.denominator == 1 else middle


def mean(values: Sequence[Time], /) -> Time:
    """The exact mean (a Fraction unless it is whole).

    >>> mean([1, 2, 4]), mean([2, 4])
    (Fraction(7, 3), 3)
    """
    if not values:
        raise ValueError("mean of no values")
    value = Fraction(sum(values), len(values))
    return value.numerator if value.denominator == 1 else value


Sample = tuple[int, Time]
"""One sample of an overhead: the index of the measured step it comes from, its value."""

BLOCKS = 3
"""The fewest groups :func:`robust` takes a median over (so one group cannot set it)."""


def median_of_means(groups: Sequence[Sequence[Time]], /) -> Time:
    """The median of the groups' means (empty groups left out): a group that went wrong,
    a slow step or a late message, moves it no further than a neighbouring group's mean,
    while a tail that every group shares stays in it, as in a mean (Lugosi and Mendelson,
    "Mean estimation and regression under heavy-tailed distributions", 2019, section 2).

    >>> median_of_means([[1, 2], [2, 2], [90]]), median_of_means([[1, 3], [], [2, 2]])
    (2, 2)
    """
    means = [mean(g) for g in groups if g]
    if not means:
        raise ValueError("median of means of no values")
    return median(means)


def robust(samples: Sequence[Sample], /, *, blocks: int = BLOCKS) -> Time:
    """The overhead figure of ``samples`` (step index, value): :func:`median_of_means`
    over the steps when at least ``blocks`` steps have samples, else over ``blocks``
    consecutive blocks of the samples in measured order (fewer than ``blocks`` samples:
    their mean, which the fit's terms then report as few).

    One late message among the 6 samples of one step (a mean would say 2.5):

    >>> robust([(0, 1), (0, 1), (0, 10), (0, 1), (0, 1), (0, 1)])
    1
    >>> robust([(0, 2), (1, 4), (2, 9), (3, 3)])
    Fraction(7, 2)
    """
    if not samples:
        raise ValueError("robust figure of no samples")
    by_step: dict[int, list[Time]] = defaultdict(list)
    for step, value in samples:
        by_step[step].append(value)
    if len(by_step) >= blocks:
        return median_of_means(list(by_step.values()))
    values = [v for _, v in samples]
    if len(values) < blocks:
        return mean(values)
    size = len(values) / blocks
    return median_of_means([values[round(k * size) : round((k + 1) * size)] for k in range(blocks)])


def _quantile(ordered: Sequence[Time], q: Fraction) -> Time:
    """The ``q`` quantile of sorted values (nearest rank, exact)."""
    return ordered[min(int(q * len(ordered)), len(ordered) - 1)]


def _stats(samples: Sequence[Sample], value: Time) -> TermStats:
    ordered = sorted(v for _, v in samples)
    if not ordered:
        return TermStats(value=value, samples=0)
    return TermStats(
        value=value,
        samples=len(ordered),
        steps=len({k for k, _ in samples}),
        p10=_quantile(ordered, Fraction(1, 10)),
        p90=_quantile(ordered, Fraction(9, 10)),
    )


def _whole(value: Time) -> int:
    """Whole time units, never negative (a fitted overhead below 0 is noise)."""
    return max(round(value), 0)


# -- what to run ------------------------------------------------------------------------
def calibration_schedule(*, n_ranks: int, n_microbatches: int, virtual: int = 1) -> Schedule:
    """1F1B (``virtual`` 1) or interleaved 1F1B with every odd micro-batch's backward split
    into I then W, so that one run measures F, B, I and W of every stage.

    It is none of the registered families, so every registered schedule is
    predicted out of sample.

    >>> s = calibration_schedule(n_ranks=2, n_microbatches=2)
    >>> [str(w) for w in s.orders[1]]
    ['1F0', '1B0', '1F1', '1I1', '1W1']
    """
    base = (
        generate("1f1b", n_ranks=n_ranks, n_microbatches=n_microbatches)
        if virtual == 1
        else generate(
            "interleaved-1f1b", n_ranks=n_ranks, n_microbatches=n_microbatches, virtual=virtual
        )
    )
    orders: list[list[Work]] = []
    for order in base.orders:
        new: list[Work] = []
        for work in order:
            if isinstance(work, Action) and work.op is Op.B and work.microbatch % 2:
                new.append(Action(stage=work.stage, op=Op.I, microbatch=work.microbatch))
                new.append(Action(stage=work.stage, op=Op.W, microbatch=work.microbatch))
            else:
                new.append(work)
        orders.append(new)
    return Schedule.from_orders(
        orders,
        placement=base.placement,
        n_microbatches=n_microbatches,
        name=f"calibration (mixed-backward {base.name})",
    )


# -- which messages each unit of work sends and takes ------------------------------------
@dataclass(frozen=True, slots=True)
class _Counts:
    structure: StepStructure
    sent: tuple[int, ...]
    taken: tuple[int, ...]


def _counts(schedule: Schedule) -> _Counts:
    structure = step_structure(schedule)
    n_messages = len(structure.messages)
    sent = tuple(sum(1 for a in out if a < n_messages) for out in structure.outputs)
    taken = tuple(sum(1 for a in ins if a < n_messages) for ins in structure.inputs)
    return _Counts(structure, sent, taken)


def _records_by_node(structure: StepStructure, trace: Trace) -> list[ActionRecord]:
    by_work: dict[Work, ActionRecord] = {r.work: r for r in trace.actions}
    missing = [str(w) for w in structure.works if w not in by_work]
    if missing:
        raise CostError(
            f"the measured trace has no record of {missing[:5]} of schedule "
            f"{structure.schedule.name!r}; give the trace of that schedule's step"
        )
    return [by_work[w] for w in structure.works]


# -- the converse: what an executor measures of a simulated step --------------------------
def compute_only(trace: Trace, schedule: Schedule, costs: CostModel, /) -> Trace:
    """``trace`` (simulated with ``costs``) as an executor measures it: each unit of work
    without its dispatch, receive and send overheads; records shifted so the first
    compute starts at 0."""
    structure = step_structure(schedule)
    costs = costs.for_stages(schedule.n_stages)
    before, after = _message_overheads(structure, costs)
    records = _records_by_node(structure, trace)
    inner = []
    for node, record in enumerate(records):
        start = record.start + costs.dispatch_overhead + before[node]
        end = record.end - after[node]
        inner.append(replace(record, start=start, end=end))
    origin = min((r.start for r in inner), default=0)
    shifted = sorted(
        (replace(r, start=r.start - origin, end=r.end - origin) for r in inner),
        key=lambda r: (r.start, r.rank),
    )
    return Trace(n_ranks=trace.n_ranks, actions=tuple(shifted))


def _message_overheads(structure: StepStructure, costs: CostModel) -> tuple[list[Time], list[Time]]:
    """Per node, the receive overheads of the messages it takes and the send overheads of
    those it sends, each message over its own rank pair's link (as the engine charges
    them: :func:`pipesim.cost_tables.comm_overhead` of :meth:`CostModel.link_between`)."""
    messages = structure.messages
    n = len(messages)

    def total(arrivals: Sequence[int], *, send: bool) -> Time:
        return sum(
            (
                comm_overhead(costs.link_between(m.src_rank, m.dst_rank), send=send)
                for m in (messages[a] for a in arrivals if a < n)
            ),
            start=0,
        )

    before = [total(ins, send=False) for ins in structure.inputs]
    after = [total(out, send=True) for out in structure.outputs]
    return before, after


def measured_makespan(trace: Trace, /) -> Time:
    """First compute start to last compute end: the span an executor reports."""
    if not trace.actions:
        return 0
    return max(r.end for r in trace.actions) - min(r.start for r in trace.actions)


# -- the fit -----------------------------------------------------------------------------
class _Source(NamedTuple):
    """A message's producer, as measured."""

    end: Time
    """Its compute end."""
    sent: int
    """How many messages it sends (its send overheads come before this one leaves)."""


class _Post(NamedTuple):
    """Where a message's receive is posted: after a node of the receiving rank and its sends
    (:func:`pipesim.comms.receive_posts`)."""

    end: Time
    """That node's compute end."""
    sent: int
    """How many messages that node sends."""
    ahead: int
    """How many receives its rank posts there before this one."""
    node: int
    """The node."""


class _Span(NamedTuple):
    """One node of a sending rank, as measured: to tell whether the rank was computing, or
    waking up for the node, when a receive was posted to it."""

    start: Time
    """Compute start."""
    end: Time
    """Compute end."""
    taken: int
    """Messages it takes."""
    sent: int
    """Messages it sends."""
    takes_from: frozenset[int]
    """The nodes whose messages it takes."""


@dataclass(frozen=True, slots=True)
class _Transition:
    step: int
    """Which measured step (its index) the transition is in."""
    gap: Time
    """Compute end of ``a`` to compute start of ``b``."""
    start_a: Time
    end_a: Time
    start_b: Time
    sent_a: int
    taken_b: int
    sources: tuple[_Source, ...]
    """Per message ``b`` takes: its producer."""
    posts_a: int
    """Receives ``a``'s rank posts after ``a`` (and its sends), before ``b``."""
    late_posts_a: int
    """Of those, the receives whose messages had been sent when ``a`` ended."""
    posts: tuple[_Post | None, ...]
    """Per message ``b`` takes: where its receive is posted (None: before the rank's
    first node)."""
    senders: tuple[tuple[_Span, ...], ...]
    """Per message ``b`` takes: its sending rank's nodes in order."""
    sent_pairs: frozenset[tuple[int, int]]
    """The (source, destination) rank pairs of the messages ``a`` sends."""
    taken_pairs: frozenset[tuple[int, int]]
    """The rank pairs of the messages ``b`` takes."""
    posted_pairs: frozenset[tuple[int, int]]
    """The rank pairs of the receives posted between ``a`` and ``b``."""


class _Posting(NamedTuple):
    """Per node of one measured step, the receives its rank posts after it."""

    posts: list[_Post | None]
    """Per message, where its receive is posted."""
    ahead: dict[int, int]
    """Per node, how many receives are posted after it."""
    late: dict[int, int]
    """Per node, how many of those are for messages sent before it ended."""
    pairs: dict[int, set[tuple[int, int]]]
    """Per node, the rank pairs of those receives."""


def _posting(counts: _Counts, records: Sequence[ActionRecord]) -> _Posting:
    structure = counts.structure
    found = _Posting([], defaultdict(int), defaultdict(int), defaultdict(set))
    for message, node in zip(structure.messages, receive_posts(structure), strict=True):
        found.posts.append(
            None
            if node < 0
            else _Post(records[node].end, counts.sent[node], found.ahead[node], node)
        )
        found.ahead[node] += 1
        found.pairs[node].add((message.src_rank, message.dst_rank))
        if node >= 0 and records[message.producer_node].end < records[node].end:
            found.late[node] += 1
    return found


def _spans(counts: _Counts, records: Sequence[ActionRecord]) -> list[tuple[_Span, ...]]:
    """Per rank its nodes as :class:`_Span`\\ s, in order."""
    structure = counts.structure
    n_messages = len(structure.messages)
    return [
        tuple(
            _Span(
                records[n].start,
                records[n].end,
                counts.taken[n],
                counts.sent[n],
                frozenset(
                    structure.messages[i].producer_node
                    for i in structure.inputs[n]
                    if i < n_messages
                ),
            )
            for n in order
        )
        for order in structure.orders
    ]


def _transitions(steps: Sequence[MeasuredStep]) -> list[_Transition]:
    """Every pair of consecutive units of work ``a -> b`` of a rank, in every step."""
    found = []
    for index, step in enumerate(steps):
        counts = _counts(step.schedule)
        structure = counts.structure
        records = _records_by_node(structure, step.trace)
        posting = _posting(counts, records)
        spans = _spans(counts, records)
        n_messages = len(structure.messages)
        for order in structure.orders:
            for a, b in itertools.pairwise(order):
                taken = [i for i in structure.inputs[b] if i < n_messages]
                ins = [structure.messages[i] for i in taken]
                outs = [structure.messages[i] for i in structure.outputs[a] if i < n_messages]
                found.append(
                    _Transition(
                        step=index,
                        gap=records[b].start - records[a].end,
                        start_a=records[a].start,
                        end_a=records[a].end,
                        start_b=records[b].start,
                        sent_a=counts.sent[a],
                        taken_b=counts.taken[b],
                        posts_a=posting.ahead[a],
                        late_posts_a=posting.late[a],
                        sources=tuple(
                            _Source(records[m.producer_node].end, counts.sent[m.producer_node])
                            for m in ins
                        ),
                        posts=tuple(posting.posts[i] for i in taken),
                        senders=tuple(spans[m.src_rank] for m in ins),
                        sent_pairs=frozenset((m.src_rank, m.dst_rank) for m in outs),
                        taken_pairs=frozenset((m.src_rank, m.dst_rank) for m in ins),
                        posted_pairs=frozenset(posting.pairs[a]),
                    )
                )
    return found


def _fit_overheads(
    steps: Sequence[MeasuredStep], send_mode: str
) -> tuple[Link, Time, dict[str, list[Sample]], dict[tuple[int, int], Link]]:
    """Dispatch, send, receive and latency (and the handshake of rendezvous sends) from
    the gaps between units of work; the same per ordered rank pair (direction) where its
    messages can be told apart."""
    found = _transitions(steps)
    # The rendezvous model charges posting receives (Link.post_overhead): the dispatch
    # comes from transitions without one; the eager model leaves it in the dispatch.
    posting = send_mode != "eager"
    idle = [
        (t.step, t.gap)
        for t in found
        if t.taken_b == 0 and t.sent_a == 0 and not (posting and t.posts_a)
    ]
    dispatch = robust(idle) if idle else 0
    fit = _message_costs if send_mode == "eager" else _rendezvous_costs
    link, samples = fit(found, dispatch)
    pairs = sorted({p for t in found for p in t.sent_pairs | t.taken_pairs | t.posted_pairs})
    by_pair = {}
    for pair in pairs:
        only = [
            t
            for t in found
            if t.sent_pairs <= {pair} and t.taken_pairs <= {pair} and t.posted_pairs <= {pair}
        ]
        by_pair[pair], _ = fit(only, dispatch, fallback=link)
    return link, _whole(dispatch), {"dispatch": idle, **samples}, by_pair


def _had_arrived(last: Time, t: _Transition, bound: Time | None, send: Time) -> bool:
    """Whether the last message ``b`` takes had surely arrived when the rank became free:
    by the latency bound when there is one, else sent before ``a`` even started."""
    if bound is None:
        return last <= t.start_a
    return last + bound <= t.end_a + send * t.sent_a


def _message_costs(
    found: Sequence[_Transition], dispatch: Time, *, fallback: Link | None = None
) -> tuple[Link, dict[str, list[Sample]]]:
    """Rules 2-4 of the module docstring over ``found``; a figure without samples is
    ``fallback``'s (0 without one)."""
    base = fallback or Link()
    local = [t for t in found if t.taken_b == 0 and t.sent_a]
    posting: list[Sample] = [(t.step, Fraction(t.gap - dispatch, t.sent_a)) for t in local]
    send = robust(posting) if posting else base.send_overhead

    def departure(source: _Source) -> Time:
        return source.end + send * source.sent

    taken = [t for t in found if t.taken_b]
    # Waited: the rank was free before the message even left, so b's compute starts
    # latency + receive * taken after the last departure (plus the dispatch).
    waited = [
        (t, t.start_b - dispatch - last)
        for t in taken
        if (last := max(departure(s) for s in t.sources)) > t.end_a + send * t.sent_a
    ]
    # Each waited value is latency + receive * taken >= latency: a bound on the latency
    # that tells which messages had arrived when the rank became free.
    bound = median([v for _, v in waited]) if waited else None
    arrived: list[Sample] = [
        (t.step, Fraction(t.gap - dispatch - send * t.sent_a, t.taken_b))
        for t in taken
        if _had_arrived(max(departure(s) for s in t.sources), t, bound, send)
    ]
    receive = robust(arrived) if arrived else base.receive_overhead
    values = [(t.step, v - receive * t.taken_b) for t, v in waited]
    latency = robust(values) if values else base.latency
    link = Link(
        latency=_whole(latency), send_overhead=_whole(send), receive_overhead=_whole(receive)
    )
    return link, {"send_overhead": posting, "receive_overhead": arrived, "latency": values}


@dataclass(frozen=True, slots=True)
class _Rendezvous:
    """The rendezvous overheads fitted before the receive overhead (rules 2 and 2b), and
    the times they put on a transition."""

    dispatch: Time
    send: Time
    """Per message sent."""
    post: Time
    """Per receive posted."""
    base: Link
    """Where a figure without samples comes from."""

    def sent(self, source: _Source) -> Time:
        """When a message is sent: its producer's end and its send overheads."""
        return source.end + self.send * source.sent

    def posted(self, post: _Post) -> Time:
        """When a receive is posted: after its node, that node's sends and the receives
        posted there before it."""
        return post.end + self.send * post.sent + self.post * post.ahead

    def free(self, t: _Transition) -> Time:
        """When ``a``'s rank is done with ``a``'s sends and the receives it posts."""
        return t.end_a + self.send * t.sent_a + self.post * t.posts_a


class _Departure(NamedTuple):
    """When the last message a unit of work takes could leave (no handshake counted)."""

    at: Time
    node_end: Time | None
    """When its receive came second while its sender was inside a node or waking up for
    one: that node's end (it answers then, or a handshake after the receive); else None."""


class _Waited(NamedTuple):
    """A transition whose ``b`` waited for its last message."""

    transition: _Transition
    value: Time
    """``b``'s compute start less the dispatch less the departure: latency (+ the
    sender's answer) + receive overhead * messages taken."""
    node_end: Time | None
    """As :attr:`_Departure.node_end`."""


def _rendezvous_costs(
    found: Sequence[_Transition], dispatch: Time, *, fallback: Link | None = None
) -> tuple[Link, dict[str, list[Sample]]]:
    """Rules 2-4 and 5 of the module docstring (rendezvous sends), over ``found``."""
    base = fallback or Link()
    # 2b: posting receives, from the gaps where nothing else happens but the dispatch.
    posted: list[Sample] = [
        (t.step, Fraction(t.gap - dispatch, t.posts_a))
        for t in found
        if t.taken_b == 0 and t.sent_a == 0 and t.posts_a and not t.late_posts_a
    ]
    post = robust(posted) if posted else base.post_overhead
    local = [t for t in found if t.taken_b == 0 and t.sent_a and not t.late_posts_a]
    posting: list[Sample] = [
        (t.step, Fraction(t.gap - dispatch - post * t.posts_a, t.sent_a)) for t in local
    ]
    send = robust(posting) if posting else base.send_overhead
    fitted = _Rendezvous(dispatch=dispatch, send=send, post=post, base=base)
    # Whether the sender was inside a node depends on the receive overhead at its start:
    # fit once without it, then again with the receive overhead found.
    receive, _, _ = _fit_rendezvous(found, fitted, receive=0)
    _, link, samples = _fit_rendezvous(found, fitted, receive=receive)
    return link, {"send_overhead": posting, "post_overhead": posted, **samples}


def _departure(t: _Transition, fitted: _Rendezvous, receive: Time) -> _Departure:
    """When the last message ``b`` takes could leave, by the engine's rule: once sent and
    its receive posted; a receive posted second is answered at the end of the sender's
    node when :func:`pipesim.engine.answers_at_node_end` says so."""
    departures: list[_Departure] = []
    for source, post, spans in zip(t.sources, t.posts, t.senders, strict=True):
        sent = fitted.sent(source)
        posted = sent if post is None else fitted.posted(post)
        if post is None or posted <= sent:
            departures.append(_Departure(sent, None))
            continue
        node_end = None
        for span in spans:
            begins = span.start - fitted.dispatch - receive * span.taken
            done = span.end + fitted.send * span.sent
            if answers_at_node_end(posted, begins, done, woken=post.node in span.takes_from):
                node_end = done
                break
            if begins >= posted:
                break
        departures.append(_Departure(posted, node_end))
    return max(departures, key=attrgetter("at"))


def _fit_rendezvous(
    found: Sequence[_Transition], fitted: _Rendezvous, *, receive: Time
) -> tuple[Time, Link, dict[str, list[Sample]]]:
    """Rules 3-5 given the overheads of rule 2 and a receive overhead for telling whether
    a sender was inside a node: the receive overhead, latency and handshake found."""
    dispatch, send, post, base = fitted.dispatch, fitted.send, fitted.post, fitted.base
    taken = [(t, _departure(t, fitted, receive)) for t in found if t.taken_b]
    # A late receive posted right before the work that needs it (after ``a``'s sends)
    # is waited for too: the handshake follows it.
    waited = [
        _Waited(t, t.start_b - dispatch - left.at, left.node_end)
        for t, left in taken
        if left.at > fitted.free(t)
        or (left.node_end is not None and left.at >= t.end_a + send * t.sent_a)
    ]
    # As rule 3: latency (+ the sender's answer) + receive * taken, per kind (True: left
    # at once), bound which messages had arrived when the rank became free.
    bounds = {
        kind: median(values)
        if (values := [w.value for w in waited if (w.node_end is None) is kind])
        else None
        for kind in (True, False)
    }

    def had_arrived(t: _Transition, left: _Departure) -> bool:
        bound = bounds[left.node_end is None]
        if bound is None:
            return left.at <= t.start_a
        return left.at + bound <= fitted.free(t)

    arrived: list[Sample] = [
        (t.step, Fraction(t.gap - dispatch - send * t.sent_a - post * t.posts_a, t.taken_b))
        for t, left in taken
        if had_arrived(t, left)
    ]
    new_receive = robust(arrived) if arrived else base.receive_overhead
    early = [
        (w.transition.step, w.value - new_receive * w.transition.taken_b)
        for w in waited
        if w.node_end is None
    ]
    # A median of all, unlike the overheads: a step has few such messages (one or two
    # per run of the 2-stage calibration), and whole process pairs deliver one late.
    latency = median([v for _, v in early]) if early else base.latency
    limited = _handshakes(waited, fitted, receive=new_receive, latency=latency)
    handshake = robust(limited) if limited else base.handshake
    link = Link(
        latency=_whole(latency),
        send_overhead=_whole(send),
        receive_overhead=_whole(new_receive),
        handshake=_whole(handshake),
        post_overhead=_whole(post),
    )
    return new_receive, link, {"receive_overhead": arrived, "latency": early, "handshake": limited}


def _handshakes(
    waited: Sequence[_Waited], fitted: _Rendezvous, *, receive: Time, latency: Time
) -> list[Sample]:
    """The handshake samples: per waited message answered by a computing sender, how long
    after its receive it left, where that came before the sender's node ended (the
    handshake, not the node's end, released it)."""
    samples: list[Sample] = []
    for w in waited:
        if w.node_end is None:
            continue
        t = w.transition
        answer = w.value - receive * t.taken_b - latency
        # The departure was b's compute start less the dispatch less the value.
        until_node_end = w.node_end - (t.start_b - fitted.dispatch - w.value)
        if answer < until_node_end:
            samples.append((t.step, answer))
    return samples


def fit_costs(
    steps: Sequence[MeasuredStep],
    /,
    *,
    stage_bytes: Sequence[StageCost] = (),
    time_unit: str = "unit",
    send_mode: str = "eager",
) -> CalibrationFit:
    """A cost model from measured ``steps`` (all on one cut: the same stage count).

    ``stage_bytes`` gives per stage the byte fields (``activation_bytes``,
    ``weight_grad_bytes``, ``output_bytes``, ``param_bytes``) to keep; times come
    from the steps (see the module docstring), in their ``time_unit``.
    """
    if not steps:
        raise CostError("fit_costs needs at least one measured step")
    n_stages = {s.schedule.n_stages for s in steps}
    if len(n_stages) != 1:
        raise CostError(
            f"the steps cut the model into {sorted(n_stages)} stages; a cost file describes "
            "one cut, so calibrate each cut from its own steps"
        )
    (count,) = n_stages
    samples: dict[tuple[int, Op], list[Sample]] = defaultdict(list)
    pairs: dict[int, list[Time]] = defaultdict(list)
    for index, step in enumerate(steps):
        for record in step.trace.actions:
            work = record.work
            if isinstance(work, Action):
                samples[(work.stage, work.op)].append((index, record.end - record.start))
            else:
                assert isinstance(work, Overlap)
                pairs[work.parts[0].stage].append(record.end - record.start)
    stages, assumed = [], []
    for stage in range(count):
        times = {
            op: _whole(median([v for _, v in samples[(stage, op)]]))
            for op in Op
            if samples[(stage, op)]
        }
        if Op.B not in times and Op.I in times and Op.W in times:
            times[Op.B] = times[Op.I] + times[Op.W]
            assumed.append(f"stage {stage}: B = I + W")
        if Op.B in times and (Op.I not in times or Op.W not in times):
            times[Op.I], times[Op.W] = times[Op.B] // 2, times[Op.B] - times[Op.B] // 2
            assumed.append(f"stage {stage}: I = W = B / 2")
        base = stage_bytes[stage] if stage < len(stage_bytes) else StageCost()
        stages.append(
            replace(
                base,
                forward=times.get(Op.F, 0),
                backward=times.get(Op.B, 0),
                input_grad=times.get(Op.I, 0),
                weight_grad=times.get(Op.W, 0),
                overlap=_whole(median(pairs[stage])) if pairs[stage] else None,
            )
        )
    link, dispatch, overheads, by_pair = _fit_overheads(steps, send_mode)
    costs = CostModel(
        stages=tuple(stages),
        link=link,
        dispatch_overhead=dispatch,
        time_unit=time_unit,
        send_mode=send_mode,
    )
    terms = {
        f"{s}{op.value}": _stats(samples[(s, op)], _term_value(costs, f"{s}{op.value}"))
        for s in range(count)
        for op in Op
        if samples[(s, op)]
    }
    for name, values in overheads.items():
        terms[name] = _stats(values, _term_value(costs, name))
    return CalibrationFit(
        costs=costs,
        assumed=tuple(assumed),
        samples={name: t.samples for name, t in terms.items()},
        pair_links=by_pair,
        terms=terms,
    )


def _term_value(costs: CostModel, name: str) -> Time:
    """The figure of ``costs`` that term ``name`` of :attr:`CalibrationFit.terms` names:
    ``"0F"`` (stage 0's forward), ``"dispatch"`` or a link field such as ``"latency"``."""
    if name == "dispatch":
        return costs.dispatch_overhead
    value: Time = (
        getattr(costs.link, name)
        if not name[:-1].isdigit()
        else getattr(costs.stages[int(name[:-1])], _OP_FIELDS[name[-1]])
    )
    return value


_OP_FIELDS = {"F": "forward", "B": "backward", "I": "input_grad", "W": "weight_grad"}


def term_stability(
    steps: Sequence[MeasuredStep], fit: CalibrationFit, /, *, send_mode: str = "eager"
) -> CalibrationFit:
    """``fit`` (of ``steps``) with each term's ``step_shift``: the most its figure moves
    when the fit leaves out any one of the steps (a jackknife over steps). A figure one
    step can move far rests on that step: a slow spell of the machine, or one late
    message in a term with few samples. Fewer than two steps: ``fit`` unchanged."""
    if len(steps) < 2:
        return fit
    shifts: dict[str, Time] = defaultdict(int)
    for k in range(len(steps)):
        without = fit_costs([*steps[:k], *steps[k + 1 :]], send_mode=send_mode)
        for name, term in fit.terms.items():
            if name in without.terms:
                shifts[name] = max(shifts[name], _size(without.terms[name].value - term.value))
    terms = {name: replace(t, step_shift=shifts[name]) for name, t in fit.terms.items()}
    return replace(fit, terms=terms)


def _size(value: Time) -> Time:
    """``|value|``, typed as a Time."""
    return value if value >= 0 else -value


def unstable_terms(
    terms: Mapping[str, TermStats], /, *, min_samples: int, max_shift: float = 0.2, floor: Time = 0
) -> dict[str, str]:
    """Per term that cannot be trusted, why: fewer than ``min_samples`` samples, or one
    step moving it by more than ``max_shift`` of its value (and more than ``floor`` time
    units, so that figures too small to matter do not warn). A term without samples was
    not fitted (its figure is the default) and is not listed.

    >>> unstable_terms({"0F": TermStats(value=100, samples=12, step_shift=5),
    ...                 "handshake": TermStats(value=40, samples=3, step_shift=30)},
    ...                min_samples=10)
    {'handshake': '3 samples (fewer than 10); leaving out one step moves it by 75%'}
    """
    found = {}
    for name, term in terms.items():
        if not term.samples:
            continue
        why = []
        if term.samples < min_samples:
            why.append(f"{term.samples} samples (fewer than {min_samples})")
        shift = term.step_shift
        if shift is not None and shift > floor and shift > max_shift * _size(term.value):
            share = f"{float(shift / term.value) * 100:.0f}%" if term.value else "from 0"
            why.append(f"leaving out one step moves it by {share}")
        if why:
            found[name] = "; ".join(why)
    return found


STATISTIC = (
    "compute: median over every micro-batch of every measured step; overheads: median "
    "over the measured steps of each step's mean over its transitions (over three blocks "
    "of the transitions with fewer than three steps); rendezvous latency: median over "
    "every message"
)
"""What a cost file's ``meta.statistic`` says of :func:`fit_costs`."""


def fit_meta(fit: CalibrationFit, /) -> dict[str, Any]:
    """What a calibrated cost file's ``meta`` keeps of ``fit``: the statistic, the ops
    assumed, per figure its samples and :class:`TermStats`, and the message costs per
    direction (``"0->1"``)."""
    return {
        "statistic": STATISTIC,
        "assumed": list(fit.assumed),
        "samples": dict(fit.samples),
        "terms": {name: term.to_dict() for name, term in fit.terms.items()},
        "links_by_direction": {
            f"{src}->{dst}": costs_to_dict(CostModel(link=link))["link"]
            for (src, dst), link in fit.pair_links.items()
        },
    }


def costs_for(schedule: Schedule, cuts: Mapping[int, CostModel], /) -> CostModel:
    """The cost model of ``schedule`` from calibrated ``cuts`` (stage count -> costs);
    with ``n_copies > 1`` every copy is the cut into ``n_stages / n_copies`` stages."""
    per_copy = schedule.n_stages // schedule.n_copies
    costs = cuts.get(per_copy)
    if costs is None:
        raise CostError(
            f"no calibration for a cut into {per_copy} stages (have {sorted(cuts)}); "
            f"calibrate with --virtual {max(per_copy // schedule.n_ranks, 1)}"
        )
    cut = costs.for_stages(per_copy).stages
    return replace(costs, stages=tuple(cut[k] for k in cut_stages(schedule)))


def cut_stages(schedule: Schedule, /) -> tuple[int, ...]:
    """Per stage of ``schedule``, the stage of the calibrated cut whose costs it takes
    (:func:`costs_for`): itself, or with ``n_copies > 1`` its place in its model copy.

    >>> cut_stages(generate("dualpipe", n_ranks=2, n_microbatches=4))
    (0, 1, 0, 1)
    """
    return tuple(range(schedule.n_stages // schedule.n_copies)) * schedule.n_copies


def predict(schedule: Schedule, costs: CostModel, /) -> Time:
    """The step an executor would measure (first compute start to last compute end,
    :func:`measured_makespan`) as pipesim predicts it from ``costs``."""
    trace = simulate(schedule, costs=costs).trace
    return measured_makespan(compute_only(trace, schedule, costs))


def replay(step: MeasuredStep, costs: CostModel, /) -> Time:
    """The step pipesim predicts when every unit of work takes the compute time measured
    for it in ``step`` and the overheads of ``costs`` (dispatch, send, receive, latency,
    links), as :func:`measured_makespan` spans it.

    Against the measured makespan this is the model's own error (dependencies, overheads,
    messages), without the run-to-run variation of compute speed that a prediction from
    per-op medians also carries. 1F1B, one micro-batch, F=10, B=20, latency 3, send 1,
    receive 4, dispatch 2, measured with 1F0 taking 15 instead of 10: 0F0 computes 0..10,
    1F0 20..35, 1B0 37..57, 0B0 67..87:

    >>> from pipesim.costs import Link
    >>> costs = CostModel.uniform(forward=10, backward=20, dispatch_overhead=2,
    ...     link=Link(latency=3, send_overhead=1, receive_overhead=4))
    >>> schedule = generate("1f1b", n_ranks=2, n_microbatches=1)
    >>> spans = {"0F0": (0, 10), "1F0": (20, 35), "1B0": (37, 57), "0B0": (67, 87)}
    >>> records = [ActionRecord(rank=r, work=w, start=spans[str(w)][0], end=spans[str(w)][1])
    ...            for r, order in enumerate(schedule.orders) for w in order]
    >>> replay(MeasuredStep(schedule=schedule, trace=Trace(n_ranks=2, actions=tuple(records))),
    ...        costs)
    87
    """
    schedule = step.schedule
    records = _records_by_node(step_structure(schedule), step.trace)
    return compute_span(schedule, costs)([r.end - r.start for r in records])


def compute_span(schedule: Schedule, costs: CostModel, /) -> Callable[[Sequence[Time]], Time]:
    """The step pipesim predicts, as :func:`measured_makespan` spans it, as a function of
    each unit of work's compute time (in ``step_structure(schedule).works`` order), with
    the overheads of ``costs`` (dispatch, send, receive, latency, links) around them.

    Compiled once, so that many sets of compute times (:func:`replay`, the draws of
    :func:`pipesim.band.predict_band`) each cost one engine run. With the compute times of
    ``costs`` themselves it is :func:`predict`. 1F1B, one micro-batch (units of work
    0F0, 0B0, 1F0, 1B0), dispatch 2: a chain of four, so 2 + 10 + 2 + 10 + 2 + 20 + 2 +
    20 from 0F0's compute start, and 5 more when 1F0 computes 15:

    >>> costs = CostModel.uniform(forward=10, backward=20, dispatch_overhead=2)
    >>> schedule = generate("1f1b", n_ranks=2, n_microbatches=1)
    >>> span = compute_span(schedule, costs)
    >>> predict(schedule, costs), span([10, 20, 10, 20]), span([10, 20, 15, 20])
    (66, 66, 71)
    """
    costs = costs.for_stages(schedule.n_stages)
    structure = step_structure(schedule)
    compiled = compile_step(structure, costs)
    # The same model with no compute: each node's duration is then its overheads alone.
    bare = replace(
        costs,
        stages=tuple(
            replace(c, forward=0, backward=0, input_grad=0, weight_grad=0, overlap=None)
            for c in costs.stages
        ),
    )
    overheads = compile_step(structure, bare).durations
    n_works = len(structure.works)

    def span(compute: Sequence[Time], /) -> Time:
        if len(compute) != n_works:
            raise CostError(
                f"{len(compute)} compute times for the {n_works} units of work of "
                f"{schedule.name!r}; give one per unit of work, in step_structure order"
            )
        durations = (
            *(o + c for o, c in zip(overheads, compute, strict=False)),
            *overheads[n_works:],
        )
        trace = run_compiled(replace(compiled, durations=durations))
        return measured_makespan(compute_only(trace, schedule, costs))

    return span
