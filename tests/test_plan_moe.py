"""Mixture-of-experts in the planner: shapes, all-to-all, memory and DualPipe's overlap.

Oracles: closed forms written from the definitions (router h x n, experts (n_in + 1) h f
each, top-k routed copies per token), the all-to-all by bytes over bandwidth on a device
whose links have round numbers, and DualPipe's F&B pair by the rule of the DeepSeek-V3
report (section 3.2.1) worked from the priced passes.
"""

from __future__ import annotations

import json
from dataclasses import replace
from fractions import Fraction

import pytest

from pipesim.engine import simulate
from pipesim.errors import PlanError
from pipesim.plan.collectives import all_to_all_s
from pipesim.plan.gpu import collective_seconds, layer_times
from pipesim.plan.hardware import Accelerator, get_accelerator
from pipesim.plan.kernels import Collective, Gemm, Shard, layer_kernels
from pipesim.plan.layers import model_layers
from pipesim.plan.model import ModelSpec, MoESpec, get_model, model_from_dict
from pipesim.plan.moe import moe_block
from pipesim.plan.planner import plan
from pipesim.plan.sweep import Point, SweepContext, build_configuration, evaluate_point
from pipesim.plan.workload import workload_from_model

EXPERTS = MoESpec(experts=16, top_k=8, expert_ffn_hidden=1024)
MOE = ModelSpec(
    n_layers=8,
    hidden=1024,
    n_heads=8,
    seq_length=1024,
    vocab_size=1000,
    gated_mlp=True,
    bias=False,
    learned_positions=False,
    dropout=False,
    flash_attention=True,
    moe=EXPERTS,
)

# An H100 whose links have round numbers: no latency, the bus bandwidth is the datasheet's
# (efficiency 1, no size curve), the all-to-all's bytes over bandwidth read by hand.
ROUND = replace(
    get_accelerator("h100-sxm"),
    intra_node_latency=0.0,
    inter_node_latency=0.0,
    intra_node_efficiency=1.0,
    inter_node_efficiency=1.0,
    intra_node_size_curve=(),
    sm_count=None,
)


def _links(intra: float, inter: float | None = None) -> Accelerator:
    return replace(ROUND, intra_node_bandwidth=intra, inter_node_bandwidth=inter or intra)


def test_moe_presets_round_trip_and_split_their_layers() -> None:
    ds = get_model("deepseek-v3")
    assert model_from_dict(ds.to_dict()) == ds
    layers = model_layers(ds, expert=64)
    kinds = [layer.name for layer in layers]
    # embedding, 3 dense blocks (first_k_dense_replace 3), 58 expert blocks, head
    assert kinds == ["embedding"] + ["block"] * 3 + ["moe block"] * 58 + ["head"]
    with pytest.raises(PlanError, match="must divide the 256 routed experts"):
        model_layers(ds, expert=3)
    with pytest.raises(PlanError, match="needs a model with expert layers"):
        workload_from_model(get_model("llama2-7b"), expert=2)


def test_expert_block_params_and_flops_by_hand() -> None:
    s, h, n, k, f = 1024, 1024, 16, 8, 1024
    one = 3 * h * f  # gate, up and down of one SwiGLU expert
    attention = h * (h + 2 * h) + h * h + h  # QKV, projection, RMSNorm
    for e in (1, 2, 16):
        block = moe_block(MOE, expert=e)
        assert block.params == attention + n * h + h + Fraction(n * one, e)
        assert block.expert_params == Fraction(n * one, e)
        # Narayanan et al.'s weight and attention matmuls, the router, top-k experts
        forward = 2 * s * h * 3 * h + 2 * s * h * h + 4 * s * s * h + 2 * s * h * n
        assert block.forward_flops == forward + 2 * s * k * one  # balanced: not e-dependent


def test_grouped_expert_gemms_follow_the_expert_parallel_size() -> None:
    s, k, n = 1024, 8, 16
    for e in (1, 4, 16):
        kernels = layer_kernels(MOE, "moe block", Shard(expert=e))
        up = next(g for g in kernels.forward if isinstance(g, Gemm) and g.name == "expert up")
        # each of e devices routes s tokens x k copies evenly over n experts, n / e local
        assert (up.m, up.n, up.k, up.batch) == (s * k * e // n, 2 * 1024, 1024, n // e)
        assert up.flops == 2 * s * k * 2 * 1024 * 1024  # the same work, split differently
    padded = replace(MOE, moe=replace(EXPERTS, capacity_factor=1.25))
    kernels = layer_kernels(padded, "moe block", Shard(expert=4))
    up = next(g for g in kernels.forward if isinstance(g, Gemm) and g.name == "expert up")
    assert up.m == 1.25 * s * k * 4 // n


def test_all_to_all_inside_a_node_and_across_nodes_by_hand() -> None:
    acc = _links(intra=100e9, inter=10e9)
    size = 1024 * 8 * 1024 * 2  # s tokens x top-8 copies x h x bf16
    dispatch = Collective("moe dispatch", "all-to-all", "expert", size, fanout=8)
    # 8 devices in one 8-GPU node: 7/8 of the buffer over NVLink
    assert collective_seconds(dispatch, acc, shard=Shard(expert=8)) == pytest.approx(
        size * 7 / 8 / 100e9
    )
    # 16 devices over 2 nodes: half the buffer leaves the node on the slower link
    assert collective_seconds(dispatch, acc, shard=Shard(expert=16)) == pytest.approx(
        size / 2 / 10e9
    )
    # node-limited routing (at most 1 node a token): the remote half of the tokens cross
    # once each, the copies fan out over NVLink in the node
    limited = replace(dispatch, node_limit=1)
    assert collective_seconds(limited, acc, shard=Shard(expert=16)) == pytest.approx(
        max(size / 8 * Fraction(1, 2) / 10e9, size * 7 / 8 / 100e9)
    )
    assert all_to_all_s(size, n_devices=1, per_node=8, intra=acc.link(inter_node=False),
                        inter=acc.link(inter_node=True)) == 0  # fmt: skip


def test_routed_tokens_and_dispatch_buffers_in_memory() -> None:
    s, h, k, f, d = 1024, 1024, 8, 1024, 2
    dropless = moe_block(MOE, expert=4)
    padded = moe_block(
        replace(MOE, moe=replace(EXPERTS, capacity_factor=1.5)),
        expert=4,
    )
    # the routed copies' dispatched input, up output (gate and up), down input and output
    routed = k * s * d * (h + 2 * f + f + h)
    assert padded.activation_bytes - dropless.activation_bytes == Fraction(1, 2) * routed
    # the dispatch's send and receive buffers of one layer
    assert dropless.transient_bytes == 2 * k * s * h * d


def _mid_case(e: int) -> tuple[SweepContext, Point]:
    acc = _links(intra=100e9)
    context = SweepContext(
        workload=workload_from_model(MOE),
        accelerator=acc,
        devices=16,
        memory_capacity_bytes=10**12,
        overlap_p2p=True,
    )
    point = Point(
        schedule="dualpipe",
        pipeline=4,
        virtual=2,
        microbatch_size=1,
        n_microbatches=8,
        data_parallel=4,
        expert_parallel=e,
    )
    return context, point


def test_dualpipe_pair_is_derived_from_its_parts_by_hand() -> None:
    context, point = _mid_case(4)
    schedule, costs = build_configuration(context, point)
    sizes = evaluate_point(context, point).layers_per_stage  # one copy's 4 stages
    times = layer_times(MOE, Shard(expert=4), context.accelerator)
    # F's dispatch and combine: s x top-8 copies x h x 2 bytes each, 3/4 of them to the
    # other 3 devices of the group, at 100 GB/s
    assert times["moe block"].forward.ep_comm_s == pytest.approx(
        2 * 0.75 * 1024 * 8 * 1024 * 2 / 100e9
    )
    kinds = ["embedding", *["moe block"] * 8, "head"]
    bounds = [sum(sizes[:i]) for i in range(5)]
    for stage in range(4):
        # DualPipe's rank holds model stage r (copy 0) and 3 - r (copy 1): a pair runs
        # the forward of one with the backward of the other
        partner = 2 * 4 - 1 - stage
        assert schedule.placement[partner] == schedule.placement[stage]
        mine = [times[k] for k in kinds[bounds[stage] : bounds[stage + 1]]]
        other = [times[k] for k in kinds[bounds[3 - stage] : bounds[4 - stage]]]
        cf = sum(x.forward.total_s - x.forward.ep_comm_s for x in mine)
        af = sum(x.forward.ep_comm_s for x in mine)
        ci = sum(x.input_grad.total_s - x.input_grad.ep_comm_s for x in other)
        ab = sum(x.input_grad.ep_comm_s for x in other)
        w = sum(x.weight_grad.total_s for x in other)
        # two streams (compute, all-to-all); each half's chain in order, W off it
        pair = max(cf + ci + w, af + ab, cf + af, ci + ab)
        assert costs.stage(stage).overlap == pytest.approx(pair * 1e9, abs=2)
        assert pair < cf + af + ci + ab + w  # something is hidden


def test_dualpipe_advantage_appears_with_costly_all_to_all_and_vanishes_without() -> None:
    def makespans(e: int) -> tuple[Fraction, Fraction]:
        context, point = _mid_case(e)
        schedule, costs = build_configuration(context, point)
        derived = simulate(schedule, costs=costs, check=False).metrics.makespan
        summed = replace(costs, stages=tuple(replace(s, overlap=None) for s in costs.stages))
        parts = simulate(schedule, costs=summed, check=False).metrics.makespan
        return Fraction(derived), Fraction(parts)

    derived, summed = makespans(4)
    assert derived < 0.9 * summed  # the all-to-all under the other half's compute
    derived, summed = makespans(1)  # no all-to-all: a pair is its parts, nothing hidden
    assert derived == summed

    def best(e: int) -> dict[str, float]:
        result = plan(
            MOE,
            devices=16,
            accelerator=_links(intra=100e9),
            global_batch=32,
            stages=(4,),
            tensor=(1,),
            expert_parallel=(e,),
            schedules=("1f1b", "interleaved-1f1b", "dualpipe"),
            microbatch_sizes=(1,),
            virtual=(1, 2),
            recompute=("none",),
            memory_capacity_bytes=10**12,
            workers=1,
            min_mfu=0,
            overlap_p2p=True,
        )
        found: dict[str, float] = {}
        for p in result.points:
            if p.fits and p.schedule not in found:
                found[p.schedule] = p.step_time_ns  # type: ignore[assignment]
        return found

    costly, free = best(4), best(1)
    assert min(costly, key=costly.__getitem__) == "dualpipe"
    gain = {
        name: {k: 1 - v["dualpipe"] / v[k] for k in ("1f1b", "interleaved-1f1b")}
        for name, v in (("costly", costly), ("free", free))
    }
    # what is left without all-to-all is the bubble DualPipe saves, not an overlap
    for other in ("1f1b", "interleaved-1f1b"):
        assert gain["costly"][other] > gain["free"][other] + 0.05


def test_dualpipe_keeps_two_copies_of_the_expert_weights() -> None:
    context, point = _mid_case(4)
    _, dual = build_configuration(context, point)
    one = replace(point, schedule="1f1b", virtual=1)
    _, single = build_configuration(context, one)
    assert sum(s.param_bytes for s in dual.stages) == 2 * sum(s.param_bytes for s in single.stages)


def test_cli_sweeps_expert_parallelism_and_refuses_bad_sizes(
    capsys: pytest.CaptureFixture[str],
) -> None:
    from pipesim.cli import main

    args = [
        "plan", "--model", "mixtral-8x7b", "--devices", "16", "--accelerator", "h100-sxm",
        "--global-batch", "32", "--stages", "2", "--tensor-parallel", "1",
        "--schedules", "1f1b", "--microbatch-sizes", "1", "--workers", "1", "--json",
    ]  # fmt: skip
    assert main([*args, "--expert-parallel", "1,8"]) == 0
    data = json.loads(capsys.readouterr().out)
    seen = {p["expert_parallel"] for p in data["points"]}
    assert seen == {1, 8}
    for bad, says in (
        ("16", "must divide the 8 routed experts of mixtral-8x7b"),
        ("0", "--expert-parallel takes whole numbers >= 1"),
    ):
        assert main([*args, "--expert-parallel", bad]) != 0
        err = capsys.readouterr().err
        assert says in err and len(err.strip().splitlines()) == 1


def test_expert_state_is_sharded_and_reduced_over_expert_data_parallel() -> None:
    from pipesim.plan.iteration import rank_iteration, static_bytes

    context, point = _mid_case(4)
    point = replace(point, schedule="1f1b", virtual=1, distributed_optimizer=True)
    _, costs = build_configuration(context, point)
    workload = workload_from_model(MOE, expert=4)
    sizes = evaluate_point(context, point).layers_per_stage
    layers = workload.layers[sizes[0] : sizes[0] + sizes[1]]  # stage 1: expert blocks only
    experts = sum(layer.expert_params for layer in layers)
    dense = sum(layer.params for layer in layers) - experts
    # d = 4 replicas of the dense weights; t d / e = 1 of each expert: nothing to shard
    assert costs.stage(1).param_bytes == static_bytes(
        dense, data_parallel=4, distributed_optimizer=True
    ) + static_bytes(experts, data_parallel=1, distributed_optimizer=True)
    # the dense gradients reduced over 4 devices, the experts' over none (1 replica)
    common = dict(
        accelerator=context.accelerator, distributed_optimizer=False,
        grad_bytes_per_param=2, weight_bytes_per_param=2, last_backward_ns=0,
        first_forward_ns=0, overlap=False,
    )  # fmt: skip
    both = rank_iteration(dense + experts, tensor=1, data_parallel=4, expert_params=experts,
                          expert_parallel=4, **common)  # type: ignore[arg-type]  # fmt: skip
    alone = rank_iteration(dense, tensor=1, data_parallel=4, **common)  # type: ignore[arg-type]
    assert both.dp_comm_ns == alone.dp_comm_ns > 0
    assert both.optimizer_ns > alone.optimizer_ns  # every expert's step on its only copy


def test_a_model_file_names_a_bad_expert_field() -> None:
    from pipesim.errors import ParseError

    data = {**MOE.to_dict(), "name": "custom"}
    assert model_from_dict(data) == replace(MOE, name="custom")
    with pytest.raises(ParseError, match=r"moe: unknown fields \['expert'\]"):
        model_from_dict({**data, "moe": {"experts": 8, "top_k": 2, "expert": 1}})
    with pytest.raises(PlanError, match=r"top_k \(9\) must be at most the routed experts \(8\)"):
        model_from_dict({**data, "moe": {"experts": 8, "top_k": 9, "expert_ffn_hidden": 64}})
    with pytest.raises(PlanError, match="capacity_factor must be a number from 1 to 64"):
        model_from_dict(
            {**data, "moe": {"experts": 8, "top_k": 2, "expert_ffn_hidden": 64,
                             "capacity_factor": 0.5}}
        )  # fmt: skip


def test_expert_tensor_parallelism_splits_each_expert_and_gathers_its_tokens() -> None:
    s, h, k, n, f, d = 1024, 1024, 8, 16, 1024, 2
    one = 3 * h * f
    assert moe_block(MOE, expert=4, expert_tensor=2).expert_params == Fraction(n * one, 8)
    kernels = layer_kernels(MOE, "moe block", Shard(expert=4, expert_tensor=2))
    names = [g.name for g in kernels.forward]
    up = next(g for g in kernels.forward if isinstance(g, Gemm) and g.name == "expert up")
    received = s * k * 4 // n  # tokens each local expert gets on this device
    assert (up.m, up.n, up.k, up.batch) == (2 * received, 2 * f // 2, h, n // 4)
    # gathered before the experts, the partial outputs reduce-scattered after them
    gather = next(
        g for g in kernels.forward if isinstance(g, Collective) and g.kind == "all-gather"
    )
    assert gather.group == "expert tensor" and gather.size_bytes == 2 * received * (n // 4) * h * d
    assert names.index("expert tokens all-gather") < names.index("expert up")
    assert names.index("expert down") < names.index("expert output reduce-scatter")
    back = [g.kind for g in kernels.input_grad if isinstance(g, Collective)]
    assert back.count("reduce-scatter") == back.count("all-gather") == 1
    # an expert group of 8 devices 2 apart spans 16: two 8-GPU nodes, 4 of it in each
    acc = _links(intra=100e9, inter=10e9)
    size = s * k * h * d
    dispatch = Collective("moe dispatch", "all-to-all", "expert", size, fanout=k)
    assert collective_seconds(dispatch, acc, shard=Shard(expert=8, expert_tensor=2)) == (
        pytest.approx(max(size * 3 / 8 / 100e9, size * 4 / 8 / 10e9))
    )
    with pytest.raises(PlanError, match="must divide the expert width 1024"):
        moe_block(MOE, expert=1, expert_tensor=3)
