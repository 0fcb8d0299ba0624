"""``pipesim synthesize``: files that validate, JSON, errors; plot and verify replay them."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pipesim import load_schedule, simulate, validate
from pipesim.cli import main

_COSTS = [
    "--forward-time",
    "2,2,3",
    "--input-grad-time",
    "2,3,3",
    "--weight-grad-time",
    "1,1,2",
    "--activation-bytes",
    "100",
    "--weight-grad-bytes",
    "40",
]


@pytest.mark.parametrize("suffix", [".json", ".csv"])
def test_written_schedule_validates_and_fits(tmp_path: Path, capsys, suffix: str) -> None:  # type: ignore[no-untyped-def]
    out = tmp_path / f"s{suffix}"
    status = main(
        ["synthesize", "-p", "3", "-m", "6", "--memory-limit", "3", *_COSTS, "-o", str(out)]
    )
    assert status == 0
    text = capsys.readouterr().out
    assert "synthesized" in text and "best built-in" in text and "lower bound" in text
    schedule = load_schedule(out)
    validate(schedule)
    assert schedule.n_ranks == 3 and schedule.n_microbatches == 6


def test_json_is_simulate_json_plus_the_bound(tmp_path: Path, capsys) -> None:  # type: ignore[no-untyped-def]
    out = tmp_path / "s.json"
    argv = ["synthesize", "-p", "3", "-m", "6", "--memory-limit", "3", *_COSTS, "-o", str(out)]
    assert main([*argv, "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert main(["simulate", str(out), *_COSTS, "--json"]) == 0
    simulated = json.loads(capsys.readouterr().out)
    for key in ("makespan", "bubble_ratio", "idle_slots", "ranks", "n_ranks", "n_stages"):
        assert data[key] == simulated[key]
    assert data["makespan"] >= data["lower_bound"] > 0
    assert data["gap"] == pytest.approx(data["makespan"] / data["lower_bound"] - 1)
    assert all(peak <= 300 for peak in data["limit_peak_bytes"])
    assert data["memory_limit_bytes"] == [300, 300, 300]
    assert data["winner"] in {c["name"] for c in data["candidates"]}
    assert data["best_builtin"]["makespan"] >= data["makespan"]


def test_v_placement_file_keeps_the_v(tmp_path: Path, capsys) -> None:  # type: ignore[no-untyped-def]
    out = tmp_path / "v.json"
    assert (
        main(
            [
                "synthesize",
                "-p",
                "2",
                "-m",
                "4",
                "--placement",
                "v",
                "--memory-limit",
                "1",
                "-o",
                str(out),
            ]
        )
        == 0
    )
    assert load_schedule(out).placement == (0, 1, 1, 0)


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--memory-limit", "0.5"], "below one micro-batch"),
        (["--memory-limit", "2", "--placement", "v", "--virtual", "3"], "virtual 2"),
        (["--memory-limit", "2", "--forward-time", "1,2"], "one per stage"),
    ],
)
def test_bad_input_is_one_clear_line(capsys, argv: list[str], message: str) -> None:  # type: ignore[no-untyped-def]
    assert main(["synthesize", "-p", "3", "-m", "4", *argv]) == 1
    err = capsys.readouterr().err
    assert err.startswith("pipesim: error: ") and message in err and "Traceback" not in err


@pytest.mark.parametrize("seconds", ["0", "-1", "nan", "inf"])
def test_a_bad_time_limit_is_a_usage_error(capsys, seconds: str) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(SystemExit) as info:
        main(["synthesize", "-p", "3", "-m", "4", "--memory-limit", "2", "--time-limit", seconds])
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("pipesim: error: argument --time-limit: ") and repr(seconds) in err


def test_plot_draws_a_synthesized_schedule(tmp_path: Path) -> None:
    out = tmp_path / "s.json"
    assert main(["synthesize", "-p", "3", "-m", "6", "--memory-limit", "6", "-o", str(out)]) == 0
    html = tmp_path / "s.html"
    assert main(["plot", str(out), "-o", str(html)]) == 0
    text = html.read_text()
    makespan = simulate(load_schedule(out)).metrics.makespan
    assert f"makespan {makespan}" in text


@pytest.mark.torch
def test_verify_replays_a_synthesized_schedule_bit_identical(tmp_path: Path, capsys) -> None:  # type: ignore[no-untyped-def]
    pytest.importorskip("torch")
    out = tmp_path / "s.json"
    assert (
        main(
            ["synthesize", "-p", "2", "-m", "4", "--memory-limit", "2", *_COSTS[:0], "-o", str(out)]
        )
        == 0
    )
    capsys.readouterr()
    status = main(["verify", str(out), "--json", "--warmup", "0", "--devices", "cpu,cpu"])
    data = json.loads(capsys.readouterr().out)
    assert status == 0 and data["bit_identical"] is True


@pytest.mark.parametrize(
    ("unit", "forward", "bound"), [("ms", "1.5", "15.5 ms"), (None, "1", "13 units")]
)
def test_the_table_says_the_time_unit(capsys, unit: str | None, forward: str, bound: str) -> None:  # type: ignore[no-untyped-def]
    # Rank 1 starts after one forward, then runs m = 4 times F + I + W (I = W = 1): the
    # bound is F + 4 (F + 2), which 1F1B-like orders reach on two ranks (gap 0).
    unit_flags = ["--time-unit", unit] if unit else []
    argv = ["synthesize", "-p", "2", "-m", "4", "--memory-limit", "2", "--forward-time", forward]
    assert main([*argv, *unit_flags]) == 0
    out = capsys.readouterr().out
    assert f"makespan ({bound.split()[1]})" in out
    assert f"lower bound {bound}: gap 0.0%" in out


def _candidates_tried(n_ranks: int, n_microbatches: int) -> int:
    """The oracle: one per greedy policy the problem gets plus one per registered
    schedule (each is tried, or refused by its rules)."""
    from pipesim.schedules import schedule_names
    from pipesim.synth.policies import policies
    from pipesim.synth.problem import make_problem

    problem = make_problem(n_ranks=n_ranks, n_microbatches=n_microbatches, memory_limit=4)
    return len(policies(problem)) + len(schedule_names())


@pytest.mark.parametrize("fmt", [[], ["--json"]])
def test_progress_goes_to_stderr_and_leaves_stdout_alone(capsys, fmt: list[str]) -> None:  # type: ignore[no-untyped-def]
    argv = ["synthesize", "-p", "4", "-m", "16", "--memory-limit", "4", *fmt]
    assert main(argv) == 0
    plain = capsys.readouterr()
    assert plain.err == ""  # not a terminal: no bar unless asked
    assert main([*argv, "--progress"]) == 0
    shown = capsys.readouterr()
    assert shown.out == plain.out  # byte-identical
    total = _candidates_tried(4, 16)
    assert shown.err.startswith("\rsynthesizing:   0%|") and f"| 0/{total} [" in shown.err
    assert f"| {total}/{total} [" in shown.err  # the last state stays in a non-terminal log
    assert main([*argv, "--no-progress"]) == 0
    assert capsys.readouterr() == plain


def test_the_library_reports_each_candidate_once() -> None:
    from pipesim.synth import synthesize

    calls: list[tuple[int, int]] = []
    synthesize(
        n_ranks=4, n_microbatches=16, memory_limit=4, progress=lambda d, t: calls.append((d, t))
    )
    total = _candidates_tried(4, 16)
    assert calls == [(done, total) for done in range(total + 1)]
