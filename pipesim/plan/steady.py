"""Exact steady-state extrapolation for the one-pass evaluator (:mod:`pipesim.plan.onepass`).

A schedule of simple actions whose per-rank orders repeat (each rank's order, after
its warm-up, is the same run of actions again and again, every micro-batch index
``q`` higher each time) under costs that depend on an action's stage and op but not
on its micro-batch (what :func:`pipesim.step.cost_tables.cost_tables` gives) is a
max-plus linear system (Baccelli, Cohen, Olsder, Quadrat, *Synchronization and
Linearity*, 1992, ch. 3): every start is a maximum of sums of earlier times and
costs. The evaluator runs the schedule one **period** at a time (each rank up to
its next cut, ``starts[r] + j * lengths[r]``) and, at each cut, records its whole
state: where each rank stands and its clock, the messages sent but not yet read
and their arrival times, who sleeps on which message, each link's free times and
the memory each rank holds. Once the state at cut ``j`` equals the state at an
earlier cut ``i``, shifted by ``(j - i) * q`` micro-batches and by one time ``delta``,
the next ``j - i`` periods repeat the last ones shifted by ``delta`` too (the proof
is in docs/planner-speed.md), so the evaluator adds ``n * delta`` to every time,
``n`` periods to every position and ``n (j - i) q`` to every message's micro-batch,
and evaluates only what is left (the drain).

Times are exact numbers (:mod:`pipesim.exact`: ints or Fractions), so "equal" is
exact equality; nothing is compared within a tolerance. A schedule without such a
pattern (:func:`find_pattern` returns None), a state that does not repeat within
:data:`MAX_CUTS` periods, or a cost that is not exact leaves the evaluation whole.
"""

from __future__ import annotations

from dataclasses import dataclass
from fractions import Fraction

from pipesim.actions import OP_INDEX, Action
from pipesim.exact import Time
from pipesim.schedule import Schedule
from pipesim.step.numbering import action_key

__all__ = ["MAX_CUTS", "Extrapolation", "Pattern", "Repeat", "find_pattern"]

_ACTION_ONLY = {Action}

MAX_CUTS = 64
"""Periods the evaluator records before it gives up waiting for the state to repeat
(the transient of the max-plus system) and evaluates the rest in full."""

_MIN_PERIODS = 4
"""A pattern shorter than this many periods saves too little to look for."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Pattern:
    """Where each rank's order repeats: for every rank ``r`` and every position ``x`` with
    ``starts[r] <= x < ends[r]``, the action at ``x + lengths[r]`` is the action at ``x``
    with its micro-batch ``shift`` higher (same stage, same op).

    >>> from pipesim.schedules import generate
    >>> find_pattern(generate("1f1b", n_ranks=2, n_microbatches=8))
    Pattern(shift=1, lengths=(2, 2), starts=(1, 0), ends=(13, 14))
    """

    shift: int
    """Micro-batches per period (``q``)."""
    lengths: tuple[int, ...]
    """Per rank: actions per period."""
    starts: tuple[int, ...]
    """Per rank: the first position of the repeating run."""
    ends: tuple[int, ...]
    """Per rank: one past the last position whose action repeats ``lengths[r]`` later."""


def work_keys(schedule: Schedule, /) -> list[list[int]] | None:
    """Each rank's order as ints: an action its :func:`pipesim.step.numbering.action_key`
    (stride: the micro-batch count), an overlapped pair of actions of keys ``a`` and ``b``
    ``-(1 + a * K + b)``, where ``K = 4 * n_stages * width`` is the number of action keys
    (so a pair's key moves by ``-(K + 1)`` per micro-batch its parts move on); None when
    an overlapped work has more than two parts.

    >>> from pipesim.schedules import generate
    >>> # rank 0 (stage 0): F0 F1 B0 B1; rank 1 (stage 1, code 4 + op): F0 B0 F1 B1
    >>> work_keys(generate("1f1b", n_ranks=2, n_microbatches=2))
    [[0, 1, 2, 3], [8, 10, 9, 11]]
    >>> # (1F1;0B0) at m = 4, two stages: -(1 + 17 * 32 + 4)
    >>> work_keys(generate("dualpipev", n_ranks=1, n_microbatches=4))[0][4]
    -549
    """
    width = schedule.n_microbatches
    span = 4 * schedule.n_stages * width
    op_index = OP_INDEX
    keys = []
    for order in schedule.orders:
        if set(map(type, order)) <= _ACTION_ONLY:
            # action_key, inlined: the sweep reads every action of every schedule here
            keys.append(
                [(4 * a.stage + op_index[a.op]) * width + a.microbatch for a in order]  # type: ignore[union-attr, operator]
            )
            continue
        row = []
        for work in order:
            parts = [(4 * a.stage + op_index[a.op]) * width + a.microbatch for a in work.parts]
            if len(parts) == 1:
                row.append(parts[0])
            elif len(parts) == 2:
                row.append(-(1 + parts[0] * span + parts[1]))
            else:
                return None
        keys.append(row)
    return keys


def find_pattern(schedule: Schedule, /, *, keys: list[list[int]] | None = None) -> Pattern | None:
    """The repeating run of ``schedule``'s orders (see :class:`Pattern`), with the smallest
    shift that covers the middle of every rank's order; None when there is none (overlapped
    works, a rank whose work is not the same per micro-batch, a shift-variant
    ``happens_before``, fewer than four periods). ``keys``: :func:`work_keys` of
    ``schedule``, when the caller has them. A rank whose order has overlapped pairs
    (DualPipe) runs a different number of works per micro-batch in its warm-up and in its
    steady state: its period is the fewest works that repeat.

    >>> from pipesim.schedules import generate
    >>> find_pattern(generate("interleaved-1f1b", n_ranks=2, n_microbatches=32, virtual=2)).shift
    2
    """
    width = schedule.n_microbatches
    codes = work_keys(schedule) if keys is None else keys
    if codes is None or not all(codes):
        return None
    paired = [min(order) < 0 for order in codes]
    # actions per micro-batch; an order with pairs may split some backwards in two (I and
    # W), so at most this many works per micro-batch
    per_microbatch = []
    for order, pairs in zip(codes, paired, strict=True):
        if pairs:
            per_microbatch.append(-(-(len(order) + sum(k < 0 for k in order)) // width))
        elif len(order) % width:
            return None
        else:
            per_microbatch.append(len(order) // width)
    signals = _signals(schedule)
    if signals is not None and any(paired):
        return None
    span = 4 * schedule.n_stages * width
    # a period spans at most a few passes over the stages (interleaved 1F1B: p micro-batches)
    for shift in range(1, min(width // _MIN_PERIODS, 2 * schedule.n_stages) + 1):
        lengths = []
        runs = []
        for order, k, pairs in zip(codes, per_microbatch, paired, strict=True):
            found = None
            for length in range(1, shift * k + 1) if pairs else (shift * k,):
                run = _run(order, length, shift, width, signals, span)
                if run is not None and run[1] - run[0] >= _MIN_PERIODS * length:
                    found = length, run
                    break
            if found is None:
                break
            lengths.append(found[0])
            runs.append(found[1])
        else:
            return Pattern(
                shift=shift,
                lengths=tuple(lengths),
                starts=tuple(a for a, _ in runs),
                ends=tuple(e for _, e in runs),
            )
    return None


@dataclass(frozen=True, slots=True, kw_only=True)
class Repeat:
    """What the evaluator found when the state at a cut repeated an earlier one: each
    further ``periods`` periods (``periods * shift`` micro-batches) of the run add
    ``delta`` to every time and ``busy[r]`` to rank ``r``'s busy time, and change no
    memory peak (:mod:`pipesim.plan.splice` reads it to price longer runs)."""

    periods: int
    """Periods from the earlier cut to the one that repeated it (``c``)."""
    delta: Time
    """The rise of rank 0's clock over those periods."""
    busy: tuple[Time, ...]
    """Per rank: busy time over those periods."""


_Signals = tuple[dict[int, list[int]], set[int]]


def _signals(schedule: Schedule) -> _Signals | None:
    """The cross-rank ``happens_before`` edges by action key: what each action waits for,
    and which actions are waited for (the evaluator keys signals by action as messages)."""
    if not schedule.happens_before:
        return None
    width, placement = schedule.n_microbatches, schedule.placement
    sources: dict[int, list[int]] = {}
    for a, b in schedule.happens_before:
        if placement[a.stage] != placement[b.stage]:
            sources.setdefault(action_key(b, width), []).append(action_key(a, width))
    return sources, {a for group in sources.values() for a in group}


def _run(
    codes: list[int],
    length: int,
    shift: int,
    width: int,
    signals: _Signals | None,
    span: int,
) -> tuple[int, int] | None:
    """The positions around the middle of ``codes`` whose work recurs ``length`` later,
    ``shift`` micro-batches on (an action's code is ``action_key``: stage and op times
    ``width`` plus micro-batch, so the same stage and op is the difference ``shift`` with
    the micro-batch still below ``width``; a pair's, :func:`work_keys`, moves by
    ``-shift (span + 1)``), waiting for and sending the same signals shifted."""
    limit = len(codes) - length
    if limit <= 0:
        return None
    top = width - shift
    pair_step = shift * (span + 1)

    def repeats(x: int) -> bool:
        early, late = codes[x], codes[x + length]
        if early < 0:
            first, second = divmod(-early - 1, span)
            return early - late == pair_step and first % width < top and second % width < top
        if late - early != shift or early % width >= top:
            return False
        if signals is None:
            return True
        sources, senders = signals
        return (early in senders) == (late in senders) and sorted(
            a + shift for a in sources.get(early, ())
        ) == sorted(sources.get(late, ()))

    middle = (len(codes) - length) // 2
    if not repeats(middle):
        return None
    start = middle
    while start > 0 and repeats(start - 1):
        start -= 1
    end = middle + 1
    while end < limit and repeats(end):
        end += 1
    return start, end


class Extrapolation:
    """The evaluator's bookkeeping at each cut: the states seen, and the jump once one
    repeats. The evaluator owns the state (lists and dicts it mutates in place); this
    object reads it at a cut and, on a repeat, shifts it ``n`` periods on."""

    def __init__(self, pattern: Pattern) -> None:
        self.pattern = pattern
        self.cut = 0
        self.seen: dict[tuple[object, ...], int] = {}
        self.refs: list[Time] = []
        self.busy: list[tuple[Time, ...]] = []
        self.repeat: Repeat | None = None
        """Set once the state at a cut repeats an earlier one."""

    def limits(self) -> list[int]:
        """Positions each rank may run up to before the next cut."""
        p = self.pattern
        return [a + self.cut * n for a, n in zip(p.starts, p.lengths, strict=True)]

    def at_cut(
        self,
        *,
        positions: list[int],
        clock: list[Time],
        held: list[int],
        count: list[int],
        busy: list[Time],
        avail: dict[int, Time],
        sleeping: dict[int, int],
        slots: dict[tuple[int, int], list[Time]],
        makespan: Time,
    ) -> tuple[list[int] | None, Time]:
        """At a stall with every rank at its limit or asleep: the next limits (None: the
        search is over, run the rest in full) and the makespan so far (moved on by a jump)."""
        p = self.pattern
        limits = self.limits()
        if all(k >= a for k, a in zip(positions, p.starts, strict=True)):
            if not _exact(clock, avail, slots):
                return None, makespan
            ref = clock[0]
            moved = self.cut * p.shift
            state = (
                tuple(
                    (k - lim, t - ref, h, c)
                    for k, lim, t, h, c in zip(positions, limits, clock, held, count, strict=True)
                ),
                tuple(sorted((key - moved, t - ref) for key, t in avail.items())),
                tuple(sorted((key - moved, rank) for key, rank in sleeping.items())),
                tuple(
                    (pair, tuple(sorted(t - ref for t in q))) for pair, q in sorted(slots.items())
                ),
            )
            earlier = self.seen.get(state)
            if earlier is not None:
                self.repeat = Repeat(
                    periods=self.cut - earlier,
                    delta=ref - self.refs[earlier],
                    busy=tuple(b - e for b, e in zip(busy, self.busy[earlier], strict=True)),
                )
                return None, self._jump(
                    earlier, ref, positions, clock, busy, avail, sleeping, slots, makespan
                )
            self.seen[state] = len(self.refs)
            self.refs.append(ref)
            self.busy.append(tuple(busy))
        else:  # the transient: some rank has not reached the repeating run yet
            self.refs.append(clock[0])
            self.busy.append(tuple(busy))
        self.cut += 1
        nxt = self.limits()
        if self.cut > MAX_CUTS or any(lim > e for lim, e in zip(nxt, p.ends, strict=True)):
            return None, makespan
        return nxt, makespan

    def _jump(
        self,
        earlier: int,
        ref: Time,
        positions: list[int],
        clock: list[Time],
        busy: list[Time],
        avail: dict[int, Time],
        sleeping: dict[int, int],
        slots: dict[tuple[int, int], list[Time]],
        makespan: Time,
    ) -> Time:
        """Move the state at this cut ``n`` cycles of ``cut - earlier`` periods on, as far
        as every rank's run reaches; the makespan so far is the last cycle's latest end
        (every rank ran in it), so it moves on by ``n delta`` too."""
        p = self.pattern
        cycle = self.cut - earlier
        delta = ref - self.refs[earlier]
        n = min(
            (e - (a + self.cut * length)) // (cycle * length)
            for a, e, length in zip(p.starts, p.ends, p.lengths, strict=True)
        )
        if n <= 0 or delta < 0:
            return makespan
        gone = n * delta
        for r, length in enumerate(p.lengths):
            positions[r] += n * cycle * length
            clock[r] += gone
            busy[r] += n * (busy[r] - self.busy[earlier][r])
        keys = n * cycle * p.shift
        moved_avail = {key + keys: t + gone for key, t in avail.items()}
        avail.clear()
        avail.update(moved_avail)
        moved_sleeping = {key + keys: rank for key, rank in sleeping.items()}
        sleeping.clear()
        sleeping.update(moved_sleeping)
        for queue in slots.values():
            queue[:] = [t + gone for t in queue]  # adding a constant keeps it a heap
        return makespan + gone


def _exact(
    clock: list[Time], avail: dict[int, Time], slots: dict[tuple[int, int], list[Time]]
) -> bool:
    """Whether every time is an exact number (equality of differences is then exact)."""
    exact = (int, Fraction)
    return (
        all(type(t) in exact for t in clock)
        and all(type(t) in exact for t in avail.values())
        and all(type(t) in exact for q in slots.values() for t in q)
    )
