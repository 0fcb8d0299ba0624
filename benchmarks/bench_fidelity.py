"""How well pipesim predicts a real step it has not seen: calibrate once, predict a grid.

Goal (issue 11): <= 3% mean and <= 8% max error out of sample, at micro-batch
counts up to 4x the calibration's and for schedules not used in calibration.

For each model size (``--sizes``, default GPT 6x256 and 6x512), every schedule below
runs ``--repeats`` times (default 3) with ``verify --dist`` (one process per rank,
gloo, ``--threads`` intra-op threads per rank, one warm-up step each), in rounds
(``verify.fidelity.measure_all``): a round runs all of them, one after the other, in
one fresh pair of rank processes, each round in its own seeded order, so every
configuration is measured once per process pair and the process start-up is paid
once per round, not once per run. The first schedule of a round runs
``verify.fidelity.BURN_IN`` untimed steps more than the others: fresh processes fault
in new memory pages for a few steps.

1. Calibration: the mixed-backward calibration schedule (1F1B with odd
   micro-batches' backward split into I + W; no registered family) at p=2, m=4,
   once per cut (2 stages, and 4 for the schedules with two stages per rank).
   ``verify.fidelity.fit_cut`` makes one cost file per cut from all its runs: it runs
   ``--calibration-copies`` times (default 3) in every round, each at its own place,
   so the file does not rest on one slow spell of the machine.
2. Grid: every registered family at p=2, for m in ``--microbatches`` (default 4
   and 16: up to 4x), predicted from the cost files alone
   (``pipesim.calibration.predict``: the simulated step as the executor times it).
3. Micro-batch size (``--scale-sizes``, default 4,8; ``none`` skips it): the
   2-stage cut also calibrated at 4 rows, 1F1B and ZB-H1 predicted at 2 and 16
   rows from the affine fit (``pipesim.scaling``: a fixed cost plus a cost per row).
4. ``--effects`` (off by default): 1F1B m=8 without a warm-up step, and with twice
   the intra-op threads per rank.
5. ``--allocators system,retain`` (off by default): every round runs under each CPU
   allocator of ``verify.allocator`` in turn (the order alternating round by round),
   so both see the same machine; calibration, prediction and summary are per
   allocator (``--json-out F.json`` writes ``F.system.json`` and ``F.retain.json``),
   preceded by each configuration's measured steps side by side.

Each line prints the prediction, the median measured step, the run-to-run spread
((slowest - fastest) / median, which no model can beat), the ``error`` (prediction
against the median), the ``excess`` (error beyond half the spread) and the
``model`` error: the median over the runs of ``pipesim.calibration.replay``'s
error, the step pipesim predicts when every action takes the compute time that run
measured for it (calibrated overheads, messages and dependencies as in the
prediction). It separates the model's own error from the run-to-run variation of
compute speed between process pairs, which dominates the prediction error on a
shared or virtual machine (measured: 0.8-1.2x per pair). The calibration schedule
is also predicted from its own file (in sample) to show the floor. Each line also
prints the p10-p90 ``band`` of :func:`pipesim.band.predict_band` (``--draws``
seeded draws, each unit of work's compute drawn from one calibration run's own
samples) and how many of the measured runs fell inside it (the summary counts them
all: a calibrated band holds about 8 in 10), and the error of the ``drawn``
prediction: the median of as many draws, each unit of work from every calibration
run's samples at once (:func:`pipesim.band.pool_runs`), which carries the variation
of compute times into the longest path; the summary sets it beside ``predict``'s.

The machine's load (``os.getloadavg``, 1 min) is recorded; lines measured above
``--max-load`` are flagged BUSY and the summary is refused when any is
(``--allow-busy`` prints it anyway, marked). ``--steps-out`` writes every measured
step (each action's rank, start, end) to refit or replay offline.

Run (the final benchmark, quiet machine):
``python benchmarks/bench_fidelity.py --json-out fidelity.json --steps-out steps.json``
It prints a line per round (with the time left for the model size) and then one
per configuration. Measured on a quiet 2-core machine (2026-12-01), a round of the 39
schedules (33 and the calibration copies) takes 59-65 s for 6x256 and 219-227 s for
6x512, so the default run (both sizes, scaling included) takes 16-19 minutes;
``--sizes 6x256 --scale-sizes none`` about 3;
``--quick`` (4 families at m=8, 2 rounds) about 1 minute.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import sys
import time
from collections import defaultdict
from collections.abc import Iterator
from typing import Any

from pipesim.band import PredictionBand, draw_prediction
from pipesim.calibration import calibration_schedule, costs_for, predict, replay
from pipesim.costs import SEND_MODES, CostModel, costs_to_dict
from pipesim.errors import PipesimError
from pipesim.scaling import AffineCosts
from pipesim.schedule import Schedule
from pipesim.schedule_io import schedule_to_json
from pipesim.schedules import generate, get_spec, schedule_names
from verify.allocator import ALLOCATOR_ENV, ALLOCATOR_MODES, allocator_mode
from verify.fidelity import BURN_IN, Measurement, fit_cut, measure, measure_all

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
        f"excess {row['excess_pct']:5.1f}%  model {row['model_error_pct']:+5.1f}%  "
        + (f"drawn {row['drawn_error_pct']:+6.1f}%  " if row["band_ms"] else "")
        + (
            f"band {row['band_ms'][0]:.0f}-{row['band_ms'][1]:.0f} ms "
            f"({row['runs_in_band']}/{len(row['runs_ms'])} in)  "
            if row["band_ms"]
            else ""
        )
        + f"load {row['load']:.1f}"
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
        # The most page faults a rank took in one measured step: first touches of memory
        # inside the ops, which a steady training loop does not pay (verify.rank.run_rank).
        "page_faults_max": max((f for f in got.page_faults if f is not None), default=None),
        "load": load,
        "busy": load > max_load,
    }


def _print_cut(virtual: int, rows: int, costs: CostModel) -> None:
    link = costs.link
    print(
        f"  calibrated {2 * virtual} stages, {rows} rows: "
        f"F {[s.forward // 1000 for s in costs.stages]} us, "
        f"B {[s.backward // 1000 for s in costs.stages]} us, "
        f"I {[s.input_grad // 1000 for s in costs.stages]} us, "
        f"W {[s.weight_grad // 1000 for s in costs.stages]} us; send "
        f"{link.send_overhead / 1000:.0f} us, receive {link.receive_overhead / 1000:.0f} us, "
        f"latency {link.latency / 1000:.0f} us, handshake {link.handshake / 1000:.0f} us "
        f"({costs.send_mode} sends), dispatch "
        f"{costs.dispatch_overhead / 1000:.0f} us per message / action",
        flush=True,
    )


def _save_cut(
    args: argparse.Namespace, options: dict[str, int], costs: CostModel, meta: Any
) -> None:
    if not args.costs_dir:
        return
    os.makedirs(args.costs_dir, exist_ok=True)
    tag = "x".join(str(options[k]) for k in ("n_layers", "width"))
    name = f"gpt{tag}-{meta['n_stages']}stages-b{meta['microbatch_size']}.json"
    with open(os.path.join(args.costs_dir, name), "w", encoding="utf-8") as out:
        json.dump(costs_to_dict(costs) | {"meta": meta}, out, indent=2)


def _families(args: argparse.Namespace) -> list[str]:
    if args.families:
        return [get_spec(n.strip()).name for n in args.families.split(",")]
    return list(_QUICK_FAMILIES) if args.quick else list(schedule_names())


def _plan(args: argparse.Namespace) -> list[tuple[str, Schedule, int]]:
    """Everything one model size runs: (role, schedule, rows per micro-batch). Roles:
    ``cal:V`` the calibration of the cut into 2V stages, ``cal-b:B`` the 2-stage
    calibration at B rows, ``grid`` a configuration predicted from the cuts, ``scale:B``
    one predicted from the two-size fit."""
    m_cal = args.calibration_microbatches
    # Each calibration runs --calibration-copies times per round, at its own seeded place
    # in the round: its cost file then pools runs spread over the whole measurement
    # instead of resting on one slow spell of the machine (_combine_copies merges them).
    plan = [
        (
            f"cal:{v}",
            calibration_schedule(n_ranks=2, n_microbatches=m_cal, virtual=v),
            args.microbatch_size,
        )
        for v in (1, 2)
        for _ in range(args.calibration_copies)
    ]
    for name in _families(args):
        virtual = get_spec(name).default_virtual
        for m in args.microbatches:
            try:
                schedule = generate(name, n_ranks=2, n_microbatches=m, virtual=virtual)
            except PipesimError as exc:
                print(f"  {name} m={m}: not run ({exc})", flush=True)
                continue
            plan.append(("grid", schedule, args.microbatch_size))
    if args.scale_sizes:
        for b in args.scale_sizes:
            if b != args.microbatch_size:
                cal_b = calibration_schedule(n_ranks=2, n_microbatches=m_cal)
                plan += [(f"cal-b:{b}", cal_b, b)] * args.calibration_copies
        for b in args.scale_targets:
            for name in ("1f1b", "zb-h1"):
                plan.append((f"scale:{b}", generate(name, n_ranks=2, n_microbatches=2 * m_cal), b))
    return plan


def _measure_size(
    args: argparse.Namespace, options: dict[str, int], plan: list[tuple[str, Schedule, int]]
) -> dict[str, tuple[Measurement, ...]]:
    """Every schedule of ``plan`` in ``args.repeats`` rounds (fresh rank processes each),
    per CPU allocator of ``args.allocators``: with two, each round runs under both, in
    alternating order, so that both see the same machine (``verify.allocator``)."""
    started = time.perf_counter()
    modes = args.allocators or [None]
    got: dict[str, list[Measurement]] = {}
    for round_ in range(args.repeats):
        order = modes if round_ % 2 == 0 else modes[::-1]
        for mode in order:
            began = time.perf_counter()
            with _allocator(mode):
                measured = measure_all(
                    [s for _, s, _ in plan],
                    model="gpt",
                    model_options=options,
                    microbatch_size=[b for _, _, b in plan],
                    repeats=1,
                    threads=args.threads,
                    timeout_s=args.timeout,
                    first_round=round_,
                )
            got.setdefault(mode or allocator_mode(), []).extend(measured)
            done = sum(len(found) for found in got.values()) // len(plan)
            left = (args.repeats * len(modes) - done) * (time.perf_counter() - started) / done
            print(
                f"  round {round_ + 1}/{args.repeats}"
                + (f" ({mode})" if mode else "")
                + f": {len(plan)} schedules in {time.perf_counter() - began:.0f} s "
                f"(load {_load():.1f}); about {left:.0f} s left for this size",
                flush=True,
            )
    return {mode: _merge(found, len(plan)) for mode, found in got.items()}


@contextlib.contextmanager
def _allocator(mode: str | None) -> Iterator[None]:
    """``$PIPESIM_CPU_ALLOCATOR`` set to ``mode`` (None: left alone) for the rank
    processes started inside."""
    before = os.environ.get(ALLOCATOR_ENV)
    if mode is not None:
        os.environ[ALLOCATOR_ENV] = mode
    try:
        yield
    finally:
        if before is None:
            os.environ.pop(ALLOCATOR_ENV, None)
        else:
            os.environ[ALLOCATOR_ENV] = before


def _combine_copies(
    plan: list[tuple[str, Schedule, int]], measured: tuple[Measurement, ...]
) -> tuple[list[tuple[str, Schedule, int]], tuple[Measurement, ...]]:
    """``plan`` with one entry per calibration role, whose Measurement holds the runs of
    all its copies (``--calibration-copies``); every other configuration as measured."""
    index: dict[str, int] = {}
    entries: list[tuple[str, Schedule, int]] = []
    runs: list[list[Measurement]] = []
    for entry, got in zip(plan, measured, strict=True):
        role = entry[0]
        if role.startswith("cal") and role in index:
            runs[index[role]].append(got)
            continue
        index[role] = len(entries)
        entries.append(entry)
        runs.append([got])
    return entries, tuple(_merge(copies, 1)[0] for copies in runs)


def _merge(rounds: list[Measurement], n: int) -> tuple[Measurement, ...]:
    """One Measurement per schedule from rounds measured one at a time (``rounds`` holds
    ``n`` per round, in plan order)."""
    merged = []
    for k in range(n):
        found = rounds[k::n]
        merged.append(
            Measurement(
                schedule=found[0].schedule,
                steps=tuple(step for got in found for step in got.steps),
                makespans_ns=tuple(t for got in found for t in got.makespans_ns),
                stage_bytes=found[-1].stage_bytes,
                page_faults=tuple(f for got in found for f in got.page_faults),
            )
        )
    return tuple(merged)


def _model_error(got: Measurement, costs: CostModel) -> float:
    """Median over the runs of the replay's error (:func:`pipesim.calibration.replay`: each
    action its measured compute, the calibrated overheads): the model's own error."""
    errors = [
        float((replay(step, costs) - span) / span) * 100
        for step, span in zip(got.steps, got.makespans_ns, strict=True)
    ]
    return float(statistics.median(errors))


def run(args: argparse.Namespace) -> int:
    # The two ranks and this process account for up to about 3 of the load by themselves.
    default = 3 + 0.5 * (os.cpu_count() or 1)
    max_load = args.max_load if args.max_load is not None else default
    sizes = _parse_sizes(args.sizes)
    print(
        f"fidelity: p=2, calibration m={args.calibration_microbatches} "
        f"({args.calibration_copies} runs a round, the first schedule of a round "
        f"{BURN_IN} more untimed steps), "
        f"{args.microbatch_size} rows per micro-batch, {args.threads} thread(s) per rank, "
        f"{args.repeats} rounds (fresh rank processes each); CPU allocator "
        f"{' and '.join(args.allocators) if args.allocators else allocator_mode()}; "
        f"{os.cpu_count()} CPUs, load {os.getloadavg()} (BUSY above {max_load:.1f})",
        flush=True,
    )
    if _load() > max_load:
        print(
            f"warning: the machine is busy now (load {_load():.1f} > {max_load:.1f}); lines "
            "measured while it stays busy are flagged BUSY and the summary is refused",
            flush=True,
        )
    results: dict[str, tuple[list[dict[str, Any]], list[dict[str, Any]]]] = {}
    steps_out: list[dict[str, Any]] = []
    for layers, width in sizes:
        options = {"n_layers": layers, "width": width}
        model = f"{layers}x{width}"
        plan = _plan(args)
        print(f"model gpt {model}: {len(plan)} schedules x {args.repeats} rounds", flush=True)
        load = _load()
        by_mode = _measure_size(args, options, plan)
        load = max(load, _load())
        for mode, copies in by_mode.items():
            plan_once, measured = _combine_copies(plan, copies)
            steps_out.append(_plain_size(model, mode, plan_once, measured))
            if len(by_mode) > 1:
                print(f"  under the {mode} allocator:", flush=True)
            rows, floor = results.setdefault(mode, ([], []))
            _evaluate(args, (model, options), plan_once, measured, (load, max_load), (rows, floor))
            for row in rows + floor:
                row["allocator"] = mode
        if args.effects and (layers, width) == sizes[0]:
            _effects(args, options)
        if args.steps_out:
            with open(args.steps_out, "w", encoding="utf-8") as out:
                json.dump(steps_out, out)
    if len(results) > 1:
        _paired(results)
    worst = 0
    for mode, (rows, floor) in results.items():
        if len(results) > 1:
            print(f"summary under the {mode} allocator:")
        json_out = _json_path(args.json_out, mode if len(results) > 1 else None)
        worst = max(worst, _summary(args, rows, floor, json_out))
    return worst


def _plain_size(
    model: str, mode: str, plan: list[tuple[str, Schedule, int]], measured: tuple[Measurement, ...]
) -> dict[str, Any]:
    """One model size's measured steps under one allocator, as ``--steps-out`` keeps them."""
    return {
        "model": model,
        "allocator": mode,
        "runs": [_plain(role, b, m) for (role, _, b), m in zip(plan, measured, strict=True)],
    }


def _json_path(path: str | None, mode: str | None) -> str | None:
    """``--json-out``, with the allocator before the suffix when two were compared."""
    if path is None or mode is None:
        return path
    root, ext = os.path.splitext(path)
    return f"{root}.{mode}{ext or '.json'}"


def _evaluate(
    args: argparse.Namespace,
    size: tuple[str, dict[str, int]],
    plan: list[tuple[str, Schedule, int]],
    measured: tuple[Measurement, ...],
    loads: tuple[float, float],
    out: tuple[list[dict[str, Any]], list[dict[str, Any]]],
) -> None:
    """Calibrate the cuts from ``measured``, predict every configuration of ``plan`` and
    add its row to ``out`` (grid and size rows, in-sample rows)."""
    model, options = size
    (load, max_load), (rows, floor) = loads, out
    got = dict(zip(range(len(plan)), measured, strict=True))
    fits, samples = _fit_cuts(args, options, plan, got)
    cuts = {2: fits["cal:1"], 4: fits["cal:2"]}
    fit = None
    if args.scale_sizes:
        b1, b2 = args.scale_sizes
        pick = {
            b: fits["cal:1"] if b == args.microbatch_size else fits[f"cal-b:{b}"] for b in (b1, b2)
        }
        fit = AffineCosts.fit(pick[b1], pick[b2], sizes=(b1, b2))
    for k, (role, schedule, b) in enumerate(plan):
        if role == "cal:1":
            costs, name, target = cuts[2], "(calibration)", floor
        elif role == "grid":
            costs, name, target = costs_for(schedule, cuts), schedule.name, rows
        elif role.startswith("scale:") and fit is not None:
            costs, name, target = fit.at(b), f"{schedule.name} b={b}", rows
        else:
            continue
        predicted = int(predict(schedule, costs))
        virtual = schedule.n_stages // schedule.n_ranks
        row = _row(model, name, virtual, schedule.n_microbatches, predicted, got[k], load, max_load)
        row["model_error_pct"] = _model_error(got[k], costs)
        band = drawn = None
        if not role.startswith("scale:"):  # samples measured at this size only
            runs = samples[schedule.n_stages // schedule.n_copies]
            spread = draw_prediction(schedule, costs, runs, draws=args.draws)
            band, drawn = spread.band, spread.drawn
        _add_band(row, band, got[k])
        row["drawn_error_pct"] = (
            float((drawn.median - got[k].median_ns) / got[k].median_ns) * 100 if drawn else None
        )
        target.append(row)
        print(("  in sample: " if target is floor else "  ") + _line(row), flush=True)


def _fit_cuts(
    args: argparse.Namespace,
    options: dict[str, int],
    plan: list[tuple[str, Schedule, int]],
    got: dict[int, Measurement],
) -> tuple[dict[str, CostModel], dict[int, Any]]:
    """Per calibration role its cost model; per stage count its runs' compute samples."""
    fits: dict[str, CostModel] = {}
    samples: dict[int, Any] = {}
    for k, (role, _, b) in enumerate(plan):
        if role.startswith("cal"):
            costs, meta = fit_cut(
                got[k],
                model="gpt",
                model_options=options,
                microbatch_size=b,
                threads=args.threads,
                send_mode=args.send_mode,
            )
            fits[role] = costs
            if role in ("cal:1", "cal:2"):
                samples[meta["n_stages"]] = meta["compute_samples_ns"]
            _print_cut(meta["virtual"], b, costs)
            _save_cut(args, options, costs, meta)
    return fits, samples


def _paired(results: dict[str, tuple[list[dict[str, Any]], list[dict[str, Any]]]]) -> None:
    """Side by side: each configuration's median measured step under each allocator."""
    (first, (rows_a, floor_a)), (second, (rows_b, floor_b)) = list(results.items())[:2]
    ratios = []
    print(f"measured steps side by side ({second} / {first}, medians of the same rounds):")
    for a, b in zip(floor_a + rows_a, floor_b + rows_b, strict=True):
        ratio = b["measured_ms"] / a["measured_ms"]
        ratios.append(ratio)
        print(
            f"  {a['model']:>7} {a['schedule']:<18} v={a['virtual']} m={a['m']:<3} "
            f"{first} {a['measured_ms']:9.2f} ms (spread {a['spread_pct']:5.1f}%)  "
            f"{second} {b['measured_ms']:9.2f} ms (spread {b['spread_pct']:5.1f}%)  "
            f"x{ratio:.3f}"
        )
    geo = statistics.geometric_mean(ratios)
    print(
        f"  {len(ratios)} configurations: geometric mean x{geo:.3f}, median "
        f"x{statistics.median(ratios):.3f}, {sum(r < 1 for r in ratios)} faster under {second}"
    )


def _add_band(row: dict[str, Any], band: PredictionBand | None, got: Measurement) -> None:
    """The band's p10 and p90 (ms) and how many measured runs fell inside it."""
    row["band_ms"] = [float(band.low) / 1e6, float(band.high) / 1e6] if band else None
    row["runs_in_band"] = (
        sum(band.low <= t <= band.high for t in got.makespans_ns) if band else None
    )


def _plain(role: str, rows: int, got: Measurement) -> dict[str, Any]:
    """One schedule's measured steps as JSON: the schedule and, per run, each unit of
    work's rank, name, compute start and end (ns), to refit and replay offline."""
    return {
        "role": role,
        "rows": rows,
        "schedule": json.loads(schedule_to_json(got.schedule)),
        "steps": [
            [[r.rank, str(r.work), int(r.start), int(r.end)] for r in step.trace.actions]
            for step in got.steps
        ],
    }


def _effects(args: argparse.Namespace, options: dict[str, int]) -> None:
    """What the calibration controls for, in numbers: the first step in fresh processes
    (no warm-up) and two intra-op threads per rank instead of one, on 1F1B m=8."""
    schedule = generate("1f1b", n_ranks=2, n_microbatches=8)

    def once(warmup: int, threads: int) -> Measurement:
        return measure(
            schedule,
            model="gpt",
            model_options=options,
            microbatch_size=args.microbatch_size,
            repeats=args.repeats,
            threads=threads,
            warmup=warmup,
            timeout_s=args.timeout,
        )

    base = once(1, args.threads)
    for label, got in (
        ("no warm-up step", once(0, args.threads)),
        (f"{2 * args.threads} threads per rank", once(1, 2 * args.threads)),
    ):
        ratio = float(got.median_ns / base.median_ns)
        print(
            f"  effect of {label} on 1f1b m=8: median step x{ratio:.2f} "
            f"(spread {got.spread * 100:.0f}% against {base.spread * 100:.0f}%)",
            flush=True,
        )


def _stats(errors: list[float]) -> tuple[float, float, float]:
    """Mean and max of the absolute errors, and the signed mean (0s without errors)."""
    if not errors:
        return (0.0, 0.0, 0.0)
    absolute = [abs(e) for e in errors]
    return (sum(absolute) / len(errors), max(absolute), sum(errors) / len(errors))


def _groups(rows: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """The errors' mean / max / signed mean per part of the grid: the schedule grid
    (registered families at the calibration's micro-batch size) and the micro-batch
    sizes predicted from the affine fit, per model size (the README's table)."""
    parts: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for row in rows:
        kind = "micro-batch sizes" if " b=" in row["schedule"] else "schedule grid"
        parts[f"{row['model']} {kind}"].append(row)
        parts[f"all {kind}"].append(row)
    drawn = "drawn_error_pct"
    return {
        label: {
            "configurations": len(group),
            "error_pct": _stats([r["error_pct"] for r in group]),
            "model_error_pct": _stats([r["model_error_pct"] for r in group]),
            "drawn_error_pct": _stats([r[drawn] for r in group if r.get(drawn) is not None]),
            "configurations_drawn": sum(1 for r in group if r.get(drawn) is not None),
        }
        for label, group in sorted(parts.items())
    }


def _group_line(label: str, group: dict[str, Any]) -> str:
    """One line of :func:`_groups`: error, drawn error (where drawn) and model error."""

    def stats(key: str) -> str:
        mean_abs, max_abs, signed = group[key]
        return f"mean {mean_abs:.1f}% max {max_abs:.1f}% (signed {signed:+.1f}%)"

    drawn = f"; drawn {stats('drawn_error_pct')}" if group["configurations_drawn"] else ""
    return (
        f"  {label} ({group['configurations']} configurations): error "
        f"{stats('error_pct')}{drawn}; model error {stats('model_error_pct')}"
    )


def _summary(
    args: argparse.Namespace,
    rows: list[dict[str, Any]],
    floor: list[Any],
    json_out: str | None,
) -> int:
    if not rows:
        print("no configuration was measured")
        return 1
    errors = [abs(r["error_pct"]) for r in rows]
    spreads = [r["spread_pct"] for r in rows]
    excess = [r["excess_pct"] for r in rows]
    model = [abs(r["model_error_pct"]) for r in rows]
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
        "mean_abs_model_error_pct": sum(model) / len(model),
        "max_abs_model_error_pct": max(model),
        "mean_signed_model_error_pct": sum(r["model_error_pct"] for r in rows) / len(rows),
        "in_sample_error_pct": [r["error_pct"] for r in floor],
        "runs_in_band": sum(r["runs_in_band"] for r in rows if r["band_ms"]),
        "configurations_drawn": sum(1 for r in rows if r["band_ms"]),
        "drawn_error_pct": _stats([r["drawn_error_pct"] for r in rows if r["band_ms"]]),
        "error_pct_where_drawn": _stats([r["error_pct"] for r in rows if r["band_ms"]]),
        "runs_with_band": sum(len(r["runs_ms"]) for r in rows if r["band_ms"]),
        "busy_lines": len(busy),
        "load_average_end": os.getloadavg(),
        "page_faults": _faults([*rows, *floor]),
    }
    summary["groups"] = _groups(rows)
    if json_out:
        with open(json_out, "w", encoding="utf-8") as out:
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
        f"{summary['max_excess_pct']:.1f}%; model error (replay with each run's own compute "
        f"times) mean {summary['mean_abs_model_error_pct']:.1f}% max "
        f"{summary['max_abs_model_error_pct']:.1f}% (signed mean "
        f"{summary['mean_signed_model_error_pct']:+.1f}%); measured runs inside the p10-p90 "
        f"band: {summary['runs_in_band']} of {summary['runs_with_band']}"
    )
    for label, key in (("prediction", "error_pct_where_drawn"), ("drawn", "drawn_error_pct")):
        mean_abs, max_abs, signed = summary[key]
        print(
            f"{label} error where drawn ({summary['configurations_drawn']} configurations): "
            f"mean {mean_abs:.1f}% max {max_abs:.1f}% (signed mean {signed:+.1f}%)"
        )
    for label, group in summary["groups"].items():
        print(_group_line(label, group))
    print(
        "in sample (calibration schedule from its own file): "
        + ", ".join(f"{e:+.1f}%" for e in summary["in_sample_error_pct"])
    )
    if summary["page_faults"] is not None:
        faults = summary["page_faults"]
        print(
            f"page faults in a measured step, the most on one rank: median "
            f"{faults['median']:,.0f} over the configurations, at most {faults['max']:,} "
            f"({faults['where']})"
        )
    return 0


def _faults(rows: list[dict[str, Any]]) -> dict[str, Any] | None:
    """Over the configurations' ``page_faults_max``: the median, the most and where."""
    counted = [r for r in rows if r.get("page_faults_max") is not None]
    if not counted:
        return None
    worst = max(counted, key=lambda r: r["page_faults_max"])
    return {
        "median": statistics.median(r["page_faults_max"] for r in counted),
        "max": worst["page_faults_max"],
        "where": f"{worst['model']} {worst['schedule']} m={worst['m']}",
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="one model, 4 families, m=8, 2 runs")
    parser.add_argument("--sizes", default=None, help="GPT sizes LAYERSxWIDTH,... (6x256,6x512)")
    parser.add_argument("--families", default=None, help="schedules to predict (all registered)")
    parser.add_argument("--microbatches", default=None, help="m values to predict (4,16)")
    parser.add_argument("--calibration-microbatches", type=int, default=4)
    parser.add_argument(
        "--calibration-copies",
        type=int,
        default=3,
        help="runs of each calibration schedule per round, at their own places in it (3)",
    )
    parser.add_argument("--microbatch-size", type=int, default=8, help="rows per micro-batch")
    parser.add_argument(
        "--repeats", type=int, default=None, help="rounds: runs per configuration (3)"
    )
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
        help="also measure the warm-up and threads effects on 1F1B m=8 (default: off)",
    )
    parser.add_argument("--scale-targets", default="2,16", help="sizes predicted from them")
    parser.add_argument(
        "--send-mode",
        choices=SEND_MODES,
        default="rendezvous",
        help="the message rule calibrated and predicted with (CostModel.send_mode)",
    )
    parser.add_argument(
        "--allocators",
        default=None,
        help="CPU allocators to measure side by side, each round under each in alternating "
        "order, e.g. system,retain (default: $PIPESIM_CPU_ALLOCATOR alone)",
    )
    parser.add_argument("--draws", type=int, default=200, help="draws per p10-p90 band (200)")
    parser.add_argument("--json-out", default=None, help="write every row and the summary")
    parser.add_argument("--costs-dir", default=None, help="keep the calibrated cost files here")
    parser.add_argument("--steps-out", default=None, help="write every measured step (JSON)")
    args = parser.parse_args(argv)
    args.sizes = args.sizes or ("6x256" if args.quick else "6x256,6x512")
    m_text = args.microbatches or ("8" if args.quick else "4,16")
    args.microbatches = [int(v) for v in m_text.split(",")]
    args.repeats = args.repeats or (2 if args.quick else 3)
    scale = args.scale_sizes or ("none" if args.quick else "4,8")
    args.scale_sizes = None if scale == "none" else [int(v) for v in scale.split(",")]
    args.scale_targets = [int(v) for v in args.scale_targets.split(",")]
    args.effects = bool(args.effects)
    args.allocators = _allocators(parser, args.allocators)
    if args.calibration_copies < 1:
        parser.error(f"--calibration-copies {args.calibration_copies}: give 1 or more")
    return run(args)


def _allocators(parser: argparse.ArgumentParser, text: str | None) -> list[str] | None:
    """``--allocators``: distinct modes of ``verify.allocator`` (None: the environment's)."""
    if text is None:
        return None
    modes = [m.strip().lower() for m in text.split(",") if m.strip()]
    if not modes or any(m not in ALLOCATOR_MODES for m in modes) or len(set(modes)) != len(modes):
        parser.error(
            f"--allocators {text!r}: give distinct modes from {', '.join(ALLOCATOR_MODES)}, "
            "e.g. system,retain"
        )
    return modes


if __name__ == "__main__":
    sys.exit(main())
