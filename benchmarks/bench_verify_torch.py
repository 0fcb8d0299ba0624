"""Wall time per steady-state step: pipesim's multi-process executor against torch's
``torch.distributed.pipelining`` runtime, same schedule, split, micro-batches, processes.

Goal (issue 12): pipesim's executor within 1.1x of torch's. Both run in the same gloo
rank processes one after the other (verify.crosscheck), each for ``--steps`` steps; a
step's time is the slowest rank's (step + barrier), the first step is dropped, the median
of the rest is reported; the whole measurement is repeated ``--repeat`` times and the
medians of the repeats are printed with the machine load (os.getloadavg) beside them.
Every run is also checked bit for bit against torch.

Run: ``python benchmarks/bench_verify_torch.py [--steps 8] [--repeat 3] [--model gpt]``
"""

from __future__ import annotations

import argparse
import os
import statistics

from pipesim.schedules import generate
from verify.crosscheck import crosscheck_all

CASES = [("1f1b", 4, 16, 1), ("interleaved-1f1b", 4, 16, 2), ("zbv", 4, 16, 2)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--model", default="gpt", choices=("mlp", "gpt"))
    args = parser.parse_args()
    schedules = [generate(n, n_ranks=p, n_microbatches=m, virtual=v) for n, p, m, v in CASES]
    options = {"n_layers": 6, "width": 128} if args.model == "gpt" else {}
    runs: dict[str, list[tuple[float, float]]] = {s.name: [] for s in schedules}
    loads = []
    for _ in range(args.repeat):
        loads.append(os.getloadavg()[0])
        checks = crosscheck_all(
            schedules, model=args.model, model_options=options, steps=args.steps, timeout_s=900
        )
        for check in checks:
            if not check.identical:
                raise SystemExit(f"{check.schedule}: NOT bit-identical: {check.mismatches[:3]}")
            runs[check.schedule].append((check.pipesim_step_s, check.torch_step_s))
    print(
        f"model {args.model}, {args.steps} steps x {args.repeat} repeats; load "
        f"{', '.join(f'{x:.1f}' for x in loads)} (1-min avg at each repeat, {os.cpu_count()} cpus)"
    )
    print(f"{'schedule':<20} {'pipesim ms':>11} {'torch ms':>9} {'ratio':>6}  all bit-identical")
    for (name, p, m, _), schedule in zip(CASES, schedules, strict=True):
        ours = statistics.median(r[0] for r in runs[schedule.name]) * 1e3
        theirs = statistics.median(r[1] for r in runs[schedule.name]) * 1e3
        print(f"{name + f' p={p} m={m}':<20} {ours:>11.2f} {theirs:>9.2f} {ours / theirs:>6.2f}")


if __name__ == "__main__":
    main()
