"""verify's public surface: every docstring example runs, ``__all__`` is complete."""

from __future__ import annotations

import importlib
import pkgutil

import pytest
from helpers import run_doctests

pytest.importorskip("torch")

import verify

pytestmark = pytest.mark.torch

MODULES = sorted(
    ["verify", *(f"verify.{info.name}" for info in pkgutil.iter_modules(verify.__path__))]
)


# verify.dist's examples start rank processes: seconds, so slow
@pytest.mark.parametrize(
    "name", [pytest.param(m, marks=pytest.mark.slow) if m == "verify.dist" else m for m in MODULES]
)
def test_doctests(name: str) -> None:
    run_doctests(name)


def test_all_lists_every_public_name_of_the_modules() -> None:
    exported = set(verify.__all__)
    for name in MODULES[1:]:
        module = importlib.import_module(name)
        assert set(module.__all__) <= exported, f"{name} exports names verify does not"
    assert all(hasattr(verify, n) for n in exported)
