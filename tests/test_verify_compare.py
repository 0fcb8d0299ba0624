"""verify.local + verify.compare: replay schedules on CPU ranks, bit for bit.

Oracles: the unsplit model run directly in the test (``model(x)``, then
``loss.backward()`` per micro-batch in the schedule's order, then one division
by the number of micro-batches, as torch.distributed.pipelining does), the
chapter's printed numbers, and the schedule's own dependency rules.
"""

from __future__ import annotations

import copy

import pytest

torch = pytest.importorskip("torch")

from torch import nn  # noqa: E402

from pipesim.actions import Op  # noqa: E402
from pipesim.errors import ScheduleError  # noqa: E402
from pipesim.graph import data_dependencies  # noqa: E402
from pipesim.schedule import Schedule  # noqa: E402
from pipesim.schedules import generate, schedule_names  # noqa: E402
from verify.bit_identity import exact_settings, exactness_problems  # noqa: E402
from verify.compare import schedule_accumulation_orders, split_microbatches, verify  # noqa: E402
from verify.errors import ExactnessError, VerifyError  # noqa: E402
from verify.local import execution_order, parse_devices, run_schedule  # noqa: E402
from verify.models import VerifyModel, gpt, mlp  # noqa: E402
from verify.stage_cut import cut_stages  # noqa: E402

pytestmark = pytest.mark.torch

# (name, ranks, micro-batches, virtual, forward_only); m not divisible by p included.
CASES = [
    ("sequential", 2, 3, None, False),
    ("sequential", 3, 4, None, True),
    ("gpipe", 2, 4, None, False),
    ("gpipe", 3, 5, None, False),
    ("gpipe", 2, 3, None, True),
    ("1f1b", 2, 1, None, False),
    ("1f1b", 2, 3, None, False),
    ("1f1b", 3, 7, None, False),
    ("1f1b", 4, 6, None, False),
    ("interleaved-1f1b", 2, 4, 2, False),
    ("interleaved-1f1b", 3, 6, 2, False),
    ("interleaved-1f1b", 2, 6, 3, False),
    ("interleaved-1f1b", 2, 5, 2, False),  # group size 5 (Megatron's rules refuse N=2 here)
]


def _build(name: str, p: int, m: int, v: int | None, fwd: bool) -> Schedule:
    options = {"group_size": m} if name == "interleaved-1f1b" and m % p else None
    return generate(name, n_ranks=p, n_microbatches=m, virtual=v, forward_only=fwd, options=options)


# Zero-bubble style (ZB-H1 shape, Qi et al. 2024) written by hand: B split into I and W.
SPLIT = Schedule.from_orders(
    [
        ["0F0", "0F1", "0I0", "0F2", "0I1", "0W0", "0I2", "0W1", "0W2"],
        ["1F0", "1I0", "1F1", "1W0", "1I1", "1F2", "1W1", "1I2", "1W2"],
    ],
    name="hand-zb",
)
# DualPipe-style overlapped F&B pair on the last rank.
OVERLAPPED = Schedule.from_orders(
    [
        ["0F0", "0F1", "0F2", "0B0", "0B1", "0B2"],
        ["1F0", "(1F1;1B0)OVERLAP_F_B", "(1F2;1B1)OVERLAP_F_B", "1B2"],
    ],
    name="hand-overlap",
)


def _oracle(model: VerifyModel, schedule: Schedule, batch_size: int):  # type: ignore[no-untyped-def]
    """Outputs and gradients of the unsplit model, computed the plain way."""
    layers = copy.deepcopy(model.layers)
    x, target = model.make_batch(batch_size)
    xs = x.tensor_split(schedule.n_microbatches)
    ts = target.tensor_split(schedule.n_microbatches)
    orders = schedule_accumulation_orders(schedule)
    assert len(set(orders)) <= 1, "oracle assumes every stage adds micro-batches in one order"
    outputs = [layers(xk) for xk in xs]
    if schedule.forward_only:
        return [o.detach() for o in outputs], None
    for k in orders[0]:
        model.loss_fn(outputs[k], ts[k]).backward()
    for p in layers.parameters():
        p.grad.div_(schedule.n_microbatches)
    return [o.detach() for o in outputs], [p.grad for p in layers.parameters()]


def _check_against_oracle(model: VerifyModel, schedule: Schedule, batch_size: int) -> None:
    expected_outputs, expected_grads = _oracle(model, schedule, batch_size)
    x, target = model.make_batch(batch_size)
    stages = cut_stages(model.layers, n_stages=schedule.n_stages)
    run = run_schedule(
        schedule,
        stages,
        devices=["cpu"] * schedule.n_ranks,
        inputs=split_microbatches(x, schedule.n_microbatches),
        targets=split_microbatches(target, schedule.n_microbatches),
        loss_fn=model.loss_fn,
    )
    assert all(torch.equal(a, b) for a, b in zip(run.outputs, expected_outputs, strict=True))
    if expected_grads is not None:
        actual = [p.grad for p in model.layers.parameters()]
        assert all(torch.equal(a, b) for a, b in zip(actual, expected_grads, strict=True))


@pytest.mark.slow
@pytest.mark.parametrize(("name", "p", "m", "v", "fwd"), CASES)
def test_builtin_schedules_are_bit_identical(
    name: str, p: int, m: int, v: int | None, fwd: bool
) -> None:
    schedule = _build(name, p, m, v, fwd)
    report = verify(schedule, model="mlp", devices="cpu", warmup=0)
    assert report.bit_identical, report.mismatches
    assert report.outputs_equal and report.losses_equal and report.order_followed
    assert report.grads_equal is (None if fwd else True)
    assert report.mismatches == ()
    if not fwd:
        # every stage holding parameters got gradients (a GELU-only stage has none)
        assert all(g > 0 for g, b in zip(report.grad_norms, report.param_bytes, strict=True) if b)
    # independent oracle: the unsplit model run the plain way
    _check_against_oracle(mlp(), schedule, report.batch_size)


@pytest.mark.slow
@pytest.mark.parametrize("name", schedule_names())
def test_every_registered_schedule_is_bit_identical(name: str) -> None:
    """Whatever generators are registered (zero-bubble I/W, DualPipe overlaps and copies)."""
    schedule = generate(name, n_ranks=2, n_microbatches=4)
    report = verify(schedule, model="mlp", warmup=0)
    assert report.bit_identical, report.mismatches
    per_copy = schedule.n_stages // schedule.n_copies
    for stage, order in enumerate(report.accumulation_orders):
        copy_index = stage // per_copy
        assert sorted(order) == list(
            range(copy_index * 4 // schedule.n_copies, (copy_index + 1) * 4 // schedule.n_copies)
        )
    if schedule.n_copies == 1 and len(set(report.accumulation_orders)) == 1:
        _check_against_oracle(mlp(), schedule, report.batch_size)


def test_chapter_case() -> None:
    """Two stages of 4 and 3 layers, batch 32, one micro-batch: the chapter's run."""
    report = verify(
        generate("1f1b", n_ranks=2, n_microbatches=1),
        model="mlp",
        devices="cpu,cpu",
        batch_size=32,
        warmup=0,
    )
    assert report.bit_identical
    assert report.n_params == 20_644 and report.model_param_bytes == 82_576
    assert report.param_bytes == (43_776, 38_800)
    assert report.layer_counts == (4, 3)
    assert report.transfer_bytes == ((12_288,),)  # (32, 96) float32 = 32 * 96 * 4
    # The chapter prints 0.1142 and 0.5349 for the full-batch backward.
    assert [round(g, 4) for g in report.grad_norms] == [0.1142, 0.5349]
    assert report.max_abs_diff_full_batch == 0.0  # one micro-batch is the full batch


@pytest.mark.parametrize("timed_steps", [1, 2, 5])
def test_several_timed_steps_report_the_median_one(timed_steps: int) -> None:
    """In process: ``timed_steps`` measured runs, the reported makespan and trace those of
    the median run (the lower middle of an even count), every run's makespan listed, and
    the chapter's gradients unchanged."""
    report = verify(
        generate("1f1b", n_ranks=2, n_microbatches=4),
        model="mlp",
        devices="cpu,cpu",
        batch_size=32,
        warmup=0,
        timed_steps=timed_steps,
    )
    assert report.bit_identical
    assert len(report.step_makespans) == timed_steps
    median = sorted(report.step_makespans)[(timed_steps - 1) // 2]
    assert report.measured_makespan == median
    assert report.trace.makespan / 1e9 == median
    assert report.to_dict()["step_makespans"] == list(report.step_makespans)


def test_transfer_bytes_per_microbatch() -> None:
    report = verify(
        generate("gpipe", n_ranks=3, n_microbatches=4), model="mlp", batch_size=32, warmup=0
    )
    assert report.transfer_bytes == ((8 * 96 * 4,) * 4, (8 * 96 * 4,) * 4)


def test_split_backward_i_and_w() -> None:
    report = verify(SPLIT, model="mlp", warmup=0)
    assert report.bit_identical and report.grads_equal
    assert report.accumulation_orders == ((0, 1, 2), (0, 1, 2))
    _check_against_oracle(mlp(), SPLIT, report.batch_size)


def test_overlapped_pairs_run_their_parts() -> None:
    report = verify(OVERLAPPED, model="mlp", warmup=0)
    assert report.bit_identical
    _check_against_oracle(mlp(), OVERLAPPED, report.batch_size)
    ranks = [r.rank for r in report.trace.actions]
    assert ranks.count(1) == 4  # the two pairs are timed as one unit each


def test_gpt_pipeline_is_bit_identical() -> None:
    schedule = generate("1f1b", n_ranks=3, n_microbatches=4)
    model = gpt(n_layers=2, width=32)
    report = verify(schedule, model=model, batch_size=8, warmup=0)
    assert report.bit_identical, report.mismatches
    assert report.layer_counts == (2, 1, 1)
    # (micro-batch of 2 rows, 16 positions, 32 wide) float32
    assert report.transfer_bytes == ((2 * 16 * 32 * 4,) * 4,) * 2
    _check_against_oracle(gpt(n_layers=2, width=32), schedule, 8)


@pytest.mark.slow
@pytest.mark.parametrize(("name", "p", "v"), [("zb-h1", 3, None), ("zbv", 2, 2)])
def test_gpt_split_backward_is_bit_identical(name: str, p: int, v: int | None) -> None:
    """I and W on transformer stages (residuals, layer norms, attention): W starts from
    the gradients I saved at the weight-owning nodes (verify.split_backward)."""
    schedule = generate(name, n_ranks=p, n_microbatches=4, virtual=v)
    assert any(a.op is Op.W for order in schedule.orders for a in order)
    report = verify(schedule, model=gpt(n_layers=3, width=32), batch_size=8, warmup=0)
    assert report.bit_identical, report.mismatches
    if len(set(report.accumulation_orders)) == 1:
        _check_against_oracle(gpt(n_layers=3, width=32), schedule, 8)


def test_uneven_microbatches_keep_every_row() -> None:
    schedule = generate("1f1b", n_ranks=2, n_microbatches=4)
    report = verify(schedule, model="mlp", batch_size=10, warmup=0)
    assert report.microbatch_sizes == (3, 3, 2, 2)
    assert report.bit_identical
    model = mlp()
    x, _ = model.make_batch(10)
    stages = cut_stages(model.layers, n_stages=2)
    _, target = model.make_batch(10)
    run = run_schedule(
        schedule,
        stages,
        devices=["cpu", "cpu"],
        inputs=x.tensor_split(4),
        targets=target.tensor_split(4),
        loss_fn=model.loss_fn,
    )
    rows = [range(0, 3), range(3, 6), range(6, 8), range(8, 10)]
    fresh = mlp().layers
    for k, r in enumerate(rows):
        assert torch.equal(run.outputs[k], fresh(x[r.start : r.stop]).detach())


def test_execution_order_respects_ranks_and_dependencies() -> None:
    for name, p, m, v, fwd in CASES:
        schedule = _build(name, p, m, v, fwd)
        order = execution_order(schedule)
        for rank in range(p):
            mine = [w for w in order if schedule.rank_of(w.parts[0].stage) == rank]
            assert mine == list(schedule.orders[rank])
        where = {a: i for i, w in enumerate(order) for a in w.parts}
        assert all(where[d.producer] < where[d.consumer] for d in data_dependencies(schedule))
        assert all(where[a] < where[b] for a, b in schedule.happens_before)


def _swap_last_two_backwards(schedule: Schedule, rank: int) -> Schedule:
    order = list(schedule.orders[rank])
    backs = [i for i, w in enumerate(order) if w.parts[0].op is Op.B]
    i, j = backs[-2], backs[-1]
    order[i], order[j] = order[j], order[i]
    orders = list(schedule.orders)
    orders[rank] = tuple(order)
    return Schedule(
        orders=tuple(orders),
        placement=schedule.placement,
        n_microbatches=schedule.n_microbatches,
        name="swapped",
    )


def test_changed_accumulation_order_is_caught() -> None:
    good = generate("1f1b", n_ranks=2, n_microbatches=4)
    swapped = _swap_last_two_backwards(good, rank=0)
    # On its own the swapped schedule is a valid one that adds 0, 1, 3, 2 on stage 0 ...
    alone = verify(swapped, model="mlp", warmup=0)
    assert alone.bit_identical and alone.accumulation_orders[0] == (0, 1, 3, 2)
    # ... but held to the order the original schedule promises, the sums differ.
    held = verify(
        swapped, model="mlp", warmup=0, accumulation_orders=schedule_accumulation_orders(good)
    )
    assert held.outputs_equal and held.losses_equal
    assert held.grads_equal is False and not held.bit_identical
    assert any("(stage 0)" in m for m in held.mismatches)
    assert not any("(stage 1" in m for m in held.mismatches)
    # Stage 0 added 0, 1 as promised, then 3 where 2 was due: the first wrong partial sum.
    assert held.mismatches[0].startswith(
        "gradients first differ after 0B3 (stage 0; micro-batch 2 was due): gradient of 0.weight"
    )


def test_wrong_stage_split_is_caught() -> None:
    model = mlp()
    layers = list(model.layers)
    # stage 1 forgets the GELU between the cut: the classic off-by-one split
    stages = (nn.Sequential(*layers[:4]), nn.Sequential(*layers[5:]))
    report = verify(
        generate("gpipe", n_ranks=2, n_microbatches=2), model=model, stages=stages, warmup=0
    )
    assert not report.outputs_equal and not report.bit_identical
    assert any(m.startswith("output of micro-batch 0") for m in report.mismatches)


def test_a_model_that_changes_between_calls_is_caught() -> None:
    class Drift(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.calls = 0

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            self.calls += 1
            return x + self.calls

    base = mlp()
    model = VerifyModel(
        name="drift",
        layers=nn.Sequential(*base.layers[:4], Drift(), *base.layers[4:]),
        make_batch=base.make_batch,
        loss_fn=base.loss_fn,
    )
    report = verify(generate("1f1b", n_ranks=2, n_microbatches=2), model=model, warmup=0)
    assert not report.bit_identical


@pytest.mark.parametrize(
    ("layer", "message"),
    [
        (nn.Dropout(0.1), r"dropout layer '1' \(Dropout, p=0.1\) is in training mode"),
        (nn.BatchNorm1d(96), r"batch-norm layer '1' \(BatchNorm1d\) is in training mode"),
    ],
)
def test_training_mode_randomness_is_refused(layer: nn.Module, message: str) -> None:
    base = mlp()
    model = VerifyModel(
        name="x",
        layers=nn.Sequential(base.layers[0], layer, *base.layers[1:]),
        make_batch=base.make_batch,
        loss_fn=base.loss_fn,
    )
    with pytest.raises(ExactnessError, match=message):
        verify(generate("gpipe", n_ranks=2, n_microbatches=2), model=model)
    layer.eval()  # inference-mode dropout / batch-norm is deterministic
    assert verify(
        generate("gpipe", n_ranks=2, n_microbatches=2), model=model, warmup=0
    ).bit_identical


def test_lower_matmul_precision_is_set_or_refused() -> None:
    layers = mlp().layers
    before = torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision("medium")
    try:
        refused = pytest.raises(ExactnessError, match=r"matmul_precision\(\) is 'medium'")
        with refused, exact_settings(layers, devices=["cpu"], apply=False):
            pass
        with exact_settings(layers, devices=["cpu"]):
            assert torch.get_float32_matmul_precision() == "highest"
        assert torch.get_float32_matmul_precision() == "medium"  # restored
    finally:
        torch.set_float32_matmul_precision(before)


def test_cuda_settings_are_named_one_by_one(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    # Checked by name only (no GPU needed): what exact mode refuses on CUDA.
    saved = (
        torch.get_float32_matmul_precision(),
        torch.backends.cuda.matmul.allow_tf32,
        torch.backends.cudnn.allow_tf32,
        torch.backends.cudnn.benchmark,
    )
    monkeypatch.delenv("CUBLAS_WORKSPACE_CONFIG", raising=False)
    try:
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
        torch.backends.cudnn.benchmark = True
        problems = exactness_problems(mlp().layers, devices=["cuda:0", "cpu"])
    finally:
        torch.backends.cuda.matmul.allow_tf32 = saved[1]
        torch.backends.cudnn.allow_tf32 = saved[2]
        torch.backends.cudnn.benchmark = saved[3]
        torch.set_float32_matmul_precision(saved[0])
    joined = "\n".join(problems)
    for needle in (
        "TF32 is on for CUDA matmuls",
        "TF32 is on for cuDNN",
        "non-deterministic algorithms are allowed",
        "cuDNN benchmarking is on",
        "CUBLAS_WORKSPACE_CONFIG",
        "some stages run on the CPU and some on CUDA",
    ):
        assert needle in joined
    assert exactness_problems(mlp().layers, devices=["cpu", "cpu"]) == []


def test_bad_inputs_are_refused() -> None:
    schedule = generate("1f1b", n_ranks=2, n_microbatches=4)
    with pytest.raises(VerifyError, match=r"batch of 3 rows cannot make 4 micro-batches"):
        verify(schedule, model="mlp", batch_size=3)
    with pytest.raises(VerifyError, match=r"unknown device 'tpu'"):
        parse_devices("tpu", n_ranks=2)
    with pytest.raises(VerifyError, match=r"3 devices \(cpu,cpu,cpu\) for 2 ranks"):
        parse_devices("cpu,cpu,cpu", n_ranks=2)
    if torch.cuda.device_count() < 8:
        with pytest.raises(VerifyError, match=r"device 'cuda:7' is not present"):
            parse_devices("cuda:7", n_ranks=1)
    with pytest.raises(ScheduleError, match="missing actions"):
        verify(Schedule.from_orders([["0F0"], ["1F0", "1B0"]]), model="mlp")
    with pytest.raises(VerifyError, match=r"3 stage modules for a schedule of 2 stages"):
        verify(schedule, model="mlp", stages=cut_stages(mlp().layers, n_stages=3))


def test_a_gradient_is_checked_bit_for_bit_and_every_difference_is_named() -> None:
    """verify.compare._grad_matches by hand: both absent and equal tensors match; one side
    absent or one bit off is a mismatch that names the parameter, the stage, the size of
    the difference and the actions that added the gradient."""
    from verify.compare import _grad_matches

    found: list[str] = []
    one = torch.tensor([1.0, 2.0])
    assert _grad_matches("w (stage 0)", None, None, "0B0", found)
    assert _grad_matches("w (stage 0)", one, one.clone(), "0B0", found)
    assert found == []
    assert not _grad_matches("w (stage 0)", one, None, "0B0", found)
    assert not _grad_matches("w (stage 1)", None, one, "1B0", found)
    off = torch.tensor([1.0, 2.0 + 2.0**-22])  # one float32 ulp above 2
    assert not _grad_matches("w (stage 1)", one, off, "1B0..1B1", found)
    assert found == [
        "gradient of w (stage 0): missing",
        "gradient of w (stage 1): unexpected",
        "gradient of w (stage 1) (max abs diff 2.38e-07, added by 1B0..1B1)",
    ]
