"""Load and save schedules: pipesim JSON and torch.distributed.pipelining CSV.

JSON (``.json``) carries everything a :class:`~pipesim.schedule.Schedule` holds::

    {"format": "pipesim-schedule", "version": 1, "name": "1f1b",
     "n_microbatches": 4, "placement": [0, 1],
     "ranks": [["0F0", "0F1", "0B0", ...], ["1F0", "1B0", ...]],
     "happens_before": [["1F0", "0F1"]]}

CSV (``.csv``) is the "compute_only" format torch's
``PipelineScheduleMulti._load_csv`` reads: one row per rank, one action per
cell, empty cells for idle steps (skipped). A blank line between rows is a rank with
no actions, as torch writes and reads it; blank lines at the end of the file are
dropped (see :mod:`pipesim.csv_rows`). The placement is inferred from
which rank runs each stage, as torch does. CSV cannot carry
``happens_before`` constraints, so saving such a schedule to CSV is refused.

>>> from pipesim.schedules import generate
>>> s = generate("1f1b", n_ranks=2, n_microbatches=3)
>>> schedule_from_csv(schedule_to_csv(s), name="1f1b") == s
True
"""

from __future__ import annotations

import csv
import io
import json
from pathlib import Path
from typing import Any

from pipesim.actions import Action, Work, parse_action
from pipesim.csv_rows import check_last_row, read_rows
from pipesim.errors import ParseError, PipesimError, brief
from pipesim.files import parse_json, read_text, write_text
from pipesim.limits import MAX_RANKS, check_range
from pipesim.schedule import Schedule
from pipesim.suggest import did_you_mean

__all__ = [
    "load_schedule",
    "save_schedule",
    "schedule_from_csv",
    "schedule_from_dict",
    "schedule_from_json",
    "schedule_to_csv",
    "schedule_to_dict",
    "schedule_to_json",
]

_FORMAT = "pipesim-schedule"
# The keys of a schedule file, as schedule_to_dict writes them.
_KEYS = (
    "format",
    "version",
    "name",
    "n_ranks",
    "n_stages",
    "n_microbatches",
    "placement",
    "ranks",
    "happens_before",
    "n_copies",
)


def schedule_to_dict(schedule: Schedule, /) -> dict[str, Any]:
    """The JSON-ready dictionary of ``schedule``."""
    data: dict[str, Any] = {
        "format": _FORMAT,
        "version": 1,
        "name": schedule.name,
        "n_ranks": schedule.n_ranks,
        "n_stages": schedule.n_stages,
        "n_microbatches": schedule.n_microbatches,
        "placement": list(schedule.placement),
        "ranks": [[str(w) for w in order] for order in schedule.orders],
    }
    if schedule.happens_before:
        data["happens_before"] = [[str(a), str(b)] for a, b in schedule.happens_before]
    if schedule.n_copies != 1:
        data["n_copies"] = schedule.n_copies
    return data


def schedule_to_json(schedule: Schedule, /) -> str:
    """``schedule`` as pipesim JSON text (one rank's order per line)."""
    return json.dumps(schedule_to_dict(schedule), indent=1) + "\n"


def schedule_from_dict(data: object, /, *, source: str = "schedule") -> Schedule:
    """Build a schedule from the dictionary form; ParseError names what is wrong and where.

    >>> schedule_from_dict({"ranks": [["0F0", "0B0"]], "happens_before": 5})
    Traceback (most recent call last):
    ...
    pipesim.errors.ParseError: schedule: 'happens_before' must be a list of [before, after] \
pairs of action strings, got 5
    """
    if not isinstance(data, dict):
        raise ParseError(f"{source}: expected a JSON object, got {type(data).__name__}")
    if data.get("format", _FORMAT) != _FORMAT:
        raise ParseError(f"{source}: 'format' is {brief(data['format'])}, expected {_FORMAT!r}")
    unknown = sorted(str(key) for key in data if key not in _KEYS)
    if unknown:  # a misspelt key would otherwise be a setting silently not applied
        raise ParseError(
            f"{source}: unknown keys {brief(unknown)}{did_you_mean(unknown[0], _KEYS)}; valid "
            f"keys are {list(_KEYS)}"
        )
    if data.get("version", 1) != 1:
        raise ParseError(
            f"{source}: schedule format version {brief(data['version'])}, but this pipesim "
            "reads version 1; write it again with this pipesim, or upgrade pipesim"
        )
    ranks = data.get("ranks")
    if not isinstance(ranks, list) or not all(isinstance(r, list) for r in ranks):
        raise ParseError(
            f"{source}: 'ranks' must be a list with one list of action strings per rank, "
            f"got {brief(ranks)}"
        )
    check_range(len(ranks), name=f"{source}: ranks", maximum=MAX_RANKS, limit="MAX_RANKS")
    orders = []
    for rank, row in enumerate(ranks):
        order = []
        for position, text in enumerate(row):
            try:
                order.append(parse_action(text))
            except PipesimError as exc:
                raise type(exc)(f"{source}: rank {rank}, position {position}: {exc}") from None
        orders.append(order)
    placement = data.get("placement")
    if placement is not None and not isinstance(placement, list):
        raise ParseError(
            f"{source}: 'placement' must be a list with the rank of each stage, got "
            f"{brief(placement)}"
        )
    name = data.get("name", "custom")
    if not isinstance(name, str):
        raise ParseError(f"{source}: 'name' must be a string, got {brief(name)}")
    happens_before = _happens_before(data.get("happens_before", []), source)
    try:
        schedule = Schedule.from_orders(
            orders,
            placement=placement,
            n_microbatches=data.get("n_microbatches"),
            name=name,
            happens_before=happens_before,
            n_copies=data.get("n_copies", 1),
        )
    except PipesimError as exc:
        raise type(exc)(f"{source}: {exc}") from None
    # The counts the ranks and placement decide, stated again by the file: they must agree.
    for key, actual in (("n_ranks", schedule.n_ranks), ("n_stages", schedule.n_stages)):
        if key in data and data[key] != actual:
            raise ParseError(
                f"{source}: {key!r} is {brief(data[key])}, but its ranks and placement make "
                f"{actual}; fix or drop {key!r}"
            )
    return schedule


def _happens_before(pairs: object, source: str) -> list[tuple[Action, Action]]:
    if not isinstance(pairs, list):
        raise ParseError(
            f"{source}: 'happens_before' must be a list of [before, after] pairs of action "
            f"strings, got {brief(pairs)}"
        )
    result: list[tuple[Action, Action]] = []
    for index, pair in enumerate(pairs):
        where = f"{source}: happens_before entry {index}"
        if not (isinstance(pair, list) and len(pair) == 2):
            raise ParseError(
                f"{where}: each happens_before entry is [before, after], got {brief(pair)}"
            )
        try:
            a, b = (parse_action(x) for x in pair)
        except PipesimError as exc:
            raise type(exc)(f"{where}: {exc}") from None
        if not (isinstance(a, Action) and isinstance(b, Action)):
            raise ParseError(f"{where}: happens_before takes simple actions, got {brief(pair)}")
        result.append((a, b))
    return result


def schedule_from_json(text: str, /, *, source: str = "schedule") -> Schedule:
    """Parse pipesim JSON text; a syntax error names the line and column."""
    return schedule_from_dict(parse_json(text, source=source), source=source)


def schedule_to_csv(schedule: Schedule, /) -> str:
    """``schedule`` in torch's compute-only CSV: one row per rank."""
    if schedule.happens_before:
        raise PipesimError(
            f"schedule {schedule.name!r} has {len(schedule.happens_before)} cross-rank "
            "happens_before constraints that torch's CSV cannot carry; save it as .json"
        )
    if schedule.n_copies != 1:
        raise PipesimError(
            f"schedule {schedule.name!r} runs {schedule.n_copies} model copies (n_copies), "
            "which torch's CSV cannot say; save it as .json"
        )
    if schedule.forward_only:
        # torch's _load_csv validates with _validate_schedule, which wants every
        # micro-batch's backward on every stage, so the file would load nowhere but here.
        raise PipesimError(
            f"schedule {schedule.name!r} is forward-only, and torch's CSV reader "
            "(PipelineScheduleMulti._load_csv) refuses a schedule without backwards; "
            "save it as .json"
        )
    check_last_row(schedule.orders, name=schedule.name)
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    for order in schedule.orders:
        writer.writerow([str(w) for w in order])
    return buffer.getvalue()


def schedule_from_csv(
    text: str,
    /,
    *,
    name: str = "custom",
    n_microbatches: int | None = None,
    source: str = "schedule",
) -> Schedule:
    """Parse torch's compute-only CSV; errors name the line (= rank + 1) and column.
    A blank line between rows is an idle rank and trailing blank lines are dropped, as
    :mod:`pipesim.csv_rows` explains."""
    rows = read_rows(text, source=source)
    orders = [_csv_row(row, line_number, source) for line_number, row in enumerate(rows, 1)]
    try:
        return Schedule.from_orders(orders, n_microbatches=n_microbatches, name=name)
    except PipesimError as exc:
        raise type(exc)(f"{source}: {exc}") from None


def _csv_row(row: list[str], line_number: int, source: str) -> list[Work]:
    order = []
    for column, cell in enumerate(row, start=1):
        cell = cell.strip()
        if not cell:  # torch writes None (an idle step) as an empty cell
            continue
        try:
            order.append(parse_action(cell))
        except PipesimError as exc:
            raise type(exc)(f"{source}: line {line_number}, column {column}: {exc}") from None
    return order


def load_schedule(path: str | Path, /) -> Schedule:
    """Read a schedule from a ``.json`` or ``.csv`` file (chosen by suffix); a CSV with
    sends and receives (torch's compute_comms format) is validated as such first."""
    path = Path(path)
    text = read_text(path, what="schedule")
    suffix = path.suffix.lower()
    if suffix == ".json":
        return schedule_from_json(text, source=str(path))
    if suffix == ".csv":
        from pipesim.comms import comms_from_csv, is_comms_csv, validate_comms

        if is_comms_csv(text):
            # torch's compute_comms CSV: its sends and receives are checked (order on both
            # ends, no blocking cycle); what runs is the compute schedule, whose messages
            # the engine sends after each producer, as pipesim verify does.
            comms = comms_from_csv(text, name=path.stem, source=str(path))
            validate_comms(comms)
            return comms.schedule
        return schedule_from_csv(text, name=path.stem, source=str(path))
    raise ParseError(f"schedule file {str(path)!r}: unknown suffix {suffix!r}; use .json or .csv")


def save_schedule(schedule: Schedule, path: str | Path, /) -> Path:
    """Write ``schedule`` as ``.json`` or ``.csv`` (chosen by suffix); returns the path."""
    path = Path(path)
    suffix = path.suffix.lower()
    if suffix == ".json":
        text = schedule_to_json(schedule)
    elif suffix == ".csv":
        text = schedule_to_csv(schedule)
    else:
        raise ParseError(f"cannot save to {str(path)!r}: use a .json or .csv suffix")
    return write_text(path, text)
