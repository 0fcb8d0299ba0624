"""Size and build time of timeline pages: binned drawing against one bar per action.

For 1F1B at p x m in {32 x 256, 64 x 1024} (the second is the page that no
browser could draw), builds the timeline figure and its HTML (plotly.js linked from
the CDN, so the size is the figure's own data) twice: as pipesim draws it (bars up
to ``LARGE_BARS``, binned above) and forced to draw every bar. Prints the median of
``--repeats`` runs of each, the page sizes and the ratios, and the machine's load
average so that figures taken on a busy machine read as such. The simulation and the
trace's records (built lazily by the engine) are made before timing.

Run:  python benchmarks/bench_plot.py [--repeats N]
Measured (load average 10-14 on 2 shared cores, medians of 3): 64 x 1024 binned 2.45 s
and 268 kB against 16.0 s and 7.9 MB drawn bar by bar (6.5x faster, 29x smaller).
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from unittest import mock

import pipesim
from pipesim.plot import binned, timeline
from pipesim.plot.html import to_html


def _page(sim: pipesim.Simulation, *, force_bars: bool) -> tuple[float, int]:
    start = time.perf_counter()
    if force_bars:
        with mock.patch.object(timeline, "LARGE_BARS", 10**12):
            html = to_html(timeline.timeline_figure(sim), cdn=True)
    else:
        html = to_html(timeline.timeline_figure(sim), cdn=True)
    return time.perf_counter() - start, len(html.encode("utf-8"))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    print(f"load average before: {os.getloadavg()[0]:.2f} (1 min); LARGE_BARS {binned.LARGE_BARS}")
    print(
        f"{'p x m':>10} {'actions':>8} {'drawn':>7} {'s':>7} {'bytes':>11} "
        f"{'bars s':>7} {'bars bytes':>11} {'time x':>7} {'size x':>7}"
    )
    for p, m in ((32, 256), (64, 1024)):
        costs = pipesim.CostModel.uniform(activation_bytes=10**6)
        sim = pipesim.simulate(pipesim.generate("1f1b", n_ranks=p, n_microbatches=m), costs=costs)
        _ = sim.trace.actions, sim.trace.transfers, sim.trace.memory  # build them untimed
        ours = [_page(sim, force_bars=False) for _ in range(args.repeats)]
        bars = [_page(sim, force_bars=True) for _ in range(args.repeats)]
        t_ours = statistics.median(t for t, _ in ours)
        t_bars = statistics.median(t for t, _ in bars)
        size_ours, size_bars = ours[0][1], bars[0][1]
        drawn = "binned" if timeline.is_large(sim) else "bars"
        print(
            f"{p:>4} x {m:<4} {len(sim.trace.actions):>8,} {drawn:>7} {t_ours:>7.2f} "
            f"{size_ours:>11,} {t_bars:>7.2f} {size_bars:>11,} {t_bars / t_ours:>7.1f} "
            f"{size_bars / size_ours:>7.1f}"
        )
    print(
        f"load average after: {os.getloadavg()[0]:.2f} (1 min); plotly.js adds ~4.7 MB "
        "to a page that embeds it"
    )


if __name__ == "__main__":
    main()
