"""The planner: closed-form bubbles, memory verdicts, ranking, engines, bad inputs."""

from __future__ import annotations

import math
import os
import re
import threading
from dataclasses import replace
from fractions import Fraction

import pytest
from helpers import FREE_ACCELERATOR as FREE  # free links: messages take 0 ns
from helpers import SMALL_MODEL as SMALL
from helpers import one_f_one_b_sweep

from pipesim.costs import CostModel, StageCost
from pipesim.errors import ParseError, PlanError, UnknownNameError
from pipesim.plan import (
    ModelSpec,
    get_accelerator,
    model_layers,
    plan,
    sweep,
    workload_from_costs,
)
from pipesim.plan.backends import _start_method
from pipesim.plan.sweep import evaluate_points


def _uniform_units(n_units: int = 8) -> object:
    # 8 identical layers, F = 1 s and B = 2 s per sequence, no messages.
    return workload_from_costs(
        CostModel.uniform(
            forward=1, backward=2, input_grad=1, weight_grad=1, activation_bytes=1000
        ),
        repeat=n_units,
        meta={"seq_length": 10},
    )


@pytest.mark.parametrize("p", [1, 2, 4, 8])
@pytest.mark.parametrize("m", [1, 3, 8])
def test_bubble_equals_closed_forms(p: int, m: int) -> None:
    result = plan(
        _uniform_units(),
        devices=p,
        accelerator=FREE,
        global_batch=m,
        stages=[p],
        microbatch_sizes=[1],
        virtual=[1, 2],
        schedules=["gpipe", "1f1b", "interleaved-1f1b"],
        workers=1,
    )
    seen = set()
    for point in result.points:
        if not point.feasible:
            continue
        v = point.virtual
        seen.add((point.schedule, v))
        # GPipe / 1F1B: (p-1)/(m+p-1); interleaved: (p-1)/(v m + p - 1) (Narayanan et al. 2021)
        assert point.bubble == Fraction(p - 1, v * m + p - 1), point.label()
        # makespan in ns: (m + (p-1)/v) (F+B) with a rank's F+B = 3 s * 8/p layers
        assert point.pipeline_time_ns == (m + Fraction(p - 1, v)) * 3 * Fraction(8, p) * 10**9
        assert point.allreduce_time_ns == 0
    assert ("1f1b", 1) in seen
    # GPipe is listed unless its per-rank orders equal 1F1B's (p = 1 or m = 1): once only
    assert ("gpipe", 1) in seen or (result.n_duplicates > 0 and (p == 1 or m == 1))


def test_gpipe_is_never_recommended_when_only_1f1b_memory_fits() -> None:
    kwargs = dict(
        devices=4,
        accelerator="a100-80gb",
        global_batch=64,
        stages=[4],
        microbatch_sizes=[4],
        virtual=[1],
        schedules=["gpipe", "1f1b"],
        workers=1,
    )
    spec = ModelSpec(n_layers=16, hidden=2048, n_heads=16, seq_length=2048, vocab_size=32000)
    roomy = plan(spec, memory_capacity_bytes=10**13, **kwargs)  # type: ignore[arg-type]
    peak = {p.schedule: p.peak_memory_bytes for p in roomy.points}
    assert peak["1f1b"] < peak["gpipe"]  # m = 16 in flight vs at most p = 4
    assert peak["gpipe"] is not None and peak["1f1b"] is not None
    capacity = (peak["1f1b"] + peak["gpipe"]) // 2
    tight = plan(spec, memory_capacity_bytes=capacity, **kwargs)  # type: ignore[arg-type]
    assert tight.best is not None and tight.best.schedule == "1f1b"
    gpipe = next(p for p in tight.points if p.schedule == "gpipe")
    assert gpipe.fits is False and gpipe.rank is None
    usable = tight.usable_memory_bytes / 2**30  # tens of GiB: named in binary units
    assert 1 <= usable < 1024 and f"{usable:.3g} GiB usable" in (gpipe.reason or "")
    assert tight.best.peak_memory_bytes <= capacity  # type: ignore[operator]
    # GPipe alone: nothing fits, so nothing is recommended
    alone = plan(spec, memory_capacity_bytes=capacity, **(kwargs | {"schedules": ["gpipe"]}))  # type: ignore[arg-type]
    assert alone.best is None and alone.fitting == ()


@pytest.mark.slow
def test_more_memory_never_makes_the_best_step_time_worse() -> None:
    kwargs = dict(
        devices=8,
        accelerator="h100-sxm",
        global_batch=32,
        microbatch_sizes=[1, 2],
        virtual=[1, 2],
        workers=1,
    )
    best = math.inf
    fitting_before: set[str] = set()
    for gigabytes in (1, 2, 4, 8, 16, 80):
        result = plan(SMALL, memory_capacity_bytes=gigabytes * 10**9, **kwargs)  # type: ignore[arg-type]
        step = result.best.step_time_ns if result.best is not None else math.inf
        assert step <= best
        best = step
        fitting = {p.label() for p in result.fitting}
        assert fitting >= fitting_before
        fitting_before = fitting
    assert best < math.inf


@pytest.mark.slow
@pytest.mark.parametrize("prune", [False, True])
def test_ranking_and_pareto_front(prune: bool) -> None:
    result = plan(
        SMALL,
        devices=8,
        accelerator="h100-sxm",
        global_batch=32,
        memory_capacity_bytes=2 * 10**9,
        workers=1,
        prune=prune,
    )
    fitting = result.fitting
    ranked = [p.rank for p in fitting if p.rank is not None]
    # a pruned plan ranks the points faster than everything it pruned, and no later one
    assert ranked == list(range(1, len(ranked) + 1))
    assert [p.rank for p in fitting[len(ranked) :]] == [None] * (len(fitting) - len(ranked))
    assert len(ranked) == len(fitting) or prune
    assert [p.step_time_ns for p in fitting] == sorted(p.step_time_ns for p in fitting)  # type: ignore[misc]
    assert result.best == fitting[0] and fitting[0].pareto
    for p in fitting:
        dominated = any(
            q.step_time_ns <= p.step_time_ns
            and q.peak_memory_bytes <= p.peak_memory_bytes  # type: ignore[operator]
            and (q.step_time_ns, q.peak_memory_bytes) != (p.step_time_ns, p.peak_memory_bytes)
            for q in fitting
        )
        if p.pareto:
            assert not dominated
        elif not any(
            (q.step_time_ns, q.peak_memory_bytes) == (p.step_time_ns, p.peak_memory_bytes)
            and q.pareto
            for q in fitting
        ):
            assert dominated
    for p in result.points:
        if p.feasible and not p.fits:
            assert p.peak_memory_bytes > result.memory_capacity_bytes  # type: ignore[operator]
        if not p.feasible:
            assert p.reason and p.rank is None


def test_metrics_of_a_point_by_hand() -> None:
    result = plan(
        SMALL,
        devices=2,
        accelerator="h100-sxm",
        global_batch=8,
        stages=[2],
        microbatch_sizes=[2],
        virtual=[1],
        schedules=["1f1b"],
        tensor=[1],
        recompute=["none"],
        workers=1,
    )
    (point,) = result.points
    h100 = get_accelerator("h100-sxm")
    seconds = point.step_time_ns / 1e9  # type: ignore[operator]
    assert point.n_microbatches == 4 and point.data_parallel == 1
    assert point.tokens_per_s == pytest.approx(8 * 512 / seconds)
    flops = sum(layer.flops for layer in model_layers(SMALL)) * 8
    assert point.mfu == pytest.approx(flops / (seconds * 2 * h100.peak_flops))
    # MFU cannot beat the best GEMM rate the durations were computed with
    assert point.mfu < h100.matmul_efficiency
    # static memory: 18 bytes per parameter of the stage's layers (embedding or head
    # included): bf16 weights, fp32 gradients, fp32 Adam (Megatron-LM's table), d = 1
    layers = model_layers(SMALL)
    sizes = point.layers_per_stage
    per_stage = [
        sum(x.params for x in layers[: sizes[0]]),
        sum(x.params for x in layers[sizes[0] :]),
    ]
    assert point.static_memory_bytes in {18 * n for n in per_stage}


@pytest.mark.slow
def test_mfu_never_exceeds_efficiency_for_any_schedule() -> None:
    # DualPipe keeps two copies of the model: each copy is the whole model, not half of it
    result = plan(SMALL, devices=8, accelerator="h100-sxm", global_batch=64, workers=1)
    names = {p.schedule for p in result.points if p.feasible}
    assert {"1f1b", "gpipe"} <= names
    for p in result.points:
        if p.feasible:
            # no kernel runs faster than the achievable matmul rate
            assert p.mfu is not None and p.mfu <= get_accelerator("h100-sxm").matmul_efficiency, (
                p.label()
            )


def test_simpy_engine_gives_the_same_plan() -> None:
    kwargs = dict(
        devices=4,
        accelerator="a100-80gb",
        global_batch=16,
        microbatch_sizes=[1, 2],
        virtual=[1, 2],
        workers=1,
    )
    fast = plan(SMALL, **kwargs)  # type: ignore[arg-type]
    reference = plan(SMALL, engine="simpy", **kwargs)  # type: ignore[arg-type]
    assert sum(p.feasible for p in fast.points) > 10
    assert fast.points == reference.points


@pytest.mark.slow
def test_workers_give_the_same_plan() -> None:
    kwargs = dict(devices=8, accelerator="h100-sxm", global_batch=64, microbatch_sizes=[1, 2])
    alone = plan(SMALL, workers=1, **kwargs).points  # type: ignore[arg-type]
    assert plan(SMALL, workers=2, **kwargs).points == alone  # type: ignore[arg-type]
    # with another thread running (as in a Jupyter kernel) the pool is not forked
    stop = threading.Event()
    thread = threading.Thread(target=stop.wait)
    thread.start()
    try:
        assert _start_method() != "fork"
        assert plan(SMALL, workers=2, **kwargs).points == alone  # type: ignore[arg-type]
    finally:
        stop.set()
        thread.join()


def test_a_sweep_that_runs_out_of_time_stops_with_a_clear_error() -> None:
    context, points = one_f_one_b_sweep(200)
    for workers in (1, 2):
        with pytest.raises(PlanError, match="did not finish within"):
            evaluate_points(context, points, workers=workers, timeout_s=1e-4)


def _die(chunk: object, context: object = None) -> object:
    os._exit(3)  # a worker killed mid-sweep (OOM killer, kill -9)


def test_a_dying_worker_is_a_clear_error_not_a_wait_for_the_deadline(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    context, points = one_f_one_b_sweep(40)
    monkeypatch.setattr(sweep, "_evaluate_chunk", _die)  # forked workers inherit it
    # Reported when the worker dies: waiting for the deadline would say "did not finish".
    with pytest.raises(PlanError, match=r"worker process died.*--workers 1"):
        evaluate_points(context, points, workers=2, timeout_s=120)


def test_bad_inputs_are_clear_errors() -> None:
    with pytest.raises(PlanError, match="whole number of 8-GPU nodes"):
        plan(SMALL, devices=12, accelerator="h100-sxm", global_batch=24)
    with pytest.raises(PlanError, match="does not divide 8 devices"):
        plan(SMALL, devices=8, accelerator="h100-sxm", global_batch=64, stages=[3])
    with pytest.raises(PlanError, match="global batch 2 cannot be split"):
        plan(SMALL, devices=8, accelerator="h100-sxm", global_batch=2, stages=[1, 2], tensor=[1])
    with pytest.raises(UnknownNameError, match="presets are"):
        plan("gpt-7", devices=8, accelerator="h100-sxm", global_batch=64)
    with pytest.raises(UnknownNameError, match="presets are"):
        plan(SMALL, devices=8, accelerator="v100", global_batch=64)
    with pytest.raises(UnknownNameError, match="valid schedules"):
        plan(SMALL, devices=8, accelerator="h100-sxm", global_batch=64, schedules=["zb-h9"])
    with pytest.raises(PlanError, match="engine"):
        plan(SMALL, devices=8, accelerator="h100-sxm", global_batch=64, engine="gpu")


def test_schedule_rules_and_layer_counts_become_reasons() -> None:
    tiny = ModelSpec(n_layers=2, hidden=64, n_heads=2, seq_length=16, vocab_size=100)
    result = plan(
        tiny,
        devices=8,
        accelerator="h100-sxm",
        global_batch=64,
        microbatch_sizes=[1],
        virtual=[1, 2],
        workers=1,
    )
    reasons = [p.reason or "" for p in result.points if not p.feasible]
    assert any(r.startswith("schedule rule:") for r in reasons)
    assert any("only 4 layers" in r for r in reasons)  # 8 stages of a 4-layer model


def test_the_winner_rebuilt_and_simulated_by_the_simpy_engine() -> None:
    from pipesim.engine import simulate
    from pipesim.plan import configuration

    # (full recomputation's transient is in the planner's peak, not in the cost model)
    result = plan(
        SMALL,
        devices=4,
        accelerator="h100-sxm",
        global_batch=16,
        recompute=["none", "selective"],
        workers=1,
    )
    best = result.best
    assert best is not None
    schedule, costs = configuration(result, best, model=SMALL)
    assert costs.time_unit == "ns"  # what --costs-out writes and simulate then prints
    metrics = simulate(schedule, costs=costs).metrics
    assert metrics.makespan == best.pipeline_time_ns
    assert metrics.bubble_ratio == best.bubble
    assert max(r.param_bytes + r.peak_activation_bytes for r in metrics.ranks) == (
        best.peak_memory_bytes
    )


def test_cost_file_units_and_its_own_microbatch_size() -> None:
    # a calibrated file: 2 stages measured with micro-batches of 2 sequences, times in ns
    costs = CostModel(
        stages=(
            StageCost(forward=4000, backward=8000, activation_bytes=600, param_bytes=400),
            StageCost(forward=2000, backward=4000, activation_bytes=200, param_bytes=400),
        )
    )
    workload = workload_from_costs(costs, meta={"time_unit": "ns", "microbatch_size": 2})
    assert workload.layers[0].forward == Fraction(2000, 10**9)  # seconds per sequence
    assert workload.layers[0].activation_bytes == 300
    assert workload.layers[0].params == 100  # fp32 parameters (verify's default)
    result = plan(
        workload,
        devices=2,
        accelerator=FREE,
        global_batch=8,
        stages=[2],
        microbatch_sizes=[2, 4],
        virtual=[1],
        schedules=["gpipe"],
        workers=1,
    )
    at2, at4 = sorted(result.points, key=lambda p: p.microbatch_size)
    # b = 2, the file's own size: its numbers as they are. GPipe, m = 4, by hand: rank 0
    # F 0-16000; rank 1 F0 4000-6000 ... F3 16000-18000, B0-B3 18000-34000 (4000 each);
    # rank 0 B0 waits for 22000: 22000-30000, then B1-B3 back to back to 54000
    assert at2.pipeline_time_ns == 54000
    assert at2.static_memory_bytes == 100 * 18
    assert at2.peak_activation_bytes == 4 * 600
    # one measured size gives no fixed overhead to scale by: b = 4 is refused, not guessed
    assert at4.pipeline_time_ns is None
    assert at4.reason is not None and "measured at 2 rows per micro-batch only" in at4.reason
    with pytest.raises(ParseError, match="time_unit"):
        workload_from_costs(costs, meta={"time_unit": "h"})
    # without meta.time_unit the cost model's own unit counts (abstract units: seconds)
    in_ms = workload_from_costs(replace(costs, time_unit="ms"))
    assert in_ms.layers[0].forward == Fraction(4000, 10**3)
    assert workload_from_costs(costs).layers[0].forward == 4000


def test_batch_that_does_not_divide_is_a_reason_not_an_error() -> None:
    result = plan(
        SMALL,
        devices=4,
        accelerator="h100-sxm",
        global_batch=8,
        stages=[1, 2],
        microbatch_sizes=[1, 4],
        virtual=[1],
        schedules=["1f1b"],
        tensor=[1],
        recompute=["none"],
        workers=1,
    )
    refused = [p for p in result.points if not p.feasible]
    assert [p.reason for p in refused] == [
        "global batch 8 is not a multiple of data parallel 4 x micro-batch size 4 = 16"
    ]


def test_schedules_meet_only_the_virtual_values_they_take() -> None:
    # 1f1b holds one stage per rank and zbv two; interleaved-1f1b takes any. Pairing a
    # schedule with a value it never takes is not a configuration, so it is not listed.
    result = plan(
        SMALL,
        devices=4,
        accelerator="h100-sxm",
        global_batch=16,
        stages=[2],
        microbatch_sizes=[1],
        virtual=[1, 2],
        schedules=["1f1b", "zbv", "interleaved-1f1b"],
        tensor=[1],
        recompute=["none"],
        workers=1,
    )
    pairs = sorted((p.schedule, p.virtual) for p in result.points)
    # interleaved-1f1b with one stage per rank is 1f1b, order for order: listed once
    from pipesim.schedules import generate

    same = [
        generate(n, n_ranks=2, n_microbatches=8, virtual=1) for n in ("1f1b", "interleaved-1f1b")
    ]
    assert same[0].orders == same[1].orders
    assert pairs == [("1f1b", 1), ("interleaved-1f1b", 2), ("zbv", 2)]
    assert result.n_duplicates == 1
    with pytest.raises(PlanError, match=r"no schedule among \['1f1b'\] takes \[2\] stages"):
        plan(
            SMALL,
            devices=4,
            accelerator="h100-sxm",
            global_batch=16,
            virtual=[2],
            schedules=["1f1b"],
            workers=1,
        )


def test_a_refusal_never_reads_as_equal_memory() -> None:
    from pipesim.plan.scoring import _digits_apart
    from pipesim.units import format_bytes

    # 77e9 and 76,968,728,985 bytes (an H100's usable 90%) are 71.71 and 71.68 GiB
    need, usable = 77 * 10**9, 76_968_728_985
    assert format_bytes(need) == format_bytes(usable) == "71.7 GiB"
    digits = _digits_apart(need, usable)
    assert digits == 4 and (format_bytes(need, digits=4), format_bytes(usable, digits=4)) == (
        f"{need / 2**30:.2f} GiB",
        f"{usable / 2**30:.2f} GiB",
    )
    assert _digits_apart(2 * usable, usable) == 3


def test_a_tie_with_the_runner_up_reads_same_step_time_not_zero_percent() -> None:
    from pipesim.plan.result import explain

    # On one stage 1F1B and GPipe run the same F and B back to back: the same step time
    # (GPipe holds more activations). The README's llama2-13b example once printed
    # "0.0% faster" for such a tie.
    result = plan(
        SMALL,
        devices=4,
        accelerator="h100-sxm",
        global_batch=16,
        tensor=[1],
        pipeline_parallel=[1],
        microbatch_sizes=[2],
        schedules=["1f1b", "gpipe"],
        min_mfu=0.0,
        workers=1,
    )
    best = result.best
    assert best is not None
    others = [p for p in result.fitting if p.schedule != best.schedule]
    twin = min(others, key=lambda p: p.step_time_ns or 0)  # what the line compares with
    assert twin.step_time_ns == best.step_time_ns  # the tie itself, from the simulator
    line = explain(result)
    assert f"same step time as the best with schedule={twin.schedule}" in line
    # "0.0% faster" on its own, not the tail of e.g. "20.0% faster" for another twin
    assert re.search(r"(?<![\d.])0\.0% faster", line) is None


def test_pipeline_parallel_is_the_name_and_stages_the_old_one() -> None:
    # The same sweep under either name: the same configurations, the same winner.
    common = dict(devices=8, accelerator="h100-sxm", global_batch=64, tensor=[1], workers=1)
    new = plan(SMALL, pipeline_parallel=[2], **common)  # type: ignore[arg-type]
    old = plan(SMALL, stages=[2], **common)  # type: ignore[arg-type]
    assert {p.pipeline for p in new.points} == {2}
    assert [p.to_dict() for p in new.points] == [p.to_dict() for p in old.points]
    with pytest.raises(PlanError, match="stages is its old name"):
        plan(SMALL, pipeline_parallel=[2], stages=[4], **common)  # type: ignore[arg-type]
