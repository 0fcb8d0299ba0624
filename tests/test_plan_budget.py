"""pipesim.plan.budget: a sweep's simulated actions, counted before it runs."""

from __future__ import annotations

import pytest

from pipesim import limits
from pipesim.actions import Overlap
from pipesim.errors import LimitError
from pipesim.plan.budget import check_sweep, sweep_actions
from pipesim.plan.hardware import get_accelerator
from pipesim.plan.model import get_model
from pipesim.plan.planner import Dimensions, sweep_points
from pipesim.plan.sweep import Point
from pipesim.plan.workload import workload_from_model
from pipesim.schedules import generate

WORKLOAD = workload_from_model(get_model("llama2-13b"))
GPUS_PER_NODE = get_accelerator("h100-sxm").gpus_per_node


def _points(devices: int, global_batch: int, **dims: tuple[object, ...]) -> list[Point]:
    dimensions = Dimensions(microbatch_sizes=(1, 2, 4, 8), virtual=(1, 2, 4), **dims)  # type: ignore[arg-type]
    points, _ = sweep_points(
        devices=devices,
        global_batch=global_batch,
        gpus_per_node=GPUS_PER_NODE,
        n_layers=len(WORKLOAD.layers),
        workload=WORKLOAD,
        dimensions=dimensions,
    )
    return points


def _generated_actions(point: Point) -> int:
    """The oracle: the simple actions of the schedule the point really generates."""
    schedule = generate(
        point.schedule,
        n_ranks=point.pipeline,
        n_microbatches=point.n_microbatches,
        virtual=point.virtual,
    )
    return sum(
        len(work.parts) if isinstance(work, Overlap) else 1
        for order in schedule.orders
        for work in order
    )


def test_sweep_actions_counts_what_the_generators_build() -> None:
    # gpipe and 1f1b run F and B of every micro-batch on every stage: exact.
    points = _points(16, 64, schedules=("gpipe", "1f1b"), tensor=(1,), recompute=("none",))
    assert len(points) > 20
    assert sweep_actions(points) == sum(_generated_actions(p) for p in points)


def test_sweep_actions_is_a_lower_bound_with_split_backward_and_two_copies() -> None:
    points = _points(8, 32, schedules=("zb-h1", "dualpipe"), tensor=(1,), recompute=("none",))
    built = [p for p in points if _buildable(p)]
    assert {p.schedule for p in built} == {"zb-h1", "dualpipe"}
    for point in built:
        assert 0 < sweep_actions([point]) <= _generated_actions(point)


def _buildable(point: Point) -> bool:
    try:
        _generated_actions(point)
    except ValueError:  # the schedule's rules refuse this size
        return False
    return True


def test_a_point_past_max_actions_counts_nothing() -> None:
    # p v m x 2 = 8 x 1 x 625000 x 2 = 10^7 is at the limit; one micro-batch more is past it.
    at = Point(schedule="1f1b", pipeline=8, virtual=1, microbatch_size=1,
               n_microbatches=625_000, data_parallel=1)  # fmt: skip
    past = Point(schedule="1f1b", pipeline=8, virtual=1, microbatch_size=1,
                 n_microbatches=625_001, data_parallel=1)  # fmt: skip
    assert sweep_actions([at]) == limits.MAX_ACTIONS
    assert sweep_actions([past]) == 0


def test_a_huge_global_batch_is_refused_naming_the_numbers() -> None:
    points = _points(8, 1_000_000)
    total = sweep_actions(points)
    assert total > limits.MAX_SWEEP_ACTIONS
    with pytest.raises(LimitError) as info:
        check_sweep(points, devices=8, global_batch=1_000_000)
    message = str(info.value)
    assert f"would simulate {total:.3g} actions in {len(points)} configurations" in message
    assert "above pipesim's limit of 1e+09 (MAX_SWEEP_ACTIONS in pipesim.limits" in message
    assert "lower --global-batch" in message


def test_a_million_devices_with_a_matching_batch_is_within_the_limit() -> None:
    # 10^6 devices, 10^6 sequences: thousands of configurations of at most 320
    # micro-batches (m = t p / b), far below the limit; plan runs it.
    points = _points(1_000_000, 1_000_000)
    assert len(points) > 1000
    assert max(p.n_microbatches for p in points) <= 8 * 40
    assert sweep_actions(points) < limits.MAX_SWEEP_ACTIONS // 10
    check_sweep(points, devices=1_000_000, global_batch=1_000_000)
