"""Calibration arithmetic on synthetic timings (pipesim.calibration, pipesim.scaling).

The fake clock is pipesim's own engine run with a known cost model: its trace,
stripped to what an executor times (compute only), is a synthetic measured run.
Calibration must recover the model exactly, and the prediction of any other
schedule from the recovered model must equal its synthetic measurement.
"""

from __future__ import annotations

from fractions import Fraction

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pipesim.actions import Op
from pipesim.calibration import (
    MeasuredStep,
    calibration_schedule,
    compute_only,
    costs_for,
    fit_costs,
    mean,
    measured_makespan,
    median,
    predict,
    replay,
    term_stability,
    unstable_terms,
)
from pipesim.costs import (
    CostModel,
    Link,
    LinkPair,
    Links,
    StageCost,
    costs_from_dict,
    costs_to_dict,
)
from pipesim.engine import simulate
from pipesim.errors import CostError
from pipesim.scaling import AffineCosts, costs_at_microbatch_size, scaling_meta
from pipesim.schedule import Schedule
from pipesim.schedules import generate, get_spec, schedule_names
from pipesim.trace import ActionRecord, Trace


def _truth(n_stages: int, *, seed: int = 0) -> CostModel:
    # Distinct values per stage and op, all far above the latency (see fit_costs' rule 3).
    stages = tuple(
        StageCost(
            forward=400 + 37 * s + seed,
            backward=900 + 11 * s,
            input_grad=300 + 29 * s,
            weight_grad=650 - 13 * s + seed,
            output_bytes=1024,
            activation_bytes=4096,
        )
        for s in range(n_stages)
    )
    link = Link(latency=17, send_overhead=9, receive_overhead=23)
    return CostModel(stages=stages, link=link, dispatch_overhead=5)


def _synthetic(schedule: Schedule, costs: CostModel) -> MeasuredStep:
    trace = simulate(schedule, costs=costs).trace
    return MeasuredStep(schedule=schedule, trace=compute_only(trace, schedule, costs))


def test_compute_only_strips_each_overhead_by_hand() -> None:
    """1F1B, 2 ranks, 1 micro-batch, F=10, B=20, latency 3, send 1, receive 4, dispatch 2:
    0F0's node is 0..13 (2 + 10 + 1), compute 2..12; arrives 16; 1F0 node 16..32,
    compute 22..32; 1B0 node 32..55, compute 34..54; arrives 58; 0B0 node 58..84,
    compute 64..84. Shifted by the first compute start (2)."""
    costs = CostModel.uniform(
        forward=10,
        backward=20,
        link=Link(latency=3, send_overhead=1, receive_overhead=4),
        dispatch_overhead=2,
    )
    schedule = generate("1f1b", n_ranks=2, n_microbatches=1)
    step = _synthetic(schedule, costs)
    spans = [(str(r.work), r.start, r.end) for r in step.trace.actions]
    assert spans == [("0F0", 0, 10), ("1F0", 20, 30), ("1B0", 32, 52), ("0B0", 62, 82)]
    assert measured_makespan(step.trace) == 82 == predict(schedule, costs)
    assert simulate(schedule, costs=costs).metrics.makespan == 84


def test_compute_only_strips_each_messages_own_link_overheads() -> None:
    """Per-pair links: 3 ranks, one to a node; rank 0 -> 1 is a link with send 1 and
    receive 4, 1 -> 2 (and back) one with send 5 and receive 7 (explicit pairs over the
    inter-node rule). Stripped of the overheads of each message's own link, every
    record is its compute alone: F 10, B 20 (the old rule took the default link's for
    every message, so the records came out 4 and 6 units off)."""
    near = Link(latency=3, send_overhead=1, receive_overhead=4)
    far = Link(latency=3, send_overhead=5, receive_overhead=7)
    links = Links(
        ranks_per_node=1,
        inter_node=near,
        pairs=(LinkPair(src=1, dst=2, link=far), LinkPair(src=2, dst=1, link=far)),
    )
    costs = CostModel.uniform(forward=10, backward=20, link=near, links=links)
    schedule = generate("1f1b", n_ranks=3, n_microbatches=2)
    trace = compute_only(simulate(schedule, costs=costs).trace, schedule, costs)
    for record in trace.actions:
        expected = 10 if record.work.parts[0].op is Op.F else 20
        assert record.end - record.start == expected, str(record.work)


def test_medians_keep_an_outlier_out() -> None:
    """A fake clock: 0F takes 10, 11, 10 and once 50 (a noisy neighbour); 1F 7 twice."""
    schedule = generate("gpipe", n_ranks=2, n_microbatches=4, forward_only=True)
    durations = {"0F": [10, 11, 10, 50], "1F": [7, 7, 7, 9]}
    records, clock = [], {0: 0, 1: 100}
    for rank, order in enumerate(schedule.orders):
        for k, work in enumerate(order):
            d = durations[f"{work.parts[0].stage}F"][k]
            records.append(
                ActionRecord(rank=rank, work=work, start=clock[rank], end=clock[rank] + d)
            )
            clock[rank] += d + 1
    fit = fit_costs(
        [MeasuredStep(schedule=schedule, trace=Trace(n_ranks=2, actions=tuple(records)))]
    )
    # medians: (10 + 11) / 2 -> 10.5 rounds to 10 (banker's), 7; a mean would give 20.25
    assert fit.costs.stage(0).forward == 10 and fit.costs.stage(1).forward == 7
    assert fit.samples["0F"] == 4
    assert median([10, 11, 10, 50]) == Fraction(21, 2)


def _one_rank_step(gaps: list[int]) -> MeasuredStep:
    """gpipe m=4 on one rank (no messages), F 10 and B 20, with ``gaps`` between them."""
    schedule = generate("gpipe", n_ranks=1, n_microbatches=4)
    records, clock = [], 0
    for k, work in enumerate(schedule.orders[0]):
        d = 10 if work.parts[0].op.value == "F" else 20
        records.append(ActionRecord(rank=0, work=work, start=clock, end=clock + d))
        clock += d + (gaps[k] if k < len(gaps) else 0)
    return MeasuredStep(schedule=schedule, trace=Trace(n_ranks=1, actions=tuple(records)))


def test_a_tail_every_step_shares_stays_in_the_overheads() -> None:
    """Three steps whose 7 gaps are each 1 six times and 8 once (a delivery that came
    late, in every step): the dispatch is each step's mean 14 / 7 = 2, not the median
    1, and the step predicted from the fit is then the measured one: 4*10 + 4*20 + 14 =
    134 (a median would predict 127)."""
    gaps = [1, 1, 1, 8, 1, 1, 1]
    steps = [_one_rank_step(gaps) for _ in range(3)]
    fit = fit_costs(steps)
    assert fit.costs.dispatch_overhead == 2 == mean(gaps) and median(gaps) == 1
    assert fit.samples["dispatch"] == 21 and fit.terms["dispatch"].steps == 3
    assert measured_makespan(steps[0].trace) == 134 == predict(steps[0].schedule, fit.costs)


def test_one_late_gap_or_one_slow_step_cannot_move_an_overhead() -> None:
    """Gaps of 1, except one of 50 (a late message): in one step of three, or among the
    7 of a single step, the dispatch stays 1 (a mean would say 3.3 and 8). A whole step
    slow by 30 per gap among three: still 1 (a mean: 11)."""
    quiet, late = [1] * 7, [1, 1, 1, 50, 1, 1, 1]
    assert (
        fit_costs(
            [_one_rank_step(quiet), _one_rank_step(late), _one_rank_step(quiet)]
        ).costs.dispatch_overhead
        == 1
    )
    assert fit_costs([_one_rank_step(late)]).costs.dispatch_overhead == 1
    assert mean(late) == 8 and mean(quiet * 2 + late) == Fraction(10, 3)
    slow = [_one_rank_step(quiet), _one_rank_step([31] * 7), _one_rank_step(quiet)]
    assert fit_costs(slow).costs.dispatch_overhead == 1


def test_term_stability_names_the_term_one_step_moves() -> None:
    """Dispatch gaps 1, 1 and 7 per step in three steps: leaving out the third moves the
    median of means from 1 to 1, leaving out a first from 1 to (1 + 7) / 2 = 4: a shift
    of 3, 300% of the figure, which unstable_terms names; F and B, the same in every
    step, do not move."""
    steps = [_one_rank_step([1] * 7), _one_rank_step([1] * 7), _one_rank_step([7] * 7)]
    fit = term_stability(steps, fit_costs(steps))
    assert fit.terms["dispatch"].value == 1 and fit.terms["dispatch"].step_shift == 3
    assert fit.terms["0F"].step_shift == 0 and fit.terms["0F"].samples == 12
    assert unstable_terms(fit.terms, min_samples=5) == {
        "dispatch": "leaving out one step moves it by 300%"
    }
    assert "fewer than 30" in unstable_terms(fit.terms, min_samples=30)["0F"]
    assert fit.terms["dispatch"].to_dict()["p90"] == 7


def test_mean_by_hand() -> None:
    assert mean([1, 2, 4]) == Fraction(7, 3) and mean([2, 4]) == 3
    # A pipesim error (the CLI prints it and exits 1), not a bare ValueError (a bug report).
    with pytest.raises(CostError, match="mean of no measured values"):
        mean([])


@pytest.mark.parametrize("name", ["1f1b", "gpipe", "zb-h1", "interleaved-1f1b", "dualpipev"])
def test_replay_of_a_synthetic_run_is_its_makespan(name: str) -> None:
    """Replaying a synthetic run with its own compute times and the true overheads gives
    exactly its measured span, for any schedule (each node's duration is what it was)."""
    spec = get_spec(name)
    target = generate(name, n_ranks=2, n_microbatches=8, virtual=spec.default_virtual or 1)
    truth = costs_for(target, {2: _truth(2), 4: _truth(4)})
    step = _synthetic(target, truth)
    assert replay(step, truth) == measured_makespan(step.trace)


def test_replay_follows_each_measured_duration() -> None:
    """gpipe, 1 rank, free overheads: the replay is the sum of the measured durations
    whatever the cost file says about compute (F 10, B 20 in the file; 3..10 measured)."""
    schedule = generate("gpipe", n_ranks=1, n_microbatches=4)
    records, clock = [], 0
    for k, work in enumerate(schedule.orders[0]):
        records.append(ActionRecord(rank=0, work=work, start=clock, end=clock + 3 + k))
        clock += 3 + k + 5  # gaps the model does not have: the replay leaves them out
    step = MeasuredStep(schedule=schedule, trace=Trace(n_ranks=1, actions=tuple(records)))
    costs = CostModel.uniform(forward=10, backward=20)
    assert replay(step, costs) == sum(3 + k for k in range(8)) == 52


def test_calibration_recovers_every_figure_exactly() -> None:
    truth = _truth(2)
    schedule = calibration_schedule(n_ranks=2, n_microbatches=4)
    fit = fit_costs([_synthetic(schedule, truth)], stage_bytes=truth.stages)
    assert fit.costs == truth
    assert fit.pair_links == {(0, 1): truth.link, (1, 0): truth.link}  # one link each way
    assert fit.assumed == ()
    assert min(fit.samples[k] for k in ("dispatch", "send_overhead", "receive_overhead")) > 0
    assert fit.samples["latency"] > 0


@pytest.mark.parametrize(("n_ranks", "virtual"), [(3, 1), (4, 2)])
def test_deeper_pipelines_are_recovered_too(n_ranks: int, virtual: int) -> None:
    """Middle stages take and send a message in every F, B and I."""
    truth = _truth(n_ranks * virtual)
    schedule = calibration_schedule(n_ranks=n_ranks, n_microbatches=2 * n_ranks, virtual=virtual)
    assert fit_costs([_synthetic(schedule, truth)], stage_bytes=truth.stages).costs == truth


def test_calibration_schedule_runs_every_op_and_is_no_registered_family() -> None:
    schedule = calibration_schedule(n_ranks=2, n_microbatches=4, virtual=2)
    ops = {(a.stage, a.op.value) for a in schedule.actions()}
    assert ops == {(s, op) for s in range(4) for op in "FBIW"}
    assert schedule.name not in schedule_names()
    assert str(schedule.orders[0][-1]) == "0W3"


def test_unmeasured_ops_are_filled_and_said() -> None:
    truth = _truth(2)
    fit = fit_costs([_synthetic(generate("1f1b", n_ranks=2, n_microbatches=4), truth)])
    assert fit.costs.stage(1).input_grad == truth.stage(1).backward // 2
    assert fit.assumed == ("stage 0: I = W = B / 2", "stage 1: I = W = B / 2")
    split = fit_costs([_synthetic(generate("zb-h1", n_ranks=2, n_microbatches=4), truth)])
    assert split.costs.stage(0).backward == truth.stage(0).input_grad + truth.stage(0).weight_grad


def _families_at_two_ranks() -> list[str]:
    return [n for n in schedule_names() if n != "sequential"]


@pytest.mark.parametrize("name", _families_at_two_ranks())
@pytest.mark.parametrize("n_microbatches", [4, 8, 16])
def test_prediction_of_a_synthetic_run_is_exact(name: str, n_microbatches: int) -> None:
    """Calibrate on the mixed-backward schedule at m=4 (one file per cut), then predict
    every registered family at m up to 4x from the files alone: exactly the measurement."""
    cuts = {}
    for virtual in (1, 2):
        truth = _truth(2 * virtual)
        schedule = calibration_schedule(n_ranks=2, n_microbatches=4, virtual=virtual)
        cuts[2 * virtual] = fit_costs([_synthetic(schedule, truth)], stage_bytes=truth.stages).costs
    spec = get_spec(name)
    virtual = spec.default_virtual if spec.default_virtual else 1
    target = generate(name, n_ranks=2, n_microbatches=n_microbatches, virtual=virtual)
    true_costs = costs_for(target, {2: _truth(2), 4: _truth(4)})
    measured = measured_makespan(_synthetic(target, true_costs).trace)
    assert predict(target, costs_for(target, cuts)) == measured


@settings(max_examples=40, deadline=None)
@given(
    forward=st.integers(200, 900),
    backward=st.integers(200, 900),
    split=st.integers(100, 800),
    latency=st.integers(0, 1500),
    send=st.integers(0, 40),
    receive=st.integers(0, 40),
    dispatch=st.integers(0, 40),
)
def test_random_models_are_recovered(
    forward: int, backward: int, split: int, latency: int, send: int, receive: int, dispatch: int
) -> None:
    truth = CostModel(
        stages=(
            StageCost(forward=forward, backward=backward, input_grad=split, weight_grad=backward),
            StageCost(
                forward=forward + 7,
                backward=backward + 3,
                input_grad=split + 1,
                weight_grad=5 + split,
            ),
        ),
        link=Link(latency=latency, send_overhead=send, receive_overhead=receive),
        dispatch_overhead=dispatch,
    )
    schedule = calibration_schedule(n_ranks=2, n_microbatches=4)
    assert fit_costs([_synthetic(schedule, truth)], stage_bytes=truth.stages).costs == truth


def test_steps_of_two_cuts_are_refused() -> None:
    steps = [
        _synthetic(generate("1f1b", n_ranks=2, n_microbatches=2), _truth(2)),
        _synthetic(generate("1f1b", n_ranks=3, n_microbatches=2), _truth(3)),
    ]
    with pytest.raises(ValueError, match=r"\[2, 3\] stages"):
        fit_costs(steps)


def test_a_trace_of_another_schedule_is_refused() -> None:
    step = _synthetic(generate("1f1b", n_ranks=2, n_microbatches=2), _truth(2))
    other = MeasuredStep(schedule=generate("zb-h1", n_ranks=2, n_microbatches=2), trace=step.trace)
    with pytest.raises(ValueError, match=r"no record of \['0I0'"):
        fit_costs([other])


def test_costs_for_a_missing_cut_names_the_fix() -> None:
    with pytest.raises(CostError, match="--virtual 2"):
        costs_for(generate("zbv", n_ranks=2, n_microbatches=4), {2: _truth(2)})


# -- micro-batch size: fixed overhead + cost per row --------------------------------------
def test_affine_scaling_by_hand() -> None:
    """F = 3.6 ms at 1 row and 4.7 ms at 2 rows: fixed 2.5 ms + 1.1 ms per row, so 8 rows
    take 11.3 ms; activations scale with the rows, parameters do not."""
    one = CostModel(
        stages=(StageCost(forward=3600, activation_bytes=100, param_bytes=7),),
        link=Link(latency=10, send_overhead=4),
        dispatch_overhead=30,
    )
    two = CostModel(
        stages=(StageCost(forward=4700, activation_bytes=200, param_bytes=7),),
        link=Link(latency=12, send_overhead=4),
        dispatch_overhead=30,
    )
    at8 = AffineCosts.fit(one, two, sizes=(1, 2)).at(8)
    assert at8.stage(0).forward == 11300
    assert at8.stage(0).activation_bytes == 800 and at8.stage(0).param_bytes == 7
    assert at8.link.latency == 24 and at8.link.send_overhead == 4 and at8.dispatch_overhead == 30


def test_affine_scaling_never_goes_below_zero() -> None:
    one = CostModel.uniform(forward=10)
    two = CostModel.uniform(forward=100)
    assert AffineCosts.fit(one, two, sizes=(8, 16)).at(1).stage(0).forward == 0


def test_a_cost_file_carries_its_second_size() -> None:
    one = CostModel.uniform(forward=10, backward=20)
    two = CostModel.uniform(forward=16, backward=36)
    meta = {"microbatch_size": 4, "microbatch_scaling": scaling_meta(two, microbatch_size=8)}
    data = costs_to_dict(one) | {"meta": meta}
    loaded = costs_from_dict(data)
    at12 = costs_at_microbatch_size(loaded, data["meta"], 12)
    assert (at12.stage(0).forward, at12.stage(0).backward) == (22, 52)
    assert costs_at_microbatch_size(loaded, {"microbatch_size": 4}, 4) == loaded
    with pytest.raises(CostError, match="calibrate at a second size"):
        costs_at_microbatch_size(loaded, {"microbatch_size": 4}, 8)
    with pytest.raises(CostError, match="two different micro-batch sizes"):
        AffineCosts.fit(one, two, sizes=(4, 4))


def test_bad_calibration_input_is_a_pipesim_error_naming_the_fix() -> None:
    # user input, not an internal fault: the CLI reports a CostError as an error with
    # its message and exit 1 (a bare ValueError would read as a pipesim bug)
    with pytest.raises(CostError, match="at least one measured step"):
        fit_costs([])
    schedule = generate("1f1b", n_ranks=2, n_microbatches=2)
    other = generate("1f1b", n_ranks=2, n_microbatches=1)
    costs = CostModel.uniform(forward=1, backward=2)
    partial = compute_only(simulate(other, costs=costs).trace, other, costs)
    with pytest.raises(CostError, match=r"has no record of .* give the trace of that"):
        fit_costs([MeasuredStep(schedule=schedule, trace=partial)])
