"""Units and command-line habits: time units carried from costs to every output, binary
bytes, --require-fit, did-you-mean, python -m pipesim, shell completion, -o suffixes.

Oracles: hand-computed conversions (1 GiB = 2**30 bytes, 378,809,301 ns = 378.809 ms),
1F1B's closed forms (makespan (m+p-1)(F+B), peak p - r micro-batches on rank r), and
bash's own completion machinery run on the generated script.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from fractions import Fraction
from pathlib import Path

import pytest

from pipesim.cli import main
from pipesim.costs import CostModel, costs_from_dict, costs_to_dict, load_costs
from pipesim.engine import simulate
from pipesim.errors import CostError, ParseError, PipesimError, UnknownNameError
from pipesim.plan import accelerator_from_dict, get_accelerator
from pipesim.schedules import generate
from pipesim.units import (
    binary_scale,
    display_scale,
    format_bytes,
    format_duration,
    parse_bytes,
    time_axis_title,
)


# -- units -----------------------------------------------------------------------------
def test_binary_bytes_never_si() -> None:
    assert format_bytes(15 * 10**9) == "14 GiB"  # 15e9 / 2**30 = 13.97
    assert format_bytes(80 * 2**30) == "80 GiB"
    assert format_bytes(1023) == "1023 B"
    assert format_bytes(2**20 + 2**19) == "1.5 MiB"
    assert binary_scale(15 * 10**9) == (2**30, "GiB")
    assert binary_scale(3 * 2**40) == (2**40, "TiB")


@pytest.mark.parametrize(
    ("unit", "largest", "factor", "shown"),
    [
        ("unit", 10**9, Fraction(1), "unit"),
        ("ns", 378_809_301, Fraction(1, 10**6), "ms"),
        ("ns", 999, Fraction(1), "ns"),
        ("ns", 5 * 10**9, Fraction(1, 10**9), "s"),
        ("s", Fraction(1, 50), Fraction(1000), "ms"),
        ("us", 1500, Fraction(1, 1000), "ms"),
    ],
)
def test_display_scale(unit: str, largest: int, factor: Fraction, shown: str) -> None:
    assert display_scale(unit, largest) == (factor, shown)


def test_format_duration_and_axis_titles() -> None:
    assert format_duration(378_809_301, "ns") == "378.809 ms"
    assert format_duration(33, "unit") == "33 units"
    assert time_axis_title("unit") == "time (units)" and time_axis_title("ns") == "time (ns)"


# -- the cost model's time unit ----------------------------------------------------------
def test_cost_model_time_unit_round_trips_and_is_checked(tmp_path: Path) -> None:
    costs = CostModel.uniform(forward=3, time_unit="ns")
    assert costs_from_dict(costs_to_dict(costs)).time_unit == "ns"
    # a cost file from verify names its unit in meta; a top-level key wins over meta
    assert costs_from_dict({"stage": {}, "meta": {"time_unit": "ns"}}).time_unit == "ns"
    assert (
        costs_from_dict({"stage": {}, "time_unit": "ms", "meta": {"time_unit": "ns"}}).time_unit
        == "ms"
    )
    assert costs_from_dict({"stage": {}}).time_unit == "unit"
    with pytest.raises(ParseError, match="time_unit: unknown time unit 'h'"):
        costs_from_dict({"stage": {}, "time_unit": "h"}, source="c.json")
    with pytest.raises(UnknownNameError, match="unknown time unit 'sec'"):
        CostModel(time_unit="sec")
    path = tmp_path / "c.json"
    path.write_text(json.dumps({"stage": {"forward": 5}, "meta": {"time_unit": "us"}}))
    assert load_costs(path).time_unit == "us"


def test_metrics_carry_the_unit() -> None:
    sim = simulate(
        generate("1f1b", n_ranks=2, n_microbatches=2), costs=CostModel.uniform(time_unit="ms")
    )
    assert sim.metrics.time_unit == "ms"
    assert sim.metrics.to_dict()["time_unit"] == "ms"


def test_cli_time_unit_in_json_and_table(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["simulate", "1f1b", "-p", "4", "-m", "8", "--forward-time", "1000000"]
    assert main([*argv, "--backward-time", "2000000", "--time-unit", "ns", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["time_unit"] == "ns" and data["makespan"] == 33_000_000  # (m+p-1)(F+B)
    assert main([*argv, "--backward-time", "2000000", "--time-unit", "ns"]) == 0
    out = capsys.readouterr().out
    assert "makespan 33000000 ns (33 ms)" in out
    assert "busy (ns)" in out and "idle (ns)" in out
    assert main(["simulate", "1f1b", "-p", "2", "-m", "2"]) == 0
    assert "makespan 9 units" in capsys.readouterr().out  # (2+2-1)(1+2)


def test_cli_cost_file_unit_and_conflicting_flag(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "costs.json"
    path.write_text(
        json.dumps({"stage": {"forward": 10, "backward": 20}, "meta": {"time_unit": "ns"}})
    )
    assert main(["simulate", "1f1b", "-p", "2", "-m", "2", "--costs", str(path), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["time_unit"] == "ns"
    argv = ["simulate", "1f1b", "-p", "2", "-m", "2", "--costs", str(path), "--time-unit", "ms"]
    assert main(argv) == 1
    assert "--time-unit ms disagrees" in capsys.readouterr().err


def test_simulate_table_bytes_are_binary(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["simulate", "1f1b", "-p", "4", "-m", "8", "--activation-bytes", "1e6"]
    assert main([*argv, "--memory-capacity", str(80 * 2**30)]) == 0
    out = capsys.readouterr().out
    assert "4,000,000 (3.81 MiB)" in out  # rank 0 holds p = 4 micro-batches of 1e6 bytes
    assert f"memory capacity {80 * 2**30:,} bytes (80 GiB): fits" in out


# -- reading sizes: one parser for every flag and field -------------------------------
@pytest.mark.parametrize(
    ("text", "n_bytes"),
    [
        ("80GiB", 80 * 2**30),
        ("80 gib", 80 * 2**30),
        ("80GB", 80 * 10**9),
        ("80gb", 80 * 10**9),
        ("1.5 KiB", 1536),
        ("1.5kb", 1500),
        ("0.1KiB", 102),  # 102.4 bytes, rounded down
        ("1/2 MiB", 2**19),
        ("2TB", 2 * 10**12),
        ("1tib", 2**40),
        ("512 mb", 512 * 10**6),
        ("1e9B", 10**9),
        ("7 b", 7),
        ("85899345920", 80 * 2**30),
        ("80e9", 80 * 10**9),
        (80e9, 80 * 10**9),  # a JSON number
        (12, 12),
    ],
)
def test_parse_bytes_by_hand(text: object, n_bytes: int) -> None:
    assert parse_bytes(text, name="x") == n_bytes


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("80XB", "--memory-capacity: unknown unit 'XB' in '80XB'; give a whole number of bytes"),
        ("2 GB/s", "unknown unit 'GB/s'"),
        ("GiB", "cannot read 'GiB' as a size"),
        ("", "cannot read '' as a size"),
        ("nan", "cannot read 'nan' as a size"),
        ("1.5", "'1.5' is not a whole number of bytes"),
        (True, "cannot read True as a size"),
        ("0", "--memory-capacity must be at least 1 byte, got '0'"),
        ("-1GiB", "must be at least 1 byte, got '-1GiB'"),
        ("1e39TiB", "too large to compute with exactly"),
    ],
)
def test_parse_bytes_refusals_name_the_value_and_the_forms(value: object, message: str) -> None:
    with pytest.raises(CostError) as info:
        parse_bytes(value, name="--memory-capacity", minimum=1)
    assert message in str(info.value)
    if "cannot read" in message or "unknown unit" in message:
        assert "KiB, MiB, GiB, TiB (1024-based)" in str(info.value)


def test_every_size_flag_and_field_reads_units(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # 1F1B: rank 0 holds p = 4 micro-batches (Narayanan et al. 2021), 4 MiB of 1 MiB each.
    base = ["simulate", "1f1b", "-p", "4", "-m", "8", "--json"]
    assert main([*base, "--activation-bytes", "1MiB", "--memory-capacity", "4 mib"]) == 0
    flags = json.loads(capsys.readouterr().out)
    assert flags["ranks"][0]["peak_activation_bytes"] == 4 * 2**20
    assert flags["memory_capacity_bytes"] == 4 * 2**20 and flags["fits"] is True
    path = tmp_path / "costs.json"
    path.write_text(
        json.dumps({"stage": {"activation_bytes": "1MiB"}, "memory_capacity_bytes": "4MiB"})
    )
    assert main([*base, "--costs", str(path)]) == 0
    assert json.loads(capsys.readouterr().out) == flags
    preset = get_accelerator("h100-sxm").to_dict()
    assert accelerator_from_dict({**preset, "memory_bytes": "80GiB"}).memory_bytes == 80 * 2**30
    # synthesize: 4 micro-batches of 1 MiB each are the same limit as 4MiB
    synth = ["synthesize", "-p", "4", "-m", "8", "--activation-bytes", "1MiB", "--json"]
    assert main([*synth, "--memory-limit", "4MiB"]) == 0
    in_bytes = json.loads(capsys.readouterr().out)
    assert main([*synth, "--memory-limit", "4"]) == 0
    in_microbatches = json.loads(capsys.readouterr().out)
    assert in_bytes["memory_limit"] == f"{4 * 2**20:,} bytes"
    assert in_bytes["makespan"] == in_microbatches["makespan"]


@pytest.mark.parametrize("command", ["simulate", "plan"])
def test_memory_capacity_reads_units_in_every_command(
    command: str, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = {
        "simulate": ["simulate", "1f1b", "-p", "2", "-m", "2", "--json"],
        "plan": [
            *("plan", "--layers", "4", "--hidden", "256", "--heads", "4", "--seq-length", "256"),
            *("--vocab", "1000", "--devices", "4", "--accelerator", "h100-sxm"),
            *("--global-batch", "8", "--workers", "1", "--json"),
        ],
    }[command]
    assert main([*argv, "--memory-capacity", "80GiB"]) == 0
    assert json.loads(capsys.readouterr().out)["memory_capacity_bytes"] == 80 * 2**30
    # a bad size: tests/test_cli.py, test_a_bad_size_flag_names_the_flag_the_value_and_the_forms


# -- --require-fit -------------------------------------------------------------------------
@pytest.mark.parametrize(("capacity", "status"), [("4000000", 0), ("3999999", 1)])
def test_require_fit(capacity: str, status: int, capsys: pytest.CaptureFixture[str]) -> None:
    # 1F1B rank 0 peaks at p * activation_bytes = 4e6 bytes
    argv = ["simulate", "1f1b", "-p", "4", "-m", "8", "--activation-bytes", "1e6"]
    assert main([*argv, "--memory-capacity", capacity, "--require-fit"]) == status
    captured = capsys.readouterr()
    assert "1f1b: 4 ranks" in captured.out  # the result is printed either way
    if status:
        assert "--require-fit: the peak memory of some rank does not fit" in captured.err
    assert main([*argv, "--memory-capacity", capacity]) == 0  # without the flag: report only


def test_require_fit_needs_a_capacity(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["simulate", "1f1b", "-p", "2", "-m", "2", "--require-fit"]) == 1
    assert "give --memory-capacity" in capsys.readouterr().err


# -- did-you-mean, python -m, suffixes -----------------------------------------------------
def test_did_you_mean_on_names(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["simulate", "1fb1", "-p", "2", "-m", "2"]) == 1
    assert "unknown schedule '1fb1' (did you mean '1f1b'?)" in capsys.readouterr().err
    assert main(["simulate", "zero-bubble-v", "-p", "2", "-m", "2"]) == 1
    assert "did you mean" not in capsys.readouterr().err  # nothing close: no guess
    from pipesim.plan.hardware import get_accelerator
    from pipesim.plan.model import get_model

    with pytest.raises(UnknownNameError, match=r"'llama2-7' \(did you mean 'llama2-7b'\?\)"):
        get_model("llama2-7")
    with pytest.raises(UnknownNameError, match=r"did you mean 'h100-sxm'\?"):
        get_accelerator("h100-smx")


def test_python_dash_m_pipesim() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "pipesim", "simulate", "gpipe", "-p", "2", "-m", "4", "--json"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["makespan"] == 15  # (m+p-1)(F+B) = 5 * 3


def test_trace_output_suffix_is_checked(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    target = tmp_path / "trace.csv"
    assert main(["trace", "1f1b", "-p", "2", "-m", "2", "-o", str(target)]) == 1
    assert "give -o a name ending in .json" in capsys.readouterr().err
    assert not target.exists()


def test_virtual_flag_is_documented_as_virtual(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["simulate", "--help"])
    assert "-v means virtual here, not verbose" in " ".join(capsys.readouterr().out.split())


# -- shell completion -----------------------------------------------------------------------
def _complete(script: Path, words: list[str]) -> list[str]:
    """What bash completes for ``words`` (the last one being typed) with ``script``."""
    line = " ".join(words)
    program = f"""
source {script}
COMP_WORDS=({line})
COMP_CWORD={len(words) - 1}
COMP_LINE="{line}"
COMP_POINT=${{#COMP_LINE}}
_shtab_pipesim pipesim
printf '%s\\n' "${{COMPREPLY[@]}}"
"""
    result = subprocess.run(
        ["bash", "-c", program], capture_output=True, text=True, timeout=60, check=False
    )
    assert result.returncode == 0, result.stderr
    return result.stdout.split()


@pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")
def test_bash_completion(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["completion", "bash"]) == 0
    script = tmp_path / "pipesim.bash"
    script.write_text(capsys.readouterr().out)
    assert _complete(script, ["pipesim", "sim"]) == ["simulate"]
    assert set(_complete(script, ["pipesim", "simulate", "1f"])) == {"1f1b"}
    assert "--require-fit" in _complete(script, ["pipesim", "simulate", "--req"])
    assert set(_complete(script, ["pipesim", "simulate", "--time-unit", ""])) == {
        "unit",
        "s",
        "ms",
        "us",
        "ns",
    }


def test_fair_per_chunk_costs() -> None:
    from pipesim.errors import CostError
    from pipesim.fair import per_chunk_costs

    costs = CostModel.uniform(
        forward=1, backward=2, activation_bytes=1001, param_bytes=10, output_bytes=7
    )
    half = per_chunk_costs(costs, virtual=2).stage(0)
    assert (half.forward, half.backward) == (Fraction(1, 2), 1)
    assert (half.activation_bytes, half.param_bytes, half.output_bytes) == (500, 5, 7)
    assert per_chunk_costs(costs, virtual=1) is costs
    uneven = CostModel(stages=(costs.stage(0), costs.stage(0).__class__(forward=3)))
    with pytest.raises(CostError, match="cannot split 2 per-stage cost entries"):
        per_chunk_costs(uneven, virtual=2)
    with pytest.raises(PipesimError):
        per_chunk_costs(uneven, virtual=3)
