"""pipesim.files: strict JSON where silence is wrong, lenient where harmless, and writes
that replace a file all at once or not at all."""

from __future__ import annotations

import os
import signal
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from pipesim.costs import load_costs
from pipesim.errors import ParseError, PipesimError
from pipesim.files import check_writable, parse_json, read_text, write_text
from pipesim.schedule_io import load_schedule, schedule_to_json
from pipesim.schedules import generate


# -- reading ----------------------------------------------------------------------------
def test_duplicate_keys_are_refused_with_the_object_position() -> None:
    text = '{\n "stage": {"forward": 1,\n  "forward": 2}}'
    with pytest.raises(ParseError) as info:
        parse_json(text, source="c.json")
    # the inner object starts at line 2, column 11 (1-based), where its "{" is
    assert str(info.value) == (
        "c.json: the key 'forward' in the object at line 2, column 11 is given twice; keep one"
    )
    with pytest.raises(ParseError, match="the key 'ranks' in the object at line 1, column 1"):
        parse_json('{"ranks": [], "ranks": []}', source="s.json")


def test_numbers_beyond_a_float_are_refused_with_their_position() -> None:
    with pytest.raises(ParseError, match=r"'1e5000' at line 2, column 13 is beyond what a float"):
        parse_json('{\n "forward": 1e5000}', source="c.json")
    with pytest.raises(ParseError, match=r"'-2.5e-400' at line 1, column 2 is beyond"):
        parse_json("[-2.5e-400]", source="c.json")
    assert parse_json("[0e-400, 0.0, 1e300]", source="c.json") == [0.0, 0.0, 1e300]


def test_byte_order_mark_and_crlf_are_accepted(tmp_path: Path) -> None:
    schedule = generate("1f1b", n_ranks=2, n_microbatches=3)
    as_json = tmp_path / "s.json"
    as_json.write_bytes(b"\xef\xbb\xbf" + schedule_to_json(schedule).replace("\n", "\r\n").encode())
    assert load_schedule(as_json).orders == schedule.orders
    as_csv = tmp_path / "s.csv"
    as_csv.write_bytes(b"\xef\xbb\xbf0F0,0F1,0F2,0B0,0B1,0B2\r\n1F0,1B0,1F1,1B1,1F2,1B2\r\n")
    assert [[str(w) for w in order] for order in load_schedule(as_csv).orders] == [
        ["0F0", "0F1", "0F2", "0B0", "0B1", "0B2"],
        ["1F0", "1B0", "1F1", "1B1", "1F2", "1B2"],
    ]
    costs = tmp_path / "c.json"
    costs.write_bytes(b'\xef\xbb\xbf{"stage": {"forward": "3/2"},\r\n "overlap_comm": false}\r\n')
    assert load_costs(costs).stages[0].forward * 2 == 3


def test_text_that_is_not_utf8_names_the_line(tmp_path: Path) -> None:
    path = tmp_path / "s.csv"
    path.write_bytes(b"0F0\n0F\xff1\n")
    with pytest.raises(ParseError, match=r"not UTF-8 text: byte 0xff at line 2 \(byte offset 6\)"):
        read_text(path, what="schedule")


def test_unreadable_paths_are_named(tmp_path: Path) -> None:
    with pytest.raises(ParseError, match=r"cannot read schedule file .*: Is a directory"):
        read_text(tmp_path, what="schedule")
    with pytest.raises(ParseError, match=r"cannot read cost file .*No such file"):
        read_text(tmp_path / "missing.json", what="cost")


# -- writing ----------------------------------------------------------------------------
def _leftovers(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir() if p.name.endswith(".tmp"))


def test_write_replaces_the_whole_file_and_keeps_its_mode(tmp_path: Path) -> None:
    path = tmp_path / "out.json"
    path.write_text("old and longer than the new text\n", encoding="utf-8")
    path.chmod(0o640)
    assert write_text(path, "new\n") == path
    assert path.read_text(encoding="utf-8") == "new\n"
    assert stat.S_IMODE(path.stat().st_mode) == 0o640
    assert _leftovers(tmp_path) == []


def test_a_new_file_gets_the_umask_mode(tmp_path: Path) -> None:
    old = os.umask(0o027)
    try:
        write_text(tmp_path / "new.txt", "x")
    finally:
        os.umask(old)
    assert stat.S_IMODE((tmp_path / "new.txt").stat().st_mode) == 0o640  # 0o666 & ~0o027


def test_an_interrupted_write_leaves_the_old_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "out.json"
    path.write_text("old\n", encoding="utf-8")

    def interrupt(descriptor: int) -> None:  # Ctrl-C after the data, before the rename
        raise KeyboardInterrupt

    monkeypatch.setattr(os, "fsync", interrupt)
    with pytest.raises(KeyboardInterrupt):
        write_text(path, "new " * 1000)
    assert path.read_text(encoding="utf-8") == "old\n"
    assert _leftovers(tmp_path) == []


def test_a_write_through_a_symlink_lands_in_its_target(tmp_path: Path) -> None:
    target = tmp_path / "real.txt"
    target.write_text("old", encoding="utf-8")
    link = tmp_path / "link.txt"
    link.symlink_to(target)
    write_text(link, "new")
    assert link.is_symlink() and target.read_text(encoding="utf-8") == "new"


def test_unwritable_paths_are_named(tmp_path: Path) -> None:
    with pytest.raises(PipesimError, match=r"cannot write .*: Is a directory"):
        write_text(tmp_path, "x")
    with pytest.raises(PipesimError, match=r"No such file or directory; give a path in an"):
        write_text(tmp_path / "no" / "x.json", "x")
    with pytest.raises(PipesimError, match=r"cannot write -o '.*x.html': the folder '.*no'"):
        check_writable(tmp_path / "no" / "x.html", what="-o")
    with pytest.raises(PipesimError, match=r"it is a folder; give a file name"):
        check_writable(tmp_path, what="--costs-out")
    assert check_writable(tmp_path / "fine.json") == tmp_path / "fine.json"


_LIMITED = """
import resource, sys
resource.setrlimit(resource.RLIMIT_FSIZE, (2000, 2000))
from pipesim.cli import main
sys.exit(main(sys.argv[1:]))
"""


@pytest.mark.slow
def test_a_write_past_the_file_size_limit_leaves_the_old_file(tmp_path: Path) -> None:
    # A file-size limit (RLIMIT_FSIZE) makes the write fail part way, as a full disk would.
    path = tmp_path / "order.json"
    old = schedule_to_json(generate("gpipe", n_ranks=2, n_microbatches=2))
    path.write_text(old, encoding="utf-8")
    big = ["schedule", "1f1b", "-p", "4", "-m", "64", "-o", str(path)]
    done = subprocess.run(
        [sys.executable, "-c", _LIMITED, *big],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 1, done.stderr
    assert done.stderr.startswith(f"pipesim: error: cannot write {str(path)!r}: File too large")
    assert "(nothing was changed)" in done.stderr and "Traceback" not in done.stderr
    assert path.read_text(encoding="utf-8") == old
    assert _leftovers(tmp_path) == []
    # the same command without the limit writes the whole schedule
    unlimited = _LIMITED.replace("(2000, 2000)", "(resource.RLIM_INFINITY,) * 2")
    small = subprocess.run(
        [sys.executable, "-c", unlimited, *big],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert small.returncode == 0, small.stderr
    assert load_schedule(path) == generate("1f1b", n_ranks=4, n_microbatches=64)


_SLOW_WRITE = """
import os, sys, time
import pipesim.files

def slow_fsync(descriptor):  # the data is in the temporary file; hold here
    print("writing", flush=True)
    time.sleep(60)

os.fsync = slow_fsync
pipesim.files.write_text(sys.argv[1], "new " * 1000)
"""


def test_sigterm_during_a_write_leaves_the_old_file(tmp_path: Path) -> None:
    path = tmp_path / "out.json"
    path.write_text("old\n", encoding="utf-8")
    child = subprocess.Popen(
        [sys.executable, "-c", _SLOW_WRITE, str(path)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert child.stdout is not None and child.stdout.readline() == "writing\n"
        assert len(_leftovers(tmp_path)) == 1  # the temporary file, next to the target
        child.send_signal(signal.SIGTERM)
        assert child.wait(timeout=60) == 128 + signal.SIGTERM
    finally:
        child.kill()
        child.communicate()
    assert path.read_text(encoding="utf-8") == "old\n"
    assert _leftovers(tmp_path) == []
