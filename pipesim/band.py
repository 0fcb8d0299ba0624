"""A predicted step with a band: each unit of work's compute drawn from the calibration runs.

:func:`pipesim.calibration.predict` simulates a step with one compute time per stage
and op (the calibration's median). Measured compute times vary within a run and
between runs (a fresh pair of rank processes runs as a whole faster or slower than
another: ``docs/results/gloo-transport.md``). :func:`predict_band` carries that into the
prediction: each of ``draws`` times (seeded) it picks one of the calibration runs
and draws every unit of work's compute time from that run's own samples of its
stage and op (:func:`compute_samples`; an op without samples takes the cost model's
time), simulates the step with the same engine and overheads as the prediction
(:func:`pipesim.calibration.compute_span`), and reports the median step and a band
(p10 to p90 by default, nearest-rank quantiles of the draws).

Per run, or pooled (:func:`pool_runs`): drawing each unit of work from every run's
samples at once treats the runs' speeds as independent per action, so its band comes
out too narrow; measured on the saved steps of two full fidelity runs
(``benchmarks/fidelity_offline.py --methods``, 52 configurations x 3 runs each), the
measured runs fell inside a pooled p10-p90 band 23% and 28% of the time, inside the
per-run band 54% and 64%. The pooled draws' median is the better point prediction:
mean error 7.2% and 5.5% against the median-based
:func:`~pipesim.calibration.predict`'s 9.0% and 5.6% (max 33.2% and 24.8% against
36.7% and 28.3%).

1F1B with one micro-batch, no overheads: the step is the chain
0F0, 1F0, 1B0, 0B0; 1F0 took 10 or 30 in the first of three runs and 50 in the
others, every other op took 10, so a draw is 40, 60 or 80 (1/6, 1/6, 2/3):

>>> from pipesim.costs import CostModel
>>> from pipesim.schedules import generate
>>> costs = CostModel.uniform(forward=10, backward=10)
>>> schedule = generate("1f1b", n_ranks=2, n_microbatches=1)
>>> runs = [{"1F": (10, 30)}, {"1F": (50,)}, {"1F": (50,)}]
>>> band = predict_band(schedule, costs, runs, draws=400, seed=1)
>>> sorted(set(band.spans)), band.low, band.median, band.high
([40, 60, 80], 40, 80, 80)
"""

from __future__ import annotations

import math
import random
import re
from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

from pipesim.actions import Action, Op, Overlap
from pipesim.calibration import MeasuredStep, compute_span, cut_stages, median
from pipesim.costs import CostModel
from pipesim.errors import CostError
from pipesim.exact import Time, to_time
from pipesim.schedule import Schedule
from pipesim.step.structure import step_structure

__all__ = [
    "SAMPLES_META_KEY",
    "DrawnPrediction",
    "PredictionBand",
    "compute_samples",
    "draw_prediction",
    "pool_runs",
    "predict_band",
    "run_spread",
    "samples_from_meta",
    "samples_meta",
]

SAMPLES_META_KEY = "compute_samples_ns"
"""Where a cost file's ``meta`` keeps :func:`compute_samples` of its calibration runs
(``pipesim calibrate`` writes it), in ns."""

RunSamples = Mapping[str, Sequence[Time]]
"""One calibration run's compute times per stage and op, keyed ``"0F"``, ``"1W"``, ..."""

_KEY = re.compile(r"(\d+)([FBIW])")


@dataclass(frozen=True, slots=True, kw_only=True)
class PredictionBand:
    """What :func:`predict_band` found, in the cost model's time unit."""

    median: Time
    """The median of the drawn steps (the lower middle one for an even count)."""
    low: Time
    """The ``quantiles[0]`` nearest-rank quantile of the drawn steps."""
    high: Time
    """The ``quantiles[1]`` nearest-rank quantile of the drawn steps."""
    quantiles: tuple[float, float]
    spans: tuple[Time, ...]
    """Every drawn step, as :func:`~pipesim.calibration.measured_makespan` spans it, in
    the order drawn."""


def compute_samples(steps: Sequence[MeasuredStep], /) -> tuple[dict[str, tuple[Time, ...]], ...]:
    """Per measured step (one calibration run), every unit of work's compute time per
    stage and op, keyed ``"0F"``, ``"1W"``, ... (in start order); overlapped pairs are
    left out (the calibration schedule has none, and a pair's parts are drawn apart).

    >>> from pipesim.schedules import generate
    >>> from pipesim.trace import ActionRecord, Trace
    >>> schedule = generate("1f1b", n_ranks=2, n_microbatches=1)
    >>> spans = {"0F0": (0, 10), "1F0": (12, 25), "1B0": (27, 50), "0B0": (52, 70)}
    >>> records = tuple(ActionRecord(rank=r, work=w, start=spans[str(w)][0],
    ...     end=spans[str(w)][1]) for r, order in enumerate(schedule.orders) for w in order)
    >>> compute_samples([MeasuredStep(schedule=schedule, trace=Trace(n_ranks=2,
    ...     actions=records))])
    ({'0F': (10,), '1F': (13,), '1B': (23,), '0B': (18,)},)
    """
    found = []
    for step in steps:
        per: dict[str, list[Time]] = defaultdict(list)
        for record in sorted(step.trace.actions, key=lambda r: (r.start, r.rank)):
            if isinstance(record.work, Action):
                per[f"{record.work.stage}{record.work.op.value}"].append(record.end - record.start)
        found.append({key: tuple(values) for key, values in per.items()})
    return tuple(found)


def pool_runs(runs: Sequence[RunSamples], /) -> dict[str, tuple[Time, ...]]:
    """Every run's samples as one run: :func:`predict_band` of ``[pool_runs(runs)]`` draws
    each unit of work from all runs at once (independently), not one run per draw.

    >>> pool_runs([{"0F": (10, 12)}, {"0F": (14,), "1W": (40,)}])
    {'0F': (10, 12, 14), '1W': (40,)}
    """
    pooled: dict[str, list[Time]] = defaultdict(list)
    for run in runs:
        for key, values in run.items():
            pooled[key].extend(values)
    return {key: tuple(values) for key, values in pooled.items()}


def run_spread(runs: Sequence[RunSamples], /) -> dict[str, Fraction]:
    """Per stage and op, how far apart the runs' own medians lie: (largest - smallest) /
    the median of every run's samples pooled (0 for an op measured in one run only, or
    always 0).

    >>> run_spread([{"0F": (10, 12), "1W": (40,)}, {"0F": (14,), "1W": (40, 40)}])
    {'0F': Fraction(1, 4), '1W': Fraction(0, 1)}
    """
    _checked(runs)
    spread = {}
    for key in dict.fromkeys(k for run in runs for k in run):
        medians = [median(list(run[key])) for run in runs if key in run]
        pooled = median([v for run in runs for v in run.get(key, ())])
        spread[key] = Fraction(max(medians) - min(medians)) / pooled if pooled else Fraction(0)
    return spread


def _checked(runs: Sequence[RunSamples]) -> list[dict[tuple[int, Op], tuple[Time, ...]]]:
    """``runs`` keyed by (stage, op), every key and time checked (they may come from JSON)."""
    if not runs:
        raise CostError("no calibration runs to draw compute times from; give at least one")
    checked = []
    for k, run in enumerate(runs):
        per = {}
        for key, values in run.items():
            match = _KEY.fullmatch(str(key))
            if match is None:
                raise CostError(
                    f"run {k}: compute sample key {key!r} is not a stage and op like '0F' or "
                    "'1W'; write the keys as compute_samples does"
                )
            if isinstance(values, str | bytes) or not isinstance(values, Sequence) or not values:
                raise CostError(
                    f"run {k}: the compute samples of {key!r} must be a list of at least one "
                    f"time, got {values!r}"
                )
            times = tuple(to_time(v, name=f"run {k}: compute sample of {key!r}") for v in values)
            per[(int(match[1]), Op(match[2]))] = times
        checked.append(per)
    return checked


def _quantile(ordered: Sequence[Time], q: float) -> Time:
    """The nearest-rank quantile: the ceil(q n)-th smallest (the smallest for q = 0)."""
    return ordered[max(math.ceil(q * len(ordered)) - 1, 0)]


def predict_band(
    schedule: Schedule,
    costs: CostModel,
    runs: Sequence[RunSamples],
    /,
    *,
    draws: int = 200,
    seed: int = 0,
    quantiles: tuple[float, float] = (0.1, 0.9),
) -> PredictionBand:
    """The step of ``schedule`` under ``costs``' overheads with every unit of work's compute
    drawn from one of ``runs`` (picked per draw, :func:`compute_samples` of the
    calibration's steps, keyed by the stages of the calibrated cut:
    :func:`~pipesim.calibration.cut_stages` maps a schedule's stages onto it), ``draws`` times
    with ``random.Random(seed)``; see the module docstring."""
    if draws < 1:
        raise CostError(f"draws must be at least 1, got {draws}")
    low_q, high_q = quantiles
    if not 0 <= low_q <= high_q <= 1:
        raise CostError(f"quantiles must satisfy 0 <= low <= high <= 1, got {quantiles}")
    per_run = _checked(runs)
    costs = costs.for_stages(schedule.n_stages)
    cut = cut_stages(schedule)
    works = step_structure(schedule).works
    span = compute_span(schedule, costs)
    rng = random.Random(seed)

    def compute(action: Action, run: Mapping[tuple[int, Op], tuple[Time, ...]]) -> Time:
        values = run.get((cut[action.stage], action.op))
        return rng.choice(values) if values else costs.stage(action.stage).duration(action.op)

    spans = []
    for _ in range(draws):
        run = rng.choice(per_run)
        times: list[Time] = []
        for work in works:
            if isinstance(work, Overlap) and costs.stage(work.parts[0].stage).overlap is not None:
                times.append(costs.duration(work))  # a measured pair's own time
                continue
            parts = work.parts if isinstance(work, Overlap) else (work,)
            times.append(sum((compute(a, run) for a in parts), start=0))
        spans.append(span(times))
    ordered = sorted(spans)
    return PredictionBand(
        median=_quantile(ordered, 0.5),
        low=_quantile(ordered, low_q),
        high=_quantile(ordered, high_q),
        quantiles=(low_q, high_q),
        spans=tuple(spans),
    )


@dataclass(frozen=True, slots=True, kw_only=True)
class DrawnPrediction:
    """What :func:`draw_prediction` found: the band and the drawn prediction that
    ``pipesim calibrate --check`` and ``pipesim simulate`` print."""

    band: PredictionBand
    """Each draw from one calibration run's samples (:func:`predict_band` of the runs):
    its ``low`` and ``high`` are the band."""
    drawn: PredictionBand
    """Each unit of work drawn from every run's samples at once (:func:`predict_band` of
    ``[pool_runs(runs)]``): its ``median`` is the drawn prediction."""
    n_runs: int
    """How many calibration runs the samples came from."""
    seed: int
    """The seed of both draws."""


def draw_prediction(
    schedule: Schedule,
    costs: CostModel,
    runs: Sequence[RunSamples],
    /,
    *,
    draws: int = 200,
    seed: int = 0,
) -> DrawnPrediction:
    """The p10-p90 band (one run per draw) and the drawn prediction (the median of draws
    from every run pooled) of ``schedule``'s step under ``costs``, ``draws`` draws each
    with ``seed``; why both, see the module docstring.

    One run, so pooling changes nothing; 1F1B with one micro-batch is a chain whose 1F0
    takes 10 or 30, every other op 10 (:func:`predict_band`'s example):

    >>> from pipesim.schedules import generate
    >>> schedule = generate("1f1b", n_ranks=2, n_microbatches=1)
    >>> got = draw_prediction(schedule, CostModel.uniform(forward=10, backward=10),
    ...     [{"1F": (10, 30)}], draws=400, seed=1)
    >>> got.band.low, got.band.high, got.drawn.median in (40, 60), got.n_runs
    (40, 60, True, 1)
    """
    return DrawnPrediction(
        band=predict_band(schedule, costs, runs, draws=draws, seed=seed),
        drawn=predict_band(schedule, costs, [pool_runs(runs)], draws=draws, seed=seed),
        n_runs=len(runs),
        seed=seed,
    )


def samples_meta(runs: Sequence[RunSamples], /) -> dict[str, Any]:
    """What a cost file's ``meta`` keeps of its calibration runs' compute, which
    :func:`samples_from_meta` reads back: each run's samples (:data:`SAMPLES_META_KEY`,
    ns) and how far the runs' medians lie apart (``compute_run_spread_pct``,
    :func:`run_spread` in percent, one decimal; 0 for one run).

    The runs' medians 11 and 14 lie (14 - 11) / 12 (the pooled median) = 25% apart:

    >>> samples_meta([{"0F": (10, 12)}, {"0F": (14,)}])
    {'compute_run_spread_pct': {'0F': 25.0}, 'compute_samples_ns': [{'0F': [10, 12]}, {'0F': [14]}]}
    """
    return {
        "compute_run_spread_pct": {
            key: round(float(value) * 100, 1) for key, value in run_spread(runs).items()
        },
        SAMPLES_META_KEY: [
            {key: [int(v) for v in values] for key, values in run.items()} for run in runs
        ],
    }


def samples_from_meta(
    schedule: Schedule,
    meta: Mapping[str, Any],
    /,
    *,
    time_unit: str,
    source: str = "the cost file",
) -> tuple[dict[str, tuple[Time, ...]], ...] | None:
    """The calibration runs' compute samples a cost file's ``meta`` carries
    (:data:`SAMPLES_META_KEY`), keyed for ``schedule``, or None when it carries none.

    The samples describe the calibrated cut (``meta["n_stages"]`` stages, else as many as
    their keys name); ``schedule`` must run on that cut (``n_stages / n_copies`` stages,
    :func:`~pipesim.calibration.cut_stages`), or the samples describe one stage, which
    every stage then takes, as a one-stage cost model is broadcast
    (:meth:`~pipesim.costs.CostModel.for_stages`). The samples are in ns, so ``time_unit``
    (the cost model's) must be too.

    >>> from pipesim.schedules import generate
    >>> meta = {"n_stages": 1, "compute_samples_ns": [{"0F": [10, 12], "0B": [20]}]}
    >>> samples_from_meta(generate("gpipe", n_ranks=2, n_microbatches=2), meta,
    ...     time_unit="ns")
    ({'0F': (10, 12), '1F': (10, 12), '0B': (20,), '1B': (20,)},)
    """
    raw = meta.get(SAMPLES_META_KEY)
    if raw is None:
        return None
    where = f"{source}: meta.{SAMPLES_META_KEY}"
    if isinstance(raw, str | bytes) or not isinstance(raw, Sequence) or not raw:
        raise CostError(
            f"{where} must be a non-empty list of runs, each mapping a stage and op like "
            f"'0F' to its times, got {raw!r:.60}; write it as pipesim calibrate does"
        )
    if not all(isinstance(run, Mapping) for run in raw):
        raise CostError(f"{where}: every run must map a stage and op like '0F' to its times")
    try:
        runs = _checked(raw)
    except CostError as exc:
        raise CostError(f"{where}: {exc}") from None
    if time_unit != "ns":
        raise CostError(
            f"{where} is in ns but the cost model's times are in {time_unit}; use the file's "
            "own unit (ns)"
        )
    named = 1 + max((stage for run in runs for stage, _ in run), default=0)
    n_stages = meta.get("n_stages", named)
    if not isinstance(n_stages, int) or isinstance(n_stages, bool) or n_stages < named:
        raise CostError(
            f"{where} names stage {named - 1}, but meta.n_stages is {n_stages!r}; the samples "
            "must describe the file's own cut"
        )
    cut = schedule.n_stages // schedule.n_copies
    if n_stages not in (cut, 1):
        raise CostError(
            f"{where} describes a cut into {n_stages} stages, but {schedule.name} runs on "
            f"{cut} stages per model copy; simulate a schedule on {n_stages} stages, or "
            f"calibrate a cut into {cut} (pipesim calibrate -p P --virtual V, P x V = {cut})"
        )
    stages = range(cut) if n_stages == 1 else (None,)
    return tuple(
        {
            f"{stage if target is None else target}{op.value}": values
            for (stage, op), values in run.items()
            for target in stages
        }
        for run in runs
    )
