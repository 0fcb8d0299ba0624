"""Chrome trace event JSON: the format's rules, checked here, and its content against oracles.

The rules follow Google's "Trace Event Format" document (the JSON object form):
every event has ``name``, ``ph``, ``pid`` (here >= 1: Perfetto reserves pid and tid 0
for Linux's idle task, google/perfetto#394; a tid belongs to one process, as in Linux);
``X`` (complete) events have ``ts`` and ``dur`` in microseconds, non-negative, and
slices on one thread must nest (here: be disjoint); ``s``/``f`` flow events share
``name``, ``cat`` and ``id``, one start and one finish per id, each bound to a slice on
its thread (``s`` to the enclosing slice, ``f`` with ``bp: "e"`` to the enclosing
slice); ``C`` counters carry numeric ``args``; ``M`` metadata names processes and
threads.
"""

from __future__ import annotations

import json
from collections import Counter, defaultdict
from itertools import pairwise
from pathlib import Path
from typing import Any

import pytest

from pipesim.cli import main
from pipesim.costs import CostModel, Link
from pipesim.engine import Simulation, simulate
from pipesim.errors import PipesimError, UnknownNameError
from pipesim.export import chrome_trace, chrome_trace_json, write_chrome_trace
from pipesim.schedule import Schedule
from pipesim.schedules import generate

_PHASES = {"X", "M", "C", "s", "f", "i"}
_META = {"process_name", "process_sort_index", "thread_name", "thread_sort_index"}


def check_trace_format(data: dict[str, Any]) -> None:
    """Assert the trace event format's rules on ``data`` (see the module docstring)."""
    assert set(data) >= {"traceEvents"}
    assert data.get("displayTimeUnit", "ms") in {"ms", "ns"}
    events = data["traceEvents"]
    assert isinstance(events, list) and events
    slices: dict[tuple[int, int], list[tuple[float, float, str]]] = defaultdict(list)
    flows: dict[Any, list[dict[str, Any]]] = defaultdict(list)
    named_threads, named_processes, used = set(), set(), set()
    owner: dict[int, int] = {}  # tid -> pid
    for event in events:
        assert isinstance(event["name"], str) and event["name"]
        assert event["ph"] in _PHASES, event
        assert isinstance(event["pid"], int) and event["pid"] >= 1
        if "tid" in event:
            assert isinstance(event["tid"], int) and event["tid"] >= 1
            assert owner.setdefault(event["tid"], event["pid"]) == event["pid"], event
        if event["ph"] == "M":
            assert event["name"] in _META and isinstance(event["args"], dict)
            if event["name"] == "thread_name":
                named_threads.add((event["pid"], event["tid"]))
            if event["name"] == "process_name":
                named_processes.add(event["pid"])
            continue
        assert isinstance(event["ts"], int | float) and event["ts"] >= 0, event
        if event["ph"] == "X":
            assert isinstance(event["tid"], int)
            assert isinstance(event["dur"], int | float) and event["dur"] >= 0, event
            slices[(event["pid"], event["tid"])].append(
                (event["ts"], event["ts"] + event["dur"], event["name"])
            )
            used.add((event["pid"], event["tid"]))
        elif event["ph"] == "i":  # an instant: thread, process or global scope
            assert event["s"] in {"t", "p", "g"} and isinstance(event["tid"], int), event
            used.add((event["pid"], event["tid"]))
        elif event["ph"] == "C":
            assert event["args"] and all(
                isinstance(v, int | float) and not isinstance(v, bool)
                for v in event["args"].values()
            )
        else:
            assert "id" in event and "cat" in event and isinstance(event["tid"], int)
            flows[event["id"]].append(event)
            used.add((event["pid"], event["tid"]))
    # slices on one thread: disjoint (touching ends allowed), hence trivially nested
    for track, spans in slices.items():
        spans.sort()
        for (_, end, a), (start, _, b) in pairwise(spans):
            assert start >= end, f"{a} and {b} overlap on {track}"
    # flows: exactly one s and one f per id, same name / cat, s no later than f, each end
    # bound to exactly one slice on its thread
    for flow_id, pair in flows.items():
        assert sorted(e["ph"] for e in pair) == ["f", "s"], flow_id
        start = next(e for e in pair if e["ph"] == "s")
        finish = next(e for e in pair if e["ph"] == "f")
        assert (start["name"], start["cat"]) == (finish["name"], finish["cat"])
        assert finish["bp"] == "e" and start["ts"] <= finish["ts"]
        for end in (start, finish):
            assert len(enclosing(slices, end)) == 1, end
    assert used <= named_threads
    assert {pid for pid, _ in used} <= named_processes


def enclosing(
    slices: dict[tuple[int, int], list[tuple[float, float, str]]], event: dict[str, Any]
) -> list[str]:
    """Names of the slices on ``event``'s thread that enclose its timestamp."""
    ts = event["ts"]
    return [
        name
        for start, end, name in slices[(event["pid"], event["tid"])]
        if start <= ts <= end and (start < ts < end or start == end)
    ]


def x_events(data: dict[str, Any]) -> list[dict[str, Any]]:
    return [e for e in data["traceEvents"] if e["ph"] == "X"]


def flow_pairs(data: dict[str, Any]) -> set[tuple[str, str]]:
    """(slice the flow leaves, slice it enters) for every flow."""
    slices: dict[tuple[int, int], list[tuple[float, float, str]]] = defaultdict(list)
    for e in x_events(data):
        slices[(e["pid"], e["tid"])].append((e["ts"], e["ts"] + e["dur"], e["name"]))
    ends: dict[Any, dict[str, str]] = defaultdict(dict)
    for e in data["traceEvents"]:
        if e["ph"] in {"s", "f"}:
            (ends[e["id"]][e["ph"]],) = enclosing(slices, e)
    return {(pair["s"], pair["f"]) for pair in ends.values()}


def sim_of(name: str, p: int, m: int, **costs: Any) -> Simulation:
    return simulate(generate(name, n_ranks=p, n_microbatches=m), costs=CostModel.uniform(**costs))


# -- format ----------------------------------------------------------------------------
@pytest.mark.parametrize(
    "costs",
    [
        {},
        {"link": Link(latency="0.25", bandwidth_bytes_per_s=400), "output_bytes": 100},
        # latency 3 > time between sends: messages overlap on each link, lanes are needed
        {"link": Link(latency=3, max_concurrent=2), "activation_bytes": 7},
    ],
)
@pytest.mark.parametrize("name", ["gpipe", "1f1b", "interleaved-1f1b"])
def test_trace_follows_the_format(name: str, costs: dict[str, Any]) -> None:
    virtual = 2 if name == "interleaved-1f1b" else None
    schedule = generate(name, n_ranks=4, n_microbatches=8, virtual=virtual)
    sim = simulate(schedule, costs=CostModel.uniform(**costs))
    text = chrome_trace_json(sim, time_unit="ms")

    def refuse(constant: str) -> None:
        raise AssertionError(f"non-standard JSON constant {constant}")

    data = json.loads(text, parse_constant=refuse)
    assert data == chrome_trace(sim, time_unit="ms")
    check_trace_format(data)


def test_checker_catches_broken_traces() -> None:
    """The rule checker itself fails on overlapping slices, unpaired flows, bad phases."""
    good = chrome_trace(sim_of("1f1b", 2, 2))
    check_trace_format(good)
    x = x_events(good)[0]
    broken: list[dict[str, Any]] = [
        {**good, "traceEvents": [*good["traceEvents"], {**x, "ts": x["ts"] + 0.5}]},
        {**good, "traceEvents": [e for e in good["traceEvents"] if e["ph"] != "f"]},
        {**good, "traceEvents": [*good["traceEvents"], {**x, "ph": "Q"}]},
        {**good, "traceEvents": [*good["traceEvents"], {**x, "ts": 100, "dur": -1}]},
        {**good, "traceEvents": [e for e in good["traceEvents"] if e["ph"] != "M"]},
        {**good, "traceEvents": [*good["traceEvents"], {**x, "ts": 100, "pid": 0}]},
    ]
    for data in broken:
        with pytest.raises(AssertionError):
            check_trace_format(data)


# -- content ---------------------------------------------------------------------------
def test_one_slice_per_action_on_its_rank_track() -> None:
    p, m = 4, 8
    sim = sim_of("1f1b", p, m)
    data = chrome_trace(sim, time_unit="ms")
    compute = [e for e in x_events(data) if e["tid"] == e["pid"]]  # main thread: compute
    for rank, order in enumerate(sim.schedule.orders):
        names = sorted(e["name"] for e in compute if e["pid"] == rank + 1)  # pid = rank + 1
        assert names == sorted(str(w) for w in order)
    by_name = {e["name"]: e for e in compute}
    # 1F1B, F=1, B=2 time units of 1 ms: 3F0 runs [3, 4], 3B0 [4, 6]; makespan 33
    assert (by_name["3F0"]["ts"], by_name["3F0"]["dur"]) == (3000, 1000)
    assert (by_name["3B0"]["ts"], by_name["3B0"]["dur"], by_name["3B0"]["cat"]) == (
        4000,
        2000,
        "B",
    )
    args = by_name["2F5"]["args"]
    assert (args["stage"], args["op"], args["microbatch"]) == (2, "F", 5)
    assert args["end"] - args["start"] == 1 and by_name["2F5"]["ts"] == args["start"] * 1000
    assert max(e["ts"] + e["dur"] for e in compute) == (m + p - 1) * 3 * 1000
    assert data["otherData"]["makespan_us"] == 33_000
    assert data["otherData"]["us_per_time_unit"] == 1000


@pytest.mark.parametrize(("unit", "scale"), [("s", 10**6), ("ms", 10**3), ("us", 1), ("ns", 1e-3)])
def test_time_unit_scale(unit: str, scale: float) -> None:
    sim = sim_of("gpipe", 2, 2, forward="0.5", backward=1)
    data = chrome_trace(sim, time_unit=unit)
    compute = {e["name"]: e for e in x_events(data)}
    # GPipe p=2, m=2, F=0.5, B=1: 1F1 runs [1, 1.5]; makespan (m+p-1)(F+B) = 4.5
    assert compute["1F1"]["ts"] == pytest.approx(1 * scale)
    assert compute["1F1"]["dur"] == pytest.approx(0.5 * scale)
    assert data["otherData"]["makespan_us"] == pytest.approx(4.5 * scale)


def test_unknown_time_unit() -> None:
    with pytest.raises(
        UnknownNameError, match="unknown time unit 'h'; give one of unit, s, ms, us, ns"
    ):
        chrome_trace(sim_of("gpipe", 2, 2), time_unit="h")


def test_flows_link_each_send_to_its_receive() -> None:
    p, m = 4, 3
    data = chrome_trace(sim_of("1f1b", p, m))
    # free links: each flow leaves the producing action and enters the consuming one:
    # stage s's F feeds stage s+1's F, stage s's B feeds stage s-1's B (same micro-batch)
    forward = {(f"{s}F{i}", f"{s + 1}F{i}") for s in range(p - 1) for i in range(m)}
    backward = {(f"{s}B{i}", f"{s - 1}B{i}") for s in range(1, p) for i in range(m)}
    assert flow_pairs(data) == forward | backward
    flows = [e for e in data["traceEvents"] if e["ph"] == "s"]
    assert len(flows) == 2 * (p - 1) * m


def test_transfers_get_their_own_tracks_and_lanes() -> None:
    p, m = 3, 4
    # Every message holds its link for 1 and arrives 3 later: GPipe's forwards leave one
    # per time unit, so up to 3 messages are on a link at once and need 3 lanes.
    sim = sim_of("gpipe", p, m, link=Link(latency=3, bandwidth_bytes_per_s=1), output_bytes=1)
    data = chrome_trace(sim, time_unit="us")
    check_trace_format(data)
    transfers = [e for e in x_events(data) if e["cat"] == "transfer"]
    assert len(transfers) == 2 * (p - 1) * m
    assert {e["dur"] for e in transfers} >= {4}  # 1 on the link + 3 latency, uncontended
    assert all(e["tid"] > p for e in transfers)  # never on a compute track (tid = pid <= p)
    names = {
        (e["pid"], e["args"]["name"])
        for e in data["traceEvents"]
        if e["ph"] == "M" and e["name"] == "thread_name" and e["tid"] != e["pid"]
    }
    assert (1, "send to rank 1") in names and (1, "send to rank 1 (2)") in names  # rank 0
    # each flow leaves its transfer slice and enters the consumer's slice
    pairs = flow_pairs(data)
    assert ("0F2→1F2", "1F2") in pairs and ("2B0→1B0", "1B0") in pairs
    assert len(pairs) == 2 * (p - 1) * m


def test_memory_counters_per_rank() -> None:
    p, m = 4, 8
    data = chrome_trace(sim_of("1f1b", p, m, activation_bytes=100))
    counters: dict[int, list[tuple[float, int]]] = defaultdict(list)
    for e in data["traceEvents"]:
        if e["ph"] == "C" and e["name"] == "activation memory":
            counters[e["pid"]].append((e["ts"], e["args"]["bytes"]))
    assert sorted(counters) == [rank + 1 for rank in range(p)]
    for pid, samples in counters.items():
        assert samples[0] == (0, 0)
        assert max(b for _, b in samples) == (p - (pid - 1)) * 100  # 1F1B rank r holds p - r
        assert samples[-1][1] == 0
    inflight = Counter(
        e["pid"] for e in data["traceEvents"] if e["name"] == "activations in flight"
    )
    assert inflight == {pid: len(samples) for pid, samples in counters.items()}


def test_overlap_and_split_backward() -> None:
    schedule = Schedule.from_orders(
        [
            ["0F0", "0F1", "0I0", "0W0", "0I1", "0W1"],
            ["1F0", "(1F1;1I0)OVERLAP_F_B", "1W0", "1I1", "1W1"],
        ]
    )
    data = chrome_trace(simulate(schedule), time_unit="us")
    check_trace_format(data)
    by_name = {e["name"]: e for e in x_events(data)}
    overlap = by_name["(1F1;1I0)OVERLAP_F_B"]
    # hand-worked: the overlap runs [2, 4] on rank 1 (see tests/test_plot.py)
    assert (overlap["ts"], overlap["dur"], overlap["cat"], overlap["pid"]) == (2, 2, "overlap", 2)
    assert overlap["args"]["parts"] == ["1F1", "1I0"]
    assert {by_name["0I0"]["cat"], by_name["0W0"]["cat"]} == {"I", "W"}
    # 0F1 feeds the F inside the overlap; the I inside it feeds 0I0
    assert {("0F1", "(1F1;1I0)OVERLAP_F_B"), ("(1F1;1I0)OVERLAP_F_B", "0I0")} <= flow_pairs(data)


def test_deterministic_and_written(tmp_path: Path) -> None:
    sim = sim_of("1f1b", 4, 8, link=Link(latency=1))
    path = write_chrome_trace(sim, tmp_path / "t.json")
    again = write_chrome_trace(sim_of("1f1b", 4, 8, link=Link(latency=1)), tmp_path / "u.json")
    assert path.read_bytes() == again.read_bytes()
    with pytest.raises(PipesimError, match="cannot write"):
        write_chrome_trace(sim, tmp_path / "no" / "t.json")


def test_cli_trace(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "trace.json"
    argv = ["trace", "1f1b", "-p", "4", "-m", "8", "--link-latency", "1", "-o", str(out)]
    assert main([*argv, "--time-unit", "ms"]) == 0
    assert "64 actions, 48 messages on 4 ranks" in capsys.readouterr().out
    data = json.loads(out.read_text())
    check_trace_format(data)
    # 1F1B p=4 m=8 with latency 1 per message: check against the simulator's makespan
    assert data["otherData"]["makespan_us"] == data["otherData"]["makespan"] * 1000
    assert main(["trace", "nope", "-o", str(out)]) == 1
    assert "unknown schedule 'nope'" in capsys.readouterr().err
    assert main([*argv[:-1], str(tmp_path / "no" / "t.json")]) == 1
    assert "cannot write" in capsys.readouterr().err


def test_sends_and_receives_of_a_comms_schedule_are_on_their_ranks() -> None:
    from pipesim.comms import lower_comms

    comms = lower_comms(generate("1f1b", n_ranks=2, n_microbatches=2))
    # Overheads: every send and receive holds its rank, a slice on its compute thread
    # (times worked by hand in tests/test_comms_engine.py: 1RECV_F0 [5, 7], 0SEND_F0 [1, 2]).
    costs = CostModel.uniform(link=Link(latency=3, send_overhead=1, receive_overhead=2))
    data = chrome_trace(simulate(comms, costs=costs), time_unit="us")
    check_trace_format(data)
    comm = {e["name"]: e for e in data["traceEvents"] if e.get("cat") == "comm"}
    sent = [str(s) for p in comms.programs for s in p if "SEND" in str(s) or "RECV" in str(s)]
    assert sorted(comm) == sorted(sent) and len(comm) == 8  # 2 messages each way, 2 ends
    assert (comm["1RECV_F0"]["ts"], comm["1RECV_F0"]["dur"], comm["1RECV_F0"]["tid"]) == (5, 2, 2)
    assert comm["1RECV_F0"]["args"] == {"peer_rank": 0, "bytes": 0, "reached": 0}
    assert (comm["0SEND_F0"]["ts"], comm["0SEND_F0"]["dur"], comm["0SEND_F0"]["pid"]) == (1, 1, 1)
    # Free sends and receives are instants at the moment they happen.
    free = chrome_trace(simulate(comms), time_unit="us")
    check_trace_format(free)
    instants = [e for e in free["traceEvents"] if e.get("cat") == "comm"]
    assert len(instants) == 8 and {e["ph"] for e in instants} == {"i"}
