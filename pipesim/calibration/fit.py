"""Measured steps -> a cost model (:func:`fit_costs`, rule 1 of :mod:`pipesim.calibration`
and the overheads of :mod:`pipesim.calibration.overheads`), how far each figure can be
trusted (:func:`term_stability`, :func:`unstable_terms`) and what a cost file keeps of
the fit (:func:`fit_meta`)."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from pipesim.actions import Action, Op, Overlap
from pipesim.calibration.measured import MeasuredStep
from pipesim.calibration.overheads import _fit_overheads
from pipesim.calibration.statistics import Sample, TermStats, _stats, _whole, median
from pipesim.costs import CostModel, Link, StageCost, costs_to_dict
from pipesim.errors import CostError
from pipesim.exact import Time

__all__ = [
    "STATISTIC",
    "CalibrationFit",
    "fit_costs",
    "fit_meta",
    "term_stability",
    "unstable_terms",
]


@dataclass(frozen=True, slots=True, kw_only=True)
class CalibrationFit:
    """What :func:`fit_costs` found."""

    costs: CostModel
    assumed: tuple[str, ...]
    """Ops not measured and filled from others, e.g. ``"stage 0: I = W = B / 2"``."""
    samples: Mapping[str, int]
    """How many measurements each figure is the median of (``"0F"``, ``"dispatch"``, ...)."""
    pair_links: Mapping[tuple[int, int], Link]
    """The message costs fitted per direction (ordered rank pair), from the transitions
    whose messages all use that pair (the others' figures where it has none)."""
    terms: Mapping[str, TermStats] = field(default_factory=dict)
    """Per fitted figure (the keys of ``samples``) its samples' statistics; with two or
    more steps also how far leaving out one step moves it (:func:`term_stability`)."""


def fit_costs(
    steps: Sequence[MeasuredStep],
    /,
    *,
    stage_bytes: Sequence[StageCost] = (),
    time_unit: str = "unit",
    send_mode: str = "eager",
) -> CalibrationFit:
    """A cost model from measured ``steps`` (all on one cut: the same stage count).

    ``stage_bytes`` gives per stage the byte fields (``activation_bytes``,
    ``weight_grad_bytes``, ``output_bytes``, ``param_bytes``) to keep; times come
    from the steps (see the module docstring), in their ``time_unit``.
    """
    if not steps:
        raise CostError("fit_costs needs at least one measured step")
    n_stages = {s.schedule.n_stages for s in steps}
    if len(n_stages) != 1:
        raise CostError(
            f"the steps cut the model into {sorted(n_stages)} stages; a cost file describes "
            "one cut, so calibrate each cut from its own steps"
        )
    (count,) = n_stages
    stages, assumed, samples = _fit_compute(steps, count, stage_bytes)
    link, dispatch, overheads, by_pair = _fit_overheads(steps, send_mode)
    costs = CostModel(
        stages=tuple(stages),
        link=link,
        dispatch_overhead=dispatch,
        time_unit=time_unit,
        send_mode=send_mode,
    )
    terms = {
        f"{s}{op.value}": _stats(samples[(s, op)], _term_value(costs, f"{s}{op.value}"))
        for s in range(count)
        for op in Op
        if samples[(s, op)]
    }
    for name, values in overheads.items():
        terms[name] = _stats(values, _term_value(costs, name))
    return CalibrationFit(
        costs=costs,
        assumed=tuple(assumed),
        samples={name: t.samples for name, t in terms.items()},
        pair_links=by_pair,
        terms=terms,
    )


def _fit_compute(
    steps: Sequence[MeasuredStep], count: int, stage_bytes: Sequence[StageCost]
) -> tuple[list[StageCost], list[str], dict[tuple[int, Op], list[Sample]]]:
    """Rule 1 of :mod:`pipesim.calibration`: per stage its compute times (the byte fields
    from ``stage_bytes``), the ops assumed, and per (stage, op) the samples."""
    samples: dict[tuple[int, Op], list[Sample]] = defaultdict(list)
    pairs: dict[int, list[Time]] = defaultdict(list)
    for index, step in enumerate(steps):
        for record in step.trace.actions:
            work = record.work
            if isinstance(work, Action):
                samples[(work.stage, work.op)].append((index, record.end - record.start))
            else:
                assert isinstance(work, Overlap)
                pairs[work.parts[0].stage].append(record.end - record.start)
    stages, assumed = [], []
    for stage in range(count):
        times = {
            op: _whole(median([v for _, v in samples[(stage, op)]]))
            for op in Op
            if samples[(stage, op)]
        }
        if Op.B not in times and Op.I in times and Op.W in times:
            times[Op.B] = times[Op.I] + times[Op.W]
            assumed.append(f"stage {stage}: B = I + W")
        if Op.B in times and (Op.I not in times or Op.W not in times):
            times[Op.I], times[Op.W] = times[Op.B] // 2, times[Op.B] - times[Op.B] // 2
            assumed.append(f"stage {stage}: I = W = B / 2")
        base = stage_bytes[stage] if stage < len(stage_bytes) else StageCost()
        stages.append(
            replace(
                base,
                forward=times.get(Op.F, 0),
                backward=times.get(Op.B, 0),
                input_grad=times.get(Op.I, 0),
                weight_grad=times.get(Op.W, 0),
                overlap=_whole(median(pairs[stage])) if pairs[stage] else None,
            )
        )
    return stages, assumed, samples


def _term_value(costs: CostModel, name: str) -> Time:
    """The figure of ``costs`` that term ``name`` of :attr:`CalibrationFit.terms` names:
    ``"0F"`` (stage 0's forward), ``"dispatch"`` or a link field such as ``"latency"``."""
    if name == "dispatch":
        return costs.dispatch_overhead
    value: Time = (
        getattr(costs.link, name)
        if not name[:-1].isdigit()
        else getattr(costs.stages[int(name[:-1])], _OP_FIELDS[name[-1]])
    )
    return value


_OP_FIELDS = {"F": "forward", "B": "backward", "I": "input_grad", "W": "weight_grad"}


def term_stability(
    steps: Sequence[MeasuredStep], fit: CalibrationFit, /, *, send_mode: str = "eager"
) -> CalibrationFit:
    """``fit`` (of ``steps``) with each term's ``step_shift``: the most its figure moves
    when the fit leaves out any one of the steps (a jackknife over steps). A figure one
    step can move far rests on that step: a slow spell of the machine, or one late
    message in a term with few samples. Fewer than two steps: ``fit`` unchanged."""
    if len(steps) < 2:
        return fit
    shifts: dict[str, Time] = defaultdict(int)
    for k in range(len(steps)):
        without = fit_costs([*steps[:k], *steps[k + 1 :]], send_mode=send_mode)
        for name, term in fit.terms.items():
            if name in without.terms:
                shifts[name] = max(shifts[name], _size(without.terms[name].value - term.value))
    terms = {name: replace(t, step_shift=shifts[name]) for name, t in fit.terms.items()}
    return replace(fit, terms=terms)


def _size(value: Time) -> Time:
    """``|value|``, typed as a Time."""
    return value if value >= 0 else -value


def unstable_terms(
    terms: Mapping[str, TermStats], /, *, min_samples: int, max_shift: float = 0.2, floor: Time = 0
) -> dict[str, str]:
    """Per term that cannot be trusted, why: fewer than ``min_samples`` samples, or one
    step moving it by more than ``max_shift`` of its value (and more than ``floor`` time
    units, so that figures too small to matter do not warn). A term without samples was
    not fitted (its figure is the default) and is not listed.

    >>> unstable_terms({"0F": TermStats(value=100, samples=12, step_shift=5),
    ...                 "handshake": TermStats(value=40, samples=3, step_shift=30)},
    ...                min_samples=10)
    {'handshake': '3 samples (fewer than 10); leaving out one step moves it by 75%'}
    """
    found = {}
    for name, term in terms.items():
        if not term.samples:
            continue
        why = []
        if term.samples < min_samples:
            why.append(f"{term.samples} samples (fewer than {min_samples})")
        shift = term.step_shift
        if shift is not None and shift > floor and shift > max_shift * _size(term.value):
            share = f"{float(shift / term.value) * 100:.0f}%" if term.value else "from 0"
            why.append(f"leaving out one step moves it by {share}")
        if why:
            found[name] = "; ".join(why)
    return found


STATISTIC = (
    "compute: median over every micro-batch of every measured step; overheads: median "
    "over the measured steps of each step's mean over its transitions (over three blocks "
    "of the transitions with fewer than three steps); rendezvous latency: median over "
    "every message"
)
"""What a cost file's ``meta.statistic`` says of :func:`fit_costs`."""


def fit_meta(fit: CalibrationFit, /) -> dict[str, Any]:
    """What a calibrated cost file's ``meta`` keeps of ``fit``: the statistic, the ops
    assumed, per figure its samples and :class:`TermStats`, and the message costs per
    direction (``"0->1"``)."""
    return {
        "statistic": STATISTIC,
        "assumed": list(fit.assumed),
        "samples": dict(fit.samples),
        "terms": {name: term.to_dict() for name, term in fit.terms.items()},
        "links_by_direction": {
            f"{src}->{dst}": costs_to_dict(CostModel(link=link))["link"]
            for (src, dst), link in fit.pair_links.items()
        },
    }
