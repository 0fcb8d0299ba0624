"""``pipesim plan --schedules auto``: synthesized schedules in the planner's sweep."""

from __future__ import annotations

import pytest

from pipesim import simulate, validate
from pipesim.cli import main
from pipesim.plan import configuration, plan
from pipesim.plan.cost_aware import cost_aware_names


def _plan():  # type: ignore[no-untyped-def]
    return plan(
        "llama2-7b",
        devices=8,
        accelerator="h100-sxm",
        global_batch=64,
        stages=[2, 4],
        microbatch_sizes=[1],
        virtual=[1],
        schedules=["auto"],
        workers=1,
    )


def _same_configuration(a, b) -> bool:  # type: ignore[no-untyped-def]
    """Equal in every dimension but the schedule (t, p, b, m, recomputation, ...)."""
    fields = ("tensor", "pipeline", "microbatch_size", "n_microbatches", "recompute")
    fields += ("sequence_parallel", "distributed_optimizer")
    return all(getattr(a, f) == getattr(b, f) for f in fields)


def test_auto_sweeps_the_registered_and_the_synthesized_schedules() -> None:
    result = _plan()
    names = {p.schedule for p in result.points}
    assert "synth" in cost_aware_names() and {"synth", "1f1b", "zb-h1", "zb-h2"} <= names
    for synth in (p for p in result.points if p.schedule == "synth"):
        assert synth.fits  # built within the memory the weights leave, so it fits
        same = [p for p in result.points if p.schedule == "1f1b" and _same_configuration(p, synth)]
        assert same and same[0].fits
        # 1F1B holds p micro-batches at most, within synth's limit here: never slower.
        assert synth.pipeline_time_ns is not None and same[0].pipeline_time_ns is not None
        assert synth.pipeline_time_ns <= same[0].pipeline_time_ns


def test_a_synthesized_point_rebuilds_for_the_simpy_engine() -> None:
    result = _plan()
    point = next(p for p in result.points if p.schedule == "synth" and p.pipeline == 4)
    schedule, costs = configuration(result, point, model="llama2-7b")
    validate(schedule)
    assert simulate(schedule, costs=costs).metrics.makespan == point.pipeline_time_ns


@pytest.mark.slow
def test_cli_auto(capsys) -> None:  # type: ignore[no-untyped-def]
    argv = ["plan", "--model", "llama2-7b", "--devices", "8", "--accelerator", "h100-sxm"]
    argv += ["--global-batch", "64", "--stages", "2", "--microbatch-sizes", "1", "--virtual", "1"]
    assert main([*argv, "--schedules", "auto", "--top", "30"]) == 0
    assert " synth " in capsys.readouterr().out


def test_no_memory_left_for_activations_is_the_reason_given() -> None:
    # Llama 2 7B on one device: 18 bytes per parameter of static memory exceed 80 GB
    # (pinned: no tensor parallelism, no recomputation, no sharded optimizer).
    result = plan(
        "llama2-7b",
        devices=2,
        accelerator="h100-sxm",
        global_batch=8,
        stages=[1],
        microbatch_sizes=[1],
        virtual=[1],
        schedules=["synth"],
        tensor=[1],
        recompute=["none"],
        distributed_optimizer=[False],
        workers=1,
    )
    (point,) = result.points
    assert point.reason is not None and "leave no memory for activations" in point.reason
