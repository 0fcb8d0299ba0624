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
        step = len(self.alive_at_start) - 1  # this runner's step count, as a unit's times
        return {"grads": {0: [grads]}, "timings": [("0F0", step, step + 1)]}, 10, 5


@pytest.fixture
def fake_runner(monkeypatch: pytest.MonkeyPatch) -> type[_FakeRunner]:
    _FakeRunner.instances, _FakeRunner.earlier = [], []
    monkeypatch.setattr(rank_module, "RankRunner", _FakeRunner)
    return _FakeRunner


def _spec(warmup: int, timed_steps: int = 1) -> RankSpec:
    return RankSpec(
        schedule_json="{}",
        model="mlp",
        batch_size=4,
        timeout_s=5.0,
        warmup=warmup,
        timed_steps=timed_steps,
    )


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


def test_every_timed_step_keeps_its_timings_and_releases_the_last_ones_tensors(
    fake_runner: type[_FakeRunner],
) -> None:
    result = run_rank(0, _spec(2, timed_steps=3), device=torch.device("cpu"))
    (runner,) = fake_runner.instances
    assert runner.alive_at_start == [0] * 5  # 2 warm-ups + 3 measured, each on a clean slate
    # The measured steps are the 3rd to 5th (steps 2, 3, 4 counting from 0), in order.
    assert result["step_timings"] == [[("0F0", k, k + 1)] for k in (2, 3, 4)]
    assert result["grads"][0][0] is _FakeRunner.earlier[-1]()
    assert result["step_wall_ns"] == [10] * 5


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


def test_each_steps_page_faults_are_the_counters_difference_around_it(
    fake_runner: type[_FakeRunner], monkeypatch: pytest.MonkeyPatch
) -> None:
    counts = iter([100, 130, 200, 260, 261, 261])  # before and after each of three steps
    monkeypatch.setattr(rank_module, "minor_page_faults", lambda: next(counts))
    result = run_rank(0, _spec(2), device=torch.device("cpu"))
    assert result["step_page_faults"] == [30, 60, 0]


def test_page_faults_are_none_where_the_platform_cannot_count_them(
    fake_runner: type[_FakeRunner], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(rank_module, "minor_page_faults", lambda: None)
    assert run_rank(0, _spec(1), device=torch.device("cpu"))["step_page_faults"] == [None, None]


def test_this_process_counts_the_pages_it_touches_first() -> None:
    before = rank_module.minor_page_faults()
    block = torch.empty(64 << 20, dtype=torch.uint8)  # 64 MiB, mapped but not yet touched
    block.fill_(1)  # every 4 KiB page touched once
    after = rank_module.minor_page_faults()
    assert before is not None and after is not None
    # At least one fault per page touched: 16,384 pages of 4 KiB, or 32 if the kernel backs
    # the block with 2 MiB huge pages (transparent huge pages set to "always").
    assert after - before >= (64 << 20) // (2 << 20)


def test_the_report_shows_the_measured_steps_page_faults_only_where_counted() -> None:
    from dataclasses import replace

    from pipesim.schedules import generate
    from verify import verify
    from verify.report import format_report

    report = verify(generate("1f1b", n_ranks=2, n_microbatches=2), model="mlp", warmup=0)
    assert report.page_faults is None  # one process: not counted
    assert "page faults" not in format_report(report)
    assert report.to_dict()["page_faults"] is None
    quiet = format_report(replace(report, page_faults=(12, 0))).splitlines()[-1]
    assert quiet == "page faults in the measured step, per rank: 12, 0"
    noisy = format_report(replace(report, page_faults=(1_001, 3))).splitlines()[-1]
    assert noisy.startswith("page faults in the measured step, per rank: 1,001, 3 (over 1,000")
    assert noisy.endswith("raise --warmup")
    assert replace(report, page_faults=(7, 8)).to_dict()["page_faults"] == [7, 8]
