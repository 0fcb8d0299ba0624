"""``pipesim trace``: a simulated step as Chrome trace event JSON for Perfetto."""

from __future__ import annotations

import argparse
from typing import Any

from pipesim.cli._common import (
    add_cost_arguments,
    add_schedule_arguments,
    costs_from_args,
    schedule_from_args,
)

# The keys of pipesim.export.US_PER_UNIT, spelled here so that `pipesim --help` stays light.
_TIME_UNITS = ("s", "ms", "us", "ns")


def register(subparsers: Any) -> None:
    """Add ``trace``."""
    parser = subparsers.add_parser(
        "trace",
        help="write a step as Chrome trace JSON (ui.perfetto.dev, chrome://tracing)",
        description=(
            "Simulate one step and write Chrome trace event JSON: a track per rank with a "
            "slice per action, send tracks for transfers that take time, flow arrows from "
            "each send to its receive, and memory counters per rank. Open it in "
            "ui.perfetto.dev or chrome://tracing."
        ),
    )
    add_schedule_arguments(parser)
    add_cost_arguments(parser)
    out = parser.add_argument_group("output")
    out.add_argument(
        "-o",
        "--output",
        default="trace.json",
        metavar="FILE",
        help="the JSON file to write (default: trace.json)",
    )
    out.add_argument(
        "--time-unit",
        choices=_TIME_UNITS,
        default="s",
        help="what one pipesim time unit stands for; trace times are microseconds, so a "
        "time t is written as t * 1e6 (s), t * 1e3 (ms), t (us) or t / 1e3 (ns); default s",
    )
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from pipesim.engine import simulate
    from pipesim.export import write_chrome_trace

    schedule = schedule_from_args(args)
    simulation = simulate(schedule, costs=costs_from_args(args, schedule))
    path = write_chrome_trace(simulation, args.output, time_unit=args.time_unit)
    trace = simulation.trace
    print(
        f"wrote {path} ({path.stat().st_size:,} bytes): {len(trace.actions)} actions, "
        f"{len(trace.transfers)} messages on {trace.n_ranks} ranks, one time unit = 1 "
        f"{args.time_unit}; open it in https://ui.perfetto.dev or chrome://tracing"
    )
    return 0
