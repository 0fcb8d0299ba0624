"""Schedule files: pipesim JSON and torch's compute-only CSV, round trips and refusals."""

from __future__ import annotations

import csv
import io
import json
from pathlib import Path
from types import SimpleNamespace

import pytest

from pipesim.actions import Overlap
from pipesim.errors import LimitError, ParseError, PipesimError, ScheduleError
from pipesim.limits import MAX_RANKS
from pipesim.schedule import Schedule
from pipesim.schedule_io import (
    load_schedule,
    save_schedule,
    schedule_from_csv,
    schedule_from_dict,
    schedule_from_json,
    schedule_to_csv,
    schedule_to_dict,
    schedule_to_json,
)
from pipesim.schedules import generate, get_spec, schedule_names

# (n_ranks, n_microbatches, virtual) tried for every registered schedule; each family
# must accept at least one of them.
SIZES = [(1, 1, None), (2, 4, None), (3, 6, None), (4, 8, None), (4, 8, 2), (2, 6, 3)]


def built_in_schedules() -> list[Schedule]:
    schedules = []
    for name in schedule_names():
        variants = [False, True] if get_spec(name).forward_only else [False]
        for forward_only in variants:
            made = 0
            for p, m, v in SIZES:
                try:
                    schedules.append(
                        generate(
                            name, n_ranks=p, n_microbatches=m, virtual=v, forward_only=forward_only
                        )
                    )
                    made += 1
                except ScheduleError:
                    continue  # this size breaks the family's rules
            assert made, f"no size in {SIZES} suits {name!r}"
    return schedules


SCHEDULES = built_in_schedules()
IDS = [
    f"{s.name}-p{s.n_ranks}-s{s.n_stages}-m{s.n_microbatches}{'-fwd' if s.forward_only else ''}"
    for s in SCHEDULES
]


# torch.distributed.pipelining's _ComputationType members for our op letters.
TORCH_OP_NAMES = {
    "F": "FORWARD",
    "B": "FULL_BACKWARD",
    "I": "BACKWARD_INPUT",
    "W": "BACKWARD_WEIGHT",
}


def csv_compatible(schedule: Schedule) -> bool:
    idle_last = not schedule.orders[-1]  # a trailing blank line, which readers drop
    plain = not schedule.happens_before and schedule.n_copies == 1
    return plain and not idle_last and not schedule.forward_only


@pytest.mark.parametrize("schedule", SCHEDULES, ids=IDS)
def test_json_round_trip(schedule: Schedule, tmp_path: Path) -> None:
    assert schedule_from_json(schedule_to_json(schedule)) == schedule
    path = save_schedule(schedule, tmp_path / "s.json")
    assert load_schedule(path) == schedule
    data = json.loads(path.read_text())
    assert data["format"] == "pipesim-schedule"
    assert data["ranks"] == [[str(w) for w in order] for order in schedule.orders]
    assert data["placement"] == list(schedule.placement)
    assert data["n_microbatches"] == schedule.n_microbatches


@pytest.mark.parametrize("schedule", SCHEDULES, ids=IDS)
def test_csv_round_trip(schedule: Schedule, tmp_path: Path) -> None:
    if not csv_compatible(schedule):
        with pytest.raises(
            PipesimError, match=r"torch's CSV (cannot|writes|reader).*save it as \.json"
        ):
            schedule_to_csv(schedule)
        return
    text = schedule_to_csv(schedule)
    rows = list(csv.reader(io.StringIO(text)))
    assert rows == [[str(w) for w in order] for order in schedule.orders]  # one row per rank
    back = schedule_from_csv(text, name=schedule.name, n_microbatches=schedule.n_microbatches)
    assert back == schedule
    path = save_schedule(schedule, tmp_path / f"{schedule.name}.csv")
    assert load_schedule(path) == schedule  # the file's stem names it


@pytest.mark.torch
@pytest.mark.parametrize(
    "schedule",
    [s for s in SCHEDULES if csv_compatible(s)],
    ids=[i for s, i in zip(SCHEDULES, IDS, strict=True) if csv_compatible(s)],
)
def test_csv_is_read_by_torch(schedule: Schedule) -> None:
    """Every cell of our CSV parses with torch.distributed.pipelining's own action parser,
    into the same stage, op and micro-batch."""
    schedules = pytest.importorskip("torch.distributed.pipelining.schedules")
    for rank, row in enumerate(csv.reader(io.StringIO(schedule_to_csv(schedule)))):
        assert len(row) == len(schedule.orders[rank])
        for cell, work in zip(row, schedule.orders[rank], strict=True):
            action = schedules._Action.from_str(cell)
            assert str(action) == cell
            if isinstance(work, Overlap):  # torch: an OVERLAP_F_B action with sub-actions
                assert action.computation_type.name == "OVERLAP_F_B"
                pairs = zip(action.sub_actions, work.parts, strict=True)
            else:
                pairs = zip([action], [work], strict=True)
            for theirs, ours in pairs:
                assert theirs.stage_index == ours.stage
                assert theirs.computation_type.name == TORCH_OP_NAMES[ours.op.value]
                assert theirs.microbatch_index == ours.microbatch
    # and the whole file passes the validator torch's _load_csv runs on it
    rows = csv.reader(io.StringIO(schedule_to_csv(schedule)))
    actions = {rank: [schedules._Action.from_str(c) for c in row] for rank, row in enumerate(rows)}
    schedules._validate_schedule(
        actions, schedule.n_ranks, schedule.n_stages, schedule.n_microbatches
    )


@pytest.mark.torch
def test_forward_only_csv_is_refused_because_torch_refuses_it() -> None:
    """torch's loader wants every micro-batch's backward, so a forward-only CSV would load
    nowhere; pipesim says so instead of writing it."""
    schedules = pytest.importorskip("torch.distributed.pipelining.schedules")
    gpipe = generate("gpipe", n_ranks=2, n_microbatches=2, forward_only=True)
    actions = {
        r: [schedules._Action.from_str(str(w)) for w in o] for r, o in enumerate(gpipe.orders)
    }
    with pytest.raises(AssertionError, match="backwards"):
        schedules._validate_schedule(actions, 2, 2, 2)
    with pytest.raises(PipesimError, match=r"forward-only.*save it as \.json"):
        schedule_to_csv(gpipe)


def test_csv_skips_empty_cells_like_torch() -> None:
    s = schedule_from_csv("0F0,,0B0\n,1F0,1B0\n")
    assert [[str(a) for a in order] for order in s.orders] == [["0F0", "0B0"], ["1F0", "1B0"]]


def test_json_keeps_happens_before() -> None:
    s = generate("sequential", n_ranks=2, n_microbatches=3, forward_only=True)
    data = schedule_to_dict(s)
    assert data["happens_before"] == [["1F0", "0F1"], ["1F1", "0F2"]]
    assert schedule_from_dict(data) == s


# -- malformed input --------------------------------------------------------------------
def test_bad_json_names_line_and_column() -> None:
    text = '{\n "ranks": [\n  ["0F0", "0B0",]\n ]\n}\n'
    with pytest.raises(ParseError, match=r"plan\.json: not valid JSON at line 3, column \d+"):
        schedule_from_json(text, source="plan.json")


def test_bad_action_in_json_names_rank_and_position() -> None:
    text = json.dumps({"ranks": [["0F0", "0B0"], ["1F0", "1Q0"]]})
    with pytest.raises(ParseError) as info:
        schedule_from_json(text, source="plan.json")
    assert "plan.json: rank 1, position 1: cannot parse action '1Q0'" in str(info.value)


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ([], "expected a JSON object, got list"),
        ({"format": "other", "ranks": []}, "'format' is 'other', expected 'pipesim-schedule'"),
        ({"ranks": "0F0"}, "'ranks' must be a list with one list of action strings per rank"),
        ({"ranks": [["0F0"]], "happens_before": [["0F0"]]}, "each happens_before entry"),
    ],
)
def test_malformed_json_structure(data: object, message: str) -> None:
    with pytest.raises(ParseError, match=message):
        schedule_from_json(json.dumps(data))


def test_bad_csv_cell_names_line_and_column() -> None:
    with pytest.raises(ParseError) as info:
        schedule_from_csv("0F0,0B0\n1F0,,1X0\n", source="plan.csv")
    assert "plan.csv: line 2, column 3: cannot parse action '1X0'" in str(info.value)


def test_empty_csv() -> None:
    with pytest.raises(ParseError, match="the CSV is empty"):
        schedule_from_csv("", source="plan.csv")


def test_csv_stage_on_two_ranks_names_the_file() -> None:
    with pytest.raises(ScheduleError, match=r"plan\.csv: stage 0 is placed on two ranks"):
        schedule_from_csv("0F0\n0B0\n", source="plan.csv")


def test_file_errors(tmp_path: Path) -> None:
    with pytest.raises(ParseError, match="cannot read schedule file"):
        load_schedule(tmp_path / "missing.json")
    (tmp_path / "s.txt").write_text("0F0\n")
    with pytest.raises(ParseError, match=r"unknown suffix '\.txt'; use \.json or \.csv"):
        load_schedule(tmp_path / "s.txt")
    (tmp_path / "latin.csv").write_bytes(b"0F0,\xff\n")
    with pytest.raises(ParseError, match="is not UTF-8 text"):
        load_schedule(tmp_path / "latin.csv")
    with pytest.raises(ParseError, match=r"use a \.json or \.csv suffix"):
        save_schedule(generate("gpipe", n_ranks=1, n_microbatches=1), tmp_path / "s.yaml")
    bad = tmp_path / "bad.json"
    bad.write_text('{"ranks": [["0F0"]\n')
    with pytest.raises(ParseError, match=r"bad\.json: not valid JSON at line 2"):
        load_schedule(bad)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"extra": 1}, "unknown keys ['extra']; valid keys are ['format', 'version', "),
        ({"rank": []}, "unknown keys ['rank'] (did you mean 'ranks'?)"),
        ({"version": 2}, "schedule format version 2, but this pipesim reads version 1"),
        ({"n_stages": 5}, "'n_stages' is 5, but its ranks and placement make 2"),
        ({"n_ranks": 3}, "'n_ranks' is 3, but its ranks and placement make 2"),
    ],
)
def test_a_key_the_file_gets_wrong_is_refused(change: dict[str, object], message: str) -> None:
    # What schedule_to_dict writes reads back; a key it does not write, or a count the
    # orders contradict, would otherwise be silently ignored.
    data = schedule_to_dict(generate("1f1b", n_ranks=2, n_microbatches=2))
    assert schedule_from_dict(data, source="s.json").n_stages == 2
    with pytest.raises(ParseError) as info:
        schedule_from_dict({**data, **change}, source="s.json")
    assert str(info.value).startswith("s.json: ") and message in str(info.value), info.value


# -- blank lines (pipesim.csv_rows) -------------------------------------------------------
def _cells(schedule: Schedule) -> list[list[str]]:
    return [[str(w) for w in order] for order in schedule.orders]


@pytest.mark.parametrize("tail", ["\n", "\n\n", "\n\n\n", "\n  \n", "\r\n\r\n"])
def test_csv_trailing_blank_lines_are_dropped(tail: str) -> None:
    s = schedule_from_csv("0F0,0B0\n1F0,1B0" + tail, source="plan.csv")
    assert _cells(s) == [["0F0", "0B0"], ["1F0", "1B0"]]
    assert s.placement == (0, 1)


def test_csv_blank_line_between_rows_is_an_idle_rank() -> None:
    # Hand-worked: rank 1 runs nothing, so stage 1 (the third row) is on rank 2.
    s = schedule_from_csv("0F0,0B0\n\n1F0,1B0\n\n", source="plan.csv")
    assert _cells(s) == [["0F0", "0B0"], [], ["1F0", "1B0"]]
    assert s.placement == (0, 2)
    assert schedule_from_csv(schedule_to_csv(s)) == s  # the idle rank round-trips


def test_csv_trailing_row_of_commas_is_a_rank() -> None:
    # torch writes a rank of idle (None) steps as commas: a row, not a blank line.
    s = schedule_from_csv("0F0,0B0\n,,\n")
    assert _cells(s) == [["0F0", "0B0"], []]


def test_csv_refuses_to_write_an_idle_last_rank() -> None:
    s = Schedule.from_orders([["0F0", "0B0"], []], name="tail")
    assert _cells(s) == [["0F0", "0B0"], []]
    with pytest.raises(PipesimError, match=r"last rank \(1\) runs no actions.*save it as \.json"):
        schedule_to_csv(s)
    assert schedule_from_json(schedule_to_json(s)) == s


def test_csv_rank_limit_counts_rows_not_trailing_blank_lines() -> None:
    assert schedule_from_csv("0F0,0B0\n" + "\n" * (MAX_RANKS + 5)).n_ranks == 1
    with pytest.raises(LimitError, match=r"plan\.csv: rows \(ranks\) 4097 is above"):
        schedule_from_csv("\n" * MAX_RANKS + "0F0,0B0\n", source="plan.csv")


@pytest.mark.torch
def test_blank_lines_read_and_written_as_torch_does(tmp_path: Path) -> None:
    """torch's own _dump_csv writes an idle rank as a blank line, and its _load_csv reads
    a blank line between rows as a rank with no actions: pipesim reads both the same."""
    schedules = pytest.importorskip("torch.distributed.pipelining.schedules")
    multi = schedules.PipelineScheduleMulti
    order = {
        r: [schedules._Action.from_str(c) for c in row]
        for r, row in enumerate([["0F0", "0B0"], [], ["1F0", "1B0"]])
    }
    path = tmp_path / "torch.csv"
    multi._dump_csv(SimpleNamespace(pipeline_order=order), str(path))
    text = path.read_text()
    assert text.splitlines()[1] == ""  # torch: the idle rank is a blank line
    theirs = SimpleNamespace(pipeline_order={}, _validate_and_set_stage_mapping=lambda o: None)
    multi._load_csv(theirs, str(path))
    ours = load_schedule(path)
    assert [[str(a) for a in row] for row in theirs.pipeline_order.values()] == _cells(ours)
    assert _cells(ours) == [["0F0", "0B0"], [], ["1F0", "1B0"]]
