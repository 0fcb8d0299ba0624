"""Import from torch.distributed.pipelining: API, CLI, errors, and no torch at import."""

from __future__ import annotations

import json
import subprocess
import sys
import warnings
from pathlib import Path

import pytest

from pipesim.cli import main
from pipesim.engine import simulate
from pipesim.errors import ParseError, PipesimError, ScheduleError, UnknownNameError
from pipesim.graph import critical_path, validate
from pipesim.schedule_io import load_schedule
from pipesim.torch_import import (
    schedule_from_pipeline_order,
    schedule_from_torch,
    torch_schedule_names,
)


def test_pipesim_imports_without_torch() -> None:
    # A fresh interpreter: importing pipesim (and its torch bridge) loads no torch.
    code = (
        "import sys, pipesim, pipesim.torch_import, pipesim.cli, pipesim.schedules; "
        "print('torch' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_missing_torch_says_to_install_the_verify_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    from pipesim import torch_import

    monkeypatch.setitem(sys.modules, "torch.distributed.pipelining", None)  # import fails
    with pytest.raises(PipesimError, match=r"pip install 'pipesim\[verify\]'"):
        torch_import.schedule_from_torch("ZBVZeroBubble", n_ranks=2, n_microbatches=4)


def test_pipeline_order_conversion_drops_idle_and_communication() -> None:
    order = {
        0: ["0F0", None, "0SEND_F0", "0B0", "0REDUCE_GRAD"],
        1: [None, "1RECV_F0", "1F0", "1B0"],
    }
    schedule = schedule_from_pipeline_order(order)
    assert [[str(a) for a in rank] for rank in schedule.orders] == [["0F0", "0B0"], ["1F0", "1B0"]]
    assert schedule.placement == (0, 1)


def test_pipeline_order_conversion_names_bad_cells() -> None:
    with pytest.raises(ParseError, match="rank 1, position 0"):
        schedule_from_pipeline_order({0: ["0F0"], 1: ["1X0"]})
    with pytest.raises(ParseError, match=r"ranks must be 0\.\.n-1"):
        schedule_from_pipeline_order({0: ["0F0"], 2: ["1F0"]})


# -- with torch (the verify extra; pinned in CI) ---------------------------------------
try:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch warns when numpy is absent
        from torch.distributed.pipelining import schedules as torch_schedules
except ImportError:  # the tests above still run
    torch_schedules = None

needs_torch = pytest.mark.skipif(torch_schedules is None, reason="needs torch (verify extra)")

CLASSES = [
    ("Schedule1F1B", 1),
    ("ScheduleGPipe", 1),
    ("ScheduleInterleaved1F1B", 2),
    ("ScheduleLoopedBFS", 3),
    ("ScheduleInterleavedZeroBubble", 2),
    ("ScheduleZBVZeroBubble", 2),
    ("ScheduleDualPipeV", 2),
]


@pytest.mark.torch
@needs_torch
def test_every_torch_class_is_known() -> None:
    assert {name for name, _ in CLASSES} <= set(torch_schedule_names())


@pytest.mark.torch
@needs_torch
@pytest.mark.parametrize(("name", "virtual"), CLASSES)
def test_imported_schedules_are_valid_and_simulate(name: str, virtual: int) -> None:
    schedule = schedule_from_torch(name, n_ranks=4, n_microbatches=8, virtual=virtual)
    validate(schedule)
    assert schedule.name == name and schedule.n_ranks == 4
    assert schedule.n_stages == 4 * virtual
    assert simulate(schedule).metrics.makespan == critical_path(schedule).length


@pytest.mark.torch
@needs_torch
def test_short_names_and_classes_are_accepted() -> None:
    by_name = schedule_from_torch("ZBVZeroBubble", n_ranks=2, n_microbatches=4)
    by_class = schedule_from_torch(
        torch_schedules.ScheduleZBVZeroBubble, n_ranks=2, n_microbatches=4
    )
    assert by_name == by_class
    assert by_name.placement == (0, 1, 1, 0)  # torch's V placement


@pytest.mark.torch
@needs_torch
def test_torch_refusals_become_schedule_errors() -> None:
    with pytest.raises(ScheduleError, match="torch's ScheduleDualPipeV refuses"):
        schedule_from_torch("DualPipeV", n_ranks=2, n_microbatches=3)
    with pytest.raises(ScheduleError, match="one stage per rank"):
        schedule_from_torch("1F1B", n_ranks=2, n_microbatches=4, virtual=2)
    with pytest.raises(UnknownNameError, match="ScheduleZBVZeroBubble"):
        schedule_from_torch("ZeroBubbleX", n_ranks=2, n_microbatches=4)
    with pytest.raises(ScheduleError, match="n_ranks"):
        schedule_from_torch("1F1B", n_ranks=0, n_microbatches=4)


@pytest.mark.torch
@needs_torch
def test_csv_loaded_into_torch_comes_back(tmp_path: Path) -> None:
    # A user's CSV, loaded by torch's own loader, then imported from the torch object.
    csv_path = tmp_path / "mine.csv"
    csv_path.write_text("0F0,0F1,0B0,0B1\n1F0,1B0,1F1,1B1\n")
    order = {
        rank: [torch_schedules._Action.from_str(cell) for cell in line.split(",")]
        for rank, line in enumerate(csv_path.read_text().splitlines())
    }
    schedule = schedule_from_pipeline_order(order, name="mine")
    assert schedule == load_schedule(csv_path)  # named after the file's stem


@pytest.mark.torch
@needs_torch
def test_cli_from_torch_writes_csv_that_simulates(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "dpv.csv"
    args = ["schedule", "--from-torch", "DualPipeV", "--stages", "2", "--microbatches", "4"]
    assert main([*args, "-o", str(out)]) == 0
    assert "(0F3;3B1)OVERLAP_F_B" in out.read_text()
    assert main(["simulate", str(out), "--json"]) == 0
    data = json.loads(capsys.readouterr().out.split("\n", 1)[1])
    assert data["n_ranks"] == 2 and data["n_stages"] == 4


@pytest.mark.torch
@needs_torch
def test_cli_from_torch_errors_are_clean(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["schedule", "--from-torch", "ZBVZeroBubble", "--stages", "2"]) == 1
    assert "--microbatches" in capsys.readouterr().err
    assert main(["schedule", "zbv", "--from-torch", "ZBVZeroBubble", "-p", "2", "-m", "4"]) == 1
    assert "exactly one" in capsys.readouterr().err
    assert main(["schedule", "--from-torch", "Nope", "-p", "2", "-m", "4"]) == 1
    assert "unknown torch schedule class 'Nope'" in capsys.readouterr().err
