"""What Megatron-LM's pipeline exchange would change on bench_published's pipelined rows.

Megatron-LM's interleaved schedule without ``overlap_p2p_comm`` runs each steady-state
forward and the backward after it before it communicates, then sends the forward's
output and the backward's input gradient and receives the next pair's two inputs in one
batched, blocking call (``send_forward_backward_recv_forward_backward`` after
``forward_step_helper`` and ``backward_step_helper``: ``megatron/schedules.py`` of
mid-2022, the code Korthikanti et al. 2023 ran, and Megatron-Core's
``forward_backward_pipelining_with_interleaving`` without ``overlap_p2p_comm``). In
pipesim's words that pair is one overlapped unit of work (:class:`pipesim.actions.Overlap`,
duration the sum of its parts): it starts once both inputs arrived and sends both
messages at its end. The planner instead runs the forward and the backward as two units,
each sending (and, with blocking sends, waiting for) its own message.

For every interleaved row of ``bench_published.py`` this prints the pipeline's makespan
both ways, with the planner's cost model, and the error against the published figure
each gives; then, for every pipelined row, how much time each pipeline exchange would
have to cost for the prediction to meet the published one (the gap divided by the
exchanges of the busiest rank: one per forward-backward pair interleaved, two without).
Run: ``python benchmarks/bench_megatron_exchange.py`` (about 10 s).
"""

from __future__ import annotations

import sys
from pathlib import Path

from pipesim.actions import Action, Op, Overlap, Work
from pipesim.costs import CostModel
from pipesim.plan.fastsim import compile_schedule, evaluate
from pipesim.plan.planner import configuration
from pipesim.schedule import Schedule

sys.path.insert(0, str(Path(__file__).parent))
import bench_published as published


def megatron_pairs(schedule: Schedule, /) -> Schedule:
    """``schedule`` with each forward that its rank follows at once by a backward run as
    one unit with it: Megatron's steady state (warm-up forwards and cool-down backwards
    stay single). The last stage's forward and the backward of the same micro-batch stay
    two units (the forward sends nothing, and pipesim's pairs hold independent work):
    the same timing as one unit."""
    orders: list[list[Work]] = []
    for order in schedule.orders:
        paired: list[Work] = []
        i = 0
        while i < len(order):
            work = order[i]
            after = order[i + 1] if i + 1 < len(order) else None
            if _pairs(work, after):
                assert isinstance(work, Action) and isinstance(after, Action)
                paired.append(Overlap(parts=(work, after)))
                i += 2
            else:
                paired.append(work)
                i += 1
        orders.append(paired)
    return Schedule.from_orders(
        orders,
        placement=schedule.placement,
        n_microbatches=schedule.n_microbatches,
        name=f"{schedule.name} (Megatron pairs)",
    )


def _pairs(work: Work, after: Work | None) -> bool:
    """Whether Megatron runs ``work`` and ``after`` before one exchange: a forward and the
    backward after it, of another stage or micro-batch."""
    if not (isinstance(work, Action) and isinstance(after, Action)):
        return False
    same = (work.stage, work.microbatch) == (after.stage, after.microbatch)
    return work.op == Op.F and after.op == Op.B and not same


def _schedule_and_costs(
    table: published.Table, run: published.Run
) -> tuple[Schedule, CostModel, int, int]:
    """The planner's schedule and cost model of ``run``, its step (ns) and micro-batches."""
    result, point = published.plan_of(table, run)
    schedule, costs = configuration(result, point, model=table.model(run))
    assert point.step_time_ns is not None
    return schedule, costs, point.step_time_ns, point.n_microbatches


def _error(table: published.Table, run: published.Run, step_s: float) -> float:
    if table.measure == "seconds":
        return step_s / run.published - 1
    assert table.flops is not None
    return table.flops(run, table.model(run)) / (step_s * run.gpus) / 1e12 / run.published - 1


def _published_seconds(table: published.Table, run: published.Run) -> float:
    if table.measure == "seconds":
        return run.published
    assert table.flops is not None
    return table.flops(run, table.model(run)) / (run.published * 1e12 * run.gpus)


def main() -> int:
    print("Interleaved rows: the planner's sends against Megatron's exchange after each pair")
    print(
        f"  {'run':>22} {'makespan s':>11} {'paired s':>9} {'change':>7} {'error':>7} {'paired':>7}"
    )
    pipelined = []
    for table in published.TABLES:
        for run in table.runs:
            if run.pipeline == 1:
                continue
            schedule, costs, step_ns, m = _schedule_and_costs(table, run)
            pipelined.append((table, run, step_ns, m))
            if run.virtual == 1:
                continue
            base = evaluate(compile_schedule(schedule), costs).makespan
            pairs = evaluate(compile_schedule(megatron_pairs(schedule)), costs).makespan
            name = f"{table.accelerator} {run.name}"
            print(
                f"  {name:>22} {base / 1e9:>11.3f} {pairs / 1e9:>9.3f} {pairs / base - 1:>+7.2%} "
                f"{_error(table, run, step_ns / 1e9):>+7.1%} "
                f"{_error(table, run, (step_ns - base + pairs) / 1e9):>+7.1%}"
            )
    print("\nWhat each pipeline exchange would have to cost to meet the published figure")
    columns = f"{'gap s':>8} {'exchanges':>10} {'ms each':>8} {'ms a pair':>10} {'of step':>8}"
    print(f"  {'run':>22} {columns}")
    for table, run, step_ns, m in pipelined:
        gap = _published_seconds(table, run) - step_ns / 1e9
        pairs = m * run.virtual
        exchanges = pairs if run.virtual > 1 else 2 * m
        name = f"{table.accelerator} {run.name}"
        print(
            f"  {name:>22} {gap:>+8.3f} {exchanges:>10} {gap / exchanges * 1e3:>8.2f} "
            f"{gap / pairs * 1e3:>10.2f} {gap / (step_ns / 1e9):>+8.1%}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
