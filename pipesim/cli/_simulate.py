"""``pipesim simulate``: one step of a schedule, as a table, JSON or the cycle grid."""

from __future__ import annotations

import argparse
from typing import Any

from pipesim.cli._common import (
    add_comms_arguments,
    add_cost_arguments,
    add_require_fit_argument,
    add_schedule_arguments,
    comms_counts,
    comms_from_args,
    costs_from_args,
    describe_comms,
    print_json,
    receive_mode,
    require_fit,
    schedule_from_args,
)
from pipesim.engine import simulate
from pipesim.exact import as_number
from pipesim.grid import format_grid
from pipesim.metrics import Metrics
from pipesim.text_table import format_table
from pipesim.units import SECONDS_PER_UNIT, format_bytes, format_duration, unit_suffix


def register(subparsers: Any) -> None:
    """Add ``simulate``."""
    parser = subparsers.add_parser(
        "simulate",
        help="simulate one step: makespan, idle, bubble, peak memory",
        description=(
            "Simulate one step of a built-in schedule or a schedule file and print makespan, "
            "busy / idle time, bubble and peak activation memory per rank."
        ),
    )
    add_schedule_arguments(parser)
    add_cost_arguments(parser)
    out = parser.add_mutually_exclusive_group()
    out.add_argument("--json", action="store_true", help="print one JSON object")
    out.add_argument(
        "--grid",
        action="store_true",
        help="print the cycle-by-rank table (micro-batch per cycle, '-' when idle)",
    )
    add_require_fit_argument(
        parser,
        failing="some rank's peak memory (parameters + activations) exceeds --memory-capacity "
        "(or the cost file's memory_capacity_bytes)",
    )
    add_comms_arguments(parser)
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    schedule = schedule_from_args(args)
    comms = comms_from_args(args)
    costs = costs_from_args(args, schedule)
    blocking = receive_mode(args, [comms])
    simulation = simulate(comms or schedule, costs=costs, blocking_receives=blocking)
    if args.json:
        result = simulation.metrics.to_dict()
        if comms is not None:
            sends, receives = comms_counts(comms)
            result["comms"] = {"sends": sends, "receives": receives, "blocking_receives": blocking}
        print_json(result)
        return _checked_fit(args, simulation)
    if comms is not None:
        print(describe_comms(comms, blocking_receives=blocking))
    if args.grid:
        print(format_grid(simulation))
        print(_headline(simulation.metrics))
    else:
        print(format_summary(simulation.metrics))
    return _checked_fit(args, simulation)


def _checked_fit(args: argparse.Namespace, simulation: Any) -> int:
    require_fit(
        args,
        simulation.metrics.fits,
        failure="the peak memory of some rank does not fit the memory capacity",
    )
    return 0


def _headline(m: Metrics) -> str:
    makespan = _fmt(m.makespan) + unit_suffix(m.time_unit)
    if m.time_unit in SECONDS_PER_UNIT and format_duration(m.makespan, m.time_unit) != makespan:
        makespan += f" ({format_duration(m.makespan, m.time_unit)})"
    return (
        f"makespan {makespan}, efficiency {float(m.efficiency):.2f}, "
        f"bubble {float(m.bubble_ratio):.1%} = {_fmt(m.idle_slots)} idle slots"
    )


def format_summary(m: Metrics) -> str:
    """A readable summary table of ``m``."""
    lines = [
        f"{m.schedule}: {m.n_ranks} ranks, {m.n_stages} stages, {m.n_microbatches} micro-batches",
        _headline(m),
    ]
    if m.memory_capacity_bytes is not None:
        verdict = "fits" if m.fits else "DOES NOT FIT"
        lines.append(
            f"memory capacity {m.memory_capacity_bytes:,} bytes "
            f"({format_bytes(m.memory_capacity_bytes)}): {verdict}"
        )
    unit = unit_suffix(m.time_unit).strip()
    headers = (
        "rank",
        f"busy ({unit})",
        f"idle ({unit})",
        "peak activation bytes",
        "peak in flight",
    )
    rows = [
        (
            str(r.rank),
            _fmt(r.busy),
            _fmt(r.idle),
            _bytes(r.peak_activation_bytes),
            str(r.peak_inflight),
        )
        for r in m.ranks
    ]
    lines += ["", format_table(headers, rows)]
    return "\n".join(lines)


def _bytes(n_bytes: int) -> str:
    """Exact bytes, and in binary units once that says more: ``4,000,000 (3.81 MiB)``."""
    exact = f"{n_bytes:,}"
    return exact if n_bytes < 1024 else f"{exact} ({format_bytes(n_bytes)})"


def _fmt(value: Any) -> str:
    number = as_number(value)
    return f"{number:g}" if isinstance(number, float) else str(number)
