"""Actions: torch-style spelling, full-match parsing, overlapped pairs."""

from __future__ import annotations

import pytest

from pipesim.actions import Action, Op, Overlap, parse_action
from pipesim.errors import ParseError


@pytest.mark.parametrize(
    ("text", "stage", "op", "microbatch"),
    [
        ("0F0", 0, Op.F, 0),
        ("0F3", 0, Op.F, 3),
        ("2I1", 2, Op.I, 1),
        ("12W7", 12, Op.W, 7),
        ("3B10", 3, Op.B, 10),
    ],
)
def test_parse_simple_action(text: str, stage: int, op: Op, microbatch: int) -> None:
    action = parse_action(text)
    assert action == Action(stage=stage, op=op, microbatch=microbatch)
    assert str(action) == text


@pytest.mark.parametrize(
    "text",
    [
        "",
        " 0F3",
        "0F3 ",
        "0F3x",
        "x0F3",
        "0f3",
        "F3",
        "0F",
        "0X3",
        "-1F0",
        "0F-1",
        "0F3;1B0",
        "(0F3)OVERLAP_F_B",
        "(0F3;1X0)OVERLAP_F_B",
        "(0F3;1B0)",
        "0 F 3",
    ],
)
def test_parse_is_a_full_match(text: str) -> None:
    with pytest.raises(ParseError) as info:
        parse_action(text)
    # The message quotes the offending text so the user can find it.
    assert repr(text) in str(info.value) or "overlapped" in str(info.value)


def test_parse_error_explains_the_spelling() -> None:
    with pytest.raises(ParseError, match=r"cannot parse action '0Q1'.*\{stage\}\{op\}"):
        parse_action("0Q1")


def test_parse_refuses_non_strings() -> None:
    with pytest.raises(ParseError, match="must be a string"):
        parse_action(3)  # type: ignore[arg-type]


def test_overlap_round_trip() -> None:
    work = parse_action("(0F3;3B1)OVERLAP_F_B")
    assert isinstance(work, Overlap)
    assert work.parts == (
        Action(stage=0, op=Op.F, microbatch=3),
        Action(stage=3, op=Op.B, microbatch=1),
    )
    assert str(work) == "(0F3;3B1)OVERLAP_F_B"
    assert list(work) == list(work.parts)


def test_overlap_needs_two_simple_actions() -> None:
    with pytest.raises(ParseError, match="two or more simple actions"):
        Overlap(parts=(Action(stage=0, op=Op.F, microbatch=0),))


def test_simple_action_parts_is_itself() -> None:
    action = parse_action("1B2")
    assert action.parts == (action,)


@pytest.mark.parametrize("field", ["stage", "microbatch"])
@pytest.mark.parametrize("value", [-1, True, 1.0, "1"])
def test_action_fields_must_be_non_negative_ints(field: str, value: object) -> None:
    kwargs: dict[str, object] = {"stage": 0, "op": Op.F, "microbatch": 0, field: value}
    with pytest.raises(ParseError, match=f"action {field} must be a non-negative integer"):
        Action(**kwargs)  # type: ignore[arg-type]


def test_action_op_must_be_an_op() -> None:
    with pytest.raises(ParseError, match="one of F, B, I, W"):
        Action(stage=0, op="F", microbatch=0)  # type: ignore[arg-type]


def test_op_is_backward() -> None:
    assert [op.value for op in Op if op.is_backward] == ["B", "I", "W"]
    assert not Op.F.is_backward


def test_actions_are_hashable_value_objects() -> None:
    assert parse_action("1F2") == parse_action("1F2")
    assert len({parse_action("1F2"), parse_action("1F2"), parse_action("1B2")}) == 2
    with pytest.raises(AttributeError):
        parse_action("1F2").stage = 3  # type: ignore[misc]
