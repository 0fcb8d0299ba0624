"""Time per steady-state step: pipesim's multi-process executor against torch's
``torch.distributed.pipelining`` runtime, same schedule, split, micro-batches, processes.

Goal: pipesim's executor within 1.1x of torch's. Each run starts the rank
processes once (verify.crosscheck) and runs, in every rank, ``--warmup`` untimed and
``--steps`` timed steps of each runtime, alternating: a step of one, then a step of the
other, the order flipped every step (and which goes first flipped between repeats), so
that both see the same load and neither always runs on a warmer machine. A step's
wall time is the slowest rank's (step + barrier); its CPU time is the ranks' processes'
CPU time added (their threads too), which load on a shared machine stretches less than
wall time. Every run is checked bit for bit against torch.

One line is printed (and flushed) per schedule and repeat as it finishes, with the load
(os.getloadavg) when it started; the summary gives, per schedule, the median over the
repeats of each side's median step, the spread (lowest-highest repeat median) and the
median of the per-repeat ratios, and ("paired") the median over all timed steps of each
pipesim step's time over the torch step's next to it. ``--budget-s`` bounds the whole
benchmark: a run gets what is left of it as its timeout, and when it is spent the
benchmark says so and summarises what it measured.

Run: ``python benchmarks/bench_verify_torch.py [--steps 10] [--warmup 2] [--repeat 3]
[--model mlp|gpt] [--budget-s 1200] [--case 1f1b ...] [--threads 1]``
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from collections.abc import Sequence

import torch

from pipesim.schedules import generate
from verify.crosscheck import CrossCheck, crosscheck
from verify.errors import RunFailedError

# (ranks, micro-batches, stages per rank): at most 7 stages, so that the 7-layer MLP splits.
CASES = {"1f1b": (4, 16, 1), "interleaved-1f1b": (2, 8, 2), "zbv": (2, 8, 2)}


def _ms(values: Sequence[float]) -> float:
    return statistics.median(values) * 1e3


def _line(label: str, check: CrossCheck, load: float, order: str) -> str:
    ours, theirs = _ms(check.pipesim_steps_s), _ms(check.torch_steps_s)
    cpu_ours, cpu_theirs = _ms(check.pipesim_cpu_s), _ms(check.torch_cpu_s)
    return (
        f"{label:<26} wall {_spread(check.pipesim_steps_s)} / {_spread(check.torch_steps_s)} "
        f"ms = {ours / theirs:5.2f}x   cpu {_spread(check.pipesim_cpu_s)} / "
        f"{_spread(check.torch_cpu_s)} ms = {cpu_ours / cpu_theirs:5.2f}x   {_paired([check])}   "
        f"load {load:4.1f}  " + order
    )


def _spread(seconds: Sequence[float]) -> str:
    """``median [lowest-highest]`` in milliseconds."""
    ms = [s * 1e3 for s in seconds]
    return f"{statistics.median(ms):8.2f} [{min(ms):.1f}-{max(ms):.1f}]"


def _paired(checks: Sequence[CrossCheck]) -> str:
    """The median over every timed step of pipesim's step / the torch step run next to it
    (the two see the same load), wall and CPU."""
    wall = [a / b for c in checks for a, b in zip(c.pipesim_steps_s, c.torch_steps_s, strict=True)]
    cpu = [a / b for c in checks for a, b in zip(c.pipesim_cpu_s, c.torch_cpu_s, strict=True)]
    return f"paired {statistics.median(wall):4.2f}x wall {statistics.median(cpu):4.2f}x cpu"


def _summary(name: str, checks: Sequence[CrossCheck]) -> str:
    walls = (
        [c.pipesim_step_s for c in checks],
        [c.torch_step_s for c in checks],
    )
    cpus = (
        [statistics.median(c.pipesim_cpu_s) for c in checks],
        [statistics.median(c.torch_cpu_s) for c in checks],
    )
    wall_ratio = statistics.median(a / b for a, b in zip(*walls, strict=True))
    cpu_ratio = statistics.median(a / b for a, b in zip(*cpus, strict=True))
    return (
        f"{name:<26} wall {_spread(walls[0])} / {_spread(walls[1])} ms = {wall_ratio:5.2f}x   "
        f"cpu {_spread(cpus[0])} / {_spread(cpus[1])} ms = {cpu_ratio:5.2f}x   "
        f"{_paired(checks)}   ({len(checks)} repeats)"
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=10, help="timed steady steps per run")
    parser.add_argument("--warmup", type=int, default=2, help="untimed steps before them")
    parser.add_argument("--repeat", type=int, default=3)
    # The small MLP by default: what an executor adds per step shows most beside little
    # compute; --model gpt (6 blocks, width 128) for a compute-bound step.
    parser.add_argument("--model", default="mlp", choices=("mlp", "gpt"))
    parser.add_argument("--budget-s", type=float, default=1200.0, help="bound of the whole run")
    parser.add_argument("--case", action="append", choices=sorted(CASES), help="default: all")
    # Every rank runs the parent's thread count (the same kernels as the reference). One
    # thread each by default: on a shared machine, idle OpenMP threads spinning on busy
    # cores count as CPU time and drown a 10% difference in noise.
    parser.add_argument("--threads", type=int, default=1, help="torch threads per rank")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    names = args.case or list(CASES)
    options = {"n_layers": 6, "width": 128} if args.model == "gpt" else {}
    deadline = time.monotonic() + args.budget_s
    print(
        f"model {args.model} {options}, {args.warmup} warm-up + {args.steps} timed steps per run, "
        f"{args.repeat} repeats, {args.threads} threads per rank, {os.cpu_count()} cpus; "
        "per run: pipesim / torch median step [lowest-highest], ratio, 1-min load at its start",
        flush=True,
    )
    done: dict[str, list[CrossCheck]] = {name: [] for name in names}
    stopped = ""
    for repeat in range(args.repeat):
        torch_first = repeat % 2 == 1
        for name in names:
            p, m, v = CASES[name]
            left = deadline - time.monotonic()
            if left < 5:
                stopped = f"the budget of {args.budget_s:g} s (--budget-s) is spent"
                break
            load = os.getloadavg()[0]
            schedule = generate(name, n_ranks=p, n_microbatches=m, virtual=v)
            try:
                check = crosscheck(
                    schedule,
                    model=args.model,
                    model_options=options,
                    warmup=args.warmup,
                    steps=args.steps,
                    timeout_s=left,
                    torch_first=torch_first,
                )
            except RunFailedError as exc:
                stopped = f"repeat {repeat + 1} of {name} did not finish: {exc}"
                break
            if not check.identical:
                print(f"{name}: NOT bit-identical with torch: {check.mismatches[:3]}", flush=True)
                return 1
            done[name].append(check)
            order = "torch first" if torch_first else "pipesim first"
            label = f"#{repeat + 1} {name} p={p} m={m}"
            print(_line(label, check, load, order), flush=True)
        if stopped:
            break
    if stopped:
        print(f"bench_verify_torch: stopped early, {stopped}; summary of what was measured")
    print(f"summary (load now {os.getloadavg()[0]:.1f}): pipesim / torch, median [spread]")
    for name in names:
        if done[name]:
            print(_summary(f"{name} p={CASES[name][0]} m={CASES[name][1]}", done[name]))
    return 1 if not any(done.values()) else 0


if __name__ == "__main__":
    sys.exit(main())
