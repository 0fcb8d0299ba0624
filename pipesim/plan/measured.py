"""A cost file in the planner: its stages at any micro-batch size, in integer nanoseconds.

A cost file (``pipesim calibrate -o``, ``pipesim verify --costs-out``, or one
written by hand) gives per stage and op the time of one micro-batch of
``meta.microbatch_size`` rows (1 when the file does not say), the overheads
that block a rank (``link.send_overhead``, ``link.receive_overhead``,
``dispatch_overhead``) and the link latency, all in its ``time_unit``. The
planner prices a micro-batch of b rows with the one size rule of
:func:`pipesim.scaling.costs_at_microbatch_size`: affine in the rows, fitted
from the two sizes a file with ``meta.microbatch_scaling`` was measured at; a
file measured at one size prices that size only (there is no second point to
fit its fixed overhead from), and the sweep lists other sizes as refused.

A planner stage that groups several file stages takes their summed times and
bytes and the output of its last one. The link and the overheads are the
file's (the link the file was measured on joins ranks of one node; between
nodes, the accelerator's inter-node link with the file's per-message
overheads). A file without a link (a free one, the default) takes the
accelerator's intra-node link instead, as the planner does for a model given
by its shapes. So with one planner stage per file stage and one node, the
plan's pipeline time is what ``pipesim simulate --costs FILE`` gives for the
same schedule.

>>> from pipesim.costs import CostModel
>>> measured = MeasuredCosts(costs=CostModel.uniform(forward=6, backward=12),
...                          meta={"microbatch_size": 1, "microbatch_scaling": {
...                              "stage": {"forward": 8, "backward": 16}, "microbatch_size": 2}},
...                          ns_per_unit=Fraction(1))
>>> stage = measured.at(4, source="costs.json").stage(0)   # 4 + 2 * 4, 8 + 4 * 4
>>> stage.forward, stage.backward
(12, 24)
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from fractions import Fraction
from typing import Any

from pipesim.costs import CostModel, Link, StageCost, require_eager
from pipesim.exact import Time
from pipesim.scaling import costs_at_microbatch_size

__all__ = ["MeasuredCosts", "measured_stages"]


@dataclass(frozen=True, slots=True, kw_only=True)
class MeasuredCosts:
    """A cost file's model as written, for pricing other micro-batch sizes."""

    costs: CostModel
    """The file's stages, times in its own unit."""
    meta: Mapping[str, Any] = field(default_factory=dict, compare=False, hash=False)
    """The file's ``meta``: ``microbatch_size`` (rows per measured micro-batch) and any
    ``microbatch_scaling`` (:mod:`pipesim.scaling`)."""
    repeat: int = 1
    """How many times the file's stages repeat (``meta.n_layers`` of a one-entry file)."""
    ns_per_unit: Fraction
    """Nanoseconds per time unit of the file."""

    def at(self, microbatch_size: int, /, *, source: str) -> CostModel:
        """The file's model (stages repeated) at ``microbatch_size`` rows, in its own
        unit; a CostError names the sizes when the file cannot price this one."""
        costs = costs_at_microbatch_size(
            self.costs, dict(self.meta), microbatch_size, source=source
        )
        require_eager(costs, evaluator=f"pipesim plan (reading {source})")
        return replace(costs, stages=costs.stages * self.repeat)


def _ns(value: Time, ns_per_unit: Fraction) -> int:
    return round(Fraction(value) * ns_per_unit)


def _link_ns(link: Link, ns_per_unit: Fraction) -> Link:
    bandwidth = link.bandwidth_bytes_per_s  # bytes per file unit -> bytes per ns
    return Link(
        latency=_ns(link.latency, ns_per_unit),
        bandwidth_bytes_per_s=None if bandwidth is None else Fraction(bandwidth) / ns_per_unit,
        max_concurrent=link.max_concurrent,
        send_overhead=_ns(link.send_overhead, ns_per_unit),
        receive_overhead=_ns(link.receive_overhead, ns_per_unit),
    )


def measured_stages(
    measured: MeasuredCosts, sizes: Sequence[int], microbatch_size: int, /, *, source: str
) -> tuple[list[StageCost], Link | None, int]:
    """Planner stages of ``sizes`` file stages each at ``microbatch_size`` rows, in integer
    ns: the stages (``param_bytes`` left 0: the planner's static memory model sets it),
    the file's link in ns (None when the file's link is free: the accelerator's applies)
    and the dispatch overhead in ns."""
    costs = measured.at(microbatch_size, source=source)
    ns = measured.ns_per_unit
    stages: list[StageCost] = []
    start = 0
    for size in sizes:
        group = costs.stages[start : start + size]
        start += size

        def total(name: str, group: Sequence[StageCost] = group) -> int:
            return _ns(sum((Fraction(getattr(s, name)) for s in group), Fraction(0)), ns)

        overlaps = [s.overlap for s in group]
        overlap = None
        if all(o is not None for o in overlaps):
            overlap = _ns(sum((Fraction(o) for o in overlaps if o is not None), Fraction(0)), ns)
        stages.append(
            StageCost(
                forward=total("forward"),
                backward=total("backward"),
                input_grad=total("input_grad"),
                weight_grad=total("weight_grad"),
                overlap=overlap,
                activation_bytes=sum(s.activation_bytes for s in group),
                weight_grad_bytes=sum(s.weight_grad_bytes for s in group),
                output_bytes=group[-1].output_bytes,
            )
        )
    link = None if costs.link == Link() else _link_ns(costs.link, ns)
    return stages, link, _ns(costs.dispatch_overhead, ns)
