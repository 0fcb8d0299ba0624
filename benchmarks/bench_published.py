"""Predicted vs published iteration times: Korthikanti et al. 2023, Table 5.

"Reducing Activation Recomputation in Large Transformer Models" (MLSys 2023)
gives, for four GPT models on NVIDIA A100 80GB (Selene, DGX A100 nodes), the
whole configuration (Table 3: heads, hidden, layers, tensor / pipeline
parallel sizes, GPUs, global and micro-batch sizes) and the measured time of
one iteration (Table 5) with full recomputation (tensor parallelism without
sequence parallelism) and with "present work" (sequence parallelism and
selective recomputation). The interleaving (stages per rank) is the one
Calculon's validation uses for the same rows (calculon-ai/calculon,
``validation/*.json``: 3 for 175B and 530B, 1 otherwise), since Table 3 does
not print it. Sequence length 2048, vocabulary 51200, fp16, dropout, no fused
attention (the paper's setting).

Narayanan et al. 2021, Table 1, prints achieved teraFLOP/s, not iteration
times, and not the micro-batch size or interleaving of each row, so its rows
are not fully specified and are left out.

The accelerator is pipesim's ``a100-80gb`` preset as shipped: its one
efficiency (0.5 of peak, the middle of Narayanan et al. 2021's 44-52%) is not
tuned per row. Run: ``python benchmarks/bench_published.py``.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass

from pipesim.plan import ModelSpec, get_accelerator, plan


@dataclass(frozen=True, slots=True, kw_only=True)
class Row:
    name: str
    layers: int
    hidden: int
    heads: int
    tensor: int
    pipeline: int
    virtual: int
    gpus: int
    global_batch: int
    microbatch: int
    full_s: float
    """Table 5: full recomputation, seconds per iteration."""
    present_s: float
    """Table 5: sequence parallelism + selective recomputation."""


ROWS = (
    Row(
        name="22B",
        layers=48,
        hidden=6144,
        heads=64,
        tensor=8,
        pipeline=1,
        virtual=1,
        gpus=8,
        global_batch=4,
        microbatch=4,
        full_s=1.42,
        present_s=1.10,
    ),
    Row(
        name="175B",
        layers=96,
        hidden=12288,
        heads=96,
        tensor=8,
        pipeline=8,
        virtual=3,
        gpus=64,
        global_batch=64,
        microbatch=1,
        full_s=18.13,
        present_s=13.75,
    ),
    Row(
        name="530B",
        layers=105,
        hidden=20480,
        heads=128,
        tensor=8,
        pipeline=35,
        virtual=3,
        gpus=280,
        global_batch=280,
        microbatch=1,
        full_s=49.05,
        present_s=37.83,
    ),
    Row(
        name="1T",
        layers=128,
        hidden=25600,
        heads=160,
        tensor=8,
        pipeline=64,
        virtual=1,
        gpus=512,
        global_batch=512,
        microbatch=1,
        full_s=94.42,
        present_s=71.49,
    ),
)


def predict(row: Row, *, recompute: str, sequence_parallel: bool) -> float:
    spec = ModelSpec(
        n_layers=row.layers,
        hidden=row.hidden,
        n_heads=row.heads,
        seq_length=2048,
        vocab_size=51200,
        dtype="fp16",
        name=row.name,
    )
    result = plan(
        spec,
        devices=row.gpus,
        accelerator="a100-80gb",
        global_batch=row.global_batch,
        tensor=[row.tensor],
        stages=[row.pipeline],
        virtual=[row.virtual],
        microbatch_sizes=[row.microbatch],
        schedules=["interleaved-1f1b" if row.virtual > 1 else "1f1b"],
        recompute=[recompute],
        sequence_parallel=[sequence_parallel],
        distributed_optimizer=[False],
        memory_headroom=0.0,
        min_mfu=0.0,
        workers=1,
    )
    point = next(p for p in result.points if p.feasible)
    assert point.step_time_s is not None
    return point.step_time_s


def main() -> None:
    acc = get_accelerator("a100-80gb")
    print(f"cores: {os.cpu_count()}, load average: {os.getloadavg()[0]:.1f}")
    print(
        f"accelerator a100-80gb: {acc.peak_flops / 1e12:.0f} TFLOP/s peak x efficiency "
        f"{acc.efficiency} (one number for every row)"
    )
    print(
        f"{'model':>6} {'GPUs':>5} {'mode':>22} {'published s':>12} {'predicted s':>12} "
        f"{'error':>7}"
    )
    errors = []
    start = time.perf_counter()
    for row in ROWS:
        for mode, recompute, sp, published in (
            ("full recompute", "full", False, row.full_s),
            ("seq-par + selective", "selective", True, row.present_s),
        ):
            predicted = predict(row, recompute=recompute, sequence_parallel=sp)
            error = predicted / published - 1
            errors.append(abs(error))
            print(
                f"{row.name:>6} {row.gpus:>5} {mode:>22} {published:>12.2f} "
                f"{predicted:>12.2f} {error:>+7.1%}"
            )
    print(
        f"mean |error| {sum(errors) / len(errors):.1%}, max |error| {max(errors):.1%} "
        f"({time.perf_counter() - start:.1f} s)"
    )


if __name__ == "__main__":
    main()
