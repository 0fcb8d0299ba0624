"""Every reader, fed random bytes, random JSON and random Python values, either returns a
value or raises a PipesimError: never another exception, whatever the input."""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from fractions import Fraction
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pipesim.actions import parse_action
from pipesim.costs import CostModel, Link, StageCost, costs_from_dict, load_costs
from pipesim.errors import PipesimError
from pipesim.exact import to_count, to_time
from pipesim.files import parse_json
from pipesim.graph import validate
from pipesim.plan.hardware import accelerator_from_dict, get_accelerator, load_accelerator
from pipesim.plan.model import get_model, load_model, model_from_dict
from pipesim.schedule import Schedule
from pipesim.schedule_io import (
    load_schedule,
    schedule_from_csv,
    schedule_from_dict,
    schedule_from_json,
    schedule_to_dict,
)
from pipesim.schedules import generate

FUZZ = settings(max_examples=150, suppress_health_check=[HealthCheck.function_scoped_fixture])

# Numbers a careless or hostile user writes: huge, tiny, negative, non-finite, long.
NUMBERS = st.one_of(
    st.integers(),
    st.integers(min_value=-(10**60), max_value=10**60),
    st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from([0, -1, 10**25, 2**63, 1e300, 5e-324, -0.0]),
    st.sampled_from([41, 5000]).map(lambda digits: 10**digits),  # repr() of 10**5000 fails
)
TEXT = st.one_of(
    st.text(max_size=12),
    st.sampled_from(
        [
            "0F0",
            "1B0",
            "0I0",
            "0W0",
            "(0F1;1B0)OVERLAP_F_B",
            "0F\u0663",
            "1e5000",
            "3/2",
            "nan",
            "-inf",
            "1e99999999",
            "9" * 5000,
            "0F" + "1" * 30,
            "\ufeff0F0",
        ]
    ),
)
SCALARS = st.one_of(st.none(), st.booleans(), NUMBERS, TEXT)
JSON_VALUES = st.recursive(
    SCALARS,
    lambda inner: st.one_of(
        st.lists(inner, max_size=5),
        st.dictionaries(st.one_of(TEXT, st.text(max_size=8)), inner, max_size=5),
    ),
    max_leaves=25,
)


def _dumps(value: Any) -> str:
    """JSON text of ``value``; json.dumps itself refuses ints past 4300 digits, so those
    are spelled by hand (the readers must refuse them, not the test)."""
    try:
        return json.dumps(value, allow_nan=True)
    except ValueError:
        return "[" + "9" * 5000 + "]"


def _mutations(base: dict[str, Any]) -> st.SearchStrategy[Any]:
    """``base`` with one key replaced by a random value, or deleted: near-valid inputs
    reach deeper checks than random ones do."""
    keys = sorted(base)
    return st.one_of(
        st.builds(lambda k, v: {**base, k: v}, st.sampled_from(keys), JSON_VALUES),
        st.builds(lambda k: {x: y for x, y in base.items() if x != k}, st.sampled_from(keys)),
        st.builds(lambda k, v: {**base, k: v}, st.text(max_size=6), JSON_VALUES),
    )


def _clean(call: Callable[[], object]) -> None:
    """Run ``call``: a value or a PipesimError are both fine; nothing else is."""
    try:
        call()
    except PipesimError as exc:
        assert str(exc), "an error must say what is wrong"


_SCHEDULE = schedule_to_dict(generate("zb-h1", n_ranks=2, n_microbatches=2))
_SCHEDULE["happens_before"] = [["0F0", "1F0"]]
_COSTS = {
    "stages": [{"forward": 1, "backward": "3/2", "activation_bytes": 10}],
    "link": {"latency": 0.5, "bandwidth_bytes_per_s": 1e9, "max_concurrent": 1},
    "memory_capacity_bytes": 80e9,
    "overlap_comm": True,
}
_MODEL = get_model("llama2-7b").to_dict()
_ACCELERATOR = get_accelerator("h100-sxm").to_dict()


# -- Python API ------------------------------------------------------------------------
@pytest.mark.slow
@FUZZ
@given(st.one_of(JSON_VALUES, _mutations(_SCHEDULE)))
def test_schedule_from_dict(data: Any) -> None:
    def read() -> None:
        schedule = schedule_from_dict(data)
        validate(schedule)

    _clean(read)


@pytest.mark.slow
@FUZZ
@given(st.one_of(JSON_VALUES, _mutations(_COSTS)))
def test_costs_from_dict(data: Any) -> None:
    _clean(lambda: costs_from_dict(data))


@FUZZ
@given(st.one_of(JSON_VALUES, _mutations(_MODEL)))
def test_model_from_dict(data: Any) -> None:
    _clean(lambda: model_from_dict(data))


@FUZZ
@given(st.one_of(JSON_VALUES, _mutations(_ACCELERATOR)))
def test_accelerator_from_dict(data: Any) -> None:
    _clean(lambda: accelerator_from_dict(data))


@FUZZ
@given(st.one_of(JSON_VALUES, st.text(max_size=40)))
def test_parse_action(text: Any) -> None:
    _clean(lambda: parse_action(text))


@FUZZ
@given(JSON_VALUES, st.sampled_from(["forward", "backward", "overlap", "activation_bytes"]))
def test_stage_cost_constructor(value: Any, field: str) -> None:
    _clean(lambda: StageCost(**{field: value}))


@FUZZ
@given(JSON_VALUES, st.sampled_from(["latency", "bandwidth_bytes_per_s", "max_concurrent"]))
def test_link_and_cost_model_constructors(value: Any, field: str) -> None:
    _clean(lambda: Link(**{field: value}))
    _clean(lambda: CostModel(stages=value))
    _clean(lambda: CostModel(memory_capacity_bytes=value))


@FUZZ
@given(JSON_VALUES)
def test_exact_numbers(value: Any) -> None:
    _clean(lambda: to_time(value, name="t"))
    _clean(lambda: to_count(value, name="n"))


@FUZZ
@given(
    st.lists(
        st.lists(
            st.one_of(TEXT, st.from_regex(r"[0-9]{1,3}[FBIW][0-9]{1,3}", fullmatch=True)),
            max_size=6,
        ),
        max_size=5,
    ),
    JSON_VALUES,
    JSON_VALUES,
)
@pytest.mark.slow
def test_schedule_constructor(orders: Any, placement: Any, n_microbatches: Any) -> None:
    def build() -> None:
        schedule = Schedule.from_orders(orders, placement=placement, n_microbatches=n_microbatches)
        validate(schedule)

    _clean(build)


# -- text and files ---------------------------------------------------------------------
@FUZZ
@given(st.one_of(st.text(max_size=200), JSON_VALUES.map(lambda v: _dumps(v)[:300])))
def test_json_and_csv_text(text: str) -> None:
    _clean(lambda: parse_json(text, source="t.json"))
    _clean(lambda: schedule_from_json(text, source="t.json"))
    _clean(lambda: schedule_from_csv(text, source="t.csv"))


_READERS: dict[str, Callable[[Path], object]] = {
    "schedule.json": load_schedule,
    "schedule.csv": load_schedule,
    "costs.json": load_costs,
    "model.json": load_model,
    "accelerator.json": load_accelerator,
}


@FUZZ
@given(
    st.one_of(
        st.binary(max_size=300),
        JSON_VALUES.map(lambda v: _dumps(v).encode()),
        _mutations(_SCHEDULE).map(lambda v: _dumps(v).encode()),
        _mutations(_COSTS).map(lambda v: _dumps(v).encode()),
    ),
    st.sampled_from(sorted(_READERS)),
)
@pytest.mark.slow
def test_file_readers_take_random_bytes(tmp_path: Path, data: bytes, name: str) -> None:
    path = tmp_path / name
    path.write_bytes(data)
    _clean(lambda: _READERS[name](path))


@pytest.mark.parametrize("name", sorted(_READERS))
def test_file_readers_take_hostile_files(tmp_path: Path, name: str) -> None:
    hostile = [
        b"[" * 200_000 + b"]" * 200_000,  # deeper than Python's recursion limit
        b'{"a": ' + b"9" * 5000 + b"}",  # past int()'s 4300-digit limit
        b'{"a": 1e5000, "b": -1e-5000}',
        b'{"ranks": [["0F0"]], "ranks": [["0F0"]]}',
        b"\x00" * 1000,
        b"0F0," + b"x" * 200_000 + b"\n",  # one cell over csv's field size limit
        b"\xef\xbb\xbf" + b"\xff\xfe" * 10,
        b'{"stage": {"forward": NaN}}',
    ]
    for data in hostile:
        path = tmp_path / name
        path.write_bytes(data)
        _clean(lambda: _READERS[name](path))  # noqa: B023 (called at once)


def test_fuzz_oracle_sanity() -> None:
    # _clean lets a non-PipesimError through: the property tests above can fail.
    with pytest.raises(ZeroDivisionError):
        _clean(lambda: 1 / 0)
    assert math.isfinite(float(Fraction(1, 3)))
