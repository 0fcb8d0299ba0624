"""``pipesim trace``: a simulated step as Chrome trace event JSON for Perfetto."""

from __future__ import annotations

import argparse
from typing import Any

from pipesim.cli._common import (
    add_comms_arguments,
    add_cost_arguments,
    add_iteration_arguments,
    add_schedule_arguments,
    check_suffix,
    comms_from_args,
    costs_from_args,
    describe_comms,
    iterations_from_args,
    receive_mode,
    schedule_from_args,
)
from pipesim.exact import as_number


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
        help="the .json file to write (default: trace.json); trace event times are "
        "microseconds, converted from --time-unit (abstract units are drawn as seconds)",
    )
    add_comms_arguments(parser)
    add_iteration_arguments(parser)
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from pipesim.engine import simulate
    from pipesim.errors import PipesimError
    from pipesim.export import write_chrome_trace

    check_suffix(args.output, (".json",), verb="trace", what="Chrome trace event JSON")
    schedule = schedule_from_args(args)
    comms = comms_from_args(args)
    blocking = receive_mode(args, [comms])
    costs = costs_from_args(args, schedule)
    if comms is not None and (args.steps is not None or args.optimizer_sync is not None):
        raise PipesimError(
            "--steps and --optimizer-sync trace a compute schedule's iterations; trace the "
            "compute schedule the comms CSV was lowered from"
        )
    iterations = iterations_from_args(args, schedule, costs)
    if iterations is not None:  # K iterations as one run, with an optimizer slice each
        simulation = iterations.simulation
        path = write_chrome_trace(simulation, args.output, optimizer=iterations.optimizer)
    else:
        simulation = simulate(comms or schedule, costs=costs, blocking_receives=blocking)
        path = write_chrome_trace(simulation, args.output)
    unit = simulation.costs.time_unit
    trace = simulation.trace
    scale = "abstract units drawn as 1 s each" if unit == "unit" else f"times in {unit}"
    print(
        f"wrote {path} ({path.stat().st_size:,} bytes): {len(trace.actions)} actions, "
        f"{len(trace.transfers)} messages on {trace.n_ranks} ranks, {scale}; open it in "
        "https://ui.perfetto.dev or chrome://tracing"
    )
    if comms is not None:
        print(f"  {describe_comms(comms, blocking_receives=blocking)}")
    if iterations is not None:
        print(
            f"  {iterations.steps} iterations, optimizer sync {iterations.sync}: "
            f"{len(iterations.optimizer)} optimizer steps; steady-state period "
            + (
                "not known (it did not repeat)"
                if iterations.period is None
                else f"{as_number(iterations.period.period)} {unit}"
            )
        )
    return 0
