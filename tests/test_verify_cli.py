"""``pipesim verify``: the JSON contract, the chapter's numbers, exit status, clear errors."""

from __future__ import annotations

import json
import re
import statistics
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from pipesim.cli import main

# The no-torch test runs without torch; everything else needs it.


def test_without_torch_it_says_how_to_install(monkeypatch, capsys) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setitem(sys.modules, "torch", None)  # `import torch` now raises ImportError
    status = main(["verify", "1f1b", "--stages", "2", "--microbatches", "2"])
    assert status == 3  # the environment cannot run the check
    err = capsys.readouterr().err
    assert err.startswith("pipesim: error: ")
    assert "pip install 'pipesim[verify]'" in err
    assert "Traceback" not in err


def test_pipesim_cli_does_not_import_torch() -> None:
    code = (
        "import sys, pipesim, pipesim.cli; pipesim.cli.build_parser(); "
        "print('torch' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


torch_only = pytest.mark.torch


def _json(capsys, argv: list[str]) -> tuple[int, dict]:  # type: ignore[no-untyped-def,type-arg]
    pytest.importorskip("torch")
    status = main([*argv, "--json", "--warmup", "0"])
    return status, json.loads(capsys.readouterr().out)


@torch_only
def test_chapter_numbers_in_json(capsys) -> None:  # type: ignore[no-untyped-def]
    status, data = _json(
        capsys,
        [
            "verify",
            "1f1b",
            "--stages",
            "2",
            "--microbatches",
            "1",
            "--batch-size",
            "32",
            "--devices",
            "cpu,cpu",
        ],
    )
    assert status == 0
    assert data["bit_identical"] is True
    assert data["outputs_equal"] is True and data["grads_equal"] is True
    assert data["n_params"] == 20_644 and data["model_param_bytes"] == 82_576
    assert data["param_bytes"] == [43_776, 38_800]
    assert data["transfer_bytes"] == [[12_288]]
    assert [round(g, 4) for g in data["grad_norms"]] == [0.1142, 0.5349]
    assert data["max_abs_diff_full_batch"] == 0
    for key in ("measured_makespan", "predicted_makespan", "makespan_error_percent"):
        assert isinstance(data[key], float)
    assert data["measured_makespan"] > 0 and data["predicted_makespan"] > 0
    assert len(data["costs"]["stages"]) == 2


@torch_only
def test_readable_report_and_forward_only(capsys) -> None:  # type: ignore[no-untyped-def]
    pytest.importorskip("torch")
    status = main(
        [
            "verify",
            "gpipe",
            "--stages",
            "2",
            "--microbatches",
            "3",
            "--forward-only",
            "--model",
            "gpt",
            "--gpt-layers",
            "2",
            "--gpt-width",
            "32",
            "--warmup",
            "0",
        ]
    )
    out = capsys.readouterr().out
    assert status == 0
    assert "BIT-IDENTICAL" in out and "gradients n/a (forward-only)" in out
    status, data = _json(capsys, ["verify", "gpipe", "-p", "2", "-m", "3", "--forward-only"])
    assert status == 0 and data["grads_equal"] is None and data["bit_identical"] is True


@torch_only
def test_interleaved_with_virtual_stages(capsys) -> None:  # type: ignore[no-untyped-def]
    status, data = _json(
        capsys,
        ["verify", "interleaved-1f1b", "--stages", "2", "--microbatches", "4", "--virtual", "2"],
    )
    assert status == 0 and data["n_stages"] == 4 and data["layer_counts"] == [2, 2, 2, 1]


@torch_only
def test_schedule_file_and_costs_out(tmp_path: Path, capsys, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    pytest.importorskip("torch")
    # An in-process run never applies the CPU allocator setting: the file must say so.
    monkeypatch.setenv("PIPESIM_CPU_ALLOCATOR", "retain")
    from pipesim.costs import costs_from_dict as load_costs_dict
    from pipesim.costs import load_costs
    from pipesim.schedule import Schedule
    from pipesim.schedule_io import save_schedule

    split = Schedule.from_orders(
        [["0F0", "0F1", "0I0", "0I1", "0W0", "0W1"], ["1F0", "1I0", "1F1", "1I1", "1W0", "1W1"]]
    )
    path = save_schedule(split, tmp_path / "zb.json")
    costs_path = tmp_path / "costs.json"
    status, data = _json(capsys, ["verify", str(path), "--costs-out", str(costs_path)])
    assert status == 0 and data["bit_identical"] is True
    assert load_costs(costs_path).stage(0).input_grad > 0
    meta = json.loads(costs_path.read_text())["meta"]
    assert meta["microbatch_size"] == data["microbatch_sizes"][0] == data["batch_size"] // 2
    # the file pipesim calibrate writes: its fit, units and provenance
    assert meta["time_unit"] == "ns" and meta["source"] == "pipesim verify"
    assert meta["statistic"].startswith("compute: median") and meta["samples"]["0I"] == 2
    assert "overheads: median over the measured steps of each step's mean" in meta["statistic"]
    assert meta["cpu_allocator"] == "system"
    assert load_costs(costs_path) == load_costs_dict(data["costs"])
    # The step's own compute samples, one run: their medians are the fitted compute, and
    # pipesim simulate --costs draws its band from them.
    (run,) = meta["compute_samples_ns"]
    assert sorted(run) == ["0F", "0I", "0W", "1F", "1I", "1W"]
    assert all(len(run[key]) == 2 for key in run) and meta["compute_run_spread_pct"]["0F"] == 0
    costs = load_costs(costs_path)
    # (the fit keeps whole ns: a median between two samples may lose its half)
    assert abs(statistics.median(run["1W"]) - costs.stage(1).weight_grad) <= 0.5
    assert abs(statistics.median(run["0F"]) - costs.stage(0).forward) <= 0.5
    assert main(["simulate", str(path), "--costs", str(costs_path), "--json"]) == 0
    band = json.loads(capsys.readouterr().out)["band"]
    assert band["runs"] == 1 and band["low"] <= band["drawn"] <= band["high"]


@pytest.fixture
def models_module(tmp_path: Path, monkeypatch) -> str:  # type: ignore[no-untyped-def]
    (tmp_path / "cli_models.py").write_text(
        textwrap.dedent("""
        from torch import nn

        class Drift(nn.Module):
            '''Adds how often it was called: a model that is not a function of its input.'''
            calls = 0

            def forward(self, x):
                Drift.calls += 1
                return x + Drift.calls

        def drifting():
            return [nn.Linear(4, 8), Drift(), nn.Linear(8, 2)]

        def dropout():
            return [nn.Linear(4, 8), nn.Dropout(0.5), nn.Linear(8, 2)]

        def fine():
            return [nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 2)]

        class Reshape(nn.Module):
            def forward(self, x):
                return x.reshape(x.shape[0], 3, -1)  # 8 features do not split in 3

        def broken():
            return [nn.Linear(4, 4), nn.Linear(4, 8), Reshape(), nn.Linear(8, 2)]
    """)
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    return "cli_models"


@torch_only
def test_factory_model_and_failed_check_exit_status(models_module: str, capsys) -> None:  # type: ignore[no-untyped-def]
    status, data = _json(
        capsys, ["verify", "1f1b", "-p", "2", "-m", "2", "--model", f"{models_module}:fine"]
    )
    assert status == 0 and data["model"] == "cli_models:fine"
    status, data = _json(
        capsys, ["verify", "1f1b", "-p", "2", "-m", "2", "--model", f"{models_module}:drifting"]
    )
    assert status == 1
    assert data["bit_identical"] is False and data["outputs_equal"] is False
    # The first difference: which tensor, by how much, and the action that made it.
    first = data["mismatches"][0]
    assert re.fullmatch(r"output of micro-batch 0 \(max abs diff [0-9.e+]+, made by 1F0\)", first)
    assert any(
        re.fullmatch(
            r"gradient of 2\.weight \(stage 1\) \(max abs diff .*, added by 1B0\.\.1B1\)", m
        )
        for m in data["mismatches"]
    ), data["mismatches"]
    # The gradients' first line names the exact action (a re-run checked after each B).
    located = "gradients first differ after 1B0 (stage 1)"
    assert any(m.startswith(located) for m in data["mismatches"]), data["mismatches"]


@torch_only
@pytest.mark.parametrize(
    ("argv", "message", "expected_status"),
    [
        (["--model", "resnet"], "unknown model 'resnet'; valid models are: mlp, gpt", 2),
        (["--model", "nope_pkg.x:build"], "cannot import module 'nope_pkg.x'", 2),
        (["--model", "cli_models:dropout"], "dropout layer '1' (Dropout, p=0.5) is in training", 3),
        (["--devices", "gpu0"], "unknown device 'gpu0'; use cpu or cuda:N", 2),
        (["--device", "cuda:99"], "device 'cuda:99' is not present (CUDA devices here: ", 3),
        (["--devices", "cpu,cpu,cpu"], "got 3 devices (cpu,cpu,cpu) for 2 ranks", 2),
        (["--batch-size", "3"], "a batch of 3 rows cannot make 4 micro-batches", 2),
        (["--split", "5,5"], "layer counts [5, 5] do not cut 7 layers into 2 stages", 2),
        (["--split", "4;3"], "--split '4;3': give whole numbers separated by commas", 2),
        (["--stages", "9"], "cannot cut a model of 7 layers into 9 stages", 2),
        (["--model", "cli_models:broken"], "the run failed inside torch: ", 4),
    ],
)
def test_bad_input_is_a_clear_error(
    argv: list[str], message: str, expected_status: int, models_module: str, capsys
) -> None:  # type: ignore[no-untyped-def]
    pytest.importorskip("torch")
    base = ["verify", "1f1b", "--stages", "2", "--microbatches", "4", "--warmup", "0"]
    status = main([*base, *argv])
    err = capsys.readouterr().err
    assert status == expected_status, err
    assert err.startswith("pipesim: error: ") and message in err
    assert "Traceback" not in err
