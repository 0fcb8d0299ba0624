"""Cross-check with torch's own runtime: the same schedule, split and micro-batches run by
``torch.distributed.pipelining`` and by pipesim's multi-process executor, bit for bit.

The schedule goes to torch as its compute-only CSV; torch's ``_PipelineScheduleRuntime``
loads it (``_load_csv``), adds its own sends and receives (``_add_send_recv``) and runs
it with ``PipelineStage`` wrappers around the very stage modules pipesim cuts. Both run in
the same rank processes (gloo on the CPU), on the same batch, from the same
initial parameters, and are compared directly: the last stage's output (torch merges
the micro-batch outputs with ``torch.cat``), each micro-batch's loss and every stage's
gradients (both divide once by the micro-batch count, torch's ``scale_grads``). Each
also runs a few steps so that the steady-state wall time per step of the two can be
set side by side (``benchmarks/bench_verify_torch.py``): a step of one, then a step of
the other, the order flipped every step, so that both see the same load.

``crosscheck(generate("1f1b", n_ranks=2, n_microbatches=4))`` starts two processes
(tests/test_verify_crosscheck.py runs every schedule torch ships); with no schedules
nothing starts:

>>> crosscheck_all([], model="mlp")
()
"""

from __future__ import annotations

import functools
import statistics
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor

from pipesim.schedule import Schedule
from pipesim.schedule_io import schedule_from_json, schedule_to_csv
from pipesim.sigterm import exit_on_sigterm
from verify.bit_identity import exact_settings
from verify.compare import build_stages
from verify.errors import VerifyError
from verify.launch import as_rank, launch
from verify.models import load_model
from verify.rank import RankRunner, RankSpec, prepare_spec
from verify.rank_status import set_current_schedule

__all__ = ["CrossCheck", "crosscheck", "crosscheck_all"]


@dataclass(frozen=True, slots=True, kw_only=True)
class CrossCheck:
    """pipesim's multi-process executor against torch's runtime on one schedule."""

    schedule: str
    identical: bool
    """Outputs, losses and gradients ``torch.equal`` between the two."""
    mismatches: tuple[str, ...]
    """One line per tensor that differs, with its largest difference."""
    pipesim_step_s: float
    """Median wall time of a steady-state step (the steps after the warm-ups), slowest rank."""
    torch_step_s: float
    """The same for torch's runtime."""
    pipesim_steps_s: tuple[float, ...] = ()
    """Wall time of each steady-state step, slowest rank (step and barrier)."""
    torch_steps_s: tuple[float, ...] = ()
    pipesim_cpu_s: tuple[float, ...] = ()
    """CPU time of each steady-state step, all ranks' processes added (their threads too):
    the work the step costs, which load on the machine stretches less than wall time."""
    torch_cpu_s: tuple[float, ...] = ()


def crosscheck(
    schedule: Schedule,
    /,
    *,
    model: str = "mlp",
    model_options: Mapping[str, Any] | None = None,
    seed: int | None = None,
    batch_size: int | None = None,
    warmup: int = 1,
    steps: int = 2,
    timeout_s: float = 120.0,
    torch_first: bool = False,
) -> CrossCheck:
    """Run ``schedule`` with each runtime, ``warmup`` untimed steps then ``steps`` timed
    ones, and compare the last steps' results."""
    (check,) = crosscheck_all(
        [schedule],
        model=model,
        model_options=model_options,
        seed=seed,
        batch_size=batch_size,
        warmup=warmup,
        steps=steps,
        timeout_s=timeout_s,
        torch_first=torch_first,
    )
    return check


def crosscheck_all(
    schedules: Sequence[Schedule],
    /,
    *,
    model: str = "mlp",
    model_options: Mapping[str, Any] | None = None,
    seed: int | None = None,
    batch_size: int | None = None,
    warmup: int = 1,
    steps: int = 2,
    timeout_s: float = 120.0,
    torch_first: bool = False,
) -> tuple[CrossCheck, ...]:
    """:func:`crosscheck` for several schedules of one rank count in the same processes;
    ``timeout_s`` bounds the whole run. Each rank alternates pipesim's steps and torch's,
    pipesim's first (``torch_first``: torch's), the order flipped every step."""
    if len({s.n_ranks for s in schedules}) > 1:
        raise VerifyError("cross-check schedules of one rank count at a time")
    if warmup < 0 or steps < 1:
        raise VerifyError(f"need warmup >= 0 and steps >= 1, got warmup={warmup}, steps={steps}")
    options = dict(model_options or {})
    specs = []
    for schedule in schedules:
        if schedule.n_copies != 1:
            raise VerifyError(
                f"torch's CSV cannot say that {schedule.name!r} runs {schedule.n_copies} model "
                "copies; cross-check a schedule with one"
            )
        _, _, spec = prepare_spec(
            schedule,
            model=model,
            model_options=options,
            seed=seed,
            batch_size=batch_size,
            warmup=warmup + steps - 1,  # the steps before the last (compared) one
            timeout_s=timeout_s,
        )
        specs.append(spec)
    if not specs:
        return ()
    # SIGTERM exits cleanly as in verify.dist: the ranks stopped, the folder removed.
    with exit_on_sigterm(), tempfile.TemporaryDirectory(prefix="pipesim-crosscheck-") as workdir:
        worker = functools.partial(_worker, torch_first=torch_first)
        launch(specs, schedules, workdir=Path(workdir), timeout_s=timeout_s, target=worker)
        return tuple(
            _compare(
                schedule,
                [
                    torch.load(Path(workdir) / f"rank{r}-{i}.pt", weights_only=False)
                    for r in range(schedule.n_ranks)
                ],
                warmup=warmup,
            )
            for i, schedule in enumerate(schedules)
        )


def _compare(
    schedule: Schedule, results: Sequence[dict[str, Any]], *, warmup: int = 1
) -> CrossCheck:
    mismatches: list[str] = []

    def check(what: str, ours: Tensor | None, theirs: Tensor | None) -> None:
        if ours is None or theirs is None:
            if (ours is None) != (theirs is None):
                mismatches.append(f"{what}: present in only one run")
            return
        if ours.shape != theirs.shape:
            mismatches.append(f"{what}: shapes {list(ours.shape)} and {list(theirs.shape)}")
        elif not torch.equal(ours, theirs):
            diff = float((ours.double() - theirs.double()).abs().max())
            mismatches.append(f"{what} (max abs diff {diff:.3g})")

    for result in results:
        ours, theirs = result["pipesim"], result["torch"]
        if ours["outputs"]:
            merged = torch.cat([ours["outputs"][k] for k in sorted(ours["outputs"])])
            check("output", merged, theirs["output"])
            for k, loss in theirs["losses"].items():
                check(f"loss of micro-batch {k}", ours["losses"][k], loss)
        for stage, grads in ours["grads"].items():
            for i, (a, b) in enumerate(zip(grads, theirs["grads"][stage], strict=True)):
                check(f"gradient {i} of stage {stage}", a, b)

    def steady(key: str, combine: Callable[[Sequence[int]], int]) -> tuple[float, ...]:
        """Per step after the warm-ups, the ranks' nanoseconds combined, in seconds."""
        per_rank = [r[key] for r in results if key in r]
        if not per_rank:
            return ()
        n_steps = len(per_rank[0])
        return tuple(combine([t[i] for t in per_rank]) / 1e9 for i in range(warmup, n_steps))

    ours, theirs = steady("pipesim_walls", max), steady("torch_walls", max)
    return CrossCheck(
        schedule=schedule.name,
        identical=not mismatches,
        mismatches=tuple(mismatches),
        pipesim_step_s=float(statistics.median(ours)),
        torch_step_s=float(statistics.median(theirs)),
        pipesim_steps_s=ours,
        torch_steps_s=theirs,
        pipesim_cpu_s=steady("pipesim_cpu", sum),
        torch_cpu_s=steady("torch_cpu", sum),
    )


# -- inside each rank's process ---------------------------------------------------------------
def _worker(
    rank: int,
    world_size: int,
    specs: Sequence[RankSpec],
    workdir: str,
    status: Any,
    *,
    torch_first: bool,
) -> None:
    body = functools.partial(_both, torch_first=torch_first)
    as_rank(rank, world_size, specs, workdir, status, body=body)


def _both(
    rank: int,
    world_size: int,
    specs: Sequence[RankSpec],
    workdir: str,
    status: Any,
    *,
    torch_first: bool,
) -> None:
    for index, spec in enumerate(specs):
        if rank == 0:
            set_current_schedule(status, world_size, index)
        ours = RankRunner(rank, spec, device=torch.device("cpu"))
        theirs = _TorchRunner(rank, spec, Path(workdir, f"schedule-{index}-rank{rank}.csv"))
        walls: dict[str, list[int]] = {"pipesim": [], "torch": []}
        cpu: dict[str, list[int]] = {"pipesim": [], "torch": []}
        results: dict[str, dict[str, Any]] = {}
        with exact_settings(ours.layers, devices=[torch.device("cpu")]):
            # Step by step, each runtime's step next to the other's and the order flipped
            # every step: both see the same load on a shared machine.
            for step in range(spec.warmup + 1):
                first = (step % 2 == 0) == torch_first
                for side in ("torch", "pipesim") if first else ("pipesim", "torch"):
                    runner = theirs if side == "torch" else ours
                    results.pop(side, None)  # its memory free for this step (run_rank's rule)
                    results[side], wall_ns, cpu_ns = runner.timed_step()
                    walls[side].append(wall_ns)
                    cpu[side].append(cpu_ns)
        torch.save(
            {
                "pipesim": results["pipesim"],
                "torch": results["torch"],
                "pipesim_walls": walls["pipesim"],
                "torch_walls": walls["torch"],
                "pipesim_cpu": cpu["pipesim"],
                "torch_cpu": cpu["torch"],
            },
            Path(workdir) / f"rank{rank}-{index}.pt",
        )


class _TorchRunner:
    """torch's runtime on this rank's stages of ``spec``'s schedule, loaded from torch's
    compute-only CSV (written to ``csv_path``), run step by step."""

    def __init__(self, rank: int, spec: RankSpec, csv_path: Path) -> None:
        from torch.distributed.pipelining import PipelineStage
        from torch.distributed.pipelining.schedules import _PipelineScheduleRuntime

        schedule = schedule_from_json(spec.schedule_json)
        csv_path.write_text(schedule_to_csv(schedule))  # what torch reads
        model = load_model(spec.model, seed=spec.seed, **spec.model_options)
        self.stages = build_stages(model, schedule)
        assert spec.batch is not None
        self.x, self.target = spec.batch
        self.mine = schedule.stages_of(rank)
        device = torch.device("cpu")
        wrapped = [PipelineStage(self.stages[s], s, schedule.n_stages, device) for s in self.mine]
        self.runtime = _PipelineScheduleRuntime(  # type: ignore[no-untyped-call]
            wrapped, schedule.n_microbatches, loss_fn=model.loss_fn, scale_grads=True
        )
        self.runtime._load_csv(str(csv_path), format="compute_only")
        self.first, self.last = 0 in self.mine, schedule.n_stages - 1 in self.mine

    def timed_step(self) -> tuple[dict[str, Any], int, int]:
        """One step of torch's runtime and the barrier after it: its outputs, losses and
        gradients, wall and CPU nanoseconds."""
        for s in self.mine:
            for p in self.stages[s].parameters():
                p.grad = None
        losses: list[Tensor] = []
        start, start_cpu = time.perf_counter_ns(), time.process_time_ns()
        kwargs: dict[str, Any] = {"target": self.target, "losses": losses} if self.last else {}
        output = self.runtime.step(*((self.x,) if self.first else ()), **kwargs)
        dist.barrier()
        wall_ns, cpu_ns = time.perf_counter_ns() - start, time.process_time_ns() - start_cpu
        result = {
            "output": output.detach() if isinstance(output, Tensor) and self.last else None,
            "losses": {k: loss.detach() for k, loss in enumerate(losses)},
            "grads": {
                s: [
                    None if p.grad is None else p.grad.detach().clone()
                    for p in self.stages[s].parameters()
                ]
                for s in self.mine
            },
        }
        return result, wall_ns, cpu_ns
