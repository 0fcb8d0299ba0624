"""The planner's registration point for schedules made from the costs.

A registered schedule family (:mod:`pipesim.schedules`) depends on the sizes
only; a *cost-aware* one is built for each configuration's stage costs and the
memory left on a device after weights, gradients and optimizer state (the
synthesized schedules of :mod:`pipesim.synth`). ``pipesim plan --schedules
auto`` sweeps every registered family plus every name registered here.

A builder is ``build(*, n_ranks, n_microbatches, virtual, costs,
memory_limit_bytes) -> Schedule``, named as ``"module:function"`` so the
planner's workers import it only when a point asks for it. A spec made for one
optimizer synchronization (``sync``, :mod:`pipesim.iterations`) gets it as the
builder's ``sync`` keyword; ``auto`` sweeps the specs of the plan's sync.

>>> cost_aware_names()
('synth', 'synth-pv', 'synth-none')
>>> cost_aware_names(sync="post-validation")
('synth-pv',)
>>> get_cost_aware("synth").virtual_values
(1,)
"""

from __future__ import annotations

import functools
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
    sync: str | None = None
    """The optimizer synchronization it is made for (passed to the builder as ``sync``);
    None: any, the builder takes no ``sync``."""

    def build(self) -> Callable[..., Schedule]:
        """The builder function (imported on first use)."""
        module, _, function = self.builder.partition(":")
        built: Callable[..., Schedule] = getattr(importlib.import_module(module), function)
        if self.sync is not None:
            return functools.partial(built, sync=self.sync)
        return built


_REGISTRY: dict[str, CostAwareSpec] = {}


def register_cost_aware(spec: CostAwareSpec, /) -> CostAwareSpec:
    """Add ``spec``; a name can be registered once."""
    if spec.name in _REGISTRY:
        raise ValueError(f"cost-aware schedule {spec.name!r} is registered twice")
    _REGISTRY[spec.name] = spec
    return spec


def cost_aware_names(*, sync: str | None = None) -> tuple[str, ...]:
    """Registered names, in registration order; with ``sync``, those made for it (or for
    any sync)."""
    return tuple(
        name
        for name, spec in _REGISTRY.items()
        if sync is None or spec.sync is None or spec.sync == sync
    )


def get_cost_aware(name: str, /) -> CostAwareSpec | None:
    """The spec of ``name``, or None for a plain registered schedule."""
    return _REGISTRY.get(name)


# One synthesized schedule per optimizer synchronization: each minimizes the
# steady-state period the plan ranks by (pipesim.synth.synthesize.for_planner).
for _name, _sync in (("synth", "global"), ("synth-pv", "post-validation"), ("synth-none", "none")):
    register_cost_aware(
        CostAwareSpec(
            name=_name,
            builder="pipesim.synth.synthesize:for_planner",
            virtual_values=(1,),
            sync=_sync,
        )
    )
