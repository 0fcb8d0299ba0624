"""Run a Schedule with torch.distributed: one process per rank (``pipesim verify --dist``).

:func:`verify_distributed` spawns the ranks itself (:func:`verify.launch.launch`):
gloo on the CPU, a file rendezvous in a temporary directory that is removed on
exit and on SIGTERM, each rank's stderr (torch's own warnings) kept out of
pipesim's output. Each rank runs its part of the step (:mod:`verify.rank`:
its program from :func:`pipesim.comms.lower_comms`, untagged ordered messages
through :class:`verify.transport.OrderedTransport`, the F/B/I/W semantics of
:class:`verify.runtime.StageRuntime`); the launcher merges the ranks' results
and checks them against the unsplit model (:mod:`verify.rank_results`).
:mod:`verify.torchrun` runs one rank per process that ``torchrun`` started
instead (gloo on the CPU, NCCL on ``cuda:LOCAL_RANK``).

Every wait has a deadline. A rank that fails, dies or hangs ends the run: the
launcher stops every rank at once and the error names the rank, what it was
running or waiting for, and the peer (:mod:`verify.rank_status`).

It also re-exports ``RankSpec``, ``run_rank``, ``launch``, ... from the modules that
define them, so ``from verify.dist import ...`` works for all of them.

>>> from pipesim.schedules import generate
>>> report = verify_distributed(generate("1f1b", n_ranks=2, n_microbatches=2), model="mlp")
>>> report.bit_identical, report.devices
(True, ('cpu', 'cpu'))
"""

from __future__ import annotations

import dataclasses
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import torch
from torch import nn

from pipesim.graph import validate
from pipesim.schedule import Schedule
from pipesim.sigterm import exit_on_sigterm
from verify.bit_identity import exact_settings
from verify.errors import VerifyError
from verify.launch import as_rank, launch
from verify.models import VerifyModel
from verify.rank import RankSpec, message_shapes, prepare_spec, run_rank
from verify.rank_results import assemble, locate_from_results, report_from_results
from verify.report import VerifyReport

__all__ = [
    "RankSpec",
    "as_rank",
    "assemble",
    "launch",
    "locate_from_results",
    "message_shapes",
    "report_from_results",
    "run_rank",
    "verify_distributed",
    "verify_distributed_all",
]


def verify_distributed(
    schedule: Schedule,
    /,
    *,
    model: str = "mlp",
    model_options: Mapping[str, Any] | None = None,
    seed: int | None = None,
    batch_size: int | None = None,
    timeout_s: float = 120.0,
    wait_timeout_s: float | None = None,
    warmup: int = 1,
    timed_steps: int = 1,
) -> VerifyReport:
    """Run ``schedule`` with one process per rank and compare it with the unsplit model.

    ``model`` is a name for :func:`~verify.models.load_model` (each process
    builds its own), ``model_options`` its keyword options (``n_layers``,
    ``width``). The report is :func:`verify.compare.verify`'s; its
    ``predicted_makespan`` simulates the schedule with one device per rank.
    A run that has not finished after ``timeout_s`` seconds is stopped; a rank
    that waits longer than ``wait_timeout_s`` (default ``timeout_s``) for one
    message gives up; those, and a rank that fails or dies, are a
    :class:`~verify.errors.RunFailedError` naming the ranks and what they were doing.
    Of ``timed_steps`` measured steps the report holds the one of median makespan.
    """
    (report,) = verify_distributed_all(
        [schedule],
        model=model,
        model_options=model_options,
        seed=seed,
        batch_size=batch_size,
        timeout_s=timeout_s,
        wait_timeout_s=wait_timeout_s,
        warmup=warmup,
        timed_steps=timed_steps,
    )
    return report


def verify_distributed_all(
    schedules: Sequence[Schedule],
    /,
    *,
    model: str = "mlp",
    model_options: Mapping[str, Any] | None = None,
    seed: int | None = None,
    batch_size: int | Sequence[int] | None = None,
    timeout_s: float = 120.0,
    wait_timeout_s: float | None = None,
    warmup: int = 1,
    burn_in: int = 0,
    timed_steps: int = 1,
) -> tuple[VerifyReport, ...]:
    """:func:`verify_distributed` for several schedules of one rank count, one after the
    other in the same rank processes (started once); ``timeout_s`` bounds the whole run.
    ``batch_size`` is one for all or one per schedule. The first schedule runs
    ``burn_in`` untimed steps more than ``warmup``: fresh processes keep touching memory
    pages they never touched before for a few steps (:data:`verify.fidelity.BURN_IN`)."""
    if not schedules:
        return ()
    sizes = list(batch_size) if isinstance(batch_size, Sequence) else [batch_size] * len(schedules)
    _check(schedules, sizes, model)
    cpu = [torch.device("cpu")] * schedules[0].n_ranks
    wait_s = timeout_s if wait_timeout_s is None else min(wait_timeout_s, timeout_s)
    common: dict[str, Any] = {
        "model": model,
        "model_options": dict(model_options or {}),
        "seed": seed,
        "warmup": warmup,
        "timed_steps": timed_steps,
        # One message may take wait_s; joining the group and the barriers the run's deadline.
        "timeout_s": wait_s,
        "group_timeout_s": timeout_s,
    }
    prepared = [
        (s, *prepare_spec(s, **common, batch_size=size))
        for s, size in zip(schedules, sizes, strict=True)
    ]
    if burn_in > 0:
        first, model_0, stages_0, spec_0 = prepared[0]
        spec_0 = dataclasses.replace(spec_0, warmup=spec_0.warmup + burn_in)
        prepared[0] = (first, model_0, stages_0, spec_0)
    reports = []
    with (
        exit_on_sigterm(),
        tempfile.TemporaryDirectory(prefix="pipesim-dist-") as workdir,
        exact_settings(prepared[0][1].layers, devices=cpu),
    ):
        launch([p[3] for p in prepared], schedules, workdir=Path(workdir), timeout_s=timeout_s)
        for index, (schedule, reference_model, stages, spec) in enumerate(prepared):
            results = [
                torch.load(Path(workdir) / f"rank{r}-{index}.pt", weights_only=False)
                for r in range(schedule.n_ranks)
            ]
            report = report_from_results(schedule, reference_model, stages, spec, results, cpu)
            if report.grads_equal is False:
                report = _locate(report, schedule, reference_model, stages, spec, timeout_s)
            reports.append(report)
    return tuple(reports)


def _check(schedules: Sequence[Schedule], sizes: Sequence[int | None], model: object) -> None:
    if len(sizes) != len(schedules):
        raise VerifyError(f"{len(sizes)} batch sizes for {len(schedules)} schedules; give one each")
    for schedule in schedules:
        validate(schedule)
    n_ranks = {s.n_ranks for s in schedules}
    if len(n_ranks) != 1:
        raise VerifyError(f"the schedules have different rank counts {sorted(n_ranks)}; give one")
    if not isinstance(model, str):
        raise VerifyError(
            "verify_distributed rebuilds the model in every process: give its name "
            "(mlp, gpt or package.module:factory), not a model object"
        )


def _locate(
    report: VerifyReport,
    schedule: Schedule,
    reference_model: VerifyModel,
    stages: Sequence[nn.Module],
    spec: RankSpec,
    timeout_s: float,
) -> VerifyReport:
    """Re-run one step of ``schedule`` in new rank processes that keep the gradients after
    every B and W, and name the action where they first differ (verify.locate)."""
    traced = dataclasses.replace(spec, trace_grads=True, warmup=0, timed_steps=1)
    with tempfile.TemporaryDirectory(prefix="pipesim-dist-") as workdir:
        launch([traced], [schedule], workdir=Path(workdir), timeout_s=timeout_s)
        results = [
            torch.load(Path(workdir) / f"rank{r}-0.pt", weights_only=False)
            for r in range(schedule.n_ranks)
        ]
    return locate_from_results(report, schedule, reference_model, stages, spec, results)
