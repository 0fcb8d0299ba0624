"""The README's path, as a user takes it: calibrate once, simulate, verify.

Unlike ``bench_fidelity.py`` (which measures calibration and grid in the same rank
processes and pools its calibration copies), every step here is a command of its own:

1. ``pipesim calibrate --model gpt --gpt-layers L --gpt-width D -p 2 [--virtual 2] -m 4
   [--send-mode MODE] -o FILE``, once per cut (2 stages, and 4 for the schedules with
   two stages per rank), with its defaults (rounds, copies, --min-samples);
2. the prediction of ``pipesim simulate NAME -p 2 -m M --costs FILE`` over the span a
   measured step has (``pipesim.calibration.predict`` of ``costs_for``: the ``band``'s
   ``predicted`` of ``simulate --json``; DualPipe's copies take the one-copy cut);
3. ``pipesim verify NAME -p 2 -m M --model gpt ... --batch-size 8M --dist --warmup 3
   --timed-steps K --json`` ``--repeats`` times (each in fresh rank processes, the
   configurations shuffled in each round; each run's figure its median of K steps),
   against whose median the prediction is held.

The grid is ``bench_fidelity.py``'s: every registered family at p=2 with its default
virtual stages, m = 4 and 16. Each line prints the prediction's error against the
median measured step and the run-to-run spread ((slowest - fastest) / median); the
summary the mean / max absolute error and the mean spread, per send mode. The load
(``os.getloadavg``) is printed before every calibration and every round, and recorded.

Run: ``OMP_NUM_THREADS=1 python benchmarks/bench_fidelity_path.py --out DIR`` (6x256, both
send modes, 3 repeats: about 15 minutes on a quiet 2-core machine).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from pipesim.calibration import costs_for, predict
from pipesim.costs import load_costs
from pipesim.errors import PipesimError
from pipesim.schedules import generate, get_spec, schedule_names

_PY = [sys.executable, "-m", "pipesim"]


def _load() -> float:
    return round(os.getloadavg()[0], 2)


def _run(cmd: list[str], timeout: float) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env)
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed ({done.returncode}):\n{done.stderr[-2000:]}")
    return done


def _calibrate(args: argparse.Namespace, size: tuple[int, int], virtual: int, mode: str) -> Path:
    layers, width = size
    out = Path(args.out) / f"cal-{layers}x{width}-v{virtual}-{mode}.json"
    if args.reuse and out.exists():
        print(f"reusing {out.name}", flush=True)
        return out
    cmd = [
        *_PY,
        "calibrate",
        "--model",
        "gpt",
        "--gpt-layers",
        str(layers),
        "--gpt-width",
        str(width),
        "-p",
        "2",
        "-m",
        "4",
        "--send-mode",
        mode,
        "-o",
        str(out),
    ]
    if virtual > 1:
        cmd += ["--virtual", str(virtual)]
    start, load = time.perf_counter(), _load()
    done = _run(cmd, timeout=1800)
    print(
        f"calibrated {out.name} in {time.perf_counter() - start:.0f} s (load {load} -> {_load()})",
        flush=True,
    )
    for line in done.stdout.splitlines():
        if "WARNING" in line or "every fitted figure" in line or "per message" in line:
            print("   " + line.strip(), flush=True)
    return out


def _grid(microbatches: list[int]) -> list[tuple[str, int, int]]:
    found = []
    for name in schedule_names():
        virtual = get_spec(name).default_virtual or 1
        for m in microbatches:
            try:
                generate(name, n_ranks=2, n_microbatches=m, virtual=virtual)
            except PipesimError:
                continue
            found.append((name, m, virtual))
    return found


def _verify(
    size: tuple[int, int], name: str, m: int, virtual: int, rows: int, timed_steps: int
) -> float:
    layers, width = size
    cmd = [
        *_PY,
        "verify",
        name,
        "-p",
        "2",
        "-m",
        str(m),
        "--model",
        "gpt",
        "--gpt-layers",
        str(layers),
        "--gpt-width",
        str(width),
        "--batch-size",
        str(rows * m),
        "--dist",
        "--warmup",
        "3",
        "--timed-steps",
        str(timed_steps),
        "--json",
    ]
    if virtual > 1:
        cmd += ["--virtual", str(virtual)]
    report = json.loads(_run(cmd, timeout=900).stdout)
    if not report.get("bit_identical", True):
        raise SystemExit(f"{name} m={m}: not bit-identical")
    return float(report["measured_makespan"]) * 1e9


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", required=True, help="directory for cost files and results")
    parser.add_argument("--sizes", default="6x256", help="GPT LxD sizes (default 6x256)")
    parser.add_argument("--send-modes", default="eager,rendezvous")
    parser.add_argument("--microbatches", default="4,16")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument(
        "--timed-steps",
        type=int,
        default=1,
        help="verify --timed-steps of each run (its median step is the run's measurement; "
        "default 1, what the figures in docs/fidelity.md were measured with)",
    )
    parser.add_argument(
        "--reuse",
        action="store_true",
        help="keep cost files and measured runs already in --out (runs.jsonl); a stopped "
        "run then goes on where it stopped, and --repeats 0 prints what it has",
    )
    args = parser.parse_args()
    Path(args.out).mkdir(parents=True, exist_ok=True)
    modes = args.send_modes.split(",")
    results: list[dict[str, Any]] = []
    for item in args.sizes.split(","):
        layers, _, width = item.partition("x")
        size = (int(layers), int(width))
        cuts = {
            mode: {2 * v: load_costs(_calibrate(args, size, v, mode)) for v in (1, 2)}
            for mode in modes
        }
        grid = _grid([int(m) for m in args.microbatches.split(",")])
        measured: dict[tuple[str, int], list[float]] = {(n, m): [] for n, m, _ in grid}
        # Every measured run is appended here as it ends, so a stopped run keeps its runs.
        log = Path(args.out) / "runs.jsonl"
        done = set()
        if args.reuse and log.exists():
            for line in log.read_text().splitlines():
                logged = json.loads(line)
                if logged["model"] == item and (logged["schedule"], logged["m"]) in measured:
                    measured[(logged["schedule"], logged["m"])].append(logged["ns"])
                    done.add((logged["round"], logged["schedule"], logged["m"]))
        loads = []
        for round_ in range(args.repeats):
            order = list(grid)
            random.Random(round_).shuffle(order)
            loads.append(_load())
            start = time.perf_counter()
            for name, m, virtual in order:
                if (round_, name, m) in done:
                    continue
                ns, load = _verify(size, name, m, virtual, 8, args.timed_steps), _load()
                measured[(name, m)].append(ns)
                with log.open("a") as f:
                    f.write(
                        json.dumps(
                            {
                                "model": item,
                                "round": round_,
                                "schedule": name,
                                "m": m,
                                "ns": ns,
                                "load": load,
                            }
                        )
                        + "\n"
                    )
            print(
                f"round {round_ + 1}/{args.repeats}: {time.perf_counter() - start:.0f} s, "
                f"load {loads[-1]} -> {_load()}",
                flush=True,
            )
        for name, m, virtual in grid:
            schedule = generate(name, n_ranks=2, n_microbatches=m, virtual=virtual)
            runs = measured[(name, m)]
            if not runs:
                continue
            med = statistics.median(runs)
            row: dict[str, Any] = {
                "model": item,
                "schedule": name,
                "m": m,
                "virtual": virtual,
                "measured_ms": med / 1e6,
                "runs_ms": [r / 1e6 for r in runs],
                "spread_pct": (max(runs) - min(runs)) / med * 100,
            }
            for mode in modes:
                predicted = float(predict(schedule, costs_for(schedule, cuts[mode])))
                row[f"{mode}_predicted_ms"] = predicted / 1e6
                row[f"{mode}_error_pct"] = (predicted - med) / med * 100
            results.append(row)
            errors = "  ".join(f"{mode} {row[f'{mode}_error_pct']:+6.1f}%" for mode in modes)
            print(
                f"{item} {name:<17} m={m:<3} measured {row['measured_ms']:8.2f} ms "
                f"({len(runs)} runs, spread {row['spread_pct']:5.1f}%)  {errors}",
                flush=True,
            )
        print(f"loads at the rounds' starts: {loads}")
    repeated = [r["spread_pct"] for r in results if len(r["runs_ms"]) > 1]
    spread = statistics.mean(repeated) if repeated else float("nan")
    for mode in modes:
        errs = [abs(r[f"{mode}_error_pct"]) for r in results]
        signed = statistics.mean(r[f"{mode}_error_pct"] for r in results)
        print(
            f"{mode}: {len(errs)} configurations, error mean {statistics.mean(errs):.1f}% / "
            f"max {max(errs):.1f}% (signed mean {signed:+.1f}%), run-to-run spread mean "
            f"{spread:.1f}% (over the {len(repeated)} measured more than once)"
        )
    (Path(args.out) / "results.json").write_text(json.dumps(results, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
