"""How fast the planner sweeps: configurations per second.

Goal (issues 6 and 10): 10,000 configurations that all need simulating, of up
to 16 stages and 128 micro-batches, in under a minute on a 2-core machine. On a
shared machine the wall time counts the neighbours' load too, so the sweep also
reports CPU seconds and what they mean for idle cores.

1. The goal's sweep: every registered schedule x pipeline degree p in
   {2, 4, 8, 16} x micro-batches m in 1..128 x virtual v in {1, 2}, for
   Llama 2 13B on 16 H100s (d = 16 / p, micro-batch size 1). Configurations a
   schedule refuses (its rules) cost a generator call and are counted apart.
2. A realistic ``plan`` call, as the CLI runs it.
3. One large configuration, fast evaluator vs the SimPy engine (same result).
4. Branch and bound (``plan(prune=True)``, ``--prune``, :mod:`pipesim.plan.prune`) against the
   exhaustive sweep (``prune=False``) on the same request, side by side, each repeated
   (median), with a check that both print the same rows. ``--big`` adds the targets of
   docs/planner-speed.md: llama2-70b on 4,096 H100s and llama3.1-405b on 16,384, every
   default dimension (the exhaustive run stops at ``--timeout``: its time is then a
   lower bound, and so is the ratio).

Every section runs twice where it can, side by side: with the exact steady-state
extrapolation (:mod:`pipesim.plan.steady`) and long schedules priced from short ones
(:mod:`pipesim.plan.splice`), the default, and without either (``PIPESIM_STEADY=0``:
every schedule generated, every micro-batch evaluated), and checks that both give the
same results. ``--big`` prints the targets of issue 27 (llama2-70b on 4,096 H100s in
at most 60 s, llama3.1-405b on 16,384 in at most 120 s) next to the measured times.

Run: ``python benchmarks/bench_plan.py [--workers N] [--quick] [--big] [--repeat K]``
"""

from __future__ import annotations

import argparse
import contextlib
import os
import resource
import statistics
import time

from pipesim.engine import simulate
from pipesim.plan import get_accelerator, get_model, plan, workload_from_model
from pipesim.plan.fastsim import compile_schedule, evaluate
from pipesim.plan.onepass import quick_step
from pipesim.plan.steady import find_pattern
from pipesim.plan.sweep import Point, SweepContext, evaluate_points
from pipesim.schedules import generate, schedule_names


def _cpu_seconds() -> float:
    """User + system CPU of this process and of its finished (joined) children."""
    own = resource.getrusage(resource.RUSAGE_SELF)
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


@contextlib.contextmanager
def _steady(on: bool):  # type: ignore[no-untyped-def]
    """The sweep with (the default) or without the steady-state extrapolation; pool
    workers inherit the environment, and each sweep reads it when it starts."""
    before = os.environ.get("PIPESIM_STEADY")
    os.environ["PIPESIM_STEADY"] = "1" if on else "0"
    try:
        yield
    finally:
        if before is None:
            del os.environ["PIPESIM_STEADY"]
        else:
            os.environ["PIPESIM_STEADY"] = before


def _label(on: bool) -> str:
    return "extrapolated and spliced" if on else "every micro-batch"


def goal_sweep(workers: int, quick: bool, repeat: int) -> None:
    model = get_model("llama2-13b")
    accelerator = get_accelerator("h100-sxm")
    context = SweepContext(
        workload=workload_from_model(model),
        accelerator=accelerator,
        devices=16,
        memory_capacity_bytes=accelerator.memory_bytes,
    )
    micro = range(1, 129, 8 if quick else 1)
    points = [
        Point(
            schedule=name,
            pipeline=p,
            virtual=v,
            microbatch_size=1,
            n_microbatches=m,
            data_parallel=16 // p,
        )
        for name in schedule_names()
        for p in (2, 4, 8, 16)
        for m in micro
        for v in (1, 2)
    ]
    print(
        f"1. goal sweep ({'quick' if quick else 'full'}): {len(points)} configurations, "
        f"p <= 16, m <= 128, {workers} workers, median of {repeat}"
    )
    walls: dict[bool, float] = {}
    results: dict[bool, object] = {}
    for on in (True, False):
        load = os.getloadavg()[0]
        times, cpus = [], []
        for _ in range(repeat):
            cpu_before = _cpu_seconds()
            start = time.perf_counter()
            with _steady(on):
                found = evaluate_points(context, points, workers=workers, timeout_s=3600)
            times.append(time.perf_counter() - start)
            cpus.append(_cpu_seconds() - cpu_before)
        results[on] = found
        wall, cpu = statistics.median(times), statistics.median(cpus)
        walls[on] = wall
        simulated = sum(r.reason is None for r in found)
        actions = sum(
            2 * p.pipeline * p.virtual * p.n_microbatches
            for p, r in zip(points, found, strict=True)
            if r.reason is None
        )
        print(
            f"   {_label(on)}: {wall:.1f} s wall ({simulated} simulated, "
            f"{len(points) - simulated} refused by schedule rules, ~{actions / 1e6:.1f} M F/B "
            f"actions): 10,000 simulated would take {10_000 / (simulated / wall):.1f} s; "
            f"{cpu:.1f} CPU s; load {load:.1f} -> {os.getloadavg()[0]:.1f}"
        )
    print(
        f"   extrapolated and spliced / every micro-batch: {walls[False] / walls[True]:.2f}x "
        "faster; "
        f"same evaluations: {results[True] == results[False]}"
    )


def realistic_plan(workers: int) -> None:
    start = time.perf_counter()
    result = plan(
        "llama2-13b", devices=32, accelerator="h100-sxm", global_batch=256, workers=workers
    )
    wall = time.perf_counter() - start
    simulated = sum(p.feasible for p in result.points)
    print(
        f"2. pipesim plan --model llama2-13b --devices 32 --accelerator h100-sxm "
        f"--global-batch 256: {len(result.points)} configurations ({simulated} simulated) "
        f"in {wall:.1f} s = {simulated / wall:,.0f} simulated/s; best: "
        f"{result.best.label() if result.best else None}"
    )


def one_large(name: str = "1f1b") -> None:
    from pipesim.plan import stage_costs, sweep

    context = SweepContext(
        workload=workload_from_model(get_model("llama2-13b")),
        accelerator=get_accelerator("h100-sxm"),
        devices=16,
        memory_capacity_bytes=80 * 10**9,
    )
    point = Point(
        schedule=name,
        pipeline=16,
        virtual=1,
        microbatch_size=1,
        n_microbatches=128,
        data_parallel=1,
    )
    sweep.evaluate_point(context, point)  # fills the cost cache
    costs = stage_costs._COSTS[next(iter(stage_costs._COSTS))].costs
    timings = {}
    start = time.perf_counter()
    schedule = generate(name, n_ranks=16, n_microbatches=128)
    timings["generate"] = time.perf_counter() - start
    start = time.perf_counter()
    one_pass = quick_step(schedule, costs)
    timings["one pass"] = time.perf_counter() - start
    start = time.perf_counter()
    pattern = find_pattern(schedule)
    timings["find_pattern"] = time.perf_counter() - start
    start = time.perf_counter()
    extrapolated = quick_step(schedule, costs, pattern=pattern)
    timings["one pass, extrapolated"] = time.perf_counter() - start
    start = time.perf_counter()
    compiled = evaluate(compile_schedule(schedule), costs)
    timings["compile + evaluate"] = time.perf_counter() - start
    start = time.perf_counter()
    reference = simulate(schedule, costs=costs, check=False).metrics.makespan
    timings["SimPy engine"] = time.perf_counter() - start
    assert one_pass is not None and one_pass.makespan == compiled.makespan == reference
    assert extrapolated == one_pass
    shown = ", ".join(f"{k} {v * 1e3:.1f} ms" for k, v in timings.items())
    print(f"3. {name} p=16 m=128 ({2 * 16 * 128} actions): {shown}; same makespan {reference} ns")


def _rows(result: object) -> list[list[str]]:
    """The table's rows, the rank left out where a pruned plan does not know it."""
    from pipesim.plan.report import format_table

    rows = []
    for line in format_table(result).splitlines():  # type: ignore[arg-type]
        words = line.split()
        if len(words) in (19, 20) and words[-1] in ("yes", "no", "*"):
            rows.append(words[1:])
    return rows


def _timed(run: object, repeat: int) -> tuple[float, object]:
    times, result = [], None
    for _ in range(repeat):
        start = time.perf_counter()
        result = run()  # type: ignore[operator]
        times.append(time.perf_counter() - start)
    return statistics.median(times), result


def pruned_vs_exhaustive(
    label: str,
    model: str,
    devices: int,
    global_batch: int,
    workers: int,
    repeat: int,
    timeout_s: float,
    target_s: float | None = None,
    **dims: object,
) -> None:
    """The branch and bound with and without the extrapolation, and the exhaustive sweep
    (with it), on one request; the rows each prints are compared."""
    kwargs = dict(
        devices=devices,
        accelerator="h100-sxm",
        global_batch=global_batch,
        workers=workers,
        timeout_s=timeout_s,
        partial=True,
        **dims,
    )
    load = os.getloadavg()[0]
    with _steady(True):
        fast, pruned = _timed(lambda: plan(model, prune=True, **kwargs), repeat)  # type: ignore[arg-type]
    with _steady(False):
        today, before = _timed(lambda: plan(model, prune=True, **kwargs), repeat)  # type: ignore[arg-type]
    with _steady(True):
        slow, every = _timed(lambda: plan(model, prune=False, **kwargs), repeat)  # type: ignore[arg-type]
    done = every.stopped is None  # type: ignore[attr-defined]
    same = _rows(pruned) == _rows(every) if done else None
    simulated = sum(p.feasible for p in pruned.points)  # type: ignore[attr-defined]
    ge = "" if done else ">= "
    print(
        f"4. {label}: {len(pruned.points)} configurations ({simulated} simulated, "  # type: ignore[attr-defined]
        f"{pruned.n_pruned} pruned); median of {repeat}, load {load:.1f} -> "  # type: ignore[attr-defined]
        f"{os.getloadavg()[0]:.1f}\n"
        f"   branch and bound, extrapolated {fast:.1f} s; every micro-batch {today:.1f} s "
        f"({today / fast:.1f}x); same rows: {_rows(pruned) == _rows(before)}\n"
        f"   exhaustive, extrapolated {ge}{slow:.1f} s"
        f"{'' if done else ' (stopped at the timeout)'}: branch and bound {ge}{slow / fast:.1f}x "
        f"faster; same rows: {same}"
        + (
            f"\n   target <= {target_s:.0f} s: {'met' if fast <= target_s else 'NOT met'} "
            f"({fast:.1f} s)"
            if target_s is not None
            else ""
        )
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--quick", action="store_true", help="every 8th m only")
    parser.add_argument("--big", action="store_true", help="the 4,096- and 16,384-GPU plans")
    parser.add_argument("--repeat", type=int, default=None, help="runs per plan (median)")
    parser.add_argument("--timeout", type=float, default=900.0, help="per exhaustive plan")
    args = parser.parse_args()
    repeat = args.repeat or (1 if args.quick else 3)
    print(f"cores: {os.cpu_count()}, load average: {os.getloadavg()[0]:.1f}")
    goal_sweep(args.workers, args.quick, repeat)
    realistic_plan(args.workers)
    one_large()
    pruned_vs_exhaustive(
        "llama2-13b on 32 H100s, global batch 256, every default dimension",
        "llama2-13b",
        32,
        256,
        args.workers,
        repeat,
        args.timeout,
    )
    if args.big:
        pruned_vs_exhaustive(
            "llama2-70b on 4,096 H100s, global batch 16384, every default dimension",
            "llama2-70b",
            4096,
            16384,
            args.workers,
            1,
            args.timeout,
            target_s=60,
        )
        pruned_vs_exhaustive(
            "llama3.1-405b on 16,384 H100s, global batch 16384, every default dimension",
            "llama3.1-405b",
            16384,
            16384,
            args.workers,
            1,
            args.timeout,
            target_s=120,
        )


if __name__ == "__main__":
    main()
