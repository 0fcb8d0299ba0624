"""Shared fixtures and settings for pipesim's test suite."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings

# Property tests run a few dozen SimPy simulations each; keep them modest and
# free of wall-clock deadlines (two shared CPU cores in CI).
settings.register_profile(
    "pipesim",
    max_examples=40,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
settings.load_profile("pipesim")

REPO_ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture
def repo_root() -> Path:
    """The repository root (holds pyproject.toml, notebooks/, pipesim/)."""
    return REPO_ROOT
