"""The sweep on a Dask cluster (pipesim.plan.backends): a real LocalCluster of two worker
processes, against the same sweep evaluated in this process (the oracle: no worker, no
scheduler), through a worker killed mid-sweep, a sweep stopped by its deadline or Ctrl-C,
an external scheduler's address and a bad one."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import distributed
import pytest
from helpers import SMALL_MODEL as SMALL
from helpers import interruptible, one_f_one_b_sweep, processes_with

from pipesim.cli import main
from pipesim.errors import PlanError
from pipesim.plan import plan
from pipesim.plan.sweep import Evaluation, evaluate_points

pytestmark = [pytest.mark.slow, pytest.mark.dist, pytest.mark.timeout(120)]


@pytest.fixture(scope="module")
def cluster() -> Iterator[distributed.LocalCluster]:
    """A scheduler and two single-threaded worker processes, as `dask scheduler` and
    `dask worker ADDRESS --nthreads 1` would start them, shared by this module's tests."""
    with distributed.LocalCluster(
        n_workers=2, threads_per_worker=1, dashboard_address=None, silence_logs=50
    ) as started:
        yield started


@pytest.fixture
def client(cluster: distributed.LocalCluster) -> Iterator[distributed.Client]:
    """A client of the test's own, to look at and disturb the cluster the sweep uses."""
    with distributed.Client(cluster.scheduler_address, set_as_default=False) as ours:
        ours.wait_for_workers(2, timeout=60)  # a worker killed by an earlier test is back
        yield ours


def _executing(client: distributed.Client) -> dict[str, int]:
    """Per worker, the tasks its threads are running now."""
    return client.run(lambda dask_worker: dask_worker.state.executing_count)  # type: ignore[no-any-return]


def _sweep_tasks(client: distributed.Client) -> list[str]:
    """The scheduler's tasks of pipesim sweeps (their keys start with pipesim-)."""
    return client.run_on_scheduler(  # type: ignore[no-any-return]
        lambda dask_scheduler: [str(k) for k in dask_scheduler.tasks if "pipesim-" in str(k)]
    )


def _nothing_left(client: distributed.Client, within_s: float = 10.0) -> None:
    """No sweep task on the scheduler, none processing or executing on a worker (a
    running chunk stops before its next point: a few tenths of a second here)."""
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        processing = [k for ks in client.processing().values() for k in ks]
        if not processing and not _sweep_tasks(client) and not any(_executing(client).values()):
            return
        time.sleep(0.1)
    assert [k for ks in client.processing().values() for k in ks] == []
    assert _sweep_tasks(client) == []
    assert not any(_executing(client).values())


def test_a_local_cluster_gives_the_same_plan_as_this_process() -> None:
    args = dict(
        devices=8,
        accelerator="h100-sxm",
        global_batch=32,
        microbatch_sizes=[1, 2],
        virtual=[1, 2],
        schedules=["1f1b", "interleaved-1f1b", "zb-h1"],
    )
    here = plan(SMALL, workers=1, **args)  # type: ignore[arg-type]
    on_cluster = plan(SMALL, workers=2, cluster="local", **args)  # type: ignore[arg-type]
    assert len(here.points) > 20 and here.best is not None
    assert on_cluster.points == here.points  # same configurations, numbers and order
    assert on_cluster.to_dict() == here.to_dict()
    assert on_cluster.stopped is None


def test_a_scheduler_address_gives_the_same_evaluations(
    cluster: distributed.LocalCluster, client: distributed.Client
) -> None:
    context, points = one_f_one_b_sweep(120)
    here = evaluate_points(context, points, workers=1)
    seen: list[tuple[int, int]] = []
    there = evaluate_points(
        context,
        points,
        cluster=cluster.scheduler_address,
        progress=lambda done, total: seen.append((done, total)),
    )
    assert there == here
    assert all(e.reason is None and not e.stopped for e in there)
    # progress as the process pool reports it: 0 at once, then up to every point
    assert seen[0] == (0, len(points)) and seen[-1] == (len(points), len(points))
    assert [d for d, _ in seen] == sorted(d for d, _ in seen)
    _nothing_left(client)


def test_a_worker_killed_mid_sweep_loses_no_configuration(
    cluster: distributed.LocalCluster, client: distributed.Client
) -> None:
    context, points = one_f_one_b_sweep(90, engine="simpy")
    here = evaluate_points(context, points, workers=1)
    returned = threading.Event()
    killed: list[int] = []

    def kill_a_busy_worker() -> None:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and not returned.is_set():
            busy = [w for w, tasks in client.processing().items() if tasks]
            if busy:
                pid = client.run(os.getpid, workers=busy[:1])[busy[0]]
                os.kill(pid, signal.SIGKILL)  # the OOM killer, kill -9
                killed.append(pid)
                return
            time.sleep(0.02)

    killer = threading.Thread(target=kill_a_busy_worker)
    killer.start()
    try:
        there = evaluate_points(context, points, cluster=cluster.scheduler_address)
    finally:
        returned.set()
        killer.join(10)
    assert killed, "the sweep ended before a worker could be killed"
    assert killed[0] not in client.run(os.getpid).values()  # gone; its nanny started another
    assert there == here  # its configurations were run again elsewhere
    _nothing_left(client)


def test_configurations_that_keep_killing_workers_are_named(
    cluster: distributed.LocalCluster, client: distributed.Client
) -> None:
    # the scheduler gives up on a task at the first worker death (default: 3 deaths)
    allowed = client.run_on_scheduler(lambda dask_scheduler: dask_scheduler.allowed_failures)
    client.run_on_scheduler(lambda dask_scheduler: setattr(dask_scheduler, "allowed_failures", 0))
    context, points = one_f_one_b_sweep(90, engine="simpy")
    here = evaluate_points(context, points, workers=1)
    lost_on: list[list[str]] = []

    def kill_a_busy_worker() -> None:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            busy = {w: tasks for w, tasks in client.processing().items() if tasks}
            if busy:
                worker, tasks = next(iter(busy.items()))
                lost_on.append([str(t) for t in tasks])
                os.kill(client.run(os.getpid, workers=[worker])[worker], signal.SIGKILL)
                return
            time.sleep(0.02)

    killer = threading.Thread(target=kill_a_busy_worker)
    killer.start()
    try:
        there = evaluate_points(context, points, cluster=cluster.scheduler_address, partial=True)
    finally:
        killer.join(10)
        client.run_on_scheduler(
            lambda dask_scheduler: setattr(dask_scheduler, "allowed_failures", allowed)
        )
    assert lost_on and lost_on[0]
    lost = [(p, e) for p, e, h in zip(points, there, here, strict=True) if e != h]
    assert lost and all(e.stopped for _, e in lost)
    for point, evaluation in lost:  # each named, by the plan's own label
        assert evaluation.reason is not None
        assert f"1f1b t=1 p=2 v=1 d=1 b=1 m={point.n_microbatches}" in evaluation.reason
        assert "workers died each time it ran" in evaluation.reason
    assert all(e.reason is None for e in there if not e.stopped)
    _nothing_left(client)


def test_a_sweep_past_its_deadline_leaves_nothing_running(
    cluster: distributed.LocalCluster, client: distributed.Client
) -> None:
    context, points = one_f_one_b_sweep(2400, engine="simpy")  # ~30 s of CPU: far past 4 s
    start = time.monotonic()
    there = evaluate_points(
        context, points, cluster=cluster.scheduler_address, timeout_s=4, partial=True
    )
    # 4 s: enough for the cluster's workers to finish some chunks on a loaded 2-core
    # machine running another test beside this one (at 2 s they sometimes finished none)
    assert time.monotonic() - start < 4 + 8  # stopping takes seconds, not the sweep
    stopped = [e for e in there if e.stopped]
    assert stopped and len(stopped) < len(points)
    assert stopped[0] == Evaluation(
        stopped=True, reason="not evaluated: the sweep stopped at its 4 s deadline"
    )
    _nothing_left(client)
    with pytest.raises(PlanError, match="did not finish within 1 s"):
        evaluate_points(context, points, cluster=cluster.scheduler_address, timeout_s=1)
    _nothing_left(client)


def test_ctrl_c_cancels_the_sweep_on_the_cluster(
    cluster: distributed.LocalCluster, client: distributed.Client
) -> None:
    context, points = one_f_one_b_sweep(400, engine="simpy")
    here = evaluate_points(context, points[:40], workers=1)

    def interrupt_after_a_few(done: int, total: int) -> None:
        if done >= 10:
            raise KeyboardInterrupt  # as Ctrl-C interrupts the wait for results

    there = evaluate_points(
        context,
        points,
        cluster=cluster.scheduler_address,
        progress=interrupt_after_a_few,
        partial=True,
    )
    done = [(p, e) for p, e in zip(points, there, strict=True) if not e.stopped]
    assert 10 <= len(done) < len(points)
    expected = dict(zip(points[:40], here, strict=True))
    assert all(expected[p] == e for p, e in done if p in expected)
    assert all(e.reason == "not evaluated: the sweep was interrupted" for e in there if e.stopped)
    _nothing_left(client)
    with pytest.raises(KeyboardInterrupt):
        evaluate_points(
            context, points, cluster=cluster.scheduler_address, progress=interrupt_after_a_few
        )
    _nothing_left(client)


TINY = [
    "plan",
    "--layers",
    "4",
    "--hidden",
    "256",
    "--heads",
    "4",
    "--seq-length",
    "128",
    "--vocab",
    "1000",
    "--devices",
    "4",
    "--accelerator",
    "h100-sxm",
    "--global-batch",
    "8",
    "--no-progress",
    "--json",
]


def test_the_cli_sends_the_sweep_to_a_scheduler_address(
    cluster: distributed.LocalCluster, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main([*TINY, "--workers", "1"]) == 0
    here = json.loads(capsys.readouterr().out)
    assert main([*TINY, "--cluster", cluster.scheduler_address]) == 0
    there = json.loads(capsys.readouterr().out)
    assert there == here and here["complete"] and len(here["points"]) > 5
    # --workers sizes a LocalCluster only
    assert main([*TINY, "--cluster", cluster.scheduler_address, "--workers", "2"]) == 1
    err = capsys.readouterr().err
    assert "drop --workers" in err and f"dask worker {cluster.scheduler_address}" in err


_MAIN = "import sys; from pipesim.cli import main; sys.exit(main(sys.argv[1:]))"
BIG = [
    "plan",
    "--model",
    "llama2-70b",
    "--devices",
    "512",
    "--accelerator",
    "h100-sxm",
    "--global-batch",
    "4096",
    "--cluster",
    "local",
    "--workers",
    "2",
]


@pytest.mark.skipif(not Path("/proc/self/environ").exists(), reason="needs /proc (Linux)")
def test_ctrl_c_on_a_terminal_stops_the_local_cluster_and_prints_the_partial_plan() -> None:
    marker = uuid.uuid4().hex
    proc = subprocess.Popen(
        [sys.executable, "-c", _MAIN, *BIG],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=dict(os.environ, PIPESIM_TEST_MARKER=marker),
        start_new_session=True,  # a process group of its own, as a terminal's job
        preexec_fn=interruptible,
    )
    try:
        deadline = time.monotonic() + 60
        while len(processes_with(marker)) < 3 and time.monotonic() < deadline:  # + 2 workers
            if proc.poll() is not None:  # the plan ended before its cluster was up: say why
                break
            time.sleep(0.1)
        if proc.poll() is not None:
            out, err = proc.communicate()
            pytest.fail(f"the plan exited {proc.returncode} before Ctrl-C:\n{err[-3000:]}")
        assert len(processes_with(marker)) >= 3, f"processes seen: {processes_with(marker)}"
        time.sleep(1.0)
        sent = time.monotonic()
        os.killpg(proc.pid, signal.SIGINT)  # what Ctrl-C sends: the whole foreground group
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert time.monotonic() - sent < 10.0  # a few seconds; slack for a loaded CI machine
    assert proc.returncode == 130, err
    assert "partial plan (the sweep was interrupted" in out
    assert "Traceback" not in err  # the workers ignore SIGINT: this process stops them
    deadline = time.monotonic() + 5
    while processes_with(marker) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert processes_with(marker) == []


def _unused_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
    return port


def test_a_bad_address_is_a_clear_error_within_the_timeout(
    capsys: pytest.CaptureFixture[str],
) -> None:
    address = f"tcp://127.0.0.1:{_unused_port()}"  # nothing listens there
    start = time.monotonic()
    assert main([*TINY, "--cluster", address, "--timeout", "3"]) == 1
    assert time.monotonic() - start < 3 + 5
    err = capsys.readouterr().err
    assert f"cannot reach a Dask scheduler at --cluster '{address}' within 3 s" in err
    assert "dask scheduler" in err and "Traceback" not in err


@pytest.mark.parametrize("address", ["nowhere", "tcp://127.0.0.1", "foo://x:1"])
def test_a_malformed_address_is_refused_at_once_without_a_traceback(
    address: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """Dask cannot parse these; they are refused before a Client is made, which would
    otherwise wait out its close at exit and print a traceback."""
    start = time.monotonic()
    assert main([*TINY, "--cluster", address, "--timeout", "30"]) == 1
    assert time.monotonic() - start < 10
    err = capsys.readouterr().err
    assert f"--cluster '{address}' is not a Dask scheduler address" in err
    assert "Traceback" not in err


def test_without_distributed_the_error_says_how_to_install_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setitem(sys.modules, "distributed", None)  # `import distributed` fails
    context, points = one_f_one_b_sweep(4)
    with pytest.raises(PlanError, match=r"pip install 'pipesim\[dask\]'"):
        evaluate_points(context, points, cluster="local")
    # without --cluster nothing needs it
    assert evaluate_points(context, points, workers=1) == evaluate_points(
        context, points, workers=2
    )


def test_pipesim_imports_no_dask() -> None:
    # In a fresh interpreter: import every pipesim module, then look for dask.
    code = (
        "import pkgutil, importlib, sys, pipesim\n"
        "for i in pkgutil.walk_packages(pipesim.__path__, prefix='pipesim.'):\n"
        "    importlib.import_module(i.name)\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('dask', 'distributed')))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True
    )
    assert done.stdout.strip() == "[]"
