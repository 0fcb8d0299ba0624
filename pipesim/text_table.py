"""Right-aligned plain-text tables for the CLI and the cycle grid.

>>> print(format_table(["rank", "busy"], [["0", "24"], ["1", "3"]]))
rank  busy
   0    24
   1     3
"""

from __future__ import annotations

from collections.abc import Sequence

__all__ = ["format_table"]


def format_table(headers: Sequence[str], rows: Sequence[Sequence[str]], /) -> str:
    """Columns right-aligned to their widest cell, two spaces apart."""
    widths = [max(len(cell) for cell in column) for column in zip(headers, *rows, strict=True)]
    lines = ["  ".join(h.rjust(w) for h, w in zip(headers, widths, strict=True))]
    lines += ["  ".join(c.rjust(w) for c, w in zip(row, widths, strict=True)) for row in rows]
    return "\n".join(lines)
