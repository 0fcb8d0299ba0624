"""Accelerators: peak compute, memory, links inside and between nodes.

Presets live in ``pipesim/data/accelerators.json``, every number beside its
public source; :func:`accelerator_from_dict` builds a custom one.

>>> h100 = get_accelerator("h100-sxm")
>>> h100.peak_flops, h100.memory_bytes, h100.gpus_per_node
(989000000000000.0, 85520809984, 8)
>>> h100.intra_node_bandwidth   # NVLink 4, per direction (the datasheet's 900 GB/s total)
450000000000.0
>>> link = h100.link(inter_node=False)   # at NCCL's measured bus bandwidth
>>> link.bandwidth_bytes_per_s == 450e9 * h100.intra_node_efficiency
True
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass, fields, replace
from functools import cache
from pathlib import Path
from typing import Any

from pipesim.errors import CostError, ParseError, PlanError, UnknownNameError, brief
from pipesim.files import read_json, read_package_json
from pipesim.plan.gemm_table import gemm_table, gemm_table_names
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
    """Bytes per second, one direction (for collectives: the largest bus bandwidth)."""
    size_curve: tuple[tuple[float, float], ...] = ()
    """Measured ``(buffer bytes, share of bandwidth_bytes_per_s)`` points of a
    collective's bus bandwidth against its buffer size, ascending; empty: flat."""

    def bandwidth_at(self, n_bytes: float, /) -> float:
        """The bus bandwidth a collective of an ``n_bytes`` buffer reaches: the size curve
        interpolated in log size (flat past its ends), times the largest.

        >>> link = Interconnect(latency_s=0, bandwidth_bytes_per_s=100.0,
        ...                     size_curve=((2**20, 0.1), (2**30, 1.0)))
        >>> [round(link.bandwidth_at(n), 6) for n in (2**25, 2**40, 1)]
        [55.0, 100.0, 10.0]
        """
        curve = self.size_curve
        if not curve or n_bytes >= curve[-1][0]:
            share = curve[-1][1] if curve else 1.0
        elif n_bytes <= curve[0][0]:
            share = curve[0][1]
        else:
            x = math.log(n_bytes)
            for (a, sa), (b, sb) in itertools.pairwise(curve):
                if n_bytes <= b:
                    share = sa + (sb - sa) * (x - math.log(a)) / (math.log(b) - math.log(a))
                    break
        return self.bandwidth_bytes_per_s * share


@dataclass(frozen=True, slots=True, kw_only=True)
class Accelerator:
    """One kind of device and the node it sits in: what :mod:`pipesim.plan.gpu` prices
    a layer's kernels with."""

    name: str
    peak_flops: float
    """Peak dense bf16 / fp16 tensor-core FLOP/s (no sparsity)."""
    memory_bytes: int
    """Device memory capacity: bytes, or a size with a unit (``"80GiB"``,
    :func:`pipesim.units.parse_bytes`)."""
    gpus_per_node: int
    """Devices per node, joined by the intra-node link."""
    intra_node_latency: float
    """Seconds, intra-node link (NVLink)."""
    intra_node_bandwidth: float
    """Bytes per second per direction, intra-node link (the datasheet's figure)."""
    inter_node_latency: float
    """Seconds, inter-node link (InfiniBand / Ethernet)."""
    inter_node_bandwidth: float
    """Bytes per second per direction per device, inter-node link (the datasheet's)."""
    memory_bandwidth: float
    """Device memory (HBM) bytes per second (the datasheet's figure)."""
    matmul_efficiency: float
    """Share of ``peak_flops`` the best-shaped large GEMM reaches, measured (0 < e <= 1)."""
    attention_forward_efficiency: float
    """Share of ``peak_flops`` a fused (flash) attention forward reaches, measured."""
    attention_backward_efficiency: float
    """The same for its backward."""
    memory_efficiency: float
    """Share of ``memory_bandwidth`` a streaming kernel reaches, measured."""
    intra_node_efficiency: float
    """NCCL's largest measured bus bandwidth inside a node over ``intra_node_bandwidth``."""
    inter_node_efficiency: float
    """NCCL bus bandwidth between nodes over ``inter_node_bandwidth``, measured."""
    intra_node_size_curve: tuple[tuple[float, float], ...] = ()
    """Measured all-reduce bus bandwidth inside a node against buffer bytes, as shares of
    its largest: ``((bytes, share), ...)`` ascending (empty: flat)."""
    fp8_peak_flops: float | None = None
    """Peak dense FP8 tensor-core FLOP/s; None: no FP8 tensor cores."""
    fp8_matmul_efficiency: float | None = None
    """Share of ``fp8_peak_flops`` the best FP8 GEMM reaches, measured; None: as bf16's."""
    sm_count: int | None = None
    """Streaming multiprocessors (GEMM wave quantization); None: not modeled."""
    gemm_table: str | None = None
    """A table of GEMM rates measured by shape (``pipesim/data/gemm_tables.json``,
    :mod:`pipesim.plan.gemm_table`) for its bf16 / fp16 GEMMs; None: the GEMMs run at
    ``matmul_efficiency`` of the peak less their tile and wave losses."""
    sustained_matmul_flops: float | None = None
    """The highest bf16 / fp16 GEMM rate held at the power limit once the clock has
    settled, measured (FLOP/s); it caps every such GEMM's rate, a table's or the
    achievable one (both measured in short bursts on an idle GPU). None: no cap."""
    fp8_sustained_matmul_flops: float | None = None
    """The same for FP8 GEMMs: the highest FP8 GEMM rate held at the power limit,
    measured (FLOP/s); it caps every FP8 GEMM's rate. None: no cap."""
    description: str = ""

    def __post_init__(self) -> None:
        for name in (
            "peak_flops",
            "intra_node_bandwidth",
            "inter_node_bandwidth",
            "memory_bandwidth",
        ):
            _check_number(name, getattr(self, name), positive=True)
        for name in ("intra_node_latency", "inter_node_latency"):
            _check_number(name, getattr(self, name), positive=False)
        try:
            memory = parse_bytes(self.memory_bytes, name="memory_bytes", minimum=1)
        except CostError as exc:
            raise PlanError(str(exc)) from None
        object.__setattr__(self, "memory_bytes", memory)
        for name in ("gpus_per_node", "sm_count"):
            value = getattr(self, name)
            if value is None and name == "sm_count":
                continue
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise PlanError(f"{name} must be a whole number >= 1, got {brief(value)}")
        for name in ("fp8_peak_flops", "sustained_matmul_flops", "fp8_sustained_matmul_flops"):
            if getattr(self, name) is not None:
                _check_number(name, getattr(self, name), positive=True)
        self._check_sustained_rates()
        if self.gemm_table is not None:
            if not isinstance(self.gemm_table, str):
                raise PlanError(
                    f"gemm_table must be the name of a measured GEMM table, got "
                    f"{brief(self.gemm_table)}; names are: {', '.join(gemm_table_names())}"
                )
            try:
                gemm_table(self.gemm_table)
            except UnknownNameError as exc:
                raise PlanError(str(exc)) from None
        object.__setattr__(self, "intra_node_size_curve", _size_curve(self.intra_node_size_curve))
        shares = [
            *EFFICIENCIES,
            *(["fp8_matmul_efficiency"] if self.fp8_matmul_efficiency is not None else []),
        ]
        for name in shares:
            _check_number(name, getattr(self, name), positive=True)
            if getattr(self, name) > 1:
                raise PlanError(
                    f"{name} is a measured share of a peak, between 0 and 1, got "
                    f"{brief(getattr(self, name))}"
                )

    def _check_sustained_rates(self) -> None:
        """A sustained rate is measured under its peak, and FP8's needs an FP8 peak."""
        pairs = (
            ("sustained_matmul_flops", "peak_flops"),
            ("fp8_sustained_matmul_flops", "fp8_peak_flops"),
        )
        for name, peak_name in pairs:
            rate, peak = getattr(self, name), getattr(self, peak_name)
            if rate is None:
                continue
            if peak is None:
                raise PlanError(f"{name} is set but {peak_name} is not; set both or neither")
            if rate > peak:
                raise PlanError(
                    f"{name} is {rate:.4g} FLOP/s, above {peak_name} {peak:.4g}: a rate "
                    f"sustained at the power limit is measured under the peak (the H200's "
                    f"708.5e12 of 989e12); measure it or leave it out"
                )

    @property
    def achieved_memory_bandwidth(self) -> float:
        """``memory_bandwidth * memory_efficiency``: what streaming kernels get."""
        return self.memory_bandwidth * self.memory_efficiency

    @property
    def fp8_matmul_share(self) -> float:
        """The achievable share of the FP8 peak (bf16's when not measured apart)."""
        if self.fp8_matmul_efficiency is None:
            return self.matmul_efficiency
        return self.fp8_matmul_efficiency

    @property
    def fp8_flops(self) -> float:
        """The FP8 peak; PlanError naming the accelerator when it has none."""
        if self.fp8_peak_flops is None:
            raise PlanError(
                f"accelerator {self.name} has no FP8 tensor cores (fp8_peak_flops is not set); "
                "train in bf16 or fp16 on it, or pick a Hopper or Blackwell accelerator"
            )
        return self.fp8_peak_flops

    def link(self, *, inter_node: bool) -> Interconnect:
        """The intra-node or inter-node path at the bandwidth NCCL measures on it (the
        datasheet's times the measured efficiency): collectives and pipeline sends alike."""
        if inter_node:
            return Interconnect(
                latency_s=self.inter_node_latency,
                bandwidth_bytes_per_s=self.inter_node_bandwidth * self.inter_node_efficiency,
            )
        return Interconnect(
            latency_s=self.intra_node_latency,
            bandwidth_bytes_per_s=self.intra_node_bandwidth * self.intra_node_efficiency,
            size_curve=self.intra_node_size_curve,
        )

    def group_link(self, span: int, /, *, apart: int = 1) -> Interconnect:
        """The link a group of devices uses whose members lie within ``span`` consecutive
        devices, ``apart`` apart (a group of t, or one whose members are t apart across
        t c or t d devices, in Megatron-Core's tp-cp-dp-pp order): inside a node when
        those devices fill whole parts of one node, between nodes otherwise.

        Between nodes a ring's bus bandwidth is that of every NIC its members in one node
        drive, at most the NVLink ring's: NCCL opens several channels whose rings leave
        the node at different GPUs, so each member's own NIC carries a share
        (stas00/ml-engineering, ``network/README.md``, "Inter-node speed depends on
        intra-node speed": an all-reduce over 4 nodes of 8 B200 with 8 x 50 GBps NICs
        each reaches 377 GBps busbw at 4 GiB, against 400 for all 8 NICs, not 50).

        >>> from pipesim.plan.hardware import get_accelerator
        >>> h100 = get_accelerator("h100-sxm")
        >>> nic = h100.link(inter_node=True).bandwidth_bytes_per_s
        >>> h100.group_link(64, apart=8).bandwidth_bytes_per_s == nic   # one GPU a node
        True
        >>> h100.group_link(64, apart=4).bandwidth_bytes_per_s == 2 * nic
        True
        """
        g = self.gpus_per_node
        if span <= g and g % span == 0:
            return self.link(inter_node=False)
        ring = self.link(inter_node=True)
        per_node = g // apart if apart < g and g % apart == 0 else 1
        if per_node == 1:
            return ring
        nvlink = self.link(inter_node=False).bandwidth_bytes_per_s
        return replace(
            ring, bandwidth_bytes_per_s=min(per_node * ring.bandwidth_bytes_per_s, nvlink)
        )

    def with_memory(self, memory_bytes: int, /) -> Accelerator:
        """The same device with another memory capacity."""
        return replace(self, memory_bytes=memory_bytes)

    def to_dict(self) -> dict[str, Any]:
        """The JSON form (as :func:`accelerator_from_dict` reads it)."""
        return {f.name: getattr(self, f.name) for f in fields(self)}


def _size_curve(points: object) -> tuple[tuple[float, float], ...]:
    """``points`` as ascending ``(bytes, share)`` pairs; PlanError naming what is wrong."""
    try:
        curve = tuple((float(size), float(share)) for size, share in points)  # type: ignore[attr-defined]
    except (TypeError, ValueError):
        raise PlanError(
            f"intra_node_size_curve must be a list of [bytes, share] pairs, got {brief(points)}"
        ) from None
    sizes = [size for size, _ in curve]
    if sizes != sorted(set(sizes)) or not all(0 < s < math.inf for s in sizes):
        raise PlanError(
            f"intra_node_size_curve sizes must be positive, finite and strictly ascending "
            f"bytes, got {brief(sizes)}; list the points smallest buffer first"
        )
    shares = [share for _, share in curve]
    if not all(0 < share <= 1 for share in shares):
        raise PlanError(
            f"intra_node_size_curve shares must be between 0 and 1 (a share of the largest "
            f"bus bandwidth), got {brief(shares)}"
        )
    return curve


def _check_number(name: str, value: object, *, positive: bool) -> None:
    # Values beyond a float (1e308) are refused too: the planner computes in floats.
    ok = not isinstance(value, bool) and isinstance(value, int | float) and abs(value) < 1e300
    if not ok or value < 0 or (positive and value == 0):  # type: ignore[operator]
        bound = "positive" if positive else "non-negative"
        raise PlanError(f"accelerator {name} must be a {bound} finite number, got {brief(value)}")


#: The measured shares of a peak an accelerator names, each between 0 and 1.
EFFICIENCIES = (
    "matmul_efficiency",
    "attention_forward_efficiency",
    "attention_backward_efficiency",
    "memory_efficiency",
    "intra_node_efficiency",
    "inter_node_efficiency",
)

_FIELDS = {f.name for f in fields(Accelerator)}
_OPTIONAL = {
    "description",
    "fp8_peak_flops",
    "fp8_matmul_efficiency",
    "sm_count",
    "intra_node_size_curve",
    "gemm_table",
    "sustained_matmul_flops",
    "fp8_sustained_matmul_flops",
}


def accelerator_from_dict(data: object, /, *, source: str = "accelerator") -> Accelerator:
    """An Accelerator from a JSON object of its fields (``*_source`` keys ignored)."""
    if not isinstance(data, dict):
        raise ParseError(f"{source}: expected a JSON object of accelerator fields")
    values = {k: v for k, v in data.items() if not k.endswith("_source") and k != "source"}
    values.setdefault("name", "custom")
    if "efficiency" in values:
        raise ParseError(
            f"{source}: 'efficiency' (one share of peak for all work) is gone: the planner "
            "prices each kernel, so give the measured shares instead: "
            + ", ".join(EFFICIENCIES)
            + " (see pipesim/data/accelerators.json for each one's meaning and sources)"
        )
    unknown = sorted(set(values) - _FIELDS)
    if unknown:
        raise ParseError(
            f"{source}: unknown accelerator fields {unknown}; valid fields are {sorted(_FIELDS)}"
        )
    missing = sorted(
        f.name for f in fields(Accelerator) if f.name not in values and f.name not in _OPTIONAL
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
