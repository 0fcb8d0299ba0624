"""The greedy list scheduler: F, I and W placed one at a time from the costs.

After Qi et al., "Zero Bubble Pipeline Parallelism", ICLR 2024, sec. 3 and
appendix G (the heuristic that seeds their ILP; the zero-bubble repository's
``manual_order``): the input gradient ``I`` is on the critical path and runs
as soon as it can; forwards run while the memory limit allows; ``W`` fills
the gaps and is forced when memory must be freed.

The scheduler is a discrete-event simulation of the engine's model (per-stage
durations, message latency and bytes / bandwidth, and the memory model of
:mod:`pipesim.step.memory`). Its memory book reserves, when F starts, the most the
micro-batch will hold on the stage (:func:`pipesim.step.memory.microbatch_peak`: the
activations, or the ``weight_grad_bytes`` I hands to W if they are more), lets
I free down to the ``weight_grad_bytes`` and W the rest, so the engine's level
never exceeds the book. Each rank, when it is free, picks among the actions
whose inputs have arrived:

1. a ready ``I`` (the latest stage first: the longest chain still ahead);
2. else a ready ``F`` (the latest stage first, finishing micro-batches it
   already holds), if the rank's memory and in-flight cap allow it; a
   micro-batch new to the rank is admitted only while the bytes of its later
   stages on the rank still fit (``reserve``), so a V placement cannot fill
   its memory with first-chunk forwards and starve the second chunk;
3. else the oldest pending ``W``.

With ``patient`` the rank also looks ahead: it starts an F or a W only if it
ends before a gradient it already knows is on its way arrives, and otherwise
waits for that gradient (the heuristic's "fill a bubble only if it fits").
With ``pace`` micro-batches enter stage 0 at most one per period, so that
under a tight memory limit (a V at p/2 or p/3 micro-batches) they flow
evenly instead of in bursts that wait out a round trip.

With ``block`` (the V placement) a rank follows a controllable-memory building
block instead (:mod:`pipesim.schedules.controllable`, Qi et al. NeurIPS 2024):
the block's repeated order, where an idle rank pulls in the first later pass
that is ready and keeps the order's memory book within the limit, and after
its last forward runs ready ``I`` before ``W``; that is the V-Half / V-Min
squeeze with the real durations, messages and byte limit.
With ``pair`` (the V placement, ``Problem.overlap_fb``) a rank about to run a
ready ``I`` of one chunk runs, if its other chunk's next forward is ready and
admitted, the two as one overlapped unit: that forward and the *full* backward
``B`` (DualPipe's F&B pair, DeepSeek-AI 2024, sec. 3.2.1; its duration is the cost
model's, :func:`pipesim.synth.problem.fb_pairs`), where
:func:`pipesim.synth.policies.pair_pays` says the pair pays.
Each policy (:mod:`pipesim.synth.policies`) is one candidate;
:func:`pipesim.synth.synthesize` evaluates them all with the exact evaluator and
keeps the best. Orders come from an
execution, so they are complete and cannot deadlock; memory peaks depend on
the order only, so the limit this scheduler respects is the one the engine
measures.
"""

from __future__ import annotations

import functools
import heapq
import itertools
import math
from collections import deque
from dataclasses import dataclass
from fractions import Fraction

from pipesim.actions import Action, Op, Overlap, Work, action_code
from pipesim.exact import Time
from pipesim.schedules.controllable import repeated_orders
from pipesim.step.cost_tables import message_bytes
from pipesim.step.memory import microbatch_peak, op_effects
from pipesim.synth.policies import Policy, pair_pays, policies
from pipesim.synth.problem import Problem, durations_of, fb_pairs

__all__ = [
    "GreedyRun",
    "Policy",
    "action_table",
    "greedy_orders",
    "greedy_run",
    "links_never_queue",
    "policies",
]

#: How far down its block order an idle rank looks for a pass to pull in.
_LOOKAHEAD = 96


@dataclass(frozen=True, slots=True, kw_only=True)
class GreedyRun:
    """What one greedy run built, and when its last action ended in the run."""

    orders: list[list[Work]]
    makespan: Time
    """The engine's makespan of these orders whenever no message queues for a link
    (:func:`links_never_queue`): each action starts when its rank is free and its
    inputs are there, as in the engine."""


def greedy_orders(problem: Problem, policy: Policy) -> list[list[Work]] | None:
    """Per-rank orders built by ``policy``; None if the policy gets stuck (memory)."""
    run = greedy_run(problem, policy)
    return None if run is None else run.orders


def greedy_run(problem: Problem, policy: Policy) -> GreedyRun | None:
    """:func:`greedy_orders` with the run's makespan."""
    greedy = _Greedy(problem, policy)
    orders = greedy.run()
    return None if orders is None else GreedyRun(orders=orders, makespan=greedy.makespan())


def links_never_queue(problem: Problem, /) -> bool:
    """Whether every cross-rank message holds its link for no time (no bytes, or no
    bandwidth limit) and communication overlaps compute: then no message waits for a
    link, and the greedy's times are the engine's.

    >>> from pipesim.synth.problem import make_problem
    >>> links_never_queue(make_problem(n_ranks=2, n_microbatches=2, memory_limit=2))
    True
    """
    costs, place = problem.costs, problem.placement
    if costs.blocking_sends:
        return False
    for s in range(problem.n_stages - 1):
        here, there = place[s], place[s + 1]
        if here == there:
            continue
        out_f = Action(stage=s, op=Op.F, microbatch=0)
        out_i = Action(stage=s + 1, op=Op.I, microbatch=0)
        if costs.link_between(here, there).occupancy(message_bytes(costs, out_f)):
            return False
        if costs.link_between(there, here).occupancy(message_bytes(costs, out_i)):
            return False
    return True


@functools.lru_cache(maxsize=4)
def action_table(n_stages: int, n_microbatches: int) -> dict[Op, tuple[tuple[Action, ...], ...]]:
    """``table[op][stage][microbatch]``, made once for every policy's run (building the
    actions anew was a fifth of a run at p = 32, m = 256)."""
    return {
        op: tuple(
            tuple(Action(stage=s, op=op, microbatch=k) for k in range(n_microbatches))
            for s in range(n_stages)
        )
        for op in (Op.F, Op.B, Op.I, Op.W)
    }


class _Greedy:
    """State of one greedy run (plain class: this is the hot loop)."""

    def __init__(self, problem: Problem, policy: Policy) -> None:
        self.pb = problem
        self.policy = policy
        n_stages, m = problem.n_stages, problem.n_microbatches
        costs, mem = problem.costs, problem.memory_costs
        # Durations with the dispatch and message overheads, as the engine takes them.
        table = durations_of(problem)
        self.f = [table[action_code(s, Op.F)] for s in range(n_stages)]
        self.i = [table[action_code(s, Op.I)] for s in range(n_stages)]
        self.w = [table[action_code(s, Op.W)] for s in range(n_stages)]
        # Memory from the one memory model (pipesim.step.memory). The book: F reserves the
        # micro-batch's peak on the stage (what I adds at its start included), I frees
        # at its end what it frees in the engine, W the rest; the engine's level is at
        # most the book's at every instant.
        effects = [op_effects(mem.stage(s), forward_only=False) for s in range(n_stages)]
        self.peak = [microbatch_peak(mem.stage(s)) for s in range(n_stages)]
        self.i_frees = [e[2].end_bytes for e in effects]
        self.w_frees = [e[3].end_bytes for e in effects]
        # Message delay from stage s to s + 1 (F) and from s + 1 to s (I); 0 on one rank.
        place = problem.placement
        self.f_delay: list[Time] = []
        self.i_delay: list[Time] = []
        for s in range(n_stages - 1):
            here, there = place[s], place[s + 1]
            out_f = Action(stage=s, op=Op.F, microbatch=0)
            out_i = Action(stage=s + 1, op=Op.I, microbatch=0)
            f_link, i_link = costs.link_between(here, there), costs.link_between(there, here)
            same = here == there
            self.f_delay.append(0 if same else f_link.transfer_time(message_bytes(costs, out_f)))
            self.i_delay.append(0 if same else i_link.transfer_time(message_bytes(costs, out_i)))
        self.stages = [problem.stages_of(r) for r in range(problem.n_ranks)]
        self.last_stage = n_stages - 1
        self.actions = action_table(n_stages, m)
        self.down = [tuple(sorted(st, reverse=True)) for st in self.stages]
        self.first = [min(st) for st in self.stages]
        self.mb_bytes = [sum(self.peak[s] for s in st) for st in self.stages]
        self.f_next = [0] * n_stages
        self.i_next = [0] * n_stages
        self.f_end: list[list[Time | None]] = [[None] * m for _ in range(n_stages)]
        self.i_end: list[list[Time | None]] = [[None] * m for _ in range(n_stages)]
        self.pending_w: list[deque[tuple[int, int]]] = [deque() for _ in self.stages]
        self.held = [0] * problem.n_ranks
        self.reserved = [0] * problem.n_ranks
        self.inflight = [0] * problem.n_ranks
        self.free_at: list[Time] = [0] * problem.n_ranks
        self.left = [3 * m * len(st) for st in self.stages]
        self.orders: list[list[Work]] = [[] for _ in self.stages]
        self.f_start0: Time = 0
        period: Time = max(
            sum((self.f[s] + self.i[s] + self.w[s] for s in st), start=0) for st in self.stages
        )
        self.pace_gap: Time = period * policy.pace
        self.block: list[list[Action]] = []
        if policy.block:
            self.block = repeated_orders(policy.block, problem.n_ranks, problem.n_microbatches)
        self.forwards_left = [m * len(st) for st in self.stages]
        # Per backward stage: the rank's other chunk and the pair's duration, where the
        # policy pairs them (see the module).
        self.partner: dict[int, tuple[int, Time]] = {}
        if policy.pair:
            for (f_stage, b_stage), duration in fb_pairs(problem).items():
                if pair_pays(problem, policy.pair, f_stage, b_stage):
                    self.partner[b_stage] = (f_stage, duration)
        self._to_whole_numbers()
        # The book's change per op of a stage (F reserves the micro-batch's peak, I and W
        # free at their ends), for the building block's look-ahead.
        self.book: dict[tuple[int, Op], int] = {}
        for s in range(n_stages):
            self.book[(s, Op.F)] = self.peak[s]
            self.book[(s, Op.I)] = self.i_frees[s]
            self.book[(s, Op.W)] = self.w_frees[s]

    def _to_whole_numbers(self) -> None:
        """Count time in units of one over the durations' common denominator: the run then
        adds and compares ints, exactly (rational times, e.g. half-stage chunks, made
        Fraction arithmetic most of a run); :meth:`makespan` converts back."""
        times = [*self.f, *self.i, *self.w, *self.f_delay, *self.i_delay, self.pace_gap]
        times += [duration for _, duration in self.partner.values()]
        self.scale = math.lcm(*(Fraction(x).denominator for x in times))
        if self.scale == 1:
            return

        def whole(values: list[Time]) -> list[Time]:
            return [int(x * self.scale) for x in values]

        self.f, self.i, self.w = whole(self.f), whole(self.i), whole(self.w)
        self.f_delay, self.i_delay = whole(self.f_delay), whole(self.i_delay)
        self.pace_gap = int(self.pace_gap * self.scale)
        self.partner = {b: (f, int(d * self.scale)) for b, (f, d) in self.partner.items()}

    def makespan(self) -> Time:
        """When the run's last action ended, in the cost model's unit."""
        end = Fraction(max(self.free_at), self.scale)
        return end.numerator if end.denominator == 1 else end

    # -- arrivals -------------------------------------------------------------------------
    def _f_arrival(self, s: int, k: int) -> Time | None:
        if s == 0:
            return 0
        end = self.f_end[s - 1][k]
        return None if end is None else end + self.f_delay[s - 1]

    def _f_arrival_paced(self, s: int, k: int) -> Time | None:
        """:meth:`_f_arrival`, held back by the policy's pace on stage 0."""
        arrival = self._f_arrival(s, k)
        if arrival is not None and s == 0 and self.policy.pace and k:
            arrival = max(arrival, self.f_start0 + self.pace_gap)
        return arrival

    def _i_arrival(self, s: int, k: int) -> Time | None:
        if self.f_end[s][k] is None:
            return None
        if s == self.last_stage:
            return self.f_end[s][k]
        end = self.i_end[s + 1][k]
        return None if end is None else end + self.i_delay[s]

    # -- the loop -------------------------------------------------------------------------
    def run(self) -> list[list[Work]] | None:
        heap: list[tuple[Time, int]] = [(0, r) for r in range(self.pb.n_ranks)]
        while heap:
            t, r = heapq.heappop(heap)
            if t < self.free_at[r] or not self.left[r]:
                continue
            wake = self._step(r, t, heap)
            if wake is not None:
                heapq.heappush(heap, (wake, r))
        return self.orders if not any(self.left) else None

    def _step(self, r: int, t: Time, heap: list[tuple[Time, int]]) -> Time | None:
        """Run one action on rank ``r`` at ``t`` if the policy allows; the next wake-up."""
        if self.block:
            return self._block_step(r, t, heap)
        m = self.pb.n_microbatches
        next_grad: Time | None = None
        for s in self.down[r]:
            k = self.i_next[s]
            if k < m:
                arrival = self._i_arrival(s, k)
                if arrival is not None:
                    if arrival <= t:
                        if s in self.partner:
                            forward = self._partner_forward(r, t, s)
                            if forward is not None:
                                return self._run_pair(r, t, forward, s, k, heap)
                        return self._run(r, t, self.actions[Op.I][s][k], heap)
                    next_grad = arrival if next_grad is None else min(next_grad, arrival)
        patient_f = next_grad is not None and "F" in self.policy.patient
        patient_w = next_grad is not None and "W" in self.policy.patient
        defer = self.policy.defer
        if defer is not None and len(self.pending_w[r]) > defer[r]:
            s, k = self.pending_w[r].popleft()
            return self._run(r, t, self.actions[Op.W][s][k], heap)
        next_input: Time | None = None
        blocked_by_memory = False
        for s in self.down[r]:
            k = self.f_next[s]
            if k >= m:
                continue
            arrival = self._f_arrival_paced(s, k)
            if arrival is None:
                continue
            if arrival > t:
                next_input = arrival if next_input is None else min(next_input, arrival)
                continue
            if not self._admits(r, s):
                blocked_by_memory = True
                continue
            if patient_f and t + self.f[s] > next_grad:  # type: ignore[operator]
                continue
            return self._run(r, t, self.actions[Op.F][s][k], heap)
        if self.pending_w[r]:
            s, k = self.pending_w[r][0]
            if not patient_w or blocked_by_memory or t + self.w[s] <= next_grad:  # type: ignore[operator]
                self.pending_w[r].popleft()
                return self._run(r, t, self.actions[Op.W][s][k], heap)
        wakes = [x for x in (next_grad, next_input) if x is not None and x > t]
        return min(wakes) if wakes else None

    def _ready_at(self, action: Action) -> Time | None:
        """When ``action``'s inputs are (or will be) there; None while unknown."""
        s, k = action.stage, action.microbatch
        if action.op is Op.F:
            return self._f_arrival(s, k)
        if action.op is Op.I:
            return self._i_arrival(s, k)
        return self.i_end[s][k]

    def _block_step(self, r: int, t: Time, heap: list[tuple[Time, int]]) -> Time | None:
        """The building block's rule (see the module): its next pass, else a later ready
        one that keeps the book within the limit; after the last forward, I before W."""
        order = self.block[r]
        wake: Time | None = None
        if not self.forwards_left[r]:
            for op in (Op.I, Op.W):
                seen: set[int] = set()
                for index, action in enumerate(order):
                    if action.op is op and action.stage not in seen:
                        seen.add(action.stage)
                        at = self._ready_at(action)
                        if at is not None and at <= t:
                            return self._block_run(r, t, index, heap)
                        if at is not None and (wake is None or at < wake):
                            wake = at
            return wake
        held = highest = self.held[r]
        limit = self.pb.limit_bytes[r]
        seen_keys: set[tuple[int, Op]] = set()
        # Patient: a later pass is pulled in only if it ends before the next one's inputs
        # are known to arrive (the heuristic's "fill a bubble only if it fits").
        due = self._ready_at(order[0]) if self.policy.patient else None
        if due is not None and due <= t:  # ready, but over the limit: anything may go
            due = None
        for index, action in enumerate(itertools.islice(order, _LOOKAHEAD)):
            key = (action.stage, action.op)
            change = self.book[key]
            if key not in seen_keys:
                seen_keys.add(key)
                at = self._ready_at(action)
                # Moved here, it raises the book at every pass before its old place.
                if (
                    at is not None
                    and at <= t
                    and (change <= 0 or highest + change <= limit)
                    and (due is None or not index or t + self._duration(action) <= due)
                    and (not index or action.op.value in self.policy.pull)
                ):
                    return self._block_run(r, t, index, heap)
                if at is not None and at > t and (wake is None or at < wake):
                    wake = at
            held += change
            highest = max(highest, held)
        return wake

    def _duration(self, action: Action) -> Time:
        s, op = action.stage, action.op
        return self.f[s] if op is Op.F else self.i[s] if op is Op.I else self.w[s]

    def _block_run(self, r: int, t: Time, index: int, heap: list[tuple[Time, int]]) -> Time:
        action = self.block[r].pop(index)
        if action.op is Op.F:
            self.forwards_left[r] -= 1
        elif action.op is Op.W:
            self.pending_w[r].remove((action.stage, action.microbatch))
        return self._run(r, t, action, heap)

    def _partner_forward(self, r: int, t: Time, s: int) -> Action | None:
        """The next forward of the chunk paired with backward stage ``s``, if it is ready
        at ``t`` and admitted (memory, in-flight cap)."""
        f_stage = self.partner[s][0]
        k = self.f_next[f_stage]
        if k >= self.pb.n_microbatches:
            return None
        arrival = self._f_arrival_paced(f_stage, k)
        if arrival is None or arrival > t or not self._admits(r, f_stage):
            return None
        return self.actions[Op.F][f_stage][k]

    def _run_pair(
        self, r: int, t: Time, forward: Action, s: int, k: int, heap: list[tuple[Time, int]]
    ) -> Time:
        """Run ``forward`` with the full backward of stage ``s``, micro-batch ``k``, as one
        unit: both outputs leave when it ends; the book takes the forward's bytes and
        frees all of the backward's (B frees what I and W would)."""
        f_stage = forward.stage
        backward = self.actions[Op.B][s][k]
        self.orders[r].append(Overlap(parts=(forward, backward)))
        self.left[r] -= 3  # F, and I and W's work in B
        pb = self.pb
        end = t + self.partner[s][1]
        if f_stage == 0:
            self.f_start0 = t
        self.f_end[f_stage][forward.microbatch] = end
        self.f_next[f_stage] += 1
        self.i_end[s][k] = end
        self.i_next[s] += 1
        self.held[r] += self.peak[f_stage] + self.i_frees[s] + self.w_frees[s]
        if f_stage == self.first[r]:
            self.reserved[r] += self.mb_bytes[r] - self.peak[f_stage]
        else:
            self.reserved[r] -= self.peak[f_stage]
        sent = end
        if f_stage < self.last_stage and pb.placement[f_stage + 1] != r:
            heapq.heappush(heap, (end + self.f_delay[f_stage], pb.placement[f_stage + 1]))
            sent = max(sent, end + self.f_delay[f_stage])
        if s > 0 and pb.placement[s - 1] != r:
            heapq.heappush(heap, (end + self.i_delay[s - 1], pb.placement[s - 1]))
            sent = max(sent, end + self.i_delay[s - 1])
        self.free_at[r] = sent if pb.costs.blocking_sends else end
        return self.free_at[r]

    def _admits(self, r: int, s: int) -> bool:
        limit = self.pb.limit_bytes[r]
        if s != self.first[r]:  # a later stage of a micro-batch the rank already holds
            if self.policy.reserve == "all":
                return True  # its bytes were reserved when the micro-batch was admitted
            return self.held[r] + self.peak[s] <= limit
        caps = self.policy.caps
        if caps is not None and self.inflight[r] >= caps[r]:
            return False
        if self.policy.reserve == "all":
            return self.held[r] + self.reserved[r] + self.mb_bytes[r] <= limit
        if self.policy.reserve == "one":  # keep room for one micro-batch's later stages
            return self.held[r] + self.mb_bytes[r] <= limit
        return self.held[r] + self.peak[s] <= limit

    def _run(self, r: int, t: Time, action: Action, heap: list[tuple[Time, int]]) -> Time:
        s, k, op = action.stage, action.microbatch, action.op
        self.orders[r].append(action)
        self.left[r] -= 1
        pb = self.pb
        if op is Op.F:
            if s == 0:
                self.f_start0 = t
            end = t + self.f[s]
            self.f_end[s][k] = end
            self.f_next[s] += 1
            self.held[r] += self.peak[s]
            self.inflight[r] += 1
            if s == self.first[r]:
                self.reserved[r] += self.mb_bytes[r] - self.peak[s]
            else:
                self.reserved[r] -= self.peak[s]
            if s < self.last_stage and pb.placement[s + 1] != r:
                heapq.heappush(heap, (end + self.f_delay[s], pb.placement[s + 1]))
            sent = end + self.f_delay[s] if s < self.last_stage else end
        elif op is Op.I:
            end = t + self.i[s]
            self.i_end[s][k] = end
            self.i_next[s] += 1
            self.held[r] += self.i_frees[s]
            self.inflight[r] -= 1
            self.pending_w[r].append((s, k))
            if s > 0 and pb.placement[s - 1] != r:
                heapq.heappush(heap, (end + self.i_delay[s - 1], pb.placement[s - 1]))
            sent = end + self.i_delay[s - 1] if s > 0 else end
        else:
            end = t + self.w[s]
            self.held[r] += self.w_frees[s]
            sent = end
        # Without overlapped communication the sender waits for its message (costs.py).
        self.free_at[r] = max(end, sent) if pb.costs.blocking_sends else end
        return self.free_at[r]
