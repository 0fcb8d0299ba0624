"""CPU ranks may keep the memory they free, as CUDA's caching allocator keeps GPU memory.

Why: torch allocates CPU tensors with the C library's ``malloc``. glibc's defaults give
freed memory back to the system: the heap's top is trimmed once more than
``M_TRIM_THRESHOLD`` is free, and chunks above a moving ``M_MMAP_THRESHOLD`` are
mapped and unmapped one by one, so the next allocation of that size faults in fresh
zeroed pages. How often that happens depends on how much a schedule keeps alive at
once, so an op's time stops being a property of the op: measured with ``pipesim verify
--dist`` on a 6-block x 512 GPT (2 ranks, one intra-op thread each), the last stage's W
took 80-135 ms inside zb-h1 at m=16 but 38-50 ms right after its own I, and a V
schedule's W on the middle stage 56-62 ms against 31 calibrated. ``python
benchmarks/bench_allocator.py`` (2 repeats, load 0.1-1.3) measured steps 10% (zb-h1 m=16)
and 8% (v-half m=16) shorter with freed memory kept, and each stage's W median within
a narrower range across runs (zb-h1 stage 0: 66.9-66.9 ms kept, 71.6-83.7 ms system).
On a GPU the caching allocator already keeps freed blocks; ``retain`` makes pipesim's CPU
rank processes do the same, so that an action's cost is its own, which is what a cost
model calibrated on one schedule and used for another assumes.

It is not the default yet: in ``benchmarks/bench_fidelity.py``, whose rank processes
run 33 schedules one after another, zb-h1 and the V schedules at m=16 on the 6x256 GPT
measured 20-38% *slower* under ``retain`` (zb-h1 879 ms, zbv 1052 ms) than under glibc's
defaults the day before (639 ms, 807 ms), while alone in fresh processes they ran 9-11%
faster (579 against 648 ms, 747 against 823 ms); a smaller ``bench_fidelity.py`` run
(6x256, 1f1b / zb-h1 / zbv / v-half at m=16, 6 schedules a process) then measured
``retain`` faster on all four (537, 588, 796, 999 ms against 580, 662, 1123, 1087).
Run-to-run spread on the shared 2-core machine (13-29% there) is as large as the
effect, so until a quiet A/B of the whole benchmark settles it
``PIPESIM_CPU_ALLOCATOR=retain`` opts in and ``system`` (the default) keeps glibc's
behaviour.

Only glibc has ``mallopt``; elsewhere (macOS, musl) the setting is reported as
unavailable and nothing changes. The settings apply to the calling process from then
on; pipesim calls :func:`configure_allocator` in the rank processes it starts and in
those torchrun starts, never in a notebook's own process.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os

from verify.errors import VerifyError

__all__ = ["ALLOCATOR_ENV", "ALLOCATOR_MODES", "allocator_mode", "configure_allocator"]

ALLOCATOR_ENV = "PIPESIM_CPU_ALLOCATOR"
ALLOCATOR_MODES = ("retain", "system")

# mallopt parameters (glibc's malloc.h) and the values pipesim sets.
_M_TRIM_THRESHOLD, _M_TOP_PAD, _M_MMAP_THRESHOLD = -1, -2, -3
_SETTINGS = (
    # Never trim the heap (mallopt takes an int: the largest value it can say).
    (_M_TRIM_THRESHOLD, 2**31 - 1),
    # Grow the heap 64 MiB at a time: fewer brk calls while a step's memory builds up.
    (_M_TOP_PAD, 64 << 20),
    # Serve chunks up to 32 MiB (glibc's largest allowed threshold on 64-bit) from the
    # heap, not from mmap; setting it also stops glibc from moving the threshold.
    (_M_MMAP_THRESHOLD, 32 << 20),
)


def allocator_mode() -> str:
    """``system`` (the default) or ``retain``, from ``$PIPESIM_CPU_ALLOCATOR``.

    >>> import os
    >>> os.environ.pop(ALLOCATOR_ENV, None) and None
    >>> allocator_mode()
    'system'
    """
    mode = os.environ.get(ALLOCATOR_ENV, "system").strip().lower() or "system"
    if mode not in ALLOCATOR_MODES:
        raise VerifyError(
            f"{ALLOCATOR_ENV}={os.environ[ALLOCATOR_ENV]!r} is not a CPU allocator mode; "
            f"use one of {', '.join(ALLOCATOR_MODES)} (or leave it unset for system)"
        )
    return mode


def configure_allocator(*, apply: bool = True) -> str:
    """Apply :func:`allocator_mode` to this process (with ``apply=False`` only say what
    applying it would give); say what is in force, for reports: ``retain``, ``system``,
    ``system (mallopt unavailable: ...)`` or ``partly retain (mallopt refused ...)``."""
    if allocator_mode() == "system":
        return "system"
    libc = _glibc()
    if libc is None:
        return "system (mallopt unavailable: not glibc)"
    if not apply:
        return "retain"
    for param, value in _SETTINGS:
        if libc.mallopt(ctypes.c_int(param), ctypes.c_int(value)) != 1:
            return f"partly retain (mallopt refused parameter {param} = {value})"
    return "retain"


def _glibc() -> ctypes.CDLL | None:
    name = ctypes.util.find_library("c")
    if name is None:
        return None
    try:
        libc = ctypes.CDLL(name)
        libc.gnu_get_libc_version  # noqa: B018 - only glibc has it
    except (OSError, AttributeError):
        return None
    return libc
