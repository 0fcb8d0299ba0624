"""The zero-bubble paper's Table 5 bubble rates beside pipesim's.

Qi et al., "Zero Bubble Pipeline Parallelism", ICLR 2024 (arXiv 2401.10241): Table 6
(Table 9 of the arXiv version) profiles T_F, T_B (the input-gradient half), T_W and
T_comm for each model and number of micro-batches m; Table 5 gives, for the same rows,
the bubble rate ``(cost - m (T_F + T_B + T_W)) / cost`` where ``cost`` is the longest
per-stage span (first start to last end of one stage), for 1F1B, ZB-H1, ZB-H2 and the
automatic ZB-1p / ZB-2p (memory of 1F1B, twice 1F1B's). Every row of both tables is here
(m = 3p, 4p and 8p for each model), each with its own profiled times as pipesim costs:
F = T_F, I = T_B, W = T_W, B = T_B + T_W, every message T_comm of latency. The numbers
below were checked cell by cell against the paper's text.

Memory as the zero-bubble runtime's scheduler counts it (sail-sg/zero-bubble-pipeline-
parallelism, ``megatron/core/pipeline_parallel/zerobubble/runtime.py``: per token and
layer F stores ``M_B = 34 h + 5 a s`` and the input-gradient pass leaves ``M_W = 32 h``
for W), with each model's hidden size h, heads a and sequence length s (the paper's
Table 3); the limits p and 2p are in micro-batches of ``M_B``. The share W keeps matters
at 2p: holding all of ``M_B`` until W (pipesim's default when a cost model gives no
bytes) leaves the last ranks too little room to defer W, and ZB-2p's figure is not reached.

Printed per row: the paper's figure and pipesim's for each schedule, by the paper's
metric (``pipesim.metrics.span_metrics``); for ZB-1p and ZB-2p pipesim's own
``synthesize --objective period --optimizer-sync post-validation`` at memory limits p and
2p, whose figure is the bubble against its steady-state iteration period (with
post-validation the next iteration's work starts as each rank ends, so the period is the
span the paper counts: pipesim.iterations), its winner, the engine's re-simulation of
it (span bubble, the paper's metric, and the peak memory against the limit), and the
bubble against the period of the hand-made schedules under post-validation and under a global sync
(Megatron-LM's default, which waits for the whole step). Machine load and the wall time
of each row come first and last.

Then the controllable-memory paper's V-Half and V-Min (Qi et al., NeurIPS 2024, arXiv
2405.15362) by its metric, ``1 - m (F + B + W) / longest stage time`` (the same span
bubble; the repository's Hugging Face space, sail/pipeline-parallelism-with-controllable-
memory, ``description1.md``), with F = I = W per chunk, beside the figures the zero-bubble
repository's README gives: bubble ``B/2`` and ``2B/3`` of 1F1B's ``B = (p-1)/(m+p-1)``
in ``(p+2)//2`` and ``(p+4)//3`` micro-batches. These are the authors' closed forms, not
the paper's measured table (its bubble rates of real 9.6B / 21B / 38.5B runs were not
available to check against; docs/steady-state.md).

Between Table 5 and V-Half / V-Min, the arXiv version's ZB-V table (Table 8: bubble rates
of 1F1B, 1F1B-I, ZB-H1, ZB-H2 and ZB-V for 6.2B / 14.6B / 28.3B on p = 16 / 24 / 32
stages, m = 3p, 4p, 8p, by the same metric) beside pipesim's ``zbv`` and its 1F1B,
interleaved-1f1b (v = 2), ZB-H1 and ZB-H2. The paper says those rates come from T_F, T_B,
T_W and T_comm profiled in its ZB-V runs but does not print them (its Table 9 holds the
Section 5 times); the authors' repository does: ``arxiv_bubble_rates()`` in
``megatron/core/pipeline_parallel/efficiency.py`` (sail-sg/zero-bubble-pipeline-
parallelism, commit f68d387 "for arxiv paper", 2023-11-29; the same nine rows in
``v_schedule.py``'s ``__main__``). They are per chunk (one layer: the models have 2p
layers here); the V runs on them as they are, the one-chunk-per-rank schedules on twice
F, B and W with T_comm unchanged. So pipesim's ``zbv`` and interleaved-1f1b get the
per-chunk times and 1F1B / ZB-H1 / ZB-H2 the doubled ones. The authors' ZB-V cell is the
order their heuristic builds on these times (``PipelineGraph.get_v_schedule``, memory
limit 2p layer activations, 1F1B's); pipesim's ``zbv`` is torch's fixed order, a
different schedule (docs/steady-state.md).

Run: ``python benchmarks/bench_zero_bubble.py [--quick] [--m3p]`` (``--quick``: the
8-stage rows of Table 5, the 16-stage rows of Table 8; ``--m3p``: one row per model, m = 3p).
"""

from __future__ import annotations

import argparse
import os
import time
from fractions import Fraction

from pipesim.costs import CostModel, Link
from pipesim.engine import simulate
from pipesim.iterations import steady_period
from pipesim.metrics import span_metrics
from pipesim.schedules import generate
from pipesim.synth import synthesize

# The paper's tables, checked cell by cell against two independent text conversions of
# it (the ICLR 2024 camera-ready, openreview tuzTN0eIO5, and the arXiv version with ZB-V);
# both carry the same cells. The profiled-time table is Table 6 in the ICLR version and
# Table 9 (Appendix D) in the arXiv version; Tables 3 and 5 keep their numbers. The two
# tables also check each other: the engine turns every row's times into Table 5's 1F1B,
# ZB-H1 and ZB-H2 cells to 4 digits (tests/test_iterations.py).
#: Table 6 (ICLR) / 9 (arXiv), profiled in ZB-2p runs, milliseconds:
#: (model, m) -> (p, T_F, T_B, T_W, T_comm). Each (model, m) row has times of its own.
TABLE_6 = {
    ("1.5B", 24): (8, "18.522", "18.086", "9.337", "0.601"),
    ("1.5B", 32): (8, "18.513", "18.086", "9.331", "0.626"),
    ("1.5B", 64): (8, "18.546", "18.097", "9.321", "0.762"),
    ("6.2B", 24): (8, "29.718", "29.444", "19.927", "0.527"),
    ("6.2B", 32): (8, "29.802", "29.428", "19.530", "0.577"),
    ("6.2B", 64): (8, "29.935", "29.621", "19.388", "0.535"),
    ("14.6B", 48): (16, "11.347", "11.248", "8.132", "0.377"),
    ("14.6B", 64): (16, "11.307", "11.254", "8.101", "0.379"),
    ("14.6B", 128): (16, "11.325", "11.308", "8.109", "0.378"),
    ("28.3B", 96): (32, "10.419", "10.207", "7.715", "0.408"),
    ("28.3B", 128): (32, "10.408", "10.204", "7.703", "0.408"),
    ("28.3B", 256): (32, "10.402", "10.248", "7.698", "0.460"),
}
#: Table 3: model -> (hidden size h, attention heads a, sequence length s). Its layers
#: (22, 30, 46, 62) and micro-batch sizes (6, 3, 1, 1) are not needed: the memory limits
#: are in units of one micro-batch's M_B, so the micro-batch size cancels.
TABLE_3 = {
    "1.5B": (2304, 24, 1024),
    "6.2B": (4096, 32, 1024),
    "14.6B": (5120, 40, 1024),
    "28.3B": (6144, 48, 1024),
}
#: Table 5's bubble rates, (model, m) -> (1F1B, ZB-H1, ZB-H2, ZB-1p, ZB-2p). Its 1F1B-I
#: column is left out: the paper's interleaving makes each layer a chunk, and its first
#: and last stages have one layer fewer, so stages hold unequal chunk counts.
TABLE_5 = {
    ("1.5B", 24): (0.2431, 0.1585, 0.1083, 0.1585, 0.0433),
    ("1.5B", 32): (0.1985, 0.1242, 0.0837, 0.1242, 0.0039),
    ("1.5B", 64): (0.1240, 0.0674, 0.0444, 0.0674, 0.0026),
    ("6.2B", 24): (0.2347, 0.1323, 0.0698, 0.1323, 0.0029),
    ("6.2B", 32): (0.1898, 0.1045, 0.0559, 0.1045, 0.0022),
    ("6.2B", 64): (0.1091, 0.0554, 0.0294, 0.0554, 0.0010),
    ("14.6B", 48): (0.2552, 0.1397, 0.0672, 0.1397, 0.0066),
    ("14.6B", 64): (0.2082, 0.1088, 0.0516, 0.1088, 0.0054),
    ("14.6B", 128): (0.1251, 0.0576, 0.0266, 0.0576, 0.0028),
    ("28.3B", 96): (0.2646, 0.1421, 0.0641, 0.1421, 0.0038),
    ("28.3B", 128): (0.2168, 0.1106, 0.0490, 0.1106, 0.0029),
    ("28.3B", 256): (0.1352, 0.0594, 0.0257, 0.0594, 0.0018),
}
SCHEDULES = ("1F1B", "ZB-H1", "ZB-H2", "ZB-1p", "ZB-2p")
#: The arXiv version's Table 8 inputs, per chunk (half a stage), milliseconds: (model, m)
#: -> (p, T_F, T_B, T_W, T_comm). Not printed in the paper; typed from the authors'
#: ``arxiv_bubble_rates()`` (module docstring), which gives them in microseconds.
TABLE_8_TIMES = {
    ("6.2B", 48): (16, "14.407", "14.380", "9.676", "1.610"),
    ("6.2B", 64): (16, "14.412", "14.393", "9.688", "1.621"),
    ("6.2B", 128): (16, "14.316", "14.306", "9.639", "1.619"),
    ("14.6B", 72): (24, "6.763", "6.969", "5.251", "0.755"),
    ("14.6B", 96): (24, "6.783", "6.984", "5.259", "0.758"),
    ("14.6B", 192): (24, "6.785", "6.990", "5.260", "0.770"),
    ("28.3B", 96): (32, "9.458", "9.748", "7.288", "0.879"),
    ("28.3B", 128): (32, "9.469", "9.744", "7.306", "0.892"),
    ("28.3B", 256): (32, "9.447", "9.644", "7.193", "0.887"),
}
#: The arXiv version's Table 8 bubble rates (the longest per-stage span, as Table 5),
#: (model, m) -> (1F1B, 1F1B-I, ZB-H1, ZB-H2, ZB-V); checked against two text copies.
TABLE_8 = {
    ("6.2B", 48): (0.2668, 0.1499, 0.1536, 0.0823, 0.0697),
    ("6.2B", 64): (0.2206, 0.1169, 0.1198, 0.0630, 0.0533),
    ("6.2B", 128): (0.1390, 0.0621, 0.0637, 0.0325, 0.0274),
    ("14.6B", 72): (0.2699, 0.1519, 0.1439, 0.0628, 0.0638),
    ("14.6B", 96): (0.2229, 0.1184, 0.1121, 0.0480, 0.0483),
    ("14.6B", 192): (0.1403, 0.0630, 0.0595, 0.0247, 0.0250),
    ("28.3B", 96): (0.2676, 0.1509, 0.1429, 0.0629, 0.0593),
    ("28.3B", 128): (0.2204, 0.1177, 0.1111, 0.0478, 0.0451),
    ("28.3B", 256): (0.1362, 0.0626, 0.0593, 0.0251, 0.0236),
}
#: Table 8's columns: label -> (pipesim schedule, virtual stages per rank). With v = 2 a
#: stage is one chunk and runs on the per-chunk times; with v = 1 on twice them.
TABLE_8_SCHEDULES = {
    "1F1B": ("1f1b", 1),
    "1F1B-I": ("interleaved-1f1b", 2),
    "ZB-H1": ("zb-h1", 1),
    "ZB-H2": ("zb-h2", 1),
    "ZB-V": ("zbv", 2),
}


def paper_costs(model: str, m: int | None = None) -> tuple[int, int, CostModel]:
    """``(p, m, costs)`` of a Table 6 row (``m`` None: the model's m = 3p row), with the
    runtime's memory model (module docstring)."""
    if m is None:
        m = min(rows for name, rows in TABLE_6 if name == model)
    p, f, b, w, comm = TABLE_6[model, m]
    h, a, s = TABLE_3[model]
    costs = CostModel.uniform(
        forward=Fraction(f),
        input_grad=Fraction(b),
        weight_grad=Fraction(w),
        backward=Fraction(b) + Fraction(w),
        link=Link(latency=Fraction(comm)),
        activation_bytes=34 * h + 5 * a * s,
        weight_grad_bytes=32 * h,
        time_unit="ms",
    )
    return p, m, costs


def _period_bubble(busy: Fraction | int, n_ranks: int, period: Fraction | int) -> float:
    return float(1 - Fraction(busy) / (n_ranks * period))


def row(model: str, m: int) -> tuple[list[str], float]:
    """One printed row per schedule of Table 5's ``(model, m)``, and its wall seconds."""
    started = time.perf_counter()
    p, m, costs = paper_costs(model, m)
    busy = m * p * (costs.stage(0).forward + costs.stage(0).input_grad + costs.stage(0).weight_grad)
    limit_unit = costs.stage(0).activation_bytes  # one micro-batch's M_B
    lines = []
    for label, name, paper in zip(
        SCHEDULES[:3], ("1f1b", "zb-h1", "zb-h2"), TABLE_5[model, m], strict=False
    ):
        schedule = generate(name, n_ranks=p, n_microbatches=m)
        sim = simulate(schedule, costs=costs)
        span = float(span_metrics(sim.trace).bubble_ratio)
        post = steady_period(schedule, costs=costs, sync="post-validation", check=False)
        lines.append(
            f"  {label:6} paper {paper:.4f}  pipesim {span:.4f} ({span - paper:+.4f})  "
            f"period bubble: post-validation {_period_bubble(busy, p, post.period):.4f}, "
            f"global {float(sim.metrics.bubble_ratio):.4f}"
        )
    for label, limit, paper in zip(SCHEDULES[3:], (p, 2 * p), TABLE_5[model, m][3:], strict=True):
        result = synthesize(
            n_ranks=p,
            n_microbatches=m,
            memory_limit=limit,
            costs=costs,
            objective="period",
            sync="post-validation",
        )
        assert result.iterations is not None
        ratio = result.iterations.period_bubble_ratio()
        assert ratio is not None
        ours = float(ratio)
        again = simulate(result.schedule, costs=costs)  # the engine, not the synthesizer
        span = float(span_metrics(again.trace).bubble_ratio)
        peak = max(r.peak_activation_bytes for r in again.metrics.ranks)
        lines.append(
            f"  {label:6} paper {paper:.4f}  pipesim {ours:.4f} ({ours - paper:+.4f})  "
            f"synthesize --objective period at {limit} micro-batches: {result.winner}; "
            f"re-simulated: span bubble {span:.4f}, peak {peak / limit_unit:.2f} "
            f"micro-batches (limit {limit}); one-step bubble "
            f"{float(result.metrics.bubble_ratio):.4f}"
        )
    return lines, time.perf_counter() - started


def table_8_costs(model: str, m: int, virtual: int) -> tuple[int, CostModel]:
    """``(p, costs)`` of a Table 8 row for a schedule of ``virtual`` stages per rank:
    the per-chunk times for two (a stage is one chunk), twice them for one, the same
    T_comm; memory as :func:`paper_costs`, one layer (M_B) per chunk."""
    p, f, b, w, comm = TABLE_8_TIMES[model, m]
    scale = 2 // virtual
    h, a, s = TABLE_3[model]
    costs = CostModel.uniform(
        forward=scale * Fraction(f),
        input_grad=scale * Fraction(b),
        weight_grad=scale * Fraction(w),
        backward=scale * (Fraction(b) + Fraction(w)),
        link=Link(latency=Fraction(comm)),
        activation_bytes=scale * (34 * h + 5 * a * s),
        weight_grad_bytes=scale * 32 * h,
        time_unit="ms",
    )
    return p, costs


def table_8_bubbles(model: str, m: int) -> dict[str, tuple[float, float]]:
    """Table 8's columns for ``(model, m)``: label -> (pipesim's span bubble, peak
    activation memory of the busiest rank in one layer's M_B)."""
    out = {}
    for label, (name, virtual) in TABLE_8_SCHEDULES.items():
        p, costs = table_8_costs(model, m, virtual)
        schedule = (
            generate(name, n_ranks=p, n_microbatches=m, virtual=virtual)
            if virtual > 1
            else generate(name, n_ranks=p, n_microbatches=m)
        )
        sim = simulate(schedule, costs=costs)
        peak = max(r.peak_activation_bytes for r in sim.metrics.ranks)
        layer = costs.stage(0).activation_bytes // (2 // virtual)
        out[label] = (float(span_metrics(sim.trace).bubble_ratio), peak / layer)
    return out


def table_8_row(model: str, m: int) -> tuple[list[str], float]:
    """One printed line per Table 8 column of ``(model, m)``, and its wall seconds."""
    started = time.perf_counter()
    p = TABLE_8_TIMES[model, m][0]
    ours = table_8_bubbles(model, m)
    lines = []
    for (label, (span, peak)), paper in zip(ours.items(), TABLE_8[model, m], strict=True):
        lines.append(
            f"  {label:6} paper {paper:.4f}  pipesim {span:.4f} ({span - paper:+.4f})  "
            f"peak {peak:.2f} layer activations (1F1B's: {2 * p})"
        )
    return lines, time.perf_counter() - started


def v_row(p: int, m: int) -> str:
    """V-Half and V-Min at F = I = W per chunk (activations held from F to W) by the span
    bubble, beside the README's B/2 and 2B/3, and their peak micro-batches."""
    costs = CostModel.uniform(
        forward=1, input_grad=1, weight_grad=1, backward=2, activation_bytes=1, weight_grad_bytes=1
    )
    b = Fraction(p - 1, m + p - 1)
    cells = [f"p={p:2d} m={m:3d} 1F1B B {float(b):.4f}"]
    for name, share, memory in (
        ("v-half", Fraction(1, 2), (p + 2) // 2),
        ("v-min", Fraction(2, 3), (p + 4) // 3),
    ):
        sim = simulate(generate(name, n_ranks=p, n_microbatches=m), costs=costs)
        span = float(span_metrics(sim.trace).bubble_ratio)
        peak = Fraction(max(r.peak_activation_bytes for r in sim.metrics.ranks), 2)
        cells.append(
            f"{name} {span:.4f} (README {float(share * b):.4f}) in {float(peak):g} "
            f"micro-batches (README {memory})"
        )
    return "  ".join(cells)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--quick",
        action="store_true",
        help="only the 8-stage (Table 5) and 16-stage (Table 8) rows",
    )
    parser.add_argument(
        "--m3p", action="store_true", help="only the rows at m = 3p (one per model)"
    )
    args = parser.parse_args()
    print(f"load average {os.getloadavg()[0]:.2f} ({os.cpu_count()} CPUs)")
    print("zero-bubble paper Table 5 (bubble against the longest per-stage span) vs pipesim")
    for (model, m), (p, *_) in TABLE_6.items():
        if (args.quick and p != 8) or (args.m3p and m != 3 * p):
            continue
        lines, seconds = row(model, m)
        print(f"{model} p={p} m={m} ({seconds:.1f} s)")
        print("\n".join(lines))
    print(
        "zero-bubble paper (arXiv) Table 8, ZB-V (span bubble; authors' per-chunk times, "
        "doubled for one chunk per rank) vs pipesim"
    )
    for (model, m), (p, *_) in TABLE_8_TIMES.items():
        if (args.quick and p != 16) or (args.m3p and m != 3 * p):
            continue
        lines, seconds = table_8_row(model, m)
        print(f"{model} p={p} m={m} ({seconds:.1f} s)")
        print("\n".join(lines))
    print(
        "  (1F1B-I: the authors' script keeps the last-rank-to-rank-0 hop only for the first "
        "micro-batch of each group of p, pipesim for all; ZB-V: the authors' heuristic order "
        "vs pipesim's fixed zbv order, two different schedules)"
    )
    print("controllable-memory V-Half / V-Min (span bubble, F = I = W) vs the README's forms")
    for p in (8,) if args.quick else (8, 16, 32):
        for m in (3 * p, 4 * p, 8 * p):
            print(v_row(p, m))


if __name__ == "__main__":
    main()
