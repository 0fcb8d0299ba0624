"""benchmarks/bench_gpu_rates.py on CPU: its shapes are the GEMMs pipesim prices, its dry
run prints them all, without CUDA it exits 3, and its measuring plumbing reports the
times a fake GPU of one known rate takes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from types import ModuleType, SimpleNamespace
from typing import Any

import pytest
from helpers import BENCHMARKS, load_benchmark

from pipesim.plan.kernels import Gemm

SCRIPT = BENCHMARKS / "bench_gpu_rates.py"
ROOT = BENCHMARKS.parent


def _bench() -> ModuleType:
    return load_benchmark("bench_gpu_rates")


def test_the_7b_t2_shapes_are_its_block_gemms_worked_by_hand() -> None:
    # the Megatron-LM README's 7.1B row: h 4096, GeLU MLP of 4h, t = 2, one 4096-token
    # sequence: T = 4096 tokens, qkv (T, 3h/t, h), projection (T, h, h/t), MLP up
    # (T, 4h/t, h), down (T, h, 4h/t); input gradients (m, k, n), weight gradients (k, n, m)
    bench = _bench()
    (config,) = [c for c in bench.CONFIGS if c.name == "megatron-7.1b-t2"]
    T, h, t = 4096, 4096, 2
    qkv, proj, up, down = (T, 3 * h // t, h), (T, h, h // t), (T, 4 * h // t, h), (T, h, 4 * h // t)
    forward = [qkv, proj, up, down]
    backward = [down, up, proj, qkv]  # the MLP first, each layer in reverse
    expected = (
        [("forward", m, n, k) for m, n, k in forward]
        + [("input_grad", m, k, n) for m, n, k in backward]
        + [("weight_grad", k, n, m) for m, n, k in [down, up, proj, qkv]]
    )
    got = [(s.pass_name, s.gemm.m, s.gemm.n, s.gemm.k) for s in bench.block_shapes(config)]
    assert got == expected


def test_all_shapes_are_the_reference_then_each_block() -> None:
    bench = _bench()
    shapes = bench.all_shapes()
    assert shapes[0].gemm == Gemm("msmf reference", 8192, 8448, 20480)
    assert len(shapes) == 1 + 12 * len(bench.CONFIGS)


def _run(*argv: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    environment = {**os.environ, "PYTHONPATH": str(ROOT), **(env or {})}
    return subprocess.run(
        [sys.executable, str(SCRIPT), *argv],
        capture_output=True,
        text=True,
        timeout=120,
        env=environment,
    )


def test_the_dry_run_prints_every_shape() -> None:
    done = _run("--dry-run")
    assert done.returncode == 0, done.stderr
    for shape in _bench().all_shapes():
        assert shape.label in done.stdout
    # the 1.7B's qkv forward: 2 x 4096 x 6144 x 2048 FLOPs at the 708.5 TFLOP/s cap
    assert "megatron-1.7b-t1 forward qkv (4096 x 6144 x 2048) | 145.5 (708)" in done.stdout


def test_without_cuda_the_measuring_mode_exits_3_saying_why() -> None:
    done = _run("--budget-s", "5", env={"CUDA_VISIBLE_DEVICES": ""})
    assert done.returncode == 3
    assert done.stderr.startswith("bench_gpu_rates: FAIL ")
    assert done.stdout == ""


#: The fake GPU's rate: every GEMM takes its FLOPs at 500 TFLOP/s.
RATE = 500e12


class _Tensor:
    def __init__(self, shape: tuple[int, ...]) -> None:
        self.shape = shape

    def to(self, _dtype: object) -> _Tensor:
        return self

    def t(self) -> _Tensor:
        return _Tensor(self.shape[::-1])

    def zero_(self) -> None:
        pass


def _fake_torch() -> Any:
    """A torch whose GEMMs advance a virtual GPU clock by ``2 m n k / RATE`` and whose
    CUDA events read that clock."""
    clock = [0.0]

    def matmul(a: _Tensor, b: _Tensor, **_: object) -> None:
        *batch, m, k = a.shape
        clock[0] += 2 * m * b.shape[-1] * k * (batch[0] if batch else 1) / RATE

    class Event:
        def __init__(self, enable_timing: bool = False) -> None:
            self.at = 0.0

        def record(self) -> None:
            self.at = clock[0]

        def elapsed_time(self, other: Event) -> float:
            return (other.at - self.at) * 1e3

        def synchronize(self) -> None:
            pass

    properties = SimpleNamespace(multi_processor_count=132, L2_cache_size=50 * 2**20)
    cuda = SimpleNamespace(
        Event=Event,
        synchronize=lambda: None,
        is_available=lambda: True,
        device_count=lambda: 1,
        get_device_properties=lambda _i: properties,
        get_device_name=lambda _i=0: "fake H100",
        get_device_capability=lambda _i=0: (9, 0),
    )

    def make(*shape: Any, **_: object) -> _Tensor:
        return _Tensor(tuple(shape[0]) if shape and isinstance(shape[0], tuple) else shape)

    return SimpleNamespace(
        __version__="0.fake",
        version=SimpleNamespace(cuda="12.fake"),
        cuda=cuda,
        bfloat16="bf16",
        float32="fp32",
        int32="int32",
        float8_e4m3fn="e4m3",
        randn=make,
        empty=make,
        ones=make,
        mm=matmul,
        bmm=matmul,
        _scaled_mm=matmul,
    )


def test_a_fake_gpu_of_one_rate_measures_that_rate_everywhere(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setitem(sys.modules, "torch", _fake_torch())
    monkeypatch.setattr(time, "sleep", lambda _s: None)
    bench = _bench()
    out = tmp_path / "rates.json"
    quick = ["--soak-s", "0.01", "--settle-s", "0.01", "--window-s", "0.001", "--idle-s", "0.01"]
    assert bench.main(["--out", str(out), *quick]) == 0
    data = json.loads(out.read_text())
    assert data["dtypes"] == ["bf16", "fp8"] and data["stopped"] is None and not data["errors"]
    assert len(data["gemms"]) == 2 * len(bench.all_shapes())
    for row in data["gemms"]:
        expected = row["flops"] / RATE
        assert row["burst"]["seconds"] == pytest.approx(expected, rel=1e-9)
        assert row["sustained"]["seconds"] == pytest.approx(expected, rel=1e-9)
        if row["config"] != "reference":  # the reference runs alone, in no mix
            assert row["mixed_s"] == pytest.approx(expected, rel=1e-9)
    assert [(m["config"], m["dtype"]) for m in data["mixed"]] == [
        (c.name, d) for d in ("bf16", "fp8") for c in bench.CONFIGS
    ]
    # every H100 block GEMM's table rate is above the 708.5 TFLOP/s cap: none under it
    bf16 = data["summary"]["bf16"]
    assert bf16["sustained_over_cap"] == {"median": pytest.approx(1.0), "n": 37}
    assert bf16["mixed_over_cap"] == {"median": pytest.approx(1.0), "n": 36}
    assert bf16["sustained_under_cap"] == {"median": None, "n": 0}


def test_a_spent_budget_stops_and_says_so(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setitem(sys.modules, "torch", _fake_torch())
    monkeypatch.setattr(time, "sleep", lambda _s: None)
    # 6 s of budget: the bursts fit (each wants 5 s left beyond its idle second), the 20 s
    # soak before the first sustained rate does not
    assert _bench().main(["--budget-s", "6", "--idle-s", "0.01"]) == 0
    printed = capsys.readouterr().out
    assert "stopped: budget (6 s) reached in bf16 sustained_phase" in printed
    assert printed.rsplit("took", 1)[0].endswith(
        "summary bf16: median sustained/burst time; alone: under the cap - (n=0), over it - "
        "(n=0); in the mix: under the cap - (n=0), over it - (n=0)\n"
        "summary fp8: median sustained/burst time; alone: under the cap - (n=0), over it - "
        "(n=0); in the mix: under the cap - (n=0), over it - (n=0)\n"
    )
