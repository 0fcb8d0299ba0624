"""verify on CUDA GPUs: skipped without one; run by scripts/gpu_check.sh on a GPU machine.

With one GPU every rank shares ``cuda:0``; with two or more, ranks take
``cuda:0``, ``cuda:1``, ... in turn (stages then really move between devices).
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from pipesim.schedule import Schedule  # noqa: E402
from pipesim.schedules import generate  # noqa: E402
from verify.bit_identity import exact_settings  # noqa: E402
from verify.compare import verify  # noqa: E402
from verify.errors import ExactnessError  # noqa: E402
from verify.models import gpt, load_model, mlp  # noqa: E402

pytestmark = [
    pytest.mark.torch,
    pytest.mark.cuda,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]


def _devices(n_ranks: int) -> str:
    count = torch.cuda.device_count()
    return ",".join(f"cuda:{r % count}" for r in range(n_ranks))


@pytest.mark.parametrize(
    ("name", "p", "m", "v"),
    [
        ("gpipe", 2, 4, None),
        ("1f1b", 2, 3, None),
        ("1f1b", 4, 8, None),
        ("interleaved-1f1b", 2, 4, 2),
    ],
)
def test_builtin_schedules_on_gpus(name: str, p: int, m: int, v: int | None) -> None:
    schedule = generate(name, n_ranks=p, n_microbatches=m, virtual=v)
    for model in (mlp(), gpt(n_layers=6, width=64)):
        report = verify(schedule, model=model, devices=_devices(p), batch_size=8 * m)
        assert report.bit_identical, report.mismatches
        assert report.measured_makespan > 0 and report.predicted_makespan > 0


def test_chapter_numbers_on_gpus() -> None:
    report = verify(
        generate("1f1b", n_ranks=2, n_microbatches=1),
        model="mlp",
        devices=_devices(2),
        batch_size=32,
    )
    assert report.bit_identical
    assert report.param_bytes == (43_776, 38_800) and report.transfer_bytes == ((12_288,),)
    assert all(g > 0 for g in report.grad_norms)


def test_split_backward_on_gpus() -> None:
    schedule = Schedule.from_orders(
        [
            ["0F0", "0F1", "0I0", "0F2", "0I1", "0W0", "0I2", "0W1", "0W2"],
            ["1F0", "1I0", "1F1", "1W0", "1I1", "1F2", "1W1", "1I2", "1W2"],
        ]
    )
    assert verify(
        schedule, model=gpt(n_layers=2, width=64), devices=_devices(2), batch_size=12
    ).bit_identical


@pytest.mark.parametrize(
    ("precision", "name", "v"),
    [
        ({"dtype": "bf16"}, "1f1b", None),
        ({"dtype": "bf16"}, "zb-h1", None),  # I and W split
        ({"dtype": "fp16"}, "interleaved-1f1b", 2),
        ({"autocast": "bf16"}, "1f1b", None),
    ],
)
def test_llama_and_gpt_in_low_precision_on_gpus(
    precision: dict[str, str], name: str, v: int | None
) -> None:
    schedule = generate(name, n_ranks=2, n_microbatches=4, virtual=v)
    for model in ("llama", "gpt"):
        built = load_model(model, n_layers=4, width=64, **precision)
        report = verify(schedule, model=built, devices=_devices(2), microbatch_size=4)
        assert report.bit_identical, (model, precision, report.mismatches)
        if "dtype" in precision:  # 4 rows x 16 positions x 64 features x 2 bytes
            assert set(report.transfer_bytes[0]) == {4 * 16 * 64 * 2}


def test_settings_are_set_then_restored() -> None:
    before = (torch.backends.cuda.matmul.allow_tf32, torch.are_deterministic_algorithms_enabled())
    with exact_settings(mlp().layers, devices=["cuda:0"]):
        assert not torch.backends.cuda.matmul.allow_tf32
        assert torch.are_deterministic_algorithms_enabled()
    assert (
        torch.backends.cuda.matmul.allow_tf32,
        torch.are_deterministic_algorithms_enabled(),
    ) == before


def test_tf32_is_refused_when_settings_are_not_applied() -> None:
    saved = (torch.get_float32_matmul_precision(), torch.backends.cuda.matmul.allow_tf32)
    torch.backends.cuda.matmul.allow_tf32 = True
    try:
        with pytest.raises(ExactnessError, match="TF32 is on for CUDA matmuls"):
            verify(
                generate("gpipe", n_ranks=2, n_microbatches=2),
                model="mlp",
                devices=_devices(2),
                apply_settings=False,
            )
    finally:
        torch.backends.cuda.matmul.allow_tf32 = saved[1]
        torch.set_float32_matmul_precision(saved[0])


def test_cuda_event_timings_are_on_the_trace() -> None:
    report = verify(generate("1f1b", n_ranks=2, n_microbatches=4), model="mlp", devices=_devices(2))
    assert all(r.end >= r.start >= 0 for r in report.trace.actions)
    assert report.costs.stage(0).forward > 0


@pytest.mark.dist
@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="NCCL needs one GPU per rank")
@pytest.mark.timeout(400)
def test_torchrun_with_nccl_is_bit_identical(tmp_path) -> None:  # type: ignore[no-untyped-def]
    import json
    import subprocess
    import sys

    report = tmp_path / "report.json"
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone"]
    command += ["--nproc-per-node", "2", "-m", "verify", "zbv", "-p", "2", "-m", "8"]
    command += ["--model", "gpt", "--gpt-layers", "6", "--json", "-o", str(report)]
    done = subprocess.run(command, capture_output=True, text=True, timeout=360)
    assert done.returncode == 0, done.stderr[-3000:]
    data = json.loads(report.read_text())
    assert data["bit_identical"] is True, data["mismatches"]
    assert data["devices"] == ["cuda:0", "cuda:1"]


def test_unit_clock_times_queued_work_without_waiting_for_it() -> None:
    from verify.timing import UnitClock

    device = torch.device("cuda", 0)
    clock = UnitClock([device])
    spans: list[tuple[int, int]] = []
    for _ in range(3):
        start = clock.mark(device)
        torch.cuda._sleep(20_000_000)  # type: ignore[attr-defined]  # ~10 ms of GPU cycles
        end = clock.mark(device)
        clock.span(device, start, end, lambda s, e: spans.append((s, e)))
    # The marks queued events and returned: the sleeps have not all run yet, nothing is read.
    assert not torch.cuda.current_stream(device).query() and spans == []
    clock.finish()
    assert len(spans) == 3
    assert all(0 <= s < e for s, e in spans)
    assert spans[0][1] <= spans[1][0] and spans[1][1] <= spans[2][0]  # one stream, in order
