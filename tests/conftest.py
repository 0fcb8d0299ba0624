"""Shared settings for pipesim's test suite."""

from __future__ import annotations

import os

from hypothesis import HealthCheck, settings

# torch's OpenMP threads (libgomp) spin between parallel regions by default; with two
# xdist workers, each rank process and each notebook kernel running two of them on two
# shared cores, the spinning takes the cores the other processes need (the torch tests:
# 118 -> 78 CPU s). PASSIVE makes an idle thread sleep instead: the same thread count,
# kernels and bits. Set before any test module imports torch (libgomp reads it as it
# loads), so the rank processes, kernels and torchrun children inherit it.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

# Property tests run a few dozen SimPy simulations each; keep them modest and free of
# wall-clock deadlines (two shared CPU cores in CI). Tests that need more examples say so.
settings.register_profile(
    "pipesim",
    max_examples=40,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
settings.load_profile("pipesim")
