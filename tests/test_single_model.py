"""Every rule of the step model is written once: the dependency rules, the
message-size rule, the memory model and the deadlock error live in
pipesim/step/dependencies.py, pipesim/step/cost_tables.py, pipesim/step/memory.py and
pipesim/step/deadlock.py (read through the compiled step, pipesim/step/compile.py); no other
production file restates them.

The check reads code only (comments and docstrings are stripped with ``tokenize``),
and each pattern is first shown to catch the restatement it was written against
(lines from the evaluators as they were before the compiled step), so an empty
result means something.
"""

from __future__ import annotations

import io
import re
import tokenize
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PRODUCTION = sorted([*ROOT.glob("pipesim/**/*.py"), *ROOT.glob("verify/**/*.py")])

#: rule -> (pattern, the files that define it)
RULES: dict[str, tuple[re.Pattern[str], set[str]]] = {
    # A copy's first stage reads the input, its last computes the loss: stage % per_copy.
    "dependency (copy boundaries)": (
        re.compile(r"%\s*\(?\s*(self\.)?per_copy\b"),
        {"pipesim/step/dependencies.py"},
    ),
    # Messages: F sends its stage's output_bytes, a gradient the previous stage's.
    "message size": (re.compile(r"\.output_bytes\b"), {"pipesim/step/cost_tables.py"}),
    # Memory: I frees all but weight_grad_bytes, W the rest; the count drops with the last byte.
    "memory effects": (
        re.compile(
            r"activation_bytes\s*-|-\s*[\w.\[\]]*weight_grad_bytes|-\s*(kept|wgb)\b|"
            r"(weight_grad_bytes|kept|wgb)(\[\w+\])?\s*(==|>)\s*0"
        ),
        {"pipesim/step/memory.py"},
    ),
    # A rank's memory peak: the highest of its levels (pipesim.step.memory.RunningPeak).
    "memory peaks": (
        re.compile(r">\s*(\w+\.)?peak\w*\b|\bmax\(\s*(max\(|(\w+\.)?peak\w*(\[[^\]]*\])?\s*,)"),
        {"pipesim/step/memory.py"},
    ),
    # Rendezvous: a receive posted late is answered at the end of the node its sender is
    # inside (pipesim.engine.answers_at_node_end).
    "rendezvous answer": (
        re.compile(r"\w+(\[\w+\])?\s*<\s*(posted|now)\s*<"),
        {"pipesim/engine.py"},
    ),
    # One DeadlockError builder (the class itself lives in errors.py).
    "deadlock error": (
        re.compile(r"\bDeadlockError\("),
        {"pipesim/step/deadlock.py", "pipesim/errors.py"},
    ),
}

#: Code that matches a pattern but is not the rule, with the reason.
NOT_THE_RULE = {
    ("message size", "pipesim/plan/workload.py"): "reads a cost file back into a workload",
    ("message size", "pipesim/plan/measured.py"): "a planner stage grouping file stages "
    "outputs what the last of them outputs",
    ("dependency (copy boundaries)", "verify/locate.py"): "maps a stage to its copy-0 twin "
    "(verify.locate.twin, used by compare and locate)",
    ("memory peaks", "pipesim/plan/fastsim.py"): "the fast evaluator's copy, for speed, "
    "pinned equal to the engine by tests/test_plan_fastsim.py",
    ("memory peaks", "pipesim/plan/onepass.py"): "the one-pass evaluator's per-action loop, "
    "for speed, pinned equal to the engine by tests/test_plan_fastsim.py",
    ("memory peaks", "verify/runtime.py"): "the torch replay's measured high-water mark of "
    "the weight-gradient bytes torch saved between I and W, the value the model is checked "
    "against",
    ("deadlock error", "pipesim/comms.py"): "a cycle of blocking sends and receives in a comms "
    "program, not the compute step's wait cycle",
    ("memory peaks", "pipesim/plan/hardware.py"): "an accelerator file's sustained GEMM rate "
    "checked against its peak FLOP/s, not a memory level",
}

#: Files still restating a rule, known and waiting for their own change. The test fails
#: when one of them stops restating it, so that the entry is removed here.
PENDING: set[tuple[str, str]] = set()

#: Restatements as they stood before pipesim/step/compile.py (git history), one per rule.
OLD_CODE = {
    "dependency (copy boundaries)": "f_waits = [s % per_copy != 0 and placement[s - 1] != p]",
    "message size": "return self.stage(producer.stage - 1).output_bytes if producer.stage",
    "memory effects": "freed_bytes += cost.activation_bytes - cost.weight_grad_bytes",
    "deadlock error": 'raise DeadlockError(f"simulation stopped with ranks {stuck}")',
    "memory peaks": "peak_bytes[rank] = max(peak_bytes[rank], sample.activation_bytes)",
    "rendezvous answer": "if self.since[rank] < now < self.until[rank]:",
}
#: More restatements as they stood before pipesim.step.memory.level_peaks and
#: pipesim.engine.answers_at_node_end (git history).
OLD_PEAK_AND_ANSWER_LINES = [
    ("memory peaks", "if held_bytes > peak_bytes:"),
    ("memory peaks", "if h > peak:"),
    ("memory peaks", "if self.level > self.peak:"),
    ("rendezvous answer", "if begins < posted < done or (begins >= posted and at[3] in takes):"),
]
OLD_MEMORY_LINES = [
    "c -= kept[stage] > 0",
    "count -= wgb[stage] == 0",
    "held -= act[stage] - wgb[stage]",
    "Op.I: (cost.input_grad, (0, 0), (act - kept, int(kept == 0))),",
]


def code_only(path: Path) -> str:
    """The file's code with comments and string literals (docstrings too) blanked."""
    lines = path.read_text(encoding="utf-8").splitlines(keepends=True)
    text_tokens = {tokenize.COMMENT, tokenize.STRING}
    text_tokens.add(getattr(tokenize, "FSTRING_MIDDLE", tokenize.STRING))  # Python >= 3.12
    for token in tokenize.generate_tokens(io.StringIO("".join(lines)).readline):
        if token.type not in text_tokens:
            continue
        (row, col), (end_row, end_col) = token.start, token.end
        for r in range(row, end_row + 1):
            line = lines[r - 1]
            lo = col if r == row else 0
            hi = end_col if r == end_row else len(line.rstrip("\n"))
            lines[r - 1] = line[:lo] + " " * (hi - lo) + line[hi:]
    return "".join(lines)


def offenders() -> set[tuple[str, str]]:
    found = set()
    for path in PRODUCTION:
        name = path.relative_to(ROOT).as_posix()
        text = code_only(path)
        for rule, (pattern, homes) in RULES.items():
            if name not in homes and pattern.search(text):
                found.add((rule, name))
    return found


@pytest.mark.parametrize("rule", sorted(RULES))
def test_each_pattern_catches_the_old_restatement(rule: str) -> None:
    assert RULES[rule][0].search(OLD_CODE[rule])


@pytest.mark.parametrize(("rule", "line"), OLD_PEAK_AND_ANSWER_LINES)
def test_peak_and_answer_patterns_catch_each_old_form(rule: str, line: str) -> None:
    assert RULES[rule][0].search(line)


@pytest.mark.parametrize("line", OLD_MEMORY_LINES)
def test_memory_pattern_catches_each_old_form(line: str) -> None:
    assert RULES["memory effects"][0].search(line)


def test_each_rule_lives_in_its_home() -> None:
    for rule, (pattern, homes) in RULES.items():
        texts = [code_only(ROOT / home) for home in sorted(homes)]
        assert any(pattern.search(t) for t in texts), rule


def test_no_other_production_file_restates_a_rule() -> None:
    found = offenders() - set(NOT_THE_RULE)
    assert found - PENDING == set(), "move the rule's use onto its home module (RULES)"
    assert PENDING - found == set(), "these no longer restate the rule: drop them from PENDING"


def test_the_evaluators_read_no_stage_cost_field() -> None:
    # The engine and the fast evaluators take durations, sizes and memory effects from the
    # compiled step's tables, never from StageCost directly.
    fields = re.compile(
        r"\.(forward|backward|input_grad|weight_grad|activation_bytes|weight_grad_bytes|"
        r"output_bytes)\b(?!\s*=)"
    )
    for name in (
        "pipesim/engine.py",
        "pipesim/graph.py",
        "pipesim/plan/fastsim.py",
        "pipesim/plan/onepass.py",
        "pipesim/plan/fasttrace.py",
    ):
        text = code_only(ROOT / name)
        assert not fields.findall(text), (name, fields.findall(text))
    assert fields.search("durations += [cost.forward, cost.backward]")
