"""Run as one rank of a ``torchrun`` job: ``torchrun --nproc-per-node P -m verify ...``.

``torchrun`` starts one process per rank and tells each its place in the
environment (``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``MASTER_ADDR``,
``MASTER_PORT``; torch's "env://" rendezvous). Each process here joins the
process group (NCCL on ``cuda:LOCAL_RANK`` when CUDA is present, else gloo on
the CPU), runs its rank of the schedule with :func:`verify.dist.run_rank`
(the same untagged, ordered messages as ``pipesim verify --dist``), and sends
its results to rank 0, which runs the unsplit reference on its own device,
writes the report and tells every rank the exit status, so that all of them
end alike.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

from pipesim.schedule import Schedule
from pipesim.schedule_io import schedule_to_json
from verify.allocator import configure_allocator
from verify.bit_identity import exact_settings
from verify.compare import build_stages, split_microbatches, step_rows
from verify.errors import ExactnessError, VerifyError
from verify.models import load_model
from verify.rank import RankSpec, message_shapes, run_rank
from verify.rank_results import locate_from_results, report_from_results
from verify.report import VerifyReport

__all__ = ["TorchrunPlace", "torchrun_place", "verify_torchrun"]

_ENV = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")


@dataclass(frozen=True, slots=True, kw_only=True)
class TorchrunPlace:
    """This process's place in a torchrun job."""

    rank: int
    world_size: int
    local_rank: int


def torchrun_place(environ: Mapping[str, str] | None = None, /) -> TorchrunPlace | None:
    """The torchrun place of this process, or None when torchrun did not start it.

    >>> torchrun_place({"RANK": "1", "WORLD_SIZE": "2", "LOCAL_RANK": "1",
    ...                 "MASTER_ADDR": "localhost", "MASTER_PORT": "29500"})
    TorchrunPlace(rank=1, world_size=2, local_rank=1)
    >>> torchrun_place({}) is None
    True
    """
    env = os.environ if environ is None else environ
    if not all(name in env for name in _ENV):
        return None
    try:
        return TorchrunPlace(
            rank=int(env["RANK"]),
            world_size=int(env["WORLD_SIZE"]),
            local_rank=int(env["LOCAL_RANK"]),
        )
    except ValueError:
        raise VerifyError(
            "RANK, WORLD_SIZE and LOCAL_RANK must be integers (set by torchrun); got "
            + ", ".join(f"{n}={env[n]!r}" for n in _ENV[:3])
        ) from None


def verify_torchrun(
    schedule: Schedule,
    /,
    *,
    model: str = "mlp",
    model_options: Mapping[str, Any] | None = None,
    seed: int | None = None,
    batch_size: int | None = None,
    timeout_s: float = 120.0,
    warmup: int = 1,
    timed_steps: int = 1,
    device_type: str | None = None,
    place: TorchrunPlace | None = None,
) -> tuple[int, VerifyReport | None]:
    """Run this process's rank; return ``(exit status, report)`` (the report on rank 0 only).

    ``device_type`` ``"cuda"`` or ``"cpu"`` (default: CUDA when present). The
    status is 0 when bit-identical, 1 otherwise, the same on every rank.
    """
    place = place or torchrun_place()
    if place is None:
        raise VerifyError("not started by torchrun: RANK, WORLD_SIZE, ... are not set")
    if place.world_size != schedule.n_ranks:
        raise VerifyError(
            f"torchrun started {place.world_size} processes for a schedule of "
            f"{schedule.n_ranks} ranks; use torchrun --nproc-per-node {schedule.n_ranks}"
        )
    device = _device(device_type, place)
    spec = RankSpec(
        schedule_json=schedule_to_json(schedule),
        model=model,
        model_options=dict(model_options or {}),
        seed=seed,
        batch_size=step_rows(schedule.n_microbatches, batch_size=batch_size),
        timeout_s=timeout_s,
        warmup=max(warmup, 0),
        timed_steps=timed_steps,
        n_threads=torch.get_num_threads(),
    )
    configure_allocator()  # this process is a rank: $PIPESIM_CPU_ALLOCATOR (verify.allocator)
    backend = "nccl" if device.type == "cuda" else "gloo"
    options: dict[str, Any] = {"device_id": device} if device.type == "cuda" else {}
    dist.init_process_group(
        backend, init_method="env://", timeout=timedelta(seconds=timeout_s), **options
    )
    try:
        _same_kernels(device, place.world_size)
        result = run_rank(place.rank, spec, device=device)
        gathered: list[Any] | None = [None] * place.world_size if place.rank == 0 else None
        dist.gather_object(result, gathered, dst=0)
        report = None
        status = [0, False]  # exit status, re-run to locate a gradient mismatch
        if place.rank == 0:
            assert gathered is not None
            report, located_by = _rank0_report(schedule, spec, gathered, device)
            status = [0 if report.bit_identical else 1, report.grads_equal is False]
        dist.broadcast_object_list(status, src=0)
        if status[1]:  # one more step keeping the gradients after each B and W
            traced = replace(spec, trace_grads=True, warmup=0, timed_steps=1)
            result = run_rank(place.rank, traced, device=device)
            dist.gather_object(result, gathered, dst=0)
            if place.rank == 0:
                assert report is not None and gathered is not None
                report = located_by(report, gathered)
    finally:
        dist.destroy_process_group()
    return int(status[0]), report


def _device(device_type: str | None, place: TorchrunPlace) -> torch.device:
    if device_type not in (None, "cpu", "cuda"):
        raise VerifyError(f"under torchrun give --devices cpu or cuda, not {device_type!r}")
    if device_type == "cpu" or (device_type is None and not torch.cuda.is_available()):
        return torch.device("cpu")
    count = torch.cuda.device_count()
    if place.local_rank >= count:
        raise ExactnessError(
            f"rank {place.rank} should run on cuda:{place.local_rank} but this machine has "
            f"{count} CUDA device(s); start at most {count} processes per node"
        )
    device = torch.device("cuda", place.local_rank)
    torch.cuda.set_device(device)
    return device


def _same_kernels(device: torch.device, world_size: int) -> None:
    """Every rank on the same GPU model (different models pick different kernels), and on
    the CPU with the same intra-op thread count as rank 0, which runs the reference: CPU
    reductions (a LayerNorm's, a bias gradient's) split their sums by thread count, so
    the GPT's gradients differ in their last bits between 1 and 2 threads."""
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    threads = None if device.type == "cuda" else torch.get_num_threads()
    seen: list[Any] = [None] * world_size
    dist.all_gather_object(seen, (name, threads))
    if len({n for n, _ in seen}) > 1:
        listed = ", ".join(f"rank {r} = {n}" for r, (n, _) in enumerate(seen))
        raise ExactnessError(f"the ranks run on different devices ({listed}); use one GPU model")
    if len({t for _, t in seen}) > 1:
        listed = ", ".join(f"rank {r} = {t}" for r, (_, t) in enumerate(seen))
        raise ExactnessError(
            f"the CPU ranks run different torch thread counts ({listed}): CPU kernels split "
            "their sums by thread count, so the bits cannot match the reference's; start "
            "every rank with the same OMP_NUM_THREADS (torchrun's default is 1)"
        )


def _rank0_report(
    schedule: Schedule, spec: RankSpec, results: list[Any], device: torch.device
) -> tuple[VerifyReport, Callable[[VerifyReport, list[Any]], VerifyReport]]:
    """The report, and how to add where a gradient mismatch arose from traced results."""
    reference_model = load_model(spec.model, seed=spec.seed, **spec.model_options)
    stages = build_stages(reference_model, schedule)
    x, target = reference_model.make_batch(spec.batch_size)
    xs = split_microbatches(x, schedule.n_microbatches)
    spec = RankSpec(
        schedule_json=spec.schedule_json,
        model=spec.model,
        model_options=spec.model_options,
        seed=spec.seed,
        batch_size=spec.batch_size,
        timeout_s=spec.timeout_s,
        shapes=message_shapes(schedule, stages, xs),
        batch=(x, target),
    )
    devices = [torch.device(r["device"]) for r in results]
    with exact_settings(reference_model.layers, devices=[device]):
        report = report_from_results(schedule, reference_model, stages, spec, results, devices)

    def located_by(report: VerifyReport, traced: list[Any]) -> VerifyReport:
        with exact_settings(reference_model.layers, devices=[device]):
            return locate_from_results(report, schedule, reference_model, stages, spec, traced)

    return report, located_by
