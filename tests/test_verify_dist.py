"""verify.dist: one process per rank with torch.distributed (gloo), untagged ordered messages,
deadlines, dead and hung ranks, clean exits.

Each test starts real processes (several seconds each on a loaded machine); every run has a
deadline, and the schedules share process launches (verify_distributed_all).
"""

from __future__ import annotations

import itertools
import json
import math
import multiprocessing
import os
import re
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from helpers import processes_with, schedule_cases, sigterm_once_ranks_joined  # noqa: E402

from pipesim.calibration import MeasuredStep, fit_costs  # noqa: E402
from pipesim.cli import main  # noqa: E402
from pipesim.comms import Comm, lower_comms  # noqa: E402
from pipesim.costs import costs_from_dict  # noqa: E402
from pipesim.schedules import generate  # noqa: E402
from pipesim.trace_io import load_trace  # noqa: E402
from verify.compare import build_stages, split_microbatches, verify  # noqa: E402
from verify.dist import verify_distributed, verify_distributed_all  # noqa: E402
from verify.errors import RunFailedError  # noqa: E402
from verify.launch import shared_cores  # noqa: E402
from verify.models import load_model  # noqa: E402
from verify.rank import message_shapes  # noqa: E402

pytestmark = [pytest.mark.torch, pytest.mark.dist, pytest.mark.timeout(300)]

_MODELS = '''
import multiprocessing
import os
import signal
import time
import torch
from torch import nn


class InRanks(nn.Module):
    """Runs ``action`` when called inside a rank process (never in the launcher)."""

    def __init__(self, action):
        super().__init__()
        self.action = action

    def forward(self, x):
        if multiprocessing.parent_process() is not None:
            self.action()
        return x


def _boom():
    raise RuntimeError("boom inside rank")


def tiny():
    layers = []
    for _ in range(8):
        layers += [nn.Linear(6, 6), nn.Tanh()]
    return layers


def sleepy():  # stage 0 of 2 (rank 0) hangs in its first forward
    return [nn.Linear(4, 4), InRanks(lambda: time.sleep(120)), nn.Linear(4, 2)]


def failing():
    return [nn.Linear(4, 4), InRanks(_boom), nn.Linear(4, 2)]


class Cast(nn.Module):
    def __init__(self, dtype):
        super().__init__()
        self.dtype = dtype

    def forward(self, x):
        return x.to(self.dtype)


def uneven():
    """Four stages of two entries whose boundaries differ in width and dtype: float32 x 10,
    float64 x 3, float64 x 7 (the last stage casts back for the loss)."""
    return [nn.Linear(6, 10), nn.Tanh(), nn.Linear(10, 3), Cast(torch.float64),
            nn.Linear(3, 7).double(), nn.Tanh(), Cast(torch.float32), nn.Linear(7, 5)]


def dying():  # stage 1 of 2 (rank 1) is killed in its first forward
    return [nn.Linear(4, 4), nn.Linear(4, 4), InRanks(lambda: os.kill(os.getpid(), 9)),
            nn.Linear(4, 2)]
'''


@pytest.fixture
def models(tmp_path: Path, monkeypatch) -> str:  # type: ignore[no-untyped-def]
    (tmp_path / "dist_models.py").write_text(_MODELS)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))
    return "dist_models"


def test_cli_dist_reproduces_the_chapter(tmp_path: Path, capsys) -> None:  # type: ignore[no-untyped-def]
    costs_path, trace_path = tmp_path / "costs.json", tmp_path / "measured.json"
    status = main(
        [
            "verify",
            "1f1b",
            "--stages",
            "2",
            "--microbatches",
            "4",
            "--dist",
            "--json",
            "--warmup",
            "0",
            "--timeout",
            "120",
            "--costs-out",
            str(costs_path),
            "--trace-out",
            str(trace_path),
        ]
    )
    captured = capsys.readouterr()
    data = json.loads(captured.out)
    assert status == 0 and data["bit_identical"] is True
    # With no warm-up the measured step is each fresh rank process's first: it must have
    # touched new memory pages for its activations and gradients.
    faults = data["page_faults"]
    assert len(faults) == 2 and all(isinstance(f, int) and f > 0 for f in faults)
    # The CLI prints shared_cores' warning (its rule is tested by hand below) exactly when
    # it has one for 2 ranks x this process's torch threads (the 2-core CI machine with
    # torch's default of 2 threads: warned).
    why = shared_cores(2, torch.get_num_threads())
    if why is None:
        assert "share cores" not in captured.err
    else:
        assert f"pipesim verify --dist: {why}" in captured.err
    assert data["param_bytes"] == [43_776, 38_800]
    assert data["transfer_bytes"] == [[3_072] * 4]  # 8 rows x 96 x 4 bytes
    # four equal micro-batches: the mean of the means is the chapter's full-batch mean
    assert [round(g, 4) for g in data["grad_norms"]] == [0.1142, 0.5349]
    # the two ranks ran at the same time: the prediction is the one-device-per-rank one
    assert data["predicted_makespan"] == data["predicted_makespan_parallel"]
    _check_cost_file(costs_path, trace_path, data, capsys)


def _check_cost_file(costs_path: Path, trace_path: Path, data: dict, capsys) -> None:  # type: ignore[no-untyped-def,type-arg]
    """--costs-out is `pipesim calibrate`'s fit of the measured step (per stage and op,
    overheads, ns, provenance) and feeds simulate and plan alike."""
    file = json.loads(costs_path.read_text())
    costs = costs_from_dict(file)
    step = load_trace(trace_path)  # the measured step, in the ranks it ran on
    fit = fit_costs([MeasuredStep(schedule=step.schedule, trace=step.trace)], time_unit="ns")
    assert [(s.forward, s.backward) for s in costs.stages] == [
        (s.forward, s.backward) for s in fit.costs.stages
    ]
    assert (costs.link, costs.dispatch_overhead) == (fit.costs.link, fit.costs.dispatch_overhead)
    assert costs == costs_from_dict(data["costs"])  # the report's model: one fit
    meta = file["meta"]
    assert meta["time_unit"] == "ns" and meta["source"] == "pipesim verify --dist"
    assert (meta["schedule"], meta["n_ranks"], meta["n_microbatches"]) == ("1f1b", 2, 4)
    assert meta["microbatch_size"] == 8 and meta["samples"] == dict(fit.samples)
    assert set(meta) >= {"assumed", "links_by_direction", "host", "load_average", "torch"}
    # verify -> costs -> plan: at the file's own size, plan's pipeline time is simulate's
    assert (
        main(["simulate", "1f1b", "-p", "2", "-m", "4", "--costs", str(costs_path), "--json"]) == 0
    )
    simulated = json.loads(capsys.readouterr().out)["makespan"]
    argv = ["plan", "--model", str(costs_path), "--devices", "2", "--accelerator", "h100-sxm",
            "--global-batch", "32", "--stages", "2", "--microbatch-sizes", "8", "--virtual", "1",
            "--schedules", "1f1b", "--min-mfu", "0", "--workers", "1", "--json"]  # fmt: skip
    assert main(argv) == 0
    assert json.loads(capsys.readouterr().out)["best"]["pipeline_time_ns"] == simulated


def _registered(n_ranks: int, microbatches: tuple[int, ...]) -> list:  # type: ignore[type-arg]
    sizes = tuple((n_ranks, m) for m in microbatches)
    return [
        generate(name, n_ranks=p, n_microbatches=m, virtual=v)
        for name, p, m, v in schedule_cases(sizes)
    ]


@pytest.mark.parametrize(("p", "microbatches"), [(2, (4,)), (4, (8,))])
def test_every_registered_schedule_is_bit_identical_over_untagged_gloo(
    p: int, microbatches: tuple[int, ...], models: str
) -> None:
    schedules = _registered(p, microbatches)
    names = {s.name for s in schedules}
    assert names >= {"gpipe", "1f1b", "interleaved-1f1b", "zb-h1", "zbv", "dualpipev"}
    reports = verify_distributed_all(
        schedules, model=f"{models}:tiny", warmup=0, timeout_s=280, wait_timeout_s=120
    )
    for schedule, report in zip(schedules, reports, strict=True):
        assert report.bit_identical, (schedule.name, report.mismatches)
        assert report.order_followed and report.grads_equal is not False
        if schedule.name == "dualpipe":
            # The same gradients as the one-process executor (the other driver of the runtime).
            local = verify(schedule, model=f"{models}:tiny", warmup=0)
            assert report.grad_norms == local.grad_norms
            assert report.accumulation_orders == local.accumulation_orders


def test_consecutive_messages_of_different_sizes_and_dtypes_are_bit_identical(
    models: str,
) -> None:
    """Boundaries of different widths and dtypes: consecutive messages between two ranks
    differ in bytes, and every one arrives whole (checked against the unsplit model)."""
    schedules = [
        generate(name, n_ranks=2, n_microbatches=4, virtual=2)
        for name in ("interleaved-1f1b", "zbv", "dualpipev")
    ]
    model = load_model(f"{models}:uneven")
    for schedule in schedules:
        # the premise: some rank sends two messages in a row of different sizes in bytes
        stages = build_stages(model, schedule)
        shapes = message_shapes(schedule, stages, split_microbatches(model.make_batch(8)[0], 4))
        sizes = {m: math.prod(shape) * dtype.itemsize for m, (shape, dtype) in shapes.items()}
        by_comm = {m.send: m for m in shapes if m.crosses_ranks}
        for program in lower_comms(schedule).programs:
            sent = [sizes[by_comm[c]] for c in program if isinstance(c, Comm) and c.op.is_send]
            assert any(a != b for a, b in itertools.pairwise(sent)), schedule.name
        assert {dtype for _, dtype in shapes.values()} == {torch.float32, torch.float64}
    reports = verify_distributed_all(schedules, model=f"{models}:uneven", warmup=1, timeout_s=200)
    for schedule, report in zip(schedules, reports, strict=True):
        assert report.bit_identical, (schedule.name, report.mismatches)
        assert report.grads_equal is True


def _no_children_left() -> None:
    assert multiprocessing.active_children() == []


def test_a_hung_rank_ends_the_run_within_seconds_naming_ranks_actions_and_peer(
    models: str,
) -> None:
    schedule = generate("gpipe", n_ranks=2, n_microbatches=2)
    start = time.monotonic()
    with pytest.raises(RunFailedError) as info:
        verify_distributed(
            schedule, model=f"{models}:sleepy", timeout_s=100, wait_timeout_s=3, warmup=0
        )
    # Start-up takes a few seconds; the hang itself is noticed after the 3 s wait deadline.
    assert time.monotonic() - start < 60
    text = str(info.value)
    assert "rank 1 waited for the message 0F0 -> 1F0 (rank 0 -> 1) needed by 1F0" in text
    assert "gave up after at most 3 s (peer: rank 0)" in text
    assert "rank 0 was running 0F0" in text
    _no_children_left()


def test_the_overall_deadline_stops_every_rank(models: str) -> None:
    schedule = generate("gpipe", n_ranks=2, n_microbatches=2)
    with pytest.raises(RunFailedError, match=r"did not finish within 4 s; its ranks were stopped"):
        verify_distributed(schedule, model=f"{models}:sleepy", timeout_s=4, warmup=0)
    _no_children_left()


def test_a_killed_rank_is_named_with_what_its_peer_waited_for(models: str) -> None:
    schedule = generate("1f1b", n_ranks=2, n_microbatches=2)
    with pytest.raises(RunFailedError) as info:
        verify_distributed(schedule, model=f"{models}:dying", timeout_s=100, warmup=0)
    text = str(info.value)
    assert text.startswith("the distributed run of '1f1b' failed: rank 1 died (killed by SIGKILL)")
    assert "rank 1 was running 1F0" in text
    # Rank 0 (0F0, SEND_F0, 0F1, SEND_F1, RECV_B0, 0B0 ...) was waiting for 1B0's gradient,
    # or, had the machine's load held it back until rank 1 was gone, posting 0F1's send.
    assert re.search(
        r"rank 0 (waited for the message 1B0|was waiting for 1B0|could not send 0F1)", text
    ), text
    _no_children_left()


def test_a_failing_rank_is_reported(models: str) -> None:
    schedule = generate("gpipe", n_ranks=2, n_microbatches=2)
    with pytest.raises(RunFailedError, match=r"run of 'gpipe' failed: rank 0 failed: boom inside"):
        verify_distributed(schedule, model=f"{models}:failing", timeout_s=100, warmup=0)
    _no_children_left()


@pytest.mark.skipif(not Path("/proc").is_dir(), reason="reads /proc to find left-over processes")
def test_sigterm_removes_the_temporary_folder_and_every_rank(models: str, tmp_path: Path) -> None:
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    marker = f"PIPESIM_TEST_MARK_{os.getpid()}_{time.monotonic_ns()}"
    env = dict(os.environ, TMPDIR=str(tmp), **{marker: "1"})
    code = textwrap.dedent(f"""
        from pipesim.schedules import generate
        from verify.dist import verify_distributed
        if __name__ == "__main__":
            verify_distributed(generate("gpipe", n_ranks=2, n_microbatches=2),
                               model="{models}:sleepy", timeout_s=200, warmup=0)
    """)
    script = tmp_path / "run_sleepy.py"
    script.write_text(code)
    launcher = subprocess.Popen([sys.executable, str(script)], env=env, stderr=subprocess.PIPE)
    status, stderr = sigterm_once_ranks_joined(launcher, "pipesim-dist-*/rank*.log", tmp, marker)
    assert status == 128 + signal.SIGTERM
    assert list(tmp.iterdir()) == []  # the rendezvous folder and its logs are gone
    time.sleep(0.5)
    assert processes_with(marker) == []
    assert b"Traceback" not in stderr


def test_shared_cores_warns_only_when_rank_threads_outnumber_the_cpus() -> None:
    # by hand: ranks x threads against the CPUs
    assert shared_cores(2, 1, cpus=2) is None  # 2 threads, 2 CPUs
    assert shared_cores(4, 4, cpus=16) is None  # 16, 16
    why = shared_cores(2, 2, cpus=2)  # 4 threads, 2 CPUs
    assert why is not None and why.startswith("2 rank processes x 2 torch threads on 2 CPUs")
    assert "OMP_NUM_THREADS=1" in why and "bit-identical" in why
    assert shared_cores(3, 1, cpus=2) is not None  # more ranks than CPUs, one thread each


def test_several_timed_steps_report_the_median_one(tmp_path: Path, capsys) -> None:  # type: ignore[no-untyped-def]
    """--timed-steps 3: three measured steps in the same rank processes; the reported
    step (its makespan, its trace, the costs fitted from it) is the one of median makespan,
    every step's makespan is listed, and the tensors still match the unsplit model."""
    trace_path = tmp_path / "measured.json"
    argv = ["verify", "1f1b", "-p", "2", "-m", "4", "--dist", "--json", "--timed-steps", "3"]
    status = main([*argv, "--timeout", "120", "--trace-out", str(trace_path)])
    data = json.loads(capsys.readouterr().out)
    assert status == 0 and data["bit_identical"] is True
    steps = data["step_makespans"]
    assert len(steps) == 3 and all(s > 0 for s in steps)
    median = sorted(steps)[1]
    assert math.isclose(data["measured_makespan"], median, rel_tol=1e-9)
    assert math.isclose(load_trace(trace_path).trace.makespan / 1e9, median, rel_tol=1e-9)
