"""The manual's commands run as printed: every ``pipesim`` line of the ``sh`` blocks of the
README and of docs/guide/, in reading order, in one folder (a later line may read what
an earlier one wrote, as a reader's would); the transcript of the README's ``text`` block
is what ``pipesim`` prints; the cost file examples of docs/guide/costs.md load; the
README's Python example gives the values its comments state.

A few lines are left to the tests that already run them (GPUs, several processes,
minutes of measuring); :data:`ELSEWHERE` names each with its reason, and a line listed
there that the README no longer has fails the test, so the list cannot go stale.
"""

from __future__ import annotations

import contextlib
import io
import json
import re
import shlex
from fractions import Fraction
from pathlib import Path

import pytest

from pipesim.cli import main

ROOT = Path(__file__).parent.parent
README = (ROOT / "README.md").read_text(encoding="utf-8")
#: The guide's pages in the order the README's table of verbs sends a reader through them.
GUIDE = [
    ROOT / "docs" / "guide" / f"{name}.md"
    for name in (
        "simulate",
        "schedules",
        "costs",
        "schedule-files",
        "plot",
        "verify",
        "synthesize",
        "calibrate",
        "plan",
        "limits",
        "development",
    )
]
MANUAL = "\n".join([README, *(page.read_text(encoding="utf-8") for page in GUIDE)])

#: README lines run elsewhere, by the start of the line, with where and why.
ELSEWHERE = {
    "pipesim plot 1f1b -p 4 -m 8 --activation-bytes 1e6 -o timeline.png": (
        "image export needs kaleido and a Chromium: tests/test_plot_browser.py"
    ),
    "pipesim verify zbv -p 2 -m 8 --model gpt --device cuda:0,cuda:1": (
        "two GPUs: scripts/gpu_check.sh, tests/test_verify_cuda.py"
    ),
    "pipesim verify 1f1b -p 4 -m 8 --dist": "rank processes: tests/test_verify_dist.py",
    "torchrun --nproc-per-node 4 -m verify": "torchrun: tests/test_verify_torchrun.py",
    "pipesim calibrate --model gpt": "minutes of measuring: tests/test_calibrate_cli.py",
    "pipesim simulate zb-h1 -p 2 -m 16 --costs gpt-2stages.json": "reads calibrate's file",
    "pipesim calibrate ... ": "an elided command line",
    "pipesim plan --model llama2-70b --devices 4096": (
        "a Dask scheduler at tcp://HOST:8786: tests/test_plan_dask.py starts one"
    ),
    "pipesim calibrate --from-trace rank0.json": "reads profiler traces: tests/test_kineto.py",
    "pipesim plot --measured rank0.json": "reads profiler traces: tests/test_kineto.py",
    "pipesim plan --model llama2-70b --devices 64": (
        "minutes on a busy machine: notebooks/04_plan.ipynb plans the same step"
    ),
}


def _commands(kind: str) -> list[str]:
    """The command lines of the manual's ``kind`` blocks, continuations joined, comments
    dropped, ``a && b`` split."""
    lines = []
    for body in re.findall(rf"```{kind}\n(.*?)```", MANUAL, re.S):
        for line in body.replace("\\\n", " ").splitlines():
            command = re.sub(r"\s+#.*$", "", line).strip()
            lines += [part.strip() for part in command.split(" && ") if part.strip()]
    return lines


def _run(argv: list[str]) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            status = main(argv)
        except SystemExit as exc:  # argparse's usage errors
            status = exc.code if isinstance(exc.code, int) else 1
    return status, out.getvalue(), err.getvalue()


@pytest.mark.slow
def test_every_sh_command_runs_as_printed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("torch")  # the verify lines; `make test` installs it
    monkeypatch.chdir(tmp_path)
    commands = [c for c in _commands("sh") if c.startswith(("pipesim ", "torchrun "))]
    ran, skipped = [], set()
    for command in commands:
        reason = next((k for k in ELSEWHERE if command.startswith(k)), None)
        if reason is not None:
            skipped.add(reason)
            continue
        status, _, err = _run(shlex.split(command)[1:])
        assert status == 0, f"manual: `{command}` exits {status}: {err}"
        ran.append(command)
    assert skipped == set(ELSEWHERE), f"no longer in the manual: {set(ELSEWHERE) - skipped}"
    verbs = {c.split()[1] for c in ran}
    assert {"schedules", "simulate", "schedule", "validate", "plot", "trace"} <= verbs
    assert {"verify", "synthesize", "plan"} <= verbs and len(ran) >= 20
    # what the lines wrote, read back: the schedule edited and validated, the measured report
    assert (tmp_path / "my_schedule.csv").read_text().startswith("0F0,")
    assert json.loads((tmp_path / "plan.json").read_text())["best"]["fits"] is True
    assert json.loads((tmp_path / "report.json").read_text())["bit_identical"] is True


def test_the_transcript_is_what_pipesim_prints() -> None:
    (block,) = re.findall(r"```text\n\$ (pipesim .*?)\n(.*?)```", README, re.S)
    command, shown = block
    status, out, _ = _run(shlex.split(command)[1:])
    assert status == 0 and out == shown


def test_the_cost_file_examples_load(tmp_path: Path) -> None:
    costs_page = (ROOT / "docs" / "guide" / "costs.md").read_text(encoding="utf-8")
    whole, links = re.findall(r"```json\n(.*?)```", costs_page, re.S)
    path = tmp_path / "costs.json"
    path.write_text(whole)
    status, out, err = _run(["simulate", "1f1b", "-p", "2", "-m", "4", "--costs", str(path)])
    assert status == 0, err
    assert "memory capacity 80,000,000,000 bytes" in out
    # the "links" fragment, in a cost file of its own: 16 ranks on two 8-GPU nodes, in s
    path.write_text(
        '{"stage": {"forward": 1e-3, "backward": 2e-3}, "time_unit": "s", ' + links + "}"
    )
    argv = ["simulate", "1f1b", "-p", "16", "-m", "16", "--costs", str(path), "--json"]
    status, out, err = _run(argv)
    assert status == 0, err
    assert json.loads(out)["time_unit"] == "s"


def test_the_python_example_gives_the_values_its_comments_state() -> None:
    (code,) = re.findall(r"```python\n(.*?)```", README, re.S)
    namespace: dict[str, object] = {"Fraction": Fraction}
    checked = 0
    for line in code.splitlines():
        statement, _, comment = line.partition("#")
        if not comment.strip() or "=" in statement.split("(")[0]:
            exec(statement, namespace)  # an assignment or an import
            continue
        stated = re.split(r" == |: ", comment.strip(), maxsplit=1)[0]
        assert eval(statement, namespace) == eval(stated, namespace), line
        checked += 1
    assert checked == 4
