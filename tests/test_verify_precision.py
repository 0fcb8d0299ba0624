"""verify in bf16 / fp16 / fp32 and under autocast, the built-in Llama, and the batch-size
vocabulary (rows per step, rows per micro-batch).

The oracle of every bit-identity check is the unsplit model run on the same micro-batches
(verify's own exact check); beside it the tests check independently that the run really
was in the dtype asked for (parameter dtypes, bytes per message from the shapes), so a
dtype silently dropped cannot pass.
"""

from __future__ import annotations

import json
import textwrap

import pytest

torch = pytest.importorskip("torch")

from pipesim.cli import main  # noqa: E402
from pipesim.schedules import generate  # noqa: E402
from verify.blocks import LlamaBlock  # noqa: E402
from verify.compare import step_rows, verify  # noqa: E402
from verify.errors import VerifyError  # noqa: E402
from verify.models import llama, load_model, with_precision  # noqa: E402
from verify.precision import parse_dtype  # noqa: E402

pytestmark = pytest.mark.torch

_ITEMSIZE = {"fp32": 4, "bf16": 2, "fp16": 2}
_SCHEDULES = (
    ("1f1b", None),
    ("interleaved-1f1b", 2),
    ("zb-h1", None),  # I and W split (zero bubble)
    ("dualpipe", None),  # two model copies
)
_WIDTH, _SEQ = 32, 16  # the models below; seq is the builders' default


_DTYPES = ("fp32", "bf16", "fp16")
_MODELS = ("llama", "gpt")
# Every (schedule, dtype) pair, each schedule and each dtype with both models: a pairwise
# covering of the three factors in 12 runs instead of the 24 of the full product.
_EVERY_DTYPE = [
    (_MODELS[(i + j) % 2], dtype, schedule, virtual)
    for i, (schedule, virtual) in enumerate(_SCHEDULES)
    for j, dtype in enumerate(_DTYPES)
]
# Autocast: the four runs of a two-level orthogonal array over model, dtype and schedule
# (each pair of factors meets in all four combinations).
_AUTOCAST = [
    ("llama", "bf16", "1f1b"),
    ("llama", "fp16", "zb-h1"),
    ("gpt", "bf16", "zb-h1"),
    ("gpt", "fp16", "1f1b"),
]


def _small(name: str, **precision: str) -> object:
    return load_model(name, n_layers=4, width=_WIDTH, **precision)


@pytest.mark.slow  # 2-15 s each: make test runs them, make test-fast does not
@pytest.mark.parametrize(("model", "dtype", "schedule", "virtual"), _EVERY_DTYPE)
def test_bit_identical_in_every_dtype(
    model: str, dtype: str, schedule: str, virtual: int | None
) -> None:
    built = _small(model, dtype=dtype)
    report = verify(
        generate(schedule, n_ranks=2, n_microbatches=4, virtual=virtual),
        model=built,  # type: ignore[arg-type]
        devices="cpu",
        microbatch_size=2,
        warmup=0,
    )
    assert report.bit_identical, report.mismatches
    assert report.precision == dtype
    assert {p.dtype for p in built.layers.parameters()} == {parse_dtype(dtype)}  # type: ignore[attr-defined]
    # Every activation crossing a boundary: 2 rows x seq x width elements of the dtype.
    crossing = [b for sizes in report.transfer_bytes for b in sizes if b]
    assert crossing and set(crossing) == {2 * _SEQ * _WIDTH * _ITEMSIZE[dtype]}


@pytest.mark.slow  # 2-15 s each: make test runs them, make test-fast does not
@pytest.mark.parametrize(("model", "under", "schedule"), _AUTOCAST)
def test_bit_identical_under_autocast(model: str, under: str, schedule: str) -> None:
    built = _small(model, autocast=under)
    report = verify(
        generate(schedule, n_ranks=2, n_microbatches=4),
        model=built,
        devices="cpu",  # type: ignore[arg-type]
    )
    assert report.bit_identical, report.mismatches
    assert report.precision == f"fp32, autocast {under}"
    # float32 master weights; the residual stream stays float32, so do the messages.
    assert {p.dtype for p in built.layers.parameters()} == {torch.float32}  # type: ignore[attr-defined]
    assert set(report.transfer_bytes[0]) == {8 * _SEQ * _WIDTH * 4}


def test_autocast_runs_the_matmuls_in_the_lower_dtype() -> None:
    plain, cast = _small("llama"), _small("llama", autocast="bf16")
    x, _ = plain.make_batch(2)  # type: ignore[attr-defined]
    with torch.no_grad():
        a = plain.layers(x)  # type: ignore[attr-defined]
        b = cast.layers(x)  # type: ignore[attr-defined]
    assert a.dtype == torch.float32 and b.dtype == torch.bfloat16  # the head's Linear
    assert not torch.equal(a, b.float()) and torch.allclose(a, b.float(), atol=0.1)


@pytest.mark.slow  # 2-15 s each: make test runs them, make test-fast does not
def test_a_wrong_accumulation_order_is_caught_in_bf16() -> None:
    # bf16 addition is not associative: adding the micro-batches' gradients in another
    # order than the schedule's changes bits, and the check must say so.
    schedule = generate("1f1b", n_ranks=2, n_microbatches=4)
    report = verify(
        schedule,
        model=_small("llama", dtype="bf16"),  # type: ignore[arg-type]
        devices="cpu",
        accumulation_orders=[(3, 2, 1, 0), (3, 2, 1, 0)],
    )
    assert report.grads_equal is False and not report.bit_identical
    assert any(m.startswith("gradient of") for m in report.mismatches)


_FACTORY = """
import torch
from torch import nn


def bf16_mlp():
    return nn.Sequential(nn.Linear(8, 16), nn.GELU(), nn.Linear(16, 4)).to(torch.bfloat16)


class _Amp(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(8, 8)

    def forward(self, x):
        with torch.autocast(device_type=x.device.type, dtype=torch.bfloat16):
            return self.fc(x)


def uses_autocast():
    return [_Amp(), nn.GELU(), _Amp(), _Amp()]
"""


def test_user_models_in_bf16_and_with_their_own_autocast(tmp_path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    # A bf16 nn.Sequential from a factory failed in its first matmul ("mat1 and mat2
    # must have the same dtype"): its batch was drawn in float32.
    (tmp_path / "precision_models.py").write_text(textwrap.dedent(_FACTORY))
    monkeypatch.syspath_prepend(str(tmp_path))
    schedule = generate("1f1b", n_ranks=2, n_microbatches=4)
    report = verify(schedule, model="precision_models:bf16_mlp", devices="cpu")
    assert report.bit_identical and report.precision == "bf16"
    assert report.transfer_bytes[0] == (8 * 16 * 2,) * 4  # 8 rows x 16 features, bf16
    # The model's own autocast: its first stage hands on bf16, the receiver takes bf16.
    report = verify(schedule, model="precision_models:uses_autocast", devices="cpu")
    assert report.bit_identical
    assert report.transfer_bytes[0] == (8 * 8 * 2,) * 4


def test_refused_combinations_say_why() -> None:
    with pytest.raises(VerifyError, match="not both"):
        load_model("gpt", dtype="bf16", autocast="bf16")
    with pytest.raises(VerifyError, match="autocast fp32 computes nothing"):
        load_model("mlp", autocast="fp32")
    with pytest.raises(VerifyError, match="unknown dtype 'bf8'"):
        load_model("mlp", dtype="bf8")
    with pytest.raises(VerifyError, match="already fp32, autocast bf16"):
        with_precision(load_model("mlp", autocast="bf16"), autocast="fp16")
    with pytest.raises(VerifyError, match="n_kv_heads=2 sizes the llama model"):
        load_model("gpt", n_kv_heads=2)
    with pytest.raises(VerifyError, match="n_heads 4 is not a multiple of n_kv_heads 3"):
        llama(n_heads=4, n_kv_heads=3)
    with pytest.raises(VerifyError, match="heads of an even size"):
        llama(width=36, n_heads=4)  # head size 9: rotary turns pairs


def test_llama_parameter_count_is_the_closed_form() -> None:
    width, heads, kv, ffn, vocab, layers = 64, 8, 2, 160, 128, 3
    model = llama(n_layers=layers, width=width, n_heads=heads, n_kv_heads=kv, ffn_width=ffn)
    head = width // heads
    block = 2 * width + 2 * width * width + 2 * width * kv * head + 3 * width * ffn
    expected = vocab * width + layers * block + width + width * vocab
    assert sum(p.numel() for p in model.layers.parameters()) == expected
    assert len(model.layers) == layers + 2


def test_llama_block_is_causal_and_rotary_is_relative() -> None:
    torch.manual_seed(0)
    block = LlamaBlock(width=32, n_heads=4, n_kv_heads=2, ffn_width=64, seq_len=8)
    x = torch.randn(1, 8, 32)
    changed = x.clone()
    changed[:, 5:] = torch.randn(1, 3, 32)
    with torch.no_grad():
        a, b = block(x), block(changed)
    assert torch.equal(a[:, :5], b[:, :5]) and not torch.equal(a[:, 5:], b[:, 5:])
    # With rotary positions the attention scores depend on offsets only: the same token
    # at every position gives the same scores along each diagonal (up to rounding).
    from verify.blocks import _rotate

    q = torch.randn(1, 1, 1, 8).expand(1, 1, 6, 8)
    scores = _rotate(q) @ _rotate(q).transpose(-2, -1)
    for offset in range(1, 3):
        diagonal = torch.diagonal(scores[0, 0], offset)
        assert torch.allclose(diagonal, diagonal[0].expand_as(diagonal), atol=1e-5)
    assert torch.allclose(_rotate(q)[..., 0, :], q[..., 0, :])  # position 0: no turn


def test_rows_per_step_and_per_microbatch() -> None:
    assert step_rows(4) == 32 and step_rows(3) == 33  # 32 rounded up to whole micro-batches
    assert step_rows(4, microbatch_size=8) == 32 == step_rows(4, batch_size=32)
    assert step_rows(4, batch_size=32, microbatch_size=8) == 32
    with pytest.raises(VerifyError, match=r"30 \(--global-batch\) disagree with 8 rows per"):
        step_rows(4, batch_size=30, microbatch_size=8)
    with pytest.raises(VerifyError, match="microbatch_size must be a whole number"):
        step_rows(4, microbatch_size=0)


def _cli_report(tmp_path, *flags: str) -> dict[str, object]:  # type: ignore[no-untyped-def]
    out = tmp_path / "report.json"
    args = ["verify", "1f1b", "-p", "2", "-m", "4", "--json", "-o", str(out), *flags]
    assert main(args) == 0
    return json.loads(out.read_text())  # type: ignore[no-any-return]


def test_cli_batch_flags_agree_and_conflicts_are_clear(tmp_path, capsys) -> None:  # type: ignore[no-untyped-def]
    by_mb = _cli_report(tmp_path, "--microbatch-size", "3")
    by_step = _cli_report(tmp_path, "--global-batch", "12")
    old_flag = _cli_report(tmp_path, "--batch-size", "12")
    for report in (by_mb, by_step, old_flag):
        assert report["batch_size"] == 12 and report["microbatch_sizes"] == [3, 3, 3, 3]
    assert main(["verify", "1f1b", "-p", "2", "-m", "4", "--batch-size", "10",
                 "--microbatch-size", "3"]) == 2  # fmt: skip
    err = capsys.readouterr().err
    assert "rows per step 10 (--global-batch) disagree with 3 rows per micro-batch" in err
    assert main(["verify", "1f1b", "-p", "2", "-m", "4", "--model", "gpt",
                 "--llama-kv-heads", "2"]) == 2  # fmt: skip
    assert "--llama-kv-heads size --model llama, not --model gpt" in capsys.readouterr().err


def test_cli_llama_bf16_report_prints_both_batch_sizes(tmp_path, capsys) -> None:  # type: ignore[no-untyped-def]
    flags = ["--model", "llama", "--llama-layers", "2", "--llama-width", "32",
             "--llama-heads", "4", "--llama-kv-heads", "1", "--llama-ffn", "48",
             "--dtype", "bf16", "--microbatch-size", "2"]  # fmt: skip
    assert main(["verify", "zb-h1", "-p", "2", "-m", "4", *flags]) == 0
    text = capsys.readouterr().out
    assert "model llama (bf16)" in text and "BIT-IDENTICAL" in text
    assert "rows: 8 per step (global batch), 2 per micro-batch (micro-batch size)" in text
    # 2 rows x 16 positions x 32 features x 2 bytes per activation
    assert f"transfer stage 0 -> 1: {', '.join(['2,048'] * 4)} bytes" in text
    n_params = 128 * 32 + 2 * (2 * 32 + 2 * 32 * 32 + 2 * 32 * 8 + 3 * 32 * 48) + 32 + 32 * 128
    assert f"parameters: {n_params:,} = {2 * n_params:,} bytes" in text


# -- one process per rank: one run per dtype ---------------------------------------------------
@pytest.mark.dist
@pytest.mark.slow
@pytest.mark.timeout(400)
@pytest.mark.parametrize(
    ("dtype", "schedule"), [("fp32", "1f1b"), ("bf16", "zb-h1"), ("fp16", "1f1b")]
)
def test_dist_messages_travel_in_the_dtype(dtype: str, schedule: str) -> None:
    from verify.dist import verify_distributed

    m, rows = 4, 2
    report = verify_distributed(
        generate(schedule, n_ranks=2, n_microbatches=m),
        model="llama",
        model_options={"n_layers": 2, "width": _WIDTH, "dtype": dtype},
        batch_size=m * rows,
        timeout_s=300,
    )
    assert report.bit_identical, report.mismatches
    assert report.precision == dtype
    # Rank 0 sends m activations, rank 1 m gradients, each rows x seq x width elements:
    # counted by the transport as it sends, so a bf16 run puts half the fp32 bytes on the wire.
    one = rows * _SEQ * _WIDTH * _ITEMSIZE[dtype]
    assert report.wire_bytes == (m * one, m * one)
    assert report.wire_dtypes == (str(parse_dtype(dtype)).removeprefix("torch."),)
    assert sum(report.wire_bytes) == 2 * sum(map(sum, report.transfer_bytes))


def _kernels_rank(rank: int, rendezvous: str, threads: int, out: str) -> None:
    """One rank of a two-process gloo group with its own thread count: what
    ``verify.torchrun``'s check says (run in a spawned process)."""
    from datetime import timedelta
    from pathlib import Path

    import torch.distributed as dist

    from verify.errors import ExactnessError
    from verify.torchrun import _same_kernels

    torch.set_num_threads(threads)
    dist.init_process_group(
        "gloo",
        init_method=f"file://{rendezvous}",
        rank=rank,
        world_size=2,
        timeout=timedelta(seconds=60),
    )
    try:
        _same_kernels(torch.device("cpu"), 2)
        Path(out).write_text("accepted")
    except ExactnessError as exc:
        Path(out).write_text(str(exc))
    finally:
        dist.destroy_process_group()


@pytest.mark.dist
@pytest.mark.timeout(200)
@pytest.mark.parametrize(("threads", "refused"), [((1, 1), False), ((1, 2), True)])
def test_torchrun_refuses_cpu_ranks_with_different_thread_counts(
    tmp_path, threads: tuple[int, int], refused: bool
) -> None:  # type: ignore[no-untyped-def]
    import multiprocessing

    context = multiprocessing.get_context("spawn")
    outs = [tmp_path / f"rank{r}.txt" for r in range(2)]
    procs = [
        context.Process(
            target=_kernels_rank, args=(r, str(tmp_path / "rdv"), threads[r], str(outs[r]))
        )
        for r in range(2)
    ]
    for p in procs:
        p.start()
    for p in procs:
        p.join(150)
        if p.is_alive():
            p.kill()
    said = [o.read_text() for o in outs]
    if not refused:
        assert said == ["accepted", "accepted"]
    else:
        assert said[0] == said[1] and said[0].startswith(
            "the CPU ranks run different torch thread counts (rank 0 = 1, rank 1 = 2)"
        )
