"""Cost models at other micro-batch sizes: a fixed overhead plus a cost per row.

Measured on the CPU (GPT, 6 blocks x 256 wide), a forward takes 3.6, 4.7, 6.8,
10.2, 18.2 and 33.1 ms for 1, 2, 4, 8, 16 and 32 rows per micro-batch: affine
in the rows (a fixed cost of launching the layer's kernels plus a cost per
row), not proportional. :class:`AffineCosts` fits ``t(b) = fixed + per_row * b``
to every time of two cost models measured at micro-batch sizes ``b1 != b2``
(compute per stage and op, link latency, send / receive / dispatch overheads)
and evaluates it at any size; byte counts that scale with the rows
(activations, messages) are proportional to ``b``, parameter bytes stay.

A cost file carries the fit in its ``meta``: ``microbatch_size`` (b1, the
size its own numbers were measured at) and ``microbatch_scaling``, the cost
model measured at b2 with its ``microbatch_size`` (:func:`scaling_meta`,
:func:`costs_at_microbatch_size`). The planner prices a cost file's micro-batch
sizes through it (:mod:`pipesim.plan.measured`).

>>> from pipesim.costs import CostModel
>>> small = CostModel.uniform(forward=6, backward=12, activation_bytes=100)
>>> large = CostModel.uniform(forward=10, backward=20, activation_bytes=200)
>>> fit = AffineCosts.fit(small, large, sizes=(4, 8))
>>> at16 = fit.at(16).stage(0)
>>> at16.forward, at16.backward, at16.activation_bytes   # 2 + 1 * 16, 4 + 2 * 16
(18, 36, 400)
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from fractions import Fraction
from typing import Any

from pipesim.costs import CostModel, Link, costs_from_dict, costs_to_dict
from pipesim.errors import CostError
from pipesim.exact import Time, whole_or_fraction

__all__ = ["AffineCosts", "costs_at_microbatch_size", "scaling_meta"]

_STAGE_TIMES = ("forward", "backward", "input_grad", "weight_grad")
_ROW_BYTES = ("activation_bytes", "weight_grad_bytes", "output_bytes")
_LINK_TIMES = ("latency", "send_overhead", "receive_overhead", "handshake")


@dataclass(frozen=True, slots=True, kw_only=True)
class AffineCosts:
    """Two cost models of one cut measured at two micro-batch sizes, as one affine model."""

    first: CostModel
    second: CostModel
    sizes: tuple[int, int]
    """Rows per micro-batch of ``first`` and ``second``."""

    def __post_init__(self) -> None:
        b1, b2 = self.sizes
        if b1 < 1 or b2 < 1 or b1 == b2:
            raise CostError(
                f"an affine fit needs two different micro-batch sizes >= 1, got {self.sizes}"
            )
        if len(self.first.stages) != len(self.second.stages):
            raise CostError(
                f"the two cost models describe {len(self.first.stages)} and "
                f"{len(self.second.stages)} stages; measure the same cut at both sizes"
            )

    @classmethod
    def fit(cls, first: CostModel, second: CostModel, /, *, sizes: tuple[int, int]) -> AffineCosts:
        """The affine model through ``first`` (at ``sizes[0]`` rows) and ``second``."""
        return cls(first=first, second=second, sizes=sizes)

    def _time(self, t1: Time, t2: Time, b: int) -> Time:
        b1, b2 = self.sizes
        per_row = Fraction(t2 - t1) / (b2 - b1)  # fixed overhead: t1 - per_row * b1
        value = t1 + per_row * (b - b1)
        # never negative below the sizes measured
        return whole_or_fraction(max(Fraction(value), Fraction(0)))

    def at(self, microbatch_size: int, /) -> CostModel:
        """The cost model at ``microbatch_size`` rows per micro-batch."""
        b = microbatch_size
        if isinstance(b, bool) or not isinstance(b, int) or b < 1:
            raise CostError(f"microbatch_size must be a whole number >= 1, got {b!r}")
        b1 = self.sizes[0]
        stages = []
        for one, two in zip(self.first.stages, self.second.stages, strict=True):
            times = {n: self._time(getattr(one, n), getattr(two, n), b) for n in _STAGE_TIMES}
            overlap = None
            if one.overlap is not None and two.overlap is not None:
                overlap = self._time(one.overlap, two.overlap, b)
            sizes = {n: round(Fraction(getattr(one, n) * b, b1)) for n in _ROW_BYTES}
            stages.append(replace(one, **times, **sizes, overlap=overlap))  # type: ignore[arg-type]
        l1, l2 = self.first.link, self.second.link
        link: Link = replace(
            l1,
            **{n: self._time(getattr(l1, n), getattr(l2, n), b) for n in _LINK_TIMES},  # type: ignore[arg-type]
        )
        return replace(
            self.first,
            stages=tuple(stages),
            link=link,
            dispatch_overhead=self._time(
                self.first.dispatch_overhead, self.second.dispatch_overhead, b
            ),
        )


def scaling_meta(second: CostModel, /, *, microbatch_size: int) -> dict[str, Any]:
    """The ``meta.microbatch_scaling`` entry of a cost file: ``second`` measured at
    ``microbatch_size`` rows, next to the file's own numbers."""
    data = costs_to_dict(second)
    data["microbatch_size"] = microbatch_size
    return data


def costs_at_microbatch_size(
    costs: CostModel, meta: dict[str, Any] | None, microbatch_size: int, /, *, source: str = "costs"
) -> CostModel:
    """``costs`` (a cost file's model, ``meta`` its meta) at ``microbatch_size`` rows.

    With ``meta.microbatch_scaling`` the affine fit through both measurements;
    without it, the file's own size must be the one asked for (there is no
    second point to fit an overhead from).
    """
    meta = meta or {}
    b1 = meta.get("microbatch_size")
    if not isinstance(b1, int) or isinstance(b1, bool) or b1 < 1:
        raise CostError(
            f"{source}: meta.microbatch_size (rows per measured micro-batch) is missing; "
            "pipesim calibrate writes it"
        )
    scaling = meta.get("microbatch_scaling")
    if scaling is None:
        if microbatch_size == b1:
            return costs
        raise CostError(
            f"{source}: measured at {b1} rows per micro-batch only; to price {microbatch_size} "
            "rows, calibrate at a second size (pipesim calibrate --microbatch-sizes B1,B2)"
        )
    if not isinstance(scaling, dict):
        raise CostError(f"{source}: meta.microbatch_scaling must be an object")
    second_raw = dict(scaling)
    b2 = second_raw.pop("microbatch_size", None)
    if not isinstance(b2, int) or isinstance(b2, bool):
        raise CostError(f"{source}: meta.microbatch_scaling.microbatch_size is missing")
    second = costs_from_dict(second_raw, source=f"{source}: meta.microbatch_scaling")
    return AffineCosts.fit(costs, second, sizes=(b1, b2)).at(microbatch_size)
