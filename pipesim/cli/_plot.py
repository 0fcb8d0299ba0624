"""``pipesim plot``: a schedule's timeline and memory as a standalone HTML page or an image.

The format follows the suffix of ``-o``: ``.html`` (interactive, offline),
``.png``, ``.svg`` or ``.pdf`` (Plotly's image export through kaleido and a
Chrome / Chromium on the machine); any other suffix is refused.

With ``--compare`` several schedules (or one schedule under several settings)
are stacked on one shared time axis. Each source may carry its own settings
after a colon, ``NAME:key=value:key=value``, where a key is any schedule or
cost flag without its dashes, e.g. ``1f1b:microbatches=16`` or
``gpipe:link-latency=0.5``, or the short keys the labels print (``p=``,
``m=``, ``v=``); they override the flags given for all. When the compared
schedules hold different numbers of stages per rank, the cost flags describe
one rank's layer block and each schedule's stages get their share
(:mod:`pipesim.fair`), so the same model is compared.

With ``--measured FILE`` (the JSON report of ``pipesim verify --json -o FILE``,
which embeds the measured trace, or a trace from ``pipesim verify --trace-out``; or
``--measured RANK0.json RANK1.json ...``, torch.profiler Chrome traces read by
:mod:`pipesim.kineto`, predicted from the cost file ``pipesim calibrate --from-trace``
would write of them unless costs are given) the measured step is drawn under the
predicted one, rank by rank, with the error per action kind (:mod:`pipesim.plot.overlay`).
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from pipesim.cli._common import (
    COUNT_TYPES,
    add_comms_arguments,
    add_cost_arguments,
    add_iteration_arguments,
    add_schedule_arguments,
    check_suffix,
    comms_from_args,
    costs_from_args,
    describe_comms,
    iterations_from_args,
    read_value,
    receive_mode,
    schedule_from_args,
    usage_error,
)
from pipesim.cli._completion import mark_schedule_argument
from pipesim.errors import PipesimError
from pipesim.schedules import schedule_names
from pipesim.suggest import did_you_mean

#: Output formats of ``-o``, by suffix.
FORMATS = (".html", ".htm", ".png", ".svg", ".pdf")

# The short keys that labels print (`1f1b p=4 m=8 v=2`), accepted back as settings, and
# the pipeline-parallel degree's flag name and old spelling (its dest is n_ranks).
_ALIASES = {
    "p": "n_ranks",
    "pipeline_parallel": "n_ranks",
    "stages": "n_ranks",
    "m": "microbatches",
    "v": "virtual",
    "no_overlap_comm": "blocking_sends",  # the old spelling
}

# Flags a source's own settings may override: dest -> kind of value.
_SIZE_KEYS = {
    "n_ranks": "count",
    "microbatches": "count",
    "virtual": "count",
    "group_size": "count",
    "forward_only": "switch",
}
_COST_KEYS = {
    "costs": "text",
    "forward_time": "value",
    "backward_time": "value",
    "input_grad_time": "value",
    "weight_grad_time": "value",
    "overlap_time": "value",
    "activation_bytes": "value",
    "weight_grad_bytes": "value",
    "message_bytes": "value",
    "param_bytes": "value",
    "optimizer_time": "value",
    "sync_time": "value",
    "link_latency": "value",
    "link_bandwidth": "value",
    "link_concurrency": "count",
    "memory_capacity": "value",
    "blocking_sends": "switch",
    "time_unit": "text",
}
_SETTING_KEYS = {**_SIZE_KEYS, **_COST_KEYS}


def register(subparsers: Any) -> None:
    """Add ``plot``."""
    parser = subparsers.add_parser(
        "plot",
        help="draw the timeline and memory of a step (HTML, PNG, SVG or PDF)",
        description=(
            "Simulate one step and draw a timeline (a row per rank, a lane per busy link, a "
            "bar per action coloured by op, memory per rank below): an interactive HTML page "
            "that opens offline, or a PNG / SVG / PDF image, chosen by the suffix of -o. "
            "With --compare, stack several schedules on one time axis; each source may carry "
            "its own settings as NAME:key=value:..., e.g. "
            "`pipesim plot 1f1b:m=4 1f1b:m=16 --compare -p 4`. With --measured, draw a "
            "measured step (a pipesim verify --json report or --trace-out file) under its "
            "prediction."
        ),
    )
    sources = parser.add_argument(
        "schedules",
        nargs="*",
        metavar="NAME|FILE",
        help="a built-in schedule (see `pipesim schedules`) or a .json / .csv schedule file, "
        "optionally followed by :key=value settings; several with --compare; none with "
        "--measured takes the measured schedule",
    )
    mark_schedule_argument(sources)
    add_schedule_arguments(parser, source=False)
    add_cost_arguments(parser)
    out = parser.add_argument_group("output")
    out.add_argument(
        "-o",
        "--output",
        default="timeline.html",
        metavar="FILE",
        help="the file to write, its format by suffix: .html (default timeline.html), .png, "
        ".svg or .pdf (images need kaleido, pip install 'pipesim[image]', and a Chromium)",
    )
    out.add_argument(
        "--compare",
        action="store_true",
        help="stack the given schedules on one shared time axis",
    )
    out.add_argument(
        "--chunk-costs",
        choices=("auto", "split", "as-given"),
        default="auto",
        help="--compare of schedules with different stages per rank: `split` divides each "
        "stage's time and activation / parameter bytes by its stages per rank (the flags "
        "describe one rank's layer block, the same model for every schedule); `as-given` "
        "uses them per stage; `auto` (default) splits when the stages per rank differ",
    )
    out.add_argument(
        "--measured",
        nargs="+",
        metavar="FILE",
        help="a measured step: the JSON report of `pipesim verify --json -o FILE`, a "
        "trace from `pipesim verify --trace-out FILE`, or torch.profiler Chrome traces of "
        "a pipeline-parallel step (one per rank, or one holding every rank; predicted "
        "from their own fit unless cost flags or --costs are given); draw it under the "
        "prediction, rank by rank, with the error per action kind",
    )
    out.add_argument(
        "--cdn",
        action="store_true",
        help="link plotly.js from cdn.plot.ly instead of embedding it: about 4.6 MB "
        "smaller, but viewing needs a network",
    )
    out.add_argument("--no-memory", action="store_true", help="leave out the memory panel")
    out.add_argument("--title", help="the figure's title (default: schedule and sizes)")
    add_comms_arguments(parser)
    add_iteration_arguments(parser)
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from pipesim.plot.style import headline

    sources: list[str] = args.schedules
    suffix = check_suffix(args.output, FORMATS, verb="plot", what="HTML or an image")
    if args.measured is not None:
        return _run_measured(args, suffix)
    if not sources:
        raise PipesimError(
            "give a schedule to plot, e.g. `pipesim plot 1f1b -p 4 -m 8`, or --measured FILE"
        )
    if args.compare and len(sources) < 2:
        raise PipesimError(
            f"nothing to compare: --compare needs two or more schedules, got {len(sources)} "
            f"({', '.join(sources)}); add another, e.g. `pipesim plot gpipe 1f1b --compare "
            "-p 4 -m 8`, or vary one: `1f1b:m=4 1f1b:m=8`"
        )
    if not args.compare and len(sources) > 1:
        raise PipesimError(
            f"got {len(sources)} schedules ({', '.join(sources)}); add --compare to stack "
            "them on one time axis, or give one"
        )
    simulations, labels, note, runs = _simulate_sources(args, sources)
    fig = _figure(args, simulations, labels, note, runs)
    path = write_figure(fig, args.output, suffix=suffix, cdn=args.cdn)
    size = path.stat().st_size
    print(f"wrote {path} ({size:,} bytes{', plotly.js from the CDN' if args.cdn else ''})")
    if note:
        print(f"  {note}")
    for simulation in simulations:
        if simulation.comms is not None:
            blocking = not args.posted_receives
            print(f"  {describe_comms(simulation.comms, blocking_receives=blocking)}")
    for label, simulation in zip(labels, simulations, strict=True):
        print(f"  {label}: {headline(simulation.metrics)}")
    return 0


def _simulate_sources(
    args: argparse.Namespace, sources: list[str]
) -> tuple[list[Any], list[str], str, list[Any]]:
    """Simulate each source; the labels, a note when chunk costs were split, and with
    ``--steps`` each source's iterations (pipesim.iterations)."""
    from pipesim.engine import simulate
    from pipesim.fair import per_chunk_costs
    from pipesim.plot.timeline import default_label

    prepared, first = [], None
    for source in sources:
        name, settings = split_settings(source)
        local = apply_settings(args, name, settings)
        first = first or local
        schedule = schedule_from_args(local)
        costs = costs_from_args(local, schedule)
        prepared.append((name, settings, schedule, comms_from_args(local), costs))
    blocking = receive_mode(first or args, [comms for _, _, _, comms, _ in prepared])
    virtuals = {schedule.n_stages // schedule.n_ranks for _, _, schedule, _, _ in prepared}
    split = args.compare and (
        args.chunk_costs == "split" or (args.chunk_costs == "auto" and len(virtuals) > 1)
    )
    simulations, labels, runs = [], [], []
    for name, settings, schedule, comms, costs in prepared:
        virtual = schedule.n_stages // schedule.n_ranks
        if split:
            costs = per_chunk_costs(costs, virtual=virtual)
        if comms is not None and (args.steps is not None or args.optimizer_sync is not None):
            raise PipesimError(
                "--steps and --optimizer-sync draw a compute schedule's iterations; plot the "
                "compute schedule the comms CSV was lowered from"
            )
        iterations = iterations_from_args(args, schedule, costs)
        if iterations is not None:  # K iterations drawn as one run, optimizer steps apart
            simulation = iterations.simulation
            runs.append(iterations)
        else:
            simulation = simulate(comms or schedule, costs=costs, blocking_receives=blocking)
        simulations.append(simulation)
        label = default_label(simulation)
        if name not in schedule_names():
            label = f"{Path(name).name}: {label}"
        extra = [f"{k}={v}" for k, v in settings.items() if _dest(k) in _COST_KEYS]
        labels.append(" ".join([label, *extra]))
    note = ""
    if split:
        note = (
            "same model: the costs describe one rank's layer block; a schedule with V stages "
            "per rank gets 1/V of its time and activation bytes per stage (--chunk-costs)"
        )
    return simulations, _unique(labels), note, runs


def _figure(
    args: argparse.Namespace,
    simulations: list[Any],
    labels: list[str],
    note: str,
    runs: list[Any],
) -> Any:
    from pipesim.plot import compare_figure, timeline_figure
    from pipesim.plot.iterations import iterations_figure

    if runs and not args.compare:
        return iterations_figure(runs[0], memory=not args.no_memory, title=args.title)

    if args.compare:
        title = args.title or f"{len(simulations)} schedules on one time axis"
        if note:
            title += f"<br><sup>{note}</sup>"
        return compare_figure(simulations, labels=labels, memory=not args.no_memory, title=title)
    return timeline_figure(simulations[0], memory=not args.no_memory, title=args.title)


def _run_measured(args: argparse.Namespace, suffix: str) -> int:
    from pipesim.engine import simulate
    from pipesim.plot.overlay import kind_errors, overlay_figure

    if args.compare or len(args.schedules) > 1:
        raise PipesimError("--measured draws one step against its prediction: drop --compare")
    measured = _load_measured(args.measured)
    if args.schedules:
        name, settings = split_settings(args.schedules[0])
        local = apply_settings(args, name, settings)
        schedule = schedule_from_args(local)
        if schedule.orders != measured.schedule.orders:
            raise PipesimError(
                f"{args.measured!r} measured schedule {measured.schedule.name!r}, which differs "
                f"from {args.schedules[0]!r} with these sizes; give the schedule it ran, or none "
                "to take it from the file"
            )
    else:
        local, schedule = args, measured.schedule
    flags_given = args.costs is not None or any(
        getattr(local, dest, None) not in (None, False) for dest in _COST_KEYS
    )
    costs = costs_from_args(local, schedule) if flags_given else measured.costs
    predicted = simulate(schedule, costs=costs)
    fig = overlay_figure(predicted, measured, title=args.title)
    path = write_figure(fig, args.output, suffix=suffix, cdn=args.cdn)
    print(f"wrote {path} ({path.stat().st_size:,} bytes): predicted and measured")
    for line in kind_errors(predicted, measured).lines():
        print(f"  {line}")
    return 0


def _load_measured(paths: list[str]) -> Any:
    """The measured step of ``--measured``: a pipesim trace or verify report, or the
    first step of torch.profiler traces with the costs fitted from all of their steps."""
    from pipesim.files import read_json
    from pipesim.kineto import is_kineto, profile_costs
    from pipesim.trace_io import load_trace
    from pipesim.views import step_of

    if len(paths) == 1 and not is_kineto(read_json(paths[0], what="--measured")):
        return load_trace(paths[0])
    costs, _, found = profile_costs(paths)
    step = found[0].step
    print(f"measured: {found[0].label} of {len(found)} step(s) in {', '.join(paths)}")
    return step_of(step.trace, schedule=step.schedule, costs=costs)


def write_figure(fig: Any, output: str, *, suffix: str, cdn: bool = False) -> Path:
    """Write ``fig`` as HTML or, by suffix, a static image."""
    if suffix in (".html", ".htm"):
        from pipesim.plot import write_html

        return write_html(fig, output, cdn=cdn)
    from pipesim.plot.image import write_image

    return write_image(fig, output)


def _dest(key: str) -> str:
    key = key.replace("-", "_")
    return _ALIASES.get(key, key)


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
        if _dest(key) not in _SETTING_KEYS:
            names = [k.replace("_", "-") for k in _SETTING_KEYS if k != "n_ranks"]
            valid = ", ".join(sorted([*names, *(a.replace("_", "-") for a in _ALIASES)]))
            raise usage_error(
                f"unknown setting {key!r} in {source!r}{did_you_mean(key, names)}; write "
                f"NAME:key=value with key one of {valid}"
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
        dest = _dest(key)
        kind = _SETTING_KEYS[dest]
        if kind == "count":
            try:
                setattr(local, dest, COUNT_TYPES[dest](value))
            except argparse.ArgumentTypeError as exc:
                raise usage_error(f"setting {key} of {source!r}: {exc}") from None
        elif kind == "value":
            setattr(local, dest, read_value(dest, value, name=f"setting {key} of {source!r}"))
        elif kind == "switch":
            if value.lower() not in {"", "true", "yes", "1", "false", "no", "0"}:
                raise usage_error(
                    f"setting {key} of {source!r} is on or off: write {key}, {key}=true or "
                    f"{key}=false, not {key}={value}"
                )
            setattr(local, dest, value.lower() in {"", "true", "yes", "1"})
        else:
            if not value:
                raise usage_error(f"setting {key} of {source!r} needs a value: {key}=X")
            setattr(local, dest, value)
    return local


def _unique(labels: list[str]) -> list[str]:
    seen: dict[str, int] = {}
    out = []
    for label in labels:
        seen[label] = seen.get(label, 0) + 1
        out.append(label if seen[label] == 1 else f"{label} ({seen[label]})")
    return out
