"""DualPipe and DualPipeV: rules, overlapped F&B units, DeepSeek's bubble and memory
figures, two model copies, file round trips."""

from __future__ import annotations

import itertools

import pytest

from pipesim.actions import Overlap, parse_action
from pipesim.cli import main
from pipesim.costs import CostModel
from pipesim.engine import simulate
from pipesim.errors import PipesimError, ScheduleError
from pipesim.graph import critical_path, validate
from pipesim.schedule import Schedule
from pipesim.schedule_io import (
    schedule_from_csv,
    schedule_from_json,
    schedule_to_csv,
    schedule_to_json,
)
from pipesim.schedules import generate


def chunk_costs(f: int, i: int, w: int, fb: int | None) -> CostModel:
    """Uniform chunks: B = I + W, F&B = ``fb`` (None: F + B), W frees 1 of 3 bytes."""
    return CostModel.uniform(
        forward=f,
        backward=i + w,
        input_grad=i,
        weight_grad=w,
        overlap=fb,
        activation_bytes=3,
        weight_grad_bytes=1,
    )


# -- rules -----------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("p", "m", "fix"),
    [(3, 6, "even number of ranks"), (4, 7, "use 8"), (4, 6, "use 8"), (2, 2, "use 4")],
)
def test_dualpipe_rules(p: int, m: int, fix: str) -> None:
    with pytest.raises(ScheduleError, match=fix):
        generate("dualpipe", n_ranks=p, n_microbatches=m)


def test_dualpipev_rules() -> None:
    with pytest.raises(ScheduleError, match=r"at least as many micro-batches as stages.*use 6"):
        generate("dualpipev", n_ranks=3, n_microbatches=5)
    with pytest.raises(ScheduleError, match="virtual=3"):
        generate("dualpipev", n_ranks=3, n_microbatches=6, virtual=3)
    generate("dualpipev", n_ranks=3, n_microbatches=6)  # odd ranks are fine in a V


# -- structure --------------------------------------------------------------------------
@pytest.mark.parametrize("p", [2, 4, 6, 8])
def test_dualpipe_is_two_copies_fed_from_both_ends(p: int) -> None:
    m = 2 * p + 2
    schedule = generate("dualpipe", n_ranks=p, n_microbatches=m)
    validate(schedule)
    assert schedule.n_copies == 2 and schedule.n_stages == 2 * p
    assert schedule.placement == tuple(range(p)) + tuple(reversed(range(p)))
    half = m // 2
    for action in schedule.actions():
        copy = action.stage // p
        assert (action.microbatch >= half) == (copy == 1)
    # Rank p-1 starts with copy 1's first stage (stage p), which reads the input.
    assert str(schedule.orders[p - 1][0]) == f"{p}F{half}"
    overlapped = [w for order in schedule.orders for w in order if isinstance(w, Overlap)]
    assert overlapped and all([a.op.value for a in w.parts] == ["F", "B"] for w in overlapped)


def test_dualpipe_copy_boundaries_carry_no_data() -> None:
    # Stage p-1 (copy 0's last) and stage p (copy 1's first) share rank p-1 but no data:
    # both ends start at time 0, and copy 1's first stage waits for nothing.
    schedule = generate("dualpipe", n_ranks=4, n_microbatches=8)
    sim = simulate(schedule, costs=chunk_costs(1, 1, 1, None))
    start = {str(r.work): r.start for r in sim.trace.actions}
    assert start["0F0"] == 0 and start["4F4"] == 0
    assert start["3F0"] == 3  # copy 0 reaches rank 3 after three forwards
    assert start["7F4"] == 3  # and copy 1 reaches rank 0 likewise


# -- DeepSeek's figures -------------------------------------------------------------------
@pytest.mark.parametrize(("f", "w"), [(1, 1), (2, 1), (2, 2), (3, 1), (4, 3)])
@pytest.mark.parametrize("p", [2, 4, 6, 8])
def test_dualpipe_bubble_formula_when_i_equals_f_and_w_at_most_f(f: int, w: int, p: int) -> None:
    # DeepSeek-V3 report, table 2: bubble (p/2 - 1)(F&B + B - 3W) per rank, holding when
    # the input-gradient pass costs a forward (I = F, so B = F + W), W <= F, and the
    # overlapped pair costs between max(F, B) and F + B.
    i = f
    b = i + w
    for fb in (max(f, b), (max(f, b) + f + b) // 2, f + b):
        for m in (2 * p, 3 * p):
            schedule = generate("dualpipe", n_ranks=p, n_microbatches=m)
            costs = chunk_costs(f, i, w, fb)
            sim = simulate(schedule, costs=costs)
            bubble = max(sim.metrics.makespan - r.busy for r in sim.metrics.ranks)
            assert bubble == (p // 2 - 1) * (fb + b - 3 * w)
            assert sim.metrics.makespan == critical_path(schedule, costs=costs).length
            # At most p + 1 micro-batch chunks of activation on a rank.
            assert max(r.peak_inflight for r in sim.metrics.ranks) == p + 1


def test_dualpipe_bubble_outside_the_condition() -> None:
    # I = 3, F = 1 (I != F): the table's formula no longer describes the schedule,
    # which keeps its order; its makespan is still the longest path of its graph.
    p, m = 6, 18
    f, i, w, fb = 1, 3, 1, 5
    b = i + w
    schedule = generate("dualpipe", n_ranks=p, n_microbatches=m)
    costs = chunk_costs(f, i, w, fb)
    sim = simulate(schedule, costs=costs)
    bubble = max(sim.metrics.makespan - r.busy for r in sim.metrics.ranks)
    assert bubble != (p // 2 - 1) * (fb + b - 3 * w)
    assert sim.metrics.makespan == critical_path(schedule, costs=costs).length


def test_overlap_duration_is_its_own_parameter_defaulting_to_the_sum() -> None:
    pair = parse_action("(0F3;3B1)OVERLAP_F_B")
    assert isinstance(pair, Overlap)
    assert chunk_costs(2, 2, 1, None).for_stages(4).duration(pair) == 2 + 3
    assert chunk_costs(2, 2, 1, 4).for_stages(4).duration(pair) == 4


@pytest.mark.parametrize("p", [2, 3, 4, 6])
def test_dualpipev_valid_memory_and_longest_path(p: int) -> None:
    for m in (2 * p, 3 * p + 1):
        schedule = generate("dualpipev", n_ranks=p, n_microbatches=m)
        validate(schedule)
        costs = chunk_costs(2, 2, 1, 4)
        sim = simulate(schedule, costs=costs)
        assert sim.metrics.makespan == critical_path(schedule, costs=costs).length
        # DualPipeV, like DualPipe, holds at most 2p + 1 chunks of its 2p-stage V.
        assert max(r.peak_inflight for r in sim.metrics.ranks) <= 2 * p + 1


# -- compound actions in files ------------------------------------------------------------
def test_overlap_round_trips_through_json_and_csv() -> None:
    schedule = generate("dualpipev", n_ranks=2, n_microbatches=4)
    text = schedule_to_csv(schedule)
    assert "(0F3;3B1)OVERLAP_F_B" in text
    assert schedule_from_csv(text, name="dualpipev") == schedule
    assert schedule_from_json(schedule_to_json(schedule)) == schedule


def test_dualpipe_copies_survive_json_but_not_torch_csv() -> None:
    schedule = generate("dualpipe", n_ranks=4, n_microbatches=8)
    again = schedule_from_json(schedule_to_json(schedule))
    assert again == schedule and again.n_copies == 2
    with pytest.raises(PipesimError, match="n_copies"):
        schedule_to_csv(schedule)


def test_n_copies_validation_names_the_copy() -> None:
    # Micro-batch 1 belongs to copy 1 (stages 2..3), not to stage 0.
    bad = Schedule.from_orders(
        [["0F1", "0B1", "3F0", "3B0"], ["1F1", "1B1", "2F0", "2B0"]], n_copies=2
    )
    with pytest.raises(ScheduleError, match=r"processes micro-batches 0\.\.0, not 1"):
        validate(bad)
    with pytest.raises(ScheduleError, match="n_copies=2 must divide"):
        Schedule.from_orders([["0F0", "0B0"]], n_copies=2)


def test_overlapped_pairs_of_every_size_parse() -> None:
    for stages in itertools.islice(itertools.permutations(range(4), 2), 5):
        text = f"({stages[0]}F1;{stages[1]}B2)OVERLAP_F_B"
        assert str(parse_action(text)) == text


# -- CLI ----------------------------------------------------------------------------------
@pytest.mark.parametrize("name", ["dualpipe", "dualpipev"])
def test_cli_simulate_accepts_bidirectional_schedules(
    name: str, capsys: pytest.CaptureFixture[str]
) -> None:
    status = main(
        ["simulate", name, "--stages", "4", "--microbatches", "8", "--overlap-time", "2", "--json"]
    )
    assert status == 0
    assert f'"schedule": "{name}"' in capsys.readouterr().out


def test_cli_dualpipe_odd_ranks_is_a_clean_error(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["simulate", "dualpipe", "--stages", "3", "--microbatches", "6"]) == 1
    assert "even number of ranks" in capsys.readouterr().err
