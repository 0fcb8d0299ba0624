"""``pipesim.__all__`` stays complete: every public name of a submodule the package
re-exports from is exported at the top level, and nothing else is public by accident."""

from __future__ import annotations
import __future__

import ast
import importlib
import subprocess
import sys
import types
from pathlib import Path

import pipesim

INIT = Path(pipesim.__file__)


def reexported_modules() -> list[str]:
    """The pipesim submodules that pipesim/__init__.py imports names from."""
    tree = ast.parse(INIT.read_text(encoding="utf-8"))
    return sorted(
        {
            node.module
            for node in ast.walk(tree)
            if isinstance(node, ast.ImportFrom)
            and node.module is not None
            and node.module.startswith("pipesim.")
        }
    )


def test_all_is_sorted_unique_and_resolves() -> None:
    names = pipesim.__all__
    assert len(set(names)) == len(names)
    assert names == sorted(names), "keep pipesim.__all__ sorted"
    for name in names:
        assert hasattr(pipesim, name), name


def test_every_reexported_submodule_is_complete() -> None:
    modules = reexported_modules()
    assert "pipesim.engine" in modules and "pipesim.graph" in modules
    missing = {}
    for module_name in modules:
        module = importlib.import_module(module_name)
        assert hasattr(module, "__all__"), f"{module_name} has no __all__"
        absent = [n for n in module.__all__ if n not in pipesim.__all__]
        if absent:
            missing[module_name] = absent
    assert not missing, f"add these to pipesim/__init__.py and its __all__: {missing}"


def test_top_level_names_are_the_submodules_objects() -> None:
    for module_name in reexported_modules():
        module = importlib.import_module(module_name)
        for name in module.__all__:
            assert getattr(pipesim, name) is getattr(module, name), (module_name, name)


def test_nothing_public_is_left_out_of_all() -> None:
    public = {
        name
        for name, value in vars(pipesim).items()
        if not name.startswith("_")
        and not isinstance(value, types.ModuleType | __future__._Feature)
    }
    assert public <= set(pipesim.__all__), sorted(public - set(pipesim.__all__))


def test_submodule_all_names_exist() -> None:
    import pkgutil

    for info in pkgutil.walk_packages(pipesim.__path__, prefix="pipesim."):
        module = importlib.import_module(info.name)
        for name in getattr(module, "__all__", ()):
            assert hasattr(module, name), (info.name, name)


def test_pipesim_never_imports_torch() -> None:
    # In a fresh interpreter: import every pipesim module, then look for torch.
    code = (
        "import pkgutil, importlib, sys, pipesim\n"
        "for i in pkgutil.walk_packages(pipesim.__path__, prefix='pipesim.'):\n"
        "    importlib.import_module(i.name)\n"
        "print(sorted(m for m in sys.modules if m == 'torch' or m.startswith('torch.')))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True
    )
    assert done.stdout.strip() == "[]"
