"""Collective communication times: ring all-reduce, reduce-scatter and all-gather.

Bandwidth-optimal ring algorithms (Patarasuk and Yuan, "Bandwidth optimal
all-reduce algorithms for clusters of workstations", JPDC 2009; Thakur et al.,
"Optimization of Collective Communication Operations in MPICH", IJHPCA 2005):
over ``n`` devices, a reduce-scatter or an all-gather of ``B`` bytes (the full
buffer on each device) takes ``n - 1`` steps of ``B / n`` bytes, so
``(n-1)/n * B / bandwidth + (n-1) * latency``; an all-reduce is one of each,
twice that. Exact (Fractions of seconds) when the inputs are.

An all-to-all (the token dispatch and combine of expert parallelism) sends each
device's buffer in ``n`` equal parts, one to every member, all at once: its time is
the bytes on the busiest path. Members in the same node take NVLink, the rest the
device's own network port, and the two run side by side, so the time is the larger
of the two paths' bytes over their bandwidths (plus one latency). With node-limited
routing (DeepSeek-V3 report, section 3.2.2) a token crosses the network once per
destination node, not once per expert, and is forwarded inside that node over NVLink.

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

__all__ = ["all_gather_s", "all_to_all_s", "allreduce_s", "reduce_scatter_s"]

Amount = int | Fraction


def _fraction(value: float) -> Fraction:
    return Fraction(repr(value)) if isinstance(value, float) else Fraction(value)


def reduce_scatter_s(n_bytes: Amount, /, *, n_devices: int, link: Interconnect) -> Fraction:
    """Seconds for a ring reduce-scatter of ``n_bytes`` over ``n_devices`` (0 for one)."""
    n = n_devices
    if n <= 1 or n_bytes == 0:
        return Fraction(0)
    steps = n - 1
    # the bus bandwidth NCCL reaches for a buffer of this size (nccl-tests' busbw)
    return Fraction(steps, n) * Fraction(n_bytes) / _fraction(
        link.bandwidth_at(float(n_bytes))
    ) + steps * _fraction(link.latency_s)


def all_gather_s(n_bytes: Amount, /, *, n_devices: int, link: Interconnect) -> Fraction:
    """Seconds for a ring all-gather: the same steps as :func:`reduce_scatter_s`."""
    return reduce_scatter_s(n_bytes, n_devices=n_devices, link=link)


def allreduce_s(n_bytes: Amount, /, *, n_devices: int, link: Interconnect) -> Fraction:
    """Seconds for a ring all-reduce: a reduce-scatter then an all-gather."""
    return 2 * reduce_scatter_s(n_bytes, n_devices=n_devices, link=link)


def all_to_all_s(
    n_bytes: Amount,
    /,
    *,
    n_devices: int,
    per_node: int,
    intra: Interconnect,
    inter: Interconnect,
    fanout: int = 1,
    node_limit: int | None = None,
) -> Fraction:
    """Seconds for an all-to-all in which each of ``n_devices`` devices sends ``n_bytes``
    spread evenly over the group, ``per_node`` members to a node.

    ``fanout``: copies of each token in ``n_bytes`` (top-k routing); with ``node_limit``
    M a token crosses the network once for each of its at most M nodes other than its
    own, then NVLink carries its copies inside the node (DeepSeek-V3's dispatch).

    >>> from pipesim.plan.hardware import Interconnect
    >>> nv = Interconnect(latency_s=0.0, bandwidth_bytes_per_s=100.0)
    >>> ib = Interconnect(latency_s=0.0, bandwidth_bytes_per_s=10.0)
    >>> all_to_all_s(800, n_devices=8, per_node=8, intra=nv, inter=ib)  # 7/8 over NVLink
    Fraction(7, 1)
    >>> all_to_all_s(800, n_devices=16, per_node=8, intra=nv, inter=ib)  # half over IB
    Fraction(40, 1)
    >>> # 8 copies of 100 bytes of tokens, on both nodes: 100 bytes cross once, not 400
    >>> all_to_all_s(800, n_devices=16, per_node=8, intra=nv, inter=ib, fanout=8, node_limit=2)
    Fraction(10, 1)
    """
    n, g = n_devices, min(per_node, n_devices)
    if n <= 1 or n_bytes == 0:
        return Fraction(0)
    nodes = -(-n // g)
    size = Fraction(n_bytes)
    if nodes == 1:
        return Fraction(n - 1, n) * size / _fraction(intra.bandwidth_at(float(size))) + _fraction(
            intra.latency_s
        )
    if node_limit is None:
        across = size * (n - g) / n
        inside = size * (g - 1) / n
    else:  # once per remote destination node; copies fanned out inside the node
        reached = min(node_limit, nodes, fanout)
        across = size / fanout * reached * Fraction(nodes - 1, nodes)
        inside = size * Fraction(g - 1, g)
    nvlink = inside / _fraction(intra.bandwidth_at(float(inside))) if inside else Fraction(0)
    network = across / _fraction(inter.bandwidth_at(float(across)))
    return max(nvlink, network) + _fraction(max(intra.latency_s, inter.latency_s))
