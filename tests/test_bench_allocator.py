"""benchmarks/bench_allocator.py: a run past --timeout ends in one line, no rank left."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path
from types import ModuleType

import pytest
from helpers import BENCHMARKS, load_benchmark

SCRIPT = BENCHMARKS / "bench_allocator.py"


def _bench() -> ModuleType:
    return load_benchmark("bench_allocator")


def test_a_run_past_the_timeout_names_the_case_and_the_fix() -> None:
    # pipesim verify cannot even import in 10 ms, so the first run is stopped.
    argv = ["--timeout", "0.01", "--case", "zb-h1:1:2", "--repeat", "1"]
    done = subprocess.run(
        [sys.executable, str(SCRIPT), *argv], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 1
    assert done.stderr == (
        "bench_allocator: zb-h1:1:2 (system) did not finish within --timeout 0.01 s and was "
        "stopped; raise it (e.g. --timeout 0.02) or run a smaller --case\n"
    )
    assert done.stdout == ""


@pytest.mark.slow
@pytest.mark.parametrize("value", ["0", "-5", "nan", "inf", "soon"])
def test_a_bad_timeout_is_a_usage_error(value: str) -> None:
    done = subprocess.run(
        [sys.executable, str(SCRIPT), "--timeout", value],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 2
    assert f"argument --timeout: {value!r} is not a positive number of seconds" in done.stderr


@pytest.mark.slow
def test_the_timeout_kills_the_processes_the_run_started(tmp_path: Path) -> None:
    """The launcher's children (the ranks) die with it: the whole group is killed."""
    pid_file = tmp_path / "child.pid"
    spawn = (
        "import subprocess, sys, time; "
        "child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)']); "
        f"open({str(pid_file)!r}, 'w').write(str(child.pid)); time.sleep(60)"
    )
    command = [sys.executable, "-c", spawn]
    bench = _bench()
    started = time.monotonic()
    with pytest.raises(SystemExit) as info:
        bench._finish(command, {}, timeout_s=5.0, what="x:1:1 (retain)")
    assert time.monotonic() - started < 30
    assert str(info.value) == bench.timeout_message("x:1:1 (retain)", 5.0)
    child = int(pid_file.read_text())
    assert not _alive(child)


def _alive(pid: int) -> bool:
    """Whether ``pid`` still runs (a zombie awaiting its reaper does not)."""
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().split(") ")[1][0]
        except (FileNotFoundError, IndexError):
            return False
        if state in "ZX":
            return False
        time.sleep(0.05)
    return True
