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


@pytest.mark.slow
def test_plot_measured_reads_the_verify_json_report(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`pipesim verify --json -o report.json` embeds the measured step; `pipesim plot
    --measured report.json` draws it and prints the error per kind, the same as from the
    --trace-out file of the same run."""
    from pipesim.plot.overlay import overlay_figure

    report_path, trace_path = tmp_path / "report.json", tmp_path / "measured.json"
    argv = ["verify", "1f1b", "-p", "2", "-m", "2", "--device", "cpu", "--json"]
    assert main([*argv, "-o", str(report_path), "--trace-out", str(trace_path)]) == 0
    report = json.loads(report_path.read_text())
    embedded = report["measured_trace"]
    assert embedded["format"] == "pipesim-trace" and embedded["time_unit"] == "ns"
    from_report, from_trace = load_trace(report_path), load_trace(trace_path)
    assert from_report.trace == from_trace.trace and from_report.schedule == from_trace.schedule

    out = tmp_path / "overlay.html"
    assert main(["plot", "--measured", str(report_path), "-o", str(out), "--cdn"]) == 0
    lines = capsys.readouterr().out.splitlines()
    # oracle for the measured means: the raw rows of the report, [rank, action, start, end]
    rows = embedded["actions"]
    assert sorted(row[1] for row in rows) == sorted(
        f"{s}{op}{k}" for s in (0, 1) for op in "FB" for k in range(2)
    )
    ns_per = {"s": 1e9, "ms": 1e6, "us": 1e3, "ns": 1.0}  # the unit the line picks
    for kind in "FB":
        spans = [row[3] - row[2] for row in rows if row[1][1] == kind]
        line = next(x for x in lines if x.strip().startswith(f"{kind}: predicted"))
        found = re.search(r"measured ([0-9.]+) (s|ms|us|ns)\b", line)
        assert found is not None, line
        shown_ns = float(found.group(1)) * ns_per[found.group(2)]
        assert shown_ns == pytest.approx(sum(spans) / len(spans), rel=1e-5), line
    # the prediction drawn is the one verify reported its makespan error against
    error = next(x for x in lines if "makespan error" in x)
    assert f"{report['makespan_error_percent']:+.1f}%" in error
    # the figure: every action once on its predicted row and once on its measured row
    predicted = simulate(from_report.schedule, costs=from_report.costs)
    fig = overlay_figure(predicted, from_report)
    row_names = dict(zip(fig.layout.yaxis.tickvals, fig.layout.yaxis.ticktext, strict=True))
    bars = Counter(row_names[y].split()[-1] for t in fig.data if t.type == "bar" for y in t.y)
    assert bars == {"predicted": len(rows), "measured": len(rows)}
    assert out.stat().st_size > 0
