"""The planner's partitioner (:mod:`pipesim.partition`, shared with verify; its
brute-force properties are in test_partition.py) on model layers, and the cut the sweep
reports."""

from __future__ import annotations

from fractions import Fraction

import pytest
from helpers import best_bottleneck, evaluate_one_point

import pipesim.partition
from pipesim.errors import PartitionError
from pipesim.partition import partition, stage_sums
from pipesim.plan.model import ModelSpec
from pipesim.plan.workload import workload_from_model


def test_embedding_and_head_are_real_layers_of_the_end_stages() -> None:
    # embedding (no FLOPs), 6 equal blocks, a heavy head: the head's stage takes one block
    # less, and the most even costs (8, 12, 10 rather than 12, 8, 10) put the embedding
    # with two blocks
    costs = [0, 4, 4, 4, 4, 4, 4, 6]
    sizes = partition(costs, n_stages=3)
    assert max(stage_sums(costs, sizes)) == best_bottleneck(costs, 3) == 12
    assert sizes == (3, 3, 2)
    assert stage_sums(costs, sizes) == (8, 12, 10)


def test_uneven_split_and_fractions() -> None:
    sizes = partition([Fraction(1, 3)] * 5, n_stages=2)
    assert sorted(sizes) == [2, 3]
    assert partition([1, 1, 1, 1, 1, 1, 1, 1], n_stages=4) == (2, 2, 2, 2)


def test_too_many_stages_is_a_clear_error() -> None:
    with pytest.raises(PartitionError, match="cannot cut a model of 3 layers"):
        partition([1, 2, 3], n_stages=4)


def test_the_planner_uses_the_shared_partitioner() -> None:
    assert partition is pipesim.partition.partition
    assert stage_sums is pipesim.partition.stage_sums


@pytest.mark.parametrize("pipeline", [2, 3, 4, 5])
def test_sweep_reports_the_cut_of_the_layer_work(pipeline: int) -> None:
    # 6 blocks, a vocabulary large enough that the head is heavier than a block
    spec = ModelSpec(n_layers=6, hidden=128, n_heads=4, seq_length=64, vocab_size=4000)
    workload = workload_from_model(spec)
    work = [layer.work for layer in workload.layers]
    assert work[-1] > work[1] > work[0]  # head > block > embedding
    evaluation = evaluate_one_point(workload, pipeline=pipeline)
    sizes = evaluation.layers_per_stage
    assert sizes == partition(work, n_stages=pipeline)
    assert max(stage_sums(work, sizes)) == best_bottleneck(work, pipeline)
