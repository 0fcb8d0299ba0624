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

Run: ``python benchmarks/fidelity_offline.py --steps steps.json --messages``
(about a minute for the full grid of two sizes on one core).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from collections import defaultdict
from typing import Any

from pipesim.actions import parse_action
from pipesim.calibration import (
    MeasuredStep,
    costs_for,
    fit_costs,
    measured_makespan,
    predict,
    replay,
)
from pipesim.comms import receive_posts
from pipesim.costs import SEND_MODES, CostModel
from pipesim.scaling import AffineCosts
from pipesim.schedule import Schedule
from pipesim.schedule_io import schedule_from_dict
from pipesim.structure import step_structure
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
