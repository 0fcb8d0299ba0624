"""verify.models and verify.stage_cut: the chapter's numbers, GPT, factories, stage cuts."""

from __future__ import annotations

import itertools
import textwrap

import pytest

torch = pytest.importorskip("torch")

from helpers import evaluate_one_point  # noqa: E402
from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402
from torch import nn  # noqa: E402

from pipesim.errors import PartitionError, UnknownNameError  # noqa: E402
from pipesim.partition import partition as plan_partition  # noqa: E402
from pipesim.plan.model import ModelSpec  # noqa: E402
from pipesim.plan.workload import workload_from_model  # noqa: E402
from verify.errors import VerifyError  # noqa: E402
from verify.models import VerifyModel, from_factory, gpt, load_model, mlp  # noqa: E402
from verify.stage_cut import cut_stages, param_bytes  # noqa: E402

pytestmark = pytest.mark.torch


def _chapter_script() -> tuple[nn.Sequential, torch.Tensor, torch.Tensor]:
    """The chapter's model_parallel.py, line for line (the oracle)."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(21)
        model = nn.Sequential(
            nn.Linear(16, 96),
            nn.GELU(),
            nn.Linear(96, 96),
            nn.GELU(),
            nn.Linear(96, 96),
            nn.GELU(),
            nn.Linear(96, 4),
        )
        x = torch.randn(32, 16)
        target = torch.randn(32, 4)
    return model, x, target


def test_mlp_is_the_chapters_model_and_batch() -> None:
    chapter, x, target = _chapter_script()
    model = mlp()
    assert [type(m) for m in model.layers] == [type(m) for m in chapter]
    for ours, theirs in zip(model.layers.parameters(), chapter.parameters(), strict=True):
        assert torch.equal(ours, theirs)
    ours_x, ours_target = model.make_batch(32)
    assert torch.equal(ours_x, x) and torch.equal(ours_target, target)
    # The same bits again: make_batch does not consume the global RNG stream.
    assert torch.equal(model.make_batch(32)[0], x)


def test_chapter_parameter_numbers() -> None:
    layers = mlp().layers
    assert sum(p.numel() for p in layers.parameters()) == 20_644
    assert param_bytes(layers) == 82_576
    stage0, stage1 = cut_stages(layers, n_stages=2)
    assert (len(stage0), len(stage1)) == (4, 3)
    assert (param_bytes(stage0), param_bytes(stage1)) == (43_776, 38_800)
    # Hand count: 16*96+96 + 96*96+96 = 10,944 params = 43,776 bytes.
    assert param_bytes(stage0) == 4 * (16 * 96 + 96 + 96 * 96 + 96)


def test_stages_share_the_models_modules() -> None:
    layers = mlp().layers
    stages = cut_stages(layers, n_stages=2, layer_counts=[4, 3])
    assert all(stages[0][i] is layers[i] for i in range(4))
    assert all(stages[1][i] is layers[4 + i] for i in range(3))
    with torch.no_grad():
        stages[1][2].bias.add_(1.0)  # a change through a stage is a change of the model
    assert torch.equal(layers[6].bias, stages[1][2].bias)


def test_more_stages_than_layers_names_both_numbers() -> None:
    with pytest.raises(PartitionError, match=r"7 layers into 8 stages.*at most 7 stages"):
        cut_stages(mlp().layers, n_stages=8)


@pytest.mark.parametrize("counts", [[4, 4], [7, 0], [3, 2, 2]])
def test_bad_layer_counts_are_refused(counts: list[int]) -> None:
    with pytest.raises(VerifyError, match=r"do not cut 7 layers into 2 stages"):
        cut_stages(mlp().layers, n_stages=2, layer_counts=counts)


def _counts(stages: tuple[nn.Sequential, ...]) -> tuple[int, ...]:
    return tuple(len(s) for s in stages)


def test_even_counts() -> None:
    def even(n: int, n_stages: int) -> tuple[int, ...]:
        return _counts(cut_stages([nn.Identity() for _ in range(n)], n_stages=n_stages))

    assert even(7, 2) == (4, 3)
    assert even(7, 7) == (1,) * 7
    assert even(10, 4) == (3, 3, 2, 2)


def _brute_force_best(costs: list[int], n_stages: int) -> int:
    n = len(costs)
    best = None
    for cuts in itertools.combinations(range(1, n), n_stages - 1):
        bounds = (0, *cuts, n)
        worst = max(sum(costs[a:b]) for a, b in itertools.pairwise(bounds))
        best = worst if best is None else min(best, worst)
    assert best is not None
    return best


@pytest.mark.parametrize("seed", range(12))
def test_balanced_counts_is_optimal(seed: int) -> None:
    rng = torch.Generator().manual_seed(seed)
    n = int(torch.randint(2, 9, (1,), generator=rng))
    costs = [int(c) for c in torch.randint(0, 20, (n,), generator=rng)]
    layers = [nn.Identity() for _ in range(n)]
    for n_stages in range(1, n + 1):
        counts = _counts(cut_stages(layers, n_stages=n_stages, balance=costs))
        assert len(counts) == n_stages and sum(counts) == n and min(counts) >= 1
        bounds = list(itertools.accumulate((0, *counts)))
        worst = max(sum(costs[a:b]) for a, b in itertools.pairwise(bounds))
        assert worst == _brute_force_best(costs, n_stages)


@settings(max_examples=150, deadline=None)
@given(
    costs=st.lists(st.integers(min_value=0, max_value=30), min_size=1, max_size=12),
    data=st.data(),
)
def test_verify_cuts_where_the_planner_cuts(costs: list[int], data: st.DataObject) -> None:
    n_stages = data.draw(st.integers(min_value=1, max_value=len(costs)))
    layers = [nn.Identity() for _ in costs]
    stages = cut_stages(layers, n_stages=n_stages, balance=costs)
    assert _counts(stages) == plan_partition(costs, n_stages=n_stages)
    assert [m for s in stages for m in s] == layers  # every entry once, in order


@pytest.mark.parametrize("pipeline", [2, 3, 4])
def test_verify_runs_the_cut_the_planner_reports(pipeline: int) -> None:
    # A GPT of 3 blocks on both sides: the planner's layers (embedding, blocks, head)
    # are verify's model entries, so the planner's work per layer cuts the torch model.
    spec = ModelSpec(n_layers=3, hidden=32, n_heads=4, seq_length=16, vocab_size=4000)
    workload = workload_from_model(spec)
    evaluation = evaluate_one_point(workload, pipeline=pipeline)
    model = gpt(n_layers=3, width=32)
    work = [layer.work for layer in workload.layers]
    stages = cut_stages(model.layers, n_stages=pipeline, balance=work)
    assert _counts(stages) == evaluation.layers_per_stage
    assert sum(_counts(stages)) == len(model.layers) == len(workload.layers)


def test_balance_by_params() -> None:
    layers = mlp().layers
    per_layer = [sum(p.numel() for p in m.parameters()) for m in layers]
    stages = cut_stages(layers, n_stages=3, balance="params")
    counts = [len(s) for s in stages]
    bounds = list(itertools.accumulate((0, *counts)))
    worst = max(sum(per_layer[a:b]) for a, b in itertools.pairwise(bounds))
    assert worst == _brute_force_best(per_layer, 3)
    with pytest.raises(VerifyError, match="unknown balance 'flops'"):
        cut_stages(layers, n_stages=2, balance="flops")
    with pytest.raises(VerifyError, match="3 layer costs for a model of 7 layers"):
        cut_stages(layers, n_stages=2, balance=[1, 2, 3])


def test_gpt_shape_and_determinism() -> None:
    a, b = gpt(n_layers=3, width=32), gpt(n_layers=3, width=32)
    assert len(a.layers) == 5
    for p, q in zip(a.layers.parameters(), b.layers.parameters(), strict=True):
        assert torch.equal(p, q)
    ids, target = a.make_batch(4)
    assert ids.shape == (4, 16) and ids.dtype == torch.int64
    # next-token targets: the target of position t is the input of position t + 1
    assert torch.equal(ids[:, 1:], target[:, :-1])
    assert not any(isinstance(m, nn.Dropout) for m in a.layers.modules())
    logits = a.layers(ids)
    assert logits.shape == (4, 16, 128)
    # Causal: changing the last token leaves earlier positions' logits unchanged.
    changed = ids.clone()
    changed[:, -1] = (changed[:, -1] + 1) % 128
    assert torch.equal(a.layers(changed)[:, :-1], logits[:, :-1])


def test_gpt_refuses_bad_sizes() -> None:
    with pytest.raises(VerifyError, match="width 30 is not divisible by n_heads 4"):
        gpt(width=30)
    with pytest.raises(VerifyError, match="n_layers must be a whole number >= 1, got 0"):
        gpt(n_layers=0)


def test_load_model_unknown_lists_valid_names() -> None:
    with pytest.raises(UnknownNameError, match=r"unknown model 'resnet'.*mlp, gpt"):
        load_model("resnet")


@pytest.fixture
def factory_module(tmp_path, monkeypatch):  # type: ignore[no-untyped-def]
    (tmp_path / "my_models.py").write_text(
        textwrap.dedent("""
        import torch
        from torch import nn
        from verify.models import VerifyModel

        def as_list():
            return [nn.Linear(3, 5), nn.Tanh(), nn.Linear(5, 2)]

        def embedding():
            return nn.Sequential(nn.Embedding(10, 4), nn.Linear(4, 2))

        def full():
            layers = nn.Sequential(nn.Linear(2, 2), nn.Linear(2, 1))
            return VerifyModel(name="full", layers=layers,
                               make_batch=lambda n: (torch.ones(n, 2), torch.zeros(n, 1)),
                               loss_fn=lambda o, t: (o - t).abs().mean())

        def convs():
            return nn.Sequential(nn.Conv1d(1, 1, 3))

        def broken():
            raise RuntimeError("no weights here")

        def wrong():
            return 42

        NOT_CALLABLE = 3
    """)
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    return "my_models"


def test_factory_models(factory_module: str) -> None:
    listed = from_factory(f"{factory_module}:as_list", seed=3)
    assert isinstance(listed.layers, nn.Sequential) and len(listed.layers) == 3
    x, target = listed.make_batch(6)
    assert x.shape == (6, 3) and target.shape == (6, 2)
    again = from_factory(f"{factory_module}:as_list", seed=3)
    assert torch.equal(again.layers[0].weight, listed.layers[0].weight)
    assert torch.equal(again.make_batch(6)[0], x)
    ids, _ = from_factory(f"{factory_module}:embedding").make_batch(2)
    assert ids.dtype == torch.int64 and int(ids.max()) < 10
    full = load_model(f"{factory_module}:full")
    assert isinstance(full, VerifyModel) and full.name == "full"


@pytest.mark.parametrize(
    ("attr", "message"),
    [
        ("broken", r"model factory 'my_models:broken' raised RuntimeError: no weights here"),
        ("wrong", r"returned int; return a non-empty nn.Sequential"),
        ("missing", r"module 'my_models' has no callable 'missing'"),
        ("NOT_CALLABLE", r"has no callable 'NOT_CALLABLE'"),
        ("convs", r"cannot guess its input"),
    ],
)
def test_factory_errors(factory_module: str, attr: str, message: str) -> None:
    with pytest.raises(VerifyError, match=message):
        from_factory(f"{factory_module}:{attr}")


def test_factory_import_failure_is_named() -> None:
    with pytest.raises(
        VerifyError,
        match=r"cannot import module 'no_such_pkg.models'.*"
        r"ModuleNotFoundError",
    ):
        from_factory("no_such_pkg.models:build")
    with pytest.raises(VerifyError, match=r"write package\.module:factory"):
        from_factory("just_a_module:")
