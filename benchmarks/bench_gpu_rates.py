"""Burst and sustained GEMM rates on this GPU, against what the planner assumes.

The planner prices each GEMM from burst measurements (OpenXLA's H100 table, the MAMF
share), capped at the sustained rate measured with the board at its power limit
(``sustained_matmul_flops`` / ``fp8_sustained_matmul_flops``; docs/planner-model.md,
"Burst and sustained rates"). Whether the GEMMs *under* that cap also slow down when a
training step holds the GPU at its power limit is what no public source measures. This
measures it for the GEMMs pipesim prices (the ``Gemm`` kernels of
``layer_kernels(spec, "block", shard)`` for :data:`CONFIGS`, plus the MSMF reference
shape), in bf16 and, where the GPU and torch have it, FP8 (``torch._scaled_mm``):

- **burst**: after ``--idle-s`` idle, ``--iterations`` GEMMs timed by CUDA events, each
  after a 256 MiB write that flushes the L2 cache (as stas00/ml-engineering's
  mamf-finder does); the median;
- **sustained**: the same GEMM looped with no gap (the first for ``--soak-s``, each
  later one for ``--settle-s``: the board stays loaded between them), then timed over a
  ``--window-s`` window, its operands rotated over enough copies to overflow the L2;
- **mixed**: each configuration's block GEMMs in layer order (forward, input-gradient,
  weight-gradient) back to back for ``--soak-s``, then each one timed within the mix.

While each runs, ``nvidia-smi`` samples the SM clock, the power and the active throttle
reasons (omitted where there is no ``nvidia-smi``). Printed per GEMM: pipesim's time
(``gemm_seconds`` with the ``--accelerator`` preset, and with its sustained caps removed),
burst, sustained, their ratios, clocks and power; the JSON (``--out``) holds it all and is
rewritten after every measurement, so a run stopped early leaves what it measured.

Run on a GPU machine (from the repository root; pipesim needs simpy there):
``PYTHONPATH=. python benchmarks/bench_gpu_rates.py --out gpu-rates.json``.
Anywhere, without a GPU: ``--dry-run`` prints the shapes and pipesim's predictions.
Exit status: 0 done (or stopped at ``--budget-s``, which its last lines say), 2 a usage
error, 3 this environment cannot measure (no torch, a CPU build of torch, no GPU), as
``scripts/gpu_check.sh``.
"""

from __future__ import annotations

import argparse
import json
import math
import shutil
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from pipesim.plan.gpu import gemm_seconds
from pipesim.plan.hardware import Accelerator, get_accelerator
from pipesim.plan.kernels import Gemm, Shard, layer_kernels
from pipesim.plan.model import ModelSpec, get_model

sys.path.insert(0, str(Path(__file__).parent))
import bench_published as published

#: Exit status when this environment cannot measure (as scripts/gpu_check.sh).
NO_GPU = 3
#: The L2 flush between burst iterations: mamf-finder's 256 MiB write (``cache.zero_()``
#: of a 256e6-byte int32 buffer before each timed ``torch.mm``).
FLUSH_BYTES = 256 * 2**20
#: The shape of the H200's MSMF (stas00/ml-engineering mamf-finder v4, branch fast-mamf):
#: M x N x K, the one the sustained cap comes from.
MSMF_REFERENCE = Gemm("msmf reference", 8192, 8448, 20480)
PASSES = ("forward", "input_grad", "weight_grad")


@dataclass(frozen=True)
class Config:
    """One block pipesim prices: its model and how a micro-batch of it is split."""

    name: str
    spec: ModelSpec
    shard: Shard


def _readme_block(name: str, /) -> tuple[ModelSpec, Shard]:
    """A row of the Megatron-LM README's H100 weak-scaling table as
    benchmarks/bench_published.py models it, and how its micro-batch is split."""
    table = next(t for t in published.TABLES if t.title.startswith("Megatron-LM README"))
    run = next(r for r in table.runs if r.name == name)
    shard = Shard(
        microbatch_size=run.microbatch,
        tensor=run.tensor,
        sequence_parallel=run.sequence_parallel,
    )
    return table.model(run), shard


#: The README's 1.7B (t1) and 7.1B (t2, sequence parallel) rows, micro-batch 1, and a
#: Llama 3 70B block at t8 with 8192-token sequences (the Megatron-Bridge / NeMo rows).
CONFIGS = (
    Config("megatron-1.7b-t1", *_readme_block("1.7B")),
    Config("megatron-7.1b-t2", *_readme_block("7.1B")),
    Config(
        "llama3-70b-t8",
        replace(get_model("llama3-70b"), seq_length=8192, dtype="bf16"),
        Shard(tensor=8, sequence_parallel=True),
    ),
)


@dataclass(frozen=True)
class Shape:
    """One GEMM pipesim prices: the configuration and pass it belongs to."""

    config: str
    pass_name: str
    gemm: Gemm

    @property
    def label(self) -> str:
        g = self.gemm
        batch = f"{g.batch} x " if g.batch > 1 else ""
        return f"{self.config} {self.pass_name} {g.name} ({batch}{g.m} x {g.n} x {g.k})"


def block_shapes(config: Config, /) -> tuple[Shape, ...]:
    """The ``Gemm`` kernels of ``config``'s block, F, I and W in the order they run."""
    kernels = layer_kernels(config.spec, "block", config.shard).passes()
    return tuple(
        Shape(config.name, name, k) for name in PASSES for k in kernels[name] if isinstance(k, Gemm)
    )


def all_shapes(configs: Sequence[Config] = CONFIGS, /) -> tuple[Shape, ...]:
    """The MSMF reference shape, then every configuration's block GEMMs."""
    shapes = [Shape("reference", "forward", MSMF_REFERENCE)]
    for config in configs:
        shapes.extend(block_shapes(config))
    return tuple(shapes)


@dataclass(frozen=True)
class Prediction:
    """pipesim's time for one GEMM, with the accelerator's sustained cap and without."""

    capped_s: float
    uncapped_s: float

    @property
    def cap_binds(self) -> bool:
        """Whether the GEMM's burst rate is above the sustained cap."""
        return self.capped_s > self.uncapped_s * (1 + 1e-9)


def predict(gemm: Gemm, accelerator: Accelerator, /, *, fp8: bool) -> Prediction:
    free = replace(accelerator, sustained_matmul_flops=None, fp8_sustained_matmul_flops=None)
    return Prediction(
        capped_s=gemm_seconds(gemm, accelerator, dtype_bytes=2, fp8=fp8),
        uncapped_s=gemm_seconds(gemm, free, dtype_bytes=2, fp8=fp8),
    )


def _tflops(gemm: Gemm, seconds: float | None) -> str:
    return "-" if not seconds else f"{gemm.flops / seconds / 1e12:.0f}"


def dry_run(shapes: Sequence[Shape], accelerator: Accelerator) -> None:
    """Print every shape and pipesim's bf16 and FP8 time for it, capped and not."""
    print(f"{len(shapes)} GEMMs; pipesim's times on {accelerator.name} (us, TFLOP/s):")
    print("  shape | bf16 capped, uncapped | fp8 capped, uncapped | cap binds bf16/fp8")
    for s in shapes:
        b = predict(s.gemm, accelerator, fp8=False)
        f = predict(s.gemm, accelerator, fp8=True)
        print(
            f"  {s.label} | {b.capped_s * 1e6:.1f} ({_tflops(s.gemm, b.capped_s)}), "
            f"{b.uncapped_s * 1e6:.1f} ({_tflops(s.gemm, b.uncapped_s)}) | "
            f"{f.capped_s * 1e6:.1f} ({_tflops(s.gemm, f.capped_s)}), "
            f"{f.uncapped_s * 1e6:.1f} ({_tflops(s.gemm, f.uncapped_s)}) | "
            f"{'yes' if b.cap_binds else 'no'}/{'yes' if f.cap_binds else 'no'}"
        )


def cuda_problem() -> str | None:
    """Why this environment cannot measure (the message), or None when it can."""
    try:
        import torch
    except ImportError:
        return (
            f"{sys.executable} cannot import torch; run it with a Python that has a CUDA "
            "build of torch"
        )
    if torch.version.cuda is None:
        return f"torch {torch.__version__} is a CPU build; run it with a CUDA build of torch"
    if not torch.cuda.is_available() or torch.cuda.device_count() < 1:
        return "no CUDA GPU visible (torch.cuda.is_available() is False)"
    return None


# -- telemetry -------------------------------------------------------------------------

SMI_FIELDS = ("clocks.sm", "power.draw")
#: The active throttle reasons' field: renamed clocks_event_reasons in newer drivers.
SMI_REASONS = ("clocks_throttle_reasons.active", "clocks_event_reasons.active")


def _smi(fields: Sequence[str], index: int) -> list[str] | None:
    """One nvidia-smi reading of ``fields`` for GPU ``index``; None when it fails."""
    command = ["nvidia-smi", "-i", str(index), f"--query-gpu={','.join(fields)}"]
    try:
        done = subprocess.run(
            [*command, "--format=csv,noheader,nounits"],
            capture_output=True,
            text=True,
            timeout=5,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    if done.returncode != 0 or not done.stdout.strip():
        return None
    return [v.strip() for v in done.stdout.strip().splitlines()[0].split(",")]


def _number(text: str) -> float | None:
    try:
        return float(text)
    except ValueError:  # "[N/A]", "[Not Supported]"
        return None


class Sampler:
    """nvidia-smi's SM clock, power and throttle reasons every ``interval_s`` in a
    background thread; :meth:`window` summarizes the samples of a span of time."""

    def __init__(self, interval_s: float, index: int) -> None:
        self.interval_s, self.index = interval_s, index
        self.samples: list[tuple[float, float | None, float | None, str]] = []
        self.fields: tuple[str, ...] | None = None
        if shutil.which("nvidia-smi") is not None:
            for reasons in SMI_REASONS:
                if _smi((*SMI_FIELDS, reasons), index) is not None:
                    self.fields = (*SMI_FIELDS, reasons)
                    break
            else:
                self.fields = SMI_FIELDS if _smi(SMI_FIELDS, index) else None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def start(self) -> None:
        if self.fields is not None:
            self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=10)

    def _run(self) -> None:
        assert self.fields is not None
        while not self._stop.wait(self.interval_s):
            values = _smi(self.fields, self.index)
            if values is None or len(values) < 2:
                continue
            reasons = values[2] if len(values) > 2 else ""
            self.samples.append((time.monotonic(), _number(values[0]), _number(values[1]), reasons))

    def window(self, start: float, end: float) -> dict[str, Any] | None:
        """Median and range of the clock and power sampled in [start, end]; None
        without nvidia-smi."""
        if self.fields is None:
            return None
        inside = [s for s in list(self.samples) if start <= s[0] <= end]
        clocks = [s[1] for s in inside if s[1] is not None]
        power = [s[2] for s in inside if s[2] is not None]
        return {
            "samples": len(inside),
            "sm_clock_mhz": _spread(clocks),
            "power_w": _spread(power),
            "throttle_reasons": sorted({s[3] for s in inside if s[3]}),
        }


def _spread(values: list[float]) -> dict[str, float] | None:
    if not values:
        return None
    return {"median": statistics.median(values), "min": min(values), "max": max(values)}


# -- measuring -------------------------------------------------------------------------


@dataclass(frozen=True)
class Settings:
    idle_s: float
    iterations: int
    soak_s: float
    settle_s: float
    window_s: float
    deadline: float
    """time.monotonic() past which nothing new starts (``--budget-s``)."""

    def left(self) -> float:
        return self.deadline - time.monotonic()


def fast_accumulation(shape: Shape) -> bool:
    """Transformer Engine's FP8 GEMMs accumulate fast (one pass) in the forward and in
    two passes for the gradients (``_2X_ACC_FPROP = False``, ``_2X_ACC_DGRAD = True``,
    ``_2X_ACC_WGRAD = True`` in transformer_engine/pytorch/module/base.py)."""
    return shape.pass_name == "forward"


def gemm_runner(torch: Any, shape: Shape, dtype: str, copies: int) -> Callable[[int], None]:
    """A function running ``shape``'s GEMM on its ``i % copies``-th operands (random
    normal, as mamf-finder's ``torch.randn``): ``torch.mm`` / ``torch.bmm`` in bf16, or
    ``torch._scaled_mm`` of e4m3 operands (B column-major, as cuBLASLt's FP8 GEMMs take
    it) with unit scales and a bf16 output."""
    g, dev = shape.gemm, "cuda"
    if dtype == "fp8":
        e4m3 = torch.float8_e4m3fn
        pairs = [
            (
                torch.randn(g.m, g.k, device=dev).to(e4m3),
                torch.randn(g.n, g.k, device=dev).to(e4m3).t(),
            )
            for _ in range(copies)
        ]
        one = torch.ones((), device=dev, dtype=torch.float32)
        fast = fast_accumulation(shape)

        def run_fp8(i: int) -> None:
            a, b = pairs[i % copies]
            torch._scaled_mm(
                a, b, scale_a=one, scale_b=one, out_dtype=torch.bfloat16, use_fast_accum=fast
            )

        return run_fp8
    lead = (g.batch,) if g.batch > 1 else ()
    bf16 = torch.bfloat16
    pairs = [
        (
            torch.randn(*lead, g.m, g.k, device=dev, dtype=bf16),
            torch.randn(*lead, g.k, g.n, device=dev, dtype=bf16),
        )
        for _ in range(copies)
    ]
    out = torch.empty(*lead, g.m, g.n, device=dev, dtype=bf16)
    mm = torch.bmm if g.batch > 1 else torch.mm

    def run(i: int) -> None:
        a, b = pairs[i % copies]
        mm(a, b, out=out)

    return run


def l2_copies(torch: Any, gemm: Gemm, dtype: str) -> int:
    """Operand copies a sustained loop rotates over so that they overflow the L2 twice
    (at most 8)."""
    l2 = getattr(torch.cuda.get_device_properties(0), "L2_cache_size", 50 * 2**20)
    size = (gemm.m * gemm.k + gemm.k * gemm.n) * gemm.batch * (1 if dtype == "fp8" else 2)
    return max(1, min(8, math.ceil(2 * l2 / size)))


def burst(torch: Any, run: Callable[[int], None], s: Settings, flush: Any) -> dict[str, Any]:
    """One warm-up GEMM, ``idle_s`` idle, then ``iterations`` GEMMs each after an L2
    flush, each timed by CUDA events."""
    run(0)
    torch.cuda.synchronize()
    time.sleep(s.idle_s)
    events = [
        (torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
        for _ in range(s.iterations)
    ]
    start = time.monotonic()
    for i, (begin, end) in enumerate(events):
        flush.zero_()
        begin.record()
        run(i)
        end.record()
    torch.cuda.synchronize()
    times = sorted(b.elapsed_time(e) / 1e3 for b, e in events)
    return {
        "seconds": statistics.median(times),
        "min_s": times[0],
        "iterations": len(times),
        "span": (start, time.monotonic()),
    }


def keep_busy(torch: Any, step: Callable[[int], None], seconds: float) -> tuple[int, float]:
    """Call ``step`` back to back for ``seconds`` with no gap on the GPU (the CPU at most
    two chunks ahead); the calls made and the wall seconds they took."""
    calls, chunk, pending = 0, 8, None
    start = time.monotonic()
    while time.monotonic() - start < seconds:
        for _ in range(chunk):
            step(calls)
            calls += 1
        mark = torch.cuda.Event()
        mark.record()
        if pending is not None:
            pending.synchronize()
        pending = mark
    torch.cuda.synchronize()
    return calls, time.monotonic() - start


def sustained(
    torch: Any, run: Callable[[int], None], settle_s: float, window_s: float
) -> dict[str, Any]:
    """``run`` looped for ``settle_s``, then timed over about ``window_s`` (at least 10
    calls) with no gap between the settling and the window."""
    calls, wall = keep_busy(torch, run, settle_s)
    n = max(10, int(window_s / (wall / max(calls, 1))))
    begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start = time.monotonic()
    begin.record()
    for i in range(n):
        run(i)
    end.record()
    torch.cuda.synchronize()
    return {
        "seconds": begin.elapsed_time(end) / 1e3 / n,
        "iterations": n,
        "settle_s": wall,
        "span": (start, time.monotonic()),
    }


def mixed(torch: Any, runs: Sequence[Callable[[int], None]], s: Settings) -> dict[str, Any]:
    """The GEMMs ``runs`` in order, round after round, for ``soak_s``; then rounds timed
    GEMM by GEMM (an event between each) for about ``window_s``: each one's median."""

    def one_round(i: int) -> None:
        for run in runs:
            run(i)

    calls, wall = keep_busy(torch, one_round, s.soak_s)
    rounds = max(5, int(s.window_s / (wall / max(calls, 1))))
    marks = [
        [torch.cuda.Event(enable_timing=True) for _ in range(len(runs) + 1)] for _ in range(rounds)
    ]
    start = time.monotonic()
    for r, events in enumerate(marks):
        events[0].record()
        for run, event in zip(runs, events[1:], strict=True):
            run(r)
            event.record()
    torch.cuda.synchronize()
    each = [
        statistics.median(events[j].elapsed_time(events[j + 1]) / 1e3 for events in marks)
        for j in range(len(runs))
    ]
    rounds_s = statistics.median(e[0].elapsed_time(e[-1]) / 1e3 for e in marks)
    return {
        "seconds": each,
        "round_s": rounds_s,
        "rounds": rounds,
        "soak_s": wall,
        "span": (start, time.monotonic()),
    }


# -- the run ---------------------------------------------------------------------------


class Report:
    """What the run measured so far, rewritten to ``path`` (when given) after each step."""

    def __init__(self, path: Path | None, head: dict[str, Any], rows: list[dict[str, Any]]):
        self.path, self.head, self.rows = path, head, rows
        self.mixed: list[dict[str, Any]] = []
        self.errors: list[str] = []
        self.stopped: str | None = None

    def data(self) -> dict[str, Any]:
        return {
            **self.head,
            "gemms": self.rows,
            "mixed": self.mixed,
            "summary": {d: summary(self.rows, d) for d in self.head["dtypes"]},
            "errors": self.errors,
            "stopped": self.stopped,
        }

    def save(self) -> None:
        if self.path is not None:
            self.path.write_text(json.dumps(self.data(), indent=1) + "\n")


def gemm_rows(
    shapes: Sequence[Shape], accelerator: Accelerator, dtypes: Sequence[str]
) -> list[dict[str, Any]]:
    """One row per shape and precision (FP8 for the linear layers' GEMMs only), with
    pipesim's prediction and room for the measurements."""
    rows = []
    for i, s in enumerate(shapes):
        g = s.gemm
        for dtype in dtypes:
            if dtype == "fp8" and not (g.low_precision and g.batch == 1):
                continue
            p = predict(g, accelerator, fp8=dtype == "fp8")
            rows.append(
                {
                    "index": i, "label": s.label, "config": s.config, "pass": s.pass_name,
                    "gemm": g.name, "m": g.m, "n": g.n, "k": g.k, "batch": g.batch,
                    "flops": g.flops, "dtype": dtype, "predicted_s": p.capped_s,
                    "predicted_uncapped_s": p.uncapped_s, "cap_binds": p.cap_binds,
                    "burst": None, "sustained": None, "mixed_s": None,
                }
            )  # fmt: skip
    return rows


def _key(shape: Shape, dtype: str) -> tuple[object, ...]:
    g = shape.gemm
    return (g.m, g.n, g.k, g.batch, dtype, dtype == "fp8" and fast_accumulation(shape))


def _telemetry(result: dict[str, Any], sampler: Sampler) -> dict[str, Any]:
    """``result`` with its ``span`` replaced by the samples of it (widened by one sample
    interval each side, so a burst of milliseconds has its nearest samples)."""
    start, end = result.pop("span")
    pad = sampler.interval_s
    return {**result, "wall_s": end - start, "telemetry": sampler.window(start - pad, end + pad)}


def _log(row: dict[str, Any], what: str) -> None:
    got = row[what]["seconds"]
    print(
        f"  {what} {row['dtype']} {row['label']}: {got * 1e6:.1f} us "
        f"({row['flops'] / got / 1e12:.0f} TFLOP/s)",
        file=sys.stderr,
        flush=True,
    )


def _each_shape(
    shapes: Sequence[Shape], rows: list[dict[str, Any]], what: str, report: Report,
    measure: Callable[[Shape, str], dict[str, Any] | None],
) -> bool:  # fmt: skip
    """Sets ``row[what]`` on every row, measuring identical shapes once with ``measure``
    (None: out of budget, and this returns False)."""
    done: dict[tuple[object, ...], dict[str, Any]] = {}
    for row in rows:
        shape = shapes[row["index"]]
        key = _key(shape, row["dtype"])
        if key not in done:
            found = measure(shape, row["dtype"])
            if found is None:
                return False
            done[key] = found
        row[what] = done[key]
        _log(row, what)
        report.save()
    return True


def burst_phase(
    torch: Any, shapes: Sequence[Shape], rows: list[dict[str, Any]], s: Settings,
    sampler: Sampler, report: Report,
) -> bool:  # fmt: skip
    """Every row's burst (identical shapes measured once); False when out of budget."""
    flush = torch.empty(FLUSH_BYTES // 4, dtype=torch.int32, device="cuda")

    def measure(shape: Shape, dtype: str) -> dict[str, Any] | None:
        if s.left() < s.idle_s + 5:
            return None
        run = gemm_runner(torch, shape, dtype, 1)
        return _telemetry(burst(torch, run, s, flush), sampler)

    return _each_shape(shapes, rows, "burst", report, measure)


def sustained_phase(
    torch: Any, shapes: Sequence[Shape], rows: list[dict[str, Any]], s: Settings,
    sampler: Sampler, report: Report,
) -> bool:  # fmt: skip
    """Every row's sustained rate, the first soaked for ``soak_s``, the rest settled for
    ``settle_s`` with no idle gap; False when out of budget."""
    settles = [s.soak_s]

    def measure(shape: Shape, dtype: str) -> dict[str, Any] | None:
        settle = settles[-1]
        if s.left() < settle + s.window_s + 5:
            return None
        run = gemm_runner(torch, shape, dtype, l2_copies(torch, shape.gemm, dtype))
        settles.append(s.settle_s)
        return _telemetry(sustained(torch, run, settle, s.window_s), sampler)

    return _each_shape(shapes, rows, "sustained", report, measure)


def mixed_phase(
    torch: Any, shapes: Sequence[Shape], rows: list[dict[str, Any]], s: Settings,
    sampler: Sampler, report: Report,
) -> bool:  # fmt: skip
    """Each configuration's block GEMMs soaked together in layer order; False when out
    of budget."""
    for config in CONFIGS:
        mine = [r for r in rows if r["config"] == config.name]
        if not mine:
            continue
        if s.left() < s.soak_s + s.window_s + 10:
            return False
        dtype = mine[0]["dtype"]
        runs = [gemm_runner(torch, shapes[r["index"]], dtype, 1) for r in mine]
        result = _telemetry(mixed(torch, runs, s), sampler)
        for row, seconds in zip(mine, result.pop("seconds"), strict=True):
            row["mixed_s"] = seconds
        report.mixed.append({"config": config.name, "dtype": dtype, **result})
        print(
            f"  mixed {dtype} {config.name}: {len(runs)} GEMMs, "
            f"{result['round_s'] * 1e3:.2f} ms a round",
            file=sys.stderr,
            flush=True,
        )
        report.save()
    return True


def fp8_problem(torch: Any) -> str | None:
    """Why FP8 GEMMs cannot be measured here, or None."""
    if not hasattr(torch, "_scaled_mm") or not hasattr(torch, "float8_e4m3fn"):
        return f"torch {torch.__version__} has no torch._scaled_mm"
    if torch.cuda.get_device_capability(0) < (8, 9):
        return "compute capability below 8.9: no FP8 tensor cores"
    try:
        gemm_runner(torch, Shape("probe", "forward", Gemm("probe", 16, 16, 16)), "fp8", 1)(0)
        torch.cuda.synchronize()
    except Exception as error:  # any failure of the probe means: skip FP8
        return f"torch._scaled_mm failed: {error}"
    return None


def _measured(row: dict[str, Any], what: str) -> float | None:
    """A row's sustained time alone (``what`` "sustained") or within the mix ("mixed")."""
    if what == "sustained":
        return row["sustained"]["seconds"] if row["sustained"] else None
    value: float | None = row["mixed_s"]
    return value


def _ratios(rows: Sequence[dict[str, Any]], what: str, binds: bool) -> list[float]:
    """``what``'s time over the burst time, for the rows the cap binds (or not)."""
    out = []
    for r in rows:
        got = _measured(r, what)
        if r["cap_binds"] == binds and r["burst"] is not None and got:
            out.append(got / r["burst"]["seconds"])
    return out


def summary(rows: Sequence[dict[str, Any]], dtype: str) -> dict[str, Any]:
    """Median sustained / burst time of the GEMMs under the cap and over it, alone and
    within the mixed soak."""
    mine = [r for r in rows if r["dtype"] == dtype]
    out: dict[str, Any] = {}
    for what in ("sustained", "mixed"):
        for binds, side in ((False, "under_cap"), (True, "over_cap")):
            values = _ratios(mine, what, binds)
            out[f"{what}_{side}"] = {
                "median": statistics.median(values) if values else None,
                "n": len(values),
            }
    return out


def _median_text(entry: dict[str, Any]) -> str:
    return "-" if entry["median"] is None else f"{entry['median']:.3f}"


def summary_line(rows: Sequence[dict[str, Any]], dtype: str) -> str:
    """The median sustained / burst time of the GEMMs under the cap and over it, each
    looped alone and within the mixed soak."""
    s = summary(rows, dtype)
    parts = [
        f"{label}: under the cap {_median_text(s[f'{what}_under_cap'])} "
        f"(n={s[f'{what}_under_cap']['n']}), over it {_median_text(s[f'{what}_over_cap'])} "
        f"(n={s[f'{what}_over_cap']['n']})"
        for what, label in (("sustained", "alone"), ("mixed", "in the mix"))
    ]
    return f"summary {dtype}: median sustained/burst time; {parts[0]}; {parts[1]}"


def _clock(result: dict[str, Any] | None) -> str:
    t = result and result.get("telemetry")
    if not t or not t["sm_clock_mhz"]:
        return "-"
    power = f"/{t['power_w']['median']:.0f}W" if t["power_w"] else ""
    return f"{t['sm_clock_mhz']['median']:.0f}MHz{power}"


def _ratio(a: float | None, b: float | None) -> str:
    return "-" if not a or not b else f"{a / b:.3f}"


def print_table(rows: Sequence[dict[str, Any]]) -> None:
    """One line per row: predicted (uncapped), burst, sustained, mixed (us and TFLOP/s),
    the ratios, and the clock / power of burst and sustained."""
    print("shape dtype | predicted (uncapped) | burst | sustained | mixed | sust/burst "
          "mixed/burst predicted/sust | burst clock/power, sustained clock/power")  # fmt: skip
    for r in rows:
        burst_s = r["burst"]["seconds"] if r["burst"] else None
        sust_s = r["sustained"]["seconds"] if r["sustained"] else None
        mixed_s = r["mixed_s"]

        def us(x: float | None, flops: int = r["flops"]) -> str:
            return "-" if not x else f"{x * 1e6:.1f}us {flops / x / 1e12:.0f}TF"

        print(
            f"{r['label']} {r['dtype']}{' [cap]' if r['cap_binds'] else ''} | "
            f"{us(r['predicted_s'])} ({us(r['predicted_uncapped_s'])}) | {us(burst_s)} | "
            f"{us(sust_s)} | {us(mixed_s)} | {_ratio(sust_s, burst_s)} "
            f"{_ratio(mixed_s, burst_s)} {_ratio(r['predicted_s'], sust_s)} | "
            f"{_clock(r['burst'])}, {_clock(r['sustained'])}"
        )


def device_info(torch: Any, sampler: Sampler) -> dict[str, Any]:
    p = torch.cuda.get_device_properties(0)
    fields = ("name", "driver_version", "power.limit", "clocks.max.sm")
    smi = _smi(fields, sampler.index) if sampler.fields is not None else None
    return {
        "name": torch.cuda.get_device_name(0),
        "capability": list(torch.cuda.get_device_capability(0)),
        "sm_count": p.multi_processor_count,
        "l2_bytes": getattr(p, "L2_cache_size", None),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "nvidia_smi": dict(zip(fields, smi, strict=False)) if smi else None,
    }


def _smi_index() -> int:
    """nvidia-smi's index of cuda:0: CUDA_VISIBLE_DEVICES's first entry when a number."""
    import os

    first = os.environ.get("CUDA_VISIBLE_DEVICES", "0").split(",")[0].strip()
    return int(first) if first.isdigit() else 0


def measure(args: argparse.Namespace, accelerator: Accelerator, shapes: Sequence[Shape]) -> int:
    """Burst, sustained and mixed, bf16 then FP8, within the budget; 0, or 1 when a
    measurement failed."""
    import torch

    start = time.monotonic()
    s = Settings(
        args.idle_s, args.iterations, args.soak_s, args.settle_s, args.window_s,
        start + args.budget_s,
    )  # fmt: skip
    sampler = Sampler(args.sample_s, _smi_index())
    dtypes = ["bf16"]
    skipped = fp8_problem(torch) if not args.no_fp8 else "--no-fp8"
    if skipped is None:
        dtypes.append("fp8")
    head: dict[str, Any] = {
        "accelerator": accelerator.name,
        "device": device_info(torch, sampler),
        "settings": {k: v for k, v in vars(args).items() if k != "out"},
        "dtypes": dtypes,
        "fp8_skipped": skipped,
    }
    report = Report(args.out, head, gemm_rows(shapes, accelerator, dtypes))
    print(f"bench_gpu_rates: {head['device']['name']}, {dtypes}; fp8: {skipped or 'measured'}")
    sampler.start()
    try:
        for dtype in dtypes:
            rows = [r for r in report.rows if r["dtype"] == dtype]
            try:
                for phase in (burst_phase, sustained_phase, mixed_phase):
                    if not phase(torch, shapes, rows, s, sampler, report):
                        report.stopped = (
                            f"budget ({args.budget_s:g} s) reached in {dtype} {phase.__name__}"
                        )
                        break
            except Exception as error:  # recorded; the next precision still runs
                report.errors.append(f"{dtype}: {type(error).__name__}: {error}")
            if report.stopped:
                break
    finally:
        sampler.stop()
        report.save()
    print_table(report.rows)
    for failure in report.errors:
        print(f"error: {failure}")
    if report.stopped:
        print(f"stopped: {report.stopped}; the rows without measurements were not reached")
    for dtype in dtypes:
        print(summary_line(report.rows, dtype))
    print(f"took {time.monotonic() - start:.0f} s")
    return 1 if report.errors else 0


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    add = parser.add_argument
    add("--dry-run", action="store_true", help="print the shapes and predictions only (no GPU)")
    add("--accelerator", default="h100-sxm", help="pipesim preset to predict with")
    add("--out", type=Path, help="write the results as JSON to this file")
    add("--budget-s", type=float, default=480.0, help="start nothing new after this (s)")
    add("--soak-s", type=float, default=20.0, help="soak before the first sustained and each mix")
    add("--settle-s", type=float, default=1.5, help="loop before each later sustained window")
    add("--window-s", type=float, default=1.0, help="timed window of a sustained rate (s)")
    add("--idle-s", type=float, default=1.0, help="idle before each burst (s)")
    add("--iterations", type=int, default=50, help="timed GEMMs of a burst")
    add("--sample-s", type=float, default=0.25, help="nvidia-smi sampling interval (s)")
    add("--no-fp8", action="store_true", help="measure bf16 only")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    for name in ("budget_s", "soak_s", "settle_s", "window_s", "idle_s", "iterations", "sample_s"):
        value = getattr(args, name)
        if not value > 0 or not math.isfinite(value):
            parser.error(f"--{name.replace('_', '-')} must be a positive number, got {value}")
    try:
        accelerator = get_accelerator(args.accelerator)
    except Exception as unknown:  # UnknownNameError: its message lists the presets
        parser.error(str(unknown))
    shapes = all_shapes()
    if args.dry_run:
        dry_run(shapes, accelerator)
        return 0
    problem = cuda_problem()
    if problem is not None:
        print(f"bench_gpu_rates: FAIL {problem}", file=sys.stderr)
        return NO_GPU
    return measure(args, accelerator, shapes)


if __name__ == "__main__":
    sys.exit(main())
