"""Rendezvous sends (``CostModel.send_mode``): hand-worked steps, files, fits, refusals."""

from __future__ import annotations

import json
from dataclasses import replace
from fractions import Fraction
from pathlib import Path

import pytest

from pipesim.calibration import MeasuredStep, compute_only, fit_costs, measured_makespan, replay
from pipesim.comms import lower_comms, receive_posts
from pipesim.costs import CostModel, Link, StageCost, costs_from_dict, costs_to_dict
from pipesim.engine import simulate
from pipesim.errors import CostError
from pipesim.graph import comms_path, critical_path
from pipesim.plan import evaluate, quick_step
from pipesim.plan.fastsim import compile_schedule
from pipesim.plan.fasttrace import fast_trace
from pipesim.schedules import generate
from pipesim.step.structure import step_structure
from pipesim.synth.problem import make_problem
from pipesim.trace import Trace


def _gpipe_costs(send_mode: str, handshake: int) -> CostModel:
    # Stage 1's forward (15) is slower than stage 0's (10): rank 0 sends each activation
    # before rank 1 has posted its receive (after its previous forward).
    return CostModel(
        stages=(StageCost(forward=10, backward=20), StageCost(forward=15, backward=20)),
        send_mode=send_mode,
        link=Link(handshake=handshake),
    )


def _starts(schedule_name: str, m: int, costs: CostModel) -> dict[str, int]:
    sim = simulate(generate(schedule_name, n_ranks=2, n_microbatches=m), costs=costs)
    return {str(r.work): r.start for r in sim.trace.actions}


def test_receive_posts_follow_the_lowering() -> None:
    # GPipe p=2 m=2, lowered: rank 0 posts 1B0's gradient after 0F1 and 1B1's after 0B0;
    # rank 1 posts 0F0's activation before anything, 0F1's after 1F0.
    structure = step_structure(generate("gpipe", n_ranks=2, n_microbatches=2))
    posted = {
        str(m.producer): (None if node < 0 else str(structure.works[node]))
        for m, node in zip(structure.messages, receive_posts(structure), strict=True)
    }
    assert posted == {"1B0": "0F1", "1B1": "0B0", "0F0": None, "0F1": "1F0"}


def test_a_waiting_sender_answers_at_once() -> None:
    # GPipe p=2 m=2. Eager: 0F0 0-10, 0F1 10-20; 1F0 10-25, 1F1 25-40 (0F1's output there
    # since 20), 1B0 40-60, 1B1 60-80; 0B0 60-80, 0B1 80-100.
    eager = _starts("gpipe", 2, _gpipe_costs("eager", 4))
    assert (eager["1F1"], eager["0B1"] + 20) == (25, 100)
    # Rendezvous: 0F1's activation was sent at 20, its receive posted after 1F0, at 25,
    # when rank 0 waits for 1B0 (inside no node): it answers at once, as eager sends.
    assert _starts("gpipe", 2, _gpipe_costs("rendezvous", 4)) == eager


def test_a_computing_sender_answers_at_its_node_end_or_a_handshake_later() -> None:
    # GPipe p=2 m=3: 0F0 0-10, 0F1 10-20, 0F2 20-30; 1F0 10-25. 0F1's activation was sent
    # at 20, its receive posted at 25 (after 1F0) while rank 0 runs 0F2 (20-30).
    # Handshake 4: answered at 25 + 4 = 29 (before 0F2 ends). 1F1 29-44; 0F2's receive
    # posted at 44, rank 0 waits for 1B0: at once. 1F2 44-59, 1B0 59-79, 1B1 79-99,
    # 1B2 99-119; 0B0 79-99 (its receive posted at 30, first), 0B1 99-119 (posted after
    # 0B0 at 99 as 1B1 is sent at 99: a tie pays nothing), 0B2 119-139.
    starts = _starts("gpipe", 3, _gpipe_costs("rendezvous", 4))
    assert starts == {
        "0F0": 0,
        "0F1": 10,
        "0F2": 20,
        "1F0": 10,
        "1F1": 29,
        "1F2": 44,
        "1B0": 59,
        "1B1": 79,
        "1B2": 99,
        "0B0": 79,
        "0B1": 99,
        "0B2": 119,
    }
    # Handshake 8: 0F2 ends first, at 30: 1F1 30-45, 1F2 45-60, ..., 0B2 120-140.
    slow = _starts("gpipe", 3, _gpipe_costs("rendezvous", 8))
    assert (slow["1F1"], slow["1F2"], slow["0B2"] + 20) == (30, 45, 140)
    eager = simulate(generate("gpipe", n_ranks=2, n_microbatches=3), costs=_gpipe_costs("eager", 8))
    assert eager.metrics.makespan == 135  # 1F1 at 25, 1F2 at 40


@pytest.mark.parametrize("name", ["gpipe", "1f1b", "zb-h1", "interleaved-1f1b", "dualpipev"])
def test_the_lowered_comms_schedule_agrees(name: str) -> None:
    # The rule reads where the lowering posts receives: simulating the lowered comms schedule
    # with posted receives (what verify runs) gives the same step when sends and receives
    # cost nothing.
    schedule = generate(name, n_ranks=2, n_microbatches=4)
    costs = CostModel.uniform(
        forward=10,
        backward=25,
        input_grad=13,
        weight_grad=12,
        send_mode="rendezvous",
        link=Link(handshake=6, latency=2),
    )
    compute = simulate(schedule, costs=costs)
    comms = simulate(lower_comms(schedule), costs=costs, blocking_receives=False)
    assert compute.metrics.makespan == comms.metrics.makespan
    assert (
        compute.metrics.makespan
        >= simulate(
            schedule,
            costs=CostModel.uniform(
                forward=10, backward=25, input_grad=13, weight_grad=12, link=Link(latency=2)
            ),
        ).metrics.makespan
    )


def test_transfers_leave_when_the_receive_is_answered() -> None:
    # As above (m=3, handshake 4): 0F0's activation leaves at 10, 0F1's at 29, 0F2's at 44.
    sim = simulate(
        generate("gpipe", n_ranks=2, n_microbatches=3), costs=_gpipe_costs("rendezvous", 4)
    )
    left = {(str(t.producer), t.start, t.end) for t in sim.trace.transfers}
    assert {("0F0", 10, 10), ("0F1", 29, 29), ("0F2", 44, 44)} <= left


def test_fit_recovers_a_known_rendezvous_model() -> None:
    # Synthetic runs generated from a known model are fitted back exactly (1F1B for the
    # overheads, GPipe for late receives: its handshake).
    truth = CostModel.uniform(
        forward=40,
        backward=90,
        input_grad=50,
        weight_grad=45,
        dispatch_overhead=1,
        link=Link(latency=3, send_overhead=2, receive_overhead=4, handshake=7),
        send_mode="rendezvous",
    )
    steps = _measured_1f1b_and_gpipe(truth)
    fit = fit_costs(steps, send_mode="rendezvous")
    assert fit.costs.link == truth.link
    assert (fit.costs.dispatch_overhead, fit.costs.send_mode) == (1, "rendezvous")
    assert fit.samples["handshake"] > 0
    assert all(replay(s, fit.costs) == replay(s, truth) for s in steps)


def test_files_keep_the_mode_and_the_handshake() -> None:
    costs = _gpipe_costs("rendezvous", 4)
    data = costs_to_dict(costs)
    assert (data["send_mode"], data["link"]["handshake"]) == ("rendezvous", 4)
    assert costs_from_dict(data) == costs
    plain = costs_to_dict(CostModel())
    assert "send_mode" not in plain and "handshake" not in plain["link"]  # files as before


def test_bad_modes_are_refused() -> None:
    with pytest.raises(CostError, match="send_mode must be one of eager, rendezvous"):
        CostModel(send_mode="lazy")
    with pytest.raises(CostError, match="with blocking_sends"):
        CostModel(send_mode="rendezvous", blocking_sends=True)


def test_evaluators_without_the_rule_refuse_it() -> None:
    schedule = generate("1f1b", n_ranks=2, n_microbatches=2)
    costs = CostModel(send_mode="rendezvous")
    calls = [
        lambda: evaluate(compile_schedule(schedule), costs),
        lambda: quick_step(schedule, costs),
        lambda: fast_trace(schedule, costs),
        lambda: critical_path(schedule, costs=costs),
        lambda: comms_path(lower_comms(schedule), costs=costs),
        lambda: make_problem(n_ranks=2, n_microbatches=2, costs=costs, memory_limit=2),
    ]
    for call in calls:
        with pytest.raises(CostError, match="models eager sends only"):
            call()


def test_plan_refuses_a_rendezvous_cost_file_and_simulate_runs_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from pipesim.cli import main

    path = tmp_path / "rv.json"
    path.write_text(json.dumps(costs_to_dict(_gpipe_costs("rendezvous", 4))))
    assert main(["simulate", "gpipe", "-p", "2", "-m", "3", "--costs", str(path), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["makespan"] == 139  # as by hand
    args = ["plan", "--model", str(path), "--devices", "2", "--accelerator", "h100-sxm"]
    assert main([*args, "--global-batch", "4", "--no-progress"]) == 1
    assert "models eager sends only" in capsys.readouterr().err


def test_an_inexact_handshake_stays_exact() -> None:
    # As by hand above with handshake 9/2: 1F1 at 25 + 9/2 (before 0F2 ends at 30), every
    # later time 1/2 later than with handshake 4 (makespan 139 there).
    costs = _gpipe_costs("rendezvous", 4)
    costs = replace(costs, link=Link(handshake=Fraction(9, 2)))
    sim = simulate(generate("gpipe", n_ranks=2, n_microbatches=3), costs=costs)
    starts = {str(r.work): r.start for r in sim.trace.actions}
    assert (starts["1F1"], starts["1F2"], sim.metrics.makespan) == (
        Fraction(59, 2),
        Fraction(89, 2),
        Fraction(279, 2),
    )


# -- posting a receive costs its rank time (Link.post_overhead) -----------------------------
@pytest.mark.parametrize("send_mode", ["eager", "rendezvous"])
def test_posting_receives_holds_the_rank_by_hand(send_mode: str) -> None:
    # GPipe p=2 m=2, F=10, B=20, each receive posting 3. Rank 1 posts 0F0's receive before
    # its first node (0-3), 1F0 10-20, posts 0F1's after it (20-23), 1F1 23-33, 1B0 33-53,
    # 1B1 53-73. Rank 0: 0F0 0-10, 0F1 10-20, posts 1B0's (20-23), 0B0 53-73, posts 1B1's
    # (73-76), 0B1 76-96 (without the postings: 1F1 at 20, 0B1 70-90). Rendezvous: each
    # receive is posted before its send or with it (0F1's at 20), so each message leaves
    # when sent: the same.
    costs = CostModel(
        stages=(StageCost(forward=10, backward=20),),
        link=Link(post_overhead=3),
        send_mode=send_mode,
    )
    sim = simulate(generate("gpipe", n_ranks=2, n_microbatches=2), costs=costs)
    starts = {str(r.work): r.start for r in sim.trace.actions}
    assert starts == {
        **{"0F0": 0, "0F1": 10, "0B0": 53, "0B1": 76},
        **{"1F0": 10, "1F1": 23, "1B0": 33, "1B1": 53},
    }
    assert sim.metrics.makespan == 96


@pytest.mark.parametrize("name", ["gpipe", "1f1b", "zb-h1", "interleaved-1f1b", "dualpipev"])
@pytest.mark.parametrize("send_mode", ["eager", "rendezvous"])
def test_the_lowered_comms_schedule_pays_the_same_postings(name: str, send_mode: str) -> None:
    # Posted after the work before each RECV in the compute schedule, held by the RECV nodes
    # of the lowered comms schedule: two ways of running the rule, one step.
    schedule = generate(name, n_ranks=2, n_microbatches=4)
    costs = CostModel.uniform(
        forward=10,
        backward=25,
        input_grad=13,
        weight_grad=12,
        send_mode=send_mode,
        link=Link(handshake=6, latency=2, post_overhead=3),
    )
    compute = simulate(schedule, costs=costs)
    comms = simulate(lower_comms(schedule), costs=costs, blocking_receives=False)
    free = simulate(schedule, costs=replace(costs, link=replace(costs.link, post_overhead=0)))
    assert compute.metrics.makespan == comms.metrics.makespan
    if send_mode == "eager":  # rendezvous: a later post may meet a sender no longer waking
        assert compute.metrics.makespan > free.metrics.makespan


def test_fit_recovers_a_known_posting_cost() -> None:
    # As test_fit_recovers_a_known_rendezvous_model, every receive posting costing 5.
    truth = CostModel.uniform(
        forward=40,
        backward=90,
        input_grad=50,
        weight_grad=45,
        dispatch_overhead=1,
        link=Link(latency=3, send_overhead=2, receive_overhead=4, handshake=7, post_overhead=5),
        send_mode="rendezvous",
    )
    steps = _measured_1f1b_and_gpipe(truth)
    fit = fit_costs(steps, send_mode="rendezvous")
    assert fit.costs.link == truth.link
    assert fit.costs.dispatch_overhead == 1
    assert fit.samples["post_overhead"] > 0
    assert all(replay(s, fit.costs) == measured_makespan(s.trace) for s in steps)


def test_evaluators_without_posting_refuse_it() -> None:
    schedule = generate("1f1b", n_ranks=2, n_microbatches=2)
    costs = CostModel(link=Link(post_overhead=1))
    calls = [
        lambda: evaluate(compile_schedule(schedule), costs),
        lambda: fast_trace(schedule, costs),
        lambda: critical_path(schedule, costs=costs),
    ]
    for call in calls:
        with pytest.raises(CostError, match="models receives posted at no cost"):
            call()


def test_files_keep_the_posting_cost() -> None:
    costs = CostModel(link=Link(post_overhead=Fraction(7, 2)), send_mode="rendezvous")
    data = costs_to_dict(costs)
    assert data["link"]["post_overhead"] == "7/2"
    assert costs_from_dict(data) == costs
    assert "post_overhead" not in costs_to_dict(CostModel())["link"]


# -- a sender waking up for the poster's message answers late ------------------------------
def _waking_costs(handshake: int) -> CostModel:
    # Stage 0's forward (12) is slower than stage 1's work (5): rank 1 waits for each
    # activation, and rank 0 posts 1B0's receive (after 0F1, at 24) after 1B0 sent it (22).
    return CostModel(
        stages=(StageCost(forward=12, backward=20), StageCost(forward=5, backward=5)),
        link=Link(handshake=handshake),
        send_mode="rendezvous",
    )


@pytest.mark.parametrize(("handshake", "answered"), [(3, 27), (8, 29)])
def test_a_sender_woken_by_the_posters_message_answers_after_it(
    handshake: int, answered: int
) -> None:
    # 1F1B p=2 m=2: 0F0 0-12, 0F1 12-24; 1F0 12-17, 1B0 17-22 (sent at 22). Rank 0 sends
    # 0F1's activation at 24 and posts 1B0's receive: rank 1, waiting for that activation,
    # runs 1F1 24-29 first, and answers at its end or a handshake after 24, whichever is
    # first. 0B0 starts then (27 or 29), 1B1 29-34, 0B1 after 0B0 (1B1's receive, posted
    # when 0B0 ends, finds rank 1 done: at once).
    sim = simulate(generate("1f1b", n_ranks=2, n_microbatches=2), costs=_waking_costs(handshake))
    starts = {str(r.work): r.start for r in sim.trace.actions}
    assert starts == {
        **{"0F0": 0, "0F1": 12, "0B0": answered, "0B1": answered + 20},
        **{"1F0": 12, "1B0": 17, "1F1": 24, "1B1": 29},
    }
    # Without a handshake the receive is answered at once, as by a waiting sender: 0B0 at 24.
    assert simulate(
        generate("1f1b", n_ranks=2, n_microbatches=2), costs=_waking_costs(0)
    ).metrics.makespan == (24 + 40)


def test_fit_recovers_the_handshake_of_waking_senders() -> None:
    # Synthetic steps where rank 1 wakes for each activation (the case above), with every
    # overhead: the fit finds the model exactly, the handshake among them.
    truth = CostModel(
        stages=(
            StageCost(forward=40, backward=90, input_grad=50, weight_grad=45),
            StageCost(forward=15, backward=20, input_grad=11, weight_grad=9),
        ),
        dispatch_overhead=1,
        link=Link(latency=3, send_overhead=2, receive_overhead=4, handshake=7, post_overhead=5),
        send_mode="rendezvous",
    )
    steps = []
    for name in ("1f1b", "gpipe", "zb-h1"):
        schedule = generate(name, n_ranks=2, n_microbatches=4)
        trace = compute_only(simulate(schedule, costs=truth).trace, schedule, truth)
        steps.append(MeasuredStep(schedule=schedule, trace=trace))
    fit = fit_costs(steps, send_mode="rendezvous")
    assert fit.costs.link == truth.link
    assert fit.samples["handshake"] > 0
    assert all(replay(s, fit.costs) == measured_makespan(s.trace) for s in steps)


def _measured_1f1b_and_gpipe(truth: CostModel) -> list[MeasuredStep]:
    """1F1B and GPipe at p=2, m=4 as a run would measure them under ``truth``: the
    simulated trace's compute only, as fit_costs reads a real run."""
    steps = []
    for name in ("1f1b", "gpipe"):
        schedule = generate(name, n_ranks=2, n_microbatches=4)
        trace = compute_only(simulate(schedule, costs=truth).trace, schedule, truth)
        steps.append(MeasuredStep(schedule=schedule, trace=trace))
    return steps


def test_one_message_held_in_one_run_leaves_the_latency_alone() -> None:
    """Three 1F1B runs generated from a known model; in one, the step's last message
    (1B3 -> 0B3) arrives 1000 later, as gloo delivered it in one process pair of three
    (pipesim.calibration, rule 5): the fit still recovers the model exactly, where a
    mean of the waits would have put the latency at (11 * 3 + 1003) / 12 = 86."""
    truth = CostModel.uniform(
        forward=40,
        backward=90,
        dispatch_overhead=1,
        link=Link(latency=3, send_overhead=2, receive_overhead=4, handshake=7),
        send_mode="rendezvous",
    )
    schedule = generate("1f1b", n_ranks=2, n_microbatches=4)
    trace = compute_only(simulate(schedule, costs=truth).trace, schedule, truth)
    last = max(trace.actions, key=lambda r: r.end)
    assert str(last.work) == "0B3"  # nothing runs after it: only its wait changes
    held = Trace(
        n_ranks=trace.n_ranks,
        actions=tuple(
            replace(r, start=r.start + 1000, end=r.end + 1000) if r is last else r
            for r in trace.actions
        ),
    )
    steps = [MeasuredStep(schedule=schedule, trace=t) for t in (trace, trace, held)]
    fit = fit_costs(steps, send_mode="rendezvous")
    assert fit.samples["latency"] == 12
    assert fit.costs.link == truth.link
