"""What an executor measures: the calibration schedule it runs, and the converse of the
fit, a simulated step as an executor measures it (:func:`compute_only`,
:func:`measured_makespan`)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

from pipesim.actions import Action, Op, Work
from pipesim.costs import CostModel
from pipesim.errors import CostError
from pipesim.exact import Time
from pipesim.schedule import Schedule
from pipesim.schedules import generate
from pipesim.step.cost_tables import comm_overhead
from pipesim.step.structure import StepStructure, step_structure
from pipesim.trace import ActionRecord, Trace

__all__ = ["MeasuredStep", "calibration_schedule", "compute_only", "measured_makespan"]


@dataclass(frozen=True, slots=True, kw_only=True)
class MeasuredStep:
    """One measured step: the schedule that ran and its compute-only action records."""

    schedule: Schedule
    trace: Trace


def calibration_schedule(*, n_ranks: int, n_microbatches: int, virtual: int = 1) -> Schedule:
    """1F1B (``virtual`` 1) or interleaved 1F1B with every odd micro-batch's backward split
    into I then W, so that one run measures F, B, I and W of every stage.

    It is none of the registered families, so every registered schedule is
    predicted out of sample.

    >>> s = calibration_schedule(n_ranks=2, n_microbatches=2)
    >>> [str(w) for w in s.orders[1]]
    ['1F0', '1B0', '1F1', '1I1', '1W1']
    """
    base = (
        generate("1f1b", n_ranks=n_ranks, n_microbatches=n_microbatches)
        if virtual == 1
        else generate(
            "interleaved-1f1b", n_ranks=n_ranks, n_microbatches=n_microbatches, virtual=virtual
        )
    )
    orders: list[list[Work]] = []
    for order in base.orders:
        new: list[Work] = []
        for work in order:
            if isinstance(work, Action) and work.op is Op.B and work.microbatch % 2:
                new.append(Action(stage=work.stage, op=Op.I, microbatch=work.microbatch))
                new.append(Action(stage=work.stage, op=Op.W, microbatch=work.microbatch))
            else:
                new.append(work)
        orders.append(new)
    return Schedule.from_orders(
        orders,
        placement=base.placement,
        n_microbatches=n_microbatches,
        name=f"calibration (mixed-backward {base.name})",
    )


def _records_by_node(structure: StepStructure, trace: Trace) -> list[ActionRecord]:
    by_work: dict[Work, ActionRecord] = {r.work: r for r in trace.actions}
    missing = [str(w) for w in structure.works if w not in by_work]
    if missing:
        raise CostError(
            f"the measured trace has no record of {missing[:5]} of schedule "
            f"{structure.schedule.name!r}; give the trace of that schedule's step"
        )
    return [by_work[w] for w in structure.works]


def compute_only(trace: Trace, schedule: Schedule, costs: CostModel, /) -> Trace:
    """``trace`` (simulated with ``costs``) as an executor measures it: each unit of work
    without its dispatch, receive and send overheads; records shifted so the first
    compute starts at 0."""
    structure = step_structure(schedule)
    costs = costs.for_stages(schedule.n_stages)
    before, after = _message_overheads(structure, costs)
    records = _records_by_node(structure, trace)
    inner = []
    for node, record in enumerate(records):
        start = record.start + costs.dispatch_overhead + before[node]
        end = record.end - after[node]
        inner.append(replace(record, start=start, end=end))
    origin = min((r.start for r in inner), default=0)
    shifted = sorted(
        (replace(r, start=r.start - origin, end=r.end - origin) for r in inner),
        key=lambda r: (r.start, r.rank),
    )
    return Trace(n_ranks=trace.n_ranks, actions=tuple(shifted))


def _message_overheads(structure: StepStructure, costs: CostModel) -> tuple[list[Time], list[Time]]:
    """Per node, the receive overheads of the messages it takes and the send overheads of
    those it sends, each message over its own rank pair's link (as the engine charges
    them: :func:`pipesim.step.cost_tables.comm_overhead` of :meth:`CostModel.link_between`)."""
    messages = structure.messages
    n = len(messages)

    def total(arrivals: Sequence[int], *, send: bool) -> Time:
        return sum(
            (
                comm_overhead(costs.link_between(m.src_rank, m.dst_rank), send=send)
                for m in (messages[a] for a in arrivals if a < n)
            ),
            start=0,
        )

    before = [total(ins, send=False) for ins in structure.inputs]
    after = [total(out, send=True) for out in structure.outputs]
    return before, after


def measured_makespan(trace: Trace, /) -> Time:
    """First compute start to last compute end: the span an executor reports."""
    if not trace.actions:
        return 0
    return max(r.end for r in trace.actions) - min(r.start for r in trace.actions)
