"""benchmarks/bench_fidelity.py: the summary's breakdown by model size and part of the grid."""

from __future__ import annotations

from types import ModuleType
from typing import Any

import pytest
from helpers import load_benchmark

pytest.importorskip("torch")  # the benchmark imports verify


def _bench() -> ModuleType:
    return load_benchmark("bench_fidelity")


def _row(
    model: str, schedule: str, error: float, model_error: float, drawn: float | None
) -> dict[str, Any]:
    return {
        "model": model,
        "schedule": schedule,
        "error_pct": error,
        "model_error_pct": model_error,
        "drawn_error_pct": drawn,
    }


def test_groups_split_sizes_and_the_grid_from_the_micro_batch_sizes() -> None:
    bench = _bench()
    rows = [
        _row("6x256", "1f1b", -4.0, -1.0, -2.0),
        _row("6x256", "zbv", 2.0, 3.0, 6.0),
        _row("6x256", "1f1b b=16", 10.0, 0.5, None),
        _row("6x512", "gpipe", -6.0, 1.0, 0.0),
    ]
    groups = bench._groups(rows)
    assert sorted(groups) == [
        "6x256 micro-batch sizes",
        "6x256 schedule grid",
        "6x512 schedule grid",
        "all micro-batch sizes",
        "all schedule grid",
    ]
    # by hand: |-4|, |2| -> mean 3, max 4, signed -1; model 1, 3 -> 2, 3, +1; drawn 2, 6
    grid = groups["6x256 schedule grid"]
    assert grid["configurations"] == 2 and grid["configurations_drawn"] == 2
    assert grid["error_pct"] == (3.0, 4.0, -1.0)
    assert grid["model_error_pct"] == (2.0, 3.0, 1.0)
    assert grid["drawn_error_pct"] == (4.0, 6.0, 2.0)
    # the three grid rows of both sizes: 4, 2, 6 -> mean 4, max 6, signed -8/3
    everything = groups["all schedule grid"]
    assert everything["error_pct"][:2] == (4.0, 6.0)
    assert everything["error_pct"][2] == pytest.approx(-8 / 3)
    # a micro-batch size row has no drawn prediction: none counted, zeros reported
    sizes = groups["6x256 micro-batch sizes"]
    assert sizes["configurations_drawn"] == 0 and sizes["drawn_error_pct"] == (0.0, 0.0, 0.0)
    line = bench._group_line("6x256 micro-batch sizes", sizes)
    assert line == (
        "  6x256 micro-batch sizes (1 configurations): error mean 10.0% max 10.0% "
        "(signed +10.0%); model error mean 0.5% max 0.5% (signed +0.5%)"
    )
    assert "drawn mean 4.0% max 6.0% (signed +2.0%)" in bench._group_line("g", grid)


def test_page_faults_summary_is_the_median_and_the_worst_configuration() -> None:
    bench = load_benchmark("bench_fidelity")
    rows = [
        {"model": "6x256", "schedule": "1f1b", "m": 4, "page_faults_max": 12},
        {"model": "6x256", "schedule": "zbv", "m": 16, "page_faults_max": None},
        {"model": "6x512", "schedule": "dualpipe", "m": 4, "page_faults_max": 3000},
        {"model": "6x512", "schedule": "gpipe", "m": 16, "page_faults_max": 40},
    ]
    assert bench._faults(rows) == {"median": 40, "max": 3000, "where": "6x512 dualpipe m=4"}
    assert bench._faults([rows[1]]) is None  # nothing counted: no line, no figure


def test_calibration_copies_become_one_measurement_per_role() -> None:
    """A plan with each calibration role three times (--calibration-copies 3) and two grid
    configurations, measured over two rounds: one entry per role remains, in plan order,
    holding the six runs of its copies in order; the grid entries are as measured."""
    from pipesim.calibration import calibration_schedule
    from pipesim.schedules import generate
    from verify.fidelity import Measurement

    bench = load_benchmark("bench_fidelity")
    cal = calibration_schedule(n_ranks=2, n_microbatches=4)
    gpipe = generate("gpipe", n_ranks=2, n_microbatches=4)
    plan = [("cal:1", cal, 8)] * 3 + [("grid", gpipe, 8)] + [("cal-b:4", cal, 4)] * 3
    plan.append(("grid", gpipe, 8))

    def runs(k: int) -> Measurement:  # two rounds: spans 10k + 1 and 10k + 2 ns
        return Measurement(
            schedule=plan[k][1],
            steps=(),
            makespans_ns=(10 * k + 1, 10 * k + 2),
            stage_bytes=(),
            page_faults=(k, None),
        )

    entries, measured = bench._combine_copies(plan, tuple(runs(k) for k in range(len(plan))))
    assert [(role, b) for role, _, b in entries] == [
        ("cal:1", 8),
        ("grid", 8),
        ("cal-b:4", 4),
        ("grid", 8),
    ]
    assert [m.makespans_ns for m in measured] == [
        (1, 2, 11, 12, 21, 22),
        (31, 32),
        (41, 42, 51, 52, 61, 62),
        (71, 72),
    ]
    assert measured[2].page_faults == (4, None, 5, None, 6, None)
