"""Links per ordered rank pair: node rules and explicit pairs, in the
engine, every fast evaluator, the critical path, the cost file and the CLI."""

from __future__ import annotations

import json

import pytest
from helpers import one_point

from pipesim.cli import main
from pipesim.costs import CostModel, Link, LinkPair, Links, costs_from_dict, costs_to_dict
from pipesim.engine import run_trace, simulate
from pipesim.errors import CostError, ParseError
from pipesim.graph import critical_path
from pipesim.plan.fastsim import fast_metrics
from pipesim.plan.fasttrace import fast_trace
from pipesim.plan.onepass import quick_step
from pipesim.schedules import generate

# One micro-batch through 4 stages, F = 1, ranks 0-1 and 2-3 on two nodes.
CHAIN = generate("gpipe", n_ranks=4, n_microbatches=1, forward_only=True)
NODES = Links(ranks_per_node=2, intra_node=Link(latency=1), inter_node=Link(latency=10))


def test_node_rule_by_hand() -> None:
    costs = CostModel.uniform(forward=1, links=NODES)
    # 0F0 0..1, +1 (same node) -> 1F0 2..3, +10 (other node) -> 2F0 13..14, +1 -> 3F0 15..16
    trace = run_trace(CHAIN, costs)
    assert [(r.start, r.end) for r in trace.actions] == [(0, 1), (2, 3), (13, 14), (15, 16)]
    assert [(t.src_rank, t.dst_rank, t.end - t.start) for t in trace.transfers] == [
        (0, 1, 1),
        (1, 2, 10),
        (2, 3, 1),
    ]
    assert simulate(CHAIN, costs=costs).metrics.makespan == 16
    assert fast_metrics(CHAIN, costs=costs).makespan == 16
    step = quick_step(CHAIN, costs)
    assert step is not None and step.makespan == 16
    assert fast_trace(CHAIN, costs) == trace
    assert critical_path(CHAIN, costs=costs).length == 16


def test_explicit_pair_wins_over_the_rule_and_bandwidth_is_per_pair() -> None:
    links = Links(
        ranks_per_node=2,
        inter_node=Link(latency=10),
        pairs=(LinkPair(src=1, dst=2, link=Link(bandwidth_bytes_per_s=2)),),
    )
    costs = CostModel.uniform(forward=1, output_bytes=8, links=links)
    # 0 -> 1 free (the default link, same node); 1 -> 2: 8 bytes / 2 = 4, no latency.
    assert simulate(CHAIN, costs=costs).metrics.makespan == 1 + 1 + 4 + 1 + 1
    assert costs.link_between(2, 1).latency == 10  # the reverse direction keeps the rule
    assert costs.link_between(3, 2) == Link()  # inside a node, no intra rule: the link


def test_links_file_round_trip_and_errors() -> None:
    data = {
        "stage": {"forward": 1},
        "links": {
            "ranks_per_node": 2,
            "intra_node": {"latency": 1},
            "inter_node": {"latency": 10, "bandwidth_bytes_per_s": 100},
            "pairs": [{"src": 0, "dst": 3, "latency": 7}],
        },
    }
    costs = costs_from_dict(data)
    assert costs.link_between(0, 3).latency == 7
    assert costs.link_between(1, 2).bandwidth_bytes_per_s == 100
    assert costs_from_dict(costs_to_dict(costs)) == costs
    with pytest.raises(ParseError, match="unknown fields \\['racks'\\]"):
        costs_from_dict({"stage": {}, "links": {"racks": 2}})
    with pytest.raises(CostError, match="ranks_per_node must be at least 1"):
        costs_from_dict({"stage": {}, "links": {"ranks_per_node": 0}})
    twice = [{"src": 0, "dst": 1}, {"src": 0, "dst": 1, "latency": 2}]
    with pytest.raises(CostError, match="from rank 0 to rank 1 is given twice"):
        costs_from_dict({"stage": {}, "links": {"pairs": twice}})
    with pytest.raises(ParseError, match="src, dst"):
        costs_from_dict({"stage": {}, "links": {"pairs": [{"latency": 1}]}})


def test_cli_flags(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["simulate", "gpipe", "-p", "4", "-m", "1", "--forward-only", "--json"]
    flags = ["--ranks-per-node", "2", "--link-latency", "1", "--inter-node-latency", "10"]
    assert main([*argv, *flags]) == 0
    assert json.loads(capsys.readouterr().out)["makespan"] == 16
    assert main([*argv, "--inter-node-latency", "10"]) == 1
    assert "need --ranks-per-node" in capsys.readouterr().err


def test_planner_puts_pipeline_hops_on_intra_or_inter_node_links() -> None:
    from pipesim.plan import ModelSpec, get_accelerator, workload_from_model
    from pipesim.plan.sweep import build_configuration

    h100 = get_accelerator("h100-sxm")  # 8 GPUs per node
    spec = ModelSpec(n_layers=8, hidden=512, n_heads=8, seq_length=512, vocab_size=2000)

    def costs_for(devices: int, data_parallel: int) -> CostModel:
        context, point = one_point(
            workload_from_model(spec),
            pipeline=devices // data_parallel,
            n_microbatches=8,
            data_parallel=data_parallel,
            accelerator=h100,
            memory_capacity_bytes=h100.memory_bytes,
        )
        return build_configuration(context, point)[1]

    intra_ns = round(h100.intra_node_latency * 10**9)
    inter_ns = round(h100.inter_node_latency * 10**9)
    assert intra_ns != inter_ns
    # 16 devices, d = 4 (tp-dp-pp order): pipeline ranks 0-1, 2-3 share a node each.
    costs = costs_for(16, 4)
    assert costs.links is not None and costs.links.ranks_per_node == 8 // 4
    assert [costs.link_between(r, r + 1).latency for r in range(3)] == [
        intra_ns,
        inter_ns,
        intra_ns,
    ]
    # d = 3 does not divide 8: every hop crosses nodes.
    assert costs_for(24, 3).link_between(0, 1).latency == inter_ns
    # One node: the intra-node link everywhere.
    one_node = costs_for(8, 2)
    assert one_node.links is None and one_node.link.latency == intra_ns


def test_message_overheads_come_from_the_pairs_link() -> None:
    # Only the inter-node link (rank 1 -> 2) has a send overhead: the one message that
    # crosses nodes holds its sender 3 longer, so the chain ends 3 later.
    slow_send = Links(
        ranks_per_node=2,
        intra_node=Link(latency=1),
        inter_node=Link(latency=10, send_overhead=3),
    )
    base = simulate(CHAIN, costs=CostModel.uniform(forward=1, links=NODES)).metrics
    costs = CostModel.uniform(forward=1, links=slow_send)
    sim = simulate(CHAIN, costs=costs)
    assert sim.metrics.makespan == base.makespan + 3
    assert [r.busy for r in sim.metrics.ranks] == [1, 1 + 3, 1, 1]
    assert fast_metrics(CHAIN, costs=costs) == sim.metrics
    assert fast_trace(CHAIN, costs) == sim.trace
