"""Schedules made for the costs: synthesis under a memory limit.

``synthesize(n_ranks=P, n_microbatches=M, memory_limit=L, costs=...)`` builds
per-rank orders of F, I and W for the given per-stage costs so that no rank
holds more than ``L`` micro-batches of activations (or ``L`` bytes), evaluates
them with pipesim's exact evaluator, and returns the fastest schedule found
next to the best built-in one and a lower bound.

- :mod:`~pipesim.synth.problem`: the problem (placement, memory limit);
- :mod:`~pipesim.synth.heuristic`: the greedy list scheduler (Qi et al. 2024);
- :mod:`~pipesim.synth.policies`: the settings of the greedy that are tried;
- :mod:`~pipesim.synth.bound`: a closed-form lower bound;
- :mod:`~pipesim.synth.cpsat`: CP-SAT for small problems (optional ``exact`` extra);
- :mod:`~pipesim.synth.synthesize`: candidates, evaluation, the winner.

>>> result = synthesize(n_ranks=4, n_microbatches=8, memory_limit=8)
>>> result.metrics.makespan == result.lower_bound  # F = I = W: ZB-H2's parallelogram
True
"""

from __future__ import annotations

from pipesim.synth.bound import lower_bound
from pipesim.synth.heuristic import greedy_orders
from pipesim.synth.policies import Policy, policies
from pipesim.synth.problem import (
    PLACEMENTS,
    MemoryLimit,
    Problem,
    make_problem,
    parse_memory_limit,
)
from pipesim.synth.synthesize import Candidate, SynthesisResult, builtin_candidates, synthesize

__all__ = [
    "PLACEMENTS",
    "Candidate",
    "MemoryLimit",
    "Policy",
    "Problem",
    "SynthesisResult",
    "builtin_candidates",
    "greedy_orders",
    "lower_bound",
    "make_problem",
    "parse_memory_limit",
    "policies",
    "synthesize",
]
