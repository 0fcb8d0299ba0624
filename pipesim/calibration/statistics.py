"""The robust statistics of the fit: exact medians and means, the median of means of
the overheads (:func:`robust`), and per fitted figure its :class:`TermStats`."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from fractions import Fraction

from pipesim.errors import CostError
from pipesim.exact import Time

__all__ = ["BLOCKS", "Sample", "TermStats", "mean", "median", "median_of_means", "robust"]


@dataclass(frozen=True, slots=True, kw_only=True)
class TermStats:
    """How one fitted figure came about: ``value`` (what the cost model holds, in the
    steps' time unit), the ``samples`` behind it and the measured ``steps`` they come
    from, their p10 and p90, and ``step_shift``: the most the figure moves when any one
    measured step is left out of the fit (None: fewer than two steps)."""

    value: Time
    samples: int
    steps: int = 0
    p10: Time = 0
    p90: Time = 0
    step_shift: Time | None = None

    @property
    def spread(self) -> float | None:
        """(p90 - p10) / value: how far the samples lie apart (None for a zero value)."""
        return float((self.p90 - self.p10) / self.value) if self.value else None

    def to_dict(self) -> dict[str, float | int | None]:
        """The JSON a cost file's ``meta.terms`` keeps (times as whole units)."""
        spread = self.spread
        return {
            "value": round(self.value),
            "samples": self.samples,
            "steps": self.steps,
            "p10": round(self.p10),
            "p90": round(self.p90),
            "spread_pct": None if spread is None else round(spread * 100, 1),
            "step_shift": None if self.step_shift is None else round(self.step_shift),
        }


def median(values: Sequence[Time], /) -> Time:
    """The exact median (the mean of the middle two for an even count).

    >>> median([3, 1, 2]), median([1, 2, 3, 5])
    (2, Fraction(5, 2))
    """
    if not values:
        raise CostError("cannot take the median of no measured values: measure at least one step")
    ordered = sorted(values)
    half = len(ordered) // 2
    if len(ordered) % 2:
        return ordered[half]
    middle = Fraction(ordered[half - 1] + ordered[half], 2)
    return middle.numerator if middle.denominator == 1 else middle


def mean(values: Sequence[Time], /) -> Time:
    """The exact mean (a Fraction unless it is whole).

    >>> mean([1, 2, 4]), mean([2, 4])
    (Fraction(7, 3), 3)
    """
    if not values:
        raise CostError("cannot take the mean of no measured values: measure at least one step")
    value = Fraction(sum(values), len(values))
    return value.numerator if value.denominator == 1 else value


Sample = tuple[int, Time]
"""One sample of an overhead: the index of the measured step it comes from, its value."""


BLOCKS = 3
"""The fewest groups :func:`robust` takes a median over (so one group cannot set it)."""


def median_of_means(groups: Sequence[Sequence[Time]], /) -> Time:
    """The median of the groups' means (empty groups left out): a group that went wrong,
    a slow step or a late message, moves it no further than a neighbouring group's mean,
    while a tail that every group shares stays in it, as in a mean (Lugosi and Mendelson,
    "Mean estimation and regression under heavy-tailed distributions", 2019, section 2).

    >>> median_of_means([[1, 2], [2, 2], [90]]), median_of_means([[1, 3], [], [2, 2]])
    (2, 2)
    """
    means = [mean(g) for g in groups if g]
    if not means:
        raise CostError(
            "cannot take the median of means of no measured values: measure at least one step"
        )
    return median(means)


def robust(samples: Sequence[Sample], /, *, blocks: int = BLOCKS) -> Time:
    """The overhead figure of ``samples`` (step index, value): :func:`median_of_means`
    over the steps when at least ``blocks`` steps have samples, else over ``blocks``
    consecutive blocks of the samples in measured order (fewer than ``blocks`` samples:
    their mean, which the fit's terms then report as few).

    One late message among the 6 samples of one step (a mean would say 2.5):

    >>> robust([(0, 1), (0, 1), (0, 10), (0, 1), (0, 1), (0, 1)])
    1
    >>> robust([(0, 2), (1, 4), (2, 9), (3, 3)])
    Fraction(7, 2)
    """
    if not samples:
        raise CostError("cannot fit a figure from no samples: measure at least one step")
    by_step: dict[int, list[Time]] = defaultdict(list)
    for step, value in samples:
        by_step[step].append(value)
    if len(by_step) >= blocks:
        return median_of_means(list(by_step.values()))
    values = [v for _, v in samples]
    if len(values) < blocks:
        return mean(values)
    size = len(values) / blocks
    return median_of_means([values[round(k * size) : round((k + 1) * size)] for k in range(blocks)])


def _quantile(ordered: Sequence[Time], q: Fraction) -> Time:
    """The ``q`` quantile of sorted values (nearest rank, exact)."""
    return ordered[min(int(q * len(ordered)), len(ordered) - 1)]


def _stats(samples: Sequence[Sample], value: Time) -> TermStats:
    ordered = sorted(v for _, v in samples)
    if not ordered:
        return TermStats(value=value, samples=0)
    return TermStats(
        value=value,
        samples=len(ordered),
        steps=len({k for k, _ in samples}),
        p10=_quantile(ordered, Fraction(1, 10)),
        p90=_quantile(ordered, Fraction(9, 10)),
    )


def _whole(value: Time) -> int:
    """Whole time units, never negative (a fitted overhead below 0 is noise)."""
    return max(round(value), 0)
