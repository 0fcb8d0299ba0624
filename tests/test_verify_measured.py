"""``pipesim verify --trace-out``: the measured step as a trace file that plot reads.

Oracles: the file holds every action of the schedule exactly once, in the ranks of the
schedule as it ran (one host thread on the CPU: one rank), with times in ns; simulating
that schedule with the calibrated costs in the file reproduces the prediction verify
reports (its predicted_makespan).
"""

from __future__ import annotations

import json
import re
from collections import Counter
from pathlib import Path

import pytest

from pipesim.cli import main
from pipesim.engine import simulate
from pipesim.trace_io import load_trace

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.torch


def test_trace_out_then_plot_measured(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    trace_path = tmp_path / "measured.json"
    argv = ["verify", "1f1b", "-p", "2", "-m", "4", "--device", "cpu", "--json"]
    argv += ["--trace-out", str(trace_path)]
    assert main(argv) == 0
    report = json.loads(capsys.readouterr().out)
    step = load_trace(trace_path)
    assert step.costs.time_unit == "ns" and step.trace.n_ranks == 1  # CPU: one host thread
    ran = Counter(str(r.work) for r in step.trace.actions)
    assert ran == Counter(f"{s}{op}{k}" for s in (0, 1) for op in "FB" for k in range(4))
    assert step.trace.makespan / 1e9 == pytest.approx(report["measured_makespan"])
    predicted = simulate(step.schedule, costs=step.costs).metrics.makespan
    assert predicted / 1e9 == pytest.approx(report["predicted_makespan"])
    out = tmp_path / "overlay.html"
    assert main(["plot", "--measured", str(trace_path), "-o", str(out), "--cdn"]) == 0
    text = capsys.readouterr().out
    assert "makespan error" in text and out.stat().st_size > 0


def test_device_list_is_not_spelled_like_plans_count(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["verify", "--help"])
    text = capsys.readouterr().out
    assert "--device DEV[,DEV...]" in text
    assert "[--devices" not in text and not re.search(r"^\s+--devices", text, re.M)  # unlisted
