"""Profile one step of a torch.distributed.pipelining schedule on two gloo CPU ranks.

``python tests/profile_pipelining.py SCHEDULE OUT_DIR PORT`` writes ``rank{N}.json``
(torch.profiler's Chrome trace of the measured step, after one warm-up step) and
``rank{N}.timings.json``: per stage action torch ran, the time its
``PipelineStage.forward_one_chunk`` / ``backward_one_chunk`` /
``backward_weight_one_chunk`` took (``time.perf_counter_ns``), the runs' own timings
that tests/test_kineto.py holds pipesim.kineto's recovered costs to.
"""

from __future__ import annotations

import functools
import json
import os
import sys
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn
from torch.distributed.pipelining import (
    PipelineStage,
    Schedule1F1B,
    ScheduleGPipe,
    ScheduleInterleaved1F1B,
)
from torch.profiler import ProfilerActivity, profile

WIDTH = 256
ROWS = 32
MICROBATCHES = 4


def _timed(stage: PipelineStage, log: list[dict[str, object]]) -> None:
    """Wrap the stage's chunk methods to log each call's micro-batch and duration."""
    for method, op in (
        ("forward_one_chunk", "F"),
        ("backward_one_chunk", "B"),
        ("backward_weight_one_chunk", "W"),
    ):
        inner = getattr(stage, method)

        @functools.wraps(inner)
        def wrapper(mb: int, *args: object, _inner=inner, _op=op, **kwargs: object) -> object:
            start = time.perf_counter_ns()
            out = _inner(mb, *args, **kwargs)
            log.append(
                {
                    "stage": stage.stage_index,
                    "op": _op,
                    "microbatch": mb,
                    "ns": time.perf_counter_ns() - start,
                    "full": kwargs.get("full_backward", True),
                }
            )
            return out

        setattr(stage, method, wrapper)


def _work(rank: int, world: int, out: str, name: str, port: int) -> None:
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    torch.manual_seed(0)
    per_rank = 2 if name == "interleaved" else 1
    n_stages = world * per_rank
    stages, log = [], []
    for k in range(per_rank):
        index = rank + k * world  # torch's looped placement
        module = nn.Sequential(nn.Linear(WIDTH, 4 * WIDTH), nn.ReLU(), nn.Linear(4 * WIDTH, WIDTH))
        stage = PipelineStage(module, index, n_stages, torch.device("cpu"))
        _timed(stage, log)
        stages.append(stage)

    def loss(out: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        return ((out - target) ** 2).mean()

    if name == "interleaved":
        schedule = ScheduleInterleaved1F1B(stages, n_microbatches=MICROBATCHES, loss_fn=loss)
    else:
        cls = {"1f1b": Schedule1F1B, "gpipe": ScheduleGPipe}[name]
        schedule = cls(stages[0], n_microbatches=MICROBATCHES, loss_fn=loss)
    x, target = torch.randn(ROWS, WIDTH), torch.randn(ROWS, WIDTH)

    def step() -> None:
        kwargs = {"target": target} if rank == world - 1 else {}
        args = (x,) if rank == 0 else ()
        schedule.step(*args, **kwargs)

    step()  # warm-up
    dist.barrier()
    log.clear()
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        step()
    prof.export_chrome_trace(os.path.join(out, f"rank{rank}.json"))
    with open(os.path.join(out, f"rank{rank}.timings.json"), "w") as f:
        json.dump(log, f)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    mp.spawn(_work, args=(2, sys.argv[2], sys.argv[1], int(sys.argv[3])), nprocs=2)
