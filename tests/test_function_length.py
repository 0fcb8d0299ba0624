"""No function in pipesim/ or verify/ is longer than about 80 lines (docstring included),
besides the CLI's argparse ``register`` declarations and the few listed below with why.

The walk is shown first to find a long function in a hand-made source, so an empty
result means something; a listed function that shrinks under the limit fails too, so
that its entry is removed.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PRODUCTION = sorted([*ROOT.glob("pipesim/**/*.py"), *ROOT.glob("verify/**/*.py")])
LIMIT = 80

#: (file, function) -> why it stays longer than LIMIT lines.
LONG_ON_PURPOSE = {
    ("pipesim/plan/planner.py", "plan"): "the public planner call: 36 keyword arguments "
    "(38 lines of signature) and their documentation; its body is a dozen named steps",
    ("pipesim/plan/onepass.py", "_run_ranks"): "the planner's hot loop, kept one function "
    "for speed (a Python call per action costs, docs/planner-speed.md); pinned equal to "
    "the engine by tests/test_plan_fastsim.py",
}


def long_functions(source: str) -> dict[str, int]:
    """Every function (methods and nested ones too) of ``source`` longer than LIMIT
    lines, by name, with its length."""
    found = {}
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            length = (node.end_lineno or node.lineno) - node.lineno + 1
            if length > LIMIT:
                found[node.name] = length
    return found


def test_the_walk_finds_a_long_function() -> None:
    body = "".join(f"        x{i} = {i}\n" for i in range(LIMIT))
    source = f"def short():\n    return 1\n\n\nclass C:\n    def long(self):\n{body}"
    assert long_functions(source) == {"long": LIMIT + 1}


def test_no_function_is_longer_than_the_limit() -> None:
    found = set()
    for path in PRODUCTION:
        name = path.relative_to(ROOT).as_posix()
        for function in long_functions(path.read_text(encoding="utf-8")):
            cli_declaration = name.startswith("pipesim/cli/") and function == "register"
            if not cli_declaration:
                found.add((name, function))
    assert found - set(LONG_ON_PURPOSE) == set(), "split them into named helpers"
    assert set(LONG_ON_PURPOSE) - found == set(), "now short: drop them from LONG_ON_PURPOSE"
