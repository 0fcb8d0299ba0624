"""Set-ups that several test modules share (imported as ``helpers``: pytest puts tests/
on the path of the modules it collects here)."""

from __future__ import annotations

import doctest
import importlib
import importlib.util
import os
import shutil
import signal
import subprocess
import sys
import time
from itertools import accumulate, combinations, pairwise
from pathlib import Path
from types import ModuleType

import pytest

from pipesim.errors import ScheduleError
from pipesim.plan.hardware import EFFICIENCIES, Accelerator, get_accelerator
from pipesim.plan.model import ModelSpec
from pipesim.plan.sweep import Evaluation, Point, SweepContext, evaluate_points
from pipesim.plan.workload import Workload, workload_from_model
from pipesim.schedules import generate, get_spec, schedule_names

#: The keys ``simulate --json`` promises (the output contract of docs/architecture.md).
JSON_CONTRACT = frozenset(
    {
        "schedule",
        "n_ranks",
        "n_stages",
        "n_microbatches",
        "makespan",
        "bubble_ratio",
        "idle_slots",
        "ranks",
    }
)
#: The keys of each entry of its ``ranks``.
RANK_CONTRACT = frozenset({"rank", "busy", "idle", "peak_activation_bytes", "peak_inflight"})

#: Free links: zero latency and a bandwidth so high that every message rounds to 0 ns; free
#: memory traffic and every GEMM at peak, so a layer takes exactly its FLOPs / peak_flops.
FREE_ACCELERATOR = Accelerator(
    name="ideal",
    peak_flops=1e15,
    memory_bytes=10**12,
    gpus_per_node=64,
    intra_node_latency=0.0,
    intra_node_bandwidth=1e30,
    inter_node_latency=0.0,
    inter_node_bandwidth=1e30,
    memory_bandwidth=1e30,
    **dict.fromkeys(EFFICIENCIES, 1.0),
)


def hand_accelerator(**changes: object) -> Accelerator:
    """An accelerator of round numbers for hand-worked cases: 1e15 FLOP/s, 1 GB/s links
    with 1 us latency, 3 GB/s memory, 8 GPUs a node, every measured share 1."""
    base: dict[str, object] = dict(
        name="hand",
        peak_flops=1e15,
        memory_bytes=10**12,
        gpus_per_node=8,
        intra_node_latency=1e-6,
        intra_node_bandwidth=1e9,
        inter_node_latency=1e-6,
        inter_node_bandwidth=1e9,
        memory_bandwidth=3e9,
        **dict.fromkeys(EFFICIENCIES, 1.0),
    )
    return Accelerator(**(base | changes))  # type: ignore[arg-type]


#: The small GPT the planner tests sweep (8 layers of 512).
SMALL_MODEL = ModelSpec(n_layers=8, hidden=512, n_heads=8, seq_length=512, vocab_size=2000)

#: A Llama-shaped block small enough to work by hand: h = 64, 8 heads of 8, 2 KV heads
#: (kv width 16), SwiGLU of 160, s = 128 (T = 128 tokens), no biases, rotary positions,
#: no dropout, fused attention.
TINY_LLAMA = ModelSpec(
    n_layers=2,
    hidden=64,
    n_heads=8,
    n_kv_heads=2,
    ffn_hidden=160,
    seq_length=128,
    vocab_size=256,
    gated_mlp=True,
    bias=False,
    learned_positions=False,
    dropout=False,
    flash_attention=True,
)


def one_f_one_b_sweep(
    max_microbatches: int, *, engine: str = "fast"
) -> tuple[SweepContext, list[Point]]:
    """SMALL_MODEL on 2 devices with free links, 1f1b at p=2 with 1..max_microbatches-1
    micro-batches; the SimPy engine makes each point slow enough to catch a sweep in
    flight."""
    context = SweepContext(
        workload=workload_from_model(SMALL_MODEL),
        accelerator=FREE_ACCELERATOR,
        devices=2,
        memory_capacity_bytes=10**12,
        engine=engine,
    )
    points = [
        Point(
            schedule="1f1b",
            pipeline=2,
            virtual=1,
            microbatch_size=1,
            n_microbatches=m,
            data_parallel=1,
        )
        for m in range(1, max_microbatches)
    ]
    return context, points


BENCHMARKS = Path(__file__).parent.parent / "benchmarks"


def load_benchmark(name: str, /) -> ModuleType:
    """``benchmarks/NAME.py`` imported as a module (benchmarks are scripts, not a package)."""
    spec = importlib.util.spec_from_file_location(name, BENCHMARKS / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    # registered first: dataclasses look their module up in sys.modules while defined
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def run_doctests(name: str, /) -> None:
    """Run the docstring examples of module ``name``; fail naming how many failed."""
    module = importlib.import_module(name)
    finder = doctest.DocTestFinder(exclude_empty=True)
    runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
    for test in finder.find(module, name):
        runner.run(test)
    result = runner.summarize(verbose=False)
    assert result.failed == 0, f"{result.failed} of {result.attempted} examples in {name} failed"


def all_cuts(n: int, n_stages: int) -> list[tuple[int, ...]]:
    """Every way to cut ``n`` layers into ``n_stages`` non-empty runs, as layer counts:
    the brute-force oracle of the partitioner."""
    return [
        tuple(b - a for a, b in pairwise((0, *cuts, n)))
        for cuts in combinations(range(1, n), n_stages - 1)
    ]


def best_bottleneck(costs: list[float], n_stages: int) -> float:
    """The least slowest-stage cost over :func:`all_cuts` of ``costs``."""
    return min(
        max(sum(costs[a:b]) for a, b in pairwise((0, *accumulate(sizes))))
        for sizes in all_cuts(len(costs), n_stages)
    )


def browser_path() -> str:
    """The browser the browser tests open pages in: ``BROWSER_PATH`` when set (the
    variable kaleido reads too; CI points it at the runner's Google Chrome), else
    Debian's chromium on the PATH. A missing browser fails the test, never skips it."""
    given = os.environ.get("BROWSER_PATH")
    if given:
        if os.path.isfile(given) and os.access(given, os.X_OK):
            return given
        pytest.fail(
            f"BROWSER_PATH={given!r} is not an executable file; point it at a Chrome or "
            "Chromium binary, or unset it to use chromium from the PATH"
        )
    for name in ("chromium", "chromium-browser"):
        path = shutil.which(name)
        if path:
            return path
    pytest.fail(
        "chromium is not installed; the browser tests need it: run `make browser-deps` "
        "(apt-get install -y chromium, as root), install Debian's chromium package, or set "
        "BROWSER_PATH to a Chrome binary"
    )


def schedule_cases(
    sizes: tuple[tuple[int, int], ...], /, *, every_virtual: bool = True
) -> list[tuple[str, int, int, int]]:
    """``(name, p, m, v)`` for every registered schedule at each ``(p, m)`` of ``sizes``
    whose rules it accepts: ``v`` over the family's virtual values (or its first only),
    2 for a family that takes none (its generator ignores it)."""
    found = []
    for name in schedule_names():
        virtual_values = get_spec(name).virtual_values or (2,)
        for p, m in sizes:
            for v in virtual_values if every_virtual else virtual_values[:1]:
                try:
                    generate(name, n_ranks=p, n_microbatches=m, virtual=v)
                except ScheduleError:
                    continue  # this size breaks the family's rules
                found.append((name, p, m, v))
    return found


def one_point(
    workload: Workload,
    /,
    *,
    pipeline: int,
    schedule: str = "1f1b",
    virtual: int = 1,
    microbatch_size: int = 1,
    n_microbatches: int | None = None,
    data_parallel: int = 1,
    accelerator: Accelerator | None = None,
    memory_capacity_bytes: int = 10**12,
) -> tuple[SweepContext, Point]:
    """The planner's sweep reduced to one configuration: ``workload`` on
    ``pipeline * data_parallel`` devices (default an h100-sxm each, a capacity nothing
    exceeds), ``n_microbatches`` defaulting to ``pipeline``."""
    context = SweepContext(
        workload=workload,
        devices=pipeline * data_parallel,
        accelerator=accelerator if accelerator is not None else get_accelerator("h100-sxm"),
        memory_capacity_bytes=memory_capacity_bytes,
    )
    point = Point(
        schedule=schedule,
        pipeline=pipeline,
        virtual=virtual,
        microbatch_size=microbatch_size,
        n_microbatches=pipeline if n_microbatches is None else n_microbatches,
        data_parallel=data_parallel,
    )
    return context, point


def evaluate_one_point(workload: Workload, /, **kwargs: object) -> Evaluation:
    """:func:`one_point` evaluated in this process."""
    context, point = one_point(workload, **kwargs)  # type: ignore[arg-type]
    (evaluation,) = evaluate_points(context, [point], workers=1)
    return evaluation


def processes_with(marker: str) -> list[int]:
    """The processes whose environment holds ``marker``: those a test started (a launcher
    and its workers), found in /proc so that a leftover is seen whoever its parent is."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if marker.encode() in (entry / "environ").read_bytes():
                    found.append(int(entry.name))
            except OSError:
                continue
    return found


def sigterm_once_ranks_joined(
    launcher: subprocess.Popen[bytes], logs: str, tmp: Path, marker: str
) -> tuple[int, bytes]:
    """Wait (90 s at most) until two rank logs match the glob ``logs`` under ``tmp`` and
    the launcher and both ranks run, then SIGTERM the launcher; its exit status and
    stderr. The launcher is killed if it outlives the call."""
    try:
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline:  # both ranks have joined (each writes its log)
            if len(list(tmp.glob(logs))) == 2 and len(processes_with(marker)) >= 3:
                break
            time.sleep(0.2)
        else:
            pytest.fail("the ranks did not start within 90 s")
        launcher.send_signal(signal.SIGTERM)
        status = launcher.wait(timeout=30)
    finally:
        if launcher.poll() is None:
            launcher.kill()
    return status, launcher.stderr.read() if launcher.stderr else b""


def interruptible() -> None:
    """``preexec_fn`` of a child a test will Ctrl-C: SIGINT back to its default action.

    A shell script's background job (``make test &``) starts with SIGINT ignored, every
    child inherits that, and Python then installs no KeyboardInterrupt handler, so the
    child would not hear the test's Ctrl-C at all. A terminal's foreground job, which
    the test stands for, has the default."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)
