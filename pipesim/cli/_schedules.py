"""``pipesim schedules``, ``pipesim schedule`` and ``pipesim validate``."""

from __future__ import annotations

import argparse
import sys
import textwrap
from pathlib import Path
from typing import Any

from pipesim.cli._common import add_schedule_arguments, schedule_from_args, schedule_from_source
from pipesim.errors import PipesimError
from pipesim.files import read_text, write_text
from pipesim.graph import validate
from pipesim.schedule_io import save_schedule, schedule_to_json
from pipesim.schedules import get_spec, schedule_names


def register(subparsers: Any) -> None:
    """Add the three verbs."""
    listing = subparsers.add_parser(
        "schedules",
        help="list the built-in schedules and their rules",
        description="List the built-in schedules, their parameter rules and sources.",
    )
    listing.set_defaults(func=run_schedules)

    make = subparsers.add_parser(
        "schedule",
        help="write a built-in schedule to a .json or .csv file",
        description=(
            "Generate a built-in schedule (or read a schedule file) and write it as pipesim "
            "JSON or torch's compute-only CSV (chosen by the suffix of -o), or print its "
            "JSON; --comms places the sends and receives (torch's compute_comms CSV)."
        ),
    )
    make.add_argument(
        "schedule",
        metavar="NAME|FILE",
        nargs="?",
        help="a built-in schedule (see `pipesim schedules`) or a .json / .csv schedule file",
    )
    add_schedule_arguments(make, source=False)
    make.add_argument(
        "--from-torch",
        metavar="CLASS",
        help="instead of NAME: the order a torch.distributed.pipelining schedule class runs "
        "(e.g. ScheduleZBVZeroBubble or ZBVZeroBubble), with --pipeline-parallel, "
        "--microbatches and --virtual; needs torch (the verify extra), starts no process group",
    )
    make.add_argument("-o", "--output", metavar="FILE", help=".json or .csv (default: stdout JSON)")
    make.add_argument(
        "--comms",
        action="store_true",
        help="with the sends and receives placed (SEND_F / RECV_F / SEND_B / RECV_B, torch's "
        "\"compute_comms\" CSV): each rank's program in the order pipesim's verify runs it",
    )
    make.set_defaults(func=run_schedule)

    check = subparsers.add_parser(
        "validate",
        help="check a schedule file: complete, consistent, deadlock-free",
        description=(
            "Validate a .json or .csv schedule; exit 1 naming every problem found. A CSV with "
            "sends and receives (torch's compute_comms format) is also checked for messages "
            "that the two ends would pair differently and for blocking sends and receives "
            "that wait on each other in a cycle."
        ),
    )
    check.add_argument("file", metavar="FILE", help="a .json or .csv schedule file")
    check.set_defaults(func=run_validate)


def run_schedules(args: argparse.Namespace) -> int:
    for name in schedule_names():
        spec = get_spec(name)
        print(f"{name}")
        for label, text in (("what", spec.summary), ("rules", spec.rules), ("source", spec.source)):
            print(
                textwrap.fill(
                    text, width=96, initial_indent=f"  {label:<7}", subsequent_indent=" " * 9
                )
            )
    return 0


def run_schedule(args: argparse.Namespace) -> int:
    if (args.schedule is None) == (args.from_torch is None):
        raise PipesimError(
            "give either a schedule NAME|FILE or --from-torch CLASS (exactly one), e.g. "
            "`pipesim schedule zbv --pipeline-parallel 4 --microbatches 8` or "
            "`pipesim schedule --from-torch ScheduleZBVZeroBubble -p 4 --microbatches 8`"
        )
    if args.from_torch is not None:
        from pipesim.torch_import import schedule_from_torch

        missing = [
            f
            for f, v in (
                ("--pipeline-parallel", args.n_ranks),
                ("--microbatches", args.microbatches),
            )
            if v is None
        ]
        if missing:
            raise PipesimError(f"--from-torch needs {' and '.join(missing)}")
        schedule = schedule_from_torch(
            args.from_torch,
            n_ranks=args.n_ranks,
            n_microbatches=args.microbatches,
            virtual=args.virtual,
        )
    else:
        schedule = schedule_from_args(args)
    if args.comms:
        return _write_comms(args, schedule)
    if args.output is None:
        sys.stdout.write(schedule_to_json(schedule))
    else:
        path = save_schedule(schedule, args.output)
        print(
            f"wrote {path} ({schedule.name}: {schedule.n_ranks} ranks, {schedule.n_stages} "
            f"stages, {schedule.n_microbatches} micro-batches)"
        )
    return 0


def _write_comms(args: argparse.Namespace, schedule: Any) -> int:
    from pipesim.comms import comms_to_csv, lower_comms

    text = comms_to_csv(lower_comms(schedule))
    if args.output is None:
        sys.stdout.write(text)
        return 0
    if not args.output.lower().endswith(".csv"):
        raise PipesimError(
            f"--comms writes torch's compute_comms CSV: use a .csv suffix, not {args.output!r}"
        )
    path = write_text(args.output, text)
    n_comms = text.count("SEND_")
    print(f"wrote {path} ({schedule.name}: {schedule.n_ranks} ranks, {n_comms} messages)")
    return 0


def run_validate(args: argparse.Namespace) -> int:
    if args.file.lower().endswith(".csv") and Path(args.file).is_file():
        from pipesim.comms import comms_from_csv, is_comms_csv, validate_comms

        text = read_text(args.file, what="schedule")
        if is_comms_csv(text):
            comms = comms_from_csv(text, name=Path(args.file).stem, source=args.file)
            validate_comms(comms)
            n_comms = sum(str(s).count("SEND_") for p in comms.programs for s in p)
            print(
                f"{args.file}: valid comms schedule ({comms.schedule.n_ranks} ranks, "
                f"{n_comms} messages, each sent and received in one order, no blocking cycle)"
            )
            return 0
    schedule = schedule_from_source(args.file, n_ranks=None, microbatches=None)
    validate(schedule)
    print(
        f"{args.file}: valid ({schedule.n_ranks} ranks, {schedule.n_stages} stages, "
        f"{schedule.n_microbatches} micro-batches, "
        f"{sum(len(o) for o in schedule.orders)} actions)"
    )
    return 0
