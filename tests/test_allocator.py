"""verify.allocator: the CPU allocator mode from the environment, and mallopt applied."""

from __future__ import annotations

import subprocess
import sys

import pytest

pytest.importorskip("torch")

from verify.allocator import (
    ALLOCATOR_ENV,
    DEFAULT_ALLOCATOR_MODE,
    allocator_mode,
    configure_allocator,
)
from verify.errors import VerifyError


def test_mode_defaults_to_retain_and_reads_system(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(ALLOCATOR_ENV, raising=False)
    assert allocator_mode() == DEFAULT_ALLOCATOR_MODE == "retain"
    # apply=False: say what applying would give without changing pytest's own malloc
    assert configure_allocator(apply=False) in ("retain", "system (mallopt unavailable: not glibc)")
    monkeypatch.setenv(ALLOCATOR_ENV, " System ")
    assert allocator_mode() == "system"
    assert configure_allocator() == "system"  # nothing to apply
    monkeypatch.setenv(ALLOCATOR_ENV, "")
    assert allocator_mode() == "retain"  # empty is unset


def test_a_distributed_run_refuses_an_unknown_mode_before_starting_ranks(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from pipesim.cli import main

    monkeypatch.setenv(ALLOCATOR_ENV, "jemalloc")
    assert main(["verify", "1f1b", "-p", "2", "-m", "2", "--dist", "--timeout", "60"]) == 2
    err = capsys.readouterr().err
    # once, from the launcher: no rank started to fail with it
    assert err.count("PIPESIM_CPU_ALLOCATOR='jemalloc'") == 1 and "rank 0" not in err


def test_unknown_mode_is_refused_naming_the_value(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(ALLOCATOR_ENV, "jemalloc")
    with pytest.raises(VerifyError, match=r"PIPESIM_CPU_ALLOCATOR='jemalloc'.*retain, system"):
        allocator_mode()


@pytest.mark.slow
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's mallopt")
def test_retain_keeps_freed_memory_in_a_fresh_process() -> None:
    # Oracle: the process's resident memory. With glibc's defaults freeing a 16 MiB
    # buffer hands it back (mmap'd chunk unmapped); with retain it stays resident.
    code = (
        "import ctypes, os, sys\n"
        "from verify.allocator import configure_allocator\n"
        "mode = sys.argv[1]\n"
        "os.environ['PIPESIM_CPU_ALLOCATOR'] = mode\n"
        "said = configure_allocator()\n"
        "libc = ctypes.CDLL(None)\n"
        "libc.malloc.restype = ctypes.c_void_p\n"
        "def rss():\n"
        "    return int(open('/proc/self/statm').read().split()[1]) * os.sysconf('SC_PAGE_SIZE')\n"
        "n = 16 << 20\n"
        "p = libc.malloc(n); ctypes.memset(p, 1, n)\n"
        "before = rss(); libc.free(ctypes.c_void_p(p)); after = rss()\n"
        "print(said, before - after)\n"
    )
    out = {}
    for mode in ("system", "retain"):
        run = subprocess.run(
            [sys.executable, "-c", code, mode], capture_output=True, text=True, check=True
        )
        said, released = run.stdout.split()
        out[mode] = (said, int(released))
    assert out["system"] == ("system", out["system"][1])
    assert out["system"][1] >= 15 << 20  # glibc unmapped the 16 MiB chunk
    assert out["retain"][0] == "retain"
    assert out["retain"][1] < 1 << 20  # kept: nothing handed back
