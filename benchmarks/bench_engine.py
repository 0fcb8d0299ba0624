"""Speed of the SimPy engine, and of torch.distributed.pipelining's own dry run, side by side.

Prints, in one run (machine load from os.getloadavg beside each figure, medians of
``--repeat`` runs):

1. ``pipesim.simulate`` (validation + engine + metrics) in actions per second, for
   1f1b and interleaved-1f1b (v=2) at p in {4, 16, 64} and m in {16, 256, 1024};
   wall time and process CPU time (CPU time is what a loaded machine distorts least);
2. a step of 1M actions (1f1b, p=64, m=8192) in a fresh process: actions per second
   and the process's peak resident memory (``resource.getrusage``), minus the memory
   the schedule itself takes; then, in another fresh process, the peak of the memory
   ``simulate`` allocates (``tracemalloc``, which slows the run, hence apart);
3. build + simulate against torch 2.x: torch's construction of the same schedule (mock
   stages, no process group, as torch's schedule visualizer does), its
   ``_add_send_recv`` lowering and its ``_simulate_comms_compute`` dry run, versus
   pipesim's ``generate`` + ``simulate``, for Interleaved 1F1B (pp=32, mb=256, v=2),
   ZB-V (pp=32, mb=256) and 1F1B (pp=32, mb=256). torch's time is bimodal from run to
   run (1F1B: about 0.17-0.18 s or 0.32 s CPU on the same machine), so the two are
   measured alternately, ``max(7, --repeat)`` times each, and the median and the best of
   each are printed with both ratios: torch median / pipesim median and torch best /
   pipesim best (CPU time). The goals hold against the best/best ratio, i.e. against
   torch's fast runs.

Run:  python benchmarks/bench_engine.py [--quick] [--repeat N]
Goals (issue 9): simulate >= 200,000 actions/s on 1f1b 64 x 1024 and >= 150,000 at 1M
actions with peak memory well under 1 GB; torch / pipesim (best/best, CPU) >= 10x for
Interleaved 1F1B and ZB-V, >= 3x for 1F1B (this session's own aim: >= 4x).
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable

import pipesim
from pipesim.actions import Action
from pipesim.costs import CostModel

# (pipesim name, torch class name, virtual) for the side-by-side comparison.
_VERSUS_TORCH = (
    ("interleaved-1f1b", "Interleaved1F1B", 2),
    ("zbv", "ZBVZeroBubble", 2),
    ("1f1b", "1F1B", None),
)

_ONE_MILLION = """
import gc, resource, sys, time
import pipesim
schedule = pipesim.generate("1f1b", n_ranks=64, n_microbatches=8192)
n = sum(len(order) for order in schedule.orders)
gc.collect()
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
wall, cpu = time.perf_counter(), time.process_time()
sim = pipesim.simulate(schedule)
wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
print(n, wall, cpu, before * 1024, after * 1024)
"""


_ONE_MILLION_TRACED = """
import gc, tracemalloc
import pipesim
schedule = pipesim.generate("1f1b", n_ranks=64, n_microbatches=8192)
gc.collect()
tracemalloc.start()
sim = pipesim.simulate(schedule)
print(tracemalloc.get_traced_memory()[1])
"""


def _load() -> str:
    return f"load {os.getloadavg()[0]:.1f}"


def _timed(repeats: int, fn: Callable[[], object]) -> tuple[float, float]:
    """Median wall and CPU seconds of ``repeats`` calls."""
    walls, cpus = [], []
    for _ in range(repeats):
        wall, cpu = time.perf_counter(), time.process_time()
        fn()
        walls.append(time.perf_counter() - wall)
        cpus.append(time.process_time() - cpu)
    return statistics.median(walls), statistics.median(cpus)


def _generate(name: str, p: int, m: int, virtual: int | None) -> pipesim.Schedule:
    return pipesim.generate(name, n_ranks=p, n_microbatches=m, virtual=virtual)


def bench_simulate(
    name: str, p: int, m: int, virtual: int | None, repeats: int
) -> tuple[int, float, float]:
    schedule = _generate(name, p, m, virtual)
    costs = CostModel().for_stages(schedule.n_stages)
    n_actions = sum(len(order) for order in schedule.orders)
    wall, cpu = _timed(repeats, lambda: pipesim.simulate(schedule, costs=costs))
    return n_actions, wall, cpu


def _pipesim_build_and_simulate(
    name: str, p: int, m: int, virtual: int | None
) -> Callable[[], object]:
    return lambda: pipesim.simulate(_generate(name, p, m, virtual))


def _torch_build_and_simulate(
    torch_name: str, p: int, m: int, virtual: int | None
) -> Callable[[], object] | None:
    """torch's construction + ``_add_send_recv`` + ``_simulate_comms_compute`` of the
    schedule, as one call; None when torch is not installed."""
    try:
        from torch.distributed.pipelining import schedules as torch_schedules
        from torch.distributed.pipelining._schedule_visualizer import get_schedule_ops
    except ImportError:
        return None
    n_stages = p * (virtual or 1)

    def stage_to_rank(stage: int) -> int:
        if torch_name == "ZBVZeroBubble":  # V placement: down the ranks, then back up
            return stage if stage < p else 2 * p - 1 - stage
        return stage % p

    fixed = None
    if torch_name == "1F1B":
        # torch's drawn Schedule1F1B.pipeline_order numbers the last rank's micro-batches
        # from 1 (tests/test_torch_parity.py), which its own _add_send_recv refuses; lower
        # the order torch runs instead, converted before the clock starts.
        from torch.distributed.pipelining.schedules import _Action, _ComputationType

        kinds = {"F": _ComputationType.FORWARD, "B": _ComputationType.FULL_BACKWARD}
        fixed = {
            rank: [
                _Action(a.stage, kinds[a.op.value], a.microbatch)
                for a in order
                if isinstance(a, Action)  # 1F1B has no overlapped pairs
            ]
            for rank, order in enumerate(_generate("1f1b", p, m, None).orders)
        }

    def build_and_simulate() -> None:
        # torch's construction of the compute order (mock stages, as its visualizer)...
        ops = get_schedule_ops(torch_name, p, m, virtual)
        compute = {rank: [a for a in row if a is not None] for rank, row in enumerate(ops)}
        # ...its lowering with send/recv actions, and its dry run of the result.
        if fixed is not None:  # _add_send_recv consumes its input's lists: a fresh copy
            compute = {rank: list(actions) for rank, actions in fixed.items()}
        lowered = torch_schedules._add_send_recv(compute, stage_to_rank, n_stages)
        torch_schedules._simulate_comms_compute(lowered, stage_to_rank, n_stages)

    return build_and_simulate


def _cpu_seconds(fn: Callable[[], object]) -> float:
    cpu = time.process_time()
    fn()
    return time.process_time() - cpu


def versus_torch(
    name: str, torch_name: str, p: int, m: int, virtual: int | None, repeats: int
) -> str:
    """One line: pipesim and torch build + simulate, measured alternately ``repeats``
    times each; median and best CPU seconds of each, and both ratios."""
    ours = _pipesim_build_and_simulate(name, p, m, virtual)
    theirs = _torch_build_and_simulate(torch_name, p, m, virtual)
    label = f"  {name:<17} p={p} m={m}:"
    if theirs is None:
        _, cpu = _timed(repeats, ours)
        return f"{label} pipesim {cpu:.3f} s CPU (torch not installed)  {_load()}"
    ours_cpu, theirs_cpu = [], []
    for _ in range(repeats):  # alternately, so that both see the same load
        ours_cpu.append(_cpu_seconds(ours))
        theirs_cpu.append(_cpu_seconds(theirs))
    o_med, o_best = statistics.median(ours_cpu), min(ours_cpu)
    t_med, t_best = statistics.median(theirs_cpu), min(theirs_cpu)
    return (
        f"{label} torch {t_med:.3f} (best {t_best:.3f}), pipesim {o_med:.3f} "
        f"(best {o_best:.3f}) s CPU; torch / pipesim {t_med / o_med:.1f}x median/median, "
        f"{t_best / o_best:.1f}x best/best  {_load()}"
    )


def _fresh_process(code: str) -> list[str]:
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=1200, check=True
    )
    return done.stdout.split()


def one_million() -> str:
    n, wall, cpu, before, after = _fresh_process(_ONE_MILLION)
    n_actions = int(n)
    mib = (int(after) - int(before)) / 2**20
    first = (
        f"1f1b p=64 m=8192: {n_actions:,} actions, simulate {float(wall):.2f} s wall "
        f"({n_actions / float(wall):,.0f}/s), {float(cpu):.2f} s CPU "
        f"({n_actions / float(cpu):,.0f}/s); peak memory +{mib:,.0f} MiB resident over the "
        f"schedule ({int(after) / 2**20:,.0f} MiB in all); {_load()}"
    )
    (traced,) = _fresh_process(_ONE_MILLION_TRACED)
    return (
        f"{first}\n  simulate allocates at most {int(traced) / 2**20:,.0f} MiB (tracemalloc peak)"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="skip the largest sizes")
    parser.add_argument("--repeat", type=int, default=3, help="runs per figure (median)")
    args = parser.parse_args()
    sizes = [(p, m) for p in (4, 16, 64) for m in (16, 256, 1024)]
    if args.quick:
        sizes = [(p, m) for p, m in sizes if p * m <= 16 * 256]
    print(f"pipesim {pipesim.__version__}, median of {args.repeat} runs")
    print(
        f"{'schedule':<18}{'p':>4}{'m':>6}{'actions':>10}{'wall s':>9}{'actions/s':>12}"
        f"{'cpu s':>8}{'actions/s':>12}  load"
    )
    for name, virtual in (("1f1b", None), ("interleaved-1f1b", 2)):
        for p, m in sizes:
            if name == "interleaved-1f1b" and m < p:
                continue
            n, wall, cpu = bench_simulate(name, p, m, virtual, args.repeat)
            print(
                f"{name:<18}{p:>4}{m:>6}{n:>10}{wall:>9.3f}{n / wall:>12,.0f}"
                f"{cpu:>8.3f}{n / cpu:>12,.0f}  {_load()}"
            )
    if not args.quick:
        print()
        print(one_million())
    print()
    repeats = max(7, args.repeat)
    p, m = (8, 64) if args.quick else (32, 256)
    print(f"build + simulate, pp={p} mb={m}, {repeats} runs of each, alternately: torch")
    print("(construction + _add_send_recv + _simulate_comms_compute) vs pipesim (generate +")
    print("simulate), median and best CPU seconds; goals against best/best")
    for name, torch_name, virtual in _VERSUS_TORCH:
        print(versus_torch(name, torch_name, p, m, virtual, repeats))


if __name__ == "__main__":
    main()
