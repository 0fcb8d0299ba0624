"""The settings of the greedy scheduler that :func:`pipesim.synth.synthesize` tries.

Each :class:`Policy` is one candidate; :mod:`pipesim.synth.heuristic` runs it and
the exact evaluator judges. The settings follow the published patterns (1F1B's
and ZB-H1's warm-up ``p - r``, ZB-H2's ``2 (p - r) - 1``, ZB-H1's ``r`` deferred
W on rank ``r``; Qi et al. 2024) and, on a V, the controllable-memory building
blocks (Qi et al. NeurIPS 2024) and DualPipe's overlapped F&B pairs
(DeepSeek-AI 2024, sec. 3.2.1).

>>> from pipesim.synth.problem import make_problem
>>> len(policies(make_problem(n_ranks=4, n_microbatches=8, memory_limit=4)))
24
>>> [p.name for p in policies(make_problem(n_ranks=4, n_microbatches=8, memory_limit=4),
...                           quick=True)][:2]
['greedy[memory]', 'greedy[1f1b-warmup]']
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from fractions import Fraction

from pipesim.actions import Op, action_code
from pipesim.schedules.controllable import BLOCKS
from pipesim.synth.problem import Problem, durations_of, fb_pairs

__all__ = ["PAIRINGS", "Policy", "pair_pays", "policies"]

#: When a rank overlaps a ready backward with its other chunk's ready forward:
#: ``saves`` when the pair is shorter than the forward and the full backward run
#: apart (it saves work), ``fast`` only when it is no longer than the forward and the
#: input gradient (neither output leaves later than running I, then F).
PAIRINGS = ("saves", "fast")


@dataclass(frozen=True, slots=True, kw_only=True)
class Policy:
    """One setting of the greedy scheduler."""

    caps: tuple[int, ...] | None = None
    """Per rank: the most stage-micro-batches between F and I (1F1B's warm-up depth);
    None: memory only. Deferred W passes are limited by memory alone."""
    defer: tuple[int, ...] | None = None
    """Per rank: the most W passes held back; past it W goes before F (ZB-H1: r on rank r)."""
    patient: str = ""
    """Ops (``"W"``, ``"FW"``) started only if they end before a gradient known to be on its way;
    with a ``block``, any later pass pulled in only if it ends before the next one is due."""
    reserve: str = "all"
    """Admitting a micro-batch new to a rank: ``all`` reserves its later stages' bytes
    until they run; ``one`` only keeps room for one micro-batch's later stages (enough
    for the oldest to go on); ``none`` checks the forward's own bytes (may get stuck)."""
    pace: Fraction = Fraction(0)
    """Feed micro-batches into stage 0 at most one per ``pace`` times the busiest rank's
    work per micro-batch, so they flow evenly instead of in bursts (tight V memory); 0: off."""
    block: str = ""
    """Follow this controllable-memory building block (``v-half``, ``v-min``); "": off."""
    pull: str = "FIW"
    """With a ``block``: the ops a rank may pull in ahead of the block's next pass (``IW``:
    never a forward early, which frees memory before it takes more)."""
    pair: str = ""
    """Overlap a ready backward with the other chunk's ready forward as one F&B unit
    (:data:`PAIRINGS`, needs ``Problem.overlap_fb``); "": never."""
    name: str = "greedy"
    """How the candidate is reported."""

    @property
    def timed_by_the_evaluator(self) -> bool:
        """Whether the run's own makespan may differ from the engine's on free links: it
        may hold a ready pass back where the engine would start it (a pace, a patient
        block), or it runs overlapped pairs, which only the evaluator times."""
        return bool(self.pace or self.pair or (self.block and self.patient))


#: The policies that won most often in benchmarks/bench_synth.py, for ``quick`` runs.
_QUICK = (
    "greedy[memory]",
    "greedy[1f1b-warmup]",
    "greedy[1f1b-warmup+1]",
    "greedy[1f1b-warmup+1,patient-W]",
    "greedy[memory,reserve-one]",
    "greedy[memory,reserve-none]",
    "greedy[paced-1,reserve-none]",
    "greedy[paced-1,reserve-none,patient-W]",
    "greedy[block-v-half]",
    "greedy[block-v-min]",
)


def pair_pays(problem: Problem, /, pairing: str, forward: int, backward: int) -> bool:
    """Whether ``pairing`` overlaps the forward of stage ``forward`` with the backward of
    stage ``backward`` (see :data:`PAIRINGS`), all durations as the engine takes them."""
    table = durations_of(problem)
    pair = fb_pairs(problem)[forward, backward]
    f = table[action_code(forward, Op.F)]
    if pairing == "fast":
        return pair <= f + table[action_code(backward, Op.I)]
    return pair < f + table[action_code(backward, Op.B)]


def policies(problem: Problem, *, quick: bool = False) -> tuple[Policy, ...]:
    """The candidate policies tried for ``problem`` (``quick``: the few that win most).

    In-flight caps follow the published patterns: ``p - r`` per rank (1F1B and
    ZB-H1's warm-up), ``2 (p - r) - 1`` (ZB-H2's), scaled by the stages per rank;
    a uniform cap (ZB-V holds about the same on every rank); none (memory only).
    With several stages per rank, three ways to admit a micro-batch (``reserve``) and
    paced feeding (``pace``) are tried as well. With ``Problem.overlap_fb``, where some
    pair saves work, each quick policy without a block is tried again pairing F and B
    both ways of :data:`PAIRINGS`.
    """
    p, v = problem.n_ranks, problem.virtual
    cap_sets: list[tuple[str, tuple[int, ...] | None]] = [("memory", None)]
    cap_sets.append(("1f1b-warmup", tuple(v * (p - r) for r in range(p))))
    if v == 1:
        cap_sets.append(("1f1b-warmup+1", tuple(p - r + 1 for r in range(p))))
        cap_sets.append(("zb-h2-warmup", tuple(2 * (p - r) - 1 for r in range(p))))
    else:  # fewer caps, more ways to admit (below): the V's memory binds first
        cap_sets.append(("uniform", tuple(v * p for _ in range(p))))
    # Deferred W passes: as many as memory allows, or v r on rank r (ZB-H1).
    defers: list[tuple[str, tuple[int, ...] | None]] = [("", None)]
    defers.append((",defer-r", tuple(v * r for r in range(p))))
    out = []
    for cap_name, caps in cap_sets:
        for defer_name, defer in defers:
            for patient in ("", "W", "FW") if v == 1 else ("", "W"):
                for reserve in ("all", "one", "none") if v > 1 else ("all",):
                    label = (
                        f"greedy[{cap_name}{defer_name}{',patient-' + patient if patient else ''}"
                    )
                    label += "]" if reserve == "all" else f",reserve-{reserve}]"
                    out.append(
                        Policy(caps=caps, defer=defer, patient=patient, reserve=reserve, name=label)
                    )
    if v > 1:  # evenly fed micro-batches for tight memory on a V or a loop
        for pace in (Fraction(1), Fraction(5, 4), Fraction(3, 2), Fraction(2)):
            for reserve in ("one", "none"):
                for patient in ("", "W"):
                    label = f"greedy[paced-{pace},reserve-{reserve}"
                    label += f",patient-{patient}]" if patient else "]"
                    out.append(Policy(pace=pace, reserve=reserve, patient=patient, name=label))
    if problem.placement_name == "v":
        out += [Policy(block=block, name=f"greedy[block-{block}]") for block in BLOCKS]
        out += [
            Policy(block=block, patient="FW", name=f"greedy[block-{block},patient]")
            for block in BLOCKS
        ]
        out += [
            Policy(block=block, pull="IW", name=f"greedy[block-{block},no-early-F]")
            for block in BLOCKS
        ]
    if quick:
        out = [policy for policy in out if policy.name in _QUICK]
    pairs = fb_pairs(problem)
    if any(pair_pays(problem, "saves", f, b) for f, b in pairs):
        bases = [policy for policy in out if policy.name in _QUICK and not policy.block]
        out += [
            replace(base, pair=pairing, name=f"{base.name[:-1]},pair-{pairing}]")
            for pairing in PAIRINGS
            for base in bases
        ]
    return tuple(out)
