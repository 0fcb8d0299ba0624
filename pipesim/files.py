"""Reading and writing the user's files, with errors that name the file and the fix.

Every file pipesim reads or writes goes through these functions, so a missing
file, a JSON syntax error (with its line and column) or an unwritable output
path reads the same whichever command hit it.

Reading is bounded by :mod:`pipesim.limits`: a file larger than
``MAX_FILE_BYTES``, JSON nested deeper than ``MAX_JSON_DEPTH`` or a JSON
integer longer than ``MAX_NUMBER_DIGITS`` digits is refused with the limit
named. JSON is read strictly where silence would be wrong (a key given twice
is refused with its object's position) and leniently where it is harmless (a
UTF-8 byte-order mark, CRLF line ends).

Writing never leaves a half-written file: the text goes to a temporary file in
the same folder, which then replaces the target in one step, so a full disk, a
file-size limit, Ctrl-C or SIGTERM leaves the old file as it was.

>>> parse_json('{"a": 1,}', source="costs.json")
Traceback (most recent call last):
...
pipesim.errors.ParseError: costs.json: not valid JSON at line 1, column 9: Expecting \
property name enclosed in double quotes
>>> parse_json('{"a": 1, "a": 2}', source="costs.json")
Traceback (most recent call last):
...
pipesim.errors.ParseError: costs.json: the key 'a' in the object at line 1, column 1 is \
given twice; keep one
"""

from __future__ import annotations

import contextlib
import errno
import json
import json.decoder
import json.scanner
import math
import os
import re
import secrets
import stat
from importlib import resources
from pathlib import Path
from typing import Any

from pipesim.errors import LimitError, ParseError, PipesimError, brief
from pipesim.limits import MAX_FILE_BYTES, MAX_JSON_DEPTH, MAX_NUMBER_DIGITS
from pipesim.sigterm import exit_on_sigterm

__all__ = [
    "check_writable",
    "parse_json",
    "read_json",
    "read_package_json",
    "read_text",
    "write_bytes",
    "write_text",
]


def read_text(path: str | Path, /, *, what: str) -> str:
    """The UTF-8 text of ``path`` (a leading byte-order mark dropped, line ends made
    ``\\n``); ParseError saying which ``what`` file could not be read."""
    path = Path(path)
    try:
        with path.open("rb") as file:
            data = file.read(MAX_FILE_BYTES + 1)  # bounded even for /dev/zero
    except OSError as exc:
        raise ParseError(f"cannot read {what} file {str(path)!r}: {exc.strerror or exc}") from None
    if len(data) > MAX_FILE_BYTES:
        raise LimitError(
            f"{what} file {str(path)!r} is larger than pipesim's limit of {MAX_FILE_BYTES} bytes "
            "(MAX_FILE_BYTES in pipesim.limits)"
        )
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        line = data.count(b"\n", 0, exc.start) + 1
        raise ParseError(
            f"{what} file {str(path)!r} is not UTF-8 text: byte {data[exc.start]:#04x} at "
            f"line {line} (byte offset {exc.start}); save it as UTF-8"
        ) from None
    return text.replace("\r\n", "\n").replace("\r", "\n")


class _BadJson(Exception):
    """Raised from inside the JSON decoder's hooks; turned into a ParseError."""

    def __init__(self, subject: str, reason: str, *, needle: str | None = None) -> None:
        super().__init__(subject, reason)
        self.subject, self.reason = subject, reason
        self.needle = needle  # the number's text, found in the document for its position


def _object(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    result = dict(pairs)
    if len(result) < len(pairs):
        seen: set[str] = set()
        for key, _ in pairs:
            if key in seen:
                raise _BadJson(f"the key {brief(key)}", "is given twice; keep one")
            seen.add(key)
    return result


def _integer(text: str) -> int:
    if len(text.lstrip("-")) > MAX_NUMBER_DIGITS:  # refused before int() reads 5000 digits
        raise _BadJson(
            f"the number {brief(text)}",
            f"has {len(text.lstrip('-'))} digits, above pipesim's limit of {MAX_NUMBER_DIGITS} "
            "(MAX_NUMBER_DIGITS in pipesim.limits)",
            needle=text,
        )
    return int(text)


def _float(text: str) -> float:
    value = float(text)
    underflow = value == 0 and re.split("[eE]", text)[0].strip("-0.") != ""
    if not math.isfinite(value) or underflow:
        raise _BadJson(
            f"the number {brief(text)}",
            "is beyond what a float holds; give a value between 1e-300 and 1e300",
            needle=text,
        )
    return value


_DECODER = json.JSONDecoder(object_pairs_hook=_object, parse_int=_integer, parse_float=_float)


def parse_json(text: str, /, *, source: str) -> Any:
    """``json.loads`` whose errors name ``source``, the line and the column; keys given
    twice, nesting deeper than ``MAX_JSON_DEPTH`` and over-long numbers are refused."""
    text = text.removeprefix("\ufeff")
    try:
        data = _DECODER.decode(text)
    except json.JSONDecodeError as exc:
        raise ParseError(
            f"{source}: not valid JSON at line {exc.lineno}, column {exc.colno}: {exc.msg}"
        ) from None
    except RecursionError:
        raise _too_deep(text, source) from None
    except _BadJson as exc:
        if exc.needle is not None:
            position: int | None = text.find(exc.needle)
            where = "" if position is None or position < 0 else _line_column(text, position)
        else:
            position = _duplicate_position(text)
            where = "" if position is None else " in the object" + _line_column(text, position)
        raise ParseError(f"{source}: {exc.subject}{where} {exc.reason}") from None
    if _deeper_than(data, MAX_JSON_DEPTH):
        raise _too_deep(text, source)
    return data


_CONTAINERS = {list, dict}


def _deeper_than(data: Any, limit: int) -> bool:
    """Whether decoded JSON nests more than ``limit`` deep: level by level, each
    container's element types gathered at C speed, so a list of ten million strings
    costs one ``set(map(type, ...))``."""
    level, depth = [data], 0
    while level:
        depth += 1
        if depth > limit:
            return True
        deeper: list[Any] = []
        for container in level:
            if type(container) not in _CONTAINERS:
                continue
            values = container.values() if type(container) is dict else container
            if _CONTAINERS & set(map(type, values)):
                deeper.extend(v for v in values if type(v) in _CONTAINERS)
        level = deeper
    return False


def _too_deep(text: str, source: str) -> ParseError:
    position = _deep_position(text)
    where = "" if position is None else _line_column(text, position)
    return ParseError(
        f"{source}: JSON nested more than {MAX_JSON_DEPTH} levels deep{where} (MAX_JSON_DEPTH "
        "in pipesim.limits)"
    )


def _deep_position(text: str) -> int | None:
    """Where nesting first passes the limit (an error path: a plain scan is fine)."""
    depth, in_string, escaped = 0, False, False
    for position, char in enumerate(text):
        if in_string:
            if escaped:
                escaped = False
            elif char == "\\":
                escaped = True
            elif char == '"':
                in_string = False
        elif char == '"':
            in_string = True
        elif char in "[{":
            depth += 1
            if depth > MAX_JSON_DEPTH:
                return position
        elif char in "]}":
            depth -= 1
    return None


def _duplicate_position(text: str) -> int | None:
    """Where the object holding a duplicate key starts: decoded again with the pure-Python
    scanner, whose object parser sees each object's offset (an error path only)."""
    decoder = json.JSONDecoder(object_pairs_hook=_object, parse_int=_integer, parse_float=_float)
    found: list[int] = []

    def parse_object(s_and_end: tuple[str, int], *args: Any) -> Any:
        try:
            return json.decoder.JSONObject(s_and_end, *args)  # type: ignore[attr-defined]
        except _BadJson:
            if not found:
                found.append(s_and_end[1] - 1)
            raise

    decoder.parse_object = parse_object  # type: ignore[attr-defined]
    decoder.scan_once = json.scanner.py_make_scanner(decoder)  # type: ignore[attr-defined]
    with contextlib.suppress(_BadJson, ValueError, RecursionError):
        decoder.decode(text)
    return found[0] if found else None


def _line_column(text: str, position: int) -> str:
    line = text.count("\n", 0, position) + 1
    column = position - (text.rfind("\n", 0, position) + 1) + 1
    return f" at line {line}, column {column}"


def read_json(path: str | Path, /, *, what: str) -> Any:
    """Read and parse the JSON file ``path`` (a ``what`` file, for the messages)."""
    return parse_json(read_text(path, what=what), source=str(path))


def read_package_json(name: str, /) -> Any:
    """A JSON data file shipped in ``pipesim/data/``."""
    text = resources.files("pipesim").joinpath(f"data/{name}").read_text(encoding="utf-8")
    return parse_json(text, source=f"pipesim/data/{name}")


def check_writable(path: str | Path, /, *, what: str = "output") -> Path:
    """Refuse, before a long run starts, an output path that cannot be written.

    >>> check_writable("/no/such/folder/plan.html", what="-o")
    Traceback (most recent call last):
    ...
    pipesim.errors.PipesimError: cannot write -o '/no/such/folder/plan.html': the folder \
'/no/such/folder' does not exist; give a path in an existing, writable folder
    """
    path = Path(path)
    target = _target(path)
    folder = target.parent
    if target.is_dir():
        reason = "it is a folder; give a file name"
    elif not folder.is_dir():
        reason = f"the folder {str(folder)!r} does not exist"
    elif target.exists() and not os.access(target, os.W_OK):
        reason = "the file is not writable"
    elif target.exists() and not target.is_file():
        return path  # a device or pipe (/dev/stdout): written in place
    elif not os.access(folder, os.W_OK | os.X_OK):
        reason = f"the folder {str(folder)!r} is not writable"
    else:
        return path
    if "folder" in reason and "give" not in reason:
        reason += "; give a path in an existing, writable folder"
    raise PipesimError(f"cannot write {what} {str(path)!r}: {reason}")


def write_text(path: str | Path, text: str, /) -> Path:
    """Write ``text`` to ``path`` as UTF-8, all at once or not at all (see
    :func:`write_bytes`)."""
    return write_bytes(path, text.encode("utf-8"))


def write_bytes(path: str | Path, data: bytes, /) -> Path:
    """Write ``data`` to ``path`` all at once or not at all; PipesimError naming the path,
    the reason and the fix. An existing file is replaced only once the new data is
    completely written (a temporary file in the same folder is moved over it)."""
    path = Path(path)
    target = _target(path)
    try:
        if target.exists() and not target.is_file() and not target.is_dir():
            with target.open("wb") as stream:  # /dev/stdout, a pipe
                stream.write(data)
        else:
            _replace(target, data)
    except OSError as exc:
        fix = (
            "free some space or raise the limit"
            if exc.errno in (errno.EFBIG, errno.ENOSPC, errno.EDQUOT)
            else "give a path in an existing, writable folder"
        )
        raise PipesimError(
            f"cannot write {str(path)!r}: {exc.strerror or exc}; {fix} (nothing was changed)"
        ) from None
    return path


def _target(path: Path) -> Path:
    """The file a write lands in: a symbolic link is written through, as open() would."""
    return Path(os.path.realpath(path)) if path.is_symlink() else path


def _replace(target: Path, data: bytes) -> None:
    with exit_on_sigterm():
        _replace_now(target, data)


def _replace_now(target: Path, data: bytes) -> None:
    mode = stat.S_IMODE(target.stat().st_mode) if target.is_file() else None
    while True:
        temporary = target.with_name(f".{target.name}.{secrets.token_hex(4)}.tmp")
        try:  # mode 0o666 lets the umask decide, as for any new file
            descriptor = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
            break
        except FileExistsError:
            continue
    try:
        with os.fdopen(descriptor, "wb") as stream:
            stream.write(data)
            stream.flush()
            os.fsync(stream.fileno())
        if mode is not None:
            os.chmod(temporary, mode)
        os.replace(temporary, target)
    except BaseException:  # a failed write or Ctrl-C: the old file stays, the part goes
        with contextlib.suppress(OSError):
            os.unlink(temporary)
        raise
