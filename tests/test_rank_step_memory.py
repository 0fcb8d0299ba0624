"""A rank's measured step must not run while an earlier step's tensors are still held.

Why: held, the warm-up's gradients (tens of MB per stage) kept its memory busy, so the
measured step touched fresh pages; on a virtual machine each first touch cost about
10 us, and DualPipe, with two stages' gradients per rank, measured 13-23% over its
prediction (docs/fidelity.md). The oracle here is Python's own reference counting: a
weak reference to an earlier step's tensor must be dead when the next step starts.
"""

from __future__ import annotations

import weakref
from pathlib import Path
from typing import Any, ClassVar

import pytest
import torch
from torch import nn

import verify.rank as rank_module
from verify.rank import RankSpec, run_rank, run_specs


class _FakeRunner:
    """Stands in for RankRunner: each step returns a fresh tensor and records whether the
    tensors of the steps before it were still alive when it started."""

    instances: ClassVar[list[_FakeRunner]] = []
    earlier: ClassVar[list[weakref.ref[torch.Tensor]]] = []  # every runner's steps, in order

    def __init__(self, rank: int, spec: RankSpec, /, **_: Any) -> None:
        self.layers = nn.Sequential(nn.Linear(2, 2))
        self.alive_at_start: list[int] = []
        _FakeRunner.instances.append(self)

    def timed_step(self) -> tuple[dict[str, Any], int, int]:
        self.alive_at_start.append(sum(ref() is not None for ref in _FakeRunner.earlier))
        grads = torch.ones(1024)
        _FakeRunner.earlier.append(weakref.ref(grads))
        return {"grads": {0: [grads]}}, 10, 5


@pytest.fixture
def fake_runner(monkeypatch: pytest.MonkeyPatch) -> type[_FakeRunner]:
    _FakeRunner.instances, _FakeRunner.earlier = [], []
    monkeypatch.setattr(rank_module, "RankRunner", _FakeRunner)
    return _FakeRunner


def _spec(warmup: int) -> RankSpec:
    return RankSpec(schedule_json="{}", model="mlp", batch_size=4, timeout_s=5.0, warmup=warmup)


@pytest.mark.parametrize("warmup", [1, 3])
def test_each_step_starts_with_the_earlier_steps_tensors_released(
    fake_runner: type[_FakeRunner], warmup: int
) -> None:
    result = run_rank(0, _spec(warmup), device=torch.device("cpu"))
    (runner,) = fake_runner.instances
    assert runner.alive_at_start == [0] * (warmup + 1)
    # The measured step's result is the one returned, with every step's times.
    assert result["grads"][0][0] is _FakeRunner.earlier[-1]()
    assert result["step_wall_ns"] == [10] * (warmup + 1)
    assert result["step_cpu_ns"] == [5] * (warmup + 1)


def test_the_next_schedule_starts_after_the_last_ones_result_is_saved_and_released(
    fake_runner: type[_FakeRunner], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setattr(rank_module, "set_current_schedule", lambda *a: None)
    monkeypatch.setattr(rank_module, "set_state", lambda *a: None)
    run_specs(0, 1, [_spec(0), _spec(0)], str(tmp_path), status=None)
    first, second = fake_runner.instances
    assert (first.alive_at_start, second.alive_at_start) == ([0], [0])
    assert _FakeRunner.earlier[0]() is None
    saved = torch.load(tmp_path / "rank0-0.pt")
    assert torch.equal(saved["grads"][0][0], torch.ones(1024))
