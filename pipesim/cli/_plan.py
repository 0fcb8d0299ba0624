"""``pipesim plan``: sweep tensor / pipeline / data parallelism, recomputation,
micro-batches and schedules for a model on hardware.

Prints the top configurations that fit with a one-line reason for the winner
and its Megatron-LM and torchtitan settings; ``--json`` / ``--csv`` print every
configuration; ``-o FILE`` writes a report whose format the suffix picks
(.html, .json, .csv). Exit status: 0 when the sweep finished, whatever it
found: a recommendation, or "nothing fits" with the nearest misses (the least
memory first), as ``simulate`` exits 0 on a result that does not fit; with
``--require-fit`` (the switch for CI, shared with ``simulate``) 1 when no
configuration is recommended (none fits, or none that fits reaches
``--min-mfu``); 1 when the sweep ran out of time (the partial ranking is
printed) or the input is bad; 130 on Ctrl-C (after printing the partial
ranking).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from pipesim.cli._common import (
    LAYERS,
    add_require_fit_argument,
    positive_int,
    print_json,
    require_fit,
    seconds,
    usage_error,
    value_argument,
    whole_number,
)
from pipesim.cli._progress import Progress, wanted
from pipesim.errors import LimitError, PlanError
from pipesim.files import check_writable, read_json
from pipesim.limits import MAX_DEVICES
from pipesim.plan.prune import DEFAULT_KEEP

_EPILOG = """\
exit status:
  0    the sweep finished: a recommendation, or why there is none ("nothing fits" and the
       nearest misses, least memory first; or nothing that fits reaches --min-mfu)
  1    with --require-fit (for CI): no configuration is recommended; also a sweep that ran
       out of --timeout (the partial ranking is printed) or bad input
  2    a bad option, or a sweep too large to simulate (past MAX_SWEEP_ACTIONS in
       pipesim.limits), refused before it starts
  130  Ctrl-C (the partial ranking is printed)
"""


def register(subparsers: Any) -> None:
    """Add ``plan``."""
    parser = subparsers.add_parser(
        "plan",
        help="capacity planner: best pipeline degree, micro-batch size and schedule",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog=_EPILOG,
        description=(
            "Sweep pipeline degree (data parallelism fills the rest of the devices), "
            "micro-batch size, virtual stages and every registered schedule for a transformer "
            "on N devices; simulate each configuration and rank those that fit in memory. "
            "Example: pipesim plan --model llama2-13b --devices 32 --accelerator h100-sxm "
            "--global-batch 256"
        ),
    )
    model = parser.add_argument_group("model")
    model.add_argument(
        "--model",
        metavar="NAME|FILE",
        help="a preset (see --list), a model JSON file of fields, or a pipesim cost file "
        "(e.g. from `pipesim verify --costs-out`); fields below override a preset",
    )
    for flag, dest, text in (
        ("--layers", "n_layers", "transformer blocks"),
        ("--hidden", "hidden", "hidden size"),
        ("--heads", "n_heads", "attention heads"),
        ("--kv-heads", "n_kv_heads", "key/value heads (grouped-query attention)"),
        ("--ffn-hidden", "ffn_hidden", "MLP width (default 4 x hidden)"),
        ("--seq-length", "seq_length", "sequence length in tokens"),
        ("--vocab", "vocab_size", "vocabulary size"),
    ):
        kind = LAYERS if dest == "n_layers" else None
        model.add_argument(flag, dest=dest, type=kind or positive_int, metavar="N", help=text)
    model.add_argument(
        "--dtype",
        choices=("bf16", "fp16", "fp32", "fp8"),
        help="training precision (fp8: the linear layers' GEMMs at the accelerator's FP8 "
        "rate with Transformer Engine's casts around them, bf16 for the rest, as "
        "Transformer Engine runs)",
    )
    model.add_argument(
        "--fp8-recipe",
        dest="fp8_recipe",
        choices=("delayed", "tensorwise"),
        help="an fp8 model's scaling recipe, as Megatron-Core's --fp8-recipe names it "
        "(default delayed; tensorwise: Transformer Engine's current scaling, an amax pass "
        "before each cast)",
    )
    model.add_argument(
        "--grad-reduce-in-bf16",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="keep and reduce a bf16 or fp8 model's gradients in bf16, not fp32 "
        "(Megatron-LM's --grad-reduce-in-bf16, NVIDIA's NeMo recipes): 16 bytes a "
        "parameter at rest instead of 18, half the data-parallel gradient traffic",
    )
    model.add_argument(
        "--flash-attention",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="fused attention: no s x s score matrices stored",
    )
    hardware = parser.add_argument_group("hardware and batch")
    hardware.add_argument(
        "--devices",
        type=whole_number(maximum=MAX_DEVICES, limit="MAX_DEVICES"),
        metavar="N",
        help="devices in all",
    )
    hardware.add_argument(
        "--accelerator", metavar="NAME|FILE", help="a preset (see --list) or a JSON file"
    )
    hardware.add_argument(
        "--global-batch", type=positive_int, metavar="B", help="sequences per optimizer step"
    )
    value_argument(
        hardware,
        "--memory-capacity",
        metavar="SIZE",
        help="override device memory: bytes, or a number with a unit (80GiB = 80 * 2^30 "
        "bytes, 80GB = 80 * 10^9; B, KB, MB, GB, TB, KiB, MiB, GiB, TiB)",
    )
    value_argument(
        hardware,
        "--memory-headroom",
        default=0.10,
        metavar="F",
        help="share of device memory kept free for allocator fragmentation and workspaces "
        "(default 0.10)",
    )
    hardware.add_argument(
        "--bytes-per-param",
        type=positive_int,
        default=None,
        metavar="N",
        help="weights + grads + optimizer state per parameter without the distributed "
        "optimizer (default 18: bf16 weights, fp32 grads and Adam, as Megatron-LM; 16 "
        "with --grad-reduce-in-bf16)",
    )
    sweep = parser.add_argument_group("sweep")
    sweep.add_argument(
        "--tensor-parallel",
        metavar="T[,T...]",
        help="tensor-parallel sizes (default: divisors of the GPUs per node that divide the "
        "heads, i.e. inside a node)",
    )
    sweep.add_argument(
        "--sequence-parallel",
        nargs="?",
        const="on",
        metavar="on|off|on,off",
        help="Megatron sequence parallelism with t > 1 (default on; bare flag: on)",
    )
    sweep.add_argument(
        "--recompute",
        metavar="none|selective|full[,...]",
        help="activation recomputation (default: all three; selective is left out with "
        "flash attention, where it saves no memory and runs the attention twice)",
    )
    sweep.add_argument(
        "--distributed-optimizer",
        nargs="?",
        const="on",
        metavar="on|off|on,off",
        help="shard the optimizer state over data parallelism, ZeRO-1 (default on with d > 1)",
    )
    sweep.add_argument(
        "--pipeline-parallel",
        "-p",
        "--stages",
        dest="pipeline_parallel",
        metavar="P[,P...]",
        help="pipeline-parallel degrees (default: all; --stages: old spelling)",
    )
    sweep.add_argument(
        "--context-parallel",
        metavar="C[,C...]",
        default="1",
        help="context-parallel sizes: each sequence split C ways, ring attention as "
        "Megatron-Core runs it (default 1; needs flash attention)",
    )
    sweep.add_argument(
        "--expert-parallel",
        metavar="E[,E...]",
        default="1",
        help="expert-parallel sizes: each expert layer's routed experts split E ways, "
        "tokens exchanged by all-to-all (default 1; a model with expert layers, e.g. "
        "--model mixtral-8x7b)",
    )
    sweep.add_argument(
        "--expert-tensor-parallel",
        metavar="ET[,ET...]",
        default="1",
        help="expert tensor-parallel sizes: each routed expert's matrices split ET ways "
        "(Megatron-Core's --expert-tensor-parallel-size; default 1)",
    )
    sweep.add_argument(
        "--overlap-p2p",
        action="store_true",
        help="pipeline sends run beside compute (Megatron-Core's --overlap-p2p-communication, "
        "torch's pipelining); default: each rank waits for its sends and receives, as "
        "Megatron-LM does",
    )
    sweep.add_argument(
        "--tp-comm-overlap",
        action="store_true",
        help="hide tensor-parallel collectives under the GEMMs next to them (Megatron-LM's "
        "--tp-comm-overlap, Transformer Engine's userbuffers)",
    )
    sweep.add_argument(
        "--microbatch-sizes",
        metavar="B[,B...]",
        default="1,2,4,8",
        help="micro-batch sizes (default 1,2,4,8)",
    )
    sweep.add_argument(
        "--virtual", metavar="V[,V...]", default="1,2,4", help="stages per rank (default 1,2,4)"
    )
    sweep.add_argument(
        "--schedules",
        metavar="NAME[,NAME...]",
        help="schedules (default: every registered one; auto adds synth, a schedule "
        "synthesized for each configuration's costs and free memory)",
    )
    sweep.add_argument(
        "--engine",
        choices=("fast", "simpy"),
        default="fast",
        help="fast evaluator (default) or the reference SimPy engine (identical, slower)",
    )
    sweep.add_argument(
        "--workers",
        type=whole_number(maximum=256),
        metavar="N",
        help="processes, here or in --cluster local (default: every core)",
    )
    sweep.add_argument(
        "--cluster",
        metavar="ADDRESS",
        help="evaluate on a Dask cluster: a scheduler's address (tcp://HOST:8786, started "
        "with `dask scheduler`, workers with `dask worker tcp://HOST:8786 --nthreads 1`) or "
        "local (a LocalCluster of --workers processes); the same plan (pip install "
        "'pipesim[dask]')",
    )
    sweep.add_argument(
        "--prune",
        action="store_true",
        help="skip, by exact lower bounds, configurations that cannot appear in the printed "
        "plan (listed as pruned; same rows, not yet faster: docs/planner-speed.md)",
    )
    from pipesim.iterations import DEFAULT_SYNC, SYNCS

    sweep.add_argument(
        "--optimizer-sync",
        choices=SYNCS,
        default=DEFAULT_SYNC,
        help="rank by the steady-state iteration period under this optimizer "
        f"synchronization (default {DEFAULT_SYNC}, Megatron-LM's: pipeline + data-parallel "
        "traffic + optimizer step); post-validation or none re-simulate the fastest "
        "configurations over iterations, where the next step starts during this one's drain, "
        "and auto sweeps the schedule synthesized for that period (docs/steady-state.md)",
    )
    sweep.add_argument(
        "--period-candidates",
        type=positive_int,
        default=DEFAULT_KEEP,
        metavar="N",
        help=f"with --optimizer-sync other than global: how many of the fastest "
        f"configurations that fit are re-simulated under it (default {DEFAULT_KEEP}); the "
        "others keep the global period, never shorter",
    )
    sweep.add_argument(
        "--timeout",
        type=seconds,
        default=600.0,
        metavar="S",
        help="stop after S seconds and rank what was evaluated (default 600)",
    )
    value_argument(
        sweep,
        "--min-mfu",
        metavar="F",
        help="the least MFU a winner must reach to be recommended (default: an eighth of "
        "the accelerator's achievable matmul share)",
    )
    out = parser.add_argument_group("output")
    kind = out.add_mutually_exclusive_group()
    kind.add_argument("--json", action="store_true", help="one JSON object with every point")
    kind.add_argument("--csv", action="store_true", help="one CSV row per point")
    out.add_argument(
        "-o",
        "--output",
        metavar="FILE",
        help="write a report: FILE.html (winner, top table, Pareto front, refusals), "
        "FILE.json or FILE.csv",
    )
    out.add_argument(
        "--costs-out",
        metavar="FILE.json",
        help="write the winner's cost model, for `pipesim simulate/plot --costs FILE`",
    )
    out.add_argument("--no-progress", action="store_true", help="no progress bar on stderr")
    out.add_argument("--cdn", action="store_true", help="chart links plotly.js from its CDN")
    out.add_argument(
        "--top",
        type=positive_int,
        default=10,
        metavar="N",
        help="rows of the table shown (default 10)",
    )
    add_require_fit_argument(
        out,
        failing="no configuration is recommended: none fits the device memory, or none that "
        "fits reaches --min-mfu",
    )
    out.add_argument("--list", action="store_true", help="list model and accelerator presets")
    parser.set_defaults(func=run)


def _ints(text: str | None, flag: str) -> list[int] | None:
    if text is None:
        return None
    try:
        values = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise PlanError(f"{flag} takes comma-separated whole numbers, got {text!r}") from None
    if not values or min(values) < 1:
        raise PlanError(f"{flag} takes whole numbers >= 1, got {text!r}")
    return values


_FIELD_FLAGS = (
    "n_layers",
    "hidden",
    "n_heads",
    "n_kv_heads",
    "ffn_hidden",
    "seq_length",
    "vocab_size",
    "dtype",
    "fp8_recipe",
    "grad_reduce_in_bf16",
    "flash_attention",
)


def _workload(args: argparse.Namespace) -> Any:
    from pipesim.costs import costs_from_dict
    from pipesim.plan.model import ModelSpec, get_model, model_from_dict, model_names
    from pipesim.plan.workload import workload_from_costs, workload_from_model

    given = {f: getattr(args, f) for f in _FIELD_FLAGS if getattr(args, f) is not None}
    source = args.model
    base: dict[str, Any] = {}
    if source is None:
        if not given:
            raise PlanError(
                "give --model NAME|FILE or the model fields (--layers, --hidden, --heads, "
                f"--seq-length, --vocab); presets: {', '.join(model_names())}"
            )
    elif source in model_names():
        base = get_model(source).to_dict()
    else:
        path = Path(source)
        if not path.exists():
            get_model(source)  # UnknownNameError listing the presets
        data = read_json(path, what="model")
        if isinstance(data, dict) and ("stage" in data or "stages" in data):
            extra = sorted(set(given) - {"seq_length"})
            if extra:
                raise PlanError(f"{source} is a cost file; model fields {extra} do not apply to it")
            meta = dict(data.get("meta") or {})
            if "seq_length" in given:
                meta["seq_length"] = given["seq_length"]
            return workload_from_costs(
                costs_from_dict(data, source=source), meta=meta, name=path.stem
            )
        base = model_from_dict(data, source=source).to_dict()
    if given and base:
        base["name"] = f"{base['name']} (modified)"
    spec: ModelSpec = model_from_dict({**base, **given}, source="model")
    return workload_from_model(spec)


def _flag_values(text: str | None, flag: str) -> list[bool] | None:
    if text is None:
        return None
    words = {"on": True, "off": False, "true": True, "false": False}
    values = [x.strip().lower() for x in text.split(",") if x.strip()]
    if not values or any(v not in words for v in values):
        raise PlanError(f"{flag} takes on, off or on,off, got {text!r}")
    return [words[v] for v in values]


def _words(text: str | None) -> list[str] | None:
    return None if text is None else [x.strip() for x in text.split(",") if x.strip()]


def _list() -> str:
    from pipesim.plan.hardware import accelerator_names, get_accelerator
    from pipesim.plan.model import get_model, model_names
    from pipesim.units import format_bytes

    lines = ["models:"]
    for name in model_names():
        spec = get_model(name)
        lines.append(f"  {name:12s} {spec.n_params / 1e9:6.1f}B params  {spec.description}")
    lines.append("accelerators:")
    for name in accelerator_names():
        acc = get_accelerator(name)
        lines.append(
            f"  {name:12s} {acc.peak_flops / 1e12:5.0f} TFLOP/s bf16, "
            f"{format_bytes(acc.memory_bytes):>9s}, {acc.gpus_per_node}/node  {acc.description}"
        )
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    if args.list:
        print(_list())
        return 0
    from pipesim.plan.report import format_csv, format_table

    _check_args(args)
    workload = _workload(args)
    accelerator = _accelerator(args.accelerator)
    output = _output_kind(args.output) if args.output else None
    result = _plan(args, workload, accelerator)
    interrupted = result.stopped is not None and "interrupted" in result.stopped
    if args.json:
        print_json(result.to_dict())
    elif args.csv:
        sys.stdout.write(format_csv(result.points))
    else:
        print(format_table(result, top=args.top))
    if output is not None:
        sys.stdout.flush()
        path = _write(result, args.output, output, cdn=args.cdn)
        print(f"wrote {path}", file=sys.stderr)
    best = result.recommended
    if args.costs_out:
        _write_costs(result, workload, args)
    if interrupted:
        return 130
    if result.stopped is not None:  # a partial ranking answers nothing for sure
        return 1
    fits = any(point.fits for point in result.points)
    require_fit(
        args,
        best is not None,
        failure="no configuration fits the memory capacity"
        if not fits
        else f"configurations fit, but none reaches --min-mfu {result.min_mfu:.1%}",
    )
    return 0


def _check_args(args: argparse.Namespace) -> None:
    """Refuse missing or bad flags and unwritable outputs before the sweep."""
    missing = [
        flag
        for flag, value in (
            ("--devices", args.devices),
            ("--accelerator", args.accelerator),
            ("--global-batch", args.global_batch),
        )
        if value is None
    ]
    if missing:
        raise PlanError(
            f"pipesim plan needs {', '.join(missing)}, e.g. `pipesim plan --model llama2-7b "
            "--devices 16 --accelerator h100-sxm --global-batch 128`"
        )
    if args.output:  # refused now, not after the sweep
        _output_kind(args.output)
        check_writable(args.output, what="-o")
    if args.costs_out:
        check_writable(args.costs_out, what="--costs-out")
    if args.timeout <= 0:
        raise PlanError(f"--timeout must be positive, got {args.timeout}")


def _accelerator(source: str) -> Any:
    """A preset's name or an accelerator JSON file."""
    from pipesim.plan.hardware import get_accelerator, load_accelerator

    if source.lower().endswith(".json") or Path(source).is_file():
        return load_accelerator(source)
    return get_accelerator(source)


def _plan(args: argparse.Namespace, workload: Any, accelerator: Any) -> Any:
    """The sweep the flags ask for, with a progress bar on stderr."""
    from pipesim.plan.planner import plan

    # Shown from the first second: evaluate_points reports 0 done when the sweep starts.
    progress = Progress(
        enabled=wanted(False if args.no_progress else None), desc="planning", unit="config"
    )
    try:
        return plan(
            workload,
            devices=args.devices,
            accelerator=accelerator,
            global_batch=args.global_batch,
            pipeline_parallel=_ints(args.pipeline_parallel, "--pipeline-parallel"),
            tensor=_ints(args.tensor_parallel, "--tensor-parallel"),
            context_parallel=_ints(args.context_parallel, "--context-parallel") or (1,),
            expert_parallel=_ints(args.expert_parallel, "--expert-parallel") or (1,),
            expert_tensor_parallel=_ints(args.expert_tensor_parallel, "--expert-tensor-parallel")
            or (1,),
            tp_comm_overlap=args.tp_comm_overlap,
            overlap_p2p=args.overlap_p2p,
            recompute=_words(args.recompute),
            sequence_parallel=_flag_values(args.sequence_parallel, "--sequence-parallel"),
            distributed_optimizer=_flag_values(
                args.distributed_optimizer, "--distributed-optimizer"
            ),
            microbatch_sizes=_ints(args.microbatch_sizes, "--microbatch-sizes") or (),
            virtual=_ints(args.virtual, "--virtual") or (),
            schedules=_words(args.schedules),
            bytes_per_param=args.bytes_per_param,
            memory_capacity_bytes=args.memory_capacity,
            memory_headroom=args.memory_headroom,
            min_mfu=args.min_mfu,
            engine=args.engine,
            workers=args.workers,
            timeout_s=args.timeout,
            progress=progress,
            partial=True,
            cluster=args.cluster,
            prune=args.prune,
            keep=max(args.top, DEFAULT_KEEP),
            optimizer_sync=args.optimizer_sync,
            period_candidates=args.period_candidates,
        )
    except LimitError as exc:  # a sweep past MAX_SWEEP_ACTIONS: too large a request
        raise usage_error(str(exc)) from None
    finally:
        progress.close()


def _output_kind(path: str) -> str:
    suffix = Path(path).suffix.lower()
    kinds = {".html": "html", ".htm": "html", ".json": "json", ".csv": "csv"}
    if suffix not in kinds:
        raise PlanError(
            f"-o {path}: cannot tell the format from the suffix {suffix or '(none)'!r}; use "
            ".html (report), .json or .csv"
        )
    return kinds[suffix]


def _write(result: Any, path: str, kind: str, *, cdn: bool) -> Path:
    import json

    from pipesim.files import write_text
    from pipesim.plan.report import format_csv, write_html

    if kind == "html":
        return write_html(result, path, cdn=cdn)
    if kind == "json":
        return write_text(Path(path), json.dumps(result.to_dict(), indent=2) + "\n")
    return write_text(Path(path), format_csv(result.points))


def _write_costs(result: Any, workload: Any, args: argparse.Namespace) -> None:
    import json

    from pipesim.costs import costs_to_dict
    from pipesim.files import write_text
    from pipesim.plan.planner import configuration

    best = result.recommended or result.best
    if best is None:
        raise PlanError(f"--costs-out {args.costs_out}: no configuration fits, so none to write")
    _, costs = configuration(result, best, model=workload, bytes_per_param=args.bytes_per_param)
    data = costs_to_dict(costs)
    data["meta"] = {
        "time_unit": "ns",
        "plan": best.label(),
        "note": "durations include tensor-parallel traffic; data-parallel traffic and the "
        "optimizer step follow the pipeline and are not in this file",
    }
    path = write_text(Path(args.costs_out), json.dumps(data, indent=2) + "\n")
    virtual = f" --virtual {best.virtual}" if best.virtual > 1 else ""
    print(
        f"wrote {path}; simulate it: pipesim simulate {best.schedule} -p {best.pipeline} "
        f"-m {best.n_microbatches}{virtual} --costs {path}",
        file=sys.stderr,
    )
