"""``pipesim plot``: a schedule's timeline and memory as one standalone HTML file.

With ``--compare`` several schedules (or one schedule under several settings)
are stacked on one shared time axis. Each source may carry its own settings
after a colon, ``NAME:key=value:key=value``, where a key is any schedule or
cost flag without its dashes, e.g. ``1f1b:microbatches=16`` or
``gpipe:link-latency=0.5``; they override the flags given for all.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from pipesim.cli._common import (
    add_cost_arguments,
    add_schedule_arguments,
    costs_from_args,
    positive_int,
    schedule_from_args,
)
from pipesim.errors import PipesimError
from pipesim.schedules import schedule_names

# Flags a source's own settings may override: dest -> kind of value.
_SIZE_KEYS = {
    "stages": "count",
    "microbatches": "count",
    "virtual": "count",
    "group_size": "count",
    "forward_only": "switch",
}
_COST_KEYS = {
    "costs": "text",
    "forward_time": "text",
    "backward_time": "text",
    "input_grad_time": "text",
    "weight_grad_time": "text",
    "overlap_time": "text",
    "activation_bytes": "text",
    "weight_grad_bytes": "text",
    "message_bytes": "text",
    "param_bytes": "text",
    "link_latency": "text",
    "link_bandwidth": "text",
    "link_concurrency": "text",
    "memory_capacity": "text",
    "no_overlap_comm": "switch",
}
_SETTING_KEYS = {**_SIZE_KEYS, **_COST_KEYS}


def register(subparsers: Any) -> None:
    """Add ``plot``."""
    parser = subparsers.add_parser(
        "plot",
        help="draw the timeline and memory of a step as standalone HTML",
        description=(
            "Simulate one step and write an interactive Plotly timeline (a row per rank, a "
            "lane per busy link, a bar per action coloured by op, memory per rank below) as "
            "one HTML file that opens offline. With --compare, stack several schedules on one "
            "time axis; each source may carry its own settings as NAME:key=value:..., e.g. "
            "`pipesim plot 1f1b:microbatches=4 1f1b:microbatches=16 --compare -p 4`."
        ),
    )
    parser.add_argument(
        "schedules",
        nargs="+",
        metavar="NAME|FILE",
        help="a built-in schedule (see `pipesim schedules`) or a .json / .csv schedule file, "
        "optionally followed by :key=value settings; several with --compare",
    )
    add_schedule_arguments(parser, source=False)
    add_cost_arguments(parser)
    out = parser.add_argument_group("output")
    out.add_argument(
        "-o",
        "--output",
        default="timeline.html",
        metavar="FILE",
        help="the HTML file to write (default: timeline.html)",
    )
    out.add_argument(
        "--compare",
        action="store_true",
        help="stack the given schedules on one shared time axis",
    )
    out.add_argument(
        "--cdn",
        action="store_true",
        help="link plotly.js from cdn.plot.ly instead of embedding it: about 4.6 MB "
        "smaller, but viewing needs a network",
    )
    out.add_argument("--no-memory", action="store_true", help="leave out the memory panel")
    out.add_argument("--title", help="the figure's title (default: schedule and sizes)")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from pipesim.engine import simulate
    from pipesim.plot import compare_figure, timeline_figure, write_html
    from pipesim.plot.style import headline
    from pipesim.plot.timeline import default_label

    sources: list[str] = args.schedules
    if args.compare and len(sources) < 2:
        raise PipesimError(
            f"nothing to compare: --compare needs two or more schedules, got {len(sources)} "
            f"({', '.join(sources)}); add another, e.g. `pipesim plot gpipe 1f1b --compare "
            "-p 4 -m 8`, or vary one: `1f1b:microbatches=4 1f1b:microbatches=8`"
        )
    if not args.compare and len(sources) > 1:
        raise PipesimError(
            f"got {len(sources)} schedules ({', '.join(sources)}); add --compare to stack "
            "them on one time axis, or give one"
        )
    output = Path(args.output)
    if output.suffix.lower() not in {".html", ".htm"}:
        raise PipesimError(
            f"pipesim plot writes HTML; give -o a name ending in .html, got {args.output!r}"
        )
    simulations = []
    labels = []
    for source in sources:
        name, settings = split_settings(source)
        local = apply_settings(args, name, settings)
        schedule = schedule_from_args(local)
        simulation = simulate(schedule, costs=costs_from_args(local, schedule))
        simulations.append(simulation)
        label = default_label(simulation)
        if name not in schedule_names():
            label = f"{Path(name).name}: {label}"
        extra = [f"{k}={v}" for k, v in settings.items() if k.replace("-", "_") in _COST_KEYS]
        labels.append(" ".join([label, *extra]))
    if args.compare:
        fig = compare_figure(
            simulations, labels=_unique(labels), memory=not args.no_memory, title=args.title
        )
    else:
        fig = timeline_figure(simulations[0], memory=not args.no_memory, title=args.title)
    path = write_html(fig, output, cdn=args.cdn)
    size = path.stat().st_size
    print(f"wrote {path} ({size:,} bytes{', plotly.js from the CDN' if args.cdn else ''})")
    for label, simulation in zip(labels, simulations, strict=True):
        print(f"  {label}: {headline(simulation.metrics)}")
    return 0


def split_settings(source: str) -> tuple[str, dict[str, str]]:
    """``"1f1b:microbatches=8:forward-only"`` -> ``("1f1b", {"microbatches": "8",
    "forward-only": ""})``; a registered name or an existing file is taken whole."""
    if source in schedule_names() or Path(source).exists() or ":" not in source:
        return source, {}
    name, *pieces = source.split(":")
    settings: dict[str, str] = {}
    for piece in pieces:
        key, _, value = piece.partition("=")
        key = key.strip()
        if key.replace("-", "_") not in _SETTING_KEYS:
            valid = ", ".join(sorted(k.replace("_", "-") for k in _SETTING_KEYS))
            raise PipesimError(
                f"unknown setting {key!r} in {source!r}; write NAME:key=value with key one of "
                f"{valid}"
            )
        settings[key] = value.strip()
    return name, settings


def apply_settings(
    args: argparse.Namespace, source: str, settings: dict[str, str]
) -> argparse.Namespace:
    """A copy of ``args`` for one source: ``schedule`` set, ``settings`` applied."""
    local = argparse.Namespace(**vars(args))
    local.schedule = source
    for key, value in settings.items():
        dest = key.replace("-", "_")
        kind = _SETTING_KEYS[dest]
        if kind == "count":
            try:
                setattr(local, dest, positive_int(value))
            except argparse.ArgumentTypeError as exc:
                raise PipesimError(f"setting {key} of {source!r}: {exc}") from None
        elif kind == "switch":
            if value.lower() not in {"", "true", "yes", "1", "false", "no", "0"}:
                raise PipesimError(
                    f"setting {key} of {source!r} is on or off: write {key}, {key}=true or "
                    f"{key}=false, not {key}={value}"
                )
            setattr(local, dest, value.lower() in {"", "true", "yes", "1"})
        else:
            if not value:
                raise PipesimError(f"setting {key} of {source!r} needs a value: {key}=X")
            setattr(local, dest, value)
    return local


def _unique(labels: list[str]) -> list[str]:
    seen: dict[str, int] = {}
    out = []
    for label in labels:
        seen[label] = seen.get(label, 0) + 1
        out.append(label if seen[label] == 1 else f"{label} ({seen[label]})")
    return out
