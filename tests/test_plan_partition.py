"""The partitioner against brute force over every contiguous split."""

from __future__ import annotations

from fractions import Fraction
from itertools import combinations, pairwise

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pipesim.errors import PlanError
from pipesim.plan.partition import partition, stage_sums


def _brute_force_best(costs: list[int], n_stages: int) -> int:
    n = len(costs)
    best = None
    for cuts in combinations(range(1, n), n_stages - 1):
        bounds = (0, *cuts, n)
        worst = max(sum(costs[a:b]) for a, b in pairwise(bounds))
        best = worst if best is None else min(best, worst)
    assert best is not None
    return best


@settings(max_examples=300, deadline=None)
@given(
    costs=st.lists(st.integers(min_value=0, max_value=20), min_size=1, max_size=9),
    data=st.data(),
)
def test_partition_is_optimal_against_brute_force(costs: list[int], data: st.DataObject) -> None:
    n_stages = data.draw(st.integers(min_value=1, max_value=len(costs)))
    sizes = partition(costs, n_stages=n_stages)
    assert len(sizes) == n_stages and min(sizes) >= 1 and sum(sizes) == len(costs)
    assert max(stage_sums(costs, sizes)) == _brute_force_best(costs, n_stages)


def test_embedding_and_head_are_real_layers_of_the_end_stages() -> None:
    # embedding (no FLOPs), 6 equal blocks, a heavy head: the head's stage takes one block
    # less, and packing from the back leaves the slack on the first stage
    costs = [0, 4, 4, 4, 4, 4, 4, 6]
    sizes = partition(costs, n_stages=3)
    assert max(stage_sums(costs, sizes)) == _brute_force_best(costs, 3) == 12
    assert sizes == (3, 3, 2)
    assert stage_sums(costs, sizes) == (8, 12, 10)


def test_uneven_split_and_fractions() -> None:
    sizes = partition([Fraction(1, 3)] * 5, n_stages=2)
    assert sorted(sizes) == [2, 3]
    assert partition([1, 1, 1, 1, 1, 1, 1, 1], n_stages=4) == (2, 2, 2, 2)


def test_too_many_stages_is_a_clear_error() -> None:
    with pytest.raises(PlanError, match="cannot cut 3 layers"):
        partition([1, 2, 3], n_stages=4)
