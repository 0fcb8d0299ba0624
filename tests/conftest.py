"""Shared settings for pipesim's test suite."""

from __future__ import annotations

from hypothesis import HealthCheck, settings

# Property tests run a few dozen SimPy simulations each; keep them modest and free of
# wall-clock deadlines (two shared CPU cores in CI). Tests that need more examples say so.
settings.register_profile(
    "pipesim",
    max_examples=40,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
settings.load_profile("pipesim")
