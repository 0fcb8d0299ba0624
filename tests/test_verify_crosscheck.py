"""verify.crosscheck: torch.distributed.pipelining's own runtime against pipesim's
multi-process executor on the same split, micro-batches and initial parameters.

One launch of two gloo processes runs every schedule (each with both runtimes).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from helpers import processes_with, sigterm_once_ranks_joined  # noqa: E402

from pipesim.schedules import generate  # noqa: E402
from verify.crosscheck import _compare, crosscheck_all  # noqa: E402

pytestmark = [pytest.mark.torch, pytest.mark.dist, pytest.mark.timeout(400)]

# Every schedule torch ships a class for, plus zb-h1 (torch runs any compute-only CSV).
TORCH_SHIPS = [
    ("gpipe", 1),
    ("1f1b", 1),
    ("interleaved-1f1b", 2),
    ("looped-bfs", 2),
    ("interleaved-zb", 2),
    ("zbv", 2),
    ("dualpipev", 2),
    ("zb-h1", 1),
]


def test_torchs_runtime_gives_the_same_bits_as_pipesims_executor() -> None:
    schedules = [generate(n, n_ranks=2, n_microbatches=4, virtual=v) for n, v in TORCH_SHIPS]
    checks = crosscheck_all(schedules, model="mlp", warmup=0, steps=1, timeout_s=380)
    for schedule, check in zip(schedules, checks, strict=True):
        assert check.schedule == schedule.name
        assert check.identical, (schedule.name, check.mismatches)
        assert check.pipesim_step_s > 0 and check.torch_step_s > 0


def _result(output: float, loss: float, grad: float) -> dict:  # type: ignore[type-arg]
    ours = {
        "outputs": {0: torch.tensor([1.0]), 1: torch.tensor([2.0])},
        "losses": {0: torch.tensor(0.5), 1: torch.tensor(0.25)},
        "grads": {1: [torch.tensor([3.0, 4.0])]},
    }
    theirs = {
        "output": torch.tensor([1.0, output]),
        "losses": {0: torch.tensor(0.5), 1: torch.tensor(loss)},
        "grads": {1: [torch.tensor([3.0, grad])]},
    }
    return {"pipesim": ours, "torch": theirs, "pipesim_walls": [5, 3], "torch_walls": [6, 4]}


def test_the_comparison_names_each_differing_tensor() -> None:
    schedule = generate("1f1b", n_ranks=2, n_microbatches=2)
    same = _compare(schedule, [_result(2.0, 0.25, 4.0)])
    assert same.identical and same.mismatches == ()
    assert (same.pipesim_step_s, same.torch_step_s) == (3e-9, 4e-9)  # the steady-state step
    # Two ranks, warm-up dropped: a step's wall time is the slower rank's, its CPU time the sum.
    slow = {"pipesim_walls": [9, 7, 2], "torch_walls": [9, 1, 8], "pipesim_cpu": [9, 5, 6]}
    fast = {"pipesim_walls": [1, 2, 3], "torch_walls": [1, 2, 3], "pipesim_cpu": [1, 1, 2]}
    first = {"pipesim": {"outputs": {}, "grads": {}}, "torch": {}, "torch_cpu": [4, 4, 4]}
    steady = _compare(
        schedule, [{**first, **slow}, {**first, **fast, "torch_cpu": [0, 1, 2]}], warmup=1
    )
    assert (steady.pipesim_steps_s, steady.torch_steps_s) == ((7e-9, 3e-9), (2e-9, 8e-9))
    assert (steady.pipesim_cpu_s, steady.torch_cpu_s) == ((6e-9, 8e-9), (5e-9, 6e-9))
    assert steady.pipesim_step_s == 5e-9  # the median of 7 and 3
    differs = _compare(schedule, [_result(2.5, 0.25, 4.0 + 2**-20)])
    assert not differs.identical
    assert differs.mismatches == (
        "output (max abs diff 0.5)",
        "gradient 0 of stage 1 (max abs diff 9.54e-07)",
    )


_SLEEPY = """
import multiprocessing
import time
from torch import nn


class Sleeps(nn.Module):
    def forward(self, x):
        if multiprocessing.parent_process() is not None:  # in a rank, not the launcher
            time.sleep(120)
        return x


def sleepy():  # rank 0 hangs in its first forward
    return [nn.Linear(4, 4), Sleeps(), nn.Linear(4, 2)]
"""


@pytest.mark.skipif(not Path("/proc").is_dir(), reason="reads /proc to find left-over processes")
def test_sigterm_leaves_no_rank_and_no_folder_behind(tmp_path: Path) -> None:
    (tmp_path / "cross_models.py").write_text(_SLEEPY)
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    marker = f"PIPESIM_TEST_MARK_{os.getpid()}_{time.monotonic_ns()}"
    env = dict(os.environ, TMPDIR=str(tmp), PYTHONPATH=str(tmp_path), **{marker: "1"})
    script = tmp_path / "run_cross.py"
    script.write_text(
        "from pipesim.schedules import generate\n"
        "from verify.crosscheck import crosscheck\n"
        "if __name__ == '__main__':\n"
        "    crosscheck(generate('gpipe', n_ranks=2, n_microbatches=2),\n"
        "               model='cross_models:sleepy', steps=1, timeout_s=200)\n"
    )
    launcher = subprocess.Popen([sys.executable, str(script)], env=env, stderr=subprocess.PIPE)
    status, stderr = sigterm_once_ranks_joined(
        launcher, "pipesim-crosscheck-*/rank*.log", tmp, marker
    )
    assert status == 128 + signal.SIGTERM
    assert list(tmp.iterdir()) == []  # the rendezvous folder and the rank logs are gone
    time.sleep(0.5)
    assert processes_with(marker) == []
    assert b"Traceback" not in stderr
