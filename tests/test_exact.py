"""Exact times: ints where integral, Fractions otherwise, floats read by their decimal spelling."""

from __future__ import annotations

from fractions import Fraction

import pytest

from pipesim.errors import CostError
from pipesim.exact import as_number, to_count, to_time


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (0, 0),
        (3, 3),
        (Fraction(6, 4), Fraction(3, 2)),
        (Fraction(4, 2), 2),
        ("1.5", Fraction(3, 2)),
        ("3/2", Fraction(3, 2)),
        (" 2 ", 2),
        (0.1, Fraction(1, 10)),
        (4.0, 4),
        (1e-3, Fraction(1, 1000)),
    ],
)
def test_to_time_is_exact(value: object, expected: object) -> None:
    result = to_time(value, name="forward")
    assert result == expected
    assert type(result) is type(expected)


def test_float_drift_is_gone() -> None:
    # 0.1 + 0.2 != 0.3 in floats; read exactly, the sum is exact.
    assert to_time(0.1, name="a") + to_time(0.2, name="b") == to_time(0.3, name="c")


@pytest.mark.parametrize(
    ("value", "message"),
    [
        (float("nan"), "finite"),
        (float("inf"), "finite"),
        (float("-inf"), "finite"),
        ("nan", "finite"),
        ("NaN", "finite"),
        ("inf", "finite"),
        ("-Infinity", "finite"),
        (-1, "non-negative"),
        ("-0.5", "non-negative"),
        (Fraction(-1, 3), "non-negative"),
        ("abc", "a number like 2, 1.5 or 3/2"),
        ("1/0", "a number like"),
        (True, "must be a number"),
        (None, "must be a number"),
        ([1], "must be a number"),
    ],
)
def test_to_time_refusals_name_the_value(value: object, message: str) -> None:
    with pytest.raises(CostError, match=message) as info:
        to_time(value, name="backward")
    assert str(info.value).startswith("backward must be")
    assert repr(value) in str(info.value)


def test_to_time_allow_zero() -> None:
    assert to_time(0, name="x") == 0
    with pytest.raises(CostError, match="x must be positive, got 0"):
        to_time(0, name="x", allow_zero=False)


@pytest.mark.parametrize(("value", "expected"), [(0, 0), (7, 7), (3.0, 3), ("12", 12), ("+5", 5)])
def test_to_count(value: object, expected: int) -> None:
    assert to_count(value, name="n") == expected


@pytest.mark.parametrize("value", [1.5, "1.5", True, None, "abc"])
def test_to_count_refuses_non_whole_numbers(value: object) -> None:
    with pytest.raises(CostError, match="n must be a whole number"):
        to_count(value, name="n")


def test_to_count_minimum() -> None:
    with pytest.raises(CostError, match="n must be at least 1, got 0"):
        to_count(0, name="n", minimum=1)
    for negative in (-2, "-2"):
        with pytest.raises(CostError, match="n must be at least 0, got -2"):
            to_count(negative, name="n")


def test_as_number() -> None:
    assert as_number(3) == 3
    assert type(as_number(Fraction(6, 3))) is int
    assert as_number(Fraction(1, 4)) == 0.25
    assert type(as_number(Fraction(1, 3))) is float


def test_numpy_scalars_and_decimals_are_numbers() -> None:
    np = pytest.importorskip("numpy")  # the verify extra brings numpy; pipesim never imports it
    from decimal import Decimal

    assert to_time(np.int64(3), name="t") == 3 and type(to_time(np.int64(3), name="t")) is int
    assert to_time(np.float64(0.1), name="t") == Fraction(1, 10)
    assert to_time(np.float32(0.1), name="t") == Fraction(1, 10)  # float32's shortest spelling
    assert to_time(np.float16(1.5), name="t") == Fraction(3, 2)
    assert to_time(Decimal("2.25"), name="t") == Fraction(9, 4)
    assert to_count(np.uint8(200), name="n") == 200
    assert to_count(np.float64(8e9), name="n") == 8_000_000_000
    with pytest.raises(CostError, match="finite"):
        to_time(np.float32("nan"), name="t")
    with pytest.raises(CostError, match="finite"):
        to_time(Decimal("Infinity"), name="t")
    with pytest.raises(CostError, match="MAX_NUMBER_DIGITS"):
        to_time(Decimal("1e99999999"), name="t")
    with pytest.raises(CostError, match="non-negative"):
        to_time(np.int32(-1), name="t")
