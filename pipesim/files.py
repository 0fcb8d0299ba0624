"""Reading and writing the user's files, with errors that name the file and the fix.

Every file pipesim reads or writes goes through these functions, so a
missing file, a JSON syntax error (with its line and column) or an unwritable
output path reads the same whichever command hit it.

>>> parse_json('{"a": 1,}', source="costs.json")
Traceback (most recent call last):
...
pipesim.errors.ParseError: costs.json: not valid JSON at line 1, column 9: Expecting \
property name enclosed in double quotes
"""

from __future__ import annotations

import json
from importlib import resources
from pathlib import Path
from typing import Any

from pipesim.errors import ParseError, PipesimError

__all__ = [
    "parse_json",
    "read_json",
    "read_package_json",
    "read_text",
    "write_bytes",
    "write_text",
]


def read_text(path: str | Path, /, *, what: str) -> str:
    """The UTF-8 text of ``path``; ParseError saying which ``what`` file could not be read."""
    path = Path(path)
    try:
        return path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ParseError(f"cannot read {what} file {str(path)!r}: {exc.strerror or exc}") from None
    except UnicodeDecodeError:
        raise ParseError(f"{what} file {str(path)!r} is not UTF-8 text") from None


def parse_json(text: str, /, *, source: str) -> Any:
    """``json.loads`` whose syntax errors name ``source``, the line and the column."""
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise ParseError(
            f"{source}: not valid JSON at line {exc.lineno}, column {exc.colno}: {exc.msg}"
        ) from None


def read_json(path: str | Path, /, *, what: str) -> Any:
    """Read and parse the JSON file ``path`` (a ``what`` file, for the messages)."""
    return parse_json(read_text(path, what=what), source=str(path))


def read_package_json(name: str, /) -> Any:
    """A JSON data file shipped in ``pipesim/data/``."""
    text = resources.files("pipesim").joinpath(f"data/{name}").read_text(encoding="utf-8")
    return parse_json(text, source=f"pipesim/data/{name}")


def write_text(path: str | Path, text: str, /) -> Path:
    """Write ``text`` to ``path``; PipesimError naming the path, the reason and the fix."""
    path = Path(path)
    try:
        path.write_text(text, encoding="utf-8")
    except OSError as exc:
        raise PipesimError(
            f"cannot write {str(path)!r}: {exc.strerror or exc}; give a path in an existing, "
            "writable directory"
        ) from None
    return path


def write_bytes(path: str | Path, data: bytes, /) -> Path:
    """Write ``data`` to ``path``; PipesimError naming the path, the reason and the fix."""
    path = Path(path)
    try:
        path.write_bytes(data)
    except OSError as exc:
        raise PipesimError(
            f"cannot write {str(path)!r}: {exc.strerror or exc}; give a path in an existing, "
            "writable directory"
        ) from None
    return path
