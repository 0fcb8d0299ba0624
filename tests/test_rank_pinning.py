"""The rank processes pipesim starts each keep to CPUs of their own when they fit.

The oracle is the kernel's own answer: each rank reads ``os.sched_getaffinity(0)`` from
inside its process (after the process group is up, so gloo's threads were started
under it) and writes it where the test reads it.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from pipesim.schedules import generate
from verify.errors import VerifyError
from verify.launch import PIN_ENV, as_rank, launch, pin_ranks, rank_cpus
from verify.rank import RankSpec

pytestmark = pytest.mark.skipif(
    not hasattr(os, "sched_setaffinity") or len(os.sched_getaffinity(0)) < 2,
    reason="needs Linux's sched_setaffinity and 2 CPUs",
)


def _write_affinity(rank: int, world_size: int, specs: Any, workdir: str, status: Any) -> None:
    Path(workdir, f"affinity{rank}").write_text(" ".join(map(str, sorted(os.sched_getaffinity(0)))))


def affinity_worker(rank: int, world_size: int, specs: Any, workdir: str, status: Any) -> None:
    as_rank(rank, world_size, specs, workdir, status, body=_write_affinity)


def _affinities(tmp_path: Path, n_threads: int) -> list[set[int]]:
    tmp_path.mkdir(parents=True, exist_ok=True)
    schedule = generate("1f1b", n_ranks=2, n_microbatches=2)
    specs = [
        RankSpec(schedule_json="{}", model="mlp", batch_size=2, timeout_s=60.0, n_threads=n_threads)
    ]
    launch(specs, [schedule], workdir=tmp_path, timeout_s=120.0, target=affinity_worker)
    return [{int(c) for c in (tmp_path / f"affinity{r}").read_text().split()} for r in range(2)]


@pytest.mark.slow
def test_two_single_thread_ranks_each_keep_to_one_cpu_of_their_own(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(PIN_ENV, raising=False)
    cpus = sorted(os.sched_getaffinity(0))
    assert _affinities(tmp_path, 1) == [{cpus[0]}, {cpus[1]}]


@pytest.mark.slow
def test_pinning_is_off_with_the_variable_at_0_or_when_the_ranks_do_not_fit(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    everything = set(os.sched_getaffinity(0))
    monkeypatch.setenv(PIN_ENV, "0")
    assert _affinities(tmp_path / "off", 1) == [everything, everything]
    monkeypatch.delenv(PIN_ENV)
    too_many = len(everything)  # 2 ranks x this many threads outnumber the CPUs
    assert _affinities(tmp_path / "shared", too_many) == [everything, everything]


def test_rank_cpus_gives_consecutive_blocks_by_hand() -> None:
    assert rank_cpus(0, 3, 2, cpus=[7, 1, 3, 5, 2, 9]) == {1, 2}
    assert rank_cpus(2, 3, 2, cpus=[7, 1, 3, 5, 2, 9]) == {7, 9}
    assert rank_cpus(0, 4, 1, cpus=[0, 1, 2]) is None


@pytest.mark.parametrize("value", ["yes", "2", "off"])
def test_a_bad_pin_value_is_refused_once_by_the_launcher_naming_it(
    value: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from pipesim.cli import main

    monkeypatch.setenv(PIN_ENV, value)
    with pytest.raises(VerifyError, match=rf"PIPESIM_PIN_RANKS='{value}' is neither 0 nor 1"):
        pin_ranks()
    assert main(["verify", "1f1b", "-p", "2", "-m", "2", "--dist", "--timeout", "60"]) == 2
    err = capsys.readouterr().err
    # once, from the launcher: no rank started to fail with it
    assert err.count(f"PIPESIM_PIN_RANKS='{value}'") == 1 and "rank 0" not in err


@pytest.mark.parametrize(("value", "pinned"), [("", True), (" 1 ", True), ("0", False)])
def test_pin_values(value: str, pinned: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(PIN_ENV, value)
    assert pin_ranks() is pinned
