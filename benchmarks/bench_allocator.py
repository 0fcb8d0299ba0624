"""What keeping freed CPU memory changes: glibc's defaults against ``retain``.

Goal (see ``verify/allocator.py``): an action's measured time should not
depend on the schedule around it. For each case this runs ``pipesim verify --dist``
(one intra-op thread per rank) with ``PIPESIM_CPU_ALLOCATOR=system`` and ``=retain``
alternately, ``--repeat`` times each, and prints per run the step (first compute start
to last compute end) and the median time of W per stage, then per mode the median
step over the repeats and the spread (lowest to highest) of each stage's W medians:
under ``system`` the last stage's W in zb-h1 and a V schedule's middle stage W run
up to twice their in-isolation time; under ``retain`` they should not. The load
(os.getloadavg) is printed on every line.

Run: ``python benchmarks/bench_allocator.py [--repeat 2] [--case zb-h1:1:16 ...]
[--timeout 600]`` (case = SCHEDULE:VIRTUAL:MICROBATCHES, on a 6-block GPT ``--width``
wide, 512 by default, 8 rows per micro-batch). A run past ``--timeout`` seconds is
stopped with its rank processes and the benchmark exits 1 naming the case and the fix.
"""

from __future__ import annotations

import argparse
import math
import os
import signal
import statistics
import subprocess
import sys
import tempfile
from collections import defaultdict
from pathlib import Path

from pipesim.actions import Action, Op
from pipesim.calibration import measured_makespan
from pipesim.trace_io import load_trace

_CASES = ("zb-h1:1:16", "v-half:2:16")


def _case(text: str) -> str:
    """argparse type: ``SCHEDULE:V:M`` with V and M positive integers."""
    parts = text.split(":")
    if len(parts) != 3 or not all(p.isdigit() and int(p) > 0 for p in parts[1:]):
        raise argparse.ArgumentTypeError(
            f"{text!r} is not SCHEDULE:VIRTUAL:MICROBATCHES, e.g. zb-h1:1:16 or v-half:2:16"
        )
    return text


def _run(
    case: str, mode: str, out: Path, *, width: int, timeout_s: float
) -> tuple[float, dict[int, float]]:
    name, virtual, m = case.split(":")
    env = os.environ | {"PIPESIM_CPU_ALLOCATOR": mode, "OMP_NUM_THREADS": "1"}
    command = [
        *(sys.executable, "-m", "pipesim", "verify", name, "-p", "2", "-v", virtual),
        *("-m", m, "--model", "gpt", "--gpt-layers", "6", "--gpt-width", str(width)),
        *("--batch-size", str(8 * int(m)), "--dist", "--warmup", "2", "--trace-out", str(out)),
    ]
    returncode, stderr = _finish(command, env, timeout_s=timeout_s, what=f"{case} ({mode})")
    if returncode != 0:
        raise SystemExit(f"bench_allocator: {case} ({mode}) failed: {stderr.strip()}")
    trace = load_trace(out).trace
    w: dict[int, list[float]] = defaultdict(list)
    for record in trace.actions:
        if isinstance(record.work, Action) and record.work.op is Op.W:
            w[record.work.stage].append(float(record.duration) / 1e6)
    step = float(measured_makespan(trace)) / 1e6
    return step, {s: statistics.median(v) for s, v in sorted(w.items())}


def _finish(
    command: list[str], env: dict[str, str], *, timeout_s: float, what: str
) -> tuple[int, str]:
    """Run ``command`` to its end: (exit status, stderr). Past ``timeout_s`` its whole
    process group (the launcher and the ranks it started) is killed, so no rank is left
    behind, and the benchmark exits with one line saying how to give it longer."""
    with subprocess.Popen(
        command,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,  # its own process group, killed as one
    ) as process:
        try:
            _, stderr = process.communicate(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.communicate()
            raise SystemExit(timeout_message(what, timeout_s)) from None
    return process.returncode, stderr


def timeout_message(what: str, timeout_s: float) -> str:
    """The one line a run past its timeout ends with.

    >>> timeout_message("zb-h1:1:16 (retain)", 600)
    'bench_allocator: zb-h1:1:16 (retain) did not finish within --timeout 600 s and was \
stopped; raise it (e.g. --timeout 1200) or run a smaller --case'
    """
    return (
        f"bench_allocator: {what} did not finish within --timeout {timeout_s:g} s and was "
        f"stopped; raise it (e.g. --timeout {2 * timeout_s:g}) or run a smaller --case"
    )


def _seconds(text: str) -> float:
    """argparse type: a positive, finite number of seconds."""
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not (0 < value < math.inf):
        raise argparse.ArgumentTypeError(f"{text!r} is not a positive number of seconds")
    return value


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeat", type=int, default=2, help="runs per mode and case (2)")
    parser.add_argument(
        "--case", action="append", type=_case, help="SCHEDULE:V:M (zb-h1:1:16, v-half:2:16)"
    )
    parser.add_argument("--width", type=int, default=512, help="GPT width (512; 256 too)")
    parser.add_argument(
        "--timeout",
        type=_seconds,
        default=600.0,
        metavar="S",
        help="seconds one pipesim verify run may take before it is stopped (600)",
    )
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        for case in args.case or _CASES:
            steps: dict[str, list[float]] = defaultdict(list)
            ws: dict[str, dict[int, list[float]]] = defaultdict(lambda: defaultdict(list))
            for repeat in range(args.repeat):
                modes = ("system", "retain") if repeat % 2 == 0 else ("retain", "system")
                for mode in modes:
                    load = os.getloadavg()[0]
                    out = Path(tmp) / "trace.json"
                    step, w = _run(case, mode, out, width=args.width, timeout_s=args.timeout)
                    steps[mode].append(step)
                    for stage, ms in w.items():
                        ws[mode][stage].append(ms)
                    shown = " ".join(f"{s}W {ms:6.1f}" for s, ms in w.items())
                    print(
                        f"{case:14s} {mode:6s} step {step:8.1f} ms  W medians (ms) {shown}  "
                        f"load {load:.2f}",
                        flush=True,
                    )
            for mode in ("system", "retain"):
                spans = " ".join(
                    f"{s}W {min(v):.1f}-{max(v):.1f}" for s, v in sorted(ws[mode].items())
                )
                print(
                    f"{case:14s} {mode:6s} median step {statistics.median(steps[mode]):8.1f} ms"
                    f"  W medians' range (ms) {spans}"
                )
            ratio = statistics.median(steps["retain"]) / statistics.median(steps["system"])
            print(f"{case:14s} retain / system step: {ratio:.3f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
