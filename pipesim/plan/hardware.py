"""Accelerators: peak compute, memory, links inside and between nodes.

Presets live in ``pipesim/data/accelerators.json``, every number beside its
public source; :func:`accelerator_from_dict` builds a custom one.

>>> h100 = get_accelerator("h100-sxm")
>>> h100.peak_flops, h100.memory_bytes, h100.gpus_per_node
(989000000000000.0, 85520809984, 8)
>>> h100.link(inter_node=False).bandwidth_bytes_per_s
450000000000.0
"""

from __future__ import annotations

from dataclasses import dataclass, fields, replace
from functools import cache
from pathlib import Path
from typing import Any

from pipesim.errors import CostError, ParseError, PlanError, UnknownNameError, brief
from pipesim.files import read_json, read_package_json
from pipesim.suggest import did_you_mean
from pipesim.units import parse_bytes

__all__ = [
    "Accelerator",
    "Interconnect",
    "accelerator_from_dict",
    "accelerator_names",
    "get_accelerator",
    "load_accelerator",
]


@dataclass(frozen=True, slots=True, kw_only=True)
class Interconnect:
    """A point-to-point path between two devices: latency + bytes / bandwidth."""

    latency_s: float
    """Seconds from send to arrival of an empty message."""
    bandwidth_bytes_per_s: float
    """Bytes per second, one direction."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Accelerator:
    """One kind of device and the node it sits in."""

    name: str
    peak_flops: float
    """Peak dense bf16 FLOP/s (no sparsity)."""
    memory_bytes: int
    """Device memory capacity: bytes, or a size with a unit (``"80GiB"``,
    :func:`pipesim.units.parse_bytes`)."""
    gpus_per_node: int
    """Devices per node, joined by the intra-node link."""
    intra_node_latency: float
    """Seconds, intra-node link (NVLink)."""
    intra_node_bandwidth: float
    """Bytes per second per direction, intra-node link."""
    inter_node_latency: float
    """Seconds, inter-node link (InfiniBand / Ethernet)."""
    inter_node_bandwidth: float
    """Bytes per second per direction per device, inter-node link."""
    efficiency: float
    """Share of peak FLOP/s that real training kernels achieve (0 < e <= 1)."""
    memory_bandwidth: float | None = None
    """Device memory (HBM) bytes per second, for the optimizer step; None: unknown
    (the step is then not timed)."""
    description: str = ""

    def __post_init__(self) -> None:
        for name in ("peak_flops", "intra_node_bandwidth", "inter_node_bandwidth"):
            _check_number(name, getattr(self, name), positive=True)
        for name in ("intra_node_latency", "inter_node_latency"):
            _check_number(name, getattr(self, name), positive=False)
        try:
            memory = parse_bytes(self.memory_bytes, name="memory_bytes", minimum=1)
        except CostError as exc:
            raise PlanError(str(exc)) from None
        object.__setattr__(self, "memory_bytes", memory)
        if (
            isinstance(self.gpus_per_node, bool)
            or not isinstance(self.gpus_per_node, int)
            or (self.gpus_per_node < 1)
        ):
            raise PlanError(
                f"gpus_per_node must be a whole number >= 1, got {brief(self.gpus_per_node)}"
            )
        if self.memory_bandwidth is not None:
            _check_number("memory_bandwidth", self.memory_bandwidth, positive=True)
        _check_number("efficiency", self.efficiency, positive=True)
        if self.efficiency > 1:
            raise PlanError(
                f"efficiency is the achieved share of peak, between 0 and 1, got {self.efficiency}"
            )

    @property
    def achieved_flops(self) -> float:
        """``peak_flops * efficiency``: the FLOP/s the planner assumes."""
        return self.peak_flops * self.efficiency

    def link(self, *, inter_node: bool) -> Interconnect:
        """The intra-node or inter-node path."""
        if inter_node:
            return Interconnect(
                latency_s=self.inter_node_latency, bandwidth_bytes_per_s=self.inter_node_bandwidth
            )
        return Interconnect(
            latency_s=self.intra_node_latency, bandwidth_bytes_per_s=self.intra_node_bandwidth
        )

    def with_memory(self, memory_bytes: int, /) -> Accelerator:
        """The same device with another memory capacity."""
        return replace(self, memory_bytes=memory_bytes)

    def to_dict(self) -> dict[str, Any]:
        """The JSON form (as :func:`accelerator_from_dict` reads it)."""
        return {f.name: getattr(self, f.name) for f in fields(self)}


def _check_number(name: str, value: object, *, positive: bool) -> None:
    # Values beyond a float (1e308) are refused too: the planner computes in floats.
    ok = not isinstance(value, bool) and isinstance(value, int | float) and abs(value) < 1e300
    if not ok or value < 0 or (positive and value == 0):  # type: ignore[operator]
        bound = "positive" if positive else "non-negative"
        raise PlanError(f"accelerator {name} must be a {bound} finite number, got {brief(value)}")


_FIELDS = {f.name for f in fields(Accelerator)}


def accelerator_from_dict(data: object, /, *, source: str = "accelerator") -> Accelerator:
    """An Accelerator from a JSON object of its fields (``*_source`` keys ignored)."""
    if not isinstance(data, dict):
        raise ParseError(f"{source}: expected a JSON object of accelerator fields")
    values = {k: v for k, v in data.items() if not k.endswith("_source") and k != "source"}
    values.setdefault("name", "custom")
    unknown = sorted(set(values) - _FIELDS)
    if unknown:
        raise ParseError(
            f"{source}: unknown accelerator fields {unknown}; valid fields are {sorted(_FIELDS)}"
        )
    missing = sorted(
        f.name
        for f in fields(Accelerator)
        if f.name not in values and f.name not in ("description", "memory_bandwidth")
    )
    if missing:
        raise ParseError(f"{source}: missing accelerator fields {missing}")
    try:
        return Accelerator(**values)
    except PlanError as exc:
        raise PlanError(f"{source}: {exc}") from None


@cache
def _presets() -> dict[str, Accelerator]:
    raw = read_package_json("accelerators.json")["accelerators"]
    return {
        name: accelerator_from_dict({**entry, "name": name}, source=f"accelerators.json: {name}")
        for name, entry in raw.items()
    }


def accelerator_names() -> tuple[str, ...]:
    """Names of the built-in accelerator presets.

    >>> "a100-80gb" in accelerator_names()
    True
    """
    return tuple(_presets())


def get_accelerator(name: str, /) -> Accelerator:
    """The preset ``name``; UnknownNameError listing the presets otherwise."""
    try:
        return _presets()[name]
    except KeyError:
        raise UnknownNameError(
            f"unknown accelerator {name!r}{did_you_mean(name, accelerator_names())}; "
            f"presets are: {', '.join(accelerator_names())} "
            "(or give an accelerator JSON file)"
        ) from None


def load_accelerator(path: str | Path, /) -> Accelerator:
    """Read an Accelerator from a JSON file of its fields."""
    return accelerator_from_dict(read_json(path, what="accelerator"), source=str(path))
