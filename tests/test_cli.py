"""The command line: every core verb through ``main(argv)``, bad input, the console script."""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import JSON_CONTRACT, RANK_CONTRACT

from pipesim.cli import main
from pipesim.schedule_io import load_schedule, save_schedule
from pipesim.schedules import generate, schedule_names


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    """``pipesim argv``: exit status, stdout, stderr (argparse's exits included)."""
    try:
        status = main(list(argv))
    except SystemExit as exc:  # argparse: --help, --version, usage errors
        status = exc.code if isinstance(exc.code, int) else 1
    out, err = capsys.readouterr()
    return status, out, err


def assert_refused(result: tuple[int, str, str], *fragments: str) -> None:
    status, out, err = result
    assert status in (1, 2), (status, err)
    assert err.startswith("pipesim: error: "), err
    assert "Traceback" not in err and "Traceback" not in out
    for fragment in fragments:
        assert fragment in err, (fragment, err)


# -- verbs ----------------------------------------------------------------------------------
def test_schedules_lists_every_schedule_with_its_rules(capsys: pytest.CaptureFixture[str]) -> None:
    status, out, _ = run(capsys, "schedules")
    assert status == 0
    for name in schedule_names():
        assert f"\n{name}\n" in f"\n{out}"
    assert "p <= N <= m" in out  # interleaved-1f1b's rule
    assert "rules" in out and "source" in out


def test_schedule_prints_json(capsys: pytest.CaptureFixture[str]) -> None:
    status, out, _ = run(capsys, "schedule", "1f1b", "--stages", "2", "--microbatches", "3")
    assert status == 0
    data = json.loads(out)
    assert data["ranks"] == [
        ["0F0", "0F1", "0B0", "0F2", "0B1", "0B2"],
        ["1F0", "1B0", "1F1", "1B1", "1F2", "1B2"],
    ]


@pytest.mark.parametrize("flag", ["--pipeline-parallel", "-p", "--stages"])
def test_pipeline_parallel_degree_has_one_dest_under_each_spelling(
    capsys: pytest.CaptureFixture[str], flag: str
) -> None:
    # --stages is the old spelling, kept for scripts; all three make the same 3-rank 1F1B.
    status, out, _ = run(capsys, "schedule", "1f1b", flag, "3", "--microbatches", "3")
    assert status == 0
    assert [row[0] for row in json.loads(out)["ranks"]] == ["0F0", "1F0", "2F0"]


@pytest.mark.parametrize("suffix", [".json", ".csv"])
def test_schedule_writes_a_file_and_validate_accepts_it(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, suffix: str
) -> None:
    path = tmp_path / f"plan{suffix}"
    status, out, _ = run(
        capsys, "schedule", "interleaved-1f1b", "-p", "4", "-m", "8", "-v", "2", "-o", str(path)
    )
    assert status == 0
    assert f"wrote {path}" in out
    expected = generate("interleaved-1f1b", n_ranks=4, n_microbatches=8, virtual=2)
    assert load_schedule(path).orders == expected.orders
    status, out, _ = run(capsys, "validate", str(path))
    assert status == 0
    assert out.startswith(f"{path}: valid (4 ranks, 8 stages, 8 micro-batches, 128 actions)")


def test_validate_refuses_a_deadlocking_file(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    path = tmp_path / "bad.csv"
    path.write_text("0F0,0B0,0F1,0B1\n1F1,1F0,1B0,1B1\n")
    assert_refused(run(capsys, "validate", str(path)), "schedule deadlocks", "1F1", "->")


def test_validate_refuses_an_incomplete_file(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    path = tmp_path / "short.json"
    path.write_text(json.dumps({"ranks": [["0F0", "0F1", "0B0"]]}))
    assert_refused(run(capsys, "validate", str(path)), "missing actions 0B1")


def test_simulate_summary(capsys: pytest.CaptureFixture[str]) -> None:
    status, out, _ = run(
        capsys, "simulate", "1f1b", "-p", "4", "-m", "8", "--activation-bytes", "1000"
    )
    assert status == 0
    assert out.startswith("1f1b: 4 ranks, 4 stages, 8 micro-batches\n")
    assert "makespan 33 units, efficiency 0.73" in out
    assert "4,000" in out  # rank 0 holds 4 micro-batches of 1000 bytes


def test_simulate_json_contract(capsys: pytest.CaptureFixture[str]) -> None:
    status, out, _ = run(
        capsys,
        "simulate",
        "gpipe",
        "--stages",
        "4",
        "--microbatches",
        "8",
        "--forward-time",
        "1",
        "--backward-time",
        "2",
        "--activation-bytes",
        "10",
        "--json",
    )
    assert status == 0
    data = json.loads(out)
    assert set(data) >= JSON_CONTRACT
    assert (data["schedule"], data["n_ranks"], data["n_stages"], data["n_microbatches"]) == (
        "gpipe",
        4,
        4,
        8,
    )
    assert data["makespan"] == (8 + 4 - 1) * 3
    assert data["bubble_ratio"] == 3 / 11
    assert data["idle_slots"] == 4 * 33 - 4 * 8 * 3
    assert len(data["ranks"]) == 4
    for rank in data["ranks"]:
        assert set(rank) >= RANK_CONTRACT
        assert rank["peak_inflight"] == 8
        assert rank["peak_activation_bytes"] == 80
        assert rank["busy"] + rank["idle"] == data["makespan"]


def test_simulate_interleaved_json(capsys: pytest.CaptureFixture[str]) -> None:
    # The rank's F=2, B=4 split over v=2 chunks: m(F+B) + (p-1)(F+B)/v = 48 + 9.
    status, out, _ = run(
        capsys,
        "simulate",
        "interleaved-1f1b",
        "-p",
        "4",
        "-m",
        "8",
        "-v",
        "2",
        "--forward-time",
        "1",
        "--backward-time",
        "2",
        "--json",
    )
    assert status == 0
    data = json.loads(out)
    assert (data["n_ranks"], data["n_stages"], data["makespan"]) == (4, 8, 57)


def test_simulate_per_stage_lists(capsys: pytest.CaptureFixture[str]) -> None:
    status, out, _ = run(
        capsys,
        "simulate",
        "gpipe",
        "-p",
        "2",
        "-m",
        "4",
        "--forward-only",
        "--forward-time",
        "1,2",
        "--json",
    )
    assert status == 0
    assert json.loads(out)["makespan"] == 1 + 4 * 2


def test_simulate_grid_is_the_chapters_table(capsys: pytest.CaptureFixture[str]) -> None:
    status, out, _ = run(
        capsys, "simulate", "gpipe", "-p", "2", "-m", "4", "--forward-only", "--grid"
    )
    assert status == 0
    assert out.splitlines()[:6] == [
        "cycle  rank 0  rank 1",
        "    0       0       -",
        "    1       1       0",
        "    2       2       1",
        "    3       3       2",
        "    4       -       3",
    ]
    assert "makespan 5 units, efficiency 0.80" in out
    assert "2 idle slots" in out


def test_simulate_a_file_with_a_cost_file(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    plan = save_schedule(generate("1f1b", n_ranks=2, n_microbatches=4), tmp_path / "p.json")
    costs = tmp_path / "costs.json"
    costs.write_text(json.dumps({"stage": {"forward": "1/2", "backward": 1}}))
    status, out, _ = run(capsys, "simulate", str(plan), "--costs", str(costs), "--json")
    assert status == 0
    assert json.loads(out)["makespan"] == (4 + 2 - 1) * 1.5


def test_simulate_link_flags(capsys: pytest.CaptureFixture[str]) -> None:
    status, out, _ = run(
        capsys,
        "simulate",
        "gpipe",
        "-p",
        "2",
        "-m",
        "1",
        "--forward-only",
        "--json",
        "--message-bytes",
        "10",
        "--link-latency",
        "3",
        "--link-bandwidth",
        "5",
    )
    assert status == 0
    assert json.loads(out)["makespan"] == 1 + 2 + 3 + 1


def test_version_and_help(capsys: pytest.CaptureFixture[str]) -> None:
    status, out, _ = run(capsys, "--version")
    assert status == 0 and out.startswith("pipesim ")
    for verb in ("schedules", "schedule", "validate", "simulate"):
        status, out, _ = run(capsys, verb, "--help")
        assert status == 0 and "usage: pipesim" in out
    status, _, err = run(capsys)
    assert status == 2 and "usage: pipesim" in err


def test_every_verb_has_help(capsys: pytest.CaptureFixture[str]) -> None:
    from pipesim.cli import build_parser

    parser = build_parser()
    actions = [a for a in parser._actions if a.__class__.__name__ == "_SubParsersAction"]
    verbs = sorted(actions[0].choices)  # type: ignore[union-attr]
    assert {"schedules", "schedule", "validate", "simulate"} <= set(verbs)
    for verb in verbs:
        status, out, _ = run(capsys, verb, "--help")
        assert status == 0, verb
        assert out.startswith(f"usage: pipesim {verb}"), verb


# -- bad input ------------------------------------------------------------------------------
SIM = ("simulate", "gpipe", "-p", "2", "-m", "4")


@pytest.mark.parametrize(
    ("argv", "fragments"),
    [
        ((*SIM, "--forward-time", "nan"), ("--forward-time must be finite", "'nan'")),
        ((*SIM, "--backward-time", "inf"), ("--backward-time must be finite", "'inf'")),
        ((*SIM, "--forward-time", "-1"), ("--forward-time must be non-negative", "'-1'")),
        ((*SIM, "--forward-time", "fast"), ("--forward-time must be a number like", "'fast'")),
        ((*SIM, "--forward-time", "1,2,3"), ("--forward-time has 3 values", "2 stages")),
        (
            (*SIM, "--activation-bytes", "1.5"),
            ("--activation-bytes: '1.5' is not a whole number of bytes",),
        ),
        (
            ("plot", "1f1b:activation-bytes=12XB", "-p", "2", "-m", "2"),
            ("setting activation-bytes of '1f1b': unknown unit 'XB' in '12XB'", "80GiB"),
        ),
        (("plot", "1f1b:forward-time=nan", "-p", "2", "-m", "2"), ("setting forward-time",)),
        ((*SIM, "--link-bandwidth", "0"), ("--link-bandwidth must be positive",)),
        ((*SIM, "--link-latency", "NaN"), ("--link-latency must be finite",)),
        ((*SIM, "--inter-node-bandwidth", "-5"), ("--inter-node-bandwidth must be positive",)),
        ((*SIM, "--link-concurrency", "0"), ("--link-concurrency", "got 0")),
        (("simulate", "gpipe", "-p", "0", "-m", "4"), ("--stages", "0")),
        (("simulate", "gpipe", "-p", "2", "-m", "-3"), ("--microbatches", "-3")),
        (("simulate", "gpipe", "-p", "1.5", "-m", "4"), ("--stages", "1.5")),
        (("simulate", "gpipe", "-p", "two", "-m", "4"), ("--stages", "two")),
        (("simulate", "1f1b", "-p", "2", "-m", "2", "-v", "0"), ("--virtual", "0")),
        (("simulate", "gpipe", "-m", "4"), ("needs --pipeline-parallel",)),
        (
            ("simulate", "pipedream", "-p", "2", "-m", "4"),
            ("unknown schedule 'pipedream'", "valid schedules are: sequential, gpipe, 1f1b"),
        ),
        (("schedule", "pipedream", "-p", "2", "-m", "4"), ("unknown schedule 'pipedream'",)),
        (
            ("simulate", "1f1b", "-p", "2", "-m", "4", "--forward-only"),
            ("no forward-only variant",),
        ),
        (("simulate", "gpipe", "-p", "2", "-m", "4", "-v", "2"), ("holds one stage per rank",)),
        (
            ("simulate", "interleaved-1f1b", "-p", "4", "-m", "6"),
            ("6 mod 4 = 2 < 4", "multiple of 4"),
        ),
        (("bogus",), ("invalid choice: 'bogus'",)),
        (("simulate", "gpipe", "-p", "2", "-m", "4", "--json", "--grid"), ("not allowed",)),
    ],
)
def test_bad_input_is_refused_without_a_traceback(
    capsys: pytest.CaptureFixture[str], argv: tuple[str, ...], fragments: tuple[str, ...]
) -> None:
    assert_refused(run(capsys, *argv), *fragments)


def test_bad_files_are_refused(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    broken = tmp_path / "broken.json"
    broken.write_text('{"ranks": [\n ["0F0",\n')
    assert_refused(run(capsys, "simulate", str(broken)), "broken.json", "line 3")
    cells = tmp_path / "cells.csv"
    cells.write_text("0F0,0B0\n1F0,1BB0\n")
    assert_refused(run(capsys, "validate", str(cells)), "line 2, column 2", "'1BB0'")
    assert_refused(run(capsys, "validate", str(tmp_path / "absent.csv")), "does not exist")
    assert_refused(run(capsys, "simulate", "plan.txt"), "unknown schedule 'plan.txt'")
    plan = save_schedule(generate("gpipe", n_ranks=2, n_microbatches=2), tmp_path / "g.json")
    assert_refused(run(capsys, "simulate", str(plan), "-p", "3"), "--pipeline-parallel 3 disagrees")
    costs = tmp_path / "costs.json"
    costs.write_text('{"stage": {"forward": -2}}')
    assert_refused(
        run(capsys, "simulate", str(plan), "--costs", str(costs)), "forward must be non-negative"
    )
    costs.write_text('{"stage": {"forward": 1}')
    assert_refused(run(capsys, "simulate", str(plan), "--costs", str(costs)), "line 1")
    assert_refused(
        run(capsys, "simulate", str(plan), "--costs", str(costs), "--forward-time", "2"),
        "either --costs or cost flags",
    )


def test_grid_refuses_uneven_cycles(capsys: pytest.CaptureFixture[str]) -> None:
    assert_refused(run(capsys, *SIM, "--backward-time", "1.5", "--grid"), "whole number of cycles")


def test_saving_sequential_forward_only_as_csv_is_refused(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    result = run(
        capsys,
        "schedule",
        "sequential",
        "-p",
        "2",
        "-m",
        "2",
        "--forward-only",
        "-o",
        str(tmp_path / "s.csv"),
    )
    assert_refused(result, "happens_before", "save it as .json")


# -- the installed console script -----------------------------------------------------------
@pytest.mark.slow
def test_console_script(tmp_path: Path) -> None:
    script = Path(sys.executable).with_name("pipesim")
    assert script.exists(), f"console script not installed next to {sys.executable}"
    done = subprocess.run(
        [
            str(script),
            "simulate",
            "gpipe",
            "--stages",
            "2",
            "--microbatches",
            "4",
            "--forward-only",
            "--json",
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    data = json.loads(done.stdout)
    assert (data["makespan"], data["idle_slots"], data["efficiency"]) == (5, 2, 0.8)
    bad = subprocess.run(
        [
            str(script),
            "simulate",
            "gpipe",
            "--stages",
            "2",
            "--microbatches",
            "4",
            "--forward-time",
            "nan",
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert bad.returncode == 2
    assert bad.stderr.startswith("pipesim: error: ") and "Traceback" not in bad.stderr


def test_every_time_and_size_flag_says_its_unit() -> None:
    # Read as a stranger would: a flag taking a time or a size says in which unit, in its
    # own help or in its group's description (the costs group explains T and SIZE once).
    import argparse

    from pipesim.cli import build_parser

    (commands,) = [a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction)]
    checked = set()
    for name, sub in commands.choices.items():
        for group in sub._action_groups:
            for action in group._group_actions:
                dest = action.dest
                text = f"{action.help} {group.description or ''}"
                if dest.endswith("_bytes") or dest in ("memory_capacity", "memory_limit"):
                    assert "GiB" in text and "GB" in text.replace("GiB", ""), (name, dest)
                elif "bandwidth" in dest:
                    assert "bytes per time unit" in text, (name, dest)
                elif dest.endswith(("_time", "latency", "timeout", "time_limit")):
                    assert "seconds" in text or "time unit" in text.replace("-", " "), (
                        name,
                        dest,
                    )
                else:
                    continue
                checked.add(f"{name} --{dest.replace('_', '-')}")
    # the flags the issue names, in every command that has them
    assert {"plan --memory-capacity", "simulate --memory-capacity", "verify --timeout"} <= checked
    assert {"synthesize --memory-limit", "plot --activation-bytes", "trace --link-bandwidth"} <= (
        checked
    )


def _flags_of_every_verb() -> list[tuple[str, argparse.ArgumentParser, argparse.Action]]:
    """(verb, its parser, action) for every flag of every subcommand."""
    from pipesim.cli import build_parser

    (commands,) = [a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction)]
    return [
        (verb, sub, action)
        for verb, sub in commands.choices.items()
        for action in sub._actions
        if action.option_strings
    ]


# Every flag that takes a size: named for bytes, or a memory capacity / limit.
SIZE_FLAGS = [
    (verb, sub, action, flag)
    for verb, sub, action in _flags_of_every_verb()
    for flag in action.option_strings
    if flag.endswith("-bytes") or flag in ("--memory-capacity", "--memory-limit")
]


def test_the_size_flags_are_all_found() -> None:
    found = {f"{verb} {flag}" for verb, _, _, flag in SIZE_FLAGS}
    cost_verbs = ("simulate", "synthesize", "plot", "trace")
    sizes = ("--activation-bytes", "--weight-grad-bytes", "--message-bytes", "--param-bytes")
    expected = {f"{v} {f}" for v in cost_verbs for f in (*sizes, "--memory-capacity")}
    assert expected | {"plan --memory-capacity", "synthesize --memory-limit"} <= found


@pytest.mark.parametrize(
    ("verb", "flag"), [(verb, flag) for verb, _, _, flag in SIZE_FLAGS], ids=lambda x: x
)
def test_a_bad_size_flag_names_the_flag_the_value_and_the_forms(
    capsys: pytest.CaptureFixture[str], verb: str, flag: str
) -> None:
    # Read while the command line is parsed: no other argument is needed to see the error.
    status, out, err = run(capsys, verb, flag, "12XB")
    assert status == 2 and out == ""
    assert err.startswith(f"pipesim: error: {flag}: unknown unit 'XB' in '12XB'; give "), err
    assert err.count("\n") == 1 and "Traceback" not in err
    # a number without a unit is bytes, except for synthesize's limit in micro-batches
    plain = "micro-batches without a unit (8, 2.5" if flag == "--memory-limit" else "80e9"
    for form in ("80GiB", "80GB", plain):
        assert form in err, (form, err)


@pytest.mark.parametrize(
    ("verb", "sub", "action", "flag"), SIZE_FLAGS, ids=[f"{v} {f}" for v, _, _, f in SIZE_FLAGS]
)
@pytest.mark.parametrize(("text", "n_bytes"), [("80GiB", 80 * 2**30), ("80GB", 80 * 10**9)])
def test_every_size_flag_reads_units(
    verb: str,
    sub: argparse.ArgumentParser,
    action: argparse.Action,
    flag: str,
    text: str,
    n_bytes: int,
) -> None:
    namespace = argparse.Namespace()
    action(sub, namespace, text, flag)
    value = getattr(namespace, action.dest)
    if isinstance(value, tuple):  # a per-stage list: one value for every stage
        (value,) = value
    assert getattr(value, "n_bytes", value) == n_bytes  # synthesize: a MemoryLimit


def test_a_bad_per_stage_size_names_the_stage(capsys: pytest.CaptureFixture[str]) -> None:
    status, _, err = run(capsys, *SIM, "--activation-bytes", "1GiB,2gb,1.5")
    assert status == 2
    assert err.startswith(
        "pipesim: error: --activation-bytes (stage 2): '1.5' is not a whole number of bytes; "
    ), err


@pytest.mark.parametrize(
    ("flags", "fragment"),
    [
        (("-p", "3"), "--pipeline-parallel 3 disagrees with 'g.json', which has 2 ranks"),
        (("-m", "5"), "--microbatches 5 disagrees with 'g.json', which has 4 micro-batches"),
        (("-v", "2"), "--virtual 2 disagrees with 'g.json', which has 1 stages per rank"),
        (("--forward-only",), "--forward-only disagrees with 'g.json', which has backward"),
        (("--group-size", "2"), "--group-size shapes a generated schedule"),
    ],
)
@pytest.mark.parametrize("verb", ["simulate", "plot", "trace", "verify"])
def test_a_size_flag_given_with_a_schedule_file_must_agree_with_it(
    capsys: pytest.CaptureFixture[str],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    verb: str,
    flags: tuple[str, ...],
    fragment: str,
) -> None:
    # The file decides; a flag it would silently override is refused, one it agrees with kept.
    monkeypatch.chdir(tmp_path)
    save_schedule(generate("1f1b", n_ranks=2, n_microbatches=4), "g.json")
    assert_refused(run(capsys, verb, "g.json", *flags), fragment)
    status, out, _ = run(capsys, "simulate", "g.json", "-p", "2", "-m", "4", "-v", "1", "--json")
    assert status == 0 and json.loads(out)["makespan"] == (4 + 2 - 1) * 3  # (m + p - 1)(F + B)


@pytest.mark.parametrize(
    ("flags", "makespan"),
    [
        ((), 7),
        (("--blocking-sends",), 9),
        (("--no-overlap-comm",), 9),  # the old spelling
    ],
)
def test_blocking_sends_flag(
    capsys: pytest.CaptureFixture[str], flags: tuple[str, ...], makespan: int
) -> None:
    """GPipe forwards on 2 ranks, 10-byte messages taking 1 + 10/5 = 3: posted sends end
    at 1F1's end, 7; blocking ones hold rank 0 until each arrives (0F1 runs 4-5, 1F1 8-9),
    the hand-worked timeline of tests/test_engine.py::test_blocking_sends."""
    status, out, err = run(
        capsys,
        "simulate", "gpipe", "-p", "2", "-m", "2", "--forward-only", "--message-bytes", "10",
        "--link-latency", "1", "--link-bandwidth", "5", "--json", *flags,
    )  # fmt: skip
    assert status == 0, err
    assert json.loads(out)["makespan"] == makespan
