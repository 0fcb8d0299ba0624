"""pipesim.partition against brute force over every contiguous cut, and hand-worked cuts."""

from __future__ import annotations

from fractions import Fraction
from itertools import accumulate, pairwise

import pytest
from helpers import all_cuts, best_bottleneck
from hypothesis import given, settings
from hypothesis import strategies as st

from pipesim.errors import CostError, PartitionError
from pipesim.partition import even_split, partition, stage_sums


def _rule_key(
    costs: list[int], sizes: tuple[int, ...]
) -> tuple[list[int], list[int], tuple[int, ...]]:
    """The documented rule written out independently, smaller is better: the stage costs
    from the largest down (its first entry is the bottleneck), the layer counts from the
    largest down, and the layer counts themselves (the shortest first stages win)."""
    sums = [sum(costs[a:b]) for a, b in pairwise((0, *accumulate(sizes)))]
    return sorted(sums, reverse=True), sorted(sizes, reverse=True), sizes


def _brute_force(costs: list[int], n_stages: int) -> tuple[int, ...]:
    return min(all_cuts(len(costs), n_stages), key=lambda sizes: _rule_key(costs, sizes))


@settings(max_examples=400, deadline=None)
@given(
    costs=st.lists(st.integers(min_value=0, max_value=20), min_size=1, max_size=10),
    data=st.data(),
)
def test_partition_is_the_brute_force_choice(costs: list[int], data: st.DataObject) -> None:
    n_stages = data.draw(st.integers(min_value=1, max_value=len(costs)))
    sizes = partition(costs, n_stages=n_stages)
    assert len(sizes) == n_stages and min(sizes) >= 1 and sum(sizes) == len(costs)
    # the optimal bottleneck over all cuts, then exactly the cut the rule names
    assert max(stage_sums(costs, sizes)) == best_bottleneck(costs, n_stages)
    assert sizes == _brute_force(costs, n_stages)


@settings(max_examples=100, deadline=None)
@given(
    costs=st.lists(st.integers(min_value=0, max_value=2), min_size=1, max_size=10),
    data=st.data(),
)
def test_many_ties_still_give_the_brute_force_choice(costs: list[int], data: st.DataObject) -> None:
    # costs 0..2 make most cuts tie on the bottleneck: steps 2-4 of the rule decide
    n_stages = data.draw(st.integers(min_value=1, max_value=len(costs)))
    assert partition(costs, n_stages=n_stages) == _brute_force(costs, n_stages)


@pytest.mark.parametrize(
    ("n", "n_stages", "extras_first"),
    [(7, 2, (4, 3)), (7, 7, (1,) * 7), (10, 4, (3, 3, 2, 2)), (12, 3, (4, 4, 4))],
)
@pytest.mark.parametrize("cost", [1, 0, Fraction(1, 3), 2.5])
def test_uniform_costs(
    n: int, n_stages: int, extras_first: tuple[int, ...], cost: int | Fraction | float
) -> None:
    # numpy.array_split / DeepSpeed partition_uniform: the first n % p stages take one more
    base, extra = divmod(n, n_stages)
    assert extras_first == tuple(base + (s < extra) for s in range(n_stages))
    assert even_split(n, n_stages=n_stages) == extras_first
    # with costs, the slack goes to the first stages (step 4): the same counts reversed
    assert partition([cost] * n, n_stages=n_stages) == extras_first[::-1]


def test_torchtitan_split_of_embedding_blocks_and_head() -> None:
    # torchtitan's generate_llm_fqn_per_model_part(4, 27) counts the embedding and the
    # head as one layer each and publishes: stage 0 = embedding + 7 blocks, stages 1-2 =
    # 7 blocks, stage 3 = 6 blocks + head.
    assert even_split(29, n_stages=4) == (8, 7, 7, 7)


def test_slack_on_the_first_stages() -> None:
    # embedding 1, 40 blocks of 10, head 15 into 16 stages (llama2-13b's shape). Bound 25
    # holds at most 2 + 14 * 2 + 1 = 31 blocks, so the bottleneck is 30 (three blocks);
    # then the first stage holds at most 2 blocks (31 > 30), the last at most 1 (35 > 30).
    # Fewest stages of 30 (step 2): first 2 blocks (21), last 1 (25), and the 37 blocks
    # between on 14 stages of <= 3 blocks: nine of 3, five of 2. Step 4: the 2s first.
    costs = [1] + [10] * 40 + [15]
    sizes = partition(costs, n_stages=16)
    assert sizes == (3, 2, 2, 2, 2, 2, *[3] * 9, 2)
    assert stage_sums(costs, sizes) == (21, 20, 20, 20, 20, 20, *[30] * 9, 25)


def test_hand_worked_heavy_head() -> None:
    # embedding (no work), 6 blocks of 4, head of 6, 3 stages. Bottleneck 12 (three
    # blocks; the head plus two blocks is 14). Cuts reaching it: (3,3,2) costs 8,12,10;
    # (4,2,2) costs 12,8,10; (4,3,1) costs 12,12,6. The first two have the same costs
    # {12,10,8} (step 2 drops (4,3,1)); counts {3,3,2} beat {4,2,2} (step 3).
    costs = [0, 4, 4, 4, 4, 4, 4, 6]
    assert partition(costs, n_stages=3) == (3, 3, 2)
    assert stage_sums(costs, (3, 3, 2)) == (8, 12, 10)


def test_hand_worked_least_imbalanced_beats_first_fit() -> None:
    # [5,1,1,1] into 3: the bottleneck 5 forces the first stage alone; (1,1,2) costs
    # 5,1,2 and (1,2,1) costs 5,2,1: the same costs and counts, so step 4 takes the
    # shorter earlier stage.
    assert partition([5, 1, 1, 1], n_stages=3) == (1, 1, 2)
    # [1,1,1,1,4] into 2: 4 is the bottleneck either way: (4,1) costs 4,4; (3,2) 3,5.
    assert partition([1, 1, 1, 1, 4], n_stages=2) == (4, 1)
    # [3,3,2,2,2] into 3: (1,1,3) costs 3,3,6; (1,2,2) 3,5,4; (1,3,1) 3,7,2;
    # (2,1,2) 6,2,4; (2,2,1) 6,4,2; (3,1,1) 8,2,2: bottleneck 5, reached only by (1,2,2).
    assert partition([3, 3, 2, 2, 2], n_stages=3) == (1, 2, 2)


def test_zero_cost_layers_spread_evenly() -> None:
    # [0, 0, 6, 0, 0] into 3: the heavy layer is the bottleneck wherever it goes; the
    # other stages cost 0, so counts decide: {2,2,1} beats {3,1,1}, and of (1,2,2),
    # (2,1,2), (2,2,1), step 4 takes (1,2,2).
    assert partition([0, 0, 6, 0, 0], n_stages=3) == (1, 2, 2)
    assert partition([0] * 5, n_stages=2) == (2, 3)


def test_exact_fractions_and_floats() -> None:
    # floats are read exactly through their shortest spelling: 0.1 * 3 == 0.3 here
    assert partition([0.1, 0.1, 0.1, 0.3], n_stages=2) == (3, 1)
    assert partition([Fraction(1, 3)] * 5, n_stages=2) == (2, 3)
    assert stage_sums([0.1, 0.2], (2,)) == (Fraction(3, 10),)


def test_one_stage_and_one_layer_per_stage() -> None:
    assert partition([3, 1, 2], n_stages=1) == (3,)
    assert partition([3, 1, 2], n_stages=3) == (1, 1, 1)


def test_more_stages_than_layers_is_a_clear_error() -> None:
    with pytest.raises(
        PartitionError, match=r"cannot cut a model of 3 layers into 4 stages.*at most 3"
    ):
        partition([1, 2, 3], n_stages=4)
    with pytest.raises(PartitionError, match="cannot cut a model of 0 layers"):
        partition([], n_stages=1)
    with pytest.raises(PartitionError, match="cannot cut a model of 2 layers into 3 stages"):
        even_split(2, n_stages=3)


@pytest.mark.parametrize("n_stages", [0, -1, True, 1.5])
def test_bad_stage_count_is_refused(n_stages: object) -> None:
    with pytest.raises(PartitionError, match="n_stages must be a whole number >= 1"):
        partition([1, 2], n_stages=n_stages)  # type: ignore[arg-type]


@pytest.mark.parametrize("bad", [-1, float("nan"), float("inf"), "x", None])
def test_bad_cost_names_the_layer(bad: object) -> None:
    with pytest.raises(CostError, match="the cost of layer 1"):
        partition([1, bad, 2], n_stages=2)  # type: ignore[list-item]
