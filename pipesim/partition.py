"""Cut a sequence of layers into contiguous pipeline stages: the one partitioner.

``pipesim plan`` cuts its layer-cost model with :func:`partition` and ``pipesim
verify`` cuts the torch model it runs with it, so the cut the planner
recommends is the cut verify executes. Each stage takes a contiguous, non-empty
run of the layers in order, so the embedding (the first layer) always lands on
the first stage and the head (the last layer) on the last; like torchtitan's
``generate_llm_fqn_per_model_part`` and Megatron-LM's
``--account-for-embedding-in-pipeline-split``, they count as layers of the end
stages.

:func:`partition`'s rule, applied in this order (each step only breaks the ties
of the one before it):

1. **Smallest bottleneck.** Minimise the largest stage cost: the slowest stage
   sets a pipeline's steady-state step time (the linear partition problem).
2. **Most even stage costs.** Among those cuts, the stage costs sorted from the
   largest down are lexicographically smallest (leximax): the second slowest
   stage is as fast as it can be, then the third, and so on, instead of
   leaving one stage nearly empty as an arbitrary optimal cut may.
3. **Most even layer counts.** Among cuts with the same stage costs, the layer
   counts sorted from the largest down are lexicographically smallest. This
   only decides where zero-cost layers go.
4. **Slack on the first stages.** What is still tied (the same costs and counts
   in another order) goes to the cut whose layer counts are lexicographically
   smallest: the lighter stages come first. In 1F1B-style schedules stage ``s``
   of ``p`` holds ``p - s`` micro-batches' activations at the peak (Narayanan
   et al. 2021), so the first stages are the memory bottleneck; Megatron-LM
   users lighten them by hand (``--decoder-first-pipeline-num-layers``). On
   five ``pipesim plan`` presets this kept (to 2 ns of rounding) or lowered the
   step time, and kept or lowered the peak memory, of every configuration that
   fits, against the planner's earlier pack-from-the-back cut; "earlier stages
   take more" raised peak memory by up to 91 % (llama2-13b on 32 H100s).

Uniform costs thus put the extra layers on the *last* stages. When no costs are
known at all, :func:`even_split` gives the split torch users know instead,
extras first (``numpy.array_split``, DeepSpeed's ``partition_uniform``,
torchtitan, and the MLP chapter's ``(4, 3)``); ``verify`` uses it for its
default ``balance="layers"``.

Method: the optimal bottleneck is one of the O(n^2) contiguous sums; a bound is
feasible for ``p`` stages exactly when greedy packing needs at most ``p``
(costs are non-negative, so a stage can always be split further without
raising the maximum), so a binary search over the sorted sums finds it in
O(n^2 log n). Steps 2-4 are a dynamic program over (first layer, stages left)
restricted to stages within that bound; it is exact because the order of the
step 2-4 keys survives prepending a stage (inserting the same value into two
descending-sorted tuples of one length keeps their order). Costs are exact
ints or Fractions (floats are read through their shortest decimal spelling, as
everywhere in pipesim), so ties are real ties, never float noise.

>>> partition([1] * 10, n_stages=4), even_split(10, n_stages=4)
((2, 2, 3, 3), (3, 3, 2, 2))
>>> partition([0, 4, 4, 4, 4, 4, 4, 6], n_stages=3)
(3, 3, 2)
>>> stage_sums([0, 4, 4, 4, 4, 4, 4, 6], (3, 3, 2))
(8, 12, 10)
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Sequence
from fractions import Fraction
from itertools import accumulate, pairwise

from pipesim.errors import PartitionError
from pipesim.exact import Time, to_time

__all__ = ["even_split", "partition", "stage_sums"]

# A multiset of values sorted from the largest down, run-length encoded as (value,
# copies) pairs. For multisets of one size, Python's tuple order on this encoding is
# the lexicographic order of the sorted values (more copies of a value beat the next,
# smaller value), and it stays short when stage costs repeat, as they do for
# transformer blocks.
_Sorted = tuple[tuple[Time, int], ...]
# A dynamic-program state: the sorted stage costs and layer counts of a suffix's best cut.
_Key = tuple[_Sorted, _Sorted]


def stage_sums(
    costs: Sequence[int | Fraction | float], sizes: Sequence[int], /
) -> tuple[Time, ...]:
    """The summed cost of each stage when ``costs`` is cut into runs of ``sizes`` layers.

    >>> stage_sums([1, 2, 3, 4], (1, 3))
    (1, 9)
    """
    exact = _layer_costs(costs)
    bounds = [0, *accumulate(sizes)]
    return tuple(sum(exact[a:b], start=0) for a, b in pairwise(bounds))


def partition(costs: Sequence[int | Fraction | float], /, *, n_stages: int) -> tuple[int, ...]:
    """Layers per stage: ``n_stages`` contiguous non-empty runs of ``costs`` (one
    non-negative cost per layer) with the smallest bottleneck, ties broken by the
    rule in the module docstring.

    >>> partition([1, 1, 1, 1, 4], n_stages=2)
    (4, 1)
    >>> partition([5, 1, 1, 1], n_stages=3)
    (1, 1, 2)
    >>> partition([0, 0, 0, 0, 0], n_stages=2)
    (2, 3)
    """
    exact = _layer_costs(costs)
    _check_fit(len(exact), n_stages)
    prefix: list[Time] = [0, *accumulate(exact)]
    return _most_even(prefix, n_stages, _bottleneck(prefix, n_stages))


def even_split(n_layers: int, /, *, n_stages: int) -> tuple[int, ...]:
    """Layer counts as even as possible when no costs are known; the first
    ``n_layers % n_stages`` stages take one more (``numpy.array_split``).

    >>> even_split(7, n_stages=2), even_split(29, n_stages=4)
    ((4, 3), (8, 7, 7, 7))
    """
    _check_fit(n_layers, n_stages)
    base, extra = divmod(n_layers, n_stages)
    return tuple(base + (1 if s < extra else 0) for s in range(n_stages))


def _check_fit(n_layers: int, n_stages: int) -> None:
    if isinstance(n_stages, bool) or not isinstance(n_stages, int) or n_stages < 1:
        raise PartitionError(f"n_stages must be a whole number >= 1, got {n_stages!r}")
    if n_stages > n_layers:
        raise PartitionError(
            f"cannot cut a model of {n_layers} layers into {n_stages} stages: each stage needs "
            f"at least one layer; use at most {n_layers} stages or a model with more layers"
        )


def _layer_costs(costs: Sequence[int | Fraction | float]) -> list[Time]:
    return [to_time(c, name=f"the cost of layer {i}") for i, c in enumerate(costs)]


def _bottleneck(prefix: list[Time], n_stages: int) -> Time:
    """The smallest achievable largest stage cost (binary search over contiguous sums)."""
    n = len(prefix) - 1
    heaviest = max(b - a for a, b in pairwise(prefix))
    candidates = sorted({prefix[j] - prefix[i] for i in range(n) for j in range(i + 1, n + 1)})
    candidates = [c for c in candidates if c >= heaviest]  # below one layer: infeasible
    low, high = 0, len(candidates) - 1  # the total, the last candidate, fits in one stage
    while low < high:
        middle = (low + high) // 2
        if _fewest_stages(prefix, candidates[middle])[0] <= n_stages:
            high = middle
        else:
            low = middle + 1
    return candidates[low]


def _fewest_stages(prefix: list[Time], bound: Time) -> list[int]:
    """``need[i]``: the fewest stages of cost <= ``bound`` covering layers ``i..n-1``.

    Filling each stage greedily from the front is optimal for a suffix (the
    classic exchange argument); needs every single layer to fit the bound.
    """
    n = len(prefix) - 1
    need = [0] * (n + 1)
    end = n
    for i in range(n - 1, -1, -1):
        while prefix[end] - prefix[i] > bound:  # the run i..end-1 is too costly
            end -= 1
        need[i] = 1 + need[end]
    return need


def _most_even(prefix: list[Time], n_stages: int, bound: Time) -> tuple[int, ...]:
    """Steps 2-4 of the rule over the cuts whose stages all cost at most ``bound``."""
    n = len(prefix) - 1
    need = _fewest_stages(prefix, bound)
    # reach[i]: the fewest stages that can cover layers 0..i-1 (mirror of ``need``)
    reach = [0] * (n + 1)
    start = 0
    for i in range(1, n + 1):
        while prefix[i] - prefix[start] > bound:
            start += 1
        reach[i] = 1 + reach[start]
    # best[i], for k stages left: the key of the best cut of layers i..n-1 into k
    # stages; None where impossible or unreachable from layer 0. first[k][i]: the
    # layer after that cut's first stage.
    best: list[_Key | None] = [None] * (n + 1)
    first: list[list[int]] = [[n] * (n + 1)]
    for i in range(n):
        if prefix[n] - prefix[i] <= bound and reach[i] <= n_stages - 1 <= i:
            best[i] = (((prefix[n] - prefix[i], 1),), ((n - i, 1),))
    first.append([n] * (n + 1))
    for k in range(2, n_stages + 1):
        done = n_stages - k  # stages already placed before layer i
        rest, best, ends = best, [None] * (n + 1), [n] * (n + 1)
        for i in range(n - k + 1):
            if need[i] <= k and reach[i] <= done <= i:
                best[i], ends[i] = _best_first_stage(prefix, rest, i, bound)
        first.append(ends)
    sizes = []
    i = 0
    for k in range(n_stages, 0, -1):
        sizes.append(first[k][i] - i)
        i = first[k][i]
    return tuple(sizes)


def _best_first_stage(
    prefix: list[Time], rest: list[_Key | None], i: int, bound: Time
) -> tuple[_Key, int]:
    """The best cut of layers ``i..`` whose remaining stages after the first are cut
    as ``rest`` says, and the layer its first stage ends before."""
    chosen: _Key | None = None
    end = i
    # Shortest first stage first, replaced only by a strictly better key: on a tie of
    # steps 2 and 3 the shorter first stage wins, which is step 4.
    last = bisect_right(prefix, prefix[i] + bound, lo=i + 1) - 1
    for j in range(i + 1, last + 1):
        tail = rest[j]
        if tail is None:
            continue
        costs = _insert(tail[0], prefix[j] - prefix[i])
        if chosen is not None and costs > chosen[0]:
            continue
        candidate = (costs, _insert(tail[1], j - i))
        if chosen is None or candidate < chosen:
            chosen, end = candidate, j
    assert chosen is not None, "a state is only visited when a cut exists"
    return chosen, end


def _insert(values: _Sorted, value: Time) -> _Sorted:
    """``values`` with one more copy of ``value``."""
    for at, (held, copies) in enumerate(values):
        if held == value:
            return (*values[:at], (value, copies + 1), *values[at + 1 :])
        if held < value:
            return (*values[:at], (value, 1), *values[at:])
    return (*values, (value, 1))
