"""Plotly figures against oracles: closed forms, hand-worked timelines, the schedule itself.

Oracles:
- GPipe / 1F1B: makespan (m+p-1)(F+B), each rank busy m(F+B) so idle (p-1)(F+B), peak
  activations m (GPipe) and p-r (1F1B) micro-batches (Narayanan et al. 2021);
- a hand-worked split-backward schedule with an overlapped F&B unit (times below);
- bars per rank: the length of the rank's order in the Schedule, not the trace;
- one transfer per cross-rank dependency: 2(p-1)m for GPipe and 1F1B.
"""

from __future__ import annotations

import subprocess
import sys
from collections import Counter
from itertools import pairwise
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pipesim.cli import main
from pipesim.costs import CostModel, Link
from pipesim.engine import Simulation, simulate
from pipesim.errors import PipesimError
from pipesim.plot import (
    BAR_KINDS,
    OP_COLORS,
    compare_figure,
    lane_labels,
    memory_figure,
    memory_steps,
    timeline_figure,
    to_html,
    write_html,
)
from pipesim.schedule import Schedule
from pipesim.schedules import generate


def sim_of(name: str, p: int, m: int, **costs: object) -> Simulation:
    virtual = 2 if name == "interleaved-1f1b" else None
    schedule = generate(name, n_ranks=p, n_microbatches=m, virtual=virtual)
    return simulate(schedule, costs=CostModel.uniform(**costs))  # type: ignore[arg-type]


def bars(fig: object, kind: str, yaxis: str = "y") -> list[tuple[int, float, float, list]]:
    """(row, start, duration, customdata) of every bar of ``kind`` on one subplot."""
    out = []
    for trace in fig.data:  # type: ignore[attr-defined]
        if trace.type == "bar" and trace.legendgroup == kind and trace.yaxis == yaxis:
            cd = trace.customdata
            columns = zip(trace.y, trace.base, trace.x, cd, strict=True)
            out += [(y, b, x, list(c)) for y, b, x, c in columns]
    return out


# A split backward (I + W) and an overlapped F&B unit, on 2 ranks, unit costs.
# Hand-worked: rank 0 runs 0F0 [0,1] 0F1 [1,2], then waits for 1I0's gradient;
# rank 1 runs 1F0 [1,2], (1F1;1I0) [2,4] (overlap = F + I = 2), 1W0 [4,5], 1I1 [5,6],
# 1W1 [6,7]; rank 0 then 0I0 [4,5] 0W0 [5,6] 0I1 [6,7] 0W1 [7,8]. Makespan 8.
SPLIT = Schedule.from_orders(
    [
        ["0F0", "0F1", "0I0", "0W0", "0I1", "0W1"],
        ["1F0", "(1F1;1I0)OVERLAP_F_B", "1W0", "1I1", "1W1"],
    ]
)


# -- timeline structure ----------------------------------------------------------------
def test_bars_per_rank_equal_the_schedules_actions() -> None:
    p, m = 4, 8
    sim = sim_of("1f1b", p, m)
    fig = timeline_figure(sim)
    for kind in ("F", "B"):
        per_rank = Counter(row for row, *_ in bars(fig, kind))
        assert per_rank == {rank: m for rank in range(p)}
    for rank, order in enumerate(sim.schedule.orders):
        drawn = sum(1 for k in ("F", "B") for row, *_ in bars(fig, k) if row == rank)
        assert drawn == len(order)


def test_one_trace_per_kind_with_its_colour() -> None:
    sim = simulate(SPLIT)
    fig = timeline_figure(sim, memory=False)
    kinds = [t.legendgroup for t in fig.data]
    assert kinds == ["F", "I", "W", "overlap", "idle"]  # BAR_KINDS order, absent kinds left out
    assert len(set(OP_COLORS.values())) == len(BAR_KINDS)  # every kind has its own colour
    for trace in fig.data:
        assert trace.marker.color == OP_COLORS[trace.legendgroup]
    # each trace holds exactly the work of its kind
    assert sorted(c[0] for *_, c in bars(fig, "F")) == ["0F0", "0F1", "1F0"]
    assert sorted(c[0] for *_, c in bars(fig, "I")) == ["0I0", "0I1", "1I1"]
    assert sorted(c[0] for *_, c in bars(fig, "W")) == ["0W0", "0W1", "1W0", "1W1"]
    (overlap,) = bars(fig, "overlap")
    assert overlap == (1, 2, 2, ["(1F1;1I0)OVERLAP_F_B", "1,1", "1,0", 2, 4, 2])
    assert fig.data[kinds.index("overlap")].text == ("F1 I0",)  # both halves named


def test_hover_fields_and_labels() -> None:
    fig = timeline_figure(sim_of("1f1b", 4, 8))
    f_trace = next(t for t in fig.data if t.legendgroup == "F")
    for field in ("stage", "micro-batch", "start", "end", "duration"):
        assert field in f_trace.hovertemplate
    # 1F1B, F=1, B=2: stage r's first forward runs [r, r+1]; the last stage's first
    # backward follows its first forward at once: [4, 6].
    by_name = {
        c[0]: (row, start, dur, c) for kind in ("F", "B") for row, start, dur, c in bars(fig, kind)
    }
    assert by_name["3F0"] == (3, 3, 1, ["3F0", "3", "0", 3, 4, 1])
    assert by_name["3B0"][1:3] == (4, 2)
    assert by_name["0F5"][3][1:3] == ["0", "5"]
    text = dict(zip((c[0] for c in f_trace.customdata), f_trace.text, strict=True))
    assert text["2F7"] == "7"  # labelled with the micro-batch


def test_time_extent_is_the_makespan() -> None:
    p, m, f, b = 4, 8, 0.25, 0.5
    sim = sim_of("1f1b", p, m, forward=str(f), backward=str(b))
    makespan = (m + p - 1) * (f + b)  # 8.25
    fig = timeline_figure(sim)
    assert fig.layout.xaxis.range == (0, makespan)
    assert fig.layout.xaxis2.range == (0, makespan)  # the memory panel shares the axis
    ends = [start + dur for kind in ("F", "B") for _, start, dur, _ in bars(fig, kind)]
    assert max(ends) == makespan and min(s for k in ("F",) for _, s, _, _ in bars(fig, k)) == 0


def test_idle_gaps_are_drawn_and_add_up() -> None:
    p, m = 4, 8
    fig = timeline_figure(sim_of("1f1b", p, m))
    idle = Counter()
    for row, _, dur, _ in bars(fig, "idle"):
        idle[row] += dur
    assert idle == {rank: (p - 1) * 3 for rank in range(p)}  # (p-1)(F+B) per rank
    assert "idle" in next(t for t in fig.data if t.legendgroup == "idle").hovertemplate
    assert timeline_figure(sim_of("1f1b", p, m), idle=False).data[-1].legendgroup != "idle"


def test_link_lanes_and_transfers() -> None:
    p, m = 4, 8
    sim = sim_of("1f1b", p, m, link=Link(latency=1))
    labels, rows = lane_labels(sim)
    expected_links = ["link 0→1", "link 1→0", "link 1→2", "link 2→1", "link 2→3", "link 3→2"]
    assert list(labels) == [f"rank {r}" for r in range(p)] + expected_links
    fig = timeline_figure(sim)
    assert list(fig.layout.yaxis.ticktext) == list(labels)
    transfers = bars(fig, "transfer")
    assert len(transfers) == 2 * (p - 1) * m
    assert {dur for _, _, dur, _ in transfers} == {1}  # latency only: no queueing
    assert Counter(row for row, *_ in transfers) == {row: m for row in rows.values()}
    # free links carry no time: no lanes, no transfer bars
    assert lane_labels(sim_of("1f1b", p, m))[1] == {}


def test_title_line() -> None:
    sim = sim_of("1f1b", 4, 8, activation_bytes=100)
    title = timeline_figure(sim).layout.title.text
    for part in (
        "1f1b: 4 ranks",
        "8 micro-batches",
        "makespan 33",
        "bubble 27.3%",
        "idle slots 36",
        "peak memory 400 B",
    ):
        assert part in title  # bubble 9/33, idle 4 x 9 slots of F=1
    tight = simulate(
        sim.schedule, costs=CostModel.uniform(activation_bytes=100, memory_capacity_bytes=300)
    )
    assert "of 300 B (DOES NOT FIT)" in timeline_figure(tight).layout.title.text


# -- memory ----------------------------------------------------------------------------
def memory_lines(fig: object) -> dict[str, tuple]:
    return {t.name: (t.x, t.y) for t in fig.data if t.type == "scatter"}  # type: ignore[attr-defined]


@pytest.mark.parametrize(("name", "peaks"), [("gpipe", [800] * 4), ("1f1b", [400, 300, 200, 100])])
def test_memory_peaks_follow_the_closed_forms(name: str, peaks: list[int]) -> None:
    fig = timeline_figure(sim_of(name, 4, 8, activation_bytes=100))
    lines = memory_lines(fig)
    assert [max(lines[f"rank {r} memory"][1]) for r in range(4)] == peaks
    for rank in range(4):
        x, y = lines[f"rank {rank} memory"]
        assert x[0] == 0 and x[-1] == 33 and y[-1] == 0
        assert y[0] == (100 if rank == 0 else 0)  # only rank 0 starts a forward at time 0
        assert all(a < b for a, b in pairwise(x[:-1]))  # one corner per time
    assert fig.layout.yaxis2.title.text == "activation memory (B)"  # 800 B: no prefix
    assert {t.line.shape for t in fig.data if t.type == "scatter"} == {"hv"}


def test_memory_steps_hand_worked_split_backward() -> None:
    sim = simulate(SPLIT, costs=CostModel.uniform(activation_bytes=100, weight_grad_bytes=40))
    # rank 1: F0 at 1 (+100), F1 inside the overlap at 2 (+100), I0 ends at 4 (-60),
    # W0 ends at 5 (-40), I1 ends at 6 (-60), W1 ends at 7 (-40); makespan 8.
    assert memory_steps(sim, 1, quantity="bytes") == (
        [0, 1, 2, 4, 5, 6, 7, 8],
        [0, 100, 200, 140, 100, 40, 0, 0],
    )


def test_capacity_line_and_params() -> None:
    costs = CostModel.uniform(activation_bytes=100, param_bytes=50, memory_capacity_bytes=400)
    sim = simulate(generate("1f1b", n_ranks=2, n_microbatches=2), costs=costs)
    fig = memory_figure(sim)
    lines = memory_lines(fig)
    assert lines["capacity 400 B"] == ((0, sim.trace.makespan), (400, 400))
    assert [min(lines[f"rank {r} memory"][1]) for r in range(2)] == [50, 50]
    assert [max(lines[f"rank {r} memory"][1]) for r in range(2)] == [250, 150]
    assert fig.layout.yaxis.title.text == "activations + params (B)"
    no_capacity = memory_figure(sim_of("1f1b", 2, 2, activation_bytes=100))
    assert not any("capacity" in t.name for t in no_capacity.data)


def test_memory_without_bytes_counts_activations_in_flight() -> None:
    fig = timeline_figure(sim_of("1f1b", 4, 8))
    lines = memory_lines(fig)
    assert [max(lines[f"rank {r} memory"][1]) for r in range(4)] == [4, 3, 2, 1]
    assert fig.layout.yaxis2.title.text == "activations in flight"


# -- compare ---------------------------------------------------------------------------
def test_compare_stacks_on_one_time_axis() -> None:
    sims = [
        sim_of("gpipe", 4, 8, activation_bytes=100),
        sim_of("1f1b", 4, 8, activation_bytes=100),
        sim_of("interleaved-1f1b", 4, 8, forward="0.5", backward=1, activation_bytes=50),
    ]
    fig = compare_figure(sims, labels=["G", "O", "I"])
    for index, (yaxis, n_work) in enumerate((("y", 64), ("y2", 64), ("y3", 128))):
        assert len(bars(fig, "F", yaxis)) + len(bars(fig, "B", yaxis)) == n_work
        assert fig.layout.annotations[index].text.startswith(f"<b>{'GOI'[index]}</b>: makespan")
    longest = max(float(s.trace.makespan) for s in sims)
    axes = [fig.layout[f"xaxis{n or ''}"] for n in ("", 2, 3, 4)]
    assert {a.matches for a in axes[:-1]} == {"x4"}  # one shared time axis
    assert all(a.range == (0, longest) for a in axes)
    # memory panel: each schedule's highest rank; GPipe holds m, 1F1B p micro-batches
    lines = memory_lines(fig)
    assert max(lines["G: rank 0 memory"][1]) == 800
    assert max(lines["O: rank 0 memory"][1]) == 400
    assert max(lines["I: rank 0 memory"][1]) == sims[2].metrics.peak_activation_bytes
    # one legend entry per bar kind (and chunk of the interleaved ranks), across blocks
    shown = [t.name for t in fig.data if t.type == "bar" and t.showlegend]
    assert shown == [
        "F forward",
        "B backward",
        "idle",
        "F forward, chunk 0",
        "F forward, chunk 1",
        "B backward, chunk 0",
        "B backward, chunk 1",
    ]


def test_compare_errors() -> None:
    with pytest.raises(PipesimError, match="nothing to compare"):
        compare_figure([])
    with pytest.raises(PipesimError, match="2 labels for 1 simulations"):
        compare_figure([sim_of("1f1b", 2, 2)], labels=["a", "b"])


# -- HTML ------------------------------------------------------------------------------
def test_html_is_deterministic_and_standalone(tmp_path: Path) -> None:
    sim = sim_of("1f1b", 4, 8, link=Link(latency=1), activation_bytes=10)
    a = write_html(timeline_figure(sim), tmp_path / "a.html")
    b = write_html(
        timeline_figure(sim_of("1f1b", 4, 8, link=Link(latency=1), activation_bytes=10)),
        tmp_path / "b.html",
    )
    assert a.read_bytes() == b.read_bytes()
    text = a.read_text()
    assert 'id="pipesim-figure"' in text
    assert 'src="https://cdn.plot.ly/' not in text and a.stat().st_size > 3_000_000  # js inside
    cdn = to_html(timeline_figure(sim), cdn=True)
    assert 'src="https://cdn.plot.ly/' in cdn and len(cdn) < 200_000


def test_unwritable_path_is_a_clear_error(tmp_path: Path) -> None:
    target = tmp_path / "missing" / "x.html"
    with pytest.raises(PipesimError, match=r"cannot write .*missing.*x\.html"):
        write_html(timeline_figure(sim_of("gpipe", 2, 2)), target)


@pytest.mark.slow
def test_large_schedule_stays_small() -> None:
    p, m = 32, 256
    sim = sim_of("1f1b", p, m, activation_bytes=1)
    fig = timeline_figure(sim)
    bar_traces = [t for t in fig.data if t.type == "bar"]
    assert [t.legendgroup for t in bar_traces] == ["F", "B", "idle"]  # not one per bar
    assert sum(len(t.x) for t in bar_traces[:2]) == 2 * p * m
    assert len(fig.data) == 3 + p  # plus one memory line per rank
    # The figure's data is under 1.5 MB (918 kB measured); plotly.js adds ~4.7 MB.
    assert len(to_html(fig, cdn=True)) < 1_500_000


@settings(max_examples=15)
@given(
    name=st.sampled_from(["gpipe", "1f1b", "interleaved-1f1b", "sequential"]),
    p=st.integers(1, 5),
    m=st.integers(1, 9),
)
@pytest.mark.slow
def test_every_rank_row_is_covered_exactly(name: str, p: int, m: int) -> None:
    try:
        sim = sim_of(name, p, m)
    except PipesimError:  # a size the generator refuses (e.g. interleaved needs m % p == 0)
        return
    fig = timeline_figure(sim, memory=False)
    makespan = sim.trace.makespan
    for rank, order in enumerate(sim.schedule.orders):
        work = [(s, d) for k in ("F", "B") for row, s, d, _ in bars(fig, k) if row == rank]
        gaps = [(s, d) for row, s, d, _ in bars(fig, "idle") if row == rank]
        assert len(work) == len(order)
        # work and idle tile [0, makespan]: sorted, each starts where the previous ended
        cursor = 0.0
        for start, dur in sorted(work + gaps):
            assert start == pytest.approx(cursor)
            cursor = start + dur
        assert cursor == pytest.approx(float(makespan))


# -- CLI -------------------------------------------------------------------------------
@pytest.mark.slow
def test_cli_plot_writes_identical_files(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    args = ["plot", "1f1b", "-p", "4", "-m", "8", "--activation-bytes", "100"]
    assert main([*args, "-o", str(tmp_path / "a.html")]) == 0
    out = capsys.readouterr().out
    assert "wrote" in out and "makespan 33" in out
    argv = [*args, "-o", str(tmp_path / "b.html")]
    code = f"from pipesim.cli import main; raise SystemExit(main({argv!r}))"
    subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, timeout=120)
    assert (tmp_path / "a.html").read_bytes() == (tmp_path / "b.html").read_bytes()


def test_cli_compare_with_per_source_settings(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "c.html"
    status = main(
        [
            "plot",
            "1f1b:microbatches=4",
            "1f1b",
            "gpipe:link-latency=0.5",
            "--compare",
            "-p",
            "2",
            "-m",
            "8",
            "-o",
            str(out),
            "--cdn",
        ]
    )
    assert status == 0
    text = capsys.readouterr().out
    # 1F1B p=2: makespan (m+p-1)(F+B) = 15 for m=4 and 27 for m=8
    assert "1f1b p=2 m=4: makespan 15" in text
    assert "1f1b p=2 m=8: makespan 27" in text
    assert "gpipe p=2 m=8 link-latency=0.5" in text
    assert out.stat().st_size < 200_000


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["plot", "nope", "-p", "2", "-m", "2"], "unknown schedule 'nope'"),
        (["plot", "1f1b", "-p", "2", "-m", "2", "--compare"], "nothing to compare"),
        (["plot", "1f1b", "gpipe", "-p", "2", "-m", "2"], "add --compare"),
        (["plot", "1f1b:color=red", "-p", "2", "-m", "2"], "unknown setting 'color'"),
        (["plot", "1f1b:microbatches=0", "-p", "2", "-m", "2"], "setting microbatches"),
        (["plot", "1f1b:p=5000", "-p", "2", "-m", "2"], "from 1 to 4096 (MAX_RANKS"),
        (["plot", "1f1b", "-p", "2", "-m", "2", "-o", "x.csv"], "ending in .html or .htm or .png"),
        (["plot", "1fb1", "-p", "2", "-m", "2"], "(did you mean '1f1b'?)"),
        (["plot", "1f1b:mb=2", "-p", "2"], "unknown setting 'mb'"),
        (["plot", "missing.json"], "does not exist"),
    ],
)
def test_cli_plot_errors(
    argv: list[str],
    message: str,
    capsys: pytest.CaptureFixture[str],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.chdir(tmp_path)
    # a bad NAME:key=value setting is a usage error (2), as the same flag's value would be
    assert main(argv) == (2 if "setting" in message or "MAX_RANKS" in message else 1)
    err = capsys.readouterr().err
    assert err.startswith("pipesim: error: ") and message in err
    assert "Traceback" not in err
    assert not list(tmp_path.glob("*.html"))


def test_cli_plot_unwritable_path(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plot", "gpipe", "-p", "2", "-m", "2", "-o", str(tmp_path / "no" / "t.html")]) == 1
    assert "cannot write" in capsys.readouterr().err


# -- reading at a glance -----------------------------------------------------------------
def test_every_panel_has_ticks_and_a_time_unit() -> None:
    fig = timeline_figure(sim_of("1f1b", 4, 8, activation_bytes=100))
    for axis in (fig.layout.xaxis, fig.layout.xaxis2):
        assert axis.showticklabels is True and axis.title.text == "time (units)"
    sims = [sim_of("gpipe", 2, 4), sim_of("1f1b", 2, 4)]
    compare = compare_figure(sims)
    axes = [compare.layout[f"xaxis{n or ''}"] for n in ("", 2, 3)]
    assert all(a.showticklabels and a.title.text == "time (units)" for a in axes)


def test_times_are_drawn_in_a_readable_unit() -> None:
    # F = 1 ms, B = 2 ms given in ns: drawn in ms, so 1F1B's 3F0 runs [3, 4] ms.
    costs = CostModel.uniform(forward=10**6, backward=2 * 10**6, time_unit="ns")
    sim = simulate(generate("1f1b", n_ranks=4, n_microbatches=8), costs=costs)
    fig = timeline_figure(sim)
    assert fig.layout.xaxis.title.text == "time (ms)"
    assert fig.layout.xaxis.range == (0, 33)  # (m+p-1)(F+B) ms
    by_name = {c[0]: (start, dur) for kind in ("F", "B") for _, start, dur, c in bars(fig, kind)}
    assert by_name["3F0"] == (3, 1)
    assert " ms" in next(t for t in fig.data if t.legendgroup == "F").hovertemplate
    assert "makespan 33 ms" in fig.layout.title.text


def test_chunks_of_a_rank_get_their_own_shade_and_legend() -> None:
    p, m, v = 4, 8, 2
    sim = sim_of("interleaved-1f1b", p, m)
    fig = timeline_figure(sim, memory=False)
    forward = [t for t in fig.data if t.legendgroup == "F"]
    assert [t.name for t in forward] == ["F forward, chunk 0", "F forward, chunk 1"]
    assert forward[0].marker.color == OP_COLORS["F"] and forward[1].marker.color != OP_COLORS["F"]
    for chunk, trace in enumerate(forward):  # stage s sits on rank s mod p, chunk s // p
        stages = {int(c[1]) for c in trace.customdata}
        assert stages == {s for s in range(p * v) if s // p == chunk}
        assert len(trace.x) == p * m  # each chunk runs every micro-batch on every rank


def test_over_capacity_is_drawn_where_it_happens() -> None:
    # 1F1B p=4, F=1, B=2, 100 bytes per micro-batch, capacity 250. Hand-worked: rank 0 runs
    # F0..F3 at 0..3, so holds 300 B from 2 and 400 B from 3; B_k ends at 12 + 3k on rank 0
    # and 10 + 3k on rank 1 (the last rank's B_k runs [4 + 3k, 6 + 3k], each rank up adds
    # B = 2), each followed at once by the next forward until F7: rank 0 drops to 300 B
    # when B4 ends at 24 and to 200 B at 27; rank 1 holds 300 B from F2 at 3 until B5
    # ends at 25.
    sim = sim_of("1f1b", 4, 8, activation_bytes=100, memory_capacity_bytes=250)
    fig = timeline_figure(sim)
    (over,) = [t for t in fig.data if t.name == "over capacity"]
    segments = [(over.x[i], over.x[i + 1], over.y[i]) for i in range(0, len(over.x), 3)]
    assert segments == [(2, 3, 300), (3, 24, 400), (24, 27, 300), (3, 25, 300)]
    assert over.line.color == "#D62728"
    assert "over capacity" not in [t.name for t in timeline_figure(sim_of("1f1b", 4, 8)).data]


def test_page_title(tmp_path: Path) -> None:
    page = write_html(timeline_figure(sim_of("1f1b", 4, 8)), tmp_path / "t.html").read_text()
    assert "<title>1f1b: 4 ranks, 4 stages, 8 micro-batches · pipesim</title>" in page


def test_views_take_a_trace() -> None:
    sim = sim_of("1f1b", 4, 8, link=Link(latency=1), activation_bytes=10)
    from_trace = timeline_figure(sim.trace, schedule=sim.schedule, costs=sim.costs)
    assert from_trace.to_json() == timeline_figure(sim).to_json()
    from pipesim.export import chrome_trace

    assert chrome_trace(sim.trace, schedule=sim.schedule, costs=sim.costs) == chrome_trace(sim)
    with pytest.raises(PipesimError, match="pass schedule="):
        timeline_figure(sim.trace)
    # a trace without memory records (a measured one) has no memory panel
    from pipesim.trace import Trace

    bare = Trace(n_ranks=4, actions=sim.trace.actions, transfers=sim.trace.transfers)
    fig = timeline_figure(bare, schedule=sim.schedule)
    assert not [t for t in fig.data if t.type == "scatter"] and "xaxis2" not in fig.layout


@pytest.mark.slow
def test_large_schedule_is_binned_and_small() -> None:
    from pipesim.plot.binned import LARGE_BARS, bar_count, bin_colors

    p, m = 32, 1024  # 65,536 actions: above the bar budget
    sim = sim_of("1f1b", p, m, activation_bytes=1)
    assert bar_count(sim) > LARGE_BARS
    fig = timeline_figure(sim)
    assert fig.data[0].type == "image" and not any(t.type == "bar" for t in fig.data)
    assert "time bins" in fig.layout.title.text  # the page says it is aggregated
    memory = [t for t in fig.data if t.type == "scatter" and t.name.endswith("memory")]
    assert len(memory) == 8 and "rank 0 memory" in [t.name for t in memory]
    assert max(memory[0].y) == p  # binning keeps the peak: rank 0 holds p micro-batches
    assert len(to_html(fig, cdn=True)) < 600_000
    # colours: rank 0 starts with p forwards back to back (blue), the last rank ends with
    # its backward alone (red); a bin half F half idle would be the mean of the two.
    colors = bin_colors(sim, n_bins=100)
    rgb = {k: tuple(int(OP_COLORS[k][i : i + 2], 16) for i in (1, 3, 5)) for k in OP_COLORS}
    assert colors[0][0] == rgb["F"]  # rank 0's first bin (31.65 long) is all forwards
    assert colors[p - 1][-1] == rgb["idle"]  # the last rank is done at 3103 of 3165
    # its first bin [0, 31.65]: idle until its F0 at p - 1 = 31, then forward
    width = 3165 / 100
    mix = tuple(
        round(((p - 1) * i + (width - (p - 1)) * f) / width)
        for i, f in zip(rgb["idle"], rgb["F"], strict=True)
    )
    assert colors[p - 1][0] == mix


def test_bin_colors_mix_by_time_covered() -> None:
    from pipesim.plot.binned import bin_colors

    # GPipe forward-only p=2 m=1: rank 0 runs F [0,1], rank 1 F [1,2]; makespan 2, 1 bin
    # per step: half forward, half idle -> the mean of the two colours, rounded.
    sim = simulate(generate("gpipe", n_ranks=2, n_microbatches=1, forward_only=True))
    (row0,), (row1,) = bin_colors(sim, n_bins=1)
    f = tuple(int(OP_COLORS["F"][i : i + 2], 16) for i in (1, 3, 5))
    idle = tuple(int(OP_COLORS["idle"][i : i + 2], 16) for i in (1, 3, 5))
    assert row0 == row1 == tuple(round((a + b) / 2) for a, b in zip(f, idle, strict=True))


def test_cli_fair_compare_closed_form(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    # Same model on p=4 ranks, F=1 and B=2 per rank's layer block: interleaved v=2 gets
    # F=1/2, B=1 per chunk, so its makespan is m(F+B) + (p-1)(F+B)/v = 24 + 4.5 (Narayanan
    # et al. 2021: the bubble shrinks by v), and 1F1B keeps (m+p-1)(F+B) = 33.
    argv = ["plot", "1f1b", "interleaved-1f1b:v=2", "--compare", "-p", "4", "-m", "8"]
    assert main([*argv, "--activation-bytes", "1000", "--cdn", "-o", str(tmp_path / "c.html")]) == 0
    out = capsys.readouterr().out
    assert "1f1b p=4 m=8: makespan 33 units" in out
    assert "interleaved-1f1b p=4 m=8 v=2: makespan 28.5 units" in out
    assert "same model" in out
    as_given = [*argv, "--chunk-costs", "as-given", "--cdn", "-o", str(tmp_path / "d.html")]
    assert main(as_given) == 0
    assert "v=2: makespan 57 units" in capsys.readouterr().out  # twice the model


def test_cli_short_keys_and_did_you_mean(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    argv = ["plot", "1f1b:m=4", "1f1b:p=2:m=8", "--compare", "-p", "2", "-m", "2", "--cdn"]
    assert main([*argv, "-o", str(tmp_path / "k.html")]) == 0
    out = capsys.readouterr().out
    assert "1f1b p=2 m=4: makespan 15" in out and "1f1b p=2 m=8: makespan 27" in out
    assert main(["plot", "1f1b:microbatch=4", "-p", "2"]) == 2  # usage, as a bad flag
    assert "(did you mean 'microbatches'?)" in capsys.readouterr().err


def test_blocking_sends_as_a_setting_and_by_its_old_name(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    # The hand-worked case of tests/test_engine.py::test_blocking_sends: 7 posted, 9 blocking.
    sizes = ["-p", "2", "-m", "2", "--forward-only", "--message-bytes", "10"]
    link = ["--link-latency", "1", "--link-bandwidth", "5", "--cdn"]
    argv = ["plot", "gpipe", "gpipe:blocking-sends", "gpipe:no-overlap-comm", "--compare"]
    assert main([*argv, *sizes, *link, "-o", str(tmp_path / "b.html")]) == 0
    out = capsys.readouterr().out
    assert out.count("makespan 9") == 2 and out.count("makespan 7") == 1, out


def test_sends_and_receives_are_marks_on_their_ranks() -> None:
    from pipesim.comms import lower_comms

    # The hand-worked step of tests/test_comms_engine.py in ms: 0SEND_F0 leaves at 2,
    # 1RECV_F0 takes its message at 5 after waiting from 0; 1RECV_F0 holds rank 1 [5, 7].
    costs = CostModel.uniform(
        link=Link(latency=3, send_overhead=1, receive_overhead=2), output_bytes=2048
    )
    costs = CostModel(stages=costs.stages, link=costs.link, time_unit="ms")
    sim = simulate(lower_comms(generate("1f1b", n_ranks=2, n_microbatches=2)), costs=costs)
    fig = timeline_figure(sim, memory=False)
    marks = {t.legendgroup: t for t in fig.data if t.type == "scatter"}
    assert set(marks) == {"SEND", "RECV"}
    send, recv = marks["SEND"], marks["RECV"]
    assert len(send.x) == len(recv.x) == 4  # 2 micro-batches x (activation + gradient)
    by_name = {cd[0]: (x, y, cd) for x, y, cd in zip(send.x, send.y, send.customdata, strict=True)}
    by_name |= {cd[0]: (x, y, cd) for x, y, cd in zip(recv.x, recv.y, recv.customdata, strict=True)}
    x, y, cd = by_name["0SEND_F0"]
    assert (x, round(y)) == (2, 0) and cd[1] == 1 and cd[2] == "2,048 bytes (2 KiB)"
    x, y, cd = by_name["1RECV_F0"]
    assert (x, round(y), cd[1], cd[3], cd[5]) == (5, 1, 0, 0, 2)  # waited 0..5, overhead 2
    assert "to rank" in send.hovertemplate and " ms" in send.hovertemplate
    assert "from rank" in recv.hovertemplate and "waited" in recv.hovertemplate
    # A receive's overhead holds its rank: drawn idle gaps leave it out, as metrics do.
    idle = sum(d for row, _, d, _ in bars(fig, "idle") if row == 1)
    assert idle == sim.metrics.ranks[1].idle
    # A compute schedule draws no marks.
    compute = timeline_figure(simulate(sim.schedule, costs=costs), memory=False)
    assert not [t for t in compute.data if t.type == "scatter"]


def test_binned_timeline_draws_sends_and_receives_per_bin(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Forward-only GPipe, unit forwards, free links: rank r runs F_k in [r + k, r + k + 1]
    (closed form), so it sends F_k at r + k + 1 and rank r + 1 takes it then; makespan
    m + p - 1. Binned, each mark is one bin's count: the oracle bins those instants."""
    import pipesim.plot.timeline as timeline
    from pipesim.comms import Comm, lower_comms
    from pipesim.plot.comms import BINNED_MARKS

    p, m = 4, 8
    schedule = lower_comms(generate("gpipe", n_ranks=p, n_microbatches=m, forward_only=True))
    sim = simulate(schedule)
    makespan = m + p - 1
    assert sim.trace.makespan == makespan
    monkeypatch.setattr(timeline, "LARGE_BARS", 0)  # draw this small step binned
    fig = timeline_figure(sim, memory=False)
    assert fig.data[0].type == "image" and not any(t.type == "bar" for t in fig.data)
    marks = {t.legendgroup: t for t in fig.data if t.type == "scatter" and t.meta}
    assert set(marks) == {"SEND", "RECV"}
    n_bins = BINNED_MARKS // p
    expected: dict[str, Counter[tuple[int, int]]] = {"SEND": Counter(), "RECV": Counter()}
    for k in range(m):
        for r in range(p - 1):
            at = r + k + 1
            expected["SEND"][(r, min(at * n_bins // makespan, n_bins - 1))] += 1
            expected["RECV"][(r + 1, min(at * n_bins // makespan, n_bins - 1))] += 1
    width = makespan / n_bins
    for kind, trace in marks.items():
        assert trace.meta["n_bins"] == n_bins
        got = Counter()
        for x, y, (count, rank, start, end) in zip(trace.x, trace.y, trace.customdata, strict=True):
            i = round(x / width - 0.5)
            assert round(y) == rank and (start, end) == pytest.approx((i * width, (i + 1) * width))
            got[(rank, i)] += count
        assert got == expected[kind]
    # every SEND / RECV action of the schedule is counted once (the schedule's own count)
    for kind, trace in marks.items():
        per_rank = Counter()
        for count, rank, *_ in trace.customdata:
            per_rank[rank] += count
        in_schedule = Counter(
            r
            for r, program in enumerate(schedule.programs)
            for step in program
            if isinstance(step, Comm) and step.op.is_send is (kind == "SEND")
        )
        assert per_rank == in_schedule and sum(per_rank.values()) == m * (p - 1)
    # a compute schedule draws no marks binned either
    plain = timeline_figure(simulate(generate("gpipe", n_ranks=p, n_microbatches=m)), memory=False)
    assert not [t for t in plain.data if t.type == "scatter" and t.meta]


@pytest.mark.slow
def test_binned_marks_stay_few_on_a_large_comms_schedule(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import pipesim.plot.timeline as timeline
    from pipesim.comms import lower_comms
    from pipesim.plot.comms import BINNED_MARKS

    p, m = 16, 256  # 15,360 sends and receives, more than one per bin of 16 x 125
    sim = simulate(lower_comms(generate("1f1b", n_ranks=p, n_microbatches=m)))
    monkeypatch.setattr(timeline, "LARGE_BARS", 0)  # (the CLI bins above 25,000 bars)
    fig = timeline_figure(sim, memory=False)
    assert fig.data[0].type == "image"
    marks = [t for t in fig.data if t.type == "scatter" and t.meta]
    assert [t.legendgroup for t in marks] == ["SEND", "RECV"]
    for trace in marks:
        assert BINNED_MARKS // 2 < len(trace.x) <= BINNED_MARKS  # many bins hold several
        assert max(c[0] for c in trace.customdata) > 1
        assert sum(c[0] for c in trace.customdata) == 2 * m * (p - 1)  # activations + grads
    assert len(to_html(fig, cdn=True)) < 300_000  # the page drawn bar by bar: 1.3 MB
