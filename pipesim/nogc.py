"""Pause Python's cyclic garbage collector around bulk allocation of acyclic objects.

Building a schedule, its compiled step and its trace allocates several objects per
action and no reference cycles; with the collector on, every few hundred
allocations it rescans the ever larger young generations, which costs 20-40 % of a
large ``generate`` + ``simulate``. Reference counting still frees everything; any
cycle made meanwhile is collected once the collector runs again.

>>> import gc
>>> with paused_gc():
...     gc.isenabled()
False
>>> gc.isenabled()
True
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager

__all__ = ["paused_gc", "sparse_gc"]


@contextmanager
def paused_gc() -> Iterator[None]:
    """Disable the cyclic collector inside the block; restore its previous state after."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


SPARSE_THRESHOLDS = (100_000, 100, 1000)
"""Allocations between young collections, and young (then middle) collections between
older ones, inside :func:`sparse_gc` (CPython's defaults: 700, 10, 10)."""


@contextmanager
def sparse_gc() -> Iterator[None]:
    """Collect cycles rarely inside the block, restore the thresholds after.

    A planner sweep keeps many schedules in its caches while it builds and drops others:
    at the default thresholds the collector rescans the cached objects again and again
    (about a third of a sweep's CPU time). Unlike :func:`paused_gc` it still collects, so
    a long block does not grow without bound.

    >>> before = gc.get_threshold()
    >>> with sparse_gc():
    ...     gc.get_threshold() == SPARSE_THRESHOLDS
    True
    >>> gc.get_threshold() == before
    True
    """
    before = gc.get_threshold()
    gc.set_threshold(*(max(a, b) for a, b in zip(before, SPARSE_THRESHOLDS, strict=True)))
    try:
        yield
    finally:
        gc.set_threshold(*before)
