"""What keeping freed CPU memory changes: glibc's defaults against ``retain``.

Goal (issue 11, see ``verify/allocator.py``): an action's measured time should not
depend on the schedule around it. For each case this runs ``pipesim verify --dist``
(one intra-op thread per rank) with ``PIPESIM_CPU_ALLOCATOR=system`` and ``=retain``
alternately, ``--repeat`` times each, and prints per run the step (first compute start
to last compute end) and the median time of W per stage, then per mode the median
step over the repeats and the spread (lowest to highest) of each stage's W medians:
under ``system`` the last stage's W in zb-h1 and a V schedule's middle stage W run
up to twice their in-isolation time; under ``retain`` they should not. The load
(os.getloadavg) is printed on every line.

Run: ``python benchmarks/bench_allocator.py [--repeat 2] [--case zb-h1:1:16 ...]``
(case = SCHEDULE:VIRTUAL:MICROBATCHES, on a 6-block GPT ``--width`` wide, 512 by default,
8 rows per micro-batch).
"""

from __future__ import annotations

import argparse
import os
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


def _run(case: str, mode: str, out: Path, width: int) -> tuple[float, dict[int, float]]:
    name, virtual, m = case.split(":")
    env = os.environ | {"PIPESIM_CPU_ALLOCATOR": mode, "OMP_NUM_THREADS": "1"}
    command = [
        *(sys.executable, "-m", "pipesim", "verify", name, "-p", "2", "-v", virtual),
        *("-m", m, "--model", "gpt", "--gpt-layers", "6", "--gpt-width", str(width)),
        *("--batch-size", str(8 * int(m)), "--dist", "--warmup", "2", "--trace-out", str(out)),
    ]
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=600)
    if done.returncode != 0:
        raise SystemExit(f"bench_allocator: {case} ({mode}) failed: {done.stderr.strip()}")
    trace = load_trace(out).trace
    w: dict[int, list[float]] = defaultdict(list)
    for record in trace.actions:
        if isinstance(record.work, Action) and record.work.op is Op.W:
            w[record.work.stage].append(float(record.duration) / 1e6)
    step = float(measured_makespan(trace)) / 1e6
    return step, {s: statistics.median(v) for s, v in sorted(w.items())}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeat", type=int, default=2, help="runs per mode and case (2)")
    parser.add_argument(
        "--case", action="append", type=_case, help="SCHEDULE:V:M (zb-h1:1:16, v-half:2:16)"
    )
    parser.add_argument("--width", type=int, default=512, help="GPT width (512; 256 too)")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        for case in args.case or _CASES:
            steps: dict[str, list[float]] = defaultdict(list)
            ws: dict[str, dict[int, list[float]]] = defaultdict(lambda: defaultdict(list))
            for repeat in range(args.repeat):
                modes = ("system", "retain") if repeat % 2 == 0 else ("retain", "system")
                for mode in modes:
                    load = os.getloadavg()[0]
                    step, w = _run(case, mode, Path(tmp) / "trace.json", args.width)
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
