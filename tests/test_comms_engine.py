"""The engine on comms schedules: explicit SEND / RECV actions (pipesim.engine,
pipesim.step.structure).

Oracles: the compute schedule (free sends and receives posted as torch's runtime posts them
give the same step, record for record), the longest path of the comms graph
(pipesim.graph.comms_path), and a step worked by hand.
"""

from __future__ import annotations

import pytest
from helpers import schedule_cases
from hypothesis import given, settings
from hypothesis import strategies as st

from pipesim import engine
from pipesim.comms import comm_schedule_from_programs, lower_comms
from pipesim.costs import CostModel, Link
from pipesim.engine import simulate
from pipesim.errors import DeadlockError, ScheduleError
from pipesim.graph import critical_path
from pipesim.schedules import generate, schedule_names

CASES = schedule_cases(((2, 4), (4, 8)), every_virtual=False)
# Links with a latency and a bandwidth: messages take time; uneven stages.
SLOW_LINKS = CostModel.uniform(
    forward=3, backward=5, output_bytes=10, link=Link(latency=2, bandwidth_bytes_per_s=5)
)
# Latency only: a message holds its link for no time, so no two contend and the longest
# path is exact; overheads on both ends, a dispatch per unit of work.
OVERHEADS = CostModel.uniform(
    forward=2,
    backward=3,
    link=Link(latency=3, send_overhead=1, receive_overhead=2),
    dispatch_overhead=1,
)


def test_every_registered_family_is_covered() -> None:
    assert {name for name, *_ in CASES} == set(schedule_names())


@pytest.mark.parametrize(("name", "p", "m", "v"), CASES)
@pytest.mark.parametrize("costs", [CostModel(), SLOW_LINKS], ids=["unit", "slow-links"])
def test_free_posted_sends_and_receives_give_the_compute_step(
    name: str, p: int, m: int, v: int, costs: CostModel
) -> None:
    # With free sends and receives that only post (torch's irecv), every unit of work
    # starts when it did without explicit comms: same records, same makespan, same busy.
    schedule = generate(name, n_ranks=p, n_microbatches=m, virtual=v)
    compute = simulate(schedule, costs=costs)
    comms = simulate(lower_comms(schedule), costs=costs, blocking_receives=False)
    assert comms.metrics.makespan == compute.metrics.makespan
    assert comms.trace.actions == compute.trace.actions
    assert comms.trace.transfers == compute.trace.transfers
    assert comms.trace.totals().busy == compute.trace.totals().busy
    # One send and one receive per message between ranks, each a zero-length record.
    assert sum(r.comm.op.is_send for r in comms.trace.comms) == len(compute.trace.transfers)
    assert sum(not r.comm.op.is_send for r in comms.trace.comms) == len(compute.trace.transfers)
    assert all(r.start == r.end for r in comms.trace.comms)


@pytest.mark.parametrize(
    ("name", "p", "m"), [(n, p, m) for n, p, m, _ in CASES if n in ("gpipe", "1f1b")]
)
def test_closed_forms_hold_for_lowered_gpipe_and_1f1b(name: str, p: int, m: int) -> None:
    comms = lower_comms(generate(name, n_ranks=p, n_microbatches=m))
    sim = simulate(comms, blocking_receives=False)
    assert sim.metrics.makespan == (m + p - 1) * (1 + 2)  # (m+p-1)(F+B), unit F, B = 2


@pytest.mark.parametrize(("name", "p", "m", "v"), CASES)
@pytest.mark.parametrize("blocking", [True, False], ids=["blocking", "posted"])
def test_makespan_is_the_longest_path_of_the_comms_graph(
    name: str, p: int, m: int, v: int, blocking: bool
) -> None:
    comms = lower_comms(generate(name, n_ranks=p, n_microbatches=m, virtual=v))
    sim = simulate(comms, costs=OVERHEADS, blocking_receives=blocking)
    path = critical_path(comms, costs=OVERHEADS, blocking_receives=blocking)
    assert sim.metrics.makespan == path.length
    # A rank is busy for the same total with explicit comms: the overheads move from the
    # work to the sends and receives (pipesim.step.cost_tables.overhead_tables).
    compute = simulate(comms.schedule, costs=OVERHEADS)
    assert sim.trace.totals().busy == compute.trace.totals().busy


@pytest.mark.parametrize(("name", "p", "m", "v"), CASES)
def test_blocking_receives_never_beat_posted_ones(name: str, p: int, m: int, v: int) -> None:
    comms = lower_comms(generate(name, n_ranks=p, n_microbatches=m, virtual=v))
    blocking = simulate(comms).metrics.makespan
    posted = simulate(comms, blocking_receives=False).metrics.makespan
    assert blocking >= posted == simulate(comms.schedule).metrics.makespan
    assert blocking == critical_path(comms).length


def test_blocking_receives_cost_1f1b_where_a_receive_precedes_unrelated_work() -> None:
    # Worked by hand: the lowering puts 1RECV_F2 before 1B1 on rank 1 (p=2, m=4), but 0F2
    # only runs after 0B0 (t=6..7), so with a blocking receive rank 1 waits from 5 to 7
    # where the compute schedule runs 1B1 at 5. Each later pair slips alike: 19, not 15.
    comms = lower_comms(generate("1f1b", n_ranks=2, n_microbatches=4))
    assert [str(s) for s in comms.programs[1]][5:8] == ["1F1", "1RECV_F2", "1B1"]
    sim = simulate(comms)
    assert sim.metrics.makespan == 19
    recv = next(r for r in sim.trace.comms if str(r.comm) == "1RECV_F2")
    assert (recv.posted, recv.start, recv.end, recv.peer) == (5, 7, 7, 0)


def _hand_case() -> CostModel:
    return CostModel.uniform(
        forward=1, backward=2, link=Link(latency=3, send_overhead=1, receive_overhead=2)
    )


def test_p2_m2_1f1b_by_hand_with_blocking_receives() -> None:
    # F=1, B=2, send 1, receive 2, latency 3. Worked by hand (rank: step [start, end]):
    #   0: 0F0 [0,1] 0SEND_F0 [1,2] (arrives 5) 0F1 [2,3] 0SEND_F1 [3,4] (arrives 7)
    #   1: 1RECV_F0 waits to 5 [5,7] 1F0 [7,8] 1RECV_F1 [8,10] 1B0 [10,12]
    #      1SEND_B0 [12,13] (arrives 16) 1F1 [13,14] 1B1 [14,16] 1SEND_B1 [16,17] (arrives 20)
    #   0: 0RECV_B0 waits 4..16 [16,18] 0B0 [18,20] 0RECV_B1 [20,22] 0B1 [22,24]
    comms = lower_comms(generate("1f1b", n_ranks=2, n_microbatches=2))
    sim = simulate(comms, costs=_hand_case())
    got = {str(r.work): (r.start, r.end) for r in sim.trace.actions}
    got |= {str(r.comm): (r.start, r.end) for r in sim.trace.comms}
    assert got == {
        "0F0": (0, 1), "0SEND_F0": (1, 2), "0F1": (2, 3), "0SEND_F1": (3, 4),
        "1RECV_F0": (5, 7), "1F0": (7, 8), "1RECV_F1": (8, 10), "1B0": (10, 12),
        "1SEND_B0": (12, 13), "1F1": (13, 14), "1B1": (14, 16), "1SEND_B1": (16, 17),
        "0RECV_B0": (16, 18), "0B0": (18, 20), "0RECV_B1": (20, 22), "0B1": (22, 24),
    }  # fmt: skip
    assert sim.metrics.makespan == 24 == critical_path(comms, costs=_hand_case()).length
    recv = next(r for r in sim.trace.comms if str(r.comm) == "0RECV_B0")
    assert (recv.posted, recv.peer) == (4, 1)
    assert [(t.start, t.end) for t in sim.trace.transfers] == [(2, 5), (4, 7), (13, 16), (17, 20)]
    # Busy: work plus overheads, as in the compute schedule (which folds them into the work).
    assert sim.trace.totals().busy == (12, 12)
    assert simulate(comms.schedule, costs=_hand_case()).metrics.makespan == 24


def test_p2_m2_1f1b_by_hand_with_posted_receives() -> None:
    # As above, but a receive only posts (no time) and the work that needs the message
    # waits for it, then pays the receive overhead (2) for taking it, as verify's
    # transport waits and checks the header there (pipesim.step.comm_durations):
    #   0: 0F0 [0,1] SEND [1,2] (arr 5) 0F1 [2,3] SEND [3,4] (arr 7) 0RECV_B0 [4,4]
    #   1: 1RECV_F0 [0,0] 1F0 waits to 5 [5,8] 1RECV_F1 [8,8] 1B0 [8,10] SEND [10,11]
    #      (arr 14) 1F1 (arrived at 7) [11,14] 1B1 [14,16] SEND [16,17] (arr 20)
    #   0: 0B0 waits to 14 [14,18] 0RECV_B1 [18,18] 0B1 waits to 20 [20,24]
    # 24: the compute schedule's makespan (above), where the receive overheads are paid
    # the same way; before, a posted RECV paid them while the message was still on its
    # way and the step came out at 20, shorter than the compute schedule's.
    comms = lower_comms(generate("1f1b", n_ranks=2, n_microbatches=2))
    sim = simulate(comms, costs=_hand_case(), blocking_receives=False)
    got = {str(r.work): (r.start, r.end) for r in sim.trace.actions}
    got |= {str(r.comm): (r.start, r.end) for r in sim.trace.comms}
    assert got == {
        "0F0": (0, 1), "0SEND_F0": (1, 2), "0F1": (2, 3), "0SEND_F1": (3, 4),
        "0RECV_B0": (4, 4), "0B0": (14, 18), "0RECV_B1": (18, 18), "0B1": (20, 24),
        "1RECV_F0": (0, 0), "1F0": (5, 8), "1RECV_F1": (8, 8), "1B0": (8, 10),
        "1SEND_B0": (10, 11), "1F1": (11, 14), "1B1": (14, 16), "1SEND_B1": (16, 17),
    }  # fmt: skip
    cost = critical_path(comms, costs=_hand_case(), blocking_receives=False).length
    assert sim.metrics.makespan == 24 == cost
    assert simulate(comms.schedule, costs=_hand_case()).metrics.makespan == 24
    assert sim.trace.totals().busy == (12, 12)  # the same overheads, paid elsewhere


@pytest.mark.parametrize("name", ["1f1b", "interleaved-1f1b", "zb-h1", "zbv", "v-half"])
def test_posted_receives_with_overheads_give_the_compute_schedules_step(name: str) -> None:
    """With every overhead and a latency, posted receives run each unit of work when the
    compute schedule does: both pay a message's receive overhead at the work that takes
    it, once it has arrived, and its send overhead right after the work that made it
    (no unit of these schedules sends two messages: see the overlapped pair below)."""
    costs = CostModel.uniform(
        forward=3,
        backward=5,
        input_grad=3,
        weight_grad=2,
        link=Link(latency=2, send_overhead=1, receive_overhead=2),
        dispatch_overhead=1,
    )
    schedule = generate(name, n_ranks=4, n_microbatches=8)
    compute = simulate(schedule, costs=costs)
    posted = simulate(lower_comms(schedule), costs=costs, blocking_receives=False)
    # (a unit of work ends before its SEND in one and with its send overhead in the other)
    assert sorted((str(r.work), r.start) for r in posted.trace.actions) == sorted(
        (str(r.work), r.start) for r in compute.trace.actions
    )
    assert posted.metrics.makespan == compute.metrics.makespan


def test_a_blocking_send_holds_its_rank_until_arrival() -> None:
    # blocking sends: 0SEND_F0 holds rank 0 for its overhead and the 3-unit transfer.
    costs = CostModel.uniform(link=Link(latency=3, send_overhead=1), blocking_sends=True)
    comms = lower_comms(generate("gpipe", n_ranks=2, n_microbatches=1))
    sim = simulate(comms, costs=costs)
    # 0F0 [0,1], 0SEND_F0 [1,2] then waits to 5; 1RECV_F0 [5,5], 1F0 [5,6], 1B0 [6,8],
    # 1SEND_B0 [8,9] waits to 12, 0RECV_B0 [12,12], 0B0 [12,14].
    assert sim.metrics.makespan == 14 == critical_path(comms, costs=costs).length


def test_a_deadlocking_order_is_refused_before_simulation(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    # Rank 0 waits for a gradient before it sends the activation that gradient needs.
    crossed = comm_schedule_from_programs(
        [
            [_step("0F0"), _step("0RECV_B0"), _step("0SEND_F0"), _step("0B0")],
            [_step("1RECV_F0"), _step("1F0"), _step("1B0"), _step("1SEND_B0")],
        ]
    )

    def must_not_run(*_: object) -> None:
        raise AssertionError("the engine ran a schedule validation should have refused")

    monkeypatch.setattr(engine, "_run", must_not_run)
    with pytest.raises(DeadlockError) as info:
        simulate(crossed)
    assert set(info.value.cycle) >= {"0SEND_F0/1RECV_F0", "1SEND_B0/0RECV_B0"}
    assert "0SEND_F0/1RECV_F0" in str(info.value)


def _step(text: str):  # type: ignore[no-untyped-def]
    from pipesim.comms import parse_instruction

    return parse_instruction(text)


def test_without_the_check_the_engine_reports_where_ranks_stopped() -> None:
    crossed = comm_schedule_from_programs(
        [
            [_step("0F0"), _step("0RECV_B0"), _step("0SEND_F0"), _step("0B0")],
            [_step("1RECV_F0"), _step("1F0"), _step("1B0"), _step("1SEND_B0")],
        ]
    )
    with pytest.raises(DeadlockError, match=r"blocked at \['0RECV_B0', '1RECV_F0'\]"):
        simulate(crossed, check=False)


def test_a_comms_trace_file_round_trips() -> None:
    from pipesim.trace_io import step_from_dict, step_to_dict

    comms = lower_comms(generate("zb-h1", n_ranks=2, n_microbatches=3))
    sim = simulate(comms, costs=OVERHEADS)
    data = step_to_dict(sim.trace, schedule=sim.schedule, costs=sim.costs)
    assert len(data["comms"]) == len(sim.trace.comms) == 2 * 2 * 3  # 2 ends, both ways, m=3
    back = step_from_dict(data)
    assert back.trace == sim.trace and back.metrics == sim.metrics


def test_cli_trace_exports_the_sends_and_receives(tmp_path, capsys) -> None:  # type: ignore[no-untyped-def]
    import json

    from pipesim.cli import main
    from pipesim.comms import comms_to_csv

    path, out = tmp_path / "x.csv", tmp_path / "x.json"
    path.write_text(comms_to_csv(lower_comms(generate("gpipe", n_ranks=2, n_microbatches=2))))
    assert main(["trace", str(path), "-o", str(out), "--time-unit", "us"]) == 0
    assert "comms schedule: 4 sends, 4 receives" in capsys.readouterr().out
    events = json.loads(out.read_text())["traceEvents"]
    names = {e["name"] for e in events if e.get("cat") == "comm"}
    sends = {f"0SEND_F{k}" for k in (0, 1)} | {f"1SEND_B{k}" for k in (0, 1)}
    receives = {f"1RECV_F{k}" for k in (0, 1)} | {f"0RECV_B{k}" for k in (0, 1)}
    assert names == sends | receives


@settings(max_examples=30, deadline=None)
@given(
    case=st.sampled_from(CASES),
    m=st.integers(1, 6),
    send=st.integers(0, 3),
    receive=st.integers(0, 3),
    latency=st.integers(0, 3),
    dispatch=st.integers(0, 2),
    blocking_sends=st.booleans(),
    blocking=st.booleans(),
)
def test_any_overheads_give_the_longest_path(
    case: tuple[str, int, int, int],
    m: int,
    send: int,
    receive: int,
    latency: int,
    dispatch: int,
    blocking_sends: bool,
    blocking: bool,
) -> None:
    name, p, _, v = case
    try:
        schedule = generate(name, n_ranks=p, n_microbatches=m, virtual=v)
    except ScheduleError:  # a size the family refuses (dualpipe needs m >= 2p, ...)
        return
    link = Link(latency=latency, send_overhead=send, receive_overhead=receive)
    costs = CostModel.uniform(
        forward=2, backward=3, link=link, dispatch_overhead=dispatch, blocking_sends=blocking_sends
    )
    comms = lower_comms(schedule)
    sim = simulate(comms, costs=costs, blocking_receives=blocking)
    assert (
        sim.metrics.makespan == critical_path(comms, costs=costs, blocking_receives=blocking).length
    )
    assert sim.trace.totals().busy == simulate(schedule, costs=costs).trace.totals().busy


@pytest.mark.parametrize("torch_class", ["ScheduleInterleaved1F1B", "ScheduleZBVZeroBubble"])
def test_torchs_own_comms_csv_simulates(torch_class: str, tmp_path) -> None:  # type: ignore[no-untyped-def]
    schedules = pytest.importorskip("torch.distributed.pipelining.schedules")
    from pipesim.comms import comms_from_csv
    from pipesim.torch_import import _StandInStage

    n_ranks, n_mb = 4, 8
    held = (0, 2 * n_ranks - 1) if torch_class == "ScheduleZBVZeroBubble" else (0, n_ranks)
    stages = [_StandInStage(stage=s, n_stages=2 * n_ranks, n_ranks=n_ranks) for s in held]
    path = tmp_path / "torch.csv"
    getattr(schedules, torch_class)(stages, n_mb)._dump_csv(str(path), format="compute_comms")
    comms = comms_from_csv(path.read_text(), n_microbatches=n_mb)
    # Posted receives (how torch's runtime runs this very file) give the compute step.
    posted = simulate(comms, blocking_receives=False)
    assert posted.trace.actions == simulate(comms.schedule).trace.actions
    # Blocking receives wait where torch's lowering put each RECV; the longest path agrees.
    blocking = simulate(comms, costs=OVERHEADS)
    assert blocking.metrics.makespan == critical_path(comms, costs=OVERHEADS).length
    assert simulate(comms).metrics.makespan > posted.metrics.makespan


def test_an_overlapped_pair_sends_its_first_message_after_its_own_overhead() -> None:
    # Rank 1 runs 1F1 and 1B0 as one overlapped unit that sends two messages. F=1, B=2,
    # send 1, no receive overhead or latency. Worked by hand (rank: work [start, end]):
    #   0: 0F0 [0,2] 0F1 [2,4]          1: 1F0 [2,4]          2: 2F0 [4,5] 2B0 [5,8]
    #   1: (1F1;1B0) [8,13]: compute 3, then SEND_F1 [11,12] (1F1's activation leaves at
    #      12, as the lowered SEND_F1 does and as verify's runtime posts it), SEND_B0
    #      [12,13] (leaves at 13)
    #   2: 2F1 [12,13] 2B1 [13,16]      0: 0B0 [13,15]        1: 1B1 [16,19]   0: 0B1 [19,21]
    # Both messages leaving at the pair's end, after both overheads, made it 22, one
    # send overhead longer than the comms schedule that runs the same sends.
    from pipesim.plan.fastsim import fast_metrics
    from pipesim.schedule import Schedule

    schedule = Schedule.from_orders(
        [
            ["0F0", "0F1", "0B0", "0B1"],
            ["1F0", "(1F1;1B0)OVERLAP_F_B", "1B1"],
            ["2F0", "2B0", "2F1", "2B1"],
        ],
        name="hand-overlap",
    )
    costs = CostModel.uniform(link=Link(send_overhead=1))
    sim = simulate(schedule, costs=costs)
    got = {str(r.work): (r.start, r.end) for r in sim.trace.actions}
    assert got == {
        "0F0": (0, 2), "0F1": (2, 4), "1F0": (2, 4), "2F0": (4, 5), "2B0": (5, 8),
        "(1F1;1B0)OVERLAP_F_B": (8, 13), "2F1": (12, 13), "2B1": (13, 16), "0B0": (13, 15),
        "1B1": (16, 19), "0B1": (19, 21),
    }  # fmt: skip
    left = {str(t.producer): t.start for t in sim.trace.transfers}
    assert (left["1F1"], left["1B0"]) == (12, 13)
    posted = simulate(lower_comms(schedule), costs=costs, blocking_receives=False)
    assert {str(r.comm): r.end for r in posted.trace.comms if r.rank == 1}["1SEND_F1"] == 12
    assert sim.metrics.makespan == posted.metrics.makespan == 21
    assert critical_path(schedule, costs=costs).length == 21
    assert fast_metrics(schedule, costs=costs).makespan == 21
