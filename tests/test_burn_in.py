"""verify.dist / verify.fidelity: the first schedule in fresh rank processes runs
``burn_in`` untimed steps more than ``warmup`` (fresh processes fault in new pages for a
few steps), counted by the forwards a rank really runs."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("torch")

from pipesim.schedules import generate
from verify.dist import verify_distributed_all
from verify.fidelity import BURN_IN, measure_all

pytestmark = [pytest.mark.torch, pytest.mark.dist, pytest.mark.timeout(300)]

_MODELS = '''
import multiprocessing
import os
from torch import nn


class CountInRanks(nn.Module):
    """Adds a line to $COUNT_FILE each time a rank process (not the launcher) runs it."""

    def forward(self, x):
        if multiprocessing.parent_process() is not None:
            with open(os.environ["COUNT_FILE"], "a") as out:
                out.write("F\\n")
        return x


def counted():  # stage 0 of 2 (rank 0) counts its forwards
    return [nn.Linear(4, 4), CountInRanks(), nn.Linear(4, 2)]
'''


@pytest.fixture
def counted(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    (tmp_path / "burn_in_models.py").write_text(_MODELS)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))
    count = tmp_path / "forwards.txt"
    monkeypatch.setenv("COUNT_FILE", str(count))
    return count


def _forwards(count: Path) -> int:
    return len(count.read_text().splitlines()) if count.exists() else 0


@pytest.mark.parametrize("burn_in", [0, 2])
def test_only_the_first_schedule_runs_the_burn_in_steps(counted: Path, burn_in: int) -> None:
    """Two GPipe m=2 runs in one process pair, no warm-up: stage 0 runs 2 forwards a step,
    so (1 + burn_in) * 2 for the first schedule and 2 for the second."""
    schedules = [generate("gpipe", n_ranks=2, n_microbatches=2) for _ in range(2)]
    reports = verify_distributed_all(
        schedules, model="burn_in_models:counted", warmup=0, burn_in=burn_in, timeout_s=240
    )
    assert all(r.bit_identical for r in reports)
    assert _forwards(counted) == (1 + burn_in) * 2 + 2


def test_measure_all_burns_in_each_fresh_process_pair(counted: Path) -> None:
    """Two rounds (fresh processes each) of two schedules, one warm-up step each: per
    round 2 * (1 + 1 + BURN_IN) + 2 * (1 + 1) forwards on stage 0."""
    schedules = [generate("gpipe", n_ranks=2, n_microbatches=2) for _ in range(2)]
    got = measure_all(
        schedules, model="burn_in_models:counted", microbatch_size=1, repeats=2, timeout_s=120
    )
    assert [len(m.steps) for m in got] == [2, 2]
    assert _forwards(counted) == 2 * (2 * (2 + BURN_IN) + 2 * 2)


def test_no_warm_up_asked_measures_the_very_first_step(counted: Path) -> None:
    """warmup 0 (what --warmup 0 asks for): no burn-in either, one step per schedule."""
    schedules = [generate("gpipe", n_ranks=2, n_microbatches=2) for _ in range(2)]
    measure_all(
        schedules,
        model="burn_in_models:counted",
        microbatch_size=1,
        repeats=1,
        warmup=0,
        timeout_s=120,
    )
    assert _forwards(counted) == 2 * 2


def test_calibrate_help_names_the_burn_in_it_adds(capsys: pytest.CaptureFixture[str]) -> None:
    """pipesim's CLI cannot import verify (torch) to parse: its help repeats the number."""
    from pipesim.cli import main

    with pytest.raises(SystemExit):
        main(["calibrate", "--help"])
    help_text = " ".join(capsys.readouterr().out.split())
    assert f"add {BURN_IN} more (verify.fidelity.BURN_IN) when W > 0" in help_text


@pytest.mark.parametrize(
    ("warmup", "burn_in", "deadline"), [(1, BURN_IN, 100.0 * (2 + BURN_IN / 2)), (0, 0, 200.0)]
)
def test_the_round_deadline_adds_the_burn_in_share(
    monkeypatch: pytest.MonkeyPatch, warmup: int, burn_in: int, deadline: float
) -> None:
    """Two schedules of 100 s each: a round may take 200 s, and with warmup 1 (a run of 2
    steps) the BURN_IN steps add BURN_IN / 2 runs' share (100 s for 2); warmup 0 has no
    burn-in."""
    import verify.fidelity as fidelity

    seen: dict[str, object] = {}

    class Stop(Exception):
        pass

    def capture(schedules: object, /, **kwargs: object) -> None:
        seen.update(kwargs)
        raise Stop

    monkeypatch.setattr(fidelity, "verify_distributed_all", capture)
    schedules = [generate("gpipe", n_ranks=2, n_microbatches=2) for _ in range(2)]
    with pytest.raises(Stop):
        measure_all(schedules, model="mlp", repeats=1, warmup=warmup, timeout_s=100)
    assert (seen["timeout_s"], seen["burn_in"], seen["wait_timeout_s"]) == (deadline, burn_in, 100)
