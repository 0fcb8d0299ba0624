"""The prediction band (pipesim.band) against oracles: with no dispersion every draw is
the deterministic prediction; on a chain of units of work the drawn step is a sum of
independent draws, whose distribution is known in closed form; draws follow one run
at a time; the samples of a synthetic run are its cost model's times exactly."""

from __future__ import annotations

import math
from collections import Counter
from fractions import Fraction

import pytest

from pipesim.band import PredictionBand, compute_samples, predict_band, run_spread
from pipesim.calibration import MeasuredStep, compute_only, costs_for, predict
from pipesim.costs import CostModel, Link, StageCost
from pipesim.engine import simulate
from pipesim.errors import CostError
from pipesim.schedules import generate

_OPS = {"F": "forward", "B": "backward", "I": "input_grad", "W": "weight_grad"}


def _truth(n_stages: int, scale: int = 1) -> CostModel:
    stages = tuple(
        StageCost(
            forward=(400 + 37 * s) * scale,
            backward=(900 + 11 * s) * scale,
            input_grad=(300 + 29 * s) * scale,
            weight_grad=(650 - 13 * s) * scale,
            output_bytes=1024,
        )
        for s in range(n_stages)
    )
    link = Link(latency=17, send_overhead=9, receive_overhead=23)
    return CostModel(stages=stages, link=link, dispatch_overhead=5)


def _exact_run(costs: CostModel) -> dict[str, tuple[int, ...]]:
    """One run whose every sample is the cost model's own time: no dispersion."""
    return {
        f"{s}{op}": (getattr(stage, field),)
        for s, stage in enumerate(costs.stages)
        for op, field in _OPS.items()
    }


@pytest.mark.parametrize(
    ("name", "n_stages_per_copy"),
    [("1f1b", 2), ("zb-h1", 2), ("interleaved-1f1b", 4), ("zbv", 4), ("dualpipe", 2)],
)
def test_no_dispersion_is_the_prediction_exactly(name: str, n_stages_per_copy: int) -> None:
    schedule = generate(name, n_ranks=2, n_microbatches=4)
    cut = _truth(n_stages_per_copy)
    costs = costs_for(schedule, {n_stages_per_copy: cut})
    band = predict_band(schedule, costs, [_exact_run(cut), _exact_run(cut)], draws=5)
    want = predict(schedule, costs)
    assert band.spans == (want,) * 5
    assert (band.low, band.median, band.high) == (want, want, want)


@pytest.mark.slow
def test_a_chain_sums_independent_draws_in_closed_form() -> None:
    # 1F1B with one micro-batch is the chain 0F0 -> 1F0 -> 1B0 -> 0B0, so the step is the
    # deterministic one plus the two forwards' excess over 400: each forward is 400 or 500
    # with probability 1/2, independently, so the excess is 0, 100, 200 with 1/4, 1/2, 1/4.
    schedule = generate("1f1b", n_ranks=2, n_microbatches=1)
    costs = CostModel.uniform(
        forward=400,
        backward=900,
        dispatch_overhead=5,
        link=Link(latency=17, send_overhead=9, receive_overhead=23),
    )
    base = predict(schedule, costs)
    n = 4000
    band = predict_band(schedule, costs, [{"0F": (400, 500), "1F": (400, 500)}], draws=n, seed=7)
    counts = Counter(s - base for s in band.spans)
    assert set(counts) == {0, 100, 200}
    for excess, p in ((0, 0.25), (100, 0.5), (200, 0.25)):
        # Within 5 standard deviations of the binomial count.
        assert abs(counts[excess] / n - p) < 5 * math.sqrt(p * (1 - p) / n), counts
    assert (band.low, band.median, band.high) == (base, base + 100, base + 200)


def test_each_draw_follows_one_run() -> None:
    # Run a takes the model's times, run b twice them: a draw is one or the other, never a
    # mixture of the two (which pooling the runs' samples would give).
    schedule = generate("zb-h1", n_ranks=2, n_microbatches=4)
    slow = _truth(2, scale=2)
    runs = [_exact_run(_truth(2)), _exact_run(slow)]
    band = predict_band(schedule, _truth(2), runs, draws=200, seed=3)
    fast_step = predict(schedule, _truth(2))
    slow_step = predict(schedule, slow)
    counts = Counter(band.spans)
    assert set(counts) == {fast_step, slow_step}
    assert abs(counts[fast_step] / 200 - 0.5) < 5 * math.sqrt(0.25 / 200)


def test_quantiles_are_nearest_rank_and_the_seed_repeats() -> None:
    schedule = generate("1f1b", n_ranks=2, n_microbatches=4)
    costs = _truth(2)
    runs = [{"0W": (100, 900, 2000), "1F": (300, 400)}, {"1B": (800, 1500)}]
    band = predict_band(schedule, costs, runs, draws=37, seed=11, quantiles=(0.25, 0.75))
    again = predict_band(schedule, costs, runs, draws=37, seed=11, quantiles=(0.25, 0.75))
    assert band == again
    ordered = sorted(band.spans)
    # Nearest rank: the ceil(q n)-th smallest of n = 37: the 10th, 19th and 28th.
    assert (band.low, band.median, band.high) == (ordered[9], ordered[18], ordered[27])
    assert isinstance(band, PredictionBand) and band.quantiles == (0.25, 0.75)


def test_samples_of_a_synthetic_run_are_its_times_exactly() -> None:
    truth = _truth(2)
    schedule = generate("zb-h1", n_ranks=2, n_microbatches=4)
    trace = compute_only(simulate(schedule, costs=truth).trace, schedule, truth)
    (run,) = compute_samples([MeasuredStep(schedule=schedule, trace=trace)])
    want = {
        f"{s}{op}": (getattr(truth.stages[s], field),) * 4
        for s in range(2)
        for op, field in _OPS.items()
        if op != "B"
    }
    assert run == want


@pytest.mark.parametrize(
    ("runs", "draws", "quantiles", "message"),
    [
        ([], 10, (0.1, 0.9), "no calibration runs"),
        ([{"F0": (1,)}], 10, (0.1, 0.9), "'F0' is not a stage and op"),
        ([{"0F": (-1,)}], 10, (0.1, 0.9), "must be non-negative"),
        ([{"0F": ()}], 10, (0.1, 0.9), "at least one"),
        ([{"0F": (1,)}], 0, (0.1, 0.9), "draws must be at least 1"),
        ([{"0F": (1,)}], 10, (0.9, 0.1), "quantiles must satisfy"),
    ],
)
def test_bad_input_is_refused_with_the_value(
    runs: list[dict[str, tuple[int, ...]]],
    draws: int,
    quantiles: tuple[float, float],
    message: str,
) -> None:
    schedule = generate("1f1b", n_ranks=2, n_microbatches=2)
    with pytest.raises(CostError, match=message):
        predict_band(schedule, _truth(2), runs, draws=draws, quantiles=quantiles)


def test_run_spread_by_hand() -> None:
    # 0F: run medians 11 (of 10, 12), 14 and 20 (of 17, 23); pooled median of
    # 10, 12, 14, 17, 23 is 14: (20 - 11) / 14. 1W: measured in one run only: no spread.
    runs = [{"0F": (10, 12), "1W": (40,)}, {"0F": (14,)}, {"0F": (17, 23)}]
    assert run_spread(runs) == {"0F": Fraction(9, 14), "1W": Fraction(0)}
