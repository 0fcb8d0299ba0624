"""Every module is on a map a newcomer reads first: a package's modules are named in the
package's docstring, pipesim's top-level modules in docs/guide/development.md's layout.

The oracle is the file tree itself: a module added without a line on its map fails here,
so docs/architecture.md's "where each change belongs" and the maps it points to never
silently miss a file.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
LAYOUT = (ROOT / "docs/guide/development.md").read_text()
PACKAGES = sorted(
    p.parent for p in [*ROOT.glob("pipesim/**/__init__.py"), ROOT / "verify/__init__.py"]
)


def _docstring(path: Path) -> str:
    return ast.get_docstring(ast.parse(path.read_text())) or ""


def _modules(package: Path) -> list[Path]:
    return sorted(p for p in package.glob("*.py") if p.stem not in {"__init__", "__main__"})


@pytest.mark.parametrize("package", PACKAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_module_is_on_its_map(package: Path) -> None:
    dotted = ".".join(package.relative_to(ROOT).parts)
    if dotted == "pipesim":  # the top level: the layout of docs/guide/development.md
        unnamed = [m.name for m in _modules(package) if not re.search(rf"\b{m.stem}\.py\b", LAYOUT)]
    else:
        doc = _docstring(package / "__init__.py")
        unnamed = [
            m.name for m in _modules(package) if not re.search(rf"\b{dotted}\.{m.stem}\b", doc)
        ]
    assert not unnamed, f"{dotted}: modules named on no map: {unnamed}"


def test_the_check_catches_a_module_left_off() -> None:
    # The premise: a name that is on no map is not found by the same patterns.
    assert not re.search(r"\bno_such_module\.py\b", LAYOUT)
    assert not re.search(
        r"\bpipesim\.plot\.no_such_module\b", _docstring(ROOT / "pipesim/plot/__init__.py")
    )
    assert re.search(r"\bpipesim\.plot\.timeline\b", _docstring(ROOT / "pipesim/plot/__init__.py"))
