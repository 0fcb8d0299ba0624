"""A lower bound on the makespan of any schedule of a problem, in closed form.

Two facts no schedule escapes (links only ever add delay, so the bound holds
for the engine's contended links too):

- rank ``r`` cannot start before the first micro-batch's forward reaches its
  first stage (the forwards of every earlier stage plus the messages between
  them), and then has its own work to do: ``head_r + work_r`` (a backward
  counted as the cheaper of a full B and I + W, so that schedules without the
  split are bounded too);
- one micro-batch must pass forward through every stage, back through every
  input gradient, and end with stage 0's backward: the critical path of a
  single micro-batch.

Durations include the dispatch and message overheads the engine charges
(:func:`pipesim.step.cost_tables.cost_tables`). Where overlapped F&B pairs are allowed
(``Problem.overlap_fb``), a pair may do a forward of one chunk and the full
backward of the other in less than their sum: a rank's work then counts each
such forward-backward couple at the cheaper of the two, and a pass on the path
takes at least the shorter of its own time and a pair's that holds it.

For ``F = I = W`` and one stage per rank the first bound is met by ZB-H2's
parallelogram, ``(p - 1) F + 3 m F``, so the gap of a good schedule is small.

>>> from pipesim.synth.problem import make_problem
>>> lower_bound(make_problem(n_ranks=4, n_microbatches=8, memory_limit=8))
27
"""

from __future__ import annotations

from pipesim.actions import Action, Op, action_code
from pipesim.exact import Time
from pipesim.step.cost_tables import message_bytes
from pipesim.synth.problem import Problem, durations_of, fb_pairs

__all__ = ["lower_bound", "split_is_cheapest"]


def lower_bound(problem: Problem, /) -> Time:
    """The larger of the two bounds in the module docstring."""
    costs, place = problem.costs, problem.placement
    n_stages, m = problem.n_stages, problem.n_microbatches

    def hop(producer: Action, to_stage: int) -> Time:
        if place[producer.stage] == place[to_stage]:
            return 0
        return costs.link.transfer_time(message_bytes(costs, producer))

    table = durations_of(problem)  # overheads included, as the engine takes them

    def d(s: int, op: Op) -> Time:
        return table[action_code(s, op)]

    def f(s: int) -> Time:
        return d(s, Op.F)

    def back(s: int) -> Time:  # a full backward B, or I then W: whichever is cheaper
        return min(d(s, Op.B), d(s, Op.I) + d(s, Op.W))

    pairs = fb_pairs(problem)
    # A pass on the path ends no sooner than its own duration or that of a pair holding
    # it; its input gradient comes with I or with all of B.
    shortest: dict[tuple[int, Op], Time] = {}
    for s in range(n_stages):
        shortest[s, Op.F], shortest[s, Op.B] = f(s), back(s)
        shortest[s, Op.I] = min(d(s, Op.I), d(s, Op.B))
    for (f_stage, b_stage), duration in pairs.items():
        shortest[f_stage, Op.F] = min(shortest[f_stage, Op.F], duration)
        for op in (Op.B, Op.I):
            shortest[b_stage, op] = min(shortest[b_stage, op], duration)

    def work_of(stages: tuple[int, ...]) -> Time:  # one micro-batch's work on a rank
        if pairs:  # its two chunks: F of one and B of the other, apart or as a pair
            a, b = stages
            return min(f(a) + back(b), pairs[a, b]) + min(f(b) + back(a), pairs[b, a])
        return sum((f(s) + back(s) for s in stages), start=0)

    # Earliest start of each stage's first forward.
    head: list[Time] = [0] * n_stages
    for s in range(1, n_stages):
        prev = Action(stage=s - 1, op=Op.F, microbatch=0)
        head[s] = head[s - 1] + shortest[s - 1, Op.F] + hop(prev, s)
    bound: Time = 0
    for rank in range(problem.n_ranks):
        stages = problem.stages_of(rank)
        bound = max(bound, min(head[s] for s in stages) + m * work_of(stages))
    # One micro-batch down and back up: each stage's input gradient (I, or all of B),
    # and stage 0's whole backward last.
    path: Time = head[-1] + shortest[n_stages - 1, Op.F]
    for s in range(n_stages - 1, 0, -1):
        path += shortest[s, Op.I]
        path += hop(Action(stage=s, op=Op.I, microbatch=0), s - 1)
    path += shortest[0, Op.B]
    return max(bound, path)


def split_is_cheapest(problem: Problem, /) -> bool:
    """Whether I + W costs no more than a full B on every stage (overheads included)
    and no overlapped F&B pair is allowed.

    Then a schedule that splits every backward loses nothing, and a bound proven
    over split schedules (the exact solver's) bounds every schedule.
    """
    if problem.overlap_fb:
        return False
    table = durations_of(problem)
    return all(
        table[action_code(s, Op.I)] + table[action_code(s, Op.W)] <= table[action_code(s, Op.B)]
        for s in range(problem.n_stages)
    )
