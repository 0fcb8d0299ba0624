"""Trace files: one step (schedule, costs, trace) as JSON, simulated or measured.

``pipesim verify --trace-out FILE`` writes the measured step in this format (and
``pipesim verify --json`` embeds it in its report as ``measured_trace``);
``pipesim plot --measured FILE`` reads either (see :mod:`pipesim.views`): the same
views draw it as a simulated step. The format::

    {"format": "pipesim-trace", "version": 1, "time_unit": "ns",
     "schedule": {...pipesim schedule JSON...}, "costs": {...cost file...},
     "n_ranks": 2,
     "actions":   [[rank, "0F0", start, end], ...],
     "transfers": [[src_rank, dst_rank, "0F0", "1F0", n_bytes, start, end], ...],
     "memory":    [[rank, time, activation_bytes, inflight], ...],
     "comms":     [[rank, "0SEND_F0", peer_rank, n_bytes, posted, start, end], ...],
     "meta": {...}}

``comms`` (a comms schedule's sends and receives, :class:`~pipesim.trace.CommRecord`)
is written only when the trace has any.

Times are numbers in ``time_unit``, or ``"p/q"`` strings when not whole, so a
file written and read back gives the same trace.

>>> from pipesim.engine import simulate
>>> from pipesim.schedules import generate
>>> sim = simulate(generate("1f1b", n_ranks=2, n_microbatches=2))
>>> step = step_from_dict(step_to_dict(sim.trace, schedule=sim.schedule, costs=sim.costs))
>>> step.trace == sim.trace, step.metrics == sim.metrics
(True, True)
"""

from __future__ import annotations

import json
from collections.abc import Callable
from fractions import Fraction
from pathlib import Path
from typing import Any, TypeVar

from pipesim.actions import Action, Comm, parse_action
from pipesim.comms import parse_instruction
from pipesim.costs import CostModel, costs_from_dict, costs_to_dict
from pipesim.engine import Simulation
from pipesim.errors import ParseError, PipesimError, brief
from pipesim.exact import Time, to_time
from pipesim.files import read_json, write_text
from pipesim.schedule import Schedule
from pipesim.schedule_io import schedule_from_dict, schedule_to_dict
from pipesim.trace import ActionRecord, CommRecord, MemoryRecord, Trace, TransferRecord
from pipesim.views import step_of

__all__ = ["load_trace", "save_trace", "step_from_dict", "step_to_dict"]

_FORMAT = "pipesim-trace"
_Record = TypeVar("_Record")


def _time(value: Time) -> int | str:
    if isinstance(value, Fraction):
        return value.numerator if value.denominator == 1 else str(value)
    return value


def step_to_dict(
    trace: Trace,
    /,
    *,
    schedule: Schedule,
    costs: CostModel | None = None,
    meta: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """The JSON-ready dictionary of ``trace`` with the schedule (and costs) it ran."""
    data: dict[str, Any] = {
        "format": _FORMAT,
        "version": 1,
        "time_unit": costs.time_unit if costs is not None else "unit",
        "schedule": schedule_to_dict(schedule),
    }
    if costs is not None:
        data["costs"] = costs_to_dict(costs)
    data["n_ranks"] = trace.n_ranks
    data["actions"] = [[r.rank, str(r.work), _time(r.start), _time(r.end)] for r in trace.actions]
    data["transfers"] = [
        [
            t.src_rank,
            t.dst_rank,
            str(t.producer),
            str(t.consumer),
            t.n_bytes,
            _time(t.start),
            _time(t.end),
        ]
        for t in trace.transfers
    ]
    data["memory"] = [[m.rank, _time(m.time), m.activation_bytes, m.inflight] for m in trace.memory]
    if trace.comms:
        data["comms"] = [
            [c.rank, str(c.comm), c.peer, c.n_bytes, _time(c.posted), _time(c.start), _time(c.end)]
            for c in trace.comms
        ]
    if meta:
        data["meta"] = meta
    return data


def save_trace(
    trace: Trace,
    path: str | Path,
    /,
    *,
    schedule: Schedule,
    costs: CostModel | None = None,
    meta: dict[str, Any] | None = None,
) -> Path:
    """Write :func:`step_to_dict` as JSON (one record per line) to ``path``."""
    data = step_to_dict(trace, schedule=schedule, costs=costs, meta=meta)
    records = ("actions", "transfers", "memory", "comms")
    head = {k: v for k, v in data.items() if k not in records}
    parts = [json.dumps(head, separators=(",", ":"))[:-1]]
    for key in (k for k in records if k in data):
        rows = ",\n".join(json.dumps(row, separators=(",", ":")) for row in data[key])
        parts.append(f'"{key}":[\n{rows}\n]')
    return write_text(path, ",\n".join(parts) + "}\n")


def step_from_dict(data: object, /, *, source: str = "trace") -> Simulation:
    """The step of a trace file's dictionary: schedule, costs, trace and metrics."""
    if not isinstance(data, dict) or data.get("format") != _FORMAT:
        raise ParseError(
            f'{source}: not a pipesim trace file (expected a JSON object with "format": '
            f'"{_FORMAT}", as `pipesim verify --trace-out` writes, or the JSON report of '
            "`pipesim verify --json -o FILE`)"
        )
    if data.get("version", 1) != 1:
        raise ParseError(
            f"{source}: trace format version {data['version']!r}, but this pipesim reads "
            "version 1; write it again with this pipesim, or upgrade pipesim"
        )
    schedule = schedule_from_dict(data.get("schedule"), source=f"{source}: schedule")
    unit = data.get("time_unit", "unit")
    costs = None
    if "costs" in data:
        if not isinstance(data["costs"], dict):
            raise ParseError(f"{source}: costs: expected a JSON object (a cost file's)")
        costs = costs_from_dict({**data["costs"], "time_unit": unit}, source=f"{source}: costs")
    n_ranks = data.get("n_ranks", schedule.n_ranks)
    if isinstance(n_ranks, bool) or not isinstance(n_ranks, int) or n_ranks != schedule.n_ranks:
        raise ParseError(
            f"{source}: n_ranks is {brief(n_ranks)}, but its schedule {schedule.name!r} has "
            f"{schedule.n_ranks} ranks; give the schedule the trace ran"
        )
    trace = Trace(
        n_ranks=n_ranks,
        actions=_records(data, "actions", _action, source=source),
        transfers=_records(data, "transfers", _transfer, source=source),
        memory=_records(data, "memory", _memory, source=source),
        comms=_records(data, "comms", _comm, source=source),
    )
    _check_records(trace, schedule, source=source)
    if costs is None:
        costs = CostModel(time_unit=unit)
    return step_of(trace, schedule=schedule, costs=costs)


def _check_records(trace: Trace, schedule: Schedule, /, *, source: str) -> None:
    """A file's records describe a run of ``schedule``: every rank they name is one of its
    ranks, and the action records are its actions, each once, on its rank, each ending
    no earlier than it starts. What the metrics and views assume of a trace the engine
    made is checked here for one read from a file."""
    ranks = range(schedule.n_ranks)
    named = [
        *((r.rank, f"{r.work} on rank {r.rank}") for r in trace.actions),
        *(
            (rank, f"a transfer from rank {t.src_rank} to rank {t.dst_rank}")
            for t in trace.transfers
            for rank in (t.src_rank, t.dst_rank)
        ),
        *((m.rank, f"a memory record of rank {m.rank}") for m in trace.memory),
        *((rank, f"{c.comm} on rank {c.rank}") for c in trace.comms for rank in (c.rank, c.peer)),
    ]
    for rank, what in named:
        if rank not in ranks:
            raise ParseError(
                f"{source}: {what} names rank {rank}, but schedule {schedule.name!r} has ranks "
                f"0..{schedule.n_ranks - 1}; give the schedule the trace ran"
            )
    expected = {(rank, work) for rank, order in enumerate(schedule.orders) for work in order}
    seen: set[tuple[int, object]] = set()
    for record in trace.actions:
        what = f"{source}: the record of {record.work} on rank {record.rank}"
        if record.end < record.start:
            raise ParseError(f"{what} ends at {record.end}, before it starts at {record.start}")
        if (record.rank, record.work) not in expected:
            raise ParseError(
                f"{what} is not an action of schedule {schedule.name!r} on that rank; give "
                "the schedule the trace ran"
            )
        if (record.rank, record.work) in seen:
            raise ParseError(f"{what} is given twice; keep one")
        seen.add((record.rank, record.work))
    missing = sorted(((r, str(w)) for r, w in expected - seen))
    if missing:
        rank, work = missing[0]
        raise ParseError(
            f"{source}: {len(missing)} of the {len(expected)} actions of schedule "
            f"{schedule.name!r} have no record, e.g. {work} on rank {rank}; a trace holds "
            "every action of the step it ran"
        )


def load_trace(path: str | Path, /) -> Simulation:
    """Read a trace file (see the module docstring), or the measured step of a
    ``pipesim verify --json`` report, which embeds one as ``measured_trace``."""
    data = read_json(path, what="trace")
    if isinstance(data, dict) and data.get("format") != _FORMAT and "measured_trace" in data:
        if data["measured_trace"] is None:
            raise ParseError(
                f"{path}: this verify report holds no measured trace (it does not say how the "
                "schedule ran); rerun `pipesim verify ... --json -o FILE` or use --trace-out FILE"
            )
        return step_from_dict(data["measured_trace"], source=f"{path}: measured_trace")
    return step_from_dict(data, source=str(path))


# The fields of each kind of record, as the module docstring writes them.
_SHAPES = {
    "actions": "[rank, action, start, end]",
    "transfers": "[src_rank, dst_rank, producer, consumer, n_bytes, start, end]",
    "memory": "[rank, time, activation_bytes, inflight]",
    "comms": "[rank, send_or_receive, peer_rank, n_bytes, posted, start, end]",
}


def _records(
    data: dict[str, Any], key: str, parse: Callable[[Any], _Record], /, *, source: str
) -> tuple[_Record, ...]:
    """The records under ``key``, each read by ``parse``; a ParseError naming the first bad
    one, its index and the shape it should have."""
    rows = data.get(key, [])
    shape = _SHAPES[key]
    if not isinstance(rows, list):
        raise ParseError(f"{source}: {key!r} must be a list of {shape} records, got {brief(rows)}")
    records = []
    for index, row in enumerate(rows):
        try:
            if not isinstance(row, list) or len(row) != shape.count(",") + 1:
                raise ValueError(f"expected {shape}")
            records.append(parse(row))
        except (TypeError, ValueError, PipesimError) as exc:
            raise ParseError(f"{source}: {key} record {index}, {brief(row)}: {exc}") from None
    return tuple(records)


def _t(value: object) -> Time:
    return to_time(value, name="time")


def _action(row: Any) -> ActionRecord:
    rank, work, start, end = row
    return ActionRecord(rank=int(rank), work=parse_action(work), start=_t(start), end=_t(end))


def _transfer(row: Any) -> TransferRecord:
    src, dst, producer, consumer, n_bytes, start, end = row
    a, b = parse_action(producer), parse_action(consumer)
    if not (isinstance(a, Action) and isinstance(b, Action)):
        raise ValueError(f"a transfer joins two simple actions, got {producer!r}, {consumer!r}")
    return TransferRecord(
        src_rank=int(src),
        dst_rank=int(dst),
        producer=a,
        consumer=b,
        n_bytes=int(n_bytes),
        start=_t(start),
        end=_t(end),
    )


def _comm(row: Any) -> CommRecord:
    rank, text, peer, n_bytes, posted, start, end = row
    comm = parse_instruction(text)
    if not isinstance(comm, Comm):
        raise ValueError(f"a comms record holds a send or receive, got {text!r}")
    return CommRecord(
        rank=int(rank),
        comm=comm,
        peer=int(peer),
        n_bytes=int(n_bytes),
        posted=_t(posted),
        start=_t(start),
        end=_t(end),
    )


def _memory(row: Any) -> MemoryRecord:
    rank, time, activation_bytes, inflight = row
    return MemoryRecord(
        rank=int(rank),
        time=_t(time),
        activation_bytes=int(activation_bytes),
        inflight=int(inflight),
    )
