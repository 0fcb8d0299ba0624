"""How steady this machine's compute is: the floor under any fidelity figure.

A prediction can only be shown within x% of a measurement on a machine whose own speed
holds within x%. This runs one fixed piece of work (a batch of single-threaded 256 x 256
matmuls, the size of ``verify --model gpt --gpt-width 256``'s GEMMs) again and again for
``--seconds`` and prints the spread of its times: p10, median, p90, and (p90 - p10) /
median. ``benchmarks/bench_fidelity_path.py`` measures the same machine in fresh rank
processes; when this spread is larger than a fidelity goal, no run there can show the goal
met or missed (docs/fidelity.md, "The machine's own spread").

Run: ``OMP_NUM_THREADS=1 python benchmarks/bench_compute_noise.py [--seconds 40]``
"""

from __future__ import annotations

import argparse
import os
import time

import torch


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=40.0, help="how long to repeat it")
    parser.add_argument("--size", type=int, default=256, help="matrix side (default 256)")
    parser.add_argument("--batch", type=int, default=200, help="matmuls per timed batch")
    args = parser.parse_args()
    for name in ("seconds", "size", "batch"):
        if getattr(args, name) <= 0:
            parser.error(f"--{name} must be positive, got {getattr(args, name)}")
    torch.set_num_threads(1)
    a, b = torch.randn(args.size, args.size), torch.randn(args.size, args.size)
    load = os.getloadavg()[0]
    times: list[float] = []
    stop = time.monotonic() + args.seconds
    while time.monotonic() < stop:
        start = time.perf_counter()
        for _ in range(args.batch):
            a @ b
        times.append((time.perf_counter() - start) * 1e3)
    times.sort()
    n = len(times)
    p10, median, p90 = times[n // 10], times[n // 2], times[9 * n // 10]
    print(f"cores: {os.cpu_count()}, load average: {load:.2f} -> {os.getloadavg()[0]:.2f}")
    print(
        f"{n} batches of {args.batch} {args.size}x{args.size} matmuls, one thread: "
        f"min {times[0]:.2f}, p10 {p10:.2f}, median {median:.2f}, p90 {p90:.2f}, "
        f"max {times[-1]:.2f} ms"
    )
    print(f"spread (p90 - p10) / median: {(p90 - p10) / median:.1%}")


if __name__ == "__main__":
    main()
