"""Collective communication times: ring all-reduce, reduce-scatter and all-gather.

Bandwidth-optimal ring algorithms (Patarasuk and Yuan, "Bandwidth optimal
all-reduce algorithms for clusters of workstations", JPDC 2009; Thakur et al.,
"Optimization of Collective Communication Operations in MPICH", IJHPCA 2005):
over ``n`` devices, a reduce-scatter or an all-gather of ``B`` bytes (the full
buffer on each device) takes ``n - 1`` steps of ``B / n`` bytes, so
``(n-1)/n * B / bandwidth + (n-1) * latency``; an all-reduce is one of each,
twice that. Exact (Fractions of seconds) when the inputs are.

>>> from pipesim.plan.hardware import Interconnect
>>> link = Interconnect(latency_s=0.0, bandwidth_bytes_per_s=100.0)
>>> allreduce_s(400, n_devices=4, link=link)
Fraction(6, 1)
>>> reduce_scatter_s(400, n_devices=4, link=link) == all_gather_s(400, n_devices=4, link=link) == 3
True
"""

from __future__ import annotations

from fractions import Fraction

from pipesim.plan.hardware import Interconnect

__all__ = ["all_gather_s", "allreduce_s", "reduce_scatter_s"]

Amount = int | Fraction


def _exact(value: float) -> Fraction:
    return Fraction(repr(value)) if isinstance(value, float) else Fraction(value)


def reduce_scatter_s(n_bytes: Amount, /, *, n_devices: int, link: Interconnect) -> Fraction:
    """Seconds for a ring reduce-scatter of ``n_bytes`` over ``n_devices`` (0 for one)."""
    n = n_devices
    if n <= 1 or n_bytes == 0:
        return Fraction(0)
    steps = n - 1
    # the bus bandwidth NCCL reaches for a buffer of this size (nccl-tests' busbw)
    return Fraction(steps, n) * Fraction(n_bytes) / _exact(
        link.bandwidth_at(float(n_bytes))
    ) + steps * _exact(link.latency_s)


def all_gather_s(n_bytes: Amount, /, *, n_devices: int, link: Interconnect) -> Fraction:
    """Seconds for a ring all-gather: the same steps as :func:`reduce_scatter_s`."""
    return reduce_scatter_s(n_bytes, n_devices=n_devices, link=link)


def allreduce_s(n_bytes: Amount, /, *, n_devices: int, link: Interconnect) -> Fraction:
    """Seconds for a ring all-reduce: a reduce-scatter then an all-gather."""
    return 2 * reduce_scatter_s(n_bytes, n_devices=n_devices, link=link)
