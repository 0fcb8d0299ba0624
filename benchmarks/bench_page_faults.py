"""Why one op's CPU time depends on what ran before it: minor page faults per W.

Goal (see ``verify/allocator.py``): find the mechanism behind the W times
that are bimodal in ``verify --dist`` runs (the same stage's W 23-30 ms or 70-90 ms on
the 6x512 GPT). W hands back every parameter's gradient as a fresh tensor (megabytes
each) and adds it into ``.grad``. Under glibc's defaults a freed block that large is
given back to the kernel (``munmap`` or a heap trim), so the next W's fresh tensors
are new pages: the kernel faults and zeroes every 4 KiB page on first touch, inside
the op's time. ``PIPESIM_CPU_ALLOCATOR=retain`` keeps freed memory in the process, as
CUDA's caching allocator does on a GPU.

This runs, in one process per mode (``system`` and ``retain`` alternately, ``--repeat``
times each), the last stage of a 2-stage split of a 6-block GPT ``--width`` wide (8 rows
of 16 tokens per micro-batch, one intra-op thread): ``--microbatches`` forwards each
followed by I, with W either at once (``adjacent``, as in 1F1B's split backward) or
three micro-batches later (``deferred``, as zero-bubble schedules place it). Per W it
records the wall time and the process's minor page faults (``getrusage``), skips the
first step (warm-up), and prints per mode and pattern the median and p10-p90 of both,
with the load (``os.getloadavg``) on every line.

Run: ``python benchmarks/bench_page_faults.py [--repeat 2] [--width 512] [--steps 4]``
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from collections import defaultdict
from collections.abc import Callable, Sequence

_PATTERNS = ("adjacent", "deferred")
_DEFER = 3  # micro-batches between a W and its I in the deferred pattern


def _minor_faults() -> int:
    from verify.allocator import minor_page_faults  # in the child, as its other imports

    count = minor_page_faults()
    if count is None:
        raise SystemExit(
            "bench_page_faults needs the process's page-fault count (getrusage), which this "
            "platform lacks; run it on Linux"
        )
    return count


def _child(width: int, steps: int, m: int) -> dict[str, list[tuple[float, int]]]:
    """Run both patterns in this process; per pattern the (ms, faults) of each W."""
    from verify.allocator import configure_allocator

    configure_allocator()  # before torch allocates anything
    import torch

    from verify.models import gpt
    from verify.split_backward import PendingWeights, input_backward, weight_backward

    torch.set_num_threads(1)
    model = gpt(n_layers=6, width=width)
    stage = torch.nn.Sequential(*list(model.layers)[4:])  # 3 blocks + head
    params = list(stage.parameters())

    def forward_and_input(mb: int) -> PendingWeights:
        torch.manual_seed(mb)
        x = torch.randn(8, 16, width, requires_grad=True)
        loss = model.loss_fn(stage(x), torch.randint(128, (8, 16)))
        return input_backward(loss, None, x, params)[1]

    def timed_weights(pending: PendingWeights) -> tuple[float, int]:
        faults, start = _minor_faults(), time.perf_counter_ns()
        for p, g in zip(params, weight_backward(pending), strict=True):
            if g is not None:
                p.grad = g.detach() if p.grad is None else p.grad.add_(g)
        return (time.perf_counter_ns() - start) / 1e6, _minor_faults() - faults

    out: dict[str, list[tuple[float, int]]] = {}
    for pattern in _PATTERNS:
        defer = 0 if pattern == "adjacent" else _DEFER
        rows: list[tuple[float, int]] = []
        for step in range(steps + 1):
            for p in params:
                p.grad = None
            pending: dict[int, PendingWeights] = {}
            timed = []
            for mb in range(m):
                pending[mb] = forward_and_input(mb)
                if mb - defer in pending:
                    timed.append(timed_weights(pending.pop(mb - defer)))
            timed += [timed_weights(pending.pop(mb)) for mb in sorted(pending)]
            if step > 0:  # the first step warms up
                rows += timed
        out[pattern] = rows
    return out


def _run_mode(mode: str, args: argparse.Namespace) -> dict[str, list[tuple[float, int]]]:
    command = [sys.executable, __file__, "--child", "--width", str(args.width)]
    command += ["--steps", str(args.steps), "--microbatches", str(args.microbatches)]
    env = os.environ | {"PIPESIM_CPU_ALLOCATOR": mode, "OMP_NUM_THREADS": "1"}
    try:
        done = subprocess.run(
            command, env=env, capture_output=True, text=True, timeout=args.timeout
        )
    except subprocess.TimeoutExpired:
        raise SystemExit(
            f"bench_page_faults: the {mode} run took over {args.timeout:g} s; "
            "raise --timeout or lower --steps / --microbatches"
        ) from None
    if done.returncode != 0:
        raise SystemExit(f"bench_page_faults: the {mode} run failed: {done.stderr.strip()}")
    result: dict[str, list[tuple[float, int]]] = json.loads(done.stdout)
    return result


def _spread(values: Sequence[float], fmt: Callable[[float], str]) -> str:
    ordered = sorted(values)
    p10, p90 = ordered[len(ordered) // 10], ordered[(len(ordered) * 9) // 10]
    return f"{fmt(statistics.median(ordered))} (p10-p90 {fmt(p10)}-{fmt(p90)})"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeat", type=int, default=2, help="processes per mode (2)")
    parser.add_argument("--width", type=int, default=512, help="GPT width (512)")
    parser.add_argument("--steps", type=int, default=4, help="timed steps per process (4)")
    parser.add_argument("--microbatches", type=int, default=16, help="per step (16)")
    parser.add_argument("--timeout", type=float, default=600, help="seconds per process")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        print(json.dumps(_child(args.width, args.steps, args.microbatches)))
        return 0
    print(
        f"W of the last of 2 stages, 6x{args.width} GPT, m={args.microbatches}; load "
        f"{os.getloadavg()[0]:.1f}",
        flush=True,
    )
    rows: dict[tuple[str, str], list[tuple[float, int]]] = defaultdict(list)
    for repeat in range(args.repeat):
        for mode in ("system", "retain") if repeat % 2 == 0 else ("retain", "system"):
            for pattern, got in _run_mode(mode, args).items():
                rows[(mode, pattern)] += [(float(ms), int(n)) for ms, n in got]
            print(f"  run {repeat + 1} {mode} done (load {os.getloadavg()[0]:.1f})", flush=True)
    medians: dict[tuple[str, str], float] = {}
    for (mode, pattern), got in sorted(rows.items()):
        medians[(mode, pattern)] = statistics.median(ms for ms, _ in got)
        times = _spread([ms for ms, _ in got], lambda v: f"{v:.1f} ms")
        faults = _spread([float(n) for _, n in got], lambda v: f"{v:.0f}")
        print(f"{mode:7} {pattern:9} W {times}  minor faults {faults}  n={len(got)}")
    for pattern in _PATTERNS:
        ratio = medians[("system", pattern)] / medians[("retain", pattern)]
        print(f"{pattern}: W under system / under retain = {ratio:.2f}")
    print(f"load at the end {os.getloadavg()[0]:.1f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
