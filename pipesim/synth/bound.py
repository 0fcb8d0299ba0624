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
(:func:`pipesim.step.cost_tables`).

For ``F = I = W`` and one stage per rank the first bound is met by ZB-H2's
parallelogram, ``(p - 1) F + 3 m F``, so the gap of a good schedule is small.

>>> from pipesim.synth.problem import make_problem
>>> lower_bound(make_problem(n_ranks=4, n_microbatches=8, memory_limit=8))
27
"""

from __future__ import annotations

from pipesim.actions import OP_INDEX, Action, Op
from pipesim.exact import Time
from pipesim.step import message_bytes
from pipesim.synth.problem import Problem, durations_of

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

    def f(s: int) -> Time:
        return table[4 * s + OP_INDEX[Op.F]]

    def i(s: int) -> Time:
        return table[4 * s + OP_INDEX[Op.I]]

    def w(s: int) -> Time:
        return table[4 * s + OP_INDEX[Op.W]]

    def back(s: int) -> Time:  # a full backward B, or I then W: whichever is cheaper
        return min(table[4 * s + OP_INDEX[Op.B]], i(s) + w(s))

    # Earliest start of each stage's first forward.
    head: list[Time] = [0] * n_stages
    for s in range(1, n_stages):
        prev = Action(stage=s - 1, op=Op.F, microbatch=0)
        head[s] = head[s - 1] + f(s - 1) + hop(prev, s)
    bound: Time = 0
    for rank in range(problem.n_ranks):
        stages = problem.stages_of(rank)
        work = sum((f(s) + back(s) for s in stages), start=0)
        bound = max(bound, min(head[s] for s in stages) + m * work)
    # One micro-batch down and back up: each stage's input gradient (I, or all of B),
    # and stage 0's whole backward last.
    path: Time = head[-1] + f(n_stages - 1)
    for s in range(n_stages - 1, 0, -1):
        path += min(i(s), table[4 * s + OP_INDEX[Op.B]])
        path += hop(Action(stage=s, op=Op.I, microbatch=0), s - 1)
    path += back(0)
    return max(bound, path)


def split_is_cheapest(problem: Problem, /) -> bool:
    """Whether I + W costs no more than a full B on every stage (overheads included).

    Then a schedule that splits every backward loses nothing, and a bound proven
    over split schedules (the exact solver's) bounds every schedule.
    """
    table = durations_of(problem)
    return all(
        table[4 * s + OP_INDEX[Op.I]] + table[4 * s + OP_INDEX[Op.W]]
        <= table[4 * s + OP_INDEX[Op.B]]
        for s in range(problem.n_stages)
    )
