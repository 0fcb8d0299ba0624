"""The ``pipesim`` command line: a thin shell over the library.

Every verb lives in its own module under :mod:`pipesim.cli` and exposes
``register(subparsers)``; the module sets ``func(args) -> int`` on its parser.
``python -m pipesim`` runs the same ``main``. ``main(argv)`` returns the exit
status and never raises for bad input: a
:class:`~pipesim.errors.PipesimError` becomes ``pipesim: error: ...`` on
stderr and exit status 1 (argparse's own usage errors exit with 2).
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence
from typing import NoReturn

from pipesim.errors import PipesimError

__all__ = ["build_parser", "main"]

# Verb modules under pipesim.cli, in the order `pipesim --help` lists them. Each has
# register(subparsers) and imports its heavy dependencies (plotly, torch) only when run.
_VERB_MODULES = (
    "_schedules",
    "_simulate",
    "_synthesize",
    "_plot",
    "_trace",
    "_verify",
    "_calibrate",
    "_plan",
    "_completion",
)


class _Parser(argparse.ArgumentParser):
    """argparse, with usage errors spelled like every other error: ``pipesim: error: ...``."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"pipesim: error: {message} (see `{self.prog} --help`)\n")


def build_parser() -> argparse.ArgumentParser:
    """The full argument parser (used by ``main`` and by the docs)."""
    from pipesim import __version__

    parser = _Parser(
        prog="pipesim",
        description=(
            "Simulate pipeline-parallel schedules: makespan, idle time, bubble and peak "
            "activation memory per device, before spending GPU hours."
        ),
    )
    parser.add_argument("--version", action="version", version=f"pipesim {__version__}")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in _VERB_MODULES:
        importlib.import_module(f"pipesim.cli.{name}").register(subparsers)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run ``pipesim`` with ``argv`` (default: ``sys.argv[1:]``); return the exit status."""
    parser = build_parser()
    args = parser.parse_args(argv)
    if getattr(args, "func", None) is None:
        parser.print_help(sys.stderr)
        return 2
    try:
        status: int = args.func(args)
    except PipesimError as exc:
        print(f"pipesim: error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("pipesim: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # e.g. `pipesim schedules | head`
        return 0
    return status
