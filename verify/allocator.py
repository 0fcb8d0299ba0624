"""CPU ranks may keep the memory they free, as CUDA's caching allocator keeps GPU memory.

Why: torch allocates CPU tensors with the C library's ``malloc``. glibc's defaults give
freed memory back to the system: the heap's top is trimmed once more than
``M_TRIM_THRESHOLD`` is free, and chunks above a moving ``M_MMAP_THRESHOLD`` are
mapped and unmapped one by one, so the next allocation of that size faults in fresh
zeroed pages. How often that happens depends on how much a schedule keeps alive at
once, so an op's time stops being a property of the op (the same W twice as long inside
one schedule as after its own I: ``docs/results/allocator.md``). On a GPU the caching
allocator already keeps freed blocks; ``retain`` makes pipesim's CPU
rank processes do the same, so that an action's cost is its own, which is what a cost
model calibrated on one schedule and used for another assumes.

It is the default because a paired A/B of the whole fidelity benchmark (``python
benchmarks/bench_fidelity.py --allocators system,retain``) measured a smaller run-to-run
spread and prediction error under it, and steps no slower (``docs/results/allocator.md``).
``PIPESIM_CPU_ALLOCATOR=system`` keeps glibc's behaviour.

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

__all__ = [
    "ALLOCATOR_ENV",
    "ALLOCATOR_MODES",
    "DEFAULT_ALLOCATOR_MODE",
    "allocator_mode",
    "configure_allocator",
    "minor_page_faults",
]

ALLOCATOR_ENV = "PIPESIM_CPU_ALLOCATOR"
ALLOCATOR_MODES = ("retain", "system")
DEFAULT_ALLOCATOR_MODE = "retain"

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
    """``retain`` (the default) or ``system``, from ``$PIPESIM_CPU_ALLOCATOR``.

    >>> import os
    >>> os.environ.pop(ALLOCATOR_ENV, None) and None
    >>> allocator_mode()
    'retain'
    """
    default = DEFAULT_ALLOCATOR_MODE
    mode = os.environ.get(ALLOCATOR_ENV, default).strip().lower() or default
    if mode not in ALLOCATOR_MODES:
        raise VerifyError(
            f"{ALLOCATOR_ENV}={os.environ[ALLOCATOR_ENV]!r} is not a CPU allocator mode; "
            f"use one of {', '.join(ALLOCATOR_MODES)} (or leave it unset for {default})"
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


def minor_page_faults() -> int | None:
    """Minor page faults of this process so far: first touches of memory pages, which the
    kernel zeroes inside whatever op touches them (what ``retain`` avoids, and what a step
    that still grows its memory pays); None where the platform has no ``resource`` module
    (Windows)."""
    try:
        import resource
    except ImportError:
        return None
    return int(resource.getrusage(resource.RUSAGE_SELF).ru_minflt)
