"""A simulated step as Chrome trace event JSON, for ui.perfetto.dev and chrome://tracing.

The format is Google's "Trace Event Format" (the JSON object form,
``{"traceEvents": [...], "displayTimeUnit": ..., "otherData": {...}}``).
What pipesim writes:

- one *process* per rank, named ``rank r``, sorted by rank, with ``pid = r + 1``:
  Perfetto treats pid 0 (and tid 0) as Linux's idle task, so synthetic traces
  start at 1 (a Perfetto maintainer's advice, google/perfetto#394);
- in it, the main thread (``tid = pid``) named ``compute`` holds a complete event (``ph: "X"``)
  per unit of work, named in torch's spelling (``0F3``), with ``cat`` the op
  (``F``, ``B``, ``I``, ``W`` or ``overlap``) and stage / micro-batch in
  ``args``. A rank runs one unit at a time, so these never overlap;
- transfers that take time get their own threads, ``send to rank d`` (a second
  lane ``send to rank d (2)`` and so on where messages on one link overlap, as
  they do with latency or ``max_concurrent > 1``; tids ``n_ranks + 1`` on, unique
  across the trace as Linux tids are), so every track holds
  disjoint slices and nothing has to nest across compute and communication;
- a flow (``ph: "s"`` then ``ph: "f"`` with ``bp: "e"``, same ``id``, ``name``
  and ``cat``) per message, from the send (the transfer slice, or the
  producing action when the link is free) to the receiving action. Both ends
  sit at the middle of their slice, so each binds to exactly one slice;
- a comms schedule's sends and receives on the rank's ``compute`` thread, where they
  hold it (``cat: "comm"``, torch's spelling, ``0SEND_F3``): a complete event for
  the time its overhead takes, an instant event (``ph: "i"``) when that is 0; ``args``
  name the peer rank, the bytes and, for a receive, when the rank reached it;
- counter events (``ph: "C"``) per rank: ``activation memory`` in bytes and
  ``activations in flight``, starting from 0 at time 0;
- metadata events (``ph: "M"``) naming processes and threads.

**Time unit.** Trace event times are microseconds. pipesim times are in the
cost model's :attr:`~pipesim.costs.CostModel.time_unit`, which the export
uses unless ``time_unit`` names another (``"s"``, ``"ms"``, ``"us"``,
``"ns"``); abstract ``"unit"`` times are drawn as seconds (Perfetto needs a
real unit; ``otherData`` keeps saying ``unit``). A time ``t`` becomes
``t * US_PER_UNIT[time_unit]`` microseconds, exactly when it is a whole number
of microseconds. The unit and the scale are recorded in ``otherData``.

The export reads a Trace and its schedule only (:mod:`pipesim.views`), so a
measured trace exports like a simulated one.

>>> from pipesim.engine import simulate
>>> from pipesim.schedules import generate
>>> data = chrome_trace(simulate(generate("gpipe", n_ranks=2, n_microbatches=2)), time_unit="ms")
>>> first = [e for e in data["traceEvents"] if e["ph"] == "X"][0]
>>> first["name"], first["ts"], first["dur"], first["pid"], first["tid"]
('0F0', 0, 1000, 1, 1)
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from fractions import Fraction
from pathlib import Path
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

from pipesim.actions import Action, Work
from pipesim.costs import CostModel
from pipesim.errors import UnknownNameError
from pipesim.exact import Time, as_number
from pipesim.files import write_text
from pipesim.schedule import Schedule
from pipesim.trace import ActionRecord, CommRecord, MemoryRecord, TransferRecord
from pipesim.units import SECONDS_PER_UNIT
from pipesim.views import Viewable, step_of

if TYPE_CHECKING:
    from pipesim.iterations import OptimizerRecord

__all__ = [
    "US_PER_UNIT",
    "chrome_trace",
    "chrome_trace_json",
    "rank_pid",
    "write_chrome_trace",
]

#: Microseconds per pipesim time unit, for each ``time_unit`` name.
US_PER_UNIT: Mapping[str, Fraction] = MappingProxyType(
    {
        "unit": Fraction(10**6),  # abstract slots: drawn as seconds
        **{unit: seconds * 10**6 for unit, seconds in SECONDS_PER_UNIT.items()},
    }
)


def rank_pid(rank: int, /) -> int:
    """The ``pid`` (and compute ``tid``) of ``rank`` in the trace: ``rank + 1``."""
    return rank + 1


_MEMORY = "activation memory"
_INFLIGHT = "activations in flight"


_Keyed = tuple[tuple[Any, ...], dict[str, Any]]  # an event and its place in the time order
_ToUs = Callable[[Time], int | float]  # a pipesim time in trace microseconds


def chrome_trace(
    step: Viewable,
    /,
    *,
    time_unit: str | None = None,
    schedule: Schedule | None = None,
    costs: CostModel | None = None,
    optimizer: Sequence[OptimizerRecord] = (),
) -> dict[str, Any]:
    """The trace event JSON object of ``step`` (see the module docstring): a
    Simulation, or a Trace with its ``schedule`` (and ``costs``); ``optimizer``: the
    optimizer steps of a run of several iterations (:mod:`pipesim.iterations`), each a
    slice ``optimizer`` on its rank's compute thread.

    Events come in a fixed order (metadata, then by time), so the same
    simulation always gives the same object.
    """
    simulation = step_of(step, schedule=schedule, costs=costs)
    time_unit = time_unit or simulation.costs.time_unit
    scale = _scale(time_unit)

    def us(value: Time) -> int | float:
        return as_number(Fraction(value) * scale)

    trace = simulation.trace
    lane_tids, thread_names = _send_lanes(trace.transfers, n_ranks=trace.n_ranks)
    meta = _metadata_events(trace.n_ranks, thread_names)
    events = _action_events(trace.actions, us)
    events += _comm_events(trace.comms, us)
    events += _transfer_events(trace.transfers, trace.actions, lane_tids, us)
    events += _counter_events(trace.n_ranks, trace.memory, us)
    events += _optimizer_events(optimizer, us)
    events.sort(key=lambda pair: pair[0])
    return {
        "traceEvents": meta + [event for _, event in events],
        "displayTimeUnit": "ms",
        "otherData": {
            "generator": "pipesim",
            "schedule": simulation.schedule.name,
            "n_ranks": trace.n_ranks,
            "n_stages": simulation.schedule.n_stages,
            "n_microbatches": simulation.schedule.n_microbatches,
            "time_unit": time_unit,
            "us_per_time_unit": as_number(scale),
            "makespan": as_number(trace.makespan),
            "makespan_us": us(trace.makespan),
        },
    }


def _metadata_events(
    n_ranks: int, thread_names: dict[tuple[int, int], str]
) -> list[dict[str, Any]]:
    """Names and sort order of each rank's process and compute thread, then of the
    send threads."""
    meta: list[dict[str, Any]] = []
    for rank in range(n_ranks):
        pid = rank_pid(rank)
        meta.append(_meta("process_name", pid, pid, name=f"rank {rank}"))
        meta.append(_meta("process_sort_index", pid, pid, sort_index=rank))
        meta.append(_meta("thread_name", pid, pid, name="compute"))
        meta.append(_meta("thread_sort_index", pid, pid, sort_index=0))
    for (pid, tid), name in sorted(thread_names.items()):
        meta.append(_meta("thread_name", pid, tid, name=name))
        meta.append(_meta("thread_sort_index", pid, tid, sort_index=tid - n_ranks))
    return meta


def _action_events(actions: tuple[ActionRecord, ...], us: _ToUs) -> list[_Keyed]:
    """A complete event per unit of work, on its rank's compute thread."""
    events: list[_Keyed] = []
    for record in actions:
        event = {
            "name": str(record.work),
            "cat": _category(record.work),
            "ph": "X",
            "ts": us(record.start),
            "dur": us(record.duration),
            "pid": rank_pid(record.rank),
            "tid": rank_pid(record.rank),
            "args": _work_args(record),
        }
        events.append(((event["ts"], 0, event["pid"], event["tid"]), event))
    return events


def _optimizer_events(records: Sequence[OptimizerRecord], us: _ToUs) -> list[_Keyed]:
    """A complete event per optimizer step, on its rank's compute thread."""
    events: list[_Keyed] = []
    for record in records:
        event = {
            "name": "optimizer",
            "cat": "optimizer",
            "ph": "X",
            "ts": us(record.start),
            "dur": us(record.end - record.start),
            "pid": rank_pid(record.rank),
            "tid": rank_pid(record.rank),
            "args": {
                "iteration": record.iteration,
                "waited": as_number(record.start - record.ready),
            },
        }
        events.append(((event["ts"], 0, event["pid"], event["tid"]), event))
    return events


def _comm_events(comms: tuple[CommRecord, ...], us: _ToUs) -> list[_Keyed]:
    """The sends and receives of a comms schedule (none for a plain one)."""
    events: list[_Keyed] = []
    for comm in comms:
        event = _comm_event(comm, us)
        events.append(((event["ts"], 0, event["pid"], event["tid"]), event))
    return events


def _transfer_events(
    transfers: tuple[TransferRecord, ...],
    actions: tuple[ActionRecord, ...],
    lane_tids: dict[int, int],
    us: _ToUs,
) -> list[_Keyed]:
    """Per message: its slice on a send thread when it takes time, and a flow from the
    send (that slice, or the producing action) to the receiving action."""
    records = {part: record for record in actions for part in record.work.parts}
    events: list[_Keyed] = []
    for flow_id, transfer in enumerate(transfers):
        lane_tid = lane_tids.get(flow_id)
        send_pid = rank_pid(transfer.src_rank)
        if lane_tid is not None:
            event = {
                "name": f"{transfer.producer}→{transfer.consumer}",
                "cat": "transfer",
                "ph": "X",
                "ts": us(transfer.start),
                "dur": us(transfer.end - transfer.start),
                "pid": send_pid,
                "tid": lane_tid,
                "args": _transfer_args(transfer),
            }
            events.append(((event["ts"], 0, send_pid, lane_tid), event))
            from_tid = lane_tid
            send_ts = us((transfer.start + transfer.end) / Fraction(2))
        else:  # a free link: the message leaves with the action that produced it
            producer = records[transfer.producer]
            from_tid = send_pid  # the producer runs on the sending rank's compute thread
            send_ts = us((producer.start + producer.end) / Fraction(2))
        consumer = records[transfer.consumer]
        flow = {"name": "message", "cat": "flow", "id": flow_id}
        start = {**flow, "ph": "s", "ts": send_ts, "pid": send_pid, "tid": from_tid}
        finish = {
            **flow,
            "ph": "f",
            "bp": "e",
            "ts": us((consumer.start + consumer.end) / Fraction(2)),
            "pid": rank_pid(consumer.rank),
            "tid": rank_pid(consumer.rank),
        }
        events.append(((start["ts"], 1, send_pid, from_tid, flow_id), start))
        events.append(((finish["ts"], 1, finish["pid"], finish["tid"], flow_id), finish))
    return events


def _counter_events(n_ranks: int, memory: tuple[MemoryRecord, ...], us: _ToUs) -> list[_Keyed]:
    """Each rank's memory counters: 0 at time 0, then every recorded change."""
    events: list[_Keyed] = []
    for rank in range(n_ranks):
        events += _counters(rank, 0, 0, 0)
    for sample in memory:
        events += _counters(sample.rank, us(sample.time), sample.activation_bytes, sample.inflight)
    return events


def _comm_event(comm: CommRecord, us: _ToUs) -> dict[str, Any]:
    """A send or receive as a slice of its rank's compute thread (an instant if free)."""
    pid = rank_pid(comm.rank)
    args: dict[str, Any] = {"peer_rank": comm.peer, "bytes": comm.n_bytes}
    if not comm.comm.op.is_send:
        args["reached"] = us(comm.posted)
    event: dict[str, Any] = {"name": str(comm.comm), "cat": "comm", "ts": us(comm.start)}
    if comm.end > comm.start:
        event |= {"ph": "X", "dur": us(comm.end - comm.start)}
    else:
        event |= {"ph": "i", "s": "t"}
    return event | {"pid": pid, "tid": pid, "args": args}


def chrome_trace_json(
    step: Viewable,
    /,
    *,
    time_unit: str | None = None,
    schedule: Schedule | None = None,
    costs: CostModel | None = None,
    optimizer: Sequence[OptimizerRecord] = (),
) -> str:
    """:func:`chrome_trace` as text: compact, one event per line, deterministic.

    >>> from pipesim.engine import simulate
    >>> from pipesim.schedules import generate
    >>> text = chrome_trace_json(simulate(generate("1f1b", n_ranks=2, n_microbatches=2)))
    >>> text.splitlines()[1]
    '{"name":"process_name","ph":"M","pid":1,"tid":1,"args":{"name":"rank 0"}},'
    """
    data = chrome_trace(
        step, time_unit=time_unit, schedule=schedule, costs=costs, optimizer=optimizer
    )
    lines = [_dumps(event) for event in data["traceEvents"]]
    return (
        '{"traceEvents":[\n'
        + ",\n".join(lines)
        + "\n],\n"
        + f'"displayTimeUnit":{_dumps(data["displayTimeUnit"])},\n'
        + f'"otherData":{_dumps(data["otherData"])}\n'
        + "}\n"
    )


def write_chrome_trace(
    step: Viewable,
    path: str | Path,
    /,
    *,
    time_unit: str | None = None,
    schedule: Schedule | None = None,
    costs: CostModel | None = None,
    optimizer: Sequence[OptimizerRecord] = (),
) -> Path:
    """Write :func:`chrome_trace_json` to ``path``; return the path.

    An unwritable path is a PipesimError naming the path and the reason.
    """
    text = chrome_trace_json(
        step, time_unit=time_unit, schedule=schedule, costs=costs, optimizer=optimizer
    )
    return write_text(path, text)


# -- helpers ---------------------------------------------------------------------------
def _scale(time_unit: str) -> Fraction:
    try:
        return US_PER_UNIT[time_unit]
    except (KeyError, TypeError):
        raise UnknownNameError(
            f"unknown time unit {time_unit!r}; give one of {', '.join(US_PER_UNIT)} "
            "(what one pipesim time unit stands for)"
        ) from None


def _dumps(value: object) -> str:
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False, allow_nan=False)


def _meta(kind: str, pid: int, tid: int, **args: Any) -> dict[str, Any]:
    return {"name": kind, "ph": "M", "pid": pid, "tid": tid, "args": args}


def _category(work: Work) -> str:
    return work.op.value if isinstance(work, Action) else "overlap"


def _work_args(record: ActionRecord) -> dict[str, Any]:
    parts = record.work.parts
    args: dict[str, Any] = {
        "start": as_number(record.start),
        "end": as_number(record.end),
    }
    if len(parts) == 1:
        args.update(stage=parts[0].stage, op=parts[0].op.value, microbatch=parts[0].microbatch)
    else:
        args["parts"] = [str(a) for a in parts]
    return args


def _transfer_args(transfer: TransferRecord) -> dict[str, Any]:
    return {
        "src_rank": transfer.src_rank,
        "dst_rank": transfer.dst_rank,
        "producer": str(transfer.producer),
        "consumer": str(transfer.consumer),
        "bytes": transfer.n_bytes,
        "start": as_number(transfer.start),
        "end": as_number(transfer.end),
    }


def _counters(rank: int, ts: int | float, activation_bytes: int, inflight: int) -> list[_Keyed]:
    memory = {
        "name": _MEMORY,
        "ph": "C",
        "ts": ts,
        "pid": rank_pid(rank),
        "args": {"bytes": activation_bytes},
    }
    held = {
        "name": _INFLIGHT,
        "ph": "C",
        "ts": ts,
        "pid": rank_pid(rank),
        "args": {"activations": inflight},
    }
    return [((ts, 2, rank, 0), memory), ((ts, 2, rank, 1), held)]


def _send_lanes(
    transfers: tuple[TransferRecord, ...], /, *, n_ranks: int
) -> tuple[dict[int, int], dict[tuple[int, int], str]]:
    """Send threads for the transfers that take time: lanes per link packed greedily
    so that the slices on each thread are disjoint. Returns the tid of each such
    transfer (by index) and the name of each ``(pid, tid)``; tids run from
    ``n_ranks + 1``, after the compute threads."""
    lane_of: dict[int, tuple[int, int, int]] = {}
    ends: dict[tuple[int, int], list[Time]] = {}  # per link, the end of each lane's last slice
    timed = sorted(
        (i for i, t in enumerate(transfers) if t.end > t.start),
        key=lambda i: (transfers[i].start, transfers[i].end, i),
    )
    for index in timed:
        transfer = transfers[index]
        link = (transfer.src_rank, transfer.dst_rank)
        lane_ends = ends.setdefault(link, [])
        lane = next((n for n, end in enumerate(lane_ends) if end <= transfer.start), None)
        if lane is None:
            lane = len(lane_ends)
            lane_ends.append(transfer.end)
        else:
            lane_ends[lane] = transfer.end
        lane_of[index] = (*link, lane)
    tids: dict[tuple[int, int, int], int] = {}
    names: dict[tuple[int, int], str] = {}
    for tid, (src, dst, lane) in enumerate(sorted(set(lane_of.values())), start=n_ranks + 1):
        tids[(src, dst, lane)] = tid
        names[(rank_pid(src), tid)] = f"send to rank {dst}" + (f" ({lane + 1})" if lane else "")
    return {index: tids[key] for index, key in lane_of.items()}, names
