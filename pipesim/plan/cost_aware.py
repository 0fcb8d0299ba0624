"""The planner's registration point for schedules made from the costs.

A registered schedule family (:mod:`pipesim.schedules`) depends on the sizes
only; a *cost-aware* one is built for each configuration's stage costs and the
memory left on a device after weights, gradients and optimizer state (the
synthesized schedules of :mod:`pipesim.synth`). ``pipesim plan --schedules
auto`` sweeps every registered family plus every name registered here.

A builder is ``build(*, n_ranks, n_microbatches, virtual, costs,
memory_limit_bytes) -> Schedule``, named as ``"module:function"`` so the
planner's workers import it only when a point asks for it.

>>> cost_aware_names()
('synth',)
>>> get_cost_aware("synth").virtual_values
(1,)
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass

from pipesim.schedule import Schedule

__all__ = ["CostAwareSpec", "cost_aware_names", "get_cost_aware", "register_cost_aware"]


@dataclass(frozen=True, slots=True, kw_only=True)
class CostAwareSpec:
    """A schedule family built from each configuration's costs."""

    name: str
    builder: str
    """``"module:function"``; see the module docstring for its signature."""
    virtual_values: tuple[int, ...] = (1,)
    """Stages per rank it takes (looped placement)."""

    def build(self) -> Callable[..., Schedule]:
        """The builder function (imported on first use)."""
        module, _, function = self.builder.partition(":")
        built: Callable[..., Schedule] = getattr(importlib.import_module(module), function)
        return built


_REGISTRY: dict[str, CostAwareSpec] = {}


def register_cost_aware(spec: CostAwareSpec, /) -> CostAwareSpec:
    """Add ``spec``; a name can be registered once."""
    if spec.name in _REGISTRY:
        raise ValueError(f"cost-aware schedule {spec.name!r} is registered twice")
    _REGISTRY[spec.name] = spec
    return spec


def cost_aware_names() -> tuple[str, ...]:
    """Registered names, in registration order."""
    return tuple(_REGISTRY)


def get_cost_aware(name: str, /) -> CostAwareSpec | None:
    """The spec of ``name``, or None for a plain registered schedule."""
    return _REGISTRY.get(name)


register_cost_aware(
    CostAwareSpec(name="synth", builder="pipesim.synth.synthesize:for_planner", virtual_values=(1,))
)
