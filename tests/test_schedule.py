"""Schedule: shape checks, placement inference, derived facts."""

from __future__ import annotations

import pytest

from pipesim.actions import Action, Op, parse_action
from pipesim.errors import ParseError, ScheduleError
from pipesim.schedule import Schedule, infer_placement


def test_from_orders_infers_placement_and_microbatches() -> None:
    s = Schedule.from_orders([["0F0", "2F0", "0F1", "2F1"], ["1F0", "3F0", "1F1", "3F1"]])
    assert s.placement == (0, 1, 0, 1)
    assert s.n_ranks == 2
    assert s.n_stages == 4
    assert s.n_microbatches == 2
    assert s.stages_of(0) == (0, 2)
    assert s.stages_of(1) == (1, 3)
    assert s.rank_of(3) == 1
    assert s.name == "custom"
    assert s.forward_only
    assert not s.split_backward


def test_from_orders_accepts_actions_and_strings() -> None:
    a = Action(stage=0, op=Op.F, microbatch=0)
    s = Schedule.from_orders([[a, "0B0"]])
    assert s.orders == ((a, parse_action("0B0")),)
    assert not s.forward_only


def test_split_backward_flag() -> None:
    s = Schedule.from_orders([["0F0", "0I0", "0W0"]])
    assert s.split_backward
    assert not s.forward_only


def test_actions_iterates_parts_of_overlaps_in_rank_order() -> None:
    s = Schedule.from_orders([["0F0", "(0F1;0B0)OVERLAP_F_B", "0B1"]])
    assert [str(a) for a in s.actions()] == ["0F0", "0F1", "0B0", "0B1"]


def test_explicit_placement_and_count_win() -> None:
    s = Schedule.from_orders([["0F0"], ["1F0"]], placement=[0, 1], n_microbatches=3)
    assert s.placement == (0, 1)
    assert s.n_microbatches == 3  # validate() will then report the missing micro-batches


def test_stage_on_two_ranks_is_refused() -> None:
    with pytest.raises(ScheduleError, match=r"stage 0 is placed on two ranks \(0 and 1\)"):
        Schedule.from_orders([["0F0"], ["0B0"]])


def test_stage_in_no_order_cannot_be_placed() -> None:
    with pytest.raises(ScheduleError, match=r"stages \[1\] appear in no rank's order"):
        infer_placement([[parse_action("0F0")], [parse_action("2F0")]])


def test_nothing_to_place() -> None:
    with pytest.raises(ScheduleError, match="no rank runs any action"):
        Schedule.from_orders([[], []])


def test_bad_action_string_is_a_parse_error() -> None:
    with pytest.raises(ParseError, match="'0X0'"):
        Schedule.from_orders([["0X0"]])


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"orders": (), "placement": (0,), "n_microbatches": 1}, "at least one rank"),
        ({"orders": ((),), "placement": (), "n_microbatches": 1}, "at least one stage"),
        ({"orders": ((),), "placement": (0,), "n_microbatches": 0}, "n_microbatches must be"),
        ({"orders": ((),), "placement": (0,), "n_microbatches": 1.5}, "got 1.5"),
        ({"orders": ((),), "placement": (0,), "n_microbatches": True}, "got True"),
        (
            {"orders": ((),), "placement": (1,), "n_microbatches": 1},
            r"stage 0 is placed on rank 1, but the schedule has 1 ranks",
        ),
        ({"orders": ((),), "placement": ("0",), "n_microbatches": 1}, "must be a rank index"),
        ({"orders": (("0F0",),), "placement": (0,), "n_microbatches": 1}, "not an action"),
    ],
)
def test_constructor_shape_checks(kwargs: dict[str, object], message: str) -> None:
    with pytest.raises(ScheduleError, match=message):
        Schedule(**kwargs)  # type: ignore[arg-type]


def test_schedule_is_a_frozen_value() -> None:
    a = Schedule.from_orders([["0F0", "0B0"]])
    b = Schedule.from_orders([["0F0", "0B0"]])
    assert a == b
    assert hash(a) == hash(b)
    with pytest.raises(AttributeError):
        a.name = "x"  # type: ignore[misc]


def test_numpy_integers_are_sizes_and_indices() -> None:
    np = pytest.importorskip("numpy")  # the verify extra brings numpy; pipesim never imports it
    from pipesim.actions import Action, Op
    from pipesim.schedules import generate

    expected = generate("1f1b", n_ranks=2, n_microbatches=4)
    assert generate("1f1b", n_ranks=np.int64(2), n_microbatches=np.int32(4)) == expected
    action = Action(stage=np.int64(1), op=Op.F, microbatch=np.uint16(3))
    assert action == Action(stage=1, op=Op.F, microbatch=3) and type(action.stage) is int
    rebuilt = Schedule.from_orders(
        [list(o) for o in expected.orders],
        placement=np.array([0, 1]),
        n_microbatches=np.int64(4),
    )
    assert rebuilt.placement == (0, 1) and rebuilt.n_microbatches == 4
    assert all(type(r) is int for r in rebuilt.placement)
