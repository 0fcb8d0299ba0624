"""The cost model: stage costs, links, broadcast, durations, message sizes, files."""

from __future__ import annotations

import json
from fractions import Fraction
from pathlib import Path

import pytest

from pipesim.actions import parse_action
from pipesim.costs import CostModel, Link, StageCost, costs_from_dict, costs_to_dict, load_costs
from pipesim.errors import CostError, ParseError


def test_stage_cost_defaults_and_durations() -> None:
    cost = StageCost()
    assert (cost.forward, cost.backward, cost.input_grad, cost.weight_grad) == (1, 2, 1, 1)
    durations = {op: cost.duration(parse_action(f"0{op}0").op) for op in "FBIW"}  # type: ignore[union-attr]
    assert durations == {"F": 1, "B": 2, "I": 1, "W": 1}


def test_stage_cost_reads_exact_times() -> None:
    cost = StageCost(forward="1.5", backward=0.1, input_grad=Fraction(2, 3), weight_grad="3/4")
    assert cost.forward == Fraction(3, 2)
    assert cost.backward == Fraction(1, 10)
    assert cost.input_grad == Fraction(2, 3)
    assert cost.weight_grad == Fraction(3, 4)


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("forward", float("nan"), "forward must be finite"),
        ("backward", float("inf"), "backward must be finite"),
        ("input_grad", -1, "input_grad must be non-negative"),
        ("weight_grad", "soon", "weight_grad must be a number like"),
        ("overlap", "-2", "overlap must be non-negative"),
        ("activation_bytes", 1.5, "activation_bytes: 1.5 is not a whole number of bytes"),
        ("output_bytes", -3, "output_bytes must be at least 0 bytes, got -3"),
        ("param_bytes", "x", "param_bytes: cannot read 'x' as a size; give a whole number"),
        ("param_bytes", "2 GB/s", "param_bytes: unknown unit 'GB/s' in '2 GB/s'"),
    ],
)
def test_stage_cost_refusals(field: str, value: object, message: str) -> None:
    with pytest.raises(CostError, match=message):
        StageCost(**{field: value})  # type: ignore[arg-type]


def test_weight_grad_bytes_may_exceed_activation_bytes() -> None:
    # What W holds after I includes the output gradients I computes (Qi et al. 2024,
    # Table 1's M_W), which F never stored: it may be more than the activations, e.g.
    # under full recomputation. Negative bytes are still refused.
    assert StageCost(activation_bytes=10, weight_grad_bytes=11).weight_grad_bytes == 11
    with pytest.raises(CostError, match="weight_grad_bytes must be at least 0 bytes, got -1"):
        StageCost(activation_bytes=10, weight_grad_bytes=-1)


def test_weight_grad_bytes_default_is_32_of_34() -> None:
    # Qi et al. 2024, Table 1: M_W = 32sbh of M_B = 34sbh (+ 5as^2b, not stored with
    # flash attention) per transformer layer; floor, so 34 bytes keep exactly 32.
    assert StageCost(activation_bytes=34).weight_grad_bytes == 32
    assert StageCost(activation_bytes=100).weight_grad_bytes == 94  # 1600 // 17
    assert StageCost().weight_grad_bytes == 0


def test_link_times() -> None:
    link = Link(latency=Fraction(1, 2), bandwidth_bytes_per_s=4)
    assert link.occupancy(10) == Fraction(5, 2)
    assert link.occupancy(8) == 2 and type(link.occupancy(8)) is int
    assert link.occupancy(0) == 0
    assert link.transfer_time(10) == 3
    assert not link.is_free
    free = Link()
    assert free.is_free and free.transfer_time(10**9) == 0
    assert not Link(latency=1).is_free


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"bandwidth_bytes_per_s": 0}, "link bandwidth must be positive, got 0"),
        ({"bandwidth_bytes_per_s": -5}, "link bandwidth must be positive"),
        ({"latency": float("nan")}, "link latency must be finite"),
        ({"max_concurrent": 0}, "max_concurrent must be at least 1, got 0"),
    ],
)
def test_link_refusals(kwargs: dict[str, object], message: str) -> None:
    with pytest.raises(CostError, match=message):
        Link(**kwargs)  # type: ignore[arg-type]


def test_for_stages_broadcasts_one_entry() -> None:
    costs = CostModel.uniform(forward=3, activation_bytes=5)
    sized = costs.for_stages(4)
    assert len(sized.stages) == 4
    assert all(s == StageCost(forward=3, activation_bytes=5) for s in sized.stages)
    assert costs.stage(3).forward == 3  # a single entry serves every stage


def test_for_stages_refuses_wrong_length() -> None:
    costs = CostModel(stages=(StageCost(), StageCost(forward=2), StageCost()))
    assert costs.for_stages(3) is costs
    with pytest.raises(CostError) as info:
        costs.for_stages(4)
    assert "describes 3 stages but the schedule has 4" in str(info.value)
    assert "one value per stage or a single value for all" in str(info.value)


def test_cost_model_refusals() -> None:
    with pytest.raises(CostError, match="stages must be a non-empty list of StageCost"):
        CostModel(stages=())
    with pytest.raises(CostError, match="memory_capacity_bytes must be at least 1"):
        CostModel(memory_capacity_bytes=0)


def test_duration_of_overlapped_work() -> None:
    pair = parse_action("(0F1;1B0)OVERLAP_F_B")
    costs = CostModel(stages=(StageCost(forward=2), StageCost(backward=5)))
    assert costs.duration(pair) == 7  # the sum of the parts by default
    explicit = CostModel(stages=(StageCost(forward=2, overlap=4), StageCost(backward=5)))
    assert explicit.duration(pair) == 4


# -- files ---------------------------------------------------------------------------------
def test_dict_round_trip() -> None:
    costs = CostModel(
        stages=(
            StageCost(forward=Fraction(1, 3), activation_bytes=10, weight_grad_bytes=4),
            StageCost(backward=5, overlap=Fraction(7, 2), output_bytes=64, param_bytes=9),
        ),
        link=Link(latency=Fraction(1, 10), bandwidth_bytes_per_s=1000, max_concurrent=2),
        memory_capacity_bytes=1 << 30,
        blocking_sends=True,
    )
    data = costs_to_dict(costs)
    assert data["stages"][0]["forward"] == "1/3"
    assert json.loads(json.dumps(data)) == data
    assert costs_from_dict(json.loads(json.dumps(data))) == costs


def test_uniform_file(tmp_path: Path) -> None:
    path = tmp_path / "costs.json"
    path.write_text(
        json.dumps({"stage": {"forward": "1.5", "activation_bytes": 8}, "link": {"latency": 2}})
    )
    costs = load_costs(path)
    assert costs.stages == (StageCost(forward=Fraction(3, 2), activation_bytes=8),)
    assert costs.link == Link(latency=2)
    assert costs.blocking_sends is False


@pytest.mark.parametrize(
    ("data", "blocking"),
    [
        ({"blocking_sends": True}, True),
        ({"blocking_sends": False}, False),
        ({"overlap_comm": False}, True),  # the old spelling, the opposite
        ({"overlap_comm": True}, False),
        ({"overlap_comm": False, "blocking_sends": True}, True),  # both, agreeing
        ({}, False),
    ],
)
def test_blocking_sends_and_its_old_spelling(data: dict[str, bool], blocking: bool) -> None:
    costs = costs_from_dict({"stage": {}, **data})
    assert costs.blocking_sends is blocking
    assert costs.overlap_comm is not blocking  # the old API name reads the opposite
    assert costs_to_dict(costs)["blocking_sends"] is blocking


@pytest.mark.parametrize(
    ("data", "error", "message"),
    [
        ([], ParseError, "costs.json: expected a JSON object, got list"),
        ({"stage": {}, "stages": [{}]}, ParseError, "give exactly one of 'stage'"),
        ({}, ParseError, "give exactly one of 'stage'"),
        ({"stages": []}, ParseError, "'stages' must be a non-empty list"),
        ({"stage": {}, "speed": 3}, ParseError, r"unknown keys \['speed'\]"),
        ({"stage": {"fwd": 1}}, ParseError, r"costs.json: stage: unknown fields \['fwd'\]"),
        ({"stages": [{}, {"forward": -1}]}, CostError, "costs.json: stage 1: forward must be"),
        ({"stage": {}, "link": {"bandwidth_bytes_per_s": 0}}, CostError, "link: link bandwidth"),
        ({"stage": {}, "blocking_sends": "yes"}, ParseError, "blocking_sends must be true or"),
        ({"stage": {}, "overlap_comm": "yes"}, ParseError, "overlap_comm must be true or false"),
        (
            {"stage": {}, "blocking_sends": True, "overlap_comm": True},
            ParseError,
            "blocking_sends true and its old spelling overlap_comm true disagree",
        ),
        ({"stage": {}, "memory_capacity_bytes": -1}, CostError, "memory_capacity_bytes"),
        ({"stage": 3}, ParseError, "stage: expected an object"),
    ],
)
def test_bad_cost_files(tmp_path: Path, data: object, error: type, message: str) -> None:
    path = tmp_path / "costs.json"
    path.write_text(json.dumps(data))
    with pytest.raises(error, match=message):
        load_costs(path)


def test_cost_file_syntax_error_names_the_line(tmp_path: Path) -> None:
    path = tmp_path / "costs.json"
    path.write_text('{\n  "stage": {"forward": 1,}\n}\n')
    with pytest.raises(ParseError, match=r"costs\.json: not valid JSON at line 2, column \d+"):
        load_costs(path)
    with pytest.raises(ParseError, match="cannot read cost file"):
        load_costs(tmp_path / "absent.json")
