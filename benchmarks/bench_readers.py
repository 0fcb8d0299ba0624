"""What the readers' safety checks cost: pipesim.files.parse_json (duplicate keys,
nesting, number digits) against plain json.loads, and whole schedule files read with
load_schedule, side by side in one run.

Prints, for a 1f1b schedule of p ranks and m micro-batches written as JSON and CSV:
the file size, the median time of json.loads, of parse_json and of load_schedule, and
the ratio parse_json / json.loads (what the strict reading adds). Each figure is the
median of --repeats runs, measured alternately; the machine's load average is
printed before and after, since other work on the machine moves every figure.

Run:  python benchmarks/bench_readers.py [--quick] [--repeats N]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from pipesim.files import parse_json
from pipesim.schedule_io import load_schedule, save_schedule
from pipesim.schedules import generate


def _medians(repeats: int, fns: dict[str, Callable[[], object]]) -> dict[str, float]:
    times: dict[str, list[float]] = {name: [] for name in fns}
    for _ in range(repeats):  # alternate, so that a burst of load hits every function alike
        for name, fn in fns.items():
            start = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - start)
    return {name: statistics.median(values) for name, values in times.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small sizes only")
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    sizes = [(16, 256)] if args.quick else [(16, 256), (64, 4096), (128, 8192)]
    print(f"load average before: {os.getloadavg()[0]:.2f}")
    print(
        f"{'p':>4} {'m':>6} {'actions':>9} {'JSON MB':>8} {'json.loads ms':>14} "
        f"{'parse_json ms':>14} {'ratio':>6} {'load .json ms':>14} {'load .csv ms':>13}"
    )
    with tempfile.TemporaryDirectory() as folder:
        for p, m in sizes:
            schedule = generate("1f1b", n_ranks=p, n_microbatches=m)
            as_json = save_schedule(schedule, Path(folder) / "s.json")
            as_csv = save_schedule(schedule, Path(folder) / "s.csv")
            text = as_json.read_text(encoding="utf-8")
            t = _medians(
                args.repeats,
                {
                    "loads": lambda: json.loads(text),  # noqa: B023 (called at once)
                    "parse": lambda: parse_json(text, source="s.json"),  # noqa: B023
                    "json": lambda: load_schedule(as_json),  # noqa: B023
                    "csv": lambda: load_schedule(as_csv),  # noqa: B023
                },
            )
            print(
                f"{p:>4} {m:>6} {2 * p * m:>9} {len(text) / 1e6:>8.1f} {1e3 * t['loads']:>14.1f} "
                f"{1e3 * t['parse']:>14.1f} {t['parse'] / t['loads']:>6.2f} "
                f"{1e3 * t['json']:>14.1f} {1e3 * t['csv']:>13.1f}"
            )
    print(f"load average after: {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
