"""Bubble rates: every built-in schedule against the synthesized ones (issue 13).

For p in {8, 16, 32} ranks and m in {3p, 4p, 8p} micro-batches, with realistic
unequal per-stage costs (Qi et al. 2024 measure W at about 0.5-0.7 of F and I
about equal to F): F = 100 +- 6 % per stage, I = F +- 5 %, W = 0.5 F or 0.7 F,
a message 3 % of F (latency), 1000 activation bytes per micro-batch of which W
keeps 400. The full backward of the built-ins without a split costs B = I + W.

Printed per configuration: the bubble rate (idle share of ranks x makespan) of
every built-in schedule with one stage per rank, and of ``synthesize`` at memory
limits p and 2p (1F1B's and ZB-H2's memory), its winner, its gap to the lower
bound, and its wall time; a built-in that exceeds the limit is marked ``*``
(it could not be chosen at that limit). Machine load comes first.

Then the V placement (two chunks of half a stage per rank): first, p in {8, 16}, m = 4p,
in the paper's setting (F = I = W, activations held from F to W), ``v-half`` and ``v-min``
against the zero-bubble repository's table (bubble B/2 and 2B/3 of 1F1B's B, memory
(p+2)//2 and (p+4)//3) and synthesize at those limits; then, p in {8, 16, 32} and m in
{3p, 4p, 8p}, with the realistic costs: 1F1B on the p-stage cut, ZB-V, V-Half, V-Min and
synthesize at limits p, (p+2)//2, p/2, (p+4)//3 and p/3 (each once), beside the V
schedules that fit the limit.

Last a summary: at limit p against ``zb-h1``, at 2p against ``zb-h2``, on the V at each
limit against ``v-half`` and ``v-min`` where they fit, in how many rows synthesis is no
worse, and the gap to the bound.

Last, the time synthesize spends on its greedy candidates at p = 32, m = 256 (p = 16,
m = 128 with ``--quick``): as it makes them (no re-run where no message queues) against
every candidate re-run with the exact evaluator, CPU seconds side by side, medians of 3.

Run: ``python benchmarks/bench_synth.py [--quick]`` (``--quick``: p = 8 only).
"""

from __future__ import annotations

import argparse
import os
import time
from fractions import Fraction

from pipesim import CostModel, Link, StageCost, generate, schedule_names, simulate
from pipesim.schedule import Schedule
from pipesim.schedules import get_spec
from pipesim.synth import make_problem, synthesize
from pipesim.synth.heuristic import greedy_run, policies
from pipesim.synth.synthesize import evaluate_candidate, greedy_candidates


def realistic_costs(p: int, w_ratio: float) -> CostModel:
    """Deterministic jitter per stage, integers (exact and fast)."""
    stages = []
    for s in range(p):
        f = 100 + (37 * s) % 13 - 6  # 94..106
        i = f + (11 * s) % 11 - 5  # F +- 5 %
        w = round(f * w_ratio)
        stages.append(
            StageCost(
                forward=f,
                input_grad=i,
                weight_grad=w,
                backward=i + w,
                activation_bytes=1000,
                weight_grad_bytes=400,
                output_bytes=0,
            )
        )
    return CostModel(stages=tuple(stages), link=Link(latency=3))


def builtins() -> list[str]:
    return [
        n
        for n in schedule_names()
        if get_spec(n).virtual_values is not None
        and 1 in get_spec(n).virtual_values  # type: ignore[operator]
        and n != "sequential"
    ]


#: Per (p, m, W ratio, limit label): synthesized bubble, the named built-in's bubble (the
#: one the issue compares with at that limit; None where it does not fit), gap to the bound.
SUMMARY: dict[str, list[tuple[float, float | None, float]]] = {}


def _note(key: str, synth: float, builtin: float | None, gap: float) -> None:
    SUMMARY.setdefault(key, []).append((synth, builtin, gap))


def row(p: int, m: int, w_ratio: float) -> None:
    costs = realistic_costs(p, w_ratio)
    cells, bubbles = [], {}
    for name in builtins():
        sim = simulate(generate(name, n_ranks=p, n_microbatches=m), costs=costs).metrics
        peak = max(r.peak_activation_bytes for r in sim.ranks)
        mark = "" if peak <= p * 1000 else ("+" if peak <= 2 * p * 1000 else "*")
        cells.append(f"{name} {float(sim.bubble_ratio):6.2%}{mark}")
        bubbles[name] = float(sim.bubble_ratio)
    print(f"p={p:2d} m={m:3d} W={w_ratio}F  " + "  ".join(cells))
    for factor, rival in ((1, "zb-h1"), (2, "zb-h2")):
        start = time.process_time()
        result = synthesize(n_ranks=p, n_microbatches=m, memory_limit=factor * p, costs=costs)
        cpu = time.process_time() - start
        best = result.best_builtin_metrics
        bubble = float(result.metrics.bubble_ratio)
        _note(f"limit {factor}p vs {rival}", bubble, bubbles[rival], float(result.gap))
        print(
            f"    synth @ {factor}p: bubble {bubble:6.2%}  "
            f"best built-in {result.best_builtin.name if result.best_builtin else '-'} "
            f"{float(best.bubble_ratio) if best else float('nan'):6.2%}  "
            f"gap to bound {float(result.gap):6.2%}  winner {result.winner}  {cpu:5.1f} s CPU"
        )


def halved(costs: CostModel) -> CostModel:
    """The same model cut into twice the stages: each chunk is half a stage."""
    chunks = []
    for stage in costs.stages:
        half = {
            name: getattr(stage, name) / 2
            for name in ("forward", "input_grad", "weight_grad", "backward")
        }
        for _ in range(2):
            chunks.append(
                StageCost(**half, activation_bytes=500, weight_grad_bytes=200, output_bytes=0)
            )
    return CostModel(stages=tuple(chunks), link=costs.link)


def v_costs_of(costs: CostModel, p: int) -> CostModel:
    """2p chunks on a V: rank r holds stages r and 2p-1-r (the halves of the p-stage cut)."""
    chunks = halved(costs)
    order = list(range(p)) + list(reversed(range(p)))
    return CostModel(
        stages=tuple(chunks.stages[2 * r + (i >= p)] for i, r in enumerate(order)),
        link=costs.link,
    )


#: Memory limits on the V, in micro-batches of a rank's activations (both chunks): 1F1B's,
#: the paper's V-Half and V-Min figures ((p+2)//2, (p+4)//3), and p/2, p/3 exactly.
def v_limits(p: int) -> list[tuple[str, Fraction]]:
    """The limits, each once (at p = 8, p/2 = (p+4)//3 = 4)."""
    labels: dict[Fraction, str] = {}
    for label, limit in (
        ("p", Fraction(p)),
        ("(p+2)//2", Fraction((p + 2) // 2)),
        ("p/2", Fraction(p, 2)),
        ("(p+4)//3", Fraction((p + 4) // 3)),
        ("p/3", Fraction(p, 3)),
    ):
        labels[limit] = f"{labels[limit]}={label}" if limit in labels else label
    return [(label, limit) for limit, label in labels.items()]


def synth_v(
    p: int, m: int, costs: CostModel, label: str, limit: Fraction, rivals: dict[str, float]
) -> None:
    """Synthesize at ``limit`` and print it beside the V schedules of ``rivals`` (name ->
    bubble) that fit it."""
    start = time.process_time()
    result = synthesize(
        n_ranks=p, n_microbatches=m, memory_limit=limit, costs=costs, virtual=2, placement="v"
    )
    cpu = time.process_time() - start
    bubble = float(result.metrics.bubble_ratio)
    fitting = {c.name: c for c in result.candidates if c.builtin and c.fits}
    shown = [
        f"{n} {rivals[n]:6.2%}" for n in ("zbv", "v-half", "v-min") if n in fitting and n in rivals
    ]
    for name in ("v-half", "v-min"):
        for part in label.split("=") if rivals else ():
            rival = rivals[name] if name in fitting else None
            _note(f"V {part} vs {name}", bubble, rival, float(result.gap))
    print(
        f"    synth V @ {label:8} = {float(limit):5.2f}: bubble {bubble:6.2%}  "
        f"fitting: {', '.join(shown) or 'none'}  gap to bound {float(result.gap):6.2%}  "
        f"winner {result.winner}  {cpu:5.1f} s CPU"
    )


def v_row(p: int, m: int, w_ratio: float) -> None:
    """The V placement at the limits above (ZB-V, V-Half, V-Min of Qi et al. 2024b)."""
    costs = realistic_costs(p, w_ratio)
    v_costs = v_costs_of(costs, p)
    one = simulate(generate("1f1b", n_ranks=p, n_microbatches=m), costs=costs).metrics
    cells = [f"1f1b (p-stage cut, p mb) {float(one.bubble_ratio):6.2%}"]
    rivals = {}
    for name in ("zbv", "v-half", "v-min"):
        sim = simulate(generate(name, n_ranks=p, n_microbatches=m), costs=v_costs).metrics
        cells.append(f"{name} {float(sim.bubble_ratio):6.2%}")
        rivals[name] = float(sim.bubble_ratio)
    print(f"p={p:2d} m={m:3d} W={w_ratio}F V  " + "  ".join(cells))
    for label, limit in v_limits(p):
        synth_v(p, m, v_costs, label, limit, rivals)


def v_paper_row(p: int, m: int) -> None:
    """F = I = W per chunk, activations held F to W (the paper's setting): our V-Half and
    V-Min against the repository's table (B/2 and 2B/3 of 1F1B's B = (p-1)/(m+p-1)), and
    synthesize at the paper's limits."""
    costs = CostModel.uniform(
        forward=1, input_grad=1, weight_grad=1, backward=2, activation_bytes=1, weight_grad_bytes=1
    ).for_stages(2 * p)
    b = Fraction(p - 1, m + p - 1)
    cells = [f"1f1b B {float(b):6.2%}"]
    for name, share, memory in (
        ("v-half", Fraction(1, 2), (p + 2) // 2),
        ("v-min", Fraction(2, 3), (p + 4) // 3),
    ):
        sim = simulate(generate(name, n_ranks=p, n_microbatches=m), costs=costs).metrics
        peak = Fraction(max(r.peak_activation_bytes for r in sim.ranks), 2)
        cells.append(
            f"{name} {float(sim.bubble_ratio):6.2%} (paper {float(share * b):6.2%}) "
            f"memory {float(peak):g} (paper {memory})"
        )
    print(f"p={p:2d} m={m:3d} F=I=W V  " + "  ".join(cells))
    for label, limit in (
        ("(p+2)//2", Fraction((p + 2) // 2)),
        ("(p+4)//3", Fraction((p + 4) // 3)),
    ):
        synth_v(p, m, costs, label, limit, {})  # the paper's two limits


def speed(p: int, m: int, repeats: int = 3) -> None:
    """Greedy candidates as synthesize makes them (trusted where no message queues) against
    every candidate re-run with the exact evaluator, side by side, CPU seconds, medians."""
    problem = make_problem(
        n_ranks=p, n_microbatches=m, costs=realistic_costs(p, 0.5), memory_limit=p
    )
    fast, slow = [], []
    for _ in range(repeats):
        start = time.process_time()
        trusted = greedy_candidates(problem)
        fast.append(time.process_time() - start)
        start = time.process_time()
        evaluated = []
        for policy in policies(problem):
            run = greedy_run(problem, policy)
            if run is not None:
                schedule = Schedule.from_orders(
                    run.orders, placement=problem.placement, n_microbatches=m
                )
                evaluated.append(evaluate_candidate(problem, schedule, name=policy.name))
        slow.append(time.process_time() - start)
    same = [(c.makespan, c.peak_activation_bytes) for c in trusted] == [
        (c.makespan, c.peak_activation_bytes) for c in evaluated
    ]
    f, s = sorted(fast)[len(fast) // 2], sorted(slow)[len(slow) // 2]
    print(
        f"speed p={p} m={m}: greedy candidates {f:5.2f} s CPU, each re-run exactly {s:5.2f} s "
        f"({s / f:4.2f}x), same makespans and peaks: {same}; load {os.getloadavg()[0]:.1f}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="p = 8 only")
    args = parser.parse_args()
    print(f"load average {os.getloadavg()[0]:.2f} on {os.cpu_count()} cores")
    print("built-ins: + needs more than p micro-batches of memory, * more than 2p")
    for p in (8,) if args.quick else (8, 16, 32):
        for m in (3 * p, 4 * p, 8 * p):
            for w_ratio in (0.5, 0.7):
                row(p, m, w_ratio)
    print("V placement: 2p chunks of half a stage, limits in micro-batches of a rank's chunks")
    for p in (8,) if args.quick else (8, 16):
        v_paper_row(p, 4 * p)
    for p in (8,) if args.quick else (8, 16, 32):
        for m in (3 * p, 4 * p, 8 * p):
            for w_ratio in (0.5, 0.7):
                v_row(p, m, w_ratio)
    speed(16 if args.quick else 32, 128 if args.quick else 256)
    summary()
    print(f"load average {os.getloadavg()[0]:.2f} at the end; {time.process_time():.0f} s CPU")


def summary() -> None:
    """Per comparison: in how many rows synthesis is no worse, its largest excess (should
    be none), and the gap to the bound (median, largest)."""
    print("summary (bubble rates; a built-in counted only where it fits the limit):")
    for key, rows in SUMMARY.items():
        compared = [(s, b) for s, b, _ in rows if b is not None]
        no_worse = sum(s <= b + 1e-12 for s, b in compared)
        worst = max((s - b for s, b in compared), default=0.0)
        gaps = sorted(g for _, _, g in rows)
        gap = f"  gap to bound median {gaps[len(gaps) // 2]:.2%}, max {gaps[-1]:.2%}"
        print(
            f"    {key:24} no worse in {no_worse}/{len(compared)} rows "
            f"(synth - built-in at worst {worst:+.2%}; {len(rows) - len(compared)} rows where "
            f"the built-in does not fit){gap}"
        )


if __name__ == "__main__":
    main()
