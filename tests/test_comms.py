"""pipesim.comms: messages, the global order, the send/receive lowering and its validation."""

from __future__ import annotations

import pytest
from helpers import schedule_cases

from pipesim.comms import (
    Comm,
    CommOp,
    comm_schedule_from_programs,
    global_order,
    lower_comms,
    messages,
    parse_instruction,
    validate_comms,
)
from pipesim.errors import DeadlockError, ParseError, PipesimError, ScheduleError
from pipesim.graph import build_graph, critical_path
from pipesim.schedule import Schedule
from pipesim.schedules import generate


def _programs(comms) -> list[list[str]]:  # type: ignore[no-untyped-def]
    return [[str(s) for s in program] for program in comms.programs]


def test_gpipe_by_hand() -> None:
    # Worked by hand: all forwards (each activation sent right after it is made and received
    # at that moment), then the backwards in the lock-step order of the two ranks.
    comms = lower_comms(generate("gpipe", n_ranks=2, n_microbatches=2))
    assert _programs(comms) == [
        ["0F0", "0SEND_F0", "0F1", "0SEND_F1", "0RECV_B0", "0B0", "0RECV_B1", "0B1"],
        ["1RECV_F0", "1F0", "1RECV_F1", "1F1", "1B0", "1SEND_B0", "1B1", "1SEND_B1"],
    ]


@pytest.mark.parametrize(("name", "p", "m", "v"), schedule_cases(((2, 4), (4, 8), (3, 6))))
def test_every_registered_schedule_lowers_to_a_valid_comms_schedule(
    name: str, p: int, m: int, v: int
) -> None:
    schedule = generate(name, n_ranks=p, n_microbatches=m, virtual=v)
    comms = lower_comms(schedule)
    validate_comms(comms)
    # The compute part is the schedule itself, untouched.
    assert [tuple(s for s in prog if not isinstance(s, Comm)) for prog in comms.programs] == [
        tuple(order) for order in schedule.orders
    ]
    # One SEND and one RECV per message between ranks. Oracle, by counting: each stage
    # boundary inside a model copy whose two stages sit on different ranks carries, per
    # micro-batch of that copy, one activation and (training) one gradient.
    per_copy = schedule.n_stages // schedule.n_copies
    crossing_boundaries = sum(
        1
        for s in range(schedule.n_stages - 1)
        if (s + 1) % per_copy and schedule.rank_of(s) != schedule.rank_of(s + 1)
    )
    expected = crossing_boundaries * (m // schedule.n_copies) * 2
    sends = [s for prog in comms.programs for s in prog if isinstance(s, Comm) and s.op.is_send]
    recvs = [s for prog in comms.programs for s in prog if isinstance(s, Comm) and not s.op.is_send]
    assert len(sends) == len(recvs) == expected
    # Between every two ranks both ends see the messages in the same order.
    for a in range(p):
        for b in range(p):
            if a == b:
                continue
            sent = [
                str(s)
                for s in comms.programs[a]
                if isinstance(s, Comm)
                and s.op.is_send
                and schedule.rank_of(s.stage - 1 if s.op is CommOp.SEND_B else s.stage + 1) == b
            ]
            got = [m for m in messages(schedule) if m.src_rank == a and m.dst_rank == b]
            assert sent == [str(m.send) for m in got]


def test_global_order_is_topological_and_keeps_rank_orders() -> None:
    schedule = generate("zbv", n_ranks=2, n_microbatches=4)
    order = global_order(schedule)
    position = {w: i for i, w in enumerate(order)}
    graph = build_graph(schedule)
    assert all(position[a] < position[b] for a, b in graph.edges)
    for rank_order in schedule.orders:
        assert sorted(rank_order, key=position.__getitem__) == list(rank_order)


def test_parse_instruction_spells_like_torch() -> None:
    assert parse_instruction("2SEND_B1") == Comm(stage=2, op=CommOp.SEND_B, microbatch=1)
    assert str(parse_instruction("0F3")) == "0F3"
    assert parse_instruction("1UNSHARD") is None and parse_instruction("0REDUCE_GRAD") is None
    with pytest.raises(ParseError, match=r"cannot parse '1SEND_X0'"):
        parse_instruction("1SEND_X0")


def _from_rows(rows: list[list[str]]):  # type: ignore[no-untyped-def]
    return comm_schedule_from_programs([[parse_instruction(x) for x in row] for row in rows])


def test_receives_in_another_order_than_the_sends_are_refused() -> None:
    rows = _programs(lower_comms(generate("gpipe", n_ranks=2, n_microbatches=2)))
    rows[1] = ["1RECV_F1", "1RECV_F0", "1F0", "1F1", "1B0", "1SEND_B0", "1B1", "1SEND_B1"]
    with pytest.raises(
        ScheduleError,
        match=r"rank 0 sends 0SEND_F0 as its message 0 to rank 1, "
        r"which receives 1RECV_F1 there: without tags they would pair the wrong",
    ):
        validate_comms(_from_rows(rows))


def test_missing_or_misplaced_sends_and_receives_are_named() -> None:
    rows = _programs(lower_comms(generate("gpipe", n_ranks=2, n_microbatches=2)))
    rows[0] = ["0SEND_F0", "0F0", "0F1", "0RECV_B0", "0B0", "0RECV_B1", "0B1"]  # no 0SEND_F1
    rows[1] = ["1RECV_F0", "1F0", "1F1", "1RECV_F1", "1B0", "1SEND_B0", "1B1", "1SEND_B1"]
    with pytest.raises(ScheduleError) as info:
        validate_comms(_from_rows(rows))
    text = str(info.value)
    assert "0SEND_F0 comes before 0F0, which produces it" in text
    assert "0SEND_F1 is missing on rank 0" in text
    assert "1RECV_F1 comes after 1F1, which needs it" in text


def test_blocking_sends_that_wait_on_each_other_are_a_deadlock_with_the_cycle() -> None:
    # Both ranks send first and receive second: with blocking (rendezvous) sends, as NCCL's,
    # each send waits for a receive the other rank never reaches (pytorch issue #172668).
    schedule_rows = [
        ["0F0", "0SEND_F0", "0RECV_B0", "0B0"],
        ["1RECV_F0", "1F0", "1B0", "1SEND_B0"],
    ]
    validate_comms(_from_rows(schedule_rows))  # sane: passes
    crossed = [
        ["0F0", "0F1", "0RECV_B0", "0SEND_F0", "0SEND_F1", "0B0", "0RECV_B1", "0B1"],
        ["1RECV_F0", "1F0", "1B0", "1SEND_B0", "1RECV_F1", "1F1", "1B1", "1SEND_B1"],
    ]
    with pytest.raises(DeadlockError) as info:
        validate_comms(_from_rows(crossed))
    assert set(info.value.cycle) >= {"0SEND_F0/1RECV_F0", "1SEND_B0/0RECV_B0"}
    assert "0SEND_F0/1RECV_F0" in str(info.value)


def test_unknown_and_duplicate_comms_are_refused() -> None:
    rows = [["0F0", "0SEND_F0", "0SEND_F0"], ["1RECV_F0", "1F0", "1RECV_F3"]]
    with pytest.raises(ScheduleError) as info:
        validate_comms(
            comm_schedule_from_programs(
                [[parse_instruction(x) for x in row] for row in rows], n_microbatches=1
            )
        )
    assert "0SEND_F0 appears twice" in str(info.value)
    assert "1RECV_F3 matches no message" in str(info.value)


def test_comms_csv_round_trip_and_the_cli(tmp_path, capsys) -> None:  # type: ignore[no-untyped-def]
    from pipesim.cli import main
    from pipesim.comms import comms_from_csv, comms_to_csv

    schedule = generate("interleaved-1f1b", n_ranks=2, n_microbatches=4, virtual=2)
    comms = lower_comms(schedule)
    assert comms_from_csv(comms_to_csv(comms), n_microbatches=4).programs == comms.programs
    path = tmp_path / "x.csv"
    argv = ["schedule", "interleaved-1f1b", "-p", "2", "-m", "4", "--virtual", "2", "--comms"]
    assert main([*argv, "-o", str(path)]) == 0
    assert path.read_text() == comms_to_csv(comms)
    capsys.readouterr()
    assert main(["validate", str(path)]) == 0
    assert "valid comms schedule (2 ranks, 24 messages" in capsys.readouterr().out
    # A hand-broken copy: rank 1 receives its first two activations the other way round.
    rows = path.read_text().splitlines()
    rows[1] = rows[1].replace("1RECV_F0", "TMP").replace("1RECV_F1", "1RECV_F0")
    rows[1] = rows[1].replace("TMP", "1RECV_F1")
    path.write_text("\n".join(rows) + "\n")
    assert main(["validate", str(path)]) == 1
    assert "without tags they would pair the wrong tensors" in capsys.readouterr().err


def test_comms_csv_blank_lines_follow_the_compute_csv_rule() -> None:
    """Trailing blank lines are dropped and an idle last rank is refused on writing, as
    for the compute-only CSV (pipesim.csv_rows)."""
    from pipesim.comms import comms_from_csv, comms_to_csv

    comms = lower_comms(generate("gpipe", n_ranks=2, n_microbatches=1))
    text = comms_to_csv(comms)
    assert comms_from_csv(text + "\n\n", n_microbatches=1).programs == comms.programs
    idle = lower_comms(Schedule.from_orders([["0F0", "0B0"], []], name="tail"))
    with pytest.raises(PipesimError, match=r"last rank \(1\) runs no actions"):
        comms_to_csv(idle)


@pytest.mark.torch
@pytest.mark.parametrize(
    ("torch_class", "same_as_pipesim"),
    [
        ("ScheduleInterleaved1F1B", True),
        ("ScheduleLoopedBFS", True),
        ("ScheduleInterleavedZeroBubble", True),
        ("ScheduleZBVZeroBubble", False),
        ("ScheduleDualPipeV", False),
    ],
)
def test_torchs_own_compute_comms_csv_loads_and_validates(
    torch_class: str, same_as_pipesim: bool, tmp_path
) -> None:  # type: ignore[no-untyped-def]
    schedules = pytest.importorskip("torch.distributed.pipelining.schedules")
    from pipesim.comms import comms_from_csv
    from pipesim.torch_import import _StandInStage

    n_ranks, n_mb = 2, 4
    v_shape = torch_class in ("ScheduleZBVZeroBubble", "ScheduleDualPipeV")
    held = (0, 2 * n_ranks - 1) if v_shape else (0, n_ranks)  # rank 0's two stages
    stages = [_StandInStage(stage=s, n_stages=2 * n_ranks, n_ranks=n_ranks) for s in held]
    path = tmp_path / "torch.csv"
    # torch lowers its compute order with _add_send_recv and dumps the result.
    getattr(schedules, torch_class)(stages, n_mb)._dump_csv(str(path), format="compute_comms")
    text = path.read_text()
    assert "SEND_F" in text and "UNSHARD" in text  # torch's own artifact, FSDP actions and all
    comms = comms_from_csv(text, n_microbatches=n_mb)
    validate_comms(comms)
    # torch's lowering walks the ranks round-robin, pipesim's by (position, rank): the same
    # programs where the two sweeps agree, equally valid where they do not.
    assert (comms.programs == lower_comms(comms.schedule).programs) is same_as_pipesim


def test_every_command_takes_a_comms_csv(tmp_path, capsys) -> None:  # type: ignore[no-untyped-def]
    import json

    from pipesim.cli import main
    from pipesim.comms import comms_to_csv

    schedule = generate("zbv", n_ranks=2, n_microbatches=4)
    path = tmp_path / "zbv.csv"
    path.write_text(comms_to_csv(lower_comms(schedule)))
    # The sends and receives run as actions: posted receives (torch's runtime) give the
    # compute schedule's step; blocking ones the longest path of the comms graph.
    assert main(["simulate", str(path), "--json", "--posted-receives"]) == 0
    from_comms = json.loads(capsys.readouterr().out)
    assert main(["simulate", "zbv", "-p", "2", "-m", "4", "--json"]) == 0
    direct = json.loads(capsys.readouterr().out)
    assert from_comms["makespan"] == direct["makespan"]
    assert from_comms["ranks"] == direct["ranks"]
    # zbv on 2 ranks holds stages (0, 3) and (1, 2): 0->1 and 2->3 cross ranks, each way,
    # for each of the 4 micro-batches: 2 * 2 * 4 = 16 messages.
    assert from_comms["comms"] == {"sends": 16, "receives": 16, "blocking_receives": False}
    assert main(["simulate", str(path), "--json"]) == 0
    blocking = json.loads(capsys.readouterr().out)
    assert blocking["comms"]["blocking_receives"] is True
    assert blocking["makespan"] == critical_path(lower_comms(schedule)).length
    assert main(["simulate", str(path)]) == 0
    assert "comms schedule: 16 sends, 16 receives" in capsys.readouterr().out
    # A comms file whose blocking sends wait on each other is refused before simulating.
    path.write_text(
        "0F0,0F1,0RECV_B0,0SEND_F0,0SEND_F1,0B0,0RECV_B1,0B1\n"
        "1RECV_F0,1F0,1B0,1SEND_B0,1RECV_F1,1F1,1B1,1SEND_B1\n"
    )
    assert main(["simulate", str(path)]) == 1
    err = capsys.readouterr().err
    assert err.startswith("pipesim: error: ") and "0SEND_F0/1RECV_F0" in err


@pytest.mark.parametrize("verb", ["simulate", "trace", "plot"])
def test_posted_receives_on_a_compute_schedule_is_refused_naming_the_lowering(  # type: ignore[no-untyped-def]
    verb: str, tmp_path, monkeypatch, capsys
) -> None:
    from pipesim.cli import main

    monkeypatch.chdir(tmp_path)
    output = {"simulate": [], "trace": ["-o", "t.json"], "plot": ["-o", "p.html"]}[verb]
    assert main([verb, "1f1b", "-p", "4", "-m", "8", "--posted-receives", *output]) == 1
    err = capsys.readouterr().err
    assert err.startswith("pipesim: error: --posted-receives changes how the RECV actions")
    assert "`pipesim schedule 1f1b -p 4 -m 8 --comms -o 1f1b-comms.csv`" in err
    assert "Traceback" not in err and not list(tmp_path.iterdir())  # nothing written


def test_the_named_lowering_is_the_fix(tmp_path, monkeypatch, capsys) -> None:  # type: ignore[no-untyped-def]
    import json
    import re

    from pipesim.cli import main

    monkeypatch.chdir(tmp_path)
    assert main(["simulate", "1f1b", "-p", "4", "-m", "8", "--posted-receives"]) == 1
    lowering = re.search(r"`pipesim (schedule [^`]+)`", capsys.readouterr().err)
    assert lowering is not None and main(lowering[1].split()) == 0
    capsys.readouterr()
    # Posted receives give the compute step, 1F1B's (m + p - 1)(F + B) = 11 * 3 = 33
    # (Narayanan et al. 2021); blocking ones the longest path of the comms graph.
    assert main(["simulate", "1f1b-comms.csv", "--posted-receives", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["makespan"] == 33
    assert main(["simulate", "1f1b-comms.csv", "--json"]) == 0
    blocking = json.loads(capsys.readouterr().out)["makespan"]
    comms = lower_comms(generate("1f1b", n_ranks=4, n_microbatches=8))
    assert blocking == critical_path(comms).length > 33


def test_the_old_names_of_an_instruction_still_import() -> None:
    """``Step`` / ``parse_step`` were the names before "step" came to mean only a
    training iteration's work; code written against them keeps working."""
    from pipesim import comms

    assert comms.parse_step("1SEND_F0") == comms.parse_instruction("1SEND_F0")
    assert comms.Step == comms.Instruction
