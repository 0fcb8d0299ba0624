"""``pipesim calibrate``: measure a model on real ranks once, write a cost file that
predicts other schedules, micro-batch counts and sizes; optionally check predictions.

It runs the mixed-backward calibration schedule (1F1B, or interleaved 1F1B with
``--virtual 2``, with odd micro-batches' backward split into I + W) with one
process per rank (``verify --dist``: gloo on the CPU), ``--repeats`` times after
a warm-up step each, ``--threads`` intra-op threads per rank, and fits per stage
and op medians plus per-message send / receive overheads, link latency and a
per-action dispatch overhead (:mod:`pipesim.calibration`). With two
``--microbatch-sizes`` it also measures the second size, and the file scales to
any size (:mod:`pipesim.scaling`). ``--check`` then runs other schedules, and
prints pipesim's prediction from the file, with a p10-p90 band drawn from the
calibration runs' own compute times and the median of draws from all of them
(:mod:`pipesim.band`), next to the measured median.
"""

from __future__ import annotations

import argparse
import importlib
import warnings
from typing import Any

from pipesim.cli._common import (
    LAYERS,
    MICROBATCHES,
    VIRTUAL,
    WARMUP,
    add_pipeline_parallel,
    positive_int,
    seconds,
    whole_number,
)
from pipesim.cli._model_flags import add_model_flags, model_options
from pipesim.errors import PipesimError
from pipesim.files import check_writable
from pipesim.metrics import error_percent
from pipesim.units import ms

_INSTALL = "pip install 'pipesim[verify]'"


def _ints(text: str) -> list[int]:
    try:
        values = [int(v) for v in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"give whole numbers like 4,8, got {text!r}") from None
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError(f"give whole numbers >= 1, got {text!r}")
    return values


def register(subparsers: Any) -> None:
    """Add ``calibrate``."""
    parser = subparsers.add_parser(
        "calibrate",
        help="measure a model on CPU ranks once; write a cost file that predicts other "
        "schedules and sizes",
        description=__doc__.split("\n\n")[0].replace("``", "") + f" Needs torch: {_INSTALL}.",
    )
    add_pipeline_parallel(parser, default=2)
    parser.add_argument(
        "--virtual",
        type=VIRTUAL,
        default=1,
        metavar="V",
        help="stages per rank of the cut to calibrate (1 or 2), default 1",
    )
    parser.add_argument(
        "-m",
        "--microbatches",
        type=MICROBATCHES,
        default=4,
        metavar="M",
        help="micro-batches of the calibration runs, default 4",
    )
    parser.add_argument(
        "--microbatch-sizes",
        type=_ints,
        default=[8],
        metavar="B[,B2]",
        help="rows per micro-batch; two sizes fit the affine size model (default 8)",
    )
    parser.add_argument(
        "--model",
        default="gpt",
        metavar="gpt|llama|mlp|MODULE:FACTORY",
        help="the model (default gpt)",
    )
    parser.add_argument(
        "--gpt-layers", type=LAYERS, default=6, metavar="N", help="GPT blocks (default 6)"
    )
    parser.add_argument(
        "--gpt-width", type=positive_int, default=256, metavar="D", help="GPT width (default 256)"
    )
    add_model_flags(parser)  # --dtype, --autocast, --llama-*: as verify's
    parser.add_argument(
        "--repeats",
        type=positive_int,
        default=3,
        metavar="K",
        help="rounds, each in fresh processes with --copies calibration steps after a "
        "warm-up (default 3)",
    )
    parser.add_argument(
        "--copies",
        type=positive_int,
        default=3,  # verify.fidelity.COPIES, without its torch import
        metavar="C",
        help="calibration steps per round, each at its own place (default 3)",
    )
    parser.add_argument(
        "--min-samples",
        type=positive_int,
        default=20,  # verify.fidelity.MIN_SAMPLES
        metavar="N",
        help="run more rounds (up to --max-repeats) while a fitted figure rests on fewer "
        "samples (default 20); calibrate warns about figures that stay below",
    )
    parser.add_argument(
        "--max-repeats",
        type=positive_int,
        default=8,  # verify.fidelity.MAX_REPEATS
        metavar="K",
        help="the most rounds to reach --min-samples (default 8)",
    )
    parser.add_argument(
        "--threads",
        # bounded: torch crashes (SIGSEGV, no message) starting 100000 threads per rank
        type=whole_number(maximum=256),
        default=1,
        metavar="T",
        help="intra-op threads per rank, 1 to 256 (default 1; recorded in the file)",
    )
    parser.add_argument(
        "--warmup",
        type=WARMUP,
        default=1,
        metavar="W",
        help="untimed steps before each measured one (default 1); each run's fresh rank "
        "processes add 2 more (verify.fidelity.BURN_IN) when W > 0: they keep touching new "
        "memory for a few steps (the file records burn_in_steps)",
    )
    parser.add_argument(
        "--timeout",
        type=seconds,
        default=300.0,
        metavar="S",
        help="stop a run after S seconds (default 300)",
    )
    parser.add_argument(
        "-o",
        "--output",
        required=True,
        metavar="FILE",
        help="the cost file to write (time unit: ns, provenance in meta)",
    )
    parser.add_argument(
        "--send-mode",
        choices=("eager", "rendezvous"),  # pipesim.costs.SEND_MODES, without its import
        default="eager",
        help="the message rule to fit and write (default eager; rendezvous: a message "
        "leaves once its receive is posted too, as gloo sends; more faithful, but only "
        "simulate, not plan, evaluates it)",
    )
    parser.add_argument(
        "--from-trace",
        nargs="+",
        metavar="FILE",
        help="fit the cost file from torch.profiler Chrome traces of a pipeline-parallel "
        "step instead of measuring (one file per rank, or one holding every rank; "
        "pipesim.kineto); needs no torch",
    )
    parser.add_argument(
        "--trace-step",
        type=whole_number(),
        default=None,
        metavar="N",
        help="with --from-trace: fit ProfilerStep#N only (default: every step the traces hold)",
    )
    parser.add_argument(
        "--check",
        metavar="NAME[,NAME...]",
        help="then measure these registered schedules and compare with the "
        "prediction from the file",
    )
    parser.add_argument(
        "--check-microbatches",
        type=_ints,
        default=None,
        metavar="M[,M...]",
        help="micro-batch counts for --check (default: -m and 4x -m)",
    )
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    check_writable(args.output, what="-o")  # refused now, not after minutes of measuring
    if args.from_trace:
        return _from_trace(args)
    warnings.filterwarnings("ignore", message="Failed to initialize NumPy")
    try:
        importlib.import_module("torch")
    except ImportError as exc:
        raise PipesimError(
            f"pipesim calibrate needs torch, which is not importable here ({exc}); install "
            f"the extra: {_INSTALL}"
        ) from None
    if len(args.microbatch_sizes) > 2:
        raise PipesimError(
            f"--microbatch-sizes takes one or two sizes, got {args.microbatch_sizes}"
        )
    checks = _check_schedules(args) if args.check else []  # refuse bad names before running
    costs, meta = _calibrate(args, args.microbatch_sizes[0])
    if len(args.microbatch_sizes) == 2:
        from pipesim.scaling import scaling_meta

        second, _ = _calibrate(args, args.microbatch_sizes[1])
        meta["microbatch_scaling"] = scaling_meta(second, microbatch_size=args.microbatch_sizes[1])
    _write(costs, meta, args.output)
    _print_costs(costs, meta, args.output)
    if checks:
        return _check(args, costs, checks, meta)
    return 0


def _options(args: argparse.Namespace) -> dict[str, Any]:
    return model_options(args)


def _calibrate(args: argparse.Namespace, microbatch_size: int) -> tuple[Any, dict[str, Any]]:
    from verify.fidelity import calibrate_cut

    return calibrate_cut(
        model=args.model,
        model_options=_options(args),
        n_ranks=args.n_ranks,
        virtual=args.virtual,
        n_microbatches=args.microbatches,
        microbatch_size=microbatch_size,
        repeats=args.repeats,
        threads=args.threads,
        warmup=max(args.warmup, 0),
        timeout_s=args.timeout,
        send_mode=args.send_mode,
        copies=args.copies,
        min_samples=args.min_samples,
        max_repeats=max(args.max_repeats, args.repeats),
    )


def _write(costs: Any, meta: dict[str, Any], path: str) -> None:
    import json

    from pipesim.costs import costs_to_dict
    from pipesim.files import write_text

    write_text(path, json.dumps(costs_to_dict(costs) | {"meta": meta}, indent=2) + "\n")


def _cost_lines(costs: Any, *, digits: int) -> list[str]:
    """A cost file's compute per stage and op (ms, ``digits`` decimals) and its overheads."""
    lines = [
        f"{op} per stage (ms): "
        + "/".join(f"{ms(getattr(s, name)):.{digits}f}" for s in costs.stages)
        for op, name in (
            ("F", "forward"),
            ("B", "backward"),
            ("I", "input_grad"),
            ("W", "weight_grad"),
        )
    ]
    link = costs.link
    lines.append(
        f"per message: send {float(link.send_overhead) / 1e3:.0f} us, receive "
        f"{float(link.receive_overhead) / 1e3:.0f} us, latency {float(link.latency) / 1e3:.0f} us; "
        f"per action: dispatch {float(costs.dispatch_overhead) / 1e3:.0f} us"
    )
    return lines


def _print_costs(costs: Any, meta: dict[str, Any], path: str) -> None:
    print(
        f"calibrated {meta['n_stages']} stages from {meta['repeats']} runs of "
        f"{meta['schedule']} (m={meta['n_microbatches']}, {meta['microbatch_size']} rows, "
        f"{meta['threads_per_rank']} thread(s) per rank, load {meta['load_average'][0]}):"
    )
    for line in _cost_lines(costs, digits=2):
        print("  " + line)
    spread = meta["compute_run_spread_pct"]
    if spread:
        widest = max(spread, key=spread.get)
        print(
            f"  runs' medians spread (largest - smallest) / median: mean "
            f"{sum(spread.values()) / len(spread):.1f}%, widest {widest} {spread[widest]:.1f}%"
        )
    faults = [f for f in meta.get("measured_step_page_faults", []) if f is not None]
    if faults:
        from verify.report import page_faults_line  # calibrating needed torch already

        print("  " + page_faults_line([max(faults)], label="the most on one rank"))
    if meta["assumed"]:
        print(f"  assumed: {'; '.join(meta['assumed'])}")
    for line in term_lines(costs, meta):
        print("  " + line)
    print(f"wrote {path}")


def term_lines(
    costs: Any, meta: dict[str, Any], *, advice: str = "calibrate with more --repeats or -m"
) -> list[str]:
    """The fitted figures a calibration cannot vouch for (few samples, or one step moving
    them far: :func:`pipesim.calibration.unstable_terms` of ``meta.terms``), one line
    each, or one line saying every figure is stable."""
    from pipesim.calibration import TermStats, unstable_terms

    terms = {
        name: TermStats(
            value=t["value"],
            samples=t["samples"],
            steps=t["steps"],
            p10=t["p10"],
            p90=t["p90"],
            step_shift=t["step_shift"],
        )
        for name, t in meta.get("terms", {}).items()
    }
    if not terms:
        return []
    # Shifts below 1% of the smallest forward are noise whatever their share of the figure.
    forwards = [s.forward for s in costs.stages if s.forward]
    floor = min(forwards) / 100 if forwards else 0
    found = unstable_terms(terms, min_samples=meta.get("min_samples", 20), floor=floor)
    if not found:
        steps = min(t.steps for t in terms.values() if t.samples)
        return [
            f"every fitted figure rests on {min(t.samples for t in terms.values() if t.samples)}+ "
            f"samples from {steps}+ steps, and no one step moves it by more than 20%"
        ]
    return [
        f"WARNING: {name} = {terms[name].value / 1e3:.0f} us is unstable: {why} "
        f"(p10-p90 of its samples {terms[name].p10 / 1e3:.0f}-{terms[name].p90 / 1e3:.0f} us); "
        f"{advice}"
        for name, why in found.items()
    ]


def _check_schedules(args: argparse.Namespace) -> list[Any]:
    """The --check schedules, each at every --check-microbatches, on the calibrated cut:
    ``p * virtual`` stages per model copy (DualPipe's copies each take the cut)."""
    from pipesim.errors import ScheduleError
    from pipesim.schedules import generate, get_spec

    counts = args.check_microbatches or [args.microbatches, 4 * args.microbatches]
    cut = args.n_ranks * args.virtual
    found = []
    for name in args.check.split(","):
        spec = get_spec(name.strip())
        for m in counts:
            fitting = None
            for virtual in dict.fromkeys((args.virtual, spec.default_virtual, 1, 2)):
                try:
                    schedule = generate(
                        spec.name, n_ranks=args.n_ranks, n_microbatches=m, virtual=virtual
                    )
                except ScheduleError:
                    continue
                if schedule.n_stages // schedule.n_copies == cut:
                    fitting = schedule
                    break
            if fitting is None:
                raise PipesimError(
                    f"--check {spec.name} at p={args.n_ranks}, m={m} does not run on a cut into "
                    f"{cut} stages; calibrate its cut in a separate run (another --virtual) or "
                    "drop it from --check"
                )
            found.append(fitting)
    return found


def _check(args: argparse.Namespace, costs: Any, schedules: list[Any], meta: dict[str, Any]) -> int:
    """Predict and measure each of ``schedules``; the band and the drawn prediction are
    :func:`pipesim.band.draw_prediction`'s from the calibration runs' samples in ``meta``
    (as ``pipesim simulate`` prints them)."""
    from pipesim.band import draw_prediction, samples_from_meta
    from pipesim.calibration import costs_for, predict
    from verify.fidelity import measure

    errors, drawn_errors = [], []
    cuts = {args.n_ranks * args.virtual: costs}
    print(
        "schedule            m   predicted (p10-p90 band)   drawn   measured (spread)   "
        "error  drawn"
    )
    for schedule in schedules:
        m = schedule.n_microbatches
        schedule_costs = costs_for(schedule, cuts)
        predicted = predict(schedule, schedule_costs)
        runs = samples_from_meta(schedule, meta, time_unit=costs.time_unit, source=args.output)
        assert runs is not None  # calibrate_cut writes them
        spread = draw_prediction(schedule, schedule_costs, runs)
        band, drawn = spread.band, spread.drawn.median
        got = measure(
            schedule,
            model=args.model,
            model_options=_options(args),
            microbatch_size=args.microbatch_sizes[0],
            repeats=args.repeats,
            threads=args.threads,
            warmup=max(args.warmup, 0),
            timeout_s=args.timeout,
        )
        error = error_percent(predicted, got.median_ns)
        drawn_error = error_percent(drawn, got.median_ns)
        errors.append(abs(error))
        drawn_errors.append(abs(drawn_error))
        print(
            f"{schedule.name:<18} {m:>3} {ms(predicted):9.2f} ms "
            f"({ms(band.low):.2f}-{ms(band.high):.2f} ms) "
            f"{ms(drawn):9.2f} ms "
            f"{ms(got.median_ns):9.2f} ms ({got.spread * 100:4.1f}%) {error:+7.1f}% "
            f"{drawn_error:+6.1f}%"
        )
    print(f"error: mean {sum(errors) / len(errors):.1f}%, max {max(errors):.1f}%")
    for line in term_lines(costs, meta):
        if line.startswith("WARNING"):
            print(line)
    print(
        f"drawn error: mean {sum(drawn_errors) / len(drawn_errors):.1f}%, "
        f"max {max(drawn_errors):.1f}%"
    )
    return 0


def _from_trace(args: argparse.Namespace) -> int:
    """``--from-trace``: the cost file of profiled steps (:func:`pipesim.kineto.profile_costs`)."""
    from pipesim.kineto import profile_costs

    if args.check:
        raise PipesimError(
            "--check measures schedules on this machine; with --from-trace, predict with "
            "`pipesim simulate NAME --costs FILE` instead"
        )
    costs, meta, found = profile_costs(
        args.from_trace, step=args.trace_step, send_mode=args.send_mode
    )
    _write(costs, meta, args.output)
    first = found[0]
    how = ["record_function ranges" if a else "forward/backward runs" for a in first.annotated]
    print(
        f"read {len(found)} step(s) ({', '.join(s.label for s in found)}) of "
        f"{meta['n_ranks']} ranks, {meta['n_stages']} stages, m={meta['n_microbatches']}:"
    )
    for rank, order in meta["actions"].items():
        busy = first.busy_ns[int(rank)]
        print(
            f"  rank {rank}: {len(order)} actions from {how[int(rank)]}, compute "
            f"{ms(busy):.2f} ms, {first.comms[int(rank)]} communication ops"
        )
    for line in _cost_lines(costs, digits=3):
        print("  " + line)
    if meta["assumed"]:
        print(f"  assumed: {'; '.join(meta['assumed'])}")
    for line in term_lines(
        costs, meta, advice="profile more steps (ProfilerStep) or micro-batches"
    ):
        print("  " + line)
    print(f"wrote {args.output}")
    return 0
