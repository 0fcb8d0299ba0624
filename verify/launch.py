"""Start one process per rank on the CPU, watch them with a deadline, stop them all at once.

:func:`launch` spawns the ranks (``multiprocessing``'s spawn context, so each
rank imports torch afresh), polls their exit codes, and on the first failure,
death or the overall deadline kills every rank still running and raises a
:class:`~verify.errors.RunFailedError` that says, from the shared status array
(:mod:`verify.rank_status`) and the ranks' error files, which rank did what.
:func:`as_rank` is the rank side: a gloo process group through a file
rendezvous in the launch's folder, torch's stderr kept in a log file there, and
any failure written where the launcher reads it. :mod:`verify.dist` and
:mod:`verify.crosscheck` run their rank bodies through both.
"""

from __future__ import annotations

import multiprocessing
import os
import time
from collections.abc import Callable, Sequence
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from pipesim.schedule import Schedule
from verify.allocator import allocator_mode, configure_allocator
from verify.errors import RunFailedError, VerifyError
from verify.rank import RankSpec, run_specs
from verify.rank_status import (
    current_schedule,
    describe_failure,
    describe_states,
    status_length,
)

__all__ = ["PIN_ENV", "as_rank", "launch", "pin_ranks", "rank_cpus", "shared_cores"]

_POLL_S = 0.02
"""How often the launcher looks at the ranks' exit codes."""
_GRACE_S = 1.0
"""After one rank fails, how long the others get to notice (their waits fail fast) and
write what they saw, before they are killed."""


def shared_cores(n_ranks: int, n_threads: int, /, *, cpus: int | None = None) -> str | None:
    """Why timings of ``n_ranks`` rank processes with ``n_threads`` torch threads each
    will run slow on ``cpus`` CPUs (default: those this process may use), or None.

    The ranks take the launching process's thread count, so that they run the same
    kernels and give the same bits; on a small machine that oversubscribes the cores.
    Measured on the 2-core machine (6x512 GPT, 1F1B, p=2, m=8, ``--dist``, 3 runs each):
    a step took 1.45-1.60 s with 2 threads per rank, 0.95-1.03 s with 1.

    >>> shared_cores(2, 1, cpus=2) is None
    True
    >>> shared_cores(2, 2, cpus=2)[:62]
    '2 rank processes x 2 torch threads on 2 CPUs share cores: meas'
    """
    if cpus is None:
        cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    if not cpus or n_ranks * n_threads <= cpus:
        return None
    return (
        f"{n_ranks} rank processes x {n_threads} torch threads on {cpus} CPUs share cores: "
        "measured times (and --costs-out) run slow; for timings set OMP_NUM_THREADS=1 (as "
        "pipesim calibrate's --threads 1 does); outputs stay bit-identical either way"
    )


#: ``0`` leaves the rank processes pipesim starts wherever the OS schedules them.
PIN_ENV = "PIPESIM_PIN_RANKS"


def rank_cpus(rank: int, n_ranks: int, n_threads: int, /, cpus: Sequence[int]) -> set[int] | None:
    """The CPUs rank ``rank`` of ``n_ranks`` keeps to, ``n_threads`` of ``cpus`` (those the
    launcher may use) of its own; None when the ranks do not fit (they share cores anyway,
    see :func:`shared_cores`).

    Why: left to the OS, two busy rank processes sometimes share one core for a while,
    and the step they measure is then slower than their ops calibrated; pinning roughly
    halves the model's error (``docs/results/rank-pinning.md``). torchrun-style launchers
    do the same (one core set per local rank).

    >>> rank_cpus(1, 2, 1, cpus=[0, 1]), rank_cpus(1, 2, 2, cpus=[0, 1, 2, 3, 4])
    ({1}, {2, 3})
    >>> rank_cpus(0, 2, 2, cpus=[0, 1]) is None
    True
    """
    if n_ranks * n_threads > len(cpus):
        return None
    ordered = sorted(cpus)
    return set(ordered[rank * n_threads : (rank + 1) * n_threads])


def pin_ranks() -> bool:
    """Whether rank processes keep to CPUs of their own: ``$PIPESIM_PIN_RANKS`` is ``1``
    (the default, also when unset or empty) or ``0``; anything else is refused.

    >>> import os
    >>> os.environ.pop(PIN_ENV, None) and None
    >>> pin_ranks()
    True
    """
    value = os.environ.get(PIN_ENV, "").strip() or "1"
    if value not in ("0", "1"):
        raise VerifyError(
            f"{PIN_ENV}={os.environ[PIN_ENV]!r} is neither 0 nor 1; use 1 (or leave it unset) "
            "to keep each rank process to CPUs of its own, 0 to let the OS place them"
        )
    return value == "1"


def _pin(rank: int, n_ranks: int, n_threads: int) -> None:
    """Keep this rank process (and the threads it starts from now on: gloo's) to its own
    CPUs (:func:`rank_cpus`), unless :func:`pin_ranks` says not to or the platform
    cannot (no ``sched_setaffinity``: macOS, Windows)."""
    if not pin_ranks() or not hasattr(os, "sched_setaffinity"):
        return
    mine = rank_cpus(rank, n_ranks, n_threads, cpus=sorted(os.sched_getaffinity(0)))
    if mine is not None:
        os.sched_setaffinity(0, mine)


def launch(
    specs: Sequence[RankSpec],
    schedules: Sequence[Schedule],
    *,
    workdir: Path,
    timeout_s: float,
    target: Callable[..., None] | None = None,
) -> None:
    """Start one process per rank running ``target(rank, world_size, specs, workdir,
    status)`` (default: the verify step, :func:`verify.rank.run_specs`), wait for all with a
    deadline, and stop every rank on the first failure; RunFailedError says which rank did
    what."""
    target = _verify_worker if target is None else target
    allocator_mode()  # a bad $PIPESIM_CPU_ALLOCATOR is refused here, not once per rank
    pin_ranks()  # and a bad $PIPESIM_PIN_RANKS
    n_ranks = schedules[0].n_ranks
    context = multiprocessing.get_context("spawn")
    status = context.Array("q", status_length(n_ranks), lock=False)
    processes = [
        context.Process(
            target=target, args=(rank, n_ranks, specs, str(workdir), status), daemon=True
        )
        for rank in range(n_ranks)
    ]
    try:
        for process in processes:
            process.start()
        _watch(processes, schedules, workdir=workdir, status=status, timeout_s=timeout_s)
    finally:
        for process in processes:
            if process.is_alive():
                process.kill()
        for process in processes:
            if process.pid is not None:
                process.join(timeout=5)


def _watch(
    processes: Sequence[Any],
    schedules: Sequence[Schedule],
    *,
    workdir: Path,
    status: Any,
    timeout_s: float,
) -> None:
    """Return when every rank has exited 0; raise on the first that did not, or at the
    deadline."""
    n_ranks = len(processes)
    deadline = time.monotonic() + timeout_s
    while True:
        codes = [p.exitcode for p in processes]
        if all(code == 0 for code in codes):
            return
        if any(code not in (None, 0) for code in codes):
            grace = time.monotonic() + _GRACE_S
            while time.monotonic() < grace and any(p.exitcode is None for p in processes):
                time.sleep(_POLL_S)
            schedule = schedules[current_schedule(status, n_ranks)]
            raise RunFailedError(
                f"the distributed run of {schedule.name!r} failed: "
                + describe_failure(schedule, processes, workdir, status)
            )
        if time.monotonic() > deadline:
            schedule = schedules[current_schedule(status, n_ranks)]
            raise RunFailedError(
                f"the distributed run of {schedule.name!r} did not finish within "
                f"{timeout_s:g} s; its ranks were stopped (raise the timeout for bigger "
                "models): " + describe_states(schedule, status, range(n_ranks))
            )
        time.sleep(_POLL_S)


def as_rank(
    rank: int,
    world_size: int,
    specs: Sequence[RankSpec],
    workdir: str,
    status: Any,
    *,
    body: Callable[[int, int, Sequence[RankSpec], str, Any], None],
) -> None:
    """Run ``body`` as one rank of a gloo group on the CPU (a process :func:`launch`
    started): stderr to a log file, a failure written where the launcher reads it."""
    # torch's own warnings and C++ logs go to a file, not into pipesim's error output.
    log = os.open(os.path.join(workdir, f"rank{rank}.log"), os.O_WRONLY | os.O_CREAT, 0o600)
    os.dup2(log, 2)
    try:
        torch.set_num_threads(specs[0].n_threads)  # the parent's count: same kernels, same bits
        configure_allocator()  # $PIPESIM_CPU_ALLOCATOR: see verify.allocator
        _pin(rank, world_size, specs[0].n_threads)  # before gloo starts its threads
        dist.init_process_group(
            "gloo",
            init_method=f"file://{workdir}/rendezvous",
            rank=rank,
            world_size=world_size,
            timeout=timedelta(seconds=_group_timeout_s(specs)),
        )
        try:
            body(rank, world_size, specs, workdir, status)
            # gloo may let a rank out of init_process_group while a peer still completes its
            # handshake with it; a rank that then tore the group down at once would close
            # that peer's connection ("connectFullMesh failed ... Connection closed by
            # peer"). Every rank leaves together. Only on success: after a failure the
            # launcher stops the others.
            dist.barrier()
        finally:
            dist.destroy_process_group()
    except BaseException as exc:  # every failure is reported to the launcher
        text = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        if not text.startswith(f"rank {rank} "):
            text = f"rank {rank} failed: {text}"
        Path(workdir, f"rank{rank}.error").write_text(text + "\n")
        raise SystemExit(1) from None


def _group_timeout_s(specs: Sequence[RankSpec]) -> float:
    """The process group's deadline: the specs' longest (RankSpec.group_timeout_s)."""
    return max(s.timeout_s if s.group_timeout_s is None else s.group_timeout_s for s in specs)


def _verify_worker(
    rank: int, world_size: int, specs: Sequence[RankSpec], workdir: str, status: Any
) -> None:
    as_rank(rank, world_size, specs, workdir, status, body=run_specs)
