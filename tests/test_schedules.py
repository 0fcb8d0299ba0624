"""Built-in schedule generators and the registry: orders, rules, refusals."""

from __future__ import annotations

import pytest

from pipesim.actions import Op
from pipesim.errors import ScheduleError, UnknownNameError
from pipesim.graph import validate
from pipesim.schedules import generate, get_spec, schedule_names
from pipesim.schedules.interleaved import schedule_table


def orders_as_text(schedule: object) -> list[list[str]]:
    return [[str(w) for w in order] for order in schedule.orders]  # type: ignore[attr-defined]


def test_registry_names_and_specs() -> None:
    # The four families of the core, in this order, ahead of any registered later.
    assert schedule_names()[:4] == ("sequential", "gpipe", "1f1b", "interleaved-1f1b")
    assert len(set(schedule_names())) == len(schedule_names())
    for name in schedule_names():
        spec = get_spec(name)
        assert spec.name == name
        assert spec.summary and spec.rules and spec.source
    assert get_spec("interleaved-1f1b").default_virtual == 2
    assert get_spec("interleaved-1f1b").options == ("group_size",)
    assert {"sequential", "gpipe"} <= {n for n in schedule_names() if get_spec(n).forward_only}
    assert not get_spec("1f1b").forward_only


def test_unknown_name_lists_the_valid_ones() -> None:
    with pytest.raises(UnknownNameError) as info:
        generate("chimera-x", n_ranks=2, n_microbatches=2)
    message = str(info.value)
    assert message.startswith("unknown schedule 'chimera-x'")
    for name in schedule_names():
        assert name in message
    assert isinstance(info.value, LookupError)


# -- every generator's output is valid ---------------------------------------------------
@pytest.mark.parametrize("name", ["sequential", "gpipe", "1f1b"])
@pytest.mark.parametrize("p", [1, 2, 3, 5])
@pytest.mark.parametrize("m", [1, 2, 4, 7])
def test_generated_schedules_validate(name: str, p: int, m: int) -> None:
    s = generate(name, n_ranks=p, n_microbatches=m)
    assert (s.name, s.n_ranks, s.n_stages, s.n_microbatches) == (name, p, p, m)
    assert s.placement == tuple(range(p))
    assert sum(1 for _ in s.actions()) == 2 * p * m
    validate(s)


@pytest.mark.parametrize("name", ["sequential", "gpipe"])
@pytest.mark.parametrize(("p", "m"), [(1, 1), (2, 4), (4, 3)])
def test_forward_only_variants(name: str, p: int, m: int) -> None:
    s = generate(name, n_ranks=p, n_microbatches=m, forward_only=True)
    assert s.forward_only
    assert all(a.op is Op.F for a in s.actions())
    assert sum(1 for _ in s.actions()) == p * m
    validate(s)


@pytest.mark.parametrize(
    ("p", "v", "m", "n"),
    [
        (2, 2, 4, 2),
        (2, 2, 5, 3),
        (4, 2, 8, 4),
        (4, 3, 12, 4),
        (3, 2, 7, 4),
        (4, 2, 10, 5),
        (2, 1, 3, 3),
        (1, 3, 2, 1),
    ],
)
def test_interleaved_validates(p: int, v: int, m: int, n: int) -> None:
    s = generate(
        "interleaved-1f1b", n_ranks=p, n_microbatches=m, virtual=v, options={"group_size": n}
    )
    assert (s.n_ranks, s.n_stages, s.n_microbatches) == (p, p * v, m)
    # Stage c*p + r is chunk c of rank r (Megatron's layout).
    assert s.placement == tuple(stage % p for stage in range(p * v))
    validate(s)


# -- the orders themselves ---------------------------------------------------------------
def test_gpipe_order() -> None:
    assert orders_as_text(generate("gpipe", n_ranks=2, n_microbatches=3)) == [
        ["0F0", "0F1", "0F2", "0B0", "0B1", "0B2"],
        ["1F0", "1F1", "1F2", "1B0", "1B1", "1B2"],
    ]


def test_1f1b_order_warmup_steady_cooldown() -> None:
    # Rank r: p-r-1 warm-up forwards, then F/B pairs, then the remaining backwards.
    assert orders_as_text(generate("1f1b", n_ranks=3, n_microbatches=4)) == [
        ["0F0", "0F1", "0F2", "0B0", "0F3", "0B1", "0B2", "0B3"],
        ["1F0", "1F1", "1B0", "1F2", "1B1", "1F3", "1B2", "1B3"],
        ["2F0", "2B0", "2F1", "2B1", "2F2", "2B2", "2F3", "2B3"],
    ]


@pytest.mark.parametrize(("p", "m"), [(4, 2), (5, 1), (3, 3), (4, 9)])
def test_1f1b_warmup_is_capped_by_m(p: int, m: int) -> None:
    s = generate("1f1b", n_ranks=p, n_microbatches=m)
    for rank, order in enumerate(s.orders):
        ops = [a.op for a in order]
        # min(p-r-1, m) warm-up forwards, plus the forward of the first F/B pair if any is left.
        assert ops.index(Op.B) == min(p - rank, m)
        assert ops.count(Op.F) == ops.count(Op.B) == m


def test_sequential_order_and_constraints() -> None:
    s = generate("sequential", n_ranks=2, n_microbatches=2)
    assert orders_as_text(s) == [["0F0", "0B0", "0F1", "0B1"], ["1F0", "1B0", "1F1", "1B1"]]
    assert s.happens_before == ()
    f = generate("sequential", n_ranks=3, n_microbatches=3, forward_only=True)
    assert [(str(a), str(b)) for a, b in f.happens_before] == [("2F0", "0F1"), ("2F1", "0F2")]


def test_megatron_table_pp2_vp2_group3_m5() -> None:
    # Megatron-LM get_schedule_table for PP=2, VP=2, microbatch_group_size_per_vp_stage=3,
    # 5 micro-batches: micro-batches 0 1 2 0 1 2 3 4 3 4 on chunks 0 0 0 1 1 1 0 0 1 1.
    table = schedule_table(5, 2, 3)
    assert [mb for mb, _ in table] == [0, 1, 2, 0, 1, 2, 3, 4, 3, 4]
    assert [chunk for _, chunk in table] == [0, 0, 0, 1, 1, 1, 0, 0, 1, 1]
    s = generate(
        "interleaved-1f1b", n_ranks=2, n_microbatches=5, virtual=2, options={"group_size": 3}
    )
    for rank, order in enumerate(s.orders):
        forwards = [a for a in order if a.op is Op.F]
        backwards = [a for a in order if a.op is Op.B]
        assert [(a.microbatch, a.stage) for a in forwards] == [
            (mb, chunk * 2 + rank) for mb, chunk in table
        ]
        # Backwards walk the same table with the chunks reversed.
        assert [(a.microbatch, a.stage) for a in backwards] == [
            (mb, (1 - chunk) * 2 + rank) for mb, chunk in table
        ]
    # Rank r warms up with (p - r - 1) * 2 + (v - 1) * N forwards (Megatron's num_warmup).
    # Rank 0: 2 + 3 = 5 warm-up forwards, then 2F2 paired with the first backward 2B0.
    assert orders_as_text(s)[0][:7] == ["0F0", "0F1", "0F2", "2F0", "2F1", "2F2", "2B0"]
    # Rank 1: 0 + 3 = 3 warm-up forwards, then 3F0 paired with 3B0.
    assert orders_as_text(s)[1][:5] == ["1F0", "1F1", "1F2", "3F0", "3B0"]


def test_interleaved_with_one_chunk_is_1f1b() -> None:
    for p, m in [(2, 2), (3, 5), (4, 8), (4, 9)]:
        a = generate(
            "interleaved-1f1b", n_ranks=p, n_microbatches=m, virtual=1, options={"group_size": m}
        )
        b = generate("1f1b", n_ranks=p, n_microbatches=m)
        assert a.orders == b.orders
        assert a.placement == b.placement


# -- refusals ---------------------------------------------------------------------------
@pytest.mark.parametrize("name", ["sequential", "gpipe", "1f1b", "interleaved-1f1b"])
@pytest.mark.parametrize("field", ["n_ranks", "n_microbatches"])
@pytest.mark.parametrize("value", [0, -1, 1.5, True, "2"])
def test_counts_must_be_whole_positive_numbers(name: str, field: str, value: object) -> None:
    kwargs: dict[str, object] = {"n_ranks": 2, "n_microbatches": 4, field: value}
    with pytest.raises(ScheduleError, match=f"{field} must be a whole number >= 1, got"):
        generate(name, **kwargs)  # type: ignore[arg-type]


@pytest.mark.parametrize("name", ["sequential", "gpipe", "1f1b"])
def test_one_stage_per_rank_schedules_refuse_virtual(name: str) -> None:
    with pytest.raises(ScheduleError, match=f"'{name}' holds one stage per rank, got virtual=2"):
        generate(name, n_ranks=2, n_microbatches=2, virtual=2)


@pytest.mark.parametrize("name", ["1f1b", "interleaved-1f1b"])
def test_training_only_schedules_refuse_forward_only(name: str) -> None:
    with pytest.raises(ScheduleError, match=f"'{name}' has no forward-only variant.*gpipe"):
        generate(name, n_ranks=2, n_microbatches=2, forward_only=True)


def test_unknown_option_is_refused() -> None:
    with pytest.raises(ScheduleError, match=r"'gpipe' takes no option \['group_size'\]"):
        generate("gpipe", n_ranks=2, n_microbatches=2, options={"group_size": 2})
    with pytest.raises(ScheduleError, match="its options: group_size"):
        generate("interleaved-1f1b", n_ranks=2, n_microbatches=2, options={"chunks": 2})


def megatron_rules_hold(p: int, m: int, n: int) -> bool:
    return p <= n <= m and (m % n == 0 or m % n >= p)


@pytest.mark.parametrize("p", [1, 2, 3, 4])
@pytest.mark.parametrize("m", [1, 2, 3, 4, 5, 6, 7, 8, 9])
def test_interleaved_refuses_exactly_when_megatron_does(p: int, m: int) -> None:
    for n in range(1, 10):
        if megatron_rules_hold(p, m, n):
            generate("interleaved-1f1b", n_ranks=p, n_microbatches=m, options={"group_size": n})
        else:
            with pytest.raises(ScheduleError, match="interleaved-1f1b needs"):
                generate("interleaved-1f1b", n_ranks=p, n_microbatches=m, options={"group_size": n})


def test_interleaved_refusal_messages() -> None:
    with pytest.raises(ScheduleError) as info:
        generate("interleaved-1f1b", n_ranks=4, n_microbatches=2)
    assert "ranks <= group size <= micro-batches" in str(info.value)
    assert "ranks=4, group size=4, micro-batches=2" in str(info.value)
    assert "use at least 4 micro-batches" in str(info.value)
    with pytest.raises(ScheduleError) as info:
        generate("interleaved-1f1b", n_ranks=4, n_microbatches=9)
    message = str(info.value)
    assert "9 mod 4 = 1 < 4" in message
    assert "multiple of 4 (e.g. 8 or 12)" in message
    with pytest.raises(ScheduleError, match="group size=2"):
        generate("interleaved-1f1b", n_ranks=3, n_microbatches=6, options={"group_size": 2})
    with pytest.raises(ScheduleError, match="virtual must be a whole number >= 1, got 0"):
        generate("interleaved-1f1b", n_ranks=2, n_microbatches=2, virtual=0)


# -- every registered family, including those added after the core ---------------------------
SIZES = [(1, 1, None), (2, 4, None), (3, 6, None), (4, 8, None), (4, 8, 2), (2, 6, 3), (4, 12, 3)]


@pytest.mark.parametrize("name", schedule_names())
def test_every_registered_schedule_validates_and_meets_its_critical_path(name: str) -> None:
    from pipesim.costs import CostModel
    from pipesim.engine import simulate
    from pipesim.graph import critical_path

    costs = CostModel.uniform(forward=2, backward=3, input_grad=2, weight_grad=1)
    made = 0
    for p, m, v in SIZES:
        for forward_only in (False, True) if get_spec(name).forward_only else (False,):
            try:
                s = generate(
                    name, n_ranks=p, n_microbatches=m, virtual=v, forward_only=forward_only
                )
            except ScheduleError:
                continue  # outside the family's rules
            made += 1
            validate(s)
            assert s.name == name
            assert (s.n_ranks, s.n_microbatches) == (p, m)
            assert simulate(s, costs=costs).metrics.makespan == critical_path(s, costs=costs).length
    assert made, f"none of {SIZES} suits {name!r}"
