"""The command line's one error path, seen from outside: every mistake a user can make is
one line ``pipesim: error: ...`` and exit status 1 (2 for a bad option), never a
traceback, and the issue's hostile inputs are refused within a small memory limit."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from pipesim.cli import _simulate as simulate_verb
from pipesim.cli import main

# pipesim's CLI in a fresh interpreter whose address space is capped (RLIMIT_AS): an
# input that grew memory without bound would die here with MemoryError, not be refused.
_CAPPED = """
import resource, sys
limit = int(sys.argv.pop(1))
resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
from pipesim.cli import main
sys.exit(main())
"""
_MEMORY_CAP = 512 * 2**20  # a plain `pipesim simulate` needs about 300 MiB of address space


# Many commands in one capped interpreter (one start-up instead of one per case): each
# runs through main() with its own stderr; what main() lets escape is recorded too.
_CAPPED_BATCH = """
import contextlib, io, json, resource, sys
limit = int(sys.argv[1])
resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
from pipesim.cli import main
results = []
for argv in json.loads(sys.argv[2]):
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        try:
            status = main(argv)
        except SystemExit as exc:
            status = exc.code
        except BaseException as exc:
            status = "escaped: " + type(exc).__name__
    results.append([status, err.getvalue()])
print(json.dumps(results))
"""


def run_capped(*argv: str, cwd: Path, cap: int = _MEMORY_CAP) -> subprocess.CompletedProcess[str]:
    """Run ``pipesim argv`` in a subprocess under the memory cap (and a generous timeout:
    an unbounded loop fails the test instead of hanging it)."""
    return subprocess.run(
        [sys.executable, "-c", _CAPPED, str(cap), *argv],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=cwd,
        check=False,
    )


def assert_one_line_error(done: subprocess.CompletedProcess[str], status: int, *fragments: str):  # type: ignore[no-untyped-def]
    assert done.returncode == status, done.stderr
    lines = done.stderr.splitlines()
    assert len(lines) == 1, done.stderr
    assert lines[0].startswith("pipesim: error: "), done.stderr
    assert "Traceback" not in done.stderr + done.stdout
    for fragment in fragments:
        assert fragment in lines[0], (fragment, lines[0])


@pytest.mark.slow
def test_a_normal_run_fits_the_memory_cap(tmp_path: Path) -> None:
    # The oracle for the cap: without this the refusals below could be the cap's doing.
    done = run_capped("simulate", "1f1b", "-p", "4", "-m", "8", "--json", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["makespan"] == 33  # (m + p - 1) * (F + B)


HOSTILE_FILES = {
    # the issue's two-line CSV that names stage 10^25
    "big.csv": b"0F0,0B0\n10000000000000000000000000F0,10000000000000000000000000B0\n",
    "micro.csv": b"0F0,0B0,0F999999,0B999999\n",  # micro-batch index at the limit
    "digits.csv": b"0F" + b"1" * 5000 + b"\n",
    "arabic.csv": "0F0,0B0\n1F\u0663\n".encode(),
    "deep.json": b"[" * 100_000 + b"]" * 100_000,
    "hb.json": b'{"ranks": [["0F0", "0B0"]], "happens_before": 5}',
    "dup.json": b'{"ranks": [["0F0", "0B0"]],\n "ranks": [["0F0"]]}',
    "costs.json": b'{"stage": {"forward": 1e5000}}',
    "costs5000.json": b'{"stage": {"forward": ' + b"7" * 5000 + b"}}",
}

CASES = [
    (("validate", "big.csv"), 1, ("big.csv: line 2, column 1", "26 digits", "MAX_INDEX_DIGITS")),
    (("validate", "micro.csv"), 1, ("missing actions 0F1, 0B1", "and 1999988 more")),
    (("validate", "digits.csv"), 1, ("line 1, column 1", "5000 digits")),
    (("validate", "arabic.csv"), 1, ("line 2, column 1", "non-ASCII digit '\u0663'")),
    (("validate", "deep.json"), 1, ("deep.json: JSON nested more than 64", "MAX_JSON_DEPTH")),
    (("validate", "hb.json"), 1, ("hb.json: 'happens_before' must be a list", "got 5")),
    (("validate", "dup.json"), 1, ("the key 'ranks' in the object at line 1, column 1",)),
    (("simulate", "1f1b", "-p", "2", "-m", "2", "--costs", "costs.json"), 1, ("'1e5000' at",)),
    (("simulate", "1f1b", "-p", "2", "-m", "2", "--costs", "costs5000.json"), 1, ("5000 digits",)),
    (("simulate", "1f1b", "-p", "2", "-m", "100000000000"), 2, ("MAX_MICROBATCHES",)),
    (("simulate", "1f1b", "-p", "2", "-m", "2", "--forward-time", "1e99999999"), 2, ("40 digits",)),
    (("simulate", "1f1b", "-p", "2", "-m", "2", "--forward-time", "1e5000"), 2, ("'1e5000'",)),
    (("simulate", "1f1b", "-p", "4096", "-m", "1000000"), 1, ("MAX_ACTIONS",)),
    (("simulate", "interleaved-1f1b", "-p", "4096", "-v", "17", "-m", "8"), 1, ("MAX_STAGES",)),
    (("synthesize", "-p", "64", "-m", "100000", "--memory-limit", "8"), 1, ("MAX_ACTIONS",)),
    (("plan", "--model", "llama2-7b", "--timeout", "nan"), 2, ("--timeout", "'nan'")),
    (("verify", "1f1b", "-p", "2", "-m", "2", "--warmup", "-3"), 2, ("--warmup", "'-3'")),
    (("verify", "1f1b", "-p", "2", "-m", "2", "--timeout", "0"), 2, ("--timeout", "'0'")),
    (("schedule", "1f1b", "-p", "2", "-m", "2", "-o", "no/such/s.json"), 1, ("cannot write",)),
    # counts are usage errors (2) bounded by the same pipesim.limits entry in every verb
    (("simulate", "1f1b", "-p", "2", "-m", "2", "--ranks-per-node", "0"), 2, ("--ranks-per-node",)),
    (("simulate", "1f1b", "-p", "2", "-m", "2", "--ranks-per-node", "5000"), 2, ("MAX_RANKS",)),
    (("simulate", "1f1b", "-p", "2", "-m", "2", "--link-concurrency", "0"), 2, ("got 0",)),
    (("calibrate", "-p", "5000", "-o", "c.json"), 2, ("--stages", "MAX_RANKS")),
    (("calibrate", "-m", "2000000", "-o", "c.json"), 2, ("MAX_MICROBATCHES",)),
    (("calibrate", "--virtual", "70000", "-o", "c.json"), 2, ("MAX_STAGES",)),
    (("calibrate", "--gpt-layers", "99999999", "-o", "c.json"), 2, ("MAX_LAYERS",)),
    (("calibrate", "--warmup", "-1", "-o", "c.json"), 2, ("--warmup", "'-1'")),
    (("calibrate", "--threads", "100000", "-o", "c.json"), 2, ("--threads", "from 1 to 256")),
    (("calibrate", "--timeout", "-1", "-o", "c.json"), 2, ("--timeout", "'-1'")),
    (("verify", "1f1b", "-p", "2", "-m", "2", "--gpt-layers", "99999999"), 2, ("MAX_LAYERS",)),
    (("plot", "1f1b:p=5000", "-p", "2", "-m", "2"), 2, ("setting p", "MAX_RANKS")),
]


def _write_hostile_files(folder: Path) -> None:
    for name, data in HOSTILE_FILES.items():
        (folder / name).write_bytes(data)


@pytest.mark.slow
def test_hostile_input_is_refused_in_one_line(tmp_path: Path) -> None:
    _write_hostile_files(tmp_path)
    cases = json.dumps([list(argv) for argv, _, _ in CASES])
    done = subprocess.run(
        [sys.executable, "-c", _CAPPED_BATCH, str(_MEMORY_CAP), cases],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=tmp_path,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    results = json.loads(done.stdout)
    for (argv, status, fragments), (got_status, err) in zip(CASES, results, strict=True):
        seen = subprocess.CompletedProcess(argv, got_status, "", err)
        assert_one_line_error(seen, status, *fragments)


# The issue's three examples, each in its own process: what a user sees on the terminal.
ISSUE_EXAMPLES = [CASES[0], CASES[9], CASES[10]]


@pytest.mark.parametrize(
    ("argv", "status", "fragments"), ISSUE_EXAMPLES, ids=[" ".join(c[0]) for c in ISSUE_EXAMPLES]
)
@pytest.mark.slow
def test_the_issue_examples_exit_cleanly(
    tmp_path: Path, argv: tuple[str, ...], status: int, fragments: tuple[str, ...]
) -> None:
    _write_hostile_files(tmp_path)
    assert_one_line_error(run_capped(*argv, cwd=tmp_path), status, *fragments)


# -- internal errors ---------------------------------------------------------------------
def _crash(*args: object, **kwargs: object) -> None:
    raise ZeroDivisionError("division by zero")


def test_an_internal_error_is_one_line_saying_how_to_report_it(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.delenv("PIPESIM_DEBUG", raising=False)
    monkeypatch.setattr(simulate_verb, "simulate", _crash)
    assert main(["simulate", "1f1b", "-p", "2", "-m", "2"]) == 1
    err = capsys.readouterr().err
    assert err.splitlines() == [
        "pipesim: internal error: ZeroDivisionError: division by zero. This is a bug in "
        "pipesim: please report it with the command line that caused it; run again with "
        "--debug (or PIPESIM_DEBUG=1) for the traceback"
    ]


@pytest.mark.parametrize("how", ["--debug before the verb", "--debug after", "PIPESIM_DEBUG=1"])
def test_debug_shows_the_traceback(
    how: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(simulate_verb, "simulate", _crash)
    argv = ["simulate", "1f1b", "-p", "2", "-m", "2"]
    if how == "PIPESIM_DEBUG=1":
        monkeypatch.setenv("PIPESIM_DEBUG", "1")
    else:
        monkeypatch.delenv("PIPESIM_DEBUG", raising=False)
        argv = ["--debug", *argv] if "before" in how else [*argv, "--debug"]
    assert main(argv) == 1
    err = capsys.readouterr().err
    assert err.startswith("Traceback (most recent call last):")
    assert "in _crash" in err
    assert err.splitlines()[-1].startswith("pipesim: internal error: ZeroDivisionError")


@pytest.mark.parametrize(
    ("error", "fragment"),
    [
        (MemoryError, "pipesim: error: out of memory"),
        (RecursionError, "pipesim: error: the input nests too deeply"),
    ],
)
def test_memory_and_recursion_errors_are_named(
    error: type[BaseException],
    fragment: str,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    def fail(*args: object, **kwargs: object) -> None:
        raise error

    monkeypatch.delenv("PIPESIM_DEBUG", raising=False)
    monkeypatch.setattr(simulate_verb, "simulate", fail)
    assert main(["simulate", "1f1b", "-p", "2", "-m", "2"]) == 1
    err = capsys.readouterr().err
    assert len(err.splitlines()) == 1 and err.startswith(fragment)


# -- numeric options ---------------------------------------------------------------------
BAD_OPTIONS = [
    ["simulate", "1f1b", "-p", "0", "-m", "2"],
    ["simulate", "1f1b", "-p", "-2", "-m", "2"],
    ["simulate", "1f1b", "-p", "2.5", "-m", "2"],
    ["simulate", "1f1b", "-p", "\u0663", "-m", "2"],
    ["simulate", "1f1b", "-p", "2", "-m", "1" * 5000],
    ["simulate", "interleaved-1f1b", "-p", "2", "-m", "4", "-v", "0"],
    ["plan", "--model", "llama2-7b", "--timeout", "inf"],
    ["plan", "--model", "llama2-7b", "--timeout", "-1"],
    ["plan", "--model", "llama2-7b", "--workers", "100000"],
    ["verify", "1f1b", "-p", "2", "-m", "2", "--timeout", "nan"],
    ["synthesize", "-p", "2", "-m", "4", "--memory-limit", "8", "--time-limit", "nan"],
    ["synthesize", "-p", "5000", "-m", "4", "--memory-limit", "8"],
    ["verify", "1f1b", "-p", "2", "-m", "2", "--seed", "-1"],
    ["verify", "1f1b", "-p", "2", "-m", "2", "--seed", str(2**64)],
]


@pytest.mark.parametrize("argv", BAD_OPTIONS, ids=[" ".join(a)[:50] for a in BAD_OPTIONS])
def test_bad_numeric_options_are_usage_errors(
    argv: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as info:
        main(argv)
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("pipesim: error: argument ") and "expected" in err
    assert len(err.splitlines()) == 1


@pytest.mark.parametrize(
    ("argv", "value"),
    [(["plan", "--timeout", "0.5"], 0.5), (["verify", "x", "--warmup", "0"], 0)],
)
def test_good_numeric_options_are_read(argv: list[str], value: float) -> None:
    from pipesim.cli import build_parser

    args = build_parser().parse_args(argv)
    assert (args.timeout if "--timeout" in argv else args.warmup) == value


def _must_not_run(*args: object, **kwargs: object) -> None:
    raise AssertionError("the run started although its output cannot be written")


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (("calibrate", "-o", "no/such/c.json"), "cannot write -o 'no/such/c.json': the folder"),
        (("calibrate", "-o", "folder"), "cannot write -o 'folder': it is a folder"),
        (
            ("verify", "1f1b", "-p", "2", "-m", "2", "-o", "no/r.json"),
            "cannot write -o 'no/r.json'",
        ),
        (("verify", "1f1b", "-p", "2", "-m", "2", "--trace-out", "folder"), "--trace-out 'folder'"),
        (("verify", "1f1b", "-p", "2", "-m", "2", "--costs-out", "no/c.json"), "--costs-out"),
    ],
)
def test_an_output_that_cannot_be_written_is_refused_before_the_run(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    argv: tuple[str, ...],
    message: str,
) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "folder").mkdir()
    if argv[0] == "verify":
        pytest.importorskip("torch")
        monkeypatch.setattr("verify.compare.verify", _must_not_run)
    else:  # refused before torch is imported: no torch needed to see it
        monkeypatch.setattr("pipesim.cli._calibrate._calibrate", _must_not_run)
    status = main(list(argv))
    err = capsys.readouterr().err
    assert status == (2 if argv[0] == "verify" else 1), err
    assert err.startswith("pipesim: error: ") and message in err, err
    assert err.count("\n") == 1


@pytest.mark.parametrize(
    ("argv", "flag", "says"),
    [
        (
            ["simulate", "1f1b", "-p", "2", "-m", "4", "--activation-bytes", "-1GiB"],
            "--activation-bytes",
            "must be at least 0 bytes, got '-1GiB'",
        ),
        (
            ["simulate", "1f1b", "-p", "2", "-m", "4", "--link-latency", "-5us"],
            "--link-latency",
            "got '-5us'",
        ),
        (
            ["simulate", "1f1b", "-p", "2", "-m", "4", "--link-latency", "-.5"],
            "--link-latency",
            "must be non-negative, got '-.5'",
        ),
    ],
)
def test_a_negative_value_with_a_unit_reaches_its_reader(
    argv: list[str], flag: str, says: str, capsys: pytest.CaptureFixture[str]
) -> None:
    # Python 3.11's argparse called '-1GiB' an unknown option ("expected one argument"):
    # the value's own reader must say what is wrong with it, given as two words or one.
    for form in (argv, [*argv[:-2], f"{argv[-2]}={argv[-1]}"]):
        with pytest.raises(SystemExit) as info:
            main(form)
        assert info.value.code == 2
        err = capsys.readouterr().err
        assert err.startswith(f"pipesim: error: {flag} ") and says in err
        assert "expected one argument" not in err
