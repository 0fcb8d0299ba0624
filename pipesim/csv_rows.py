"""Rows of torch.distributed.pipelining's schedule CSV: one rule for blank lines, shared
by the compute-only reader (:mod:`pipesim.schedule_io`) and the compute_comms reader
(:mod:`pipesim.comms`).

torch's ``_dump_csv`` writes one ``csv.writer`` row per rank, so a rank with no actions
is an empty row: a blank line. Its ``_load_csv`` reads every line as a rank, blank ones
included (``torch/distributed/pipelining/schedules.py``, torch 2.13). pipesim follows
it, so files round-trip with torch:

- a blank line *between* rows is a rank with no actions (an idle rank);
- blank lines at the *end* are dropped: ``"...\\n\\n"`` is an editor's extra newline, not
  an idle last rank (torch would refuse that file for having one rank too many);
- so a schedule whose last rank has no actions cannot be written as CSV (its blank
  last line would be dropped): :func:`check_last_row` refuses it, naming ``.json``.

>>> read_rows("0F0,0B0\\n\\n2F0,2B0\\n\\n\\n", source="s.csv")
[['0F0', '0B0'], [], ['2F0', '2B0']]
"""

from __future__ import annotations

import csv
import io
from collections.abc import Sequence

from pipesim.errors import ParseError, PipesimError
from pipesim.limits import MAX_RANKS, check_range

__all__ = ["check_last_row", "read_rows"]


def read_rows(text: str, /, *, source: str) -> list[list[str]]:
    """The CSV's rows, one per rank, trailing blank lines dropped; a row's number (from 1)
    is its line number when no cell spans lines. A leading byte-order mark is skipped."""
    rows: list[list[str]] = []
    kept = 0  # rows up to the last non-blank one
    reader = csv.reader(io.StringIO(text.removeprefix("\ufeff")))
    try:
        for row in reader:
            rows.append(row)
            if not _blank(row):
                kept = len(rows)
                check_range(
                    kept, name=f"{source}: rows (ranks)", maximum=MAX_RANKS, limit="MAX_RANKS"
                )
    except csv.Error as exc:  # a cell over csv's field size limit, a NUL byte, ...
        raise ParseError(f"{source}: not valid CSV at line {reader.line_num}: {exc}") from None
    if not kept:
        raise ParseError(f"{source}: the CSV is empty; write one row of actions per rank")
    return rows[:kept]


def check_last_row(rows: Sequence[Sequence[object]], /, *, name: str) -> None:
    """Refuse rows whose last one is empty: written as CSV it would be a trailing blank
    line, which :func:`read_rows` drops, so the file would lose that rank."""
    if rows and not rows[-1]:
        raise PipesimError(
            f"schedule {name!r}: its last rank ({len(rows) - 1}) runs no actions, which "
            "torch's CSV writes as a trailing blank line that readers drop; save it as .json"
        )


def _blank(row: list[str]) -> bool:
    # csv.reader gives [] for an empty line and [" "] for one of spaces; a row of commas
    # is a rank written with idle (None) steps, as torch writes them, so it is kept.
    return len(row) <= 1 and not "".join(row).strip()
