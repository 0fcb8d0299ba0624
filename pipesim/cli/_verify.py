"""``pipesim verify``: replay a schedule on real torch devices and check it bit for bit.

torch (the ``verify`` extra) is imported only when the verb runs; without it
the verb says how to install it. Exit statuses (also in ``--help``): 0
bit-identical; 1 the run completed and something differs (the report names
the first differing tensor, its largest difference and the action it came
from); 2 bad usage or input; 3 an environment that cannot be exact; 4 a rank
failed, died or missed a deadline. Under ``torchrun`` (``torchrun
--nproc-per-node P -m verify ...``) each process runs one rank and rank 0
prints the report.
"""

from __future__ import annotations

import argparse
import importlib
import json
import sys
import warnings
from typing import Any

from pipesim.cli._common import (
    LAYERS,
    WARMUP,
    add_schedule_arguments,
    positive_int,
    print_json,
    schedule_from_args,
    seconds,
    whole_number,
)
from pipesim.cli._model_flags import add_model_flags, model_options
from pipesim.errors import PipesimError
from pipesim.files import check_writable

#: Measured steps of one verify run (each its own step of the whole schedule).
TIMED_STEPS = whole_number(minimum=1, maximum=1000)

_INSTALL = "pip install 'pipesim[verify]'"
_EPILOG = """\
launch like torch:
  torchrun --nproc-per-node P -m verify SCHEDULE -p P ...   one rank per process (NCCL on
                                  cuda:LOCAL_RANK when CUDA is present, else gloo); rank 0
                                  prints the report and writes --costs-out
  pipesim verify SCHEDULE --dist ...                        pipesim starts the P processes

exit status:
  0  bit-identical: outputs, losses and gradients equal the unsplit model's
  1  the run completed and is NOT bit-identical (the report names the first differing
     tensor, its max abs difference and the action it came from)
  2  bad usage or input (schedule, model, devices, batch size, split)
  3  the environment cannot be exact (TF32 on, non-deterministic algorithms, dropout or
     batch-norm in training mode, mixed GPU models, torchrun CPU ranks with different
     thread counts, a GPU asked for and missing, no torch)
  4  the run failed: a rank raised, died or missed its deadline (the error names the rank,
     the action it ran or waited for, and the peer)
"""


def register(subparsers: Any) -> None:
    """Add ``verify``."""
    parser = subparsers.add_parser(
        "verify",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog=_EPILOG,
        help="run a schedule with torch and check it is bit-identical to the unsplit model",
        description=(
            "Replay a built-in schedule or a schedule file on real devices (CUDA GPUs when "
            "present, else the CPU) with a reference model; check outputs, losses and "
            "gradients bit for bit against the unsplit model on the same micro-batches; "
            "measure every action and compare pipesim's prediction with the measurement. "
            f"Needs torch: {_INSTALL}."
        ),
    )
    add_schedule_arguments(parser)
    group = parser.add_argument_group("model and devices")
    group.add_argument(
        "--model",
        default="mlp",
        metavar="mlp|gpt|llama|MODULE:FACTORY",
        help="the model-parallelism chapter's MLP (default), a small GPT, a small Llama "
        "(RMSNorm, rotary embedding, grouped-query attention, SwiGLU), or an import path "
        "package.module:factory returning an nn.Sequential or a list of modules",
    )
    group.add_argument(
        "--gpt-layers",
        type=LAYERS,
        default=4,
        metavar="N",
        help="transformer blocks of --model gpt (default 4; N+2 entries to cut)",
    )
    group.add_argument(
        "--gpt-width",
        type=positive_int,
        default=64,
        metavar="D",
        help="hidden width of --model gpt (default 64)",
    )
    add_model_flags(group)
    group.add_argument(
        "--seed",
        type=whole_number(minimum=0, maximum=2**63 - 1),
        metavar="S",
        help="initialisation seed (default 21 for the MLP, as the chapter; else 0)",
    )
    group.add_argument(
        "--device",
        dest="devices",
        metavar="DEV[,DEV...]",
        help="the torch device of each rank (or one for all), e.g. cuda:0,cuda:1 or cpu; "
        "default: the CUDA devices present, else cpu (plan's --devices N is a count)",
    )
    # The list was spelled --devices before; kept, unlisted, so that scripts keep working.
    group.add_argument("--devices", dest="devices", help=argparse.SUPPRESS)
    group.add_argument(
        "--microbatch-size",
        type=positive_int,
        metavar="B",
        help="rows per micro-batch (as calibrate --microbatch-sizes); the step has B x M rows",
    )
    group.add_argument(
        "--global-batch",
        dest="global_batch",
        type=positive_int,
        metavar="B",
        help="rows per step, as pipesim plan names it (default 32 rounded up to a multiple of "
        "M); with --microbatch-size the two must agree",
    )
    # Rows per step were spelled --batch-size before; kept, unlisted, so that scripts work.
    group.add_argument(
        "--batch-size", dest="global_batch", type=positive_int, help=argparse.SUPPRESS
    )
    group.add_argument(
        "--split",
        metavar="N[,N...]",
        help="model entries per stage, e.g. 4,3 (default: as even as possible)",
    )
    group.add_argument(
        "--balance",
        choices=("layers", "params"),
        default="layers",
        help="without --split: even layer counts, or balanced parameter counts",
    )
    group.add_argument(
        "--warmup",
        type=WARMUP,
        default=1,
        metavar="K",
        help="untimed runs before the measured one (default 1)",
    )
    group.add_argument(
        "--timed-steps",
        type=TIMED_STEPS,
        default=1,
        metavar="N",
        help="measured steps after the warm-up; the report holds the one of median makespan "
        "and lists every one's (default 1; 5 or more on a shared machine)",
    )
    group.add_argument(
        "--dist",
        action="store_true",
        help="one process per rank with torch.distributed (gloo, CPU ranks), started by "
        "pipesim: the ranks really run at the same time, so the measured step compares with "
        "the parallel prediction (under torchrun this is implied)",
    )
    group.add_argument(
        "--timeout",
        type=seconds,
        default=300.0,
        metavar="S",
        help="--dist / torchrun: deadline in seconds of the run and of every wait for a "
        "message (default 300)",
    )
    group.add_argument(
        "--check-settings-only",
        action="store_true",
        help="do not set the determinism settings (TF32 off, deterministic algorithms); "
        "refuse when they are not already exact",
    )
    out = parser.add_argument_group("output")
    out.add_argument(
        "--json",
        action="store_true",
        help="print one JSON object; it embeds the measured step (measured_trace), so "
        "`pipesim plot --measured REPORT.json` draws it against the prediction",
    )
    out.add_argument(
        "-o",
        "--output",
        metavar="FILE",
        help="write the report (JSON with --json) to FILE instead of stdout; under torchrun "
        "rank 0 writes it",
    )
    out.add_argument(
        "--costs-out",
        metavar="FILE",
        help="write the calibrated cost model (time unit: ns) for `pipesim simulate --costs FILE`",
    )
    out.add_argument(
        "--trace-out",
        metavar="FILE",
        help="write the measured step as a pipesim trace (times in ns) for "
        "`pipesim plot --measured FILE`: measured against predicted, rank by rank",
    )
    parser.set_defaults(func=run)


def _split(text: str | None) -> list[int] | None:
    if text is None:
        return None
    try:
        counts = [int(part) for part in text.split(",")]
    except ValueError:
        raise PipesimError(
            f"--split {text!r}: give whole numbers separated by commas, e.g. --split 4,3"
        ) from None
    return counts


def _rows(args: argparse.Namespace, schedule: Any) -> int:
    """Rows per step from --global-batch and/or --microbatch-size (verify.compare.step_rows)."""
    from verify.compare import step_rows

    return step_rows(
        schedule.n_microbatches,
        batch_size=args.global_batch,
        microbatch_size=args.microbatch_size,
    )


def _run_dist(args: argparse.Namespace, schedule: Any) -> int:
    from verify.dist import verify_distributed
    from verify.torchrun import torchrun_place, verify_torchrun

    if args.split or args.balance != "layers" or args.check_settings_only:
        raise PipesimError(
            "--dist and torchrun cut the model evenly by layers; drop --split / --balance / "
            "--check-settings-only"
        )
    common = {
        "model": args.model,
        "model_options": model_options(args),
        "seed": args.seed,
        "batch_size": _rows(args, schedule),
        "timeout_s": args.timeout,
        "warmup": max(args.warmup, 0),
        "timed_steps": args.timed_steps,
    }
    kinds = {d.strip().split(":")[0] for d in (args.devices or "").split(",") if d.strip()}
    if torchrun_place() is not None:
        if len(kinds) > 1:
            raise PipesimError(f"under torchrun give --device cpu or cuda, not {args.devices}")
        status, report = verify_torchrun(
            schedule, device_type=kinds.pop() if kinds else None, **common
        )
        if report is not None:  # rank 0
            _print(args, report, schedule)
        return status
    if kinds - {"cpu"}:
        raise PipesimError(
            f"--dist runs CPU ranks with gloo; drop --device {args.devices}, run without --dist "
            "for CUDA devices in one process, or start the ranks with torchrun for NCCL"
        )
    _warn_shared_cores(schedule.n_ranks)
    report = verify_distributed(schedule, **common)
    _print(args, report, schedule)
    return 0 if report.bit_identical else 1


def _warn_shared_cores(n_ranks: int) -> None:
    import torch

    from verify.launch import shared_cores

    if (why := shared_cores(n_ranks, torch.get_num_threads())) is not None:
        print(f"pipesim verify --dist: {why}", file=sys.stderr)


def _print(args: argparse.Namespace, report: Any, schedule: Any) -> None:
    from verify.report import format_report

    _write_costs(args, report, schedule)
    if args.output:
        from pipesim.files import write_text

        text = json.dumps(report.to_dict(), indent=1) if args.json else format_report(report)
        write_text(args.output, text + "\n")
    elif args.json:
        print_json(report.to_dict())
    else:
        print(format_report(report))


def _write_costs(args: argparse.Namespace, report: Any, schedule: Any) -> None:
    if args.trace_out:
        from verify.measured import write_measured_trace

        write_measured_trace(report, args.trace_out)
    if not args.costs_out:
        return
    from verify.calibrate import cost_file, save_costs
    from verify.torchrun import torchrun_place

    costs, meta = cost_file(
        report,
        schedule,
        source="pipesim verify" + (" --dist" if args.dist else ""),
        model_options=model_options(args),
        warmup=max(args.warmup, 0),
        rank_processes=args.dist or torchrun_place() is not None,
    )
    try:
        save_costs(costs, args.costs_out, meta=meta)
    except OSError as exc:
        raise PipesimError(f"cannot write --costs-out {args.costs_out!r}: {exc.strerror}") from None


def run(args: argparse.Namespace) -> int:
    """The verb; every error carries the exit status the epilog lists."""
    try:
        return _run(args)
    except PipesimError as exc:
        if getattr(exc, "exit_status", None) is None:
            exc.exit_status = 2  # type: ignore[attr-defined]  # bad usage or input
        raise


def _run(args: argparse.Namespace) -> int:
    # torch warns at import when numpy is absent; verify does not use numpy.
    warnings.filterwarnings("ignore", message="Failed to initialize NumPy")
    try:
        importlib.import_module("torch")
    except ImportError as exc:
        error = PipesimError(
            f"pipesim verify needs torch, which is not importable here ({exc}); install the "
            f"extra: {_INSTALL}"
        )
        error.exit_status = 3  # type: ignore[attr-defined]
        raise error from None
    from verify.compare import verify
    from verify.errors import RunFailedError
    from verify.models import load_model
    from verify.torchrun import torchrun_place

    schedule = schedule_from_args(args)
    for flag, path in (
        ("-o", args.output),
        ("--costs-out", args.costs_out),
        ("--trace-out", args.trace_out),
    ):
        if path:  # refused now, not after the run
            check_writable(path, what=flag)
    try:
        if args.dist or torchrun_place() is not None:
            return _run_dist(args, schedule)
        model = load_model(args.model, seed=args.seed, **model_options(args))
        report = verify(
            schedule,
            model=model,
            devices=args.devices,
            batch_size=_rows(args, schedule),
            layer_counts=_split(args.split),
            balance=args.balance,
            apply_settings=not args.check_settings_only,
            warmup=max(args.warmup, 0),
            timed_steps=args.timed_steps,
        )
    except RuntimeError as exc:  # torch reports shape errors, CUDA failures, ... this way
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise RunFailedError(f"the run failed inside torch: {first}") from None
    _print(args, report, schedule)
    return 0 if report.bit_identical else 1
