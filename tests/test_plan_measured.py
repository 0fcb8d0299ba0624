"""The planner on a cost file: micro-batch sizes priced by the affine size rule
(pipesim.scaling), the file's link and overheads kept, so that the plan's pipeline time
is `pipesim simulate` of the same (scaled) file."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from helpers import FREE_ACCELERATOR as FREE  # free links: messages take 0 ns
from helpers import evaluate_one_point, one_point

from pipesim.cli import main
from pipesim.costs import CostModel, Link, StageCost, costs_from_dict, costs_to_dict
from pipesim.plan.hardware import get_accelerator
from pipesim.plan.sweep import build_configuration
from pipesim.plan.workload import workload_from_costs
from pipesim.scaling import costs_at_microbatch_size, scaling_meta

# Two stages measured at 1 and at 2 rows per micro-batch (ns). Per row: stage 0 F 1000,
# B 2000; stage 1 F 1000, B 1000; fixed: stage 0 F 2000, B 4000; stage 1 F 1000, B 3000.
AT_1 = CostModel(
    stages=(
        StageCost(forward=3000, backward=6000, input_grad=3500, weight_grad=2500,
                  activation_bytes=300, output_bytes=50),
        StageCost(forward=2000, backward=4000, input_grad=2200, weight_grad=1800,
                  activation_bytes=100, output_bytes=50),
    ),
    time_unit="ns",
)  # fmt: skip
AT_2 = CostModel(
    stages=(
        StageCost(forward=4000, backward=8000, input_grad=4500, weight_grad=3500,
                  activation_bytes=600, output_bytes=100),
        StageCost(forward=3000, backward=5000, input_grad=2800, weight_grad=2200,
                  activation_bytes=200, output_bytes=100),
    ),
    time_unit="ns",
)  # fmt: skip
META = {"time_unit": "ns", "microbatch_size": 1, "microbatch_scaling": {}}
META["microbatch_scaling"] = scaling_meta(AT_2, microbatch_size=2)


def test_a_file_measured_at_two_sizes_prices_a_third_by_the_affine_rule() -> None:
    workload = workload_from_costs(AT_1, meta=META)
    context, point = one_point(
        workload, pipeline=2, schedule="gpipe", microbatch_size=4, n_microbatches=2,
        accelerator=FREE,
    )  # fmt: skip
    _, costs = build_configuration(context, point)
    # fixed + per row * 4, by hand
    assert [(s.forward, s.backward) for s in costs.stages] == [(6000, 12000), (5000, 7000)]
    assert [(s.input_grad, s.weight_grad) for s in costs.stages] == [(6500, 5500), (4000, 3000)]
    assert [s.activation_bytes for s in costs.stages] == [1200, 400]  # proportional to rows
    scaled = costs_at_microbatch_size(AT_1, META, 4)
    assert [s.forward for s in scaled.stages] == [s.forward for s in costs.stages]
    # GPipe, p = 2, m = 2, by hand: rank 0 F0 0-6000, F1 6000-12000; rank 1 F0 6000-11000,
    # F1 12000-17000, B0 17000-24000, B1 24000-31000; rank 0 B0 24000-36000, B1 36000-48000.
    # (Rows in proportion would give F 12000 on stage 0, and 96000.)
    evaluation = evaluate_one_point(
        workload, pipeline=2, schedule="gpipe", microbatch_size=4, n_microbatches=2,
        accelerator=FREE,
    )  # fmt: skip
    assert evaluation.makespan_ns == 48000


def _file(tmp_path: Path, costs: CostModel, meta: dict[str, Any], name: str) -> Path:
    path = tmp_path / name
    path.write_text(json.dumps(costs_to_dict(costs) | {"meta": meta}))
    return path


def _plan(path: Path, *, schedule: str, b: int, m: int, capsys: Any) -> dict[str, Any]:
    argv = ["plan", "--model", str(path), "--devices", "2", "--accelerator", "h100-sxm",
            "--global-batch", str(b * m), "--stages", "2", "--microbatch-sizes", str(b),
            "--virtual", "1", "--schedules", schedule, "--min-mfu", "0", "--workers", "1",
            "--json"]  # fmt: skip
    assert main(argv) == 0
    data: dict[str, Any] = json.loads(capsys.readouterr().out)
    return data


def _simulate(path: Path, *, schedule: str, m: int, capsys: Any) -> Any:
    assert (
        main(["simulate", schedule, "-p", "2", "-m", str(m), "--costs", str(path), "--json"]) == 0
    )
    return json.loads(capsys.readouterr().out)["makespan"]


@pytest.mark.parametrize("schedule", ["gpipe", "1f1b", "zb-h1"])
def test_plan_pipeline_time_is_simulate_of_the_same_file(
    schedule: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # what `pipesim calibrate` measures beside compute: per-message send and receive
    # overheads, link latency, a per-action dispatch overhead (ns)
    link = Link(latency=700, send_overhead=300, receive_overhead=500)
    first = CostModel(stages=AT_1.stages, link=link, dispatch_overhead=90, time_unit="ns")
    second = CostModel(stages=AT_2.stages, link=link, dispatch_overhead=110, time_unit="ns")
    meta = {"time_unit": "ns", "microbatch_size": 1}
    # at the file's own size: the file as it is
    plain = _file(tmp_path, first, meta, "one-size.json")
    planned = _plan(plain, schedule=schedule, b=1, m=4, capsys=capsys)
    simulated = _simulate(plain, schedule=schedule, m=4, capsys=capsys)
    assert planned["best"]["pipeline_time_ns"] == simulated
    without = _simulate(
        _file(tmp_path, AT_1, meta, "no-overheads.json"), schedule=schedule, m=4, capsys=capsys
    )
    assert simulated > without  # the overheads count (they were dropped before)
    # at another size: the scaled file (pipesim.scaling), simulated
    scaling = {**meta, "microbatch_scaling": scaling_meta(second, microbatch_size=2)}
    two_sizes = _file(tmp_path, first, scaling, "two-sizes.json")
    planned = _plan(two_sizes, schedule=schedule, b=4, m=4, capsys=capsys)
    data = json.loads(two_sizes.read_text())
    at4 = costs_at_microbatch_size(costs_from_dict(data), data["meta"], 4)
    assert at4.dispatch_overhead == 90 + 20 * 3 and at4.link.latency == 700
    scaled = _file(tmp_path, at4, {"time_unit": "ns"}, "at4.json")
    assert planned["best"]["pipeline_time_ns"] == _simulate(
        scaled, schedule=schedule, m=4, capsys=capsys
    )


def test_planner_stages_sum_the_file_stages_they_group() -> None:
    # 4 file stages on 2 planner stages: sums of times and bytes, the last one's output
    four = CostModel(
        stages=(*AT_1.stages, *AT_1.stages),
        link=Link(latency=7, send_overhead=3, receive_overhead=5),
        dispatch_overhead=2,
    )
    workload = workload_from_costs(four, meta={"time_unit": "ns"})
    context, point = one_point(workload, pipeline=2, n_microbatches=2, accelerator=FREE)
    _, costs = build_configuration(context, point)
    assert [s.forward for s in costs.stages] == [5000, 5000]
    assert [s.activation_bytes for s in costs.stages] == [400, 400]
    assert costs.link == four.link and costs.dispatch_overhead == 2
    # a file without a link takes the accelerator's intra-node one
    h100 = get_accelerator("h100-sxm")
    _, linked = build_configuration(
        *one_point(workload_from_costs(AT_1, meta={"time_unit": "ns"}), pipeline=2)
    )
    assert linked.link.latency == round(h100.intra_node_latency * 10**9) > 0
    assert linked.dispatch_overhead == 0
