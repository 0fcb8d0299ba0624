"""The ``pipesim`` command line: a thin shell over the library.

Every verb lives in its own module under :mod:`pipesim.cli` and exposes
``register(subparsers)``; the module sets ``func(args) -> int`` on its parser.
``python -m pipesim`` runs the same ``main``. ``main(argv)`` returns the exit
status and never raises for bad input: a :class:`~pipesim.errors.PipesimError`
becomes one line ``pipesim: error: ...`` on
stderr and exit status 1, or the error's ``exit_status`` where it has one (``pipesim
verify`` documents its own); argparse's own usage errors exit with 2; running out
of memory or stack says so in one line too. Anything else is a bug in pipesim:
one line ``pipesim: internal error: ...`` says how to report it, and the
traceback follows only with ``--debug`` (or ``PIPESIM_DEBUG=1``).

The modules, one a verb (``register`` and its ``run``) or a part they share:

- :mod:`~pipesim.cli._simulate`: ``simulate``, one step as a table, JSON or the cycle grid;
- :mod:`~pipesim.cli._schedules`: ``schedules``, ``schedule`` and ``validate``;
- :mod:`~pipesim.cli._plot`: ``plot``, timelines and comparisons as HTML or an image;
- :mod:`~pipesim.cli._trace`: ``trace``, a simulated step for Perfetto;
- :mod:`~pipesim.cli._synthesize`: ``synthesize``, a schedule for these costs;
- :mod:`~pipesim.cli._verify`: ``verify``, the replay on torch devices;
- :mod:`~pipesim.cli._calibrate`: ``calibrate``, a cost file from real ranks or traces;
- :mod:`~pipesim.cli._plan`: ``plan``, the capacity planner;
- :mod:`~pipesim.cli._completion`: ``completion``, a shell completion script;
- :mod:`~pipesim.cli._common`: the flags the verbs share (sizes, costs, schedule sources);
- :mod:`~pipesim.cli._model_flags`: the model flags of ``verify`` and ``calibrate``;
- :mod:`~pipesim.cli._progress`: the progress bar of the long verbs.
"""

from __future__ import annotations

import argparse
import importlib
import os
import re
import sys
import traceback
from collections.abc import Sequence
from typing import Any, NoReturn

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
    """argparse, with usage errors spelled like every other error: ``pipesim: error: ...``,
    and a value that starts with a minus and a digit read as a value (``--activation-bytes
    -1GiB``, ``--latency -5us``), so that its reader says what is wrong with it: Python
    3.11's argparse only takes plain numbers (``-1``, ``-0.5``) there and calls anything
    else an unknown option. 3.13's own rule is this one (``argparse._negative_number_matcher``);
    pipesim has no option that starts with a digit, so nothing else changes."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._negative_number_matcher = re.compile(r"-\.?\d")

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
    parser.add_argument("--debug", action="store_true", help=_DEBUG_HELP)
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in _VERB_MODULES:
        importlib.import_module(f"pipesim.cli.{name}").register(subparsers)
    for verb in subparsers.choices.values():  # `pipesim simulate ... --debug` works too
        # SUPPRESS: a verb's default must not overwrite a --debug given before the verb
        verb.add_argument(
            "--debug", action="store_true", default=argparse.SUPPRESS, help=_DEBUG_HELP
        )
    return parser


_DEBUG_HELP = "show the traceback of an internal error (or set PIPESIM_DEBUG=1)"


def main(argv: Sequence[str] | None = None) -> int:
    """Run ``pipesim`` with ``argv`` (default: ``sys.argv[1:]``); return the exit status."""
    parser = build_parser()
    args = parser.parse_args(argv)
    if getattr(args, "func", None) is None:
        parser.print_help(sys.stderr)
        return 2
    debug = args.debug or os.environ.get("PIPESIM_DEBUG", "") not in ("", "0")
    try:
        status: int = args.func(args)
    except PipesimError as exc:
        # A verb may say which status an error means (pipesim verify: 2 input, 3 environment).
        status = getattr(exc, "exit_status", 1)
        _fail(f"pipesim: error: {exc}", debug=debug)
        return status if isinstance(status, int) else 1
    except KeyboardInterrupt:
        print("pipesim: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # e.g. `pipesim schedules | head`
        # Point stdout at /dev/null so that the flush at exit does not fail again.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 0
    except MemoryError:
        return _fail(
            "pipesim: error: out of memory: the input is larger than this machine can hold; "
            "use fewer ranks, stages or micro-batches (see docs/guide/limits.md)",
            debug=debug,
        )
    except RecursionError:
        return _fail(
            "pipesim: error: the input nests too deeply to process (Python's recursion limit); "
            "flatten it (see docs/guide/limits.md)",
            debug=debug,
        )
    except Exception as exc:  # a bug in pipesim, not in the input
        text = (str(exc).strip().splitlines() or [""])[0][:200]
        return _fail(
            f"pipesim: internal error: {type(exc).__name__}{': ' + text if text else ''}. This "
            "is a bug in pipesim: please report it with the command line that caused it"
            + ("" if debug else "; run again with --debug (or PIPESIM_DEBUG=1) for the traceback"),
            debug=debug,
        )
    return status


def _fail(message: str, *, debug: bool) -> int:
    if debug:
        traceback.print_exc()
    print(message, file=sys.stderr)
    return 1
