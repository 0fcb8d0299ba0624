"""``pipesim simulate``: one step of a schedule, as a table, JSON or the cycle grid; with
a calibrated cost file that keeps its runs' compute samples, also the band and the drawn
step (:func:`pipesim.band.draw_prediction`, as ``pipesim calibrate --check`` prints)."""

from __future__ import annotations

import argparse
from typing import Any

from pipesim.band import DrawnPrediction, draw_prediction, samples_from_meta
from pipesim.calibration import predict
from pipesim.cli._common import (
    add_comms_arguments,
    add_cost_arguments,
    add_iteration_arguments,
    add_require_fit_argument,
    add_schedule_arguments,
    comms_counts,
    comms_from_args,
    costs_from_args,
    describe_comms,
    iterations_from_args,
    print_json,
    receive_mode,
    require_fit,
    schedule_from_args,
    whole_number,
)
from pipesim.costs import CostModel
from pipesim.engine import simulate
from pipesim.errors import CostError, PipesimError
from pipesim.exact import as_number
from pipesim.grid import format_grid
from pipesim.metrics import Metrics, span_metrics
from pipesim.schedule import Schedule
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
    add_iteration_arguments(parser)
    _add_band_arguments(parser)
    parser.set_defaults(func=run)


#: Draws per band by default: as benchmarks/bench_fidelity.py and calibrate --check.
DRAWS = 200
#: Each draw is one engine run of the step: beyond this the band says no more.
MAX_DRAWS = 100_000


def _add_band_arguments(parser: Any) -> None:
    group = parser.add_argument_group(
        "band",
        "with a cost file from `pipesim calibrate`, which keeps each calibration run's "
        "compute times (meta.compute_samples_ns): the p10-p90 band of steps drawn with every "
        "unit of work's compute from one run's samples, and the drawn step (the median of "
        "draws from all runs' samples at once), over the span a measured step has (first "
        "compute start to last compute end)",
    )
    group.add_argument(
        "--band",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="print the band (default: when the cost file has samples)",
    )
    group.add_argument(
        "--draws",
        type=whole_number(maximum=MAX_DRAWS),
        metavar="N",
        help=f"simulated draws per band, 1 to {MAX_DRAWS:,} (default {DRAWS})",
    )
    group.add_argument(
        "--seed",
        type=whole_number(minimum=0),
        metavar="S",
        help="the draws' random seed (default 0)",
    )


def run(args: argparse.Namespace) -> int:
    schedule = schedule_from_args(args)
    comms = comms_from_args(args)
    costs = costs_from_args(args, schedule)
    blocking = receive_mode(args, [comms])
    if comms is not None and (args.steps is not None or args.optimizer_sync is not None):
        raise PipesimError(
            "--steps and --optimizer-sync run a compute schedule's iterations; simulate the "
            "compute schedule the comms CSV was lowered from"
        )
    simulation = simulate(comms or schedule, costs=costs, blocking_receives=blocking)
    iterations = iterations_from_args(args, schedule, costs)
    band = _band(args, schedule, costs, comms=comms is not None)
    if args.json:
        result = simulation.metrics.to_dict() | span_metrics(simulation.trace).to_dict()
        if iterations is not None:
            result["iterations"] = iterations.to_dict()
        if comms is not None:
            sends, receives = comms_counts(comms)
            result["comms"] = {"sends": sends, "receives": receives, "blocking_receives": blocking}
        if band is not None:
            result["band"] = band_to_dict(*band, source=args.costs)
        print_json(result)
        return _checked_fit(args, simulation)
    if comms is not None:
        print(describe_comms(comms, blocking_receives=blocking))
    if args.grid:
        print(format_grid(simulation))
        print(_headline(simulation.metrics))
    else:
        print(format_summary(simulation.metrics))
        spans = span_metrics(simulation.trace)
        print(
            f"longest rank span {_time(spans.longest, simulation.metrics.time_unit)}, "
            f"bubble against it {float(spans.bubble_ratio):.1%} (the zero-bubble paper's "
            "metric: a rank's first start to its last end)"
        )
    if iterations is not None:
        print(format_iterations(iterations))
    if band is not None:
        print(format_band(*band, time_unit=costs.time_unit, source=args.costs))
    return _checked_fit(args, simulation)


def format_iterations(iterations: Any, /) -> str:
    """The K-iteration run in three lines: its makespan and each step's, and the
    steady-state period with its bubble (docs/steady-state.md)."""
    unit = iterations.costs.time_unit
    steps = [_fmt(iterations.step_makespan(k)) for k in range(iterations.steps)]
    shown = ", ".join(steps[:8]) + (", ..." if len(steps) > 8 else "")
    period, ratio = iterations.period, iterations.period_bubble_ratio()
    head = (
        f"{iterations.steps} iteration{'s' if iterations.steps != 1 else ''}, optimizer sync "
        f"{iterations.sync}: makespan {_time(iterations.makespan, unit)} (steps {shown})\n"
    )
    if period is None or ratio is None:
        return head + f"no steady-state iteration period: {iterations.no_period}"
    return head + (
        f"steady-state iteration period {_time(period.period, unit)}, bubble against it "
        f"{float(ratio):.1%}\n  {period.describe()}"
    )


def _band(
    args: argparse.Namespace, schedule: Schedule, costs: CostModel, *, comms: bool
) -> tuple[DrawnPrediction, Any] | None:
    """The band and drawn step of ``--costs``' calibration samples with the prediction
    from its medians over the same span, or None: no ``--band`` and no samples (or a
    comms schedule, whose band nothing draws yet)."""
    from pipesim.files import read_json

    asked = args.band is True or args.draws is not None or args.seed is not None
    if args.band is False:
        if args.draws is not None or args.seed is not None:
            raise PipesimError("--draws and --seed set the band's draws: drop --no-band or them")
        return None
    if args.costs is None:
        if not asked:
            return None
        raise PipesimError(
            "--band, --draws and --seed draw compute times from a cost file's calibration "
            "samples; give --costs FILE written by `pipesim calibrate`"
        )
    data = read_json(args.costs, what="cost")  # costs_from_args has read it: a JSON object
    meta = data.get("meta")
    runs = None
    if isinstance(meta, dict):
        try:
            runs = samples_from_meta(schedule, meta, time_unit=costs.time_unit, source=args.costs)
        except CostError as exc:
            raise CostError(f"{exc}; or simulate without the band: --no-band") from None
    if runs is None:
        if not asked:
            return None
        raise PipesimError(
            f"{args.costs!r} keeps no compute samples (meta.compute_samples_ns), so there is "
            "no band to draw; write the cost file with `pipesim calibrate -o FILE`, or drop "
            "--band / --draws / --seed"
        )
    if comms:
        if not asked:
            return None
        raise PipesimError(
            "--band draws the steps of a compute schedule; simulate the compute schedule the "
            "comms CSV was lowered from, or drop --band"
        )
    drawn = draw_prediction(
        schedule,
        costs,
        runs,
        draws=DRAWS if args.draws is None else args.draws,
        seed=0 if args.seed is None else args.seed,
    )
    return drawn, predict(schedule, costs)


def format_band(drawn: DrawnPrediction, predicted: Any, /, *, time_unit: str, source: str) -> str:
    """Two lines: the drawn step and its p10-p90 band beside the prediction from the cost
    file's medians over the same span, and where the draws came from."""
    band = drawn.band
    low, high = (round(q * 100) for q in band.quantiles)
    unit = unit_suffix(time_unit)
    return (
        f"drawn step {_time(drawn.drawn.median, time_unit)}, p{low}-p{high} band "
        f"{_fmt(band.low)}-{_fmt(band.high)}{unit}; the medians' step {_fmt(predicted)}{unit}: "
        "each from the first compute start to the last compute end, as a step is measured\n"
        f"  {len(band.spans)} draws (seed {drawn.seed}) from the compute samples of the "
        f"{drawn.n_runs} calibration run{'s' if drawn.n_runs != 1 else ''} in {source}: the "
        "band draws each step from one run, the drawn step from all runs pooled"
    )


def band_to_dict(drawn: DrawnPrediction, predicted: Any, /, *, source: str) -> dict[str, Any]:
    """The ``band`` object of ``simulate --json`` (docs/architecture.md)."""
    return {
        "drawn": as_number(drawn.drawn.median),
        "low": as_number(drawn.band.low),
        "high": as_number(drawn.band.high),
        "quantiles": list(drawn.band.quantiles),
        "predicted": as_number(predicted),
        "draws": len(drawn.band.spans),
        "seed": drawn.seed,
        "runs": drawn.n_runs,
        "source": source,
    }


def _checked_fit(args: argparse.Namespace, simulation: Any) -> int:
    require_fit(
        args,
        simulation.metrics.fits,
        failure="the peak memory of some rank does not fit the memory capacity",
    )
    return 0


def _time(value: Any, time_unit: str) -> str:
    """``value`` with its unit, and in a readable unit when that differs: ``1234567 ns
    (1.23457 ms)``."""
    text = _fmt(value) + unit_suffix(time_unit)
    if time_unit in SECONDS_PER_UNIT and format_duration(value, time_unit) != text:
        text += f" ({format_duration(value, time_unit)})"
    return text


def _headline(m: Metrics) -> str:
    makespan = _time(m.makespan, m.time_unit)
    return (
        f"makespan {makespan}, efficiency {float(m.efficiency):.2f}, "
        f"bubble {float(m.bubble_ratio):.1%}{_in_slots(m)}"
    )


def _in_slots(m: Metrics) -> str:
    if m.idle_slots is None:
        return " (forwards take no time: no slot to count idle time in)"
    return f" = {_fmt(m.idle_slots)} idle slots"


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
