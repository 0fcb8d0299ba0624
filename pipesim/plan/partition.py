"""Cutting a model's layers into pipeline stages that minimise the slowest stage.

The layers (embedding, blocks, head) keep their order; each stage takes a
contiguous, non-empty run of them, so the embedding always lands on the first
stage and the head on the last. Uneven splits are allowed: the answer
minimises the largest stage cost (the classic linear partition problem).

Method: the optimal bottleneck is one of the O(n^2) contiguous sums; for a
candidate bound, packing layers greedily from the *last* stage backwards gives
the fewest stages that respect it, so a binary search over the sorted
candidates finds the optimum in O(n^2 log n). Packing from the back leaves any
slack on the first stages, which in 1F1B-style schedules hold the most
micro-batches in flight. If the greedy packing uses fewer stages than asked,
the costliest splittable stages are cut in two (never raising the maximum).

>>> partition([0, 4, 4, 4, 4, 8], n_stages=3)
(3, 2, 1)
>>> stage_sums([0, 4, 4, 4, 4, 8], (3, 2, 1))
(8, 8, 8)
"""

from __future__ import annotations

from collections.abc import Sequence
from fractions import Fraction
from itertools import accumulate

from pipesim.errors import PlanError

__all__ = ["partition", "stage_sums"]

Cost = int | Fraction


def stage_sums(costs: Sequence[Cost], sizes: Sequence[int], /) -> tuple[Cost, ...]:
    """The summed cost of each stage when ``costs`` is cut into groups of ``sizes``."""
    sums = []
    start = 0
    for size in sizes:
        sums.append(sum(costs[start : start + size], start=0))
        start += size
    return tuple(sums)


def partition(costs: Sequence[Cost], /, *, n_stages: int) -> tuple[int, ...]:
    """Layers per stage: ``n_stages`` contiguous non-empty groups of ``costs`` whose
    largest sum is as small as possible.

    >>> partition([1, 1, 1, 1], n_stages=2)
    (2, 2)
    >>> partition([5, 1, 1, 1, 1, 1], n_stages=2)
    (1, 5)
    """
    n = len(costs)
    if isinstance(n_stages, bool) or not isinstance(n_stages, int) or n_stages < 1:
        raise PlanError(f"n_stages must be a whole number >= 1, got {n_stages!r}")
    if n_stages > n:
        raise PlanError(
            f"cannot cut {n} layers (embedding and head included) into {n_stages} non-empty "
            f"stages; use at most {n} stages"
        )
    if any(c < 0 for c in costs):
        raise PlanError(f"layer costs must be non-negative, got {list(costs)!r}")
    prefix = [0, *accumulate(costs)]
    heaviest = max(costs)  # no bound below one layer's cost is feasible
    candidates = sorted({prefix[j] - prefix[i] for i in range(n) for j in range(i + 1, n + 1)})
    candidates = [c for c in candidates if c >= heaviest]
    low, high = 0, len(candidates) - 1  # the total (last candidate) always fits in 1 stage
    while low < high:
        middle = (low + high) // 2
        if len(_pack_from_back(costs, candidates[middle])) <= n_stages:
            high = middle
        else:
            low = middle + 1
    sizes = _pack_from_back(costs, candidates[low])
    while len(sizes) < n_stages:
        sums = stage_sums(costs, sizes)
        # cut the costliest stage that has two or more layers, as evenly as possible
        k = max((i for i in range(len(sizes)) if sizes[i] > 1), key=lambda i: (sums[i], -i))
        start = sum(sizes[:k])
        best = min(
            range(1, sizes[k]),
            key=lambda cut: max(
                prefix[start + cut] - prefix[start],
                prefix[start + sizes[k]] - prefix[start + cut],
            ),
        )
        sizes[k : k + 1] = [best, sizes[k] - best]
    return tuple(sizes)


def _pack_from_back(costs: Sequence[Cost], bound: Cost) -> list[int]:
    """Fewest stages with every stage sum <= ``bound``, filled from the last layer."""
    sizes: list[int] = []
    load: Cost = 0
    count = 0
    for cost in reversed(costs):
        if count and load + cost > bound:
            sizes.append(count)
            load, count = 0, 0
        load += cost
        count += 1
    sizes.append(count)
    sizes.reverse()
    return sizes
