"""CPU time of a stage's backward split into I and W, against one whole backward.

Three ways to run a transformer stage's backward, side by side in one process, one
thread, on the same forward each time (the forward is not timed):

- ``B``: ``torch.autograd.backward`` once (the bar the split must stay near);
- ``I+W rewalk``: I by ``autograd.grad`` w.r.t. the input keeping the graph, then W by
  ``autograd.grad`` w.r.t. the parameters from the stage output again (what
  verify.runtime did before: W repeats the input path);
- ``I+W split``: :mod:`verify.split_backward` (W starts at the gradients I saved);
- ``I+W torch``: torch.distributed.pipelining's ``stage_backward_input`` /
  ``stage_backward_weight`` (a private module of torch, for reference).

Every variant's gradients are checked bit for bit against B's. The three variants run
in turn within each repeat (the order rotating), CPU time by ``time.process_time``,
load by ``os.getloadavg``; medians over repeats, and each variant's ratio to B.

Run: ``python benchmarks/bench_split_backward.py [--repeat 15] [--layers 3] [--width 128]``
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from collections.abc import Callable
from typing import cast

import torch
from torch import Tensor, nn

from verify.blocks import Block
from verify.split_backward import input_backward, weight_backward

Run = Callable[[nn.Module, Tensor, Tensor], list[Tensor]]


def _whole(stage: nn.Module, x: Tensor, grad: Tensor) -> list[Tensor]:
    out = stage(x)
    start = time.process_time()
    out.backward(grad)
    _whole.elapsed = time.process_time() - start  # type: ignore[attr-defined]
    return [p.grad for p in stage.parameters()]  # type: ignore[misc]


def _timed(split: Callable[[Tensor, Tensor, Tensor, list[Tensor]], list[Tensor]]) -> Run:
    def run(stage: nn.Module, x: Tensor, grad: Tensor) -> list[Tensor]:
        params: list[Tensor] = list(stage.parameters())
        out = stage(x)
        start = time.process_time()
        grads = split(out, grad, x, params)
        run.elapsed = time.process_time() - start  # type: ignore[attr-defined]
        return grads

    return run


def _rewalk(out: Tensor, grad: Tensor, x: Tensor, params: list[Tensor]) -> list[Tensor]:
    torch.autograd.grad(out, x, grad_outputs=grad, retain_graph=True)
    return list(torch.autograd.grad(out, params, grad_outputs=grad))


def _split(out: Tensor, grad: Tensor, x: Tensor, params: list[Tensor]) -> list[Tensor]:
    _, pending = input_backward(out, grad, x, params)
    return weight_backward(pending)  # type: ignore[return-value]


def _torch(out: Tensor, grad: Tensor, x: Tensor, params: list[Tensor]) -> list[Tensor]:
    from torch.distributed.pipelining._backward import (
        stage_backward_input,
        stage_backward_weight,
    )

    weights = cast("list[nn.Parameter]", params)  # the stage's own parameters
    _, groups = stage_backward_input([out], [grad], [x], iter(weights))
    stage_backward_weight(iter(weights), groups)
    return [p.grad for p in params]  # type: ignore[misc]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=15)
    parser.add_argument("--layers", type=int, default=3, help="transformer blocks in the stage")
    parser.add_argument("--width", type=int, default=128)
    parser.add_argument("--batch", type=int, default=4, help="micro-batch rows (16 positions)")
    args = parser.parse_args()
    torch.set_num_threads(1)
    torch.manual_seed(0)
    stage = nn.Sequential(
        *(Block(width=args.width, n_heads=4, seq_len=16) for _ in range(args.layers))
    )
    x0 = torch.randn(args.batch, 16, args.width)
    grad = torch.randn(args.batch, 16, args.width)
    variants: dict[str, Run] = {
        "B": _whole,
        "I+W rewalk": _timed(_rewalk),
        "I+W split": _timed(_split),
        "I+W torch": _timed(_torch),
    }
    times: dict[str, list[float]] = {name: [] for name in variants}
    loads = []
    reference: list[Tensor] | None = None
    names = list(variants)
    for repeat in range(args.repeat + 1):  # the first round warms up, untimed
        loads.append(os.getloadavg()[0])
        for name in names[repeat % len(names) :] + names[: repeat % len(names)]:
            for p in stage.parameters():
                p.grad = None
            x = x0.clone().requires_grad_(True)
            grads = [g.clone() for g in variants[name](stage, x, grad)]
            if reference is None:
                reference = grads
            if not all(torch.equal(a, b) for a, b in zip(grads, reference, strict=True)):
                print(f"{name}: gradients differ from the first variant's", flush=True)
                return 1
            if repeat:
                times[name].append(variants[name].elapsed)  # type: ignore[attr-defined]
    print(
        f"stage of {args.layers} blocks, width {args.width}, micro-batch {args.batch}x16, "
        f"1 thread, {args.repeat} repeats, load {min(loads):.1f}-{max(loads):.1f}: "
        "median CPU ms [lowest-highest], ratio to B"
    )
    whole = statistics.median(times["B"])
    for name, values in times.items():
        ms = [v * 1e3 for v in values]
        median = statistics.median(values)
        print(
            f"  {name:<12} {median * 1e3:8.2f} [{min(ms):.2f}-{max(ms):.2f}]  "
            f"{median / whole:5.2f}x"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
