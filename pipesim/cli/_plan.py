"""``pipesim plan``: sweep stages, micro-batches and schedules for a model on hardware.

Prints the top configurations that fit with a one-line reason for the winner;
``--json`` / ``--csv`` print every configuration; ``-o plan.html`` writes an
interactive chart. Exit status 0 when the sweep ran (even if nothing fits:
the table says so), 1 on bad input.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from pipesim.cli._common import (
    add_require_fit_argument,
    positive_int,
    print_json,
    require_fit,
    seconds,
    whole_number,
)
from pipesim.errors import PlanError
from pipesim.files import check_writable, read_json
from pipesim.limits import MAX_DEVICES, MAX_LAYERS


def register(subparsers: Any) -> None:
    """Add ``plan``."""
    parser = subparsers.add_parser(
        "plan",
        help="capacity planner: best pipeline degree, micro-batch size and schedule",
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
        kind = whole_number(maximum=MAX_LAYERS, limit="MAX_LAYERS") if dest == "n_layers" else None
        model.add_argument(flag, dest=dest, type=kind or positive_int, metavar="N", help=text)
    model.add_argument("--dtype", choices=("bf16", "fp16", "fp32"), help="training dtype")
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
    hardware.add_argument(
        "--memory-capacity", metavar="BYTES", help="override device memory (e.g. 80e9)"
    )
    hardware.add_argument(
        "--bytes-per-param",
        type=positive_int,
        default=16,
        metavar="N",
        help="weights + grads + optimizer state per parameter (16: mixed-precision Adam)",
    )
    sweep = parser.add_argument_group("sweep")
    sweep.add_argument("--stages", metavar="P[,P...]", help="pipeline degrees (default: all)")
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
        help="processes (default: every core)",
    )
    sweep.add_argument(
        "--timeout",
        type=seconds,
        default=600.0,
        metavar="S",
        help="give up after S seconds (default 600)",
    )
    out = parser.add_argument_group("output")
    kind = out.add_mutually_exclusive_group()
    kind.add_argument("--json", action="store_true", help="one JSON object with every point")
    kind.add_argument("--csv", action="store_true", help="one CSV row per point")
    out.add_argument("-o", "--output", metavar="FILE.html", help="write an interactive chart")
    out.add_argument("--cdn", action="store_true", help="chart links plotly.js from its CDN")
    out.add_argument("--top", type=positive_int, default=10, metavar="N", help="rows shown")
    add_require_fit_argument(out)
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


def _capacity(text: str | None) -> int | None:
    if text is None:
        return None
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not value.is_integer() or value < 1:
        raise PlanError(f"--memory-capacity takes a whole number of bytes like 80e9, got {text!r}")
    return int(value)


_FIELD_FLAGS = (
    "n_layers",
    "hidden",
    "n_heads",
    "n_kv_heads",
    "ffn_hidden",
    "seq_length",
    "vocab_size",
    "dtype",
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


def _progress() -> Callable[[int, int], None] | None:
    """A progress bar on a terminal (tqdm if installed), nothing otherwise."""
    if not sys.stderr.isatty():
        return None
    try:
        from tqdm import tqdm  # type: ignore[import-untyped]
    except ImportError:
        tqdm = None
    state: dict[str, Any] = {}

    def update(done: int, total: int) -> None:
        if tqdm is not None:
            bar = state.get("bar")
            if bar is None:
                bar = state["bar"] = tqdm(total=total, unit="config", leave=False)
            bar.update(done - bar.n)
            if done == total:
                bar.close()
            return
        end = "\n" if done == total else ""
        print(
            f"\rplanning: {done}/{total} configurations ({done / total:.0%})",
            end=end,
            file=sys.stderr,
            flush=True,
        )

    return update


def _list() -> str:
    from pipesim.plan.hardware import accelerator_names, get_accelerator
    from pipesim.plan.model import get_model, model_names

    lines = ["models:"]
    for name in model_names():
        spec = get_model(name)
        lines.append(f"  {name:12s} {spec.n_params / 1e9:6.1f}B params  {spec.description}")
    lines.append("accelerators:")
    for name in accelerator_names():
        acc = get_accelerator(name)
        lines.append(
            f"  {name:12s} {acc.peak_flops / 1e12:5.0f} TFLOP/s bf16, "
            f"{acc.memory_bytes / 1e9:4.0f} GB, {acc.gpus_per_node}/node  {acc.description}"
        )
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    if args.list:
        print(_list())
        return 0
    from pipesim.plan.hardware import get_accelerator, load_accelerator
    from pipesim.plan.planner import plan
    from pipesim.plan.report import format_csv, format_table, write_html

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
        check_writable(args.output, what="-o")
    workload = _workload(args)
    source = args.accelerator
    accelerator = (
        load_accelerator(source)
        if source.lower().endswith(".json") or Path(source).is_file()
        else get_accelerator(source)
    )
    if args.timeout <= 0:
        raise PlanError(f"--timeout must be positive, got {args.timeout}")
    result = plan(
        workload,
        devices=args.devices,
        accelerator=accelerator,
        global_batch=args.global_batch,
        stages=_ints(args.stages, "--stages"),
        microbatch_sizes=_ints(args.microbatch_sizes, "--microbatch-sizes") or (),
        virtual=_ints(args.virtual, "--virtual") or (),
        schedules=None
        if args.schedules is None
        else [s.strip() for s in args.schedules.split(",") if s.strip()],
        bytes_per_param=args.bytes_per_param,
        memory_capacity_bytes=_capacity(args.memory_capacity),
        engine=args.engine,
        workers=args.workers,
        timeout_s=args.timeout,
        progress=_progress(),
    )
    if args.json:
        print_json(result.to_dict())
    elif args.csv:
        sys.stdout.write(format_csv(result.points))
    else:
        print(format_table(result, top=args.top))
    if args.output:
        sys.stdout.flush()
        path = write_html(result, args.output, cdn=args.cdn)
        print(f"wrote {path}", file=sys.stderr)
    fits = any(point.fits for point in result.points)
    require_fit(args, fits, failure="no configuration fits the memory capacity")
    return 0
