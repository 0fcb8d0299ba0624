"""SIGTERM as a clean exit: inside the block it raises ``SystemExit(143)``, so ``finally``
blocks and context managers run (temporary files and folders are removed, child processes
are stopped) instead of the process dying on the spot.

Only in the main thread (where Python's signal handlers live) and only where nobody else
handles SIGTERM already (a handler the caller installed is theirs to keep).

>>> import signal
>>> with exit_on_sigterm():
...     signal.getsignal(signal.SIGTERM) is signal.SIG_DFL
False
>>> signal.getsignal(signal.SIGTERM) is signal.SIG_DFL
True
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager

__all__ = ["exit_on_sigterm"]


@contextmanager
def exit_on_sigterm() -> Iterator[None]:
    """Turn SIGTERM into ``SystemExit(128 + SIGTERM)`` inside the block; restore after."""
    if (
        threading.current_thread() is not threading.main_thread()
        or signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL
    ):
        yield
        return

    def terminate(signum: int, frame: object) -> None:
        raise SystemExit(128 + signum)

    signal.signal(signal.SIGTERM, terminate)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
