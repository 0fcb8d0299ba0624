"""Trace files and the predicted-vs-measured overlay.

Oracles: a file written and read back gives the same records and metrics; a
"measured" step made by simulating the same schedule with known slower costs has
known per-kind errors ((predicted - measured) / measured, e.g. F = 1 against 5/4 is
-20%), and the overlay draws exactly the schedule's actions once per side.
"""

from __future__ import annotations

import json
from fractions import Fraction
from pathlib import Path

import pytest

from pipesim.cli import main
from pipesim.costs import CostModel, Link
from pipesim.engine import simulate
from pipesim.errors import ParseError, PipesimError
from pipesim.plot.overlay import kind_errors, overlay_figure
from pipesim.schedules import generate
from pipesim.trace_io import load_trace, save_trace, step_from_dict, step_to_dict


def test_round_trip_keeps_every_record(tmp_path: Path) -> None:
    schedule = generate("zb-h1", n_ranks=3, n_microbatches=4)
    costs = CostModel.uniform(
        forward="1/3",
        activation_bytes=10,
        weight_grad_bytes=4,
        link=Link(latency="1/7"),
        time_unit="us",
    )
    sim = simulate(schedule, costs=costs)
    path = save_trace(sim.trace, tmp_path / "t.json", schedule=schedule, costs=sim.costs)
    back = load_trace(path)
    assert back.trace == sim.trace  # exact: Fractions written as "p/q"
    assert back.metrics == sim.metrics and back.costs.time_unit == "us"
    assert back.schedule.orders == schedule.orders
    data = json.loads(path.read_text())
    assert data["format"] == "pipesim-trace" and data["time_unit"] == "us"
    assert len(data["actions"]) == sum(len(o) for o in schedule.orders)


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ({"format": "pipesim-schedule"}, "not a pipesim trace file"),
        ([], "not a pipesim trace file"),
    ],
)
def test_bad_files(data: object, message: str) -> None:
    with pytest.raises(ParseError, match=message):
        step_from_dict(data, source="x.json")


def test_a_verify_report_is_read_for_its_measured_trace(tmp_path: Path) -> None:
    sim = simulate(generate("1f1b", n_ranks=2, n_microbatches=2))
    embedded = step_to_dict(sim.trace, schedule=sim.schedule, costs=sim.costs)
    report = tmp_path / "report.json"
    report.write_text(json.dumps({"bit_identical": True, "measured_trace": embedded}))
    assert load_trace(report).trace == sim.trace
    report.write_text(json.dumps({"bit_identical": True, "measured_trace": None}))
    with pytest.raises(ParseError, match="holds no measured trace"):
        load_trace(report)
    report.write_text(json.dumps({"bit_identical": True}))  # neither a trace nor a report
    with pytest.raises(ParseError, match=r"not a pipesim trace file .* verify --json -o FILE"):
        load_trace(report)


def _bad_trace(change: str) -> dict[str, object]:
    """1F1B on 2 ranks, m = 2, as a trace file's dictionary, with one thing changed.
    Rank 0 runs 0F0 0F1 0B0 0B1 (p - r - 1 = 1 warm-up forward, then 1F1B); the first
    action record is rank 0's 0F0 from 0 to 1."""
    sim = simulate(generate("1f1b", n_ranks=2, n_microbatches=2))
    data = step_to_dict(sim.trace, schedule=sim.schedule)
    first = data["actions"][0]
    assert first == [0, "0F0", 0, 1]
    changes = {
        "short record": lambda: data["actions"].__setitem__(0, [0, "0F0", 0]),
        "records not a list": lambda: data.update(actions=5),
        "nan time": lambda: data["actions"].__setitem__(0, [0, "0F0", "nan", 1]),
        "ends before it starts": lambda: data["actions"].__setitem__(0, [0, "0F0", 3, 1]),
        "rank out of range": lambda: data["actions"].__setitem__(0, [7, "0F0", 0, 1]),
        "foreign action": lambda: data["actions"].__setitem__(0, [0, "9F9", 0, 1]),
        "action twice": lambda: data["actions"].append(first),
        "action missing": lambda: data["actions"].pop(0),
        "no actions": lambda: data.pop("actions"),
        "memory rank": lambda: data["memory"].__setitem__(0, [5, 0, 1, 1]),
        "costs a list": lambda: data.update(costs=[]),
        "newer version": lambda: data.update(version=2),
        "n_ranks": lambda: data.update(n_ranks=-1),
    }
    changes[change]()
    return data


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ("short record", "actions record 0, [0, '0F0', 0]: expected [rank, action, start, end]"),
        ("records not a list", "'actions' must be a list of [rank, action, start, end] records"),
        ("nan time", "actions record 0, [0, '0F0', 'nan', 1]: time must be finite"),
        ("ends before it starts", "the record of 0F0 on rank 0 ends at 1, before it starts at 3"),
        ("rank out of range", "0F0 on rank 7 names rank 7, but schedule '1f1b' has ranks 0..1"),
        ("foreign action", "the record of 9F9 on rank 0 is not an action of schedule '1f1b'"),
        ("action twice", "the record of 0F0 on rank 0 is given twice"),
        ("action missing", "1 of the 8 actions of schedule '1f1b' have no record, e.g. 0F0 on"),
        ("no actions", "8 of the 8 actions of schedule '1f1b' have no record"),
        ("memory rank", "a memory record of rank 5 names rank 5"),
        ("costs a list", "costs: expected a JSON object"),
        ("newer version", "trace format version 2, but this pipesim reads version 1"),
        ("n_ranks", "n_ranks is -1, but its schedule '1f1b' has 2 ranks"),
    ],
)
def test_a_malformed_trace_is_refused_naming_the_record(change: str, message: str) -> None:
    with pytest.raises(ParseError) as info:
        step_from_dict(_bad_trace(change), source="x.json")
    assert str(info.value).startswith("x.json: ") and message in str(info.value), info.value


def test_kind_errors_against_known_slowdowns() -> None:
    schedule = generate("zb-h1", n_ranks=2, n_microbatches=4)
    predicted = simulate(schedule)  # F = I = W = 1
    measured = simulate(schedule, costs=CostModel.uniform(forward="5/4", input_grad=2))
    errors = kind_errors(predicted, measured)
    assert errors.percent == {"F": -20.0, "I": -50.0, "W": 0.0}
    assert errors.measured["F"] == Fraction(5, 4)
    expected = (predicted.trace.makespan - measured.trace.makespan) / Fraction(
        measured.trace.makespan
    )
    assert errors.makespan_percent == pytest.approx(float(expected * 100))
    lines = errors.lines()
    assert lines[0] == "F: predicted 1 units, measured 1.25 units (-20.0%)"


def test_overlay_draws_both_sides_rank_by_rank() -> None:
    schedule = generate("1f1b", n_ranks=3, n_microbatches=4)
    predicted = simulate(schedule, costs=CostModel.uniform(link=Link(latency=1)))
    measured = simulate(schedule, costs=CostModel.uniform(backward=3))
    fig = overlay_figure(predicted, measured)
    assert list(fig.layout.yaxis.ticktext) == [
        f"rank {r} {w}" for r in range(3) for w in ("predicted", "measured")
    ]
    for which, row_offset in (("predicted", 0), ("measured", 1)):
        traces = [t for t in fig.data if t.name.startswith(which)]
        rows = [y for t in traces for y in t.y]
        assert sorted(rows) == sorted(
            2 * r + row_offset for r, o in enumerate(schedule.orders) for _ in o
        )
    assert "B -33.3%" in fig.layout.title.text  # B: 2 predicted against 3 measured
    assert fig.layout.xaxis.title.text == "time (units)"


def test_overlay_refuses_mixed_units() -> None:
    schedule = generate("1f1b", n_ranks=2, n_microbatches=2)
    with pytest.raises(PipesimError, match="in unit but the measurement in ns"):
        kind_errors(simulate(schedule), simulate(schedule, costs=CostModel(time_unit="ns")))


def test_cli_measured(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    schedule = generate("1f1b", n_ranks=2, n_microbatches=4)
    costs = CostModel.uniform(forward=100, backward=200, time_unit="ns")
    slow = CostModel.uniform(forward=125, backward=200, time_unit="ns")
    measured = simulate(schedule, costs=slow)
    path = save_trace(measured.trace, tmp_path / "m.json", schedule=schedule, costs=costs)
    out = tmp_path / "o.html"
    # no schedule given: the file's schedule, predicted with the file's costs
    assert main(["plot", "--measured", str(path), "-o", str(out), "--cdn"]) == 0
    text = capsys.readouterr().out
    assert "F: predicted 100 ns, measured 125 ns (-20.0%)" in text
    assert "<title>1f1b: predicted and measured, rank by rank · pipesim</title>" in out.read_text()
    # the same schedule named on the command line, with cost flags
    argv = ["plot", "1f1b", "-p", "2", "-m", "4", "--measured", str(path), "--cdn"]
    flags = ["--forward-time", "125", "--backward-time", "200", "--time-unit", "ns"]
    assert main([*argv, *flags, "-o", str(out)]) == 0
    assert "F: predicted 125 ns, measured 125 ns (+0.0%)" in capsys.readouterr().out
    # another schedule is refused
    assert main(["plot", "gpipe", "-p", "2", "-m", "4", "--measured", str(path)]) == 1
    assert "give the schedule it ran" in capsys.readouterr().err
