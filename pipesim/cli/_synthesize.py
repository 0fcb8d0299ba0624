"""``pipesim synthesize``: make a schedule for these costs under a memory limit."""

from __future__ import annotations

import argparse
from dataclasses import replace
from typing import Any

from pipesim.cli._common import (
    add_cost_arguments,
    add_size_arguments,
    costs_for_stages,
    print_json,
    seconds,
    value_argument,
)
from pipesim.cli._progress import Progress, wanted
from pipesim.costs import CostModel
from pipesim.errors import PipesimError
from pipesim.exact import as_number
from pipesim.iterations import DEFAULT_SYNC, SYNCS
from pipesim.schedule_io import save_schedule
from pipesim.synth import PLACEMENTS, SynthesisResult, synthesize
from pipesim.synth.synthesize import OBJECTIVES
from pipesim.text_table import format_table
from pipesim.units import unit_suffix


def register(subparsers: Any) -> None:
    """Add ``synthesize``."""
    parser = subparsers.add_parser(
        "synthesize",
        help="make a schedule for the given costs and memory limit",
        description=(
            "Build per-rank orders of F, I and W for the given per-stage costs so that no "
            "rank holds more than --memory-limit of activations, evaluate them with the exact "
            "simulator next to every built-in schedule that fits the same limit, and keep the "
            "fastest. Prints its makespan and bubble beside the best built-in schedule and a "
            "lower bound; -o writes it as JSON or torch CSV."
        ),
    )
    size = parser.add_argument_group("problem")
    add_size_arguments(
        size, required=True, virtual_help="stages per rank (default 1; 2 with --placement v)"
    )
    size.add_argument(
        "--placement",
        choices=PLACEMENTS,
        default="looped",
        help="stage -> rank: looped (stage s on rank s mod p, the default) or v "
        "(rank r holds stages r and 2p-1-r, needs V = 2)",
    )
    value_argument(
        size,
        "--memory-limit",
        required=True,
        metavar="LIMIT",
        help="activation memory per rank: micro-batches (e.g. 8, 2.5, 16/3), each the "
        "most one micro-batch holds on the rank (its activation bytes, or its weight-grad "
        "bytes if larger), or bytes with a unit (e.g. 20GiB = 20 * 2^30 bytes, 20GB = "
        "20 * 10^9)",
    )
    add_cost_arguments(parser)
    search = parser.add_argument_group("search")
    search.add_argument(
        "--exact",
        action="store_true",
        help="also run the CP-SAT solver (small problems; pip install "
        "'pipesim[exact]'): a proven lower bound and often a better schedule",
    )
    search.add_argument(
        "--overlap-fb",
        action="store_true",
        help="with --placement v, also try running a forward and the other chunk's full "
        "backward as one overlapped unit (DualPipe's F&B pair, priced by --overlap-time); "
        "kept only where the simulated makespan is shorter",
    )
    search.add_argument(
        "--quick",
        action="store_true",
        help="try only the greedy policies that win most often (faster for large p and m)",
    )
    search.add_argument(
        "--objective",
        choices=OBJECTIVES,
        default="step",
        help="minimize one step's makespan (step, default) or the steady-state iteration "
        "period under --optimizer-sync (period; with post-validation the longest per-rank "
        "span, the zero-bubble paper's cost)",
    )
    search.add_argument(
        "--optimizer-sync",
        choices=SYNCS,
        default=DEFAULT_SYNC,
        help=f"the optimizer synchronization the period objective assumes (default "
        f"{DEFAULT_SYNC}, Megatron-LM's; docs/steady-state.md)",
    )
    search.add_argument(
        "--time-limit",
        type=seconds,
        default=10.0,
        metavar="S",
        help="seconds the exact solver may run (default 10)",
    )
    out = parser.add_argument_group("output")
    out.add_argument("-o", "--output", metavar="FILE", help="write the schedule (.json or .csv)")
    out.add_argument(
        "--json",
        action="store_true",
        help="print simulate --json's object plus lower_bound, gap, winner, ...",
    )
    out.add_argument(
        "--progress",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="a progress bar over the candidates on stderr (default: on a terminal only); "
        "stdout is the same either way",
    )
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    if not args.time_limit > 0:  # also refuses nan
        raise PipesimError(
            f"--time-limit must be a positive number of seconds, got {args.time_limit}"
        )
    virtual = args.virtual or (2 if args.placement == "v" else 1)
    costs = costs_for_stages(args, args.n_ranks * virtual)
    if args.costs is None and args.backward_time is None:
        # Built-ins with a full backward B are compared at B = I + W, what splitting it costs.
        costs = replace(
            costs,
            stages=tuple(replace(s, backward=s.input_grad + s.weight_grad) for s in costs.stages),
        )
    progress = Progress(enabled=wanted(args.progress), desc="synthesizing", unit="candidate")
    try:
        result = _synthesize(args, costs, virtual, progress)
    finally:
        progress.close()
    if args.output:
        save_schedule(result.schedule, args.output)
    if args.json:
        print_json(result.to_dict())
    else:
        print(format_result(result))
        if args.output:
            print(f"wrote {args.output}")
    return 0


def _synthesize(
    args: argparse.Namespace, costs: CostModel, virtual: int, progress: Progress
) -> SynthesisResult:
    return synthesize(
        n_ranks=args.n_ranks,
        n_microbatches=args.microbatches,
        memory_limit=args.memory_limit,
        costs=costs,
        virtual=virtual,
        placement=args.placement,
        exact=args.exact,
        exact_time_limit_s=args.time_limit,
        quick=args.quick,
        overlap_fb=args.overlap_fb,
        progress=progress,
        objective=args.objective,
        sync=args.optimizer_sync,
    )


def format_result(result: SynthesisResult) -> str:
    """The synthesized schedule beside the best built-in one and the bound."""
    pb, m = result.problem, result.metrics
    lines = [
        f"synthesized for p={pb.n_ranks}, v={pb.virtual} ({pb.placement_name}), "
        f"m={pb.n_microbatches}, memory limit {pb.limit} per rank; winner: {result.winner}",
    ]
    rows = [
        (
            "synthesized",
            _fmt(m.makespan),
            f"{float(m.bubble_ratio):.1%}",
            f"{max(result.peak_activation_bytes):,}",
        )
    ]
    best, best_metrics = result.best_builtin, result.best_builtin_metrics
    if best is not None and best_metrics is not None:
        rows.append(
            (
                f"best built-in ({best.name})",
                _fmt(best.makespan),
                f"{float(best_metrics.bubble_ratio):.1%}",
                f"{max(best.peak_activation_bytes):,}",
            )
        )
    unit = unit_suffix(pb.costs.time_unit)  # " units", " ns": every time says its unit
    lines.append(
        format_table(("schedule", f"makespan ({unit.strip()})", "bubble", "peak bytes"), rows)
    )
    if best is None:
        lines.append("no built-in schedule fits this memory limit")
    proof = " (proven optimal)" if result.optimal and result.objective == "step" else ""
    lines.append(
        f"lower bound {_fmt(result.lower_bound)}{unit}: gap {float(result.gap):.1%}{proof}"
    )
    if result.iterations is not None and result.iterations.period is not None:
        it = result.iterations
        ratio = it.period_bubble_ratio()
        assert it.period is not None and ratio is not None
        bound = result.period_lower_bound
        solver = "" if bound is None else f"; the solver's bound on it {_fmt(bound)}{unit}"
        solver += " (proven optimal)" if result.optimal else ""
        lines.append(
            f"chosen by the steady-state iteration period ({it.sync} sync): "
            f"{_fmt(it.period.period)}{unit}, bubble against it "
            f"{float(ratio):.1%} (the bound above is one step's{solver})"
        )
    return "\n".join(lines)


def _fmt(value: Any) -> str:
    number = as_number(value)
    return f"{number:g}" if isinstance(number, float) else str(number)
