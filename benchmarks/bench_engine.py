"""Speed of the SimPy engine, and of torch.distributed.pipelining's own dry run.

Prints, for 1f1b and interleaved-1f1b at p in {4, 16, 64} and m in {16, 256, 1024}:
simulated actions per second of the engine alone (``run_trace``), and the wall
time of a full ``simulate`` (validation + engine + metrics). When torch is
installed it also builds the same interleaved configurations with torch's
schedule classes (mock stages, no process group, as torch's own schedule
visualizer does), lowers them with communication actions and runs torch's
``_simulate_comms_compute`` dry run, and prints torch time / pipesim time.

Run:  python benchmarks/bench_engine.py [--quick]
Goals (issue 2): >= 200,000 actions/s on one core for the engine; a 64 x 1024
1f1b step in a few seconds; pp=32 x 256 interleaved ten times faster than torch.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable

import pipesim
from pipesim.costs import CostModel


def _best_of(repeats: int, fn: Callable[[], object]) -> float:
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - start)
    return best


def bench_pipesim(name: str, p: int, m: int, virtual: int | None) -> tuple[int, float, float]:
    schedule = pipesim.generate(name, n_ranks=p, n_microbatches=m, virtual=virtual)
    costs = CostModel().for_stages(schedule.n_stages)
    n_actions = sum(len(order) for order in schedule.orders)
    repeats = 3 if n_actions < 50_000 else 1
    engine = _best_of(repeats, lambda: pipesim.run_trace(schedule, costs))
    full = _best_of(
        repeats,
        lambda: pipesim.simulate(
            pipesim.generate(name, n_ranks=p, n_microbatches=m, virtual=virtual), costs=costs
        ),
    )
    return n_actions, engine, full


def bench_torch(p: int, m: int, virtual: int) -> float | None:
    try:
        from torch.distributed.pipelining import schedules as torch_schedules
        from torch.distributed.pipelining._schedule_visualizer import get_schedule_ops
    except ImportError:
        return None

    def build_and_simulate() -> None:
        ops = get_schedule_ops("Interleaved1F1B", p, m, virtual, with_comms=True)
        # The dry run models compute and send/recv only; drop FSDP-style bookkeeping ops.
        skip = {"UNSHARD", "RESHARD", "REDUCE_GRAD"}
        order = {
            rank: [a for a in row if a is not None and a.computation_type.value not in skip]
            for rank, row in enumerate(ops)
        }
        torch_schedules._simulate_comms_compute(order, lambda s: s % p, p * virtual)

    return _best_of(1, build_and_simulate)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="skip the largest sizes")
    args = parser.parse_args()
    sizes = [(p, m) for p in (4, 16, 64) for m in (16, 256, 1024)]
    if args.quick:
        sizes = [(p, m) for p, m in sizes if p * m <= 16 * 256]
    print(
        f"{'schedule':<18}{'p':>4}{'m':>6}{'actions':>10}{'engine s':>10}"
        f"{'actions/s':>12}{'simulate s':>12}"
    )
    for name, virtual in (("1f1b", None), ("interleaved-1f1b", 2)):
        for p, m in sizes:
            if name == "interleaved-1f1b" and m < p:
                continue
            n, engine, full = bench_pipesim(name, p, m, virtual)
            print(f"{name:<18}{p:>4}{m:>6}{n:>10}{engine:>10.3f}{n / engine:>12,.0f}{full:>12.3f}")
    print()
    print("interleaved-1f1b, v=2: build + simulate, torch dry run vs pipesim simulate")
    for p, m in ((8, 64), (32, 256)):
        if args.quick and p * m > 16 * 256:
            continue
        torch_time = bench_torch(p, m, 2)
        _, _, full = bench_pipesim("interleaved-1f1b", p, m, 2)
        if torch_time is None:
            print(f"  p={p} m={m}: pipesim {full:.3f} s (torch not installed)")
        else:
            print(
                f"  p={p} m={m}: torch {torch_time:.3f} s, pipesim {full:.3f} s, "
                f"ratio {torch_time / full:.1f}x"
            )


if __name__ == "__main__":
    main()
