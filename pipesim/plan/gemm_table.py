"""A GEMM's achieved rate from a table measured by shape.

Where an accelerator names a ``gemm_table`` (``pipesim/data/gemm_tables.json``, each
table with its public source), :func:`pipesim.plan.gpu.gemm_seconds` prices a GEMM at
the rate that table measured for its shape instead of one achievable rate for every
shape. A table is a grid: batch ``b`` and the three sides ``m``, ``n``, ``k`` each on a
few powers of two (OpenXLA's H100 table: ``b`` 1, 2, 4; sides 256 to 4096). A GEMM is
mapped onto the grid by three rules, each a way of running it that cannot be slower
than the GEMM itself is run by cuBLAS, so the rate it gives is a floor:

- a side ``m`` or ``n`` longer than the grid's longest is cut into equal pieces no
  longer than it, and the pieces join the batch: the same output tiles spread over the
  same SMs (a batch past the grid's largest takes that largest batch's rate, as running
  it as several batched GEMMs would);
- a contraction ``k`` longer than the grid's longest runs as that many back-to-back
  GEMMs accumulating into one output, so at the rate of the longest ``k``;
- a side shorter than the grid's shortest costs what the shortest one costs (a small
  GEMM is bound by its fixed costs, not its FLOPs).

Between grid points the rate is interpolated multilinearly in the logarithms of
``b``, ``m``, ``n``, ``k`` and of the rate (the grid doubles each side, and rates grow
about evenly per doubling). Tile quantization off the grid's powers of two is not
modeled beyond what the grid itself shows.

>>> table = GemmTable(name="toy", grid=(1, 2), sides=(2, 4),
...                   rates={(b, m, n, k): 10.0 * b * m for b in (1, 2) for m in (2, 4)
...                          for n in (2, 4) for k in (2, 4)})
>>> round(table.rate(4, 4, 4), 9)       # on the grid
40.0
>>> round(table.rate(8, 4, 4), 9)       # 8 rows: two pieces of 4, a batch of 2
80.0
>>> round(table.rate(4, 4, 8), 9)       # k of 8: two GEMMs of k 4 back to back
40.0
>>> round(table.rate(1, 4, 4), 9)       # m of 1 costs what m of 2 costs: half the rate
10.0
>>> round(table.rate(2 * 2**0.5, 4, 4), 6)   # halfway between 2 and 4 in log: 20 and 40
28.284271
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass
from functools import cache

from pipesim.errors import PlanError, UnknownNameError
from pipesim.files import read_package_json
from pipesim.suggest import did_you_mean

__all__ = ["GemmTable", "gemm_table", "gemm_table_names"]


@dataclass(frozen=True, slots=True, kw_only=True)
class GemmTable:
    """Measured FLOP/s of ``(m x k) @ (k x n)`` GEMMs, ``b`` at once, on a grid."""

    name: str
    grid: tuple[int, ...]
    """The batch sizes measured, ascending."""
    sides: tuple[int, ...]
    """The lengths measured for each of ``m``, ``n`` and ``k``, ascending."""
    rates: dict[tuple[int, int, int, int], float]
    """``(b, m, n, k)`` -> FLOP/s, one for every point of the grid."""

    def rate(self, m: int, n: int, k: int, *, batch: int = 1) -> float:
        """FLOP/s of ``batch`` GEMMs ``(m, n, k)`` by the rules of the module docstring."""
        longest, shortest = self.sides[-1], self.sides[0]
        pieces_m, pieces_n = math.ceil(m / longest), math.ceil(n / longest)
        b = batch * pieces_m * pieces_n
        sides = (m / pieces_m, n / pieces_n, min(k, longest))
        padded = [max(side, shortest) for side in sides]
        # a short side costs the shortest's time: the rate falls by the FLOPs it lacks
        shortfall = math.prod(sides) / math.prod(padded)
        log_rate = 0.0
        bm, bn, bk = (_bracket(side, self.sides) for side in padded)
        for (pb, wb), (pm, wm), (pn, wn), (pk, wk) in itertools.product(
            _bracket(b, self.grid), bm, bn, bk
        ):
            weight = wb * wm * wn * wk
            if weight:
                log_rate += weight * math.log(self.rates[(pb, pm, pn, pk)])
        return math.exp(log_rate) * shortfall


def _bracket(x: float, points: tuple[int, ...]) -> tuple[tuple[int, float], ...]:
    """The grid points either side of ``x`` with their weights, linear in log ``x``;
    the end point alone outside the grid."""
    if x <= points[0]:
        return ((points[0], 1.0),)
    if x >= points[-1]:
        return ((points[-1], 1.0),)
    for lo, hi in itertools.pairwise(points):
        if x <= hi:
            w = (math.log(x) - math.log(lo)) / (math.log(hi) - math.log(lo))
            return ((lo, 1.0 - w), (hi, w))
    raise AssertionError("unreachable: x lies inside the grid")


@cache
def _tables() -> dict[str, GemmTable]:
    raw = read_package_json("gemm_tables.json")["tables"]
    return {name: _table(name, entry["entries"]) for name, entry in raw.items()}


def _table(name: str, entries: list[list[int]]) -> GemmTable:
    rates = {(b, m, n, k): float(flops) for b, m, n, k, flops in entries}
    grid = tuple(sorted({b for b, *_ in rates}))
    sides = tuple(sorted({m for _, m, _, _ in rates}))
    for b, m, n, k in itertools.product(grid, sides, sides, sides):
        if (b, m, n, k) not in rates:  # a hole would make interpolation guess
            raise PlanError(f"gemm table {name}: no entry for b={b} m={m} n={n} k={k}")
    return GemmTable(name=name, grid=grid, sides=sides, rates=rates)


def gemm_table_names() -> tuple[str, ...]:
    """Names of the measured GEMM tables.

    >>> gemm_table_names()
    ('xla-sm90-bf16',)
    """
    return tuple(_tables())


def gemm_table(name: str, /) -> GemmTable:
    """The table ``name``; UnknownNameError listing the tables otherwise."""
    try:
        return _tables()[name]
    except KeyError:
        raise UnknownNameError(
            f"unknown gemm_table {name!r}{did_you_mean(name, gemm_table_names())}; "
            f"tables are: {', '.join(gemm_table_names())} (or leave gemm_table out: "
            "GEMMs then run at matmul_efficiency of the peak, less tile and wave losses)"
        ) from None
