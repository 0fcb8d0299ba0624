"""Every docstring example in pipesim runs and prints what it says: a docstring's example
is documentation that cannot go stale."""

from __future__ import annotations

import doctest
import importlib
import pkgutil

import pytest
from helpers import run_doctests

import pipesim


def pipesim_modules() -> list[str]:
    names = ["pipesim"]
    for info in pkgutil.walk_packages(pipesim.__path__, prefix="pipesim."):
        names.append(info.name)
    return sorted(names)


MODULES = pipesim_modules()


def test_every_module_is_found() -> None:
    for name in ("pipesim.engine", "pipesim.graph", "pipesim.schedules.gpipe", "pipesim.cli"):
        assert name in MODULES


@pytest.mark.parametrize("name", MODULES)
def test_doctests(name: str) -> None:
    run_doctests(name)


def test_the_core_has_examples() -> None:
    finder = doctest.DocTestFinder(exclude_empty=True)
    counted = {
        name: sum(len(t.examples) for t in finder.find(importlib.import_module(name), name))
        for name in (
            "pipesim.actions",
            "pipesim.graph",
            "pipesim.engine",
            "pipesim.grid",
            "pipesim.exact",
            "pipesim.schedule_io",
            "pipesim.costs",
        )
    }
    assert all(counted.values()), counted
