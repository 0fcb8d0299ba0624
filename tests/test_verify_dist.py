"""verify.dist: one process per rank with torch.distributed (gloo), deadlines, failures.

Each test starts real processes (a few seconds each); every run has a deadline.
"""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from pipesim.cli import main  # noqa: E402
from pipesim.schedules import generate  # noqa: E402
from verify.compare import verify  # noqa: E402
from verify.dist import verify_distributed  # noqa: E402
from verify.errors import RunFailedError, VerifyError  # noqa: E402

pytestmark = [pytest.mark.torch, pytest.mark.dist, pytest.mark.timeout(120)]


def test_cli_dist_reproduces_the_chapter(capsys) -> None:  # type: ignore[no-untyped-def]
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
            "90",
        ]
    )
    data = json.loads(capsys.readouterr().out)
    assert status == 0 and data["bit_identical"] is True
    assert data["param_bytes"] == [43_776, 38_800]
    assert data["transfer_bytes"] == [[3_072] * 4]  # 8 rows x 96 x 4 bytes
    # four equal micro-batches: the mean of the means is the chapter's full-batch mean
    assert [round(g, 4) for g in data["grad_norms"]] == [0.1142, 0.5349]
    # the two ranks ran at the same time: the prediction is the one-device-per-rank one
    assert data["predicted_makespan"] == data["predicted_makespan_parallel"]


def test_dualpipe_copies_overlaps_and_split_backward_across_processes() -> None:
    schedule = generate("dualpipe", n_ranks=2, n_microbatches=4)
    report = verify_distributed(schedule, model="mlp", warmup=0, timeout_s=90)
    assert report.bit_identical, report.mismatches
    # The same gradients as the one-process executor (an independent path through torch).
    local = verify(schedule, model="mlp", warmup=0)
    assert report.grad_norms == local.grad_norms
    assert report.accumulation_orders == local.accumulation_orders


@pytest.fixture
def slow_models(tmp_path: Path, monkeypatch) -> str:  # type: ignore[no-untyped-def]
    (tmp_path / "dist_models.py").write_text(
        textwrap.dedent("""
        import multiprocessing
        import time
        from torch import nn

        class InRanks(nn.Module):
            def __init__(self, action):
                super().__init__()
                self.action = action

            def forward(self, x):
                if multiprocessing.parent_process() is not None:  # only inside a rank
                    self.action()
                return x

        def _boom():
            raise RuntimeError("boom inside rank")

        def sleepy():
            return [nn.Linear(4, 4), InRanks(lambda: time.sleep(60)), nn.Linear(4, 2)]

        def failing():
            return [nn.Linear(4, 4), InRanks(_boom), nn.Linear(4, 2)]
    """)
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))
    return "dist_models"


def test_a_hung_rank_hits_the_deadline(slow_models: str) -> None:
    schedule = generate("gpipe", n_ranks=2, n_microbatches=2)
    with pytest.raises(VerifyError, match=r"did not finish within 4 s; its ranks were stopped"):
        verify_distributed(schedule, model=f"{slow_models}:sleepy", timeout_s=4, warmup=0)


def test_a_failing_rank_is_reported(slow_models: str) -> None:
    schedule = generate("gpipe", n_ranks=2, n_microbatches=2)
    with pytest.raises(RunFailedError, match=r"run of 'gpipe' failed: rank 0 failed: boom inside"):
        verify_distributed(schedule, model=f"{slow_models}:failing", timeout_s=60, warmup=0)
