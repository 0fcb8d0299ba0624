"""verify.locate: a gradient mismatch names the exact action where it arose.

The injected fault: a layer ``x * w`` whose backward adds 0.25 to ``w``'s gradient, only
inside a pipeline stage (its input is then a fresh leaf; in the unsplit reference it is
an intermediate) and only for micro-batches of 8 rows. A batch of 34 rows in 4
micro-batches has 9, 9, 8, 8 rows (``torch.tensor_split``), so the hand-worked oracle is:
stage 1's gradient of ``w`` first differs after it adds micro-batch 2 (1B2, or 1W2 when
the backward is split), by 0.25, and its final gradient by (0.25 + 0.25) / 4 = 0.125.
"""

from __future__ import annotations

from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from pipesim.schedules import generate  # noqa: E402
from verify.compare import verify  # noqa: E402
from verify.dist import verify_distributed  # noqa: E402

pytestmark = pytest.mark.torch

_MODELS = """
import torch
from torch import nn


class _ScaleAddingToWeightGrad(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, w, delta):
        ctx.save_for_backward(x, w)
        ctx.delta = delta
        return x * w

    @staticmethod
    def backward(ctx, grad):
        x, w = ctx.saved_tensors
        return grad * w, (grad * x).sum(0) + ctx.delta, None


class FaultyScale(nn.Module):
    def __init__(self, width):
        super().__init__()
        self.w = nn.Parameter(torch.ones(width))

    def forward(self, x):
        in_a_stage = x.is_leaf and x.requires_grad
        delta = 0.25 if in_a_stage and x.shape[0] == 8 else 0.0
        return _ScaleAddingToWeightGrad.apply(x, self.w, delta)


def faulty():  # two stages of two layers: stage 1 starts with the faulty layer
    return [nn.Linear(6, 6), nn.Tanh(), FaultyScale(6), nn.Linear(6, 6)]
"""


@pytest.fixture
def faulty(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    (tmp_path / "locate_models.py").write_text(_MODELS)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))
    return "locate_models:faulty"


def _first_line(mismatches: tuple[str, ...], action: str) -> float:
    """The located line names the action and 2.w; return its max abs diff."""
    first = mismatches[0]
    prefix = f"gradients first differ after {action} (stage 1): gradient of 2.w "
    assert first.startswith(prefix), first
    return float(first[len(prefix) :].removeprefix("(max abs diff ").removesuffix(")"))


@pytest.mark.parametrize(("name", "action"), [("1f1b", "1B2"), ("zb-h1", "1W2")])
def test_the_report_names_the_action_where_the_gradient_went_wrong(
    faulty: str, name: str, action: str
) -> None:
    from verify.models import load_model

    report = verify(
        generate(name, n_ranks=2, n_microbatches=4),
        model=load_model(faulty),
        batch_size=34,
        warmup=0,
    )
    assert report.outputs_equal and report.losses_equal and report.grads_equal is False
    assert _first_line(report.mismatches, action) == pytest.approx(0.25, rel=1e-3)
    # The final gradient of w is still reported, with the whole range of actions.
    (final,) = [m for m in report.mismatches[1:] if m.startswith("gradient of 2.w")]
    assert "(stage 1) (max abs diff 0.125" in final
    assert all("stage 0" not in m for m in report.mismatches)  # its gradients are right


def test_an_unfaulted_run_has_no_located_line(faulty: str) -> None:
    from verify.models import load_model

    # 18 rows in 2 micro-batches: 9 each, the fault never fires; nothing to locate.
    report = verify(
        generate("gpipe", n_ranks=2, n_microbatches=2), model=load_model(faulty), batch_size=18
    )
    assert report.bit_identical and report.mismatches == ()


@pytest.mark.dist
@pytest.mark.timeout(300)
def test_the_multi_process_executor_names_it_too(faulty: str) -> None:
    report = verify_distributed(
        generate("1f1b", n_ranks=2, n_microbatches=4),
        model=faulty,
        batch_size=34,
        timeout_s=200,
        warmup=0,
    )
    assert report.grads_equal is False
    assert _first_line(report.mismatches, "1B2") == pytest.approx(0.25, rel=1e-3)


@pytest.mark.dist
@pytest.mark.timeout(300)
def test_under_torchrun_rank_0_names_it_and_the_run_exits_1(faulty: str, tmp_path: Path) -> None:
    import json
    import subprocess
    import sys

    report = tmp_path / "report.json"
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone"]
    command += ["--nproc-per-node", "2", "-m", "verify", "1f1b", "-p", "2", "-m", "4"]
    command += ["--model", faulty, "--batch-size", "34", "--warmup", "0", "--timeout", "120"]
    command += ["--json", "--output", str(report)]
    done = subprocess.run(command, capture_output=True, text=True, timeout=240, cwd=tmp_path)
    assert done.returncode == 1, done.stderr[-2000:]
    mismatches = tuple(json.loads(report.read_text())["mismatches"])
    assert _first_line(mismatches, "1B2") == pytest.approx(0.25, rel=1e-3)
