"""verify.calibrate: measured trace, calibrated costs (the fit of pipesim calibrate),
predicted vs measured.

No timing asserts: the figures are whatever the machine measured; the tests
check how they are turned into pipesim objects, against closed forms.
"""

from __future__ import annotations

import itertools
import json
import statistics
from fractions import Fraction

import pytest

torch = pytest.importorskip("torch")

from pipesim.actions import Action, Op  # noqa: E402
from pipesim.cli import main  # noqa: E402
from pipesim.costs import Link, load_costs  # noqa: E402
from pipesim.engine import simulate  # noqa: E402
from pipesim.schedules import generate  # noqa: E402
from verify.calibrate import (  # noqa: E402
    as_run_schedule,
    calibrate,
    measured_trace,
    save_costs,
)
from verify.compare import split_microbatches, verify  # noqa: E402
from verify.local import LocalRun, run_schedule  # noqa: E402
from verify.models import mlp  # noqa: E402
from verify.stage_cut import cut_stages, param_bytes  # noqa: E402

pytestmark = pytest.mark.torch


def _run(name: str = "1f1b", p: int = 2, m: int = 4, batch: int = 32) -> LocalRun:
    schedule = generate(name, n_ranks=p, n_microbatches=m)
    model = mlp()
    x, target = model.make_batch(batch)
    return run_schedule(
        schedule,
        cut_stages(model.layers, n_stages=p),
        devices=["cpu"] * p,
        inputs=split_microbatches(x, m),
        targets=split_microbatches(target, m),
        loss_fn=model.loss_fn,
    )


def test_measured_trace_holds_every_unit_of_work_in_rank_order() -> None:
    run = _run()
    trace = measured_trace(run)
    assert trace.n_ranks == 2
    assert len(trace.actions) == sum(len(o) for o in run.schedule.orders)
    for rank in range(2):
        ours = [r.work for r in sorted(trace.rank_actions(rank), key=lambda r: r.start)]
        assert ours == list(run.schedule.orders[rank])
    assert all(r.end >= r.start >= 0 for r in trace.actions)
    assert trace.makespan == max(
        max(r.end for r in trace.actions), max(t.end for t in trace.transfers)
    )
    # One host thread on the CPU: measured actions never overlap.
    spans = sorted((r.start, r.end) for r in trace.actions)
    assert all(a_end <= b_start for (_, a_end), (b_start, _) in itertools.pairwise(spans))
    # 1f1b p=2 m=4: 4 activations 0->1 and 4 gradients 1->0 cross ranks.
    assert len(trace.transfers) == 8
    assert {t.n_bytes for t in trace.transfers} == {8 * 96 * 4}


def test_calibrated_costs_are_the_fit_pipesim_calibrate_makes() -> None:
    run = _run()
    stages = cut_stages(mlp().layers, n_stages=2)
    costs = calibrate(run, devices=["cpu", "cpu"], param_bytes=[param_bytes(s) for s in stages])
    for stage in range(2):
        for op in (Op.F, Op.B):
            measured = [
                t.end_ns - t.start_ns
                for t in run.actions
                if isinstance(t.work, Action) and t.work.stage == stage and t.work.op is op
            ]
            assert len(measured) == 4
            assert costs.stage(stage).duration(op) == round(statistics.median(measured))
        cost = costs.stage(stage)
        assert cost.input_grad + cost.weight_grad == cost.backward  # split of an unsplit B
    # One host thread runs every rank: the gap between one unit of work and the next is
    # the dispatch overhead (the schedule as it ran is one rank: no message crosses). One
    # step: the 15 gaps in measured order make three blocks of five, and the figure is the
    # median of the blocks' means (pipesim.calibration.robust)
    spans = sorted((t.start_ns, t.end_ns) for t in run.actions)
    gaps = [b_start - a_end for (_, a_end), (b_start, _) in itertools.pairwise(spans)]
    assert len(gaps) == 15
    means = sorted(Fraction(sum(gaps[k : k + 5]), 5) for k in (0, 5, 10))
    assert costs.dispatch_overhead == max(round(means[1]), 0)
    assert costs.stage(0).output_bytes == 8 * 96 * 4
    assert costs.stage(1).output_bytes == 0
    assert (costs.stage(0).param_bytes, costs.stage(1).param_bytes) == (43_776, 38_800)
    # Bytes saved for backward, counted by hand for 8 rows: stage 0 keeps the 16 input
    # features and three 96-wide tensors (GELU in, Linear in, GELU in); stage 1 three.
    assert costs.stage(0).activation_bytes == 8 * (16 + 3 * 96) * 4
    assert costs.stage(1).activation_bytes == 8 * 3 * 96 * 4
    assert costs.link == Link()  # every rank on the one CPU: no link was measured


def test_prediction_for_one_host_thread_is_the_sum_of_costs() -> None:
    run = _run("gpipe", p=3, m=3)
    costs = calibrate(run, devices=["cpu"] * 3)
    as_run = as_run_schedule(run.schedule, executed=run.executed, devices=["cpu"] * 3)
    assert as_run.n_ranks == 1 and list(as_run.orders[0]) == list(run.executed)
    predicted = simulate(as_run, costs=costs).metrics.makespan
    n_units = len(run.executed)  # each holds the thread for its dispatch, then its compute
    assert predicted == sum(costs.duration(w) for w in run.executed) + n_units * (
        costs.dispatch_overhead
    )


def test_as_run_schedule_merges_ranks_per_cuda_device() -> None:
    schedule = generate("1f1b", n_ranks=3, n_microbatches=2)
    executed = [w for order in schedule.orders for w in order]  # any order works for the shape
    merged = as_run_schedule(schedule, executed=executed, devices=["cuda:0", "cuda:0", "cuda:1"])
    assert merged.n_ranks == 2 and merged.placement == (0, 0, 1)
    assert [str(a) for a in merged.orders[1]] == [str(a) for a in schedule.orders[2]]
    separate = as_run_schedule(schedule, executed=executed, devices=["cuda:0", "cuda:1", "cuda:2"])
    assert separate.orders == schedule.orders


def test_cost_file_round_trips_into_pipesim_simulate(tmp_path, capsys) -> None:  # type: ignore[no-untyped-def]
    report = verify(generate("1f1b", n_ranks=2, n_microbatches=4), model="mlp", warmup=0)
    path = tmp_path / "costs.json"
    save_costs(report.costs, path, meta={"model": "mlp"})
    assert json.loads(path.read_text())["meta"]["time_unit"] == "ns"
    assert load_costs(path) == report.costs
    status = main(
        ["simulate", "1f1b", "--stages", "2", "--microbatches", "4", "--costs", str(path), "--json"]
    )
    assert status == 0
    simulated = json.loads(capsys.readouterr().out)
    assert simulated["makespan"] == round(report.predicted_makespan_parallel * 1e9)
