"""torch.profiler (Kineto) Chrome traces of a pipeline-parallel step -> measured steps.

``torch.profiler.profile(...).export_chrome_trace(path)`` writes, per process, a JSON
object whose ``traceEvents`` hold complete events (``"ph": "X"``: ``name``, ``ts`` and
``dur`` in microseconds, ``pid``, ``tid``, ``cat``), flow events (``"ph": "s"`` /
``"f"``, ``"cat": "fwdbwd"``) that link each forward operator to the autograd node
that runs its backward, and ``distributedInfo.rank``; times are ``baseTimeNanoseconds``
plus ``ts`` (torch/csrc/profiler/kineto_shim.cpp, torch/autograd/profiler_util.py).
:func:`read_profile` takes one such file per rank, or one file holding several
processes (each ``pid`` a rank, in the order of their ``distributedInfo`` or of the
pids), and :func:`measured_steps` finds on each rank's busiest thread the compute of
each action of the step, as :mod:`pipesim.calibration` reads a measured step:

- **annotated**: ``record_function`` ranges named as an action (``0F3``, ``1I2``;
  torch's ``_PipelineScheduleRuntime`` spells them ``PP:0F3``, pipesim's verify runtime
  ``0F3``). An action's compute is the span of the operators inside its range,
  communication left out (torch's runtime waits for an action's receives inside its
  range, and the wait is no operator).
- **unannotated** (torch 2.13's ``ScheduleGPipe`` / ``Schedule1F1B`` record none, only
  ``gloo:send`` / ``gloo:recv``): the rank's outermost operators are cut into runs at
  every communication operator (``c10d::``, ``gloo:``, ``nccl:``) and wherever forward
  operators give way to ``autograd::engine::evaluate_function`` ranges or back; a run
  is a forward when the flows link its operators to a backward, and each backward run
  belongs to the forward its autograd nodes' flows come from. Such a rank holds one
  stage (its rank number) and runs its forwards in micro-batch order, as torch's
  single-stage schedules do; runs linked to no forward or backward (splitting the
  batch, scaling gradients) are not actions.

``ProfilerStep#N`` ranges (``prof.step()`` under a profiler ``schedule``) cut a trace
into steps, each a :class:`~pipesim.calibration.MeasuredStep` of the schedule as it
ran (per rank its actions in the order they ran); without them the whole trace is one
step. The ranks' timelines are compared as they are, so they must share a clock (the
processes of one host do). GPU kernels are not read: on a GPU the CPU ranges time the
launches, not the kernels, and :func:`measured_steps` refuses such a trace.
"""

from __future__ import annotations

import re
from bisect import bisect_right
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pipesim.actions import Action, Op, parse_action
from pipesim.calibration import MeasuredStep, fit_costs, fit_meta, term_stability
from pipesim.costs import CostModel
from pipesim.errors import PipesimError, ScheduleError, brief
from pipesim.files import read_json
from pipesim.schedule import Schedule
from pipesim.trace import ActionRecord, Trace

__all__ = [
    "ProfiledRank",
    "ProfiledStep",
    "TraceError",
    "is_kineto",
    "measured_steps",
    "profile_costs",
    "read_profile",
]

_ANNOTATION = re.compile(r"(?:PP:)?(\d+[FBIW]\d+)")
_COMM_PREFIXES = ("c10d::", "gloo:", "nccl:", "record_param_comms", "ProcessGroup")
_BACKWARD = "autograd::engine::evaluate_function"
_STEP = re.compile(r"ProfilerStep#(\d+)")
_GPU_CATS = frozenset({"kernel", "gpu_memcpy", "gpu_memset"})


class TraceError(PipesimError, ValueError):
    """A profiler trace cannot be read as a pipeline-parallel step."""


@dataclass(frozen=True, slots=True, kw_only=True)
class _Event:
    name: str
    start: int
    """Nanoseconds (``baseTimeNanoseconds`` + ``ts``)."""
    end: int
    cat: str


@dataclass(frozen=True, slots=True, kw_only=True)
class ProfiledRank:
    """One rank's events of a profiler trace: its busiest thread's complete events and
    its forward -> backward flows (start and end times in ns), with where they came from."""

    rank: int
    source: str
    pid: int | str
    tid: int | str
    host: str | None
    events: tuple[_Event, ...]
    flows: Mapping[Any, tuple[int, int]]
    """Flow id -> (time of its start in a forward operator, of its end in a backward)."""
    gpu_events: int = 0


@dataclass(frozen=True, slots=True, kw_only=True)
class ProfiledStep:
    """One step found in the traces: the measured step (compute-only action records in
    ns from the step's first compute start) and how it was found."""

    step: MeasuredStep
    label: str
    """``ProfilerStep#N``, or ``whole trace``."""
    annotated: tuple[bool, ...]
    """Per rank: its actions came from ``record_function`` ranges."""
    busy_ns: tuple[int, ...]
    """Per rank, the summed compute of its actions."""
    comms: tuple[int, ...]
    """Per rank, the communication operators inside the step."""


def is_kineto(data: object, /) -> bool:
    """Whether ``data`` (a parsed JSON file) is a Chrome trace: an object with
    ``traceEvents``."""
    return isinstance(data, dict) and "traceEvents" in data


def read_profile(paths: Sequence[str | Path], /) -> tuple[ProfiledRank, ...]:
    """The ranks of the traces at ``paths`` (one per rank, or one holding them all),
    ordered by rank."""
    if not paths:
        raise TraceError("give at least one profiler trace (torch.profiler's Chrome JSON)")
    ranks: list[ProfiledRank] = []
    for path in paths:
        data = read_json(path, what="profiler trace")
        ranks.extend(_ranks_of(data, source=str(path)))
    if len(paths) > 1 and len(ranks) != len(paths):
        raise TraceError(
            f"{len(paths)} trace files hold {len(ranks)} processes; give one file per rank, "
            "or one file holding every rank"
        )
    found = sorted(ranks, key=lambda r: r.rank)
    numbers = [r.rank for r in found]
    if numbers != list(range(len(found))):
        raise TraceError(
            f"the traces are of ranks {numbers}; give one trace of each rank 0..n-1 "
            f"({', '.join(f'{r.source}: rank {r.rank}' for r in found)})"
        )
    return tuple(found)


def _ranks_of(data: object, *, source: str) -> list[ProfiledRank]:
    if not is_kineto(data):
        raise TraceError(
            f"{source}: not a torch.profiler trace (expected a JSON object with "
            '"traceEvents", as `prof.export_chrome_trace(path)` writes)'
        )
    assert isinstance(data, dict)
    events = data["traceEvents"]
    if not isinstance(events, list):
        raise TraceError(f"{source}: traceEvents is {brief(events)}, not a list of events")
    base = data.get("baseTimeNanoseconds", 0)
    if isinstance(base, bool) or not isinstance(base, int):
        raise TraceError(f"{source}: baseTimeNanoseconds is {brief(base)}, not a whole number")
    info = data.get("distributedInfo")
    by_pid: dict[Any, list[dict[str, Any]]] = defaultdict(list)
    for k, event in enumerate(events):
        if not isinstance(event, dict):
            raise TraceError(f"{source}: traceEvents[{k}] is {brief(event)}, not an object")
        if event.get("ph") in ("X", "s", "f") and isinstance(event.get("pid"), int):
            by_pid[event["pid"]].append(event)
    if not by_pid:
        raise TraceError(
            f"{source}: no complete events of a process; profile the step with "
            "torch.profiler.profile(activities=[ProfilerActivity.CPU])"
        )
    pids = sorted(by_pid)
    fixed = info.get("rank") if isinstance(info, dict) and len(pids) == 1 else None
    if fixed is not None and (isinstance(fixed, bool) or not isinstance(fixed, int)):
        raise TraceError(f"{source}: distributedInfo.rank is {brief(fixed)}, not a rank")
    return [
        _rank(
            by_pid[pid],
            rank=fixed if fixed is not None else k,
            pid=pid,
            base=base,
            source=source,
            host=data.get("host_name"),
        )
        for k, pid in enumerate(pids)
    ]


def _ns(event: dict[str, Any], key: str, base: int, source: str) -> int:
    value = event.get(key)
    if isinstance(value, bool) or not isinstance(value, int | float) or value != value:
        raise TraceError(
            f"{source}: event {brief(event.get('name'))} has {key} {brief(value)}; a "
            f"Chrome trace event's {key} is a number of microseconds"
        )
    if key == "dur" and value < 0:
        raise TraceError(f"{source}: event {brief(event.get('name'))} has a negative dur {value}")
    return round(value * 1000) + (base if key == "ts" else 0)


def _rank(
    events: list[dict[str, Any]], *, rank: int, pid: Any, base: int, source: str, host: Any
) -> ProfiledRank:
    complete = [e for e in events if e.get("ph") == "X"]
    gpu = sum(1 for e in complete if e.get("cat") in _GPU_CATS)
    ops: dict[Any, int] = defaultdict(int)
    for e in complete:
        if e.get("cat") == "cpu_op":
            ops[e.get("tid")] += 1
    if not ops:
        raise TraceError(
            f"{source}: process {pid} has no CPU operators (cat cpu_op); profile with "
            "activities=[ProfilerActivity.CPU]"
        )
    tid: int | str = max(ops, key=lambda t: ops[t])  # the thread that runs the schedule
    mine = [
        _Event(
            name=str(e.get("name", "")),
            start=(start := _ns(e, "ts", base, source)),
            end=start + _ns(e, "dur", base, source),
            cat=str(e.get("cat", "")),
        )
        for e in complete
        if e.get("tid") == tid
    ]
    starts: dict[Any, int] = {}
    flows: dict[Any, tuple[int, int]] = {}
    for e in events:
        if e.get("cat") != "fwdbwd":
            continue
        if e.get("ph") == "s":
            starts[e.get("id")] = _ns(e, "ts", base, source)
        elif e.get("id") in starts:
            flows[e.get("id")] = (starts[e.get("id")], _ns(e, "ts", base, source))
    return ProfiledRank(
        rank=rank,
        source=source,
        pid=pid,
        tid=tid,
        host=host if isinstance(host, str) else None,
        events=tuple(sorted(mine, key=lambda e: (e.start, -e.end))),
        flows=flows,
        gpu_events=gpu,
    )


# -- steps -------------------------------------------------------------------------------
def measured_steps(
    ranks: Sequence[ProfiledRank], /, *, step: int | None = None
) -> tuple[ProfiledStep, ...]:
    """The steps the traces of ``ranks`` hold (``step``: only ``ProfilerStep#step``)."""
    gpu = [r.rank for r in ranks if r.gpu_events]
    if gpu:
        raise TraceError(
            f"the traces of ranks {gpu} hold GPU kernels; this reader times actions on the "
            "CPU timeline only, which on a GPU times the launches: calibrate from a CPU run, "
            "or from `pipesim verify` on the GPU (--costs-out)"
        )
    windows = _windows(ranks, step)
    return tuple(_step(ranks, label, window) for label, window in windows)


def _windows(
    ranks: Sequence[ProfiledRank], step: int | None
) -> list[tuple[str, list[tuple[int, int]]]]:
    """Per step label, each rank's (start, end) of it."""
    marks = [
        {int(m[1]): (e.start, e.end) for e in r.events if (m := _STEP.fullmatch(e.name))}
        for r in ranks
    ]
    common = sorted(set.intersection(*(set(m) for m in marks))) if marks else []
    if step is not None:
        if step not in common:
            raise TraceError(
                f"no ProfilerStep#{step} on every rank; the traces have steps {common or 'none'}"
            )
        common = [step]
    if not common:
        if any(marks):
            raise TraceError(
                "the ranks' traces share no ProfilerStep#N; profile the same steps on every rank"
            )
        return [("whole trace", [(-(2**62), 2**62)] * len(ranks))]
    return [(f"ProfilerStep#{n}", [m[n] for m in marks]) for n in common]


@dataclass(slots=True)
class _Run:
    kind: str  # "F" or "B"
    ops: list[_Event]

    @property
    def start(self) -> int:
        return self.ops[0].start

    @property
    def end(self) -> int:
        return max(e.end for e in self.ops)


def _is_comm(name: str) -> bool:
    return name.startswith(_COMM_PREFIXES)


def _outermost(events: Iterable[_Event]) -> list[_Event]:
    """The CPU operators not inside another one (events sorted by start, longest first)."""
    found: list[_Event] = []
    end = -(2**62)
    for e in events:
        if e.cat != "cpu_op":
            continue
        if e.start >= end:
            found.append(e)
            end = e.end
    return found


def _step(ranks: Sequence[ProfiledRank], label: str, window: list[tuple[int, int]]) -> ProfiledStep:
    orders: list[list[Action]] = []
    spans: dict[Action, tuple[int, int, int]] = {}
    annotated, comms = [], []
    for profile, (lo, hi) in zip(ranks, window, strict=True):
        inside = [e for e in profile.events if lo <= e.start and e.end <= hi]
        comms.append(sum(1 for e in _outermost(inside) if _is_comm(e.name)))
        marked = [e for e in inside if _ANNOTATION.fullmatch(e.name)]
        found = _annotated(marked, inside) if marked else _unannotated(profile, inside)
        annotated.append(bool(marked))
        orders.append([a for a, _, _ in found])
        for action, start, end in found:
            if action in spans:
                raise TraceError(
                    f"{profile.source}: {action} ran twice in {label} (ranks "
                    f"{spans[action][2]} and {profile.rank}); give the trace of one step"
                )
            spans[action] = (start, end, profile.rank)
    if not spans:
        raise TraceError(
            f"{label}: no action found in the traces (no record_function range named like "
            "0F3, and no forward operator linked to a backward); profile a training step "
            "of the pipeline"
        )
    schedule = _schedule(orders, ranks, label)
    origin = min(s for s, _, _ in spans.values())
    records = tuple(
        sorted(
            (
                ActionRecord(rank=r, work=a, start=s - origin, end=e - origin)
                for a, (s, e, r) in spans.items()
            ),
            key=lambda rec: (rec.start, rec.rank),
        )
    )
    busy = [0] * len(ranks)
    for rec in records:
        busy[rec.rank] += int(rec.end - rec.start)
    return ProfiledStep(
        step=MeasuredStep(schedule=schedule, trace=Trace(n_ranks=len(ranks), actions=records)),
        label=label,
        annotated=tuple(annotated),
        busy_ns=tuple(busy),
        comms=tuple(comms),
    )


def _schedule(orders: list[list[Action]], ranks: Sequence[ProfiledRank], label: str) -> Schedule:
    actions = [a for o in orders for a in o]
    n_microbatches = max(a.microbatch for a in actions) + 1
    try:
        return Schedule.from_orders(
            orders, n_microbatches=n_microbatches, name=f"profiled ({label})"
        )
    except ScheduleError as exc:
        per_rank = "; ".join(
            f"rank {r.rank}: {' '.join(map(str, o[:8]))}{' ...' if len(o) > 8 else ''}"
            for r, o in zip(ranks, orders, strict=True)
        )
        raise TraceError(
            f"{label}: the actions found do not make a pipeline schedule ({exc}); found {per_rank}"
        ) from None


def _annotated(marked: list[_Event], inside: list[_Event]) -> list[tuple[Action, int, int]]:
    """Each action range's compute: the span of the operators inside it, communication
    left out (torch's runtime waits for an action's receives inside its range, and the
    wait is no operator; a range with no operator is its own span)."""
    found = []
    starts = [e.start for e in inside]
    for mark in marked:
        match = _ANNOTATION.fullmatch(mark.name)
        assert match is not None
        work = parse_action(match[1])
        assert isinstance(work, Action)
        within = [
            e
            for e in inside[bisect_right(starts, mark.start - 1) :]
            if e.end <= mark.end and e is not mark
        ]
        ops = [e for e in _outermost(within) if not _is_comm(e.name)]
        if ops:
            found.append((work, ops[0].start, max(e.end for e in ops)))
        else:
            found.append((work, mark.start, mark.end))
    return found


def _runs(profile: ProfiledRank, inside: list[_Event]) -> list[_Run]:
    """The outermost operators cut at communication and at forward <-> backward."""
    runs: list[_Run] = []
    current: _Run | None = None
    for e in _outermost(inside):
        if _is_comm(e.name):
            current = None
            continue
        kind = "B" if e.name.startswith(_BACKWARD) else "F"
        if current is None or current.kind != kind:
            current = _Run(kind=kind, ops=[])
            runs.append(current)
        current.ops.append(e)
    return runs


def _holds(times: Sequence[int], event: _Event) -> bool:
    """Whether a time of the sorted ``times`` lies inside ``event``."""
    i = bisect_right(times, event.end)
    return i > 0 and times[i - 1] >= event.start


def _unannotated(profile: ProfiledRank, inside: list[_Event]) -> list[tuple[Action, int, int]]:
    """Forward and backward runs paired by their autograd flows (module docstring)."""
    runs = _runs(profile, inside)
    bounds = sorted((r.start, r.end, k) for k, r in enumerate(runs))
    run_starts = [b[0] for b in bounds]

    def run_at(t: int) -> int | None:
        i = bisect_right(run_starts, t) - 1
        return bounds[i][2] if i >= 0 and t <= bounds[i][1] else None

    backward_of: dict[int, set[int]] = defaultdict(set)
    forward_of: dict[int, set[int]] = defaultdict(set)
    for fwd_t, bwd_t in profile.flows.values():
        f, b = run_at(fwd_t), run_at(bwd_t)
        if f is not None and b is not None and runs[f].kind == "F" and runs[b].kind == "B":
            backward_of[f].add(b)
            forward_of[b].add(f)
    for k, linked in list(backward_of.items()) + list(forward_of.items()):
        if len(linked) > 1:
            raise TraceError(
                f"{profile.source}: rank {profile.rank}: the operators at "
                f"{runs[k].start - runs[0].start} ns after the rank's first run back "
                f"{len(linked)} micro-batches without a send or receive between them; record "
                "each action with torch.profiler.record_function('0F3') (stage, op, "
                "micro-batch) to tell them apart"
            )
    # A forward's compute: from its first to its last operator with a backward (splitting
    # the batch before it, detaching the output or seeding the loss's gradient after it
    # are the schedule's, not the stage's).
    flow_starts = sorted(fwd_t for fwd_t, _ in profile.flows.values())
    for k in backward_of:
        held = [e for e in runs[k].ops if _holds(flow_starts, e)]
        runs[k] = _Run(kind="F", ops=held or runs[k].ops)
    forwards = sorted(backward_of, key=lambda k: runs[k].start)
    microbatch = {k: n for n, k in enumerate(forwards)}
    found = []
    for k in range(len(runs)):
        if k in microbatch:
            found.append((Action(stage=profile.rank, op=Op.F, microbatch=microbatch[k]), k))
        elif k in forward_of:
            (f,) = forward_of[k]
            found.append((Action(stage=profile.rank, op=Op.B, microbatch=microbatch[f]), k))
    return [(a, runs[k].start, runs[k].end) for a, k in found]


def profile_costs(
    paths: Sequence[str | Path], /, *, step: int | None = None, send_mode: str = "eager"
) -> tuple[CostModel, dict[str, Any], tuple[ProfiledStep, ...]]:
    """A cost model (time unit: ns) from the profiler traces at ``paths``, fitted as
    ``pipesim calibrate`` fits its own runs (:func:`pipesim.calibration.fit_costs` over
    every step found, or ``ProfilerStep#step`` alone), the ``meta`` a cost file keeps
    with it (the fit's figures and their samples, and the provenance: trace files, rank,
    process, thread and host of each, the steps, the device), and the steps read."""
    ranks = read_profile(paths)
    found = measured_steps(ranks, step=step)
    steps = [s.step for s in found]
    cuts = {s.schedule.n_stages for s in steps}
    if len(cuts) != 1:
        raise TraceError(
            f"the traces' steps cut the model into {sorted(cuts)} stages; give steps of one cut"
        )
    fit = term_stability(
        steps, fit_costs(steps, time_unit="ns", send_mode=send_mode), send_mode=send_mode
    )
    first = found[0].step.schedule
    meta: dict[str, Any] = {
        "time_unit": "ns",
        "source": "pipesim calibrate --from-trace (torch.profiler)",
        "trace_files": [str(p) for p in paths],
        "ranks": [
            {"rank": r.rank, "file": r.source, "pid": r.pid, "tid": r.tid, "host": r.host}
            for r in ranks
        ],
        "steps": [s.label for s in found],
        "device": "cpu",
        "schedule": first.name,
        "actions": {str(r): [str(w) for w in o] for r, o in enumerate(first.orders)},
        "annotated": list(found[0].annotated),
        "n_ranks": first.n_ranks,
        "n_stages": first.n_stages,
        "virtual": first.n_stages // first.n_ranks,
        "n_microbatches": first.n_microbatches,
        "busy_ns": [list(s.busy_ns) for s in found],
        **fit_meta(fit),
    }
    return fit.costs, meta, found
