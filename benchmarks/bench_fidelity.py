"""How well pipesim predicts a real step it has not seen: calibrate once, predict a grid.

Goal (issue 11): <= 3% mean and <= 8% max error out of sample, at micro-batch
counts up to 4x the calibration's and for schedules not used in calibration.

1. Calibrate (``verify.fidelity.calibrate_cut``): for each model size, the
   mixed-backward calibration schedule (1F1B with odd micro-batches' backward
   split into I + W; no registered family) at p=2, m=4, once per cut (2
   stages, and 4 for the schedules with two stages per rank), ``--repeats``
   runs of ``verify --dist`` (one process per rank, gloo, ``--threads`` intra-op
   threads per rank, one warm-up step each). Out comes one cost file per cut.
2. Predict every registered family that applies at p=2, for m in ``--microbatches``
   (default 4, 8, 16: up to 4x), from the cost files alone
   (``pipesim.calibration.predict``: the simulated step as the executor times it).
3. Measure each with ``verify --dist`` (``--repeats`` runs in fresh processes,
   median) and print per configuration the prediction, the median, the
   run-to-run spread ((slowest - fastest) / median) and the error.
4. Micro-batch size (not with ``--quick``): calibrate the 2-stage cut at 4 and
   8 rows, predict 1F1B and ZB-H1 at 2 and 16 rows from the affine fit
   (``pipesim.scaling``: a fixed cost plus a cost per row) and measure them.

5. Effects the calibration controls for (not with ``--quick``): 1F1B m=8 measured
   without a warm-up step, and with twice the intra-op threads per rank.

Model error and run-to-run spread are printed apart: ``error`` is the
prediction against the median; ``spread`` is how far the same configuration
moves between runs, which no model can beat; ``excess`` is the error beyond
half the spread. The calibration schedule is also predicted from its own file
(in sample) to show the floor.

The machine's load (``os.getloadavg``, 1 min) is recorded before every
configuration; a line measured above ``--max-load`` is flagged BUSY, and the
summary is refused when any is (``--allow-busy`` prints it anyway, marked).

Run: ``python benchmarks/bench_fidelity.py [--quick] [--json-out FILE]``
(the full run is about 260 runs of ``verify --dist``, an estimated 30-40 minutes on
a quiet 2-core machine; ``--quick`` is 14 runs, a few minutes).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from typing import Any

from pipesim.calibration import calibration_schedule, costs_for, predict
from pipesim.costs import CostModel, costs_to_dict
from pipesim.errors import PipesimError
from pipesim.scaling import AffineCosts
from pipesim.schedules import generate, get_spec, schedule_names
from verify.fidelity import Measurement, calibrate_cut, measure

_QUICK_FAMILIES = ("gpipe", "zb-h1", "interleaved-1f1b", "zbv")


def _parse_sizes(text: str) -> list[tuple[int, int]]:
    sizes = []
    for item in text.split(","):
        layers, _, width = item.partition("x")
        sizes.append((int(layers), int(width)))
    return sizes


def _load() -> float:
    return os.getloadavg()[0]


def _line(row: dict[str, Any]) -> str:
    return (
        f"{row['model']:>7} {row['schedule']:<18} v={row['virtual']} m={row['m']:<3} "
        f"predicted {row['predicted_ms']:9.2f} ms  measured {row['measured_ms']:9.2f} ms "
        f"(spread {row['spread_pct']:5.1f}%)  error {row['error_pct']:+6.1f}%  "
        f"excess {row['excess_pct']:5.1f}%  load {row['load']:.1f}"
        + ("  BUSY" if row["busy"] else "")
    )


def _row(
    model: str,
    name: str,
    virtual: int,
    m: int,
    predicted: int,
    got: Measurement,
    load: float,
    max_load: float,
) -> dict[str, Any]:
    measured = float(got.median_ns)
    error = (predicted - measured) / measured * 100
    spread = got.spread * 100
    return {
        "model": model,
        "schedule": name,
        "virtual": virtual,
        "m": m,
        "predicted_ms": predicted / 1e6,
        "measured_ms": measured / 1e6,
        "runs_ms": [t / 1e6 for t in got.makespans_ns],
        "spread_pct": spread,
        "error_pct": error,
        "excess_pct": max(abs(error) - spread / 2, 0.0),
        "load": load,
        "busy": load > max_load,
    }


def _calibrate(
    args: argparse.Namespace,
    options: dict[str, int],
    *,
    virtuals: tuple[int, ...] = (1, 2),
    microbatch_size: int | None = None,
) -> dict[int, CostModel]:
    cuts = {}
    rows = microbatch_size or args.microbatch_size
    for virtual in virtuals:
        load = _load()
        start = time.perf_counter()
        costs, meta = calibrate_cut(
            model="gpt",
            model_options=options,
            n_ranks=2,
            virtual=virtual,
            n_microbatches=args.calibration_microbatches,
            microbatch_size=rows,
            repeats=args.repeats,
            threads=args.threads,
            timeout_s=args.timeout,
        )
        cuts[2 * virtual] = costs
        link = costs.link
        print(
            f"  calibrated {2 * virtual} stages, {rows} rows, in "
            f"{time.perf_counter() - start:.0f} s "
            f"(load {load:.1f}): F {[s.forward // 1000 for s in costs.stages]} us, "
            f"B {[s.backward // 1000 for s in costs.stages]} us, "
            f"I {[s.input_grad // 1000 for s in costs.stages]} us, "
            f"W {[s.weight_grad // 1000 for s in costs.stages]} us; send "
            f"{link.send_overhead / 1000:.0f} us, receive {link.receive_overhead / 1000:.0f} us, "
            f"latency {link.latency / 1000:.0f} us, dispatch "
            f"{costs.dispatch_overhead / 1000:.0f} us per message / action",
            flush=True,
        )
        if args.costs_dir:
            os.makedirs(args.costs_dir, exist_ok=True)
            tag = "x".join(str(options[k]) for k in ("n_layers", "width"))
            name = f"gpt{tag}-{2 * virtual}stages-b{rows}.json"
            path = os.path.join(args.costs_dir, name)
            data = costs_to_dict(costs) | {"meta": meta}
            with open(path, "w", encoding="utf-8") as out:
                json.dump(data, out, indent=2)
    return cuts


def _families(args: argparse.Namespace) -> list[str]:
    if args.families:
        return [get_spec(n.strip()).name for n in args.families.split(",")]
    return list(_QUICK_FAMILIES) if args.quick else list(schedule_names())


def _measure(
    args: argparse.Namespace,
    options: dict[str, int],
    schedule: Any,
    *,
    microbatch_size: int | None = None,
    threads: int | None = None,
    warmup: int = 1,
) -> Measurement:
    """``verify.fidelity.measure`` of ``schedule`` on the GPT ``options`` with the run's
    settings (rows per micro-batch, repeats, threads, timeout) unless overridden."""
    return measure(
        schedule,
        model="gpt",
        model_options=options,
        microbatch_size=args.microbatch_size if microbatch_size is None else microbatch_size,
        repeats=args.repeats,
        threads=args.threads if threads is None else threads,
        warmup=warmup,
        timeout_s=args.timeout,
    )


def run(args: argparse.Namespace) -> int:
    # The two ranks and this process account for up to about 3 of the load by themselves.
    default = 3 + 0.5 * (os.cpu_count() or 1)
    max_load = args.max_load if args.max_load is not None else default
    sizes = _parse_sizes(args.sizes)
    print(
        f"fidelity: p=2, calibration m={args.calibration_microbatches}, "
        f"{args.microbatch_size} rows per micro-batch, {args.threads} thread(s) per rank, "
        f"{args.repeats} runs per configuration; {os.cpu_count()} CPUs, load "
        f"{os.getloadavg()} (BUSY above {max_load:.1f})",
        flush=True,
    )
    if _load() > max_load:
        print(
            f"warning: the machine is busy now (load {_load():.1f} > {max_load:.1f}); lines "
            "measured while it stays busy are flagged BUSY and the summary is refused",
            flush=True,
        )
    rows: list[dict[str, Any]] = []
    floor: list[dict[str, Any]] = []
    for layers, width in sizes:
        options = {"n_layers": layers, "width": width}
        model = f"{layers}x{width}"
        print(f"model gpt {model}:", flush=True)
        cuts = _calibrate(args, options)
        in_sample = calibration_schedule(n_ranks=2, n_microbatches=args.calibration_microbatches)
        load = _load()
        got = _measure(args, options, in_sample)
        row = _row(
            model,
            "(calibration)",
            1,
            in_sample.n_microbatches,
            int(predict(in_sample, cuts[2])),
            got,
            load,
            max_load,
        )
        floor.append(row)
        print("  in sample: " + _line(row), flush=True)
        for name in _families(args):
            virtual = get_spec(name).default_virtual
            for m in args.microbatches:
                try:
                    schedule = generate(name, n_ranks=2, n_microbatches=m, virtual=virtual)
                except PipesimError as exc:
                    print(f"  {name} m={m}: not run ({exc})", flush=True)
                    continue
                predicted = int(predict(schedule, costs_for(schedule, cuts)))
                load = _load()
                got = _measure(args, options, schedule)
                row = _row(model, name, virtual, m, predicted, got, load, max_load)
                rows.append(row)
                print("  " + _line(row), flush=True)
        if args.scale_sizes:
            rows += _scaling(args, options, model, max_load)
        if args.effects and (layers, width) == sizes[0]:
            _effects(args, options)
    return _summary(args, rows, floor)


def _effects(args: argparse.Namespace, options: dict[str, int]) -> None:
    """What the calibration controls for, in numbers: the first step in fresh processes
    (no warm-up) and two intra-op threads per rank instead of one, on 1F1B m=8."""
    schedule = generate("1f1b", n_ranks=2, n_microbatches=8)

    def run(warmup: int, threads: int) -> Measurement:
        return _measure(args, options, schedule, threads=threads, warmup=warmup)

    base = run(1, args.threads)
    for label, got in (
        ("no warm-up step", run(0, args.threads)),
        (f"{2 * args.threads} threads per rank", run(1, 2 * args.threads)),
    ):
        ratio = float(got.median_ns / base.median_ns)
        print(
            f"  effect of {label} on 1f1b m=8: median step x{ratio:.2f} "
            f"(spread {got.spread * 100:.0f}% against {base.spread * 100:.0f}%)",
            flush=True,
        )


def _scaling(
    args: argparse.Namespace, options: dict[str, int], model: str, max_load: float
) -> list[dict[str, Any]]:
    """Calibrate the 2-stage cut at two micro-batch sizes; predict other sizes from the
    affine fit (pipesim.scaling) and measure them."""
    b1, b2 = args.scale_sizes
    first = _calibrate(args, options, virtuals=(1,), microbatch_size=b1)[2]
    second = _calibrate(args, options, virtuals=(1,), microbatch_size=b2)[2]
    fit = AffineCosts.fit(first, second, sizes=(b1, b2))
    rows = []
    for b in args.scale_targets:
        for name in ("1f1b", "zb-h1"):
            schedule = generate(name, n_ranks=2, n_microbatches=args.calibration_microbatches * 2)
            predicted = int(predict(schedule, fit.at(b)))
            load = _load()
            got = _measure(args, options, schedule, microbatch_size=b)
            row = _row(
                model, f"{name} b={b}", 1, schedule.n_microbatches, predicted, got, load, max_load
            )
            rows.append(row)
            print("  " + _line(row), flush=True)
    return rows


def _summary(args: argparse.Namespace, rows: list[dict[str, Any]], floor: list[Any]) -> int:
    if not rows:
        print("no configuration was measured")
        return 1
    errors = [abs(r["error_pct"]) for r in rows]
    spreads = [r["spread_pct"] for r in rows]
    excess = [r["excess_pct"] for r in rows]
    busy = [r for r in rows + floor if r["busy"]]
    summary = {
        "configurations": len(rows),
        "mean_abs_error_pct": sum(errors) / len(errors),
        "max_abs_error_pct": max(errors),
        "mean_signed_error_pct": sum(r["error_pct"] for r in rows) / len(rows),
        "mean_spread_pct": sum(spreads) / len(spreads),
        "max_spread_pct": max(spreads),
        "mean_excess_pct": sum(excess) / len(excess),
        "max_excess_pct": max(excess),
        "in_sample_error_pct": [r["error_pct"] for r in floor],
        "busy_lines": len(busy),
        "load_average_end": os.getloadavg(),
    }
    if args.json_out:
        with open(args.json_out, "w", encoding="utf-8") as out:
            json.dump({"summary": summary, "rows": rows, "in_sample": floor}, out, indent=2)
    if busy and not args.allow_busy:
        print(
            f"NOT REPORTED: {len(busy)} of {len(rows) + len(floor)} configurations ran on a busy "
            "machine (load above --max-load); rerun on a quiet machine or pass --allow-busy"
        )
        return 2
    mark = " (BUSY MACHINE: not meaningful)" if busy else ""
    print(
        f"out of sample, {len(rows)} configurations{mark}: error mean "
        f"{summary['mean_abs_error_pct']:.1f}% "
        f"max {summary['max_abs_error_pct']:.1f}% (signed mean "
        f"{summary['mean_signed_error_pct']:+.1f}%); run-to-run spread mean "
        f"{summary['mean_spread_pct']:.1f}% max {summary['max_spread_pct']:.1f}%; error beyond "
        f"half the spread mean {summary['mean_excess_pct']:.1f}% max "
        f"{summary['max_excess_pct']:.1f}%"
    )
    print(
        "in sample (calibration schedule from its own file): "
        + ", ".join(f"{e:+.1f}%" for e in summary["in_sample_error_pct"])
    )
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="one model, 4 families, m=8, 2 runs")
    parser.add_argument("--sizes", default=None, help="GPT sizes LAYERSxWIDTH,... (6x256,6x512)")
    parser.add_argument("--families", default=None, help="schedules to predict (all registered)")
    parser.add_argument("--microbatches", default=None, help="m values to predict (4,8,16)")
    parser.add_argument("--calibration-microbatches", type=int, default=4)
    parser.add_argument("--microbatch-size", type=int, default=8, help="rows per micro-batch")
    parser.add_argument("--repeats", type=int, default=None, help="runs per configuration (3)")
    parser.add_argument("--threads", type=int, default=1, help="intra-op threads per rank")
    parser.add_argument("--timeout", type=float, default=300.0, help="seconds per run")
    parser.add_argument("--max-load", type=float, default=None, help="BUSY above (3 + CPUs / 2)")
    parser.add_argument("--allow-busy", action="store_true", help="summarise a busy run anyway")
    parser.add_argument(
        "--scale-sizes",
        default=None,
        help="two calibration micro-batch sizes for the size check (4,8; 'none' skips it)",
    )
    parser.add_argument(
        "--effects",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="measure warm-up and threads effects (default: on, off with --quick)",
    )
    parser.add_argument("--scale-targets", default="2,16", help="sizes predicted from them")
    parser.add_argument("--json-out", default=None, help="write every row and the summary")
    parser.add_argument("--costs-dir", default=None, help="keep the calibrated cost files here")
    args = parser.parse_args(argv)
    args.sizes = args.sizes or ("6x256" if args.quick else "6x256,6x512")
    m_text = args.microbatches or ("8" if args.quick else "4,8,16")
    args.microbatches = [int(v) for v in m_text.split(",")]
    args.repeats = args.repeats or (2 if args.quick else 3)
    scale = args.scale_sizes or ("none" if args.quick else "4,8")
    args.scale_sizes = None if scale == "none" else [int(v) for v in scale.split(",")]
    args.scale_targets = [int(v) for v in args.scale_targets.split(",")]
    args.effects = (not args.quick) if args.effects is None else args.effects
    return run(args)


if __name__ == "__main__":
    sys.exit(main())
