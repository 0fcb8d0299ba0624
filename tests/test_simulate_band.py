"""``pipesim simulate --costs FILE`` with the calibration samples a cost file keeps: the
band and the drawn step against oracles (samples of one value each: the engine's own
makespan with those times; a one-rank step: a sum of independent draws whose quantiles
are worked out by hand and by enumeration), the text matching the library call, and
every way to get the options wrong."""

from __future__ import annotations

import itertools
import json
import math
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from pipesim.band import draw_prediction, samples_from_meta
from pipesim.cli import main
from pipesim.costs import CostModel, StageCost, costs_to_dict, load_costs
from pipesim.engine import simulate
from pipesim.errors import CostError
from pipesim.schedules import generate

_OPS = {"F": "forward", "B": "backward", "I": "input_grad", "W": "weight_grad"}


def _run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    try:
        status = main(list(argv))
    except SystemExit as exc:  # argparse's usage errors
        status = exc.code if isinstance(exc.code, int) else 1
    out, err = capsys.readouterr()
    assert "Traceback" not in err
    return status, out, err


def _write(path: Path, costs: CostModel, meta: dict[str, Any] | None) -> str:
    data = costs_to_dict(costs) | ({"meta": meta} if meta is not None else {})
    path.write_text(json.dumps(data))
    return str(path)


def _stages(n_stages: int, base: int) -> tuple[StageCost, ...]:
    return tuple(
        StageCost(
            forward=base + 7 * s,
            backward=2 * base + 3 * s,
            input_grad=base + 5 * s,
            weight_grad=base - 2 * s,
        )
        for s in range(n_stages)
    )


@pytest.mark.parametrize(
    ("name", "virtual"), [("1f1b", 1), ("zb-h1", 1), ("interleaved-1f1b", 2), ("gpipe", 1)]
)
def test_one_sample_per_op_collapses_the_band_to_the_engines_makespan(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], name: str, virtual: int
) -> None:
    # The file's times are 100-based, every sample 130-based: with one value per op every
    # draw is the step with the samples' times, which the engine simulates directly (no
    # overheads: the step starts with a compute and ends with one, so the span a measured
    # step has is the makespan).
    schedule = generate(name, n_ranks=2, n_microbatches=4, virtual=virtual)
    n = schedule.n_stages
    sampled = _stages(n, 130)
    run = {f"{s}{op}": [getattr(sampled[s], f)] for s in range(n) for op, f in _OPS.items()}
    meta = {"n_stages": n, "compute_samples_ns": [run, run]}
    path = _write(tmp_path / "c.json", CostModel(stages=_stages(n, 100), time_unit="ns"), meta)
    argv = ["simulate", name, "-p", "2", "-m", "4", "--virtual", str(virtual), "--costs", path]
    status, out, _ = _run(capsys, *argv, "--json", "--draws", "7")
    assert status == 0
    got = json.loads(out)
    want = simulate(schedule, costs=CostModel(stages=sampled)).metrics.makespan
    medians = simulate(schedule, costs=CostModel(stages=_stages(n, 100))).metrics.makespan
    assert want != medians  # the band is not the file's own step
    band = got["band"]
    assert (band["low"], band["drawn"], band["high"]) == (want, want, want)
    assert got["makespan"] == band["predicted"] == medians
    assert (band["draws"], band["seed"], band["runs"], band["source"]) == (7, 0, 2, path)
    assert band["quantiles"] == [0.1, 0.9]


def test_one_stage_samples_are_every_stages_as_a_one_stage_cost_file_is(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    meta = {"n_stages": 1, "compute_samples_ns": [{"0F": [30], "0B": [70]}]}
    costs = CostModel.uniform(forward=10, backward=20, time_unit="ns")
    path = _write(tmp_path / "c.json", costs, meta)
    status, out, _ = _run(capsys, "simulate", "1f1b", "-p", "3", "-m", "5", "--costs", path)
    assert status == 0
    schedule = generate("1f1b", n_ranks=3, n_microbatches=5)
    want = simulate(schedule, costs=CostModel.uniform(forward=30, backward=70)).metrics.makespan
    assert f"band {want}-{want} ns" in out and f"drawn step {want} ns" in out


def _hand_file(tmp_path: Path) -> str:
    # Two runs; F is 10 in one run and 20 in the other, B 30 or 50 in both.
    meta = {
        "n_stages": 1,
        "compute_samples_ns": [{"0F": [10], "0B": [30, 50]}, {"0F": [20], "0B": [30, 50]}],
    }
    costs = CostModel.uniform(forward=15, backward=40, time_unit="ns")
    return _write(tmp_path / "h.json", costs, meta)


def _quantile(distribution: Counter[int], q: float) -> int:
    """The nearest-rank quantile of an exact distribution: the smallest value whose
    cumulative probability reaches q."""
    total, seen = sum(distribution.values()), 0
    for value in sorted(distribution):
        seen += distribution[value]
        if seen >= q * total:
            return value
    raise AssertionError("unreachable")


@pytest.mark.slow
def test_a_one_rank_step_sums_its_draws_as_worked_by_hand(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # GPipe on one rank, two micro-batches: the step is F0 + F1 + B0 + B1, one after another.
    # Drawn (every run pooled): F from (10, 20), B from (30, 50, 30, 50), independently:
    # F0 + F1 is 20, 30, 40 w.p. 1/4, 1/2, 1/4, B0 + B1 60, 80, 100 likewise, so the step is
    # 80 .. 140 by 10 w.p. (1, 2, 3, 4, 3, 2, 1)/16; cumulative 1, 3, 6, 10, 13, 15, 16
    # sixteenths: p10 = 90 (1/16 < 0.1 <= 3/16), median 110 (6/16 < 1/2 <= 10/16), p90 =
    # 130 (13/16 < 0.9 <= 15/16). The band (one run per draw): F0 + F1 is 20 or 40 w.p. 1/2,
    # so 80, 100, 120, 140 w.p. (1, 3, 3, 1)/8: p10 = 80 (1/8 >= 0.1), p90 = 140 (7/8 < 0.9).
    pooled = Counter(
        f0 + f1 + b0 + b1
        for f0, f1, b0, b1 in itertools.product((10, 20), (10, 20), (30, 50), (30, 50))
    )
    per_run = Counter(
        2 * f + b0 + b1 for f, b0, b1 in itertools.product((10, 20), (30, 50), (30, 50))
    )
    assert [_quantile(pooled, q) for q in (0.1, 0.5, 0.9)] == [90, 110, 130]
    assert [_quantile(per_run, q) for q in (0.1, 0.9)] == [80, 140]

    path = _hand_file(tmp_path)
    argv = ["simulate", "gpipe", "-p", "1", "-m", "2", "--costs", path, "--draws", "4000"]
    status, out, _ = _run(capsys, *argv, "--seed", "7", "--json")
    assert status == 0
    band = json.loads(out)["band"]
    assert (band["low"], band["drawn"], band["high"]) == (80, 110, 140)
    assert band["predicted"] == 15 + 15 + 40 + 40  # the file's own times, a sum too

    schedule = generate("gpipe", n_ranks=1, n_microbatches=2)
    costs = load_costs(path)
    runs = samples_from_meta(schedule, json.loads(Path(path).read_text())["meta"], time_unit="ns")
    assert runs is not None
    drawn = draw_prediction(schedule, costs, runs, draws=4000, seed=7).drawn
    assert (drawn.low, drawn.median, drawn.high) == (90, 110, 130)
    counts = Counter(drawn.spans)
    assert set(counts) == set(pooled)
    for value, k in pooled.items():
        p = k / 16  # each within 5 standard deviations of its binomial count
        assert abs(counts[value] / 4000 - p) < 5 * math.sqrt(p * (1 - p) / 4000), counts


def test_the_text_prints_the_library_calls_numbers(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    meta = {
        "n_stages": 2,
        "compute_samples_ns": [
            {"0F": [90, 110], "1F": [100, 120], "0B": [200], "1B": [190, 230]},
            {"0F": [100], "1F": [110], "0B": [210, 250]},
        ],
    }
    costs = CostModel(stages=_stages(2, 100), time_unit="ns", dispatch_overhead=3)
    path = _write(tmp_path / "c.json", costs, meta)
    argv = ["simulate", "1f1b", "-p", "2", "-m", "4", "--costs", path, "--draws", "50"]
    status, out, _ = _run(capsys, *argv, "--seed", "3")
    assert status == 0
    schedule = generate("1f1b", n_ranks=2, n_microbatches=4)
    runs = samples_from_meta(schedule, meta, time_unit="ns")
    assert runs is not None
    got = draw_prediction(schedule, costs, runs, draws=50, seed=3)
    assert f"drawn step {got.drawn.median} ns" in out
    assert f"p10-p90 band {got.band.low}-{got.band.high} ns" in out
    assert "50 draws (seed 3) from the compute samples of the 2 calibration runs in" in out
    assert got.band.low < got.band.high  # the samples do spread the step
    # The default draws are 200; the grid view (whole cycles: unit-like costs) prints it too.
    status, out, _ = _run(capsys, "simulate", "1f1b", "-p", "2", "-m", "4", "--costs", path)
    assert status == 0 and "200 draws (seed 0)" in out
    meta = {"n_stages": 1, "compute_samples_ns": [{"0F": [10, 20]}]}
    costs = CostModel.uniform(forward=10, backward=20, time_unit="ns")
    path = _write(tmp_path / "u.json", costs, meta)
    status, out, _ = _run(
        capsys, "simulate", "1f1b", "-p", "2", "-m", "2", "--costs", path, "--grid"
    )
    assert (
        status == 0
        and "200 draws (seed 0) from the compute samples of the 1 calibration run in" in out
    )


def test_without_samples_the_band_is_off_and_asking_for_it_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = _write(tmp_path / "plain.json", CostModel.uniform(forward=1, backward=2), None)
    base = ["simulate", "1f1b", "-p", "2", "-m", "4"]
    status, out, _ = _run(capsys, *base, "--costs", path, "--json")
    assert status == 0 and "band" not in json.loads(out)
    status, out, _ = _run(capsys, *base, "--costs", path)
    assert status == 0 and "drawn step" not in out
    for extra in (["--band"], ["--draws", "5"], ["--seed", "2"]):
        status, _, err = _run(capsys, *base, "--costs", path, *extra)
        assert status == 1
        assert path in err and "no compute samples" in err and "pipesim calibrate" in err
    status, _, err = _run(capsys, *base, "--forward-time", "1", "--band")
    assert status == 1 and "give --costs FILE written by `pipesim calibrate`" in err


@pytest.mark.parametrize(
    ("extra", "fragment"),
    [
        (["--draws", "0"], "argument --draws: expected a whole number from 1 to 100000, got 0"),
        (["--draws", "ten"], "argument --draws"),
        (["--draws", "100001"], "argument --draws"),
        (["--seed", "-1"], "argument --seed"),
    ],
)
def test_bad_draws_and_seeds_are_usage_errors(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], extra: list[str], fragment: str
) -> None:
    path = _hand_file(tmp_path)
    status, _, err = _run(
        capsys, "simulate", "gpipe", "-p", "1", "-m", "2", "--costs", path, *extra
    )
    assert status == 2 and fragment in err


def test_samples_of_another_cut_are_refused_and_no_band_simulates(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # A one-stage cost file runs any schedule; its samples of a two-stage cut do not.
    meta = {"n_stages": 2, "compute_samples_ns": [{"0F": [9], "1F": [11]}]}
    costs = CostModel.uniform(forward=10, backward=20, time_unit="ns")
    path = _write(tmp_path / "c.json", costs, meta)
    base = ["simulate", "1f1b", "-p", "4", "-m", "4", "--costs", path]
    status, _, err = _run(capsys, *base)
    assert status == 1
    assert "describes a cut into 2 stages, but 1f1b runs on 4 stages" in err
    assert path in err and "--no-band" in err
    status, out, _ = _run(capsys, *base, "--no-band")
    # 1F1B: (m + p - 1) (F + B) = 7 x 30 (Narayanan et al. 2021).
    assert status == 0 and "drawn step" not in out and "makespan 210 ns" in out
    status, _, err = _run(capsys, *base, "--no-band", "--draws", "3")
    assert status == 1 and "drop --no-band" in err
    # The same samples on a two-stage schedule are drawn.
    status, out, _ = _run(
        capsys, "simulate", "1f1b", "-p", "2", "-m", "2", "--costs", path, "--json"
    )
    assert status == 0 and json.loads(out)["band"]["runs"] == 1


def test_samples_in_ns_need_a_cost_model_in_ns(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # No time_unit in the file: abstract units, which ns samples cannot be drawn into.
    meta = {"n_stages": 1, "compute_samples_ns": [{"0F": [9]}]}
    path = _write(tmp_path / "c.json", CostModel.uniform(forward=10, backward=20), meta)
    status, _, err = _run(
        capsys, "simulate", "gpipe", "-p", "1", "-m", "2", "--costs", path, "--band"
    )
    assert status == 1 and "is in ns but the cost model's times are in unit" in err


def test_a_comms_schedule_draws_no_band(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    lowered = tmp_path / "1f1b-comms.csv"
    argv = ["schedule", "1f1b", "-p", "2", "-m", "2", "--comms", "-o", str(lowered)]
    assert _run(capsys, *argv)[0] == 0
    path = _hand_file(tmp_path)
    status, out, _ = _run(capsys, "simulate", str(lowered), "--costs", path)
    assert status == 0 and "comms schedule" in out and "drawn step" not in out
    status, _, err = _run(capsys, "simulate", str(lowered), "--costs", path, "--band")
    assert status == 1 and "simulate the compute schedule" in err


@pytest.mark.parametrize(
    ("meta", "message"),
    [
        ({"compute_samples_ns": {}}, "must be a non-empty list of runs"),
        ({"compute_samples_ns": [[1, 2]]}, "every run must map a stage and op"),
        ({"compute_samples_ns": [{"F0": [1]}]}, "'F0' is not a stage and op"),
        ({"n_stages": 1, "compute_samples_ns": [{"1F": [1]}]}, "names stage 1"),
        ({"n_stages": 3, "compute_samples_ns": [{"0F": [1]}]}, "a cut into 3 stages"),
    ],
)
def test_malformed_samples_are_refused_with_the_file(meta: dict[str, Any], message: str) -> None:
    schedule = generate("1f1b", n_ranks=2, n_microbatches=2)
    with pytest.raises(CostError, match=message) as info:
        samples_from_meta(schedule, meta, time_unit="ns", source="x.json")
    assert str(info.value).startswith("x.json: meta.compute_samples_ns")


def test_no_samples_is_none_and_dualpipe_draws_on_its_copy_cut() -> None:
    assert (
        samples_from_meta(generate("gpipe", n_ranks=2, n_microbatches=2), {}, time_unit="s") is None
    )
    # DualPipe's two copies each run the two-stage cut: the samples stay keyed by the cut.
    runs = samples_from_meta(
        generate("dualpipe", n_ranks=2, n_microbatches=4),
        {"n_stages": 2, "compute_samples_ns": [{"0F": [1], "1F": [2]}]},
        time_unit="ns",
    )
    assert runs == ({"0F": (1,), "1F": (2,)},)
