"""Every documented limit of pipesim.limits: the largest value it allows is accepted, the
next one is refused at once, and the message names the limit."""

from __future__ import annotations

import json
import math
from fractions import Fraction
from pathlib import Path

import pytest

from pipesim import limits
from pipesim.actions import Action, Op, parse_action
from pipesim.cli import main
from pipesim.costs import CostModel, Link, StageCost
from pipesim.errors import CostError, LimitError, ParseError, PipesimError, PlanError
from pipesim.exact import to_count, to_time
from pipesim.files import parse_json, read_text
from pipesim.limits import check_actions
from pipesim.plan.model import get_model, model_from_dict
from pipesim.schedule import Schedule
from pipesim.schedule_io import schedule_from_csv
from pipesim.schedules import generate


def usage_error(capsys: pytest.CaptureFixture[str], *argv: str) -> str:
    """Run ``pipesim argv``, expect argparse's usage error (exit 2), return stderr."""
    with pytest.raises(SystemExit) as info:
        main(list(argv))
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("pipesim: error: ") and "Traceback" not in err
    return err


def test_the_documented_values() -> None:
    # docs/guide/limits.md and the module docstring state these numbers.
    assert limits.MAX_RANKS == 4_096
    assert limits.MAX_STAGES == 65_536
    assert limits.MAX_MICROBATCHES == 1_000_000
    assert limits.MAX_ACTIONS == 10_000_000
    assert limits.MAX_SWEEP_ACTIONS == 1_000_000_000
    assert limits.MAX_LAYERS == 1_024
    assert limits.MAX_DEVICES == 1_000_000
    assert limits.MAX_INDEX_DIGITS == 9
    assert limits.MAX_NUMBER_DIGITS == 40
    assert limits.MAX_DENOMINATOR_DIGITS == 100
    assert limits.MAX_FILE_BYTES == 256 * 2**20
    assert limits.MAX_JSON_DEPTH == 64
    page = Path(__file__).parent.parent / "docs" / "guide" / "limits.md"
    text = page.read_text(encoding="utf-8")
    for name in limits.__all__:
        if name.startswith("MAX_"):
            assert name in text, f"document {name} in docs/guide/limits.md"


# -- ranks ------------------------------------------------------------------------------
def test_max_ranks() -> None:
    at_limit = Schedule.from_orders([[f"{r}F0"] for r in range(limits.MAX_RANKS)], n_microbatches=1)
    assert at_limit.n_ranks == limits.MAX_RANKS
    with pytest.raises(
        LimitError, match=r"ranks 4097 is above pipesim's limit of 4096 \(MAX_RANKS"
    ):
        Schedule.from_orders([[f"{r}F0"] for r in range(limits.MAX_RANKS + 1)])
    with pytest.raises(LimitError, match="MAX_RANKS"):
        generate("gpipe", n_ranks=limits.MAX_RANKS + 1, n_microbatches=1, forward_only=True)
    csv = "\n".join(f"{r}F0" for r in range(limits.MAX_RANKS + 1)) + "\n"
    with pytest.raises(LimitError, match="MAX_RANKS"):
        schedule_from_csv(csv)


def test_max_ranks_on_the_command_line(capsys: pytest.CaptureFixture[str]) -> None:
    err = usage_error(capsys, "simulate", "gpipe", "-p", "4097", "-m", "1")
    assert "from 1 to 4096 (MAX_RANKS in pipesim.limits), got 4097" in err


# -- stages -----------------------------------------------------------------------------
def test_max_stages() -> None:
    assert Action(stage=limits.MAX_STAGES - 1, op=Op.F, microbatch=0).stage == 65_535
    with pytest.raises(LimitError, match=r"action stage 65536 is above .* 65535 \(MAX_STAGES"):
        Action(stage=limits.MAX_STAGES, op=Op.F, microbatch=0)
    # A stage 10^25 (the two-line CSV) is refused by its digits, before int().
    with pytest.raises(ParseError, match=r"line 1, column 2: .* 26 digits.*MAX_INDEX_DIGITS"):
        schedule_from_csv("0F0,10000000000000000000000000F0\n")
    with pytest.raises(LimitError, match=r"virtual 65537 is above .*MAX_STAGES"):
        generate("looped-bfs", n_ranks=1, virtual=limits.MAX_STAGES + 1, n_microbatches=1)
    with pytest.raises(LimitError, match=r"stages \(n_ranks x virtual\) 65540 .*MAX_STAGES"):
        generate("looped-bfs", n_ranks=4, virtual=limits.MAX_STAGES // 4 + 1, n_microbatches=1)


# -- micro-batches ----------------------------------------------------------------------
def test_max_microbatches(capsys: pytest.CaptureFixture[str]) -> None:
    assert Action(stage=0, op=Op.F, microbatch=limits.MAX_MICROBATCHES - 1).microbatch == 999_999
    with pytest.raises(LimitError, match="MAX_MICROBATCHES"):
        Action(stage=0, op=Op.F, microbatch=limits.MAX_MICROBATCHES)
    # n_microbatches at the limit is a valid value (validation then lists what is missing) ...
    big = Schedule.from_orders([["0F0"]], n_microbatches=limits.MAX_MICROBATCHES)
    assert big.n_microbatches == 1_000_000
    with pytest.raises(LimitError, match=r"n_microbatches 1000001 .*MAX_MICROBATCHES"):
        Schedule.from_orders([["0F0"]], n_microbatches=limits.MAX_MICROBATCHES + 1)
    err = usage_error(capsys, "simulate", "1f1b", "-p", "2", "-m", "100000000000")
    assert "(MAX_MICROBATCHES in pipesim.limits), got 100000000000" in err


# -- actions ----------------------------------------------------------------------------
def test_max_actions() -> None:
    check_actions(limits.MAX_ACTIONS, what="x")
    with pytest.raises(LimitError, match=r"at least 10000001 actions, .* \(MAX_ACTIONS"):
        check_actions(limits.MAX_ACTIONS + 1, what="x")
    # 11 ranks x 10^6 forwards: refused from the sizes, before a single action is built
    with pytest.raises(LimitError, match=r"gpipe with 11 ranks.* 11000000 actions.*MAX_ACTIONS"):
        generate("gpipe", n_ranks=11, n_microbatches=10**6, forward_only=True)
    # Training: F and B of each stage and micro-batch; dualpipe's two copies halve it.
    with pytest.raises(LimitError, match=r"at least 10000008 actions"):
        generate("1f1b", n_ranks=6, n_microbatches=833_334)
    with pytest.raises(LimitError, match=r"dualpipe .* at least 10240000 actions"):
        generate("dualpipe", n_ranks=64, n_microbatches=80_000)


# -- layers and devices -----------------------------------------------------------------
def test_max_layers_and_devices(capsys: pytest.CaptureFixture[str]) -> None:
    fields = get_model("llama2-7b").to_dict()
    assert model_from_dict({**fields, "n_layers": limits.MAX_LAYERS}).n_layers == 1024
    with pytest.raises(PlanError, match=r"n_layers 1025 .*MAX_LAYERS"):
        model_from_dict({**fields, "n_layers": limits.MAX_LAYERS + 1})
    err = usage_error(capsys, "plan", "--model", "llama2-7b", "--layers", "1025")
    assert "MAX_LAYERS" in err
    err = usage_error(capsys, "plan", "--model", "llama2-7b", "--devices", "1000001")
    assert "from 1 to 1000000 (MAX_DEVICES in pipesim.limits)" in err


# -- digits -----------------------------------------------------------------------------
def test_max_index_digits() -> None:
    assert parse_action("000000001F000000002") == Action(stage=1, op=Op.F, microbatch=2)
    with pytest.raises(ParseError, match=r"stage index has 10 digits.*limit of 9 \(MAX_INDEX"):
        parse_action("0000000001F0")
    with pytest.raises(ParseError, match=r"micro-batch index has 5000 digits.*MAX_INDEX_DIGITS"):
        parse_action("0F" + "1" * 5000)


def test_max_number_digits() -> None:
    largest = 10**limits.MAX_NUMBER_DIGITS - 1  # 40 nines
    assert to_time(largest, name="t") == largest
    assert to_time(Fraction(1, largest), name="t") == Fraction(1, largest)
    assert to_time("1e39", name="t") == 10**39
    assert to_time("1e-39", name="t") == Fraction(1, 10**39)
    assert to_count("9" * 40, name="n") == largest
    for value in (10**40, Fraction(1, 10**40), "1e40", "1e-40", "1" * 41, 1e300, 5e-324):
        with pytest.raises(CostError, match=r"more than 40 digits \(MAX_NUMBER_DIGITS"):
            to_time(value, name="forward")
    for value in ("1e99999999", "1e5000", "9" * 5000, 10**5000):
        with pytest.raises(CostError, match="MAX_NUMBER_DIGITS"):
            to_time(value, name="forward")
    with pytest.raises(CostError, match="MAX_NUMBER_DIGITS"):
        to_count("1e41", name="activation_bytes")
    # JSON integers: 40 digits are read, 41 refused with their position
    assert parse_json(f"[{largest}]", source="f.json") == [largest]
    with pytest.raises(ParseError, match=r"f.json: the number '1{41}' at line 1, column 2 has 41"):
        parse_json("[" + "1" * 41 + "]", source="f.json")


def test_max_denominator_digits() -> None:
    # Three coprime 34-digit denominators: each value is within MAX_NUMBER_DIGITS, their
    # common denominator (their product, 101 digits) is not.
    denominators = [3**70, 7**40, 11**32]
    assert [len(str(d)) for d in denominators] == [34, 34, 34]
    assert len(str(math.lcm(*denominators))) == 101
    two = CostModel(stages=tuple(StageCost(forward=Fraction(1, d)) for d in denominators[:2]))
    assert two.stages[1].forward == Fraction(1, 7**40)
    with pytest.raises(CostError, match=r"common denominator of .*100 digits \(MAX_DENOM"):
        CostModel(stages=tuple(StageCost(forward=Fraction(1, d)) for d in denominators))
    # bytes / bandwidth: the bandwidth's numerator is a denominator too
    with pytest.raises(CostError, match="MAX_DENOMINATOR_DIGITS"):
        CostModel(
            stages=tuple(StageCost(forward=Fraction(1, d)) for d in denominators[:2]),
            link=Link(bandwidth_bytes_per_s=11**32),
        )
    # and so are the overheads a rank adds per message and per unit of work
    with pytest.raises(CostError, match="MAX_DENOMINATOR_DIGITS"):
        CostModel(
            stages=tuple(StageCost(forward=Fraction(1, d)) for d in denominators[:2]),
            link=Link(send_overhead=Fraction(1, 11**32)),
        )
    with pytest.raises(CostError, match="MAX_DENOMINATOR_DIGITS"):
        CostModel(
            stages=tuple(StageCost(forward=Fraction(1, d)) for d in denominators[:2]),
            dispatch_overhead=Fraction(1, 11**32),
        )


# -- files ------------------------------------------------------------------------------
def test_max_file_bytes(tmp_path: Path) -> None:
    path = tmp_path / "huge.json"
    with path.open("wb") as file:  # sparse: no disk space used
        file.truncate(limits.MAX_FILE_BYTES + 1)
    with pytest.raises(LimitError, match=r"larger than pipesim's limit of 268435456 bytes"):
        read_text(path, what="schedule")
    small = tmp_path / "small.json"
    small.write_text("[1]", encoding="utf-8")
    assert read_text(small, what="schedule") == "[1]"


def test_max_json_depth() -> None:
    depth = limits.MAX_JSON_DEPTH
    assert parse_json("[" * depth + "]" * depth, source="d.json") is not None
    assert parse_json('{"a":' * depth + "1" + "}" * depth, source="d.json") is not None
    with pytest.raises(ParseError, match=r"nested more than 64 levels deep at line 1, column 65"):
        parse_json("[" * (depth + 1) + "]" * (depth + 1), source="d.json")
    # far beyond Python's own recursion limit: still the same clean refusal
    with pytest.raises(ParseError, match="MAX_JSON_DEPTH"):
        parse_json("[" * 100_000 + "]" * 100_000, source="d.json")
    # brackets inside strings do not count
    assert parse_json(json.dumps(["[" * 1000]), source="d.json") == ["[" * 1000]


def test_limit_errors_are_pipesim_errors() -> None:
    assert issubclass(LimitError, PipesimError) and issubclass(LimitError, ValueError)
