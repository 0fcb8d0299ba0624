"""verify.crosscheck: torch.distributed.pipelining's own runtime against pipesim's
multi-process executor on the same split, micro-batches and initial parameters.

One launch of two gloo processes runs every schedule (each with both runtimes).
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

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
    checks = crosscheck_all(schedules, model="mlp", steps=1, timeout_s=380)
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
    differs = _compare(schedule, [_result(2.5, 0.25, 4.0 + 2**-20)])
    assert not differs.identical
    assert differs.mismatches == (
        "output (max abs diff 0.5)",
        "gradient 0 of stage 1 (max abs diff 9.54e-07)",
    )
