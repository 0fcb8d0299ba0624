"""``pipesim calibrate``: real CPU ranks, a cost file with units and provenance, checks.

The figures themselves depend on the machine; these tests check what the file
holds and that the pieces fit together (the arithmetic is tests/test_calibration.py).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from pipesim.calibration import calibration_schedule, predict  # noqa: E402
from pipesim.cli import main  # noqa: E402
from pipesim.costs import costs_from_dict  # noqa: E402
from pipesim.scaling import costs_at_microbatch_size  # noqa: E402
from pipesim.schedules import generate  # noqa: E402

pytestmark = [pytest.mark.torch, pytest.mark.dist, pytest.mark.timeout(240)]


def test_calibrate_writes_a_cost_file_with_provenance_and_checks(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    # Unset: the rank processes apply the default, retain, and the file says so.
    monkeypatch.delenv("PIPESIM_CPU_ALLOCATOR", raising=False)
    out = tmp_path / "mlp.json"
    status = main(
        [
            "calibrate",
            "--model",
            "mlp",
            "-p",
            "2",
            "-m",
            "2",
            "--microbatch-sizes",
            "2",
            "--repeats",
            "1",
            "--copies",
            "1",
            "--max-repeats",
            "1",
            "--warmup",
            "0",
            "--timeout",
            "120",
            "-o",
            str(out),
            "--check",
            "gpipe",
            "--check-microbatches",
            "2",
        ]
    )
    text = capsys.readouterr().out
    assert status == 0, text
    data = json.loads(out.read_text())
    meta = data["meta"]
    assert meta["time_unit"] == "ns"
    assert meta["threads_per_rank"] == 1 and meta["microbatch_size"] == 2
    assert meta["cpu_allocator"] == "retain"
    assert meta["schedule"] == calibration_schedule(n_ranks=2, n_microbatches=2).name
    assert (meta["n_ranks"], meta["n_stages"], meta["repeats"]) == (2, 2, 1)
    assert meta["burn_in_steps"] == 0  # --warmup 0: the very first step, as asked
    assert meta["assumed"] == []  # F, B, I and W all measured
    assert meta["samples"]["0I"] == 1 and meta["samples"]["1B"] == 1
    # Each fitted figure's samples and spread; one step: no step to leave out, and the
    # figures resting on one sample (below --min-samples' 20) are named as unstable.
    assert meta["terms"]["0I"]["samples"] == 1 and meta["terms"]["0F"]["samples"] == 2
    assert meta["terms"]["0F"]["steps"] == 1 and meta["terms"]["0F"]["step_shift"] is None
    assert meta["terms"]["0F"]["p10"] <= meta["terms"]["0F"]["value"] <= meta["terms"]["0F"]["p90"]
    assert {k: t["samples"] for k, t in meta["terms"].items()} == meta["samples"]
    assert (meta["rounds"], meta["copies_per_round"]) == (1, 1)
    assert "WARNING: 0I = " in text and "1 samples (fewer than 20)" in text
    # One run's own compute times per stage and op: two forwards and one of each backward
    # per stage (m=2, the odd one split), their median the file's time; one run, no spread.
    (run,) = meta["compute_samples_ns"]
    assert sorted(run) == ["0B", "0F", "0I", "0W", "1B", "1F", "1I", "1W"]
    assert [len(run[k]) for k in ("0F", "1F", "0B", "1W")] == [2, 2, 1, 1]
    assert data["stages"][1]["forward"] == round(sum(run["1F"]) / 2)
    assert data["stages"][0]["weight_grad"] == run["0W"][0]
    assert set(meta["compute_run_spread_pct"].values()) == {0.0}
    # --warmup 0: the one measured step is its fresh processes' first, so it touched new
    # memory pages; the file keeps the count and calibrate prints it.
    (faults,) = meta["measured_step_page_faults"]
    assert isinstance(faults, int) and faults > 0
    assert f"page faults in the measured step, the most on one rank: {faults:,}" in text
    costs = costs_from_dict(data)
    assert costs.time_unit == "ns"
    assert all(s.forward > 0 and s.backward > 0 and s.weight_grad > 0 for s in costs.stages)
    assert costs.stage(0).output_bytes == 2 * 96 * 4  # 2 rows of the MLP's 96-wide hidden
    assert costs_at_microbatch_size(costs, meta, 2) == costs  # measured at one size only
    assert predict(calibration_schedule(n_ranks=2, n_microbatches=2), costs) > 0
    assert "gpipe" in text and "error: mean" in text and "p10-p90 band" in text
    assert "drawn error: mean" in text
    # simulate draws the same band from the file (pipesim.band.draw_prediction); its
    # deterministic figure on the measured span is calibrate's prediction.
    assert main(["simulate", "gpipe", "-p", "2", "-m", "2", "--costs", str(out), "--json"]) == 0
    band = json.loads(capsys.readouterr().out)["band"]
    gpipe = generate("gpipe", n_ranks=2, n_microbatches=2)
    assert band["predicted"] == predict(gpipe, costs) and band["runs"] == 1
    assert band["low"] <= band["drawn"] <= band["high"] and band["draws"] == 200


def test_three_sizes_are_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    status = main(["calibrate", "--microbatch-sizes", "2,4,8", "-o", str(tmp_path / "c.json")])
    assert status == 1
    assert "one or two sizes" in capsys.readouterr().err


def test_a_check_on_another_cut_is_refused_before_running(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "c.json"
    status = main(["calibrate", "-p", "2", "--check", "zbv", "-o", str(out)])
    assert status == 1
    assert "does not run on a cut into 2 stages" in capsys.readouterr().err
    assert not out.exists()


def test_measure_all_runs_each_schedule_once_per_round_at_its_own_size() -> None:
    """Two schedules, two rounds (fresh rank processes each), 2 and 3 rows per
    micro-batch: every schedule has one step per round, with its own actions, bit-identical
    (else measure_all raises), and the message sizes of its own rows (the MLP's 96-wide
    hidden in float32); the replay of a step with its own fit is a positive span."""
    from pipesim.calibration import fit_costs, measured_makespan, replay
    from verify.fidelity import measure_all

    rounds: list[int] = []
    schedules = [
        generate("gpipe", n_ranks=2, n_microbatches=2),
        calibration_schedule(n_ranks=2, n_microbatches=4),
    ]
    got = measure_all(
        schedules,
        model="mlp",
        microbatch_size=[2, 3],
        repeats=2,
        warmup=0,
        timeout_s=120,
        on_round=lambda k, seconds: rounds.append(k),
    )
    assert rounds == [0, 1]
    for schedule, found, rows in zip(schedules, got, (2, 3), strict=True):
        assert found.schedule is schedule and len(found.steps) == 2
        names = sorted(str(w) for order in schedule.orders for w in order)
        for step in found.steps:
            assert sorted(str(r.work) for r in step.trace.actions) == names
        assert found.makespans_ns == tuple(measured_makespan(s.trace) for s in found.steps)
        assert found.stage_bytes[0].output_bytes == rows * 96 * 4
    fit = fit_costs(got[1].steps)
    assert replay(got[1].steps[0], fit.costs) > 0


def test_cost_lines_print_each_op_per_stage_and_the_overheads_by_hand() -> None:
    from pipesim.cli._calibrate import _cost_lines
    from pipesim.costs import CostModel, Link, StageCost

    costs = CostModel(
        stages=(StageCost(forward=1_234_567, backward=2_000_000), StageCost(forward=500_000)),
        link=Link(latency=7_000, send_overhead=2_000, receive_overhead=3_400),
        dispatch_overhead=1_000,
    )
    assert _cost_lines(costs, digits=2) == [
        "F per stage (ms): 1.23/0.50",
        "B per stage (ms): 2.00/0.00",
        "I per stage (ms): 0.00/0.00",
        "W per stage (ms): 0.00/0.00",
        "per message: send 2 us, receive 3 us, latency 7 us; per action: dispatch 1 us",
    ]
    assert _cost_lines(costs, digits=3)[0] == "F per stage (ms): 1.235/0.500"
