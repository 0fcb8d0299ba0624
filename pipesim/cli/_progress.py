"""A tqdm progress bar on stderr for the long verbs (``plan``, ``synthesize``).

Shown on a terminal, or anywhere when forced (``--progress``); never on stdout, so
what a command prints (a table, ``--json``) is the same with or without it. On a
terminal the bar clears when done; forced into a file or pipe, its last line stays.
"""

from __future__ import annotations

import sys
from typing import Any


class Progress:
    """``progress(done, total)`` callback drawing a bar, opened at the first call."""

    def __init__(self, *, enabled: bool, desc: str, unit: str) -> None:
        self.enabled = enabled
        self.desc = desc
        self.unit = unit
        self.bar: Any = None

    def __call__(self, done: int, total: int) -> None:
        if not self.enabled:
            return
        if self.bar is None:
            from tqdm import tqdm  # type: ignore[import-untyped]

            self.bar = tqdm(
                total=total,
                unit=self.unit,
                desc=self.desc,
                leave=not sys.stderr.isatty(),
                file=sys.stderr,
                mininterval=0.2,
                smoothing=0.1,
            )
        self.bar.update(done - self.bar.n)

    def close(self) -> None:
        """Close the bar (a terminal's clears); safe to call when none opened."""
        if self.bar is not None:
            self.bar.close()
            self.bar = None


def wanted(flag: bool | None) -> bool:
    """``--progress`` / ``--no-progress`` as given, else whether stderr is a terminal."""
    return sys.stderr.isatty() if flag is None else flag
