"""Refit and replay the steps ``bench_fidelity.py --steps-out`` saved, under each message rule.

No rank process runs: every measured step (each action's rank, start and end) is read
back, the cuts are refitted from the calibration runs (``cal:1``, ``cal:2``) with
:func:`pipesim.calibration.fit_costs` under each ``--send-modes`` rule
(``CostModel.send_mode``: ``eager``, or ``rendezvous``: a message leaves once its
receive is posted too, a handshake later when the receive came second), and every
``grid`` configuration (and ``scale:B`` one, from the affine fit of the two 2-stage
calibrations) is predicted (:func:`pipesim.calibration.predict`, against the
median run) and replayed (:func:`pipesim.calibration.replay`: each action with its own
measured compute time, so what is left is the model's error: dependencies, overheads,
messages). It prints, per configuration and rule, the prediction error and the model
error (median over the runs), then their mean / max per model size and family.

``--messages`` also prints, per model size, how long the receiving rank waited for the
messages it waited for, split by whether the receive was posted before or after the send
(what separates the two rules; times from the compute records, the receive posted when
the rank finished the work before it in :func:`pipesim.comms.lower_comms`'s program).

``--methods`` compares, side by side on the same steps, ways to turn the calibration
runs' compute times into a prediction of every ``grid`` configuration (and the
calibration schedule in sample), each with the overheads fitted as above: ``median``
(what ``predict`` uses: per stage and op the median over every micro-batch of every
run), ``mean`` (the mean instead), ``runs`` (the mean of the predictions from each
run's own medians), ``pooled`` and ``band`` (the median of ``--draws`` seeded draws of
:func:`pipesim.band.predict_band`, every unit of work drawn from all runs' samples at
once, or from one run's per draw), with the error mean / max and signed mean per size,
and how many measured runs fell inside each draw's p10-p90 band.

Run: ``python benchmarks/fidelity_offline.py --steps steps.json --messages --methods``
(about a minute for the full grid of two sizes on one core, two more for the methods).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from collections import defaultdict
from dataclasses import replace
from typing import Any

from pipesim.actions import Op, parse_action
from pipesim.band import compute_samples, pool_runs, predict_band
from pipesim.calibration import (
    MeasuredStep,
    costs_for,
    fit_costs,
    mean,
    measured_makespan,
    median,
    predict,
    replay,
)
from pipesim.comms import receive_posts
from pipesim.costs import SEND_MODES, CostModel
from pipesim.exact import Time
from pipesim.scaling import AffineCosts
from pipesim.schedule import Schedule
from pipesim.schedule_io import schedule_from_dict
from pipesim.step.structure import step_structure
from pipesim.trace import ActionRecord, Trace


def _steps(run: dict[str, Any]) -> tuple[Schedule, list[MeasuredStep]]:
    schedule = schedule_from_dict(run["schedule"])
    steps = []
    for rows in run["steps"]:
        records = tuple(
            ActionRecord(rank=rank, work=parse_action(work), start=start, end=end)
            for rank, work, start, end in rows
        )
        trace = Trace(n_ranks=schedule.n_ranks, actions=records)
        steps.append(MeasuredStep(schedule=schedule, trace=trace))
    return schedule, steps


def _percent(got: Any, want: Any) -> float:
    return float((got - want) / want) * 100


def evaluate(size: dict[str, Any], send_mode: str) -> tuple[list[dict[str, Any]], CostModel]:
    """Every configuration of one model size under ``send_mode``: its prediction and model
    errors (percent), as ``bench_fidelity.py`` computes them; and the 2-stage cut's cost
    model."""
    runs = [(run["role"], run["rows"], *_steps(run)) for run in size["runs"]]
    cuts: dict[int, CostModel] = {}
    by_rows: dict[int, CostModel] = {}
    for role, rows_per_mb, schedule, steps in runs:
        if role.startswith("cal"):
            fit = fit_costs(steps, time_unit="ns", send_mode=send_mode).costs
            if role != "cal:2":
                by_rows[rows_per_mb] = fit
            if role != "cal-b:4" or schedule.n_stages not in cuts:
                cuts.setdefault(schedule.n_stages, fit)
    # The micro-batch size rows: from the affine fit of the two 2-stage calibrations.
    sizes = sorted(by_rows)
    scaled = (
        AffineCosts.fit(by_rows[sizes[0]], by_rows[sizes[1]], sizes=(sizes[0], sizes[1]))
        if len(sizes) == 2
        else None
    )
    rows = []
    for role, rows_per_mb, schedule, steps in runs:
        if role in ("grid", "cal:1"):
            costs = costs_for(schedule, cuts)
        elif role.startswith("scale:") and scaled is not None:
            costs = scaled.at(rows_per_mb)
        else:
            continue
        spans = [measured_makespan(s.trace) for s in steps]
        model = [_percent(replay(s, costs), span) for s, span in zip(steps, spans, strict=True)]
        rows.append(
            {
                "model": size["model"],
                "role": role,
                "schedule": {"grid": schedule.name, "cal:1": "(calibration)"}.get(
                    role, f"{schedule.name} b={rows_per_mb}"
                ),
                "m": schedule.n_microbatches,
                "error_pct": _percent(
                    predict(schedule, costs), statistics.median(map(float, spans))
                ),
                "model_error_pct": statistics.median(model),
            }
        )
    return rows, cuts[2]


_FIELDS = {Op.F: "forward", Op.B: "backward", Op.I: "input_grad", Op.W: "weight_grad"}
METHODS = ("median", "mean", "runs", "pooled", "band")


def _with_compute(costs: CostModel, runs: list[dict[str, tuple[Time, ...]]], combine: Any) -> Any:
    """``costs`` with each measured stage and op's compute ``combine``d from ``runs``'
    samples (pooled), the overheads kept."""
    pooled: dict[str, list[Time]] = defaultdict(list)
    for run in runs:
        for key, values in run.items():
            pooled[key] += values
    stages = []
    for s, stage in enumerate(costs.stages):
        times = {
            _FIELDS[op]: round(combine(pooled[f"{s}{op.value}"]))
            for op in Op
            if pooled.get(f"{s}{op.value}")
        }
        stages.append(replace(stage, **times))
    return replace(costs, stages=tuple(stages))


def evaluate_methods(
    size: dict[str, Any], send_mode: str, *, draws: int, seed: int
) -> list[dict[str, Any]]:
    """Every ``grid`` configuration (and the calibration in sample) of one model size,
    predicted by each of :data:`METHODS` (see the module docstring): the error against
    the median run (percent) and, for the two drawn ones, the measured runs inside the
    p10-p90 band."""
    runs = [(run["role"], *_steps(run)) for run in size["runs"]]
    cuts: dict[int, CostModel] = {}
    samples: dict[int, list[dict[str, tuple[Time, ...]]]] = {}
    for role, schedule, steps in runs:
        if role in ("cal:1", "cal:2"):
            cuts[schedule.n_stages] = fit_costs(steps, time_unit="ns", send_mode=send_mode).costs
            samples[schedule.n_stages] = list(compute_samples(steps))
    rows = []
    for role, schedule, steps in runs:
        if role not in ("grid", "cal:1"):
            continue
        per_copy = schedule.n_stages // schedule.n_copies
        cut, by_run = cuts[per_copy], samples[per_copy]

        def with_(costs: CostModel, schedule: Schedule = schedule, per_copy: int = per_copy) -> Any:
            return costs_for(schedule, {per_copy: costs})

        spans = [measured_makespan(s.trace) for s in steps]
        measured = statistics.median(map(float, spans))
        bands = {
            name: predict_band(schedule, with_(cut), group, draws=draws, seed=seed)
            for name, group in (("pooled", [pool_runs(by_run)]), ("band", by_run))
        }
        predicted = {
            "median": predict(schedule, with_(cut)),
            "mean": predict(schedule, with_(_with_compute(cut, by_run, mean))),
            "runs": statistics.mean(
                float(predict(schedule, with_(_with_compute(cut, [r], median)))) for r in by_run
            ),
            **{name: band.median for name, band in bands.items()},
        }
        rows.append(
            {
                "model": size["model"],
                "role": role,
                "schedule": schedule.name if role == "grid" else "(calibration)",
                "m": schedule.n_microbatches,
                "errors": {k: _percent(v, measured) for k, v in predicted.items()},
                "inside": {
                    name: sum(band.low <= t <= band.high for t in spans)
                    for name, band in bands.items()
                },
                "runs": len(spans),
            }
        )
    return rows


def _print_methods(rows: list[dict[str, Any]]) -> None:
    print(f"{'size':>6} {'schedule':<18} {'m':>3} " + " ".join(f"{m:>7}" for m in METHODS))
    for r in rows:
        cells = " ".join(f"{r['errors'][m]:+6.1f}%" for m in METHODS)
        print(f"{r['model']:>6} {r['schedule']:<18} {r['m']:>3} {cells}")
    grid = [r for r in rows if r["role"] == "grid"]
    for label in ["all", *sorted({r["model"] for r in grid})]:
        group = [r for r in grid if label in ("all", r["model"])]
        print(f"{label}, {len(group)} grid configurations (prediction error mean / max, signed):")
        for m in METHODS:
            errors = [r["errors"][m] for r in group]
            line = (
                f"  {m:>7}: {statistics.mean(map(abs, errors)):4.1f}% / "
                f"{max(map(abs, errors)):4.1f}% ({statistics.mean(errors):+4.1f}%)"
            )
            if m in ("pooled", "band"):
                inside = sum(r["inside"][m] for r in group)
                line += f"; runs inside its p10-p90: {inside} of {sum(r['runs'] for r in group)}"
            print(line)
    for r in rows:
        if r["role"] == "cal:1":
            cells = ", ".join(f"{m} {r['errors'][m]:+.1f}%" for m in METHODS)
            print(f"{r['model']} in sample (calibration schedule): {cells}")


def _waits(size: dict[str, Any]) -> dict[str, list[float]]:
    """Per kind of message (receive posted before or after its send), how long after
    both were posted the consumer started, in us, for the messages it waited for."""
    found: dict[str, list[float]] = defaultdict(list)
    for run in size["runs"]:
        schedule, steps = _steps(run)
        structure = step_structure(schedule)
        posts = receive_posts(structure)
        for step in steps:
            by_work = {r.work: r for r in step.trace.actions}
            records = [by_work[w] for w in structure.works]
            for message, post in zip(structure.messages, posts, strict=True):
                sent = records[message.producer_node].end
                posted = records[post].end if post >= 0 else None
                consumer = message.consumer_node
                ahead = [n for n in structure.orders[structure.ranks[consumer]] if n < consumer]
                free = records[ahead[-1]].end if ahead else 0
                start = records[consumer].start
                later = posted is not None and posted > sent
                both = max(sent, posted or sent)
                if start - free > 1_500_000 and start > both:  # it waited (1.5 ms)
                    found["receive after send" if later else "receive first"].append(
                        (start - both) / 1e3
                    )
    return found


def _summary(label: str, rows: list[dict[str, Any]], key: str) -> str:
    values = [abs(r[key]) for r in rows]
    if not values:
        return f"{label}: none"
    return f"{label}: mean {statistics.mean(values):.1f}% max {max(values):.1f}%"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", required=True, help="bench_fidelity.py --steps-out's file")
    parser.add_argument("--send-modes", default=",".join(SEND_MODES), help="rules to compare")
    parser.add_argument("--messages", action="store_true", help="also print the message waits")
    parser.add_argument(
        "--methods", action="store_true", help="also compare ways to combine the runs' compute"
    )
    parser.add_argument("--draws", type=int, default=200, help="draws per band (--methods)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the draws (--methods)")
    args = parser.parse_args(argv)
    modes = [m.strip() for m in args.send_modes.split(",")]
    unknown = [m for m in modes if m not in SEND_MODES]
    if unknown:
        print(f"pipesim: error: unknown send mode {unknown[0]!r}; use {', '.join(SEND_MODES)}")
        return 2
    with open(args.steps, encoding="utf-8") as handle:
        data = json.load(handle)
    results: dict[str, list[dict[str, Any]]] = {m: [] for m in modes}
    for size in data:
        if args.messages:
            for kind, waits in sorted(_waits(size).items()):
                print(
                    f"{size['model']} waited messages, {kind}: n={len(waits)}, consumer start "
                    f"- both posted: median {statistics.median(waits):.0f} us, "
                    f"mean {statistics.mean(waits):.0f} us"
                )
        for mode in modes:
            rows, costs = evaluate(size, mode)
            link = costs.link
            print(
                f"{size['model']} {mode}: send {link.send_overhead / 1e3:.0f} us, receive "
                f"{link.receive_overhead / 1e3:.0f} us, latency {link.latency / 1e3:.0f} us, "
                f"handshake {link.handshake / 1e3:.0f} us, post {link.post_overhead / 1e3:.0f} us, "
                "dispatch "
                f"{costs.dispatch_overhead / 1e3:.0f} us"
            )
            results[mode] += rows
    header = "".join(f" | {m:>10} pred  model" for m in modes)
    print(f"{'size':>6} {'schedule':<18} {'m':>3}{header}")
    first = results[modes[0]]
    for k, row in enumerate(first):
        cells = "".join(
            f" | {results[m][k]['error_pct']:+15.1f}% {results[m][k]['model_error_pct']:+5.1f}%"
            for m in modes
        )
        print(f"{row['model']:>6} {row['schedule']:<18} {row['m']:>3}{cells}")
    if args.methods:
        mode = "rendezvous" if "rendezvous" in modes else modes[0]
        print(f"methods ({mode} sends, {args.draws} draws, seed {args.seed}):")
        _print_methods(
            [
                row
                for size in data
                for row in evaluate_methods(size, mode, draws=args.draws, seed=args.seed)
            ]
        )
    for mode in modes:
        grid = [r for r in results[mode] if r["role"] != "cal:1"]
        print(f"{mode}, {len(grid)} configurations out of sample:")
        groups: dict[str, list[dict[str, Any]]] = defaultdict(list)
        for r in grid:
            groups[f"all {r['model']}"].append(r)
            groups[r["schedule"]].append(r)
        for label, group in [("all", grid), *sorted(groups.items())]:
            print(
                f"  {_summary(label, group, 'model_error_pct')} model; "
                f"{_summary('prediction', group, 'error_pct')}"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
