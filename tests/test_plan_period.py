"""The planner ranked by the steady-state period of an optimizer synchronization."""

from __future__ import annotations

from dataclasses import replace

import pytest

from pipesim.errors import PipesimError
from pipesim.iterations import simulate_iterations
from pipesim.plan import configuration, plan
from pipesim.plan.cost_aware import cost_aware_names


def _plan(sync: str, candidates: int = 4):  # type: ignore[no-untyped-def]
    return plan(
        "llama2-7b",
        devices=8,
        accelerator="h100-sxm",
        global_batch=32,
        stages=[4, 8],
        tensor=[1],
        microbatch_sizes=[1],
        virtual=[1],
        recompute=["none"],
        schedules=["1f1b", "zb-h1", "zb-h2", "auto"],
        workers=1,
        optimizer_sync=sync,
        period_candidates=candidates,
    )


def test_global_sync_period_is_pipeline_plus_what_follows_it() -> None:
    result = _plan("global")
    assert result.optimizer_sync == "global" and result.period_candidates == 0
    names = {p.schedule for p in result.points}
    assert "synth" in names and "synth-pv" not in names
    for point in result.fitting:
        assert point.period_sync == "global"
        assert point.step_time_ns == point.pipeline_time_ns + point.allreduce_time_ns


def test_post_validation_rescores_the_fastest_by_the_engines_iterations() -> None:
    glob = {p.label(): p for p in _plan("global").fitting}
    result = _plan("post-validation", candidates=4)
    assert result.optimizer_sync == "post-validation" and result.period_candidates == 4
    assert {p.schedule for p in result.points} >= {"synth-pv"}
    rescored = [p for p in result.fitting if p.period_sync == "post-validation"]
    assert len(rescored) == 4
    for point in rescored:
        # The oracle: the configuration's own schedule and costs, each rank's optimizer
        # step the exposed traffic + optimizer step the sweep priced, 3 iterations.
        schedule, costs = configuration(result, point, model="llama2-7b")
        firsts = {schedule.placement.index(r) for r in range(schedule.n_ranks)}
        stages = tuple(
            replace(c, optimizer=point.allreduce_time_ns if s in firsts else 0)
            for s, c in enumerate(costs.stages)
        )
        run = simulate_iterations(
            schedule, costs=replace(costs, stages=stages), steps=3, sync="post-validation"
        )
        assert run.period is not None
        assert point.step_time_ns == round(run.period.period)
        # never longer than under a global sync, which waits for every rank
        if point.label() in glob:
            assert point.step_time_ns <= glob[point.label()].step_time_ns
    # ranked by the period: the step times are in order among those that fit
    times = [p.step_time_ns for p in result.fitting]
    assert times == sorted(times)
    # tokens/s follow the period
    best = result.fitting[0]
    assert best.tokens_per_s == pytest.approx(32 * 4096 / (best.step_time_ns / 1e9))


def test_auto_synthesizes_for_the_sync() -> None:
    assert cost_aware_names(sync="global") == ("synth",)
    assert cost_aware_names(sync="none") == ("synth-none",)
    with pytest.raises(PipesimError, match="optimizer sync must be one of"):
        _plan("local")
