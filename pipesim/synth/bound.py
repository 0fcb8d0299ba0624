"""A lower bound on the makespan of any schedule of a problem, in closed form.

Two facts no schedule escapes (links only ever add delay, so the bound holds
for the engine's contended links too):

- rank ``r`` cannot start before the first micro-batch's forward reaches its
  first stage (the forwards of every earlier stage plus the messages between
  them), and then has its own work to do: ``head_r + work_r``;
- one micro-batch must pass forward through every stage, back through every
  input gradient, and end with stage 0's weight gradient: the critical path
  of a single micro-batch.

For ``F = I = W`` and one stage per rank the first bound is met by ZB-H2's
parallelogram, ``(p - 1) F + 3 m F``, so the gap of a good schedule is small.

>>> from pipesim.synth.problem import make_problem
>>> lower_bound(make_problem(n_ranks=4, n_microbatches=8, memory_limit=8))
27
"""

from __future__ import annotations

from pipesim.actions import Action, Op
from pipesim.exact import Time
from pipesim.step import message_bytes
from pipesim.synth.problem import Problem

__all__ = ["lower_bound"]


def lower_bound(problem: Problem, /) -> Time:
    """The larger of the two bounds in the module docstring."""
    costs, place = problem.costs, problem.placement
    n_stages, m = problem.n_stages, problem.n_microbatches

    def hop(producer: Action, to_stage: int) -> Time:
        if place[producer.stage] == place[to_stage]:
            return 0
        return costs.link.transfer_time(message_bytes(costs, producer))

    # Earliest start of each stage's first forward.
    head: list[Time] = [0] * n_stages
    for s in range(1, n_stages):
        prev = Action(stage=s - 1, op=Op.F, microbatch=0)
        head[s] = head[s - 1] + costs.stage(s - 1).forward + hop(prev, s)
    bound: Time = 0
    for rank in range(problem.n_ranks):
        stages = problem.stages_of(rank)
        work = sum(
            (
                costs.stage(s).forward + costs.stage(s).input_grad + costs.stage(s).weight_grad
                for s in stages
            ),
            start=0,
        )
        bound = max(bound, min(head[s] for s in stages) + m * work)
    # One micro-batch down and back up, then stage 0's W.
    path: Time = head[-1] + costs.stage(n_stages - 1).forward
    for s in range(n_stages - 1, -1, -1):
        path += costs.stage(s).input_grad
        if s > 0:
            path += hop(Action(stage=s, op=Op.I, microbatch=0), s - 1)
    path += costs.stage(0).weight_grad
    return max(bound, path)
