"""``pipesim plan`` on the command line: table, JSON, CSV, HTML, errors."""

from __future__ import annotations

import csv
import io
import json
from pathlib import Path

import pytest

from pipesim.cli import main
from pipesim.costs import CostModel, costs_to_dict

# Large enough that a fitting configuration passes the planner's sane-efficiency check
# (at 8 x 512 the kernels' fixed costs leave MFU under 10% on an H100).
BASE = [
    "plan",
    "--layers",
    "8",
    "--hidden",
    "1024",
    "--heads",
    "16",
    "--seq-length",
    "1024",
    "--vocab",
    "2000",
    "--devices",
    "8",
    "--accelerator",
    "h100-sxm",
    "--global-batch",
    "32",
    "--workers",
    "1",
]


@pytest.mark.slow
def test_table_names_the_winner_and_why(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(BASE) == 0
    out = capsys.readouterr().out
    assert "custom on 8 x h100-sxm" in out
    assert "rank" in out and "MFU" in out
    winner = next(line for line in out.splitlines() if line.startswith("winner: "))
    assert "is the fastest configuration that fits" in winner


@pytest.mark.slow
def test_json_and_csv_agree(capsys: pytest.CaptureFixture[str]) -> None:
    assert main([*BASE, "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["n_points"] == len(data["points"]) and data["best"] == data["points"][0]
    assert data["best"]["rank"] == 1 and data["best"]["fits"] is True
    assert main([*BASE, "--csv"]) == 0
    rows = list(csv.DictReader(io.StringIO(capsys.readouterr().out)))
    assert len(rows) == data["n_points"]
    assert rows[0]["schedule"] == data["best"]["schedule"]
    assert float(rows[0]["step_time_s"]) == pytest.approx(data["best"]["step_time_s"])


@pytest.mark.slow
def test_html_chart(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "plan.html"
    assert main([*BASE, "--cdn", "-o", str(out)]) == 0
    html = out.read_text()
    assert "pipesim-plan" in html and "Pareto front" in html and "capacity" in html
    assert "cdn.plot.ly" in html


def test_preset_and_cost_file_models(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert (
        main(
            [
                "plan",
                "--model",
                "llama2-7b",
                "--devices",
                "8",
                "--accelerator",
                "h200",
                "--global-batch",
                "16",
                "--stages",
                "2,4",
                "--microbatch-sizes",
                "1",
                "--workers",
                "1",
                "--json",
            ]
        )
        == 0
    )
    assert json.loads(capsys.readouterr().out)["model"] == "llama2-7b"
    costs = costs_to_dict(
        CostModel.uniform(
            forward=1000, backward=2000, activation_bytes=10**6, param_bytes=4 * 10**6
        )
    )
    costs["meta"] = {"time_unit": "us", "n_layers": 8}
    path = tmp_path / "costs.json"
    path.write_text(json.dumps(costs))
    assert (
        main(
            [
                "plan",
                "--model",
                str(path),
                "--devices",
                "4",
                "--accelerator",
                "a100-80gb",
                "--global-batch",
                "16",
                "--workers",
                "1",
                "--json",
            ]
        )
        == 0
    )
    data = json.loads(capsys.readouterr().out)
    assert data["model"] == "costs" and data["best"]["mfu"] is None


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--devices", "12"], "whole number of 8-GPU nodes"),
        (["--stages", "3"], "does not divide 8 devices"),
        (
            ["--global-batch", "1", "--stages", "1", "--tensor-parallel", "1"],
            "global batch 1 cannot be split",
        ),
        # 8 devices at p = 1, 2, 4, 8: data parallel 8, 4, 2, 1 x micro-batch 3 = 24, 12, 6,
        # 3; the nearest multiples of 3 around 64 are 21 x 3 and 22 x 3
        (
            ["--global-batch", "64", "--microbatch-sizes", "3", "--tensor-parallel", "1"],
            "(here one of [3, 6, 12, 24]); use a global batch of 63 or 66,",
        ),
        # one piece of 1000 (p = 8, data parallel 1) is more than the whole batch of 32
        (
            ["--microbatch-sizes", "1000", "--stages", "8", "--tensor-parallel", "1"],
            "(here one of [1000]); use a global batch of 1000,",
        ),
        (["--accelerator", "v100"], "unknown accelerator 'v100'"),
        (["--schedules", "nope"], "unknown schedule 'nope'"),
        (["--model", "gpt-9"], "unknown model 'gpt-9'"),
        (["--microbatch-sizes", "a"], "comma-separated whole numbers"),
        (["--context-parallel", "2"], "needs fused (flash) attention"),
        (["--context-parallel", "3", "--flash-attention"], "does not divide 8 devices"),
        (["--dtype", "fp8", "--accelerator", "a100-80gb"], "a100-80gb has no FP8 tensor cores"),
    ],
)
def test_bad_input_is_one_clear_line(
    extra: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main([*BASE, *extra]) == 1
    err = capsys.readouterr().err
    assert err.startswith("pipesim: error: ") and message in err
    assert "Traceback" not in err


def test_missing_arguments(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plan", "--model", "llama2-7b"]) == 1
    assert "needs --devices, --accelerator, --global-batch" in capsys.readouterr().err


def test_list_presets(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plan", "--list"]) == 0
    out = capsys.readouterr().out
    assert "gpt3-175b" in out and "h100-sxm" in out


@pytest.mark.slow
def test_require_fit(capsys: pytest.CaptureFixture[str]) -> None:
    """Exit 1 when no configuration fits (the table is printed first), 0 when one does."""
    assert main([*BASE, "--require-fit"]) == 0
    capsys.readouterr()
    # 1 MB cannot hold even the parameters of an 8-layer, 1024-wide model (millions of them)
    assert main([*BASE, "--memory-capacity", "1e6", "--require-fit"]) == 1
    captured = capsys.readouterr()
    assert "--require-fit: no configuration fits the memory capacity" in captured.err
    assert "custom on 8 x h100-sxm" in captured.out
    # without the flag a finished sweep exits 0 whatever it found, as `simulate` does on
    # a result that does not fit: --require-fit is the switch for CI
    assert main([*BASE, "--memory-capacity", "1e6"]) == 0
    captured = capsys.readouterr()
    assert "nothing fits in" in captured.out and captured.err == ""


def test_help_and_readme_state_the_exit_statuses(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["plan", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "0 the sweep finished: a recommendation, or why there is none" in text
    assert "1 with --require-fit (for CI): no configuration is recommended" in text
    page = Path(__file__).parent.parent / "docs" / "guide" / "plan.md"
    readme = " ".join(page.read_text().split())
    assert "`plan` exits 0 when the sweep finished, whatever it found" in readme
    assert "with `--require-fit`, 1 when no configuration is recommended" in readme


@pytest.mark.parametrize(
    ("flag", "value", "shown", "limit"),
    [
        ("--memory-headroom", "nan", "'nan'", "to below 1"),
        ("--memory-headroom", "1", "1.0", "to below 1"),
        ("--memory-headroom", "-0.1", "-0.1", "to below 1"),
        ("--min-mfu", "2", "2.0", "to 1"),
        ("--min-mfu", "1.0000001", "1.0000001", "to 1"),
        ("--min-mfu", "1e999", "inf", "to 1"),
        ("--min-mfu", "half", "'half'", "to 1"),
    ],
)
def test_a_bad_share_is_a_usage_error_naming_the_flag(
    flag: str, value: str, shown: str, limit: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as info:
        main([*BASE, f"{flag}={value}"])
    err = capsys.readouterr().err
    assert info.value.code == 2
    assert err.startswith(f"pipesim: error: {flag} must be a number from 0 {limit}, got {shown}")


def test_a_share_is_read_as_given() -> None:
    from pipesim.cli._common import read_value

    assert read_value("memory_headroom", "0.25", name="--memory-headroom") == 0.25
    assert read_value("min_mfu", "1", name="--min-mfu") == 1.0  # all of peak is allowed


def test_a_sweep_past_max_sweep_actions_is_refused_at_once(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """8 devices and 10^6 sequences: configurations of up to 10^6 micro-batches, billions
    of actions in all (tests/test_plan_budget.py counts them): exit 2 before any runs."""
    argv = ["plan", "--model", "llama2-13b", "--devices", "8", "--accelerator", "h100-sxm"]
    assert main([*argv, "--global-batch", "1000000", "--workers", "1"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("pipesim: error: the sweep of 8 devices with global batch 1000000")
    assert "MAX_SWEEP_ACTIONS in pipesim.limits" in err and "lower --global-batch" in err
    assert "Traceback" not in err


def test_a_million_devices_still_plan(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["plan", "--model", "llama2-13b", "--devices", "1000000", "--accelerator", "h100-sxm"]
    narrow = ["--stages", "8", "--schedules", "1f1b", "--tensor-parallel", "8", "--workers", "1"]
    assert main([*argv, "--global-batch", "1000000", *narrow, "--json"]) == 0
    best = json.loads(capsys.readouterr().out)["best"]
    # t p d = 8 x 8 x 15625 = 10^6 devices; m = 10^6 / (15625 b)
    assert (best["tensor_parallel"], best["pipeline"], best["data_parallel"]) == (8, 8, 15_625)
    assert best["fits"] is True
    assert best["n_microbatches"] * best["microbatch_size"] * 15_625 == 1_000_000


def test_context_parallel_fp8_and_comm_overlap(capsys: pytest.CaptureFixture[str]) -> None:
    flash = [*BASE, "--flash-attention", "--microbatch-sizes", "1", "--virtual", "1"]
    assert main([*flash, "--context-parallel", "1,2", "--json"]) == 0
    points = json.loads(capsys.readouterr().out)["points"]
    assert {p["context_parallel"] for p in points} == {1, 2}
    for p in points:  # every configuration fills the 8 devices: t c p d
        product = p["tensor_parallel"] * p["context_parallel"] * p["pipeline"]
        assert product * p["data_parallel"] == 8
    # FP8 GEMMs and hidden tensor-parallel collectives can only make the winner faster
    assert main([*flash, "--json"]) == 0
    plain = json.loads(capsys.readouterr().out)["points"][0]["step_time_s"]
    assert main([*flash, "--dtype", "fp8", "--json"]) == 0
    delayed = json.loads(capsys.readouterr().out)
    fp8 = delayed["points"][0]
    assert fp8["step_time_s"] < plain
    # current scaling reads every cast tensor once more for its amax: every configuration
    # is slower, so the winner is
    assert main([*flash, "--dtype", "fp8", "--fp8-recipe", "tensorwise", "--json"]) == 0
    tensorwise = json.loads(capsys.readouterr().out)
    current = tensorwise["points"][0]
    assert current["step_time_s"] > fp8["step_time_s"]
    # Megatron-LM's flags name the recipe unless it is Megatron-Core's default (delayed)
    assert "--fp8-format hybrid --fp8-recipe tensorwise" in tensorwise["megatron_args"]
    assert "--fp8-format hybrid" in delayed["megatron_args"]
    assert "--fp8-recipe" not in delayed["megatron_args"]
    assert main([*flash, "--tensor-parallel", "8", "--stages", "1", "--json"]) == 0
    exposed = json.loads(capsys.readouterr().out)["points"][0]
    assert (
        main([*flash, "--tensor-parallel", "8", "--stages", "1", "--tp-comm-overlap", "--json"])
        == 0
    )
    hidden = json.loads(capsys.readouterr().out)["points"][0]
    assert 0 < hidden["tp_comm_time_ns"] < exposed["tp_comm_time_ns"]
    assert hidden["step_time_s"] < exposed["step_time_s"]
