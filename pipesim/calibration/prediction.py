"""Predictions from a calibrated cost model, spanned as an executor measures a step:
:func:`predict`, :func:`replay` (measured compute times, fitted overheads),
:func:`compute_span`; the cost model of a schedule from calibrated cuts (:func:`costs_for`)."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace

from pipesim.calibration.measured import (
    MeasuredStep,
    _records_by_node,
    compute_only,
    measured_makespan,
)
from pipesim.costs import CostModel
from pipesim.engine import run_compiled, simulate
from pipesim.errors import CostError
from pipesim.exact import Time
from pipesim.schedule import Schedule
from pipesim.step import compile_step
from pipesim.step.structure import step_structure

__all__ = ["compute_span", "costs_for", "cut_stages", "predict", "replay"]


def costs_for(schedule: Schedule, cuts: Mapping[int, CostModel], /) -> CostModel:
    """The cost model of ``schedule`` from calibrated ``cuts`` (stage count -> costs);
    with ``n_copies > 1`` every copy is the cut into ``n_stages / n_copies`` stages."""
    per_copy = schedule.n_stages // schedule.n_copies
    costs = cuts.get(per_copy)
    if costs is None:
        raise CostError(
            f"no calibration for a cut into {per_copy} stages (have {sorted(cuts)}); "
            f"calibrate with --virtual {max(per_copy // schedule.n_ranks, 1)}"
        )
    cut = costs.for_stages(per_copy).stages
    return replace(costs, stages=tuple(cut[k] for k in cut_stages(schedule)))


def cut_stages(schedule: Schedule, /) -> tuple[int, ...]:
    """Per stage of ``schedule``, the stage of the calibrated cut whose costs it takes
    (:func:`costs_for`): itself, or with ``n_copies > 1`` its place in its model copy.

    >>> from pipesim.schedules import generate
    >>> cut_stages(generate("dualpipe", n_ranks=2, n_microbatches=4))
    (0, 1, 0, 1)
    """
    return tuple(range(schedule.n_stages // schedule.n_copies)) * schedule.n_copies


def predict(schedule: Schedule, costs: CostModel, /) -> Time:
    """The step an executor would measure (first compute start to last compute end,
    :func:`measured_makespan`) as pipesim predicts it from ``costs``."""
    trace = simulate(schedule, costs=costs).trace
    return measured_makespan(compute_only(trace, schedule, costs))


def replay(step: MeasuredStep, costs: CostModel, /) -> Time:
    """The step pipesim predicts when every unit of work takes the compute time measured
    for it in ``step`` and the overheads of ``costs`` (dispatch, send, receive, latency,
    links), as :func:`measured_makespan` spans it.

    Against the measured makespan this is the model's own error (dependencies, overheads,
    messages), without the run-to-run variation of compute speed that a prediction from
    per-op medians also carries. 1F1B, one micro-batch, F=10, B=20, latency 3, send 1,
    receive 4, dispatch 2, measured with 1F0 taking 15 instead of 10: 0F0 computes 0..10,
    1F0 20..35, 1B0 37..57, 0B0 67..87:

    >>> from pipesim.costs import Link
    >>> from pipesim.schedules import generate
    >>> from pipesim.trace import ActionRecord, Trace
    >>> costs = CostModel.uniform(forward=10, backward=20, dispatch_overhead=2,
    ...     link=Link(latency=3, send_overhead=1, receive_overhead=4))
    >>> schedule = generate("1f1b", n_ranks=2, n_microbatches=1)
    >>> spans = {"0F0": (0, 10), "1F0": (20, 35), "1B0": (37, 57), "0B0": (67, 87)}
    >>> records = [ActionRecord(rank=r, work=w, start=spans[str(w)][0], end=spans[str(w)][1])
    ...            for r, order in enumerate(schedule.orders) for w in order]
    >>> replay(MeasuredStep(schedule=schedule, trace=Trace(n_ranks=2, actions=tuple(records))),
    ...        costs)
    87
    """
    schedule = step.schedule
    records = _records_by_node(step_structure(schedule), step.trace)
    return compute_span(schedule, costs)([r.end - r.start for r in records])


def compute_span(schedule: Schedule, costs: CostModel, /) -> Callable[[Sequence[Time]], Time]:
    """The step pipesim predicts, as :func:`measured_makespan` spans it, as a function of
    each unit of work's compute time (in ``step_structure(schedule).works`` order), with
    the overheads of ``costs`` (dispatch, send, receive, latency, links) around them.

    Compiled once, so that many sets of compute times (:func:`replay`, the draws of
    :func:`pipesim.band.predict_band`) each cost one engine run. With the compute times of
    ``costs`` themselves it is :func:`predict`. 1F1B, one micro-batch (units of work
    0F0, 0B0, 1F0, 1B0), dispatch 2: a chain of four, so 2 + 10 + 2 + 10 + 2 + 20 + 2 +
    20 from 0F0's compute start, and 5 more when 1F0 computes 15:

    >>> from pipesim.schedules import generate
    >>> costs = CostModel.uniform(forward=10, backward=20, dispatch_overhead=2)
    >>> schedule = generate("1f1b", n_ranks=2, n_microbatches=1)
    >>> span = compute_span(schedule, costs)
    >>> predict(schedule, costs), span([10, 20, 10, 20]), span([10, 20, 15, 20])
    (66, 66, 71)
    """
    costs = costs.for_stages(schedule.n_stages)
    structure = step_structure(schedule)
    compiled = compile_step(structure, costs)
    # The same model with no compute: each node's duration is then its overheads alone.
    bare = replace(
        costs,
        stages=tuple(
            replace(c, forward=0, backward=0, input_grad=0, weight_grad=0, overlap=None)
            for c in costs.stages
        ),
    )
    overheads = compile_step(structure, bare).durations
    n_works = len(structure.works)

    def span(compute: Sequence[Time], /) -> Time:
        if len(compute) != n_works:
            raise CostError(
                f"{len(compute)} compute times for the {n_works} units of work of "
                f"{schedule.name!r}; give one per unit of work, in step_structure order"
            )
        durations = (
            *(o + c for o, c in zip(overheads, compute, strict=False)),
            *overheads[n_works:],
        )
        trace = run_compiled(replace(compiled, durations=durations))
        return measured_makespan(compute_only(trace, schedule, costs))

    return span
