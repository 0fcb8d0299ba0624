"""Set-ups that several test modules share (imported as ``helpers``: pytest puts tests/
on the path of the modules it collects here)."""

from __future__ import annotations

from pipesim.plan.hardware import Accelerator, get_accelerator
from pipesim.plan.sweep import Evaluation, Point, SweepContext, evaluate_points
from pipesim.plan.workload import Workload


def one_point(
    workload: Workload,
    /,
    *,
    pipeline: int,
    schedule: str = "1f1b",
    virtual: int = 1,
    microbatch_size: int = 1,
    n_microbatches: int | None = None,
    data_parallel: int = 1,
    accelerator: Accelerator | None = None,
    memory_capacity_bytes: int = 10**12,
) -> tuple[SweepContext, Point]:
    """The planner's sweep reduced to one configuration: ``workload`` on
    ``pipeline * data_parallel`` devices (default an h100-sxm each, a capacity nothing
    exceeds), ``n_microbatches`` defaulting to ``pipeline``."""
    context = SweepContext(
        workload=workload,
        devices=pipeline * data_parallel,
        accelerator=accelerator if accelerator is not None else get_accelerator("h100-sxm"),
        memory_capacity_bytes=memory_capacity_bytes,
    )
    point = Point(
        schedule=schedule,
        pipeline=pipeline,
        virtual=virtual,
        microbatch_size=microbatch_size,
        n_microbatches=pipeline if n_microbatches is None else n_microbatches,
        data_parallel=data_parallel,
    )
    return context, point


def evaluate_one_point(workload: Workload, /, **kwargs: object) -> Evaluation:
    """:func:`one_point` evaluated in this process."""
    context, point = one_point(workload, **kwargs)  # type: ignore[arg-type]
    (evaluation,) = evaluate_points(context, [point], workers=1)
    return evaluation
