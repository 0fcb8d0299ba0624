"""Plan results for people and machines: a table, CSV, and an interactive Plotly chart.

>>> from pipesim.plan.result import PlanPoint
>>> row = PlanPoint(schedule="1f1b", pipeline=2, virtual=1, data_parallel=1, microbatch_size=1,
...                 n_microbatches=4, fits=False, reason="needs more memory")
>>> format_csv([row]).splitlines()[0].split(",")[:4]
['rank', 'schedule', 'pipeline', 'virtual']
"""

from __future__ import annotations

import csv
import html
import io
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from pipesim.files import write_text
from pipesim.plan.result import PlanPoint, PlanResult, explain
from pipesim.units import NS_PER_S, binary_scale, format_bytes

__all__ = [
    "COLUMN_KEY",
    "format_csv",
    "format_table",
    "plan_figure",
    "report_html",
    "write_html",
]

_HEADERS = (
    "rank",
    "schedule",
    "t",
    "c",
    "p",
    "v",
    "d",
    "b",
    "m",
    "sp",
    "recompute",
    "zero1",
    "step s",
    "dp s",
    "tokens/s",
    "MFU",
    "bubble",
    "memory",
    "fits",
    "pareto",
)

#: What each column of the table (and of the HTML report) means, with its unit.
COLUMN_KEY = (
    (
        "rank",
        "1 = recommended; only configurations that fit are ranked (?: in a pruned plan, "
        "slower than a configuration pruned)",
    ),
    ("schedule", "pipeline schedule (`pipesim schedules`)"),
    ("t", "tensor-parallel size (--tensor-parallel), inside a node"),
    ("c", "context-parallel size (--context-parallel): each sequence split c ways"),
    (
        "e",
        "expert-parallel size (--expert-parallel): routed experts split e ways (shown "
        "when a configuration has e > 1)",
    ),
    (
        "et",
        "expert tensor-parallel size (--expert-tensor-parallel): each routed expert split "
        "et ways (shown when a configuration has et > 1)",
    ),
    ("p", "pipeline degree: ranks per pipeline (--stages)"),
    ("v", "stages per rank (--virtual)"),
    ("d", "data-parallel replicas: devices / (t c p)"),
    ("b", "micro-batch size, sequences"),
    ("m", "micro-batches per step: global batch / (d b)"),
    ("sp", "sequence parallelism (--sequence-parallel)"),
    ("recompute", "activation recomputation: none, selective or full (--recompute)"),
    ("zero1", "optimizer state sharded over d (--distributed-optimizer)"),
    ("step s", "seconds per iteration: pipeline + exposed dp traffic + optimizer step"),
    ("dp s", "seconds of data-parallel traffic and optimizer step after the pipeline"),
    ("tokens/s", "tokens per second, all devices"),
    ("MFU", "model FLOPs (no recomputation) / (step time x devices x peak FLOP/s)"),
    ("bubble", "idle share of the pipeline's ranks x pipeline time"),
    (
        "memory",
        "peak per device in the binary unit the header names (GiB = 2^30 bytes): "
        "weights + grads + optimizer + activations",
    ),
    ("fits", "peak within the usable memory (capacity less the headroom)"),
    ("pareto", "* on the step-time / memory Pareto front"),
)


def _memory_unit(points: Sequence[PlanPoint]) -> tuple[int, str]:
    """``(divisor, unit)``: one binary unit for the memory of every row (they line up)."""
    return binary_scale(max((p.peak_memory_bytes or 0 for p in points), default=0))


def _headers(unit: str) -> tuple[str, ...]:
    return tuple(f"memory {unit}" if h == "memory" else h for h in _HEADERS)


def _row(point: PlanPoint, divisor: int) -> tuple[str, ...]:
    def fmt(value: float | None, spec: str) -> str:
        return "-" if value is None else format(value, spec)

    bubble = None if point.bubble is None else float(point.bubble)
    memory = None if point.peak_memory_bytes is None else point.peak_memory_bytes / divisor
    return (
        ("?" if point.fits else "-") if point.rank is None else str(point.rank),
        point.schedule,
        str(point.tensor),
        str(point.context_parallel),
        str(point.pipeline),
        str(point.virtual),
        str(point.data_parallel),
        str(point.microbatch_size),
        str(point.n_microbatches),
        "yes" if point.sequence_parallel else "-",
        point.recompute,
        "yes" if point.distributed_optimizer else "-",
        fmt(point.step_time_s, ".4g"),
        fmt(None if point.allreduce_time_ns is None else point.allreduce_time_ns / NS_PER_S, ".3g"),
        fmt(point.tokens_per_s, ",.0f"),
        fmt(point.mfu, ".1%"),
        fmt(bubble, ".1%"),
        fmt(memory, ".1f"),
        "-" if point.fits is None else ("yes" if point.fits else "no"),
        "*" if point.pareto else "",
    )


def _table(points: Sequence[PlanPoint], scale: tuple[int, str]) -> list[str]:
    divisor, unit = scale
    headers = _headers(unit)
    rows = [_row(p, divisor) for p in points]
    for name, field in (("et", "expert_tensor"), ("e", "expert_parallel")):
        if any(getattr(p, field) > 1 for p in points):  # a column only where it says something
            at = headers.index("c") + 1
            headers = (*headers[:at], name, *headers[at:])
            rows = [
                (*row[:at], str(getattr(p, field)), *row[at:])
                for row, p in zip(rows, points, strict=True)
            ]
    widths = [max(len(x) for x in col) for col in zip(headers, *rows, strict=True)]
    lines = ["  ".join(h.rjust(w) for h, w in zip(headers, widths, strict=True))]
    lines += ["  ".join(x.rjust(w) for x, w in zip(row, widths, strict=True)) for row in rows]
    return lines


def format_table(result: PlanResult, /, *, top: int = 10) -> str:
    """The top configurations that fit (or, when none fits, the least memory-hungry ones),
    a count of the rest, and the one-line reason for the winner."""
    fitting = result.fitting
    simulated = [p for p in result.points if p.feasible]
    infeasible = [p for p in result.points if not p.feasible]
    head = (
        f"{result.model} on {result.devices} x {result.accelerator.name} "
        f"({format_bytes(result.memory_capacity_bytes)} each), global batch "
        f"{result.global_batch}: {len(result.points)} configurations, {len(simulated)} "
        f"simulated, {len(fitting)} fit"
    )
    if result.optimizer_sync != "global":
        head += (
            f"; step s is the steady-state period under {result.optimizer_sync} optimizer "
            f"sync for the {result.period_candidates} fastest re-simulated over iterations, "
            "the global sync's (an upper bound) for the rest"
        )
    shown = list(fitting[:top]) if fitting else simulated[:top]
    pareto_more = [p for p in result.pareto if p not in shown][:top]
    # one table in two parts: the same unit and column widths
    header, *rows = _table([*shown, *pareto_more], _memory_unit([*shown, *pareto_more]))
    lines = [head, ""]
    if shown:
        lines += [header, *rows[: len(shown)]]
        if not fitting:
            lines.append("(none fits: the least memory first)")
    if pareto_more:
        lines += ["", "more of the Pareto front (step time vs memory):"]
        lines += rows[len(shown) :]
    lines += _not_simulated(infeasible)
    if result.n_duplicates:
        lines += [
            "",
            f"{result.n_duplicates} configurations identical to one listed (same per-rank "
            "orders and costs, e.g. interleaved-1f1b with v=1 is 1f1b) are not repeated",
        ]
    lines += ["", "winner: " + explain(result)]
    return "\n".join(lines + _winner_lines(result))


def _not_simulated(infeasible: Sequence[PlanPoint]) -> list[str]:
    """Up to 8 kinds of reason a configuration was not simulated, most frequent first."""
    groups: dict[str, list[str]] = {}
    for point in infeasible:
        text = (point.reason or "?").split(";")[0]
        # one line per kind of reason: the same rule with other numbers is the same kind
        groups.setdefault(re.sub(r"(?<![\w'-])\d+", "#", text), []).append(text)
    if not groups:
        return []
    lines = ["", f"{len(infeasible)} configurations not simulated, for example:"]
    ranked = sorted(groups.values(), key=lambda texts: -len(texts))
    for texts in ranked[:8]:
        lines.append(f"  {len(texts):5d} x {texts[0]}")
    if len(ranked) > 8:
        lines.append(f"  ... and {len(ranked) - 8} more kinds (see --json or --csv)")
    return lines


def _winner_lines(result: PlanResult) -> list[str]:
    """The recommended point's iteration breakdown and its framework arguments."""
    best = result.recommended
    if best is None:
        return []
    from pipesim.plan.frameworks import megatron_args, torchtitan_args

    parts = best.parts_s() or {}
    inside = [name for name in ("compute", "tp_comm", "bubble", "pp_comm") if name in parts]
    return [
        "",
        "iteration (s): "
        + ", ".join(
            f"{name} {parts[name]:.3g}"
            for name in ("pipeline", *inside, "dp_comm", "optimizer", *_overlap(parts), "step")
        )
        + f" ({', '.join(inside)} are inside pipeline; pp_comm, the time the sends between "
        "stages cost, mostly within bubble)",
        "Megatron-LM: " + megatron_args(result, best),
        "torchtitan:  " + torchtitan_args(result, best),
    ]


def _overlap(parts: dict[str, float]) -> tuple[str, ...]:
    """``next_step_overlap`` where the next step starts before this one's end."""
    return ("next_step_overlap",) if parts.get("next_step_overlap", 0) > 0 else ()


_CSV_FIELDS = (
    "rank",
    "schedule",
    "pipeline",
    "virtual",
    "tensor_parallel",
    "data_parallel",
    "context_parallel",
    "expert_parallel",
    "expert_tensor_parallel",
    "sequence_parallel",
    "recompute",
    "distributed_optimizer",
    "microbatch_size",
    "n_microbatches",
    "n_stages",
    "layers_per_stage",
    "step_time_s",
    "pipeline_time_ns",
    "tp_comm_time_ns",
    "dp_comm_time_ns",
    "dp_comm_total_ns",
    "optimizer_time_ns",
    "pp_comm_time_ns",
    "bubble_time_ns",
    "allreduce_time_ns",
    "tokens_per_s",
    "mfu",
    "bubble",
    "peak_memory_bytes",
    "static_memory_bytes",
    "peak_activation_bytes",
    "fits",
    "pareto",
    "reason",
)


def format_csv(points: Sequence[PlanPoint], /) -> str:
    """One row per configuration, in ranked order."""
    out = io.StringIO()
    writer = csv.DictWriter(out, fieldnames=_CSV_FIELDS, lineterminator="\n")
    writer.writeheader()
    for point in points:
        data = point.to_dict()
        data["layers_per_stage"] = " ".join(str(n) for n in point.layers_per_stage)
        writer.writerow({k: ("" if data[k] is None else data[k]) for k in _CSV_FIELDS})
    return out.getvalue()


def plan_figure(result: PlanResult, /) -> Any:
    """Plotly figure: step time vs peak memory per device of the configurations that fit
    (and those just over the usable memory), one colour per schedule, the Pareto front
    as a line, the usable memory as a vertical line, the configuration on hover. The
    time axis is logarithmic and stops at 4x the fastest, so the front stays readable
    next to absurd configurations. Needs plotly (imported here, not at module load)."""
    import plotly.graph_objects as go

    fig = go.Figure()
    simulated = [p for p in result.points if p.feasible]
    divisor, unit = binary_scale(result.usable_memory_bytes)
    usable = result.usable_memory_bytes / divisor
    ceiling = 4 * _fastest_time(simulated)
    shown = [
        p
        for p in simulated
        if (p.step_time_s or 0) <= ceiling and (p.peak_memory_bytes or 0) / divisor <= 2 * usable
    ]
    for trace in _schedule_traces(shown, divisor):
        fig.add_trace(trace)
    front = result.pareto
    if front:
        fig.add_trace(_front_trace(front, divisor))
    fig.add_vline(
        x=usable,
        line={"color": "red", "dash": "dash"},
        annotation_text=f"usable {format_bytes(result.usable_memory_bytes)}",
        annotation_position="top left",
    )
    _note_hidden(fig, result, hidden=len(simulated) - len(shown), ceiling=ceiling)
    fig.update_layout(
        title=(
            f"{result.model}, {result.devices} x {result.accelerator.name}: step time vs "
            "memory (x: does not fit; ringed: Pareto front)"
        ),
        xaxis_title=f"peak memory per device ({unit})",
        yaxis_title="step time (s, log scale)",
        yaxis_type="log",
        legend_title="schedule",
        template="plotly_white",
    )
    return fig


def _note_hidden(fig: Any, result: PlanResult, *, hidden: int, ceiling: float) -> None:
    """Say under the plot how many configurations lie beyond its axes."""
    # added, not set through update_layout(annotations=...): that would overwrite the
    # vertical line's own label ("usable ...") and inherit its anchors
    fig.add_annotation(
        text=f"{hidden} configurations slower than {ceiling:.3g} s or over "
        f"{format_bytes(2 * result.usable_memory_bytes)} are not drawn",
        xref="paper",
        yref="paper",
        x=0,
        y=-0.16,
        xanchor="left",
        yanchor="top",
        showarrow=False,
        font={"size": 11, "color": "#666"},
    )


def _fastest_time(simulated: Sequence[PlanPoint]) -> float:
    """The step time of the fastest configuration that fits (of any, when none fits)."""
    fastest = min((p.step_time_s or 0 for p in simulated if p.fits), default=None)
    if fastest is None:
        fastest = min((p.step_time_s or 0 for p in simulated), default=1.0)
    return fastest


def _schedule_traces(shown: Sequence[PlanPoint], divisor: int) -> list[Any]:
    """One marker trace per schedule, by name: a cross where a configuration does not
    fit, a ring where it is on the Pareto front."""
    import plotly.graph_objects as go

    traces = []
    for name in sorted({p.schedule for p in shown}):
        mine = [p for p in shown if p.schedule == name]
        traces.append(
            go.Scatter(
                x=[(p.peak_memory_bytes or 0) / divisor for p in mine],
                y=[p.step_time_s for p in mine],
                mode="markers",
                name=name,
                marker={
                    "symbol": ["circle" if p.fits else "x" for p in mine],
                    "size": [11 if p.pareto else 7 for p in mine],
                    "line": {"width": [2 if p.pareto else 0 for p in mine], "color": "black"},
                },
                text=[_hover(p) for p in mine],
                hovertemplate="%{text}<extra></extra>",
            )
        )
    return traces


def _front_trace(front: Sequence[PlanPoint], divisor: int) -> Any:
    """The Pareto front as a dotted staircase, by memory."""
    import plotly.graph_objects as go

    ordered = sorted(front, key=lambda p: p.peak_memory_bytes or 0)
    return go.Scatter(
        x=[(p.peak_memory_bytes or 0) / divisor for p in ordered],
        y=[p.step_time_s for p in ordered],
        mode="lines",
        name="Pareto front",
        line={"color": "black", "dash": "dot", "shape": "hv"},
        hoverinfo="skip",
    )


def _hover(point: PlanPoint) -> str:
    bubble = "-" if point.bubble is None else f"{float(point.bubble):.1%}"
    mfu = "-" if point.mfu is None else f"{point.mfu:.1%}"
    lines = [
        f"<b>{point.schedule}</b> rank {point.rank if point.rank is not None else '-'}",
        point.label(),
        f"step {point.step_time_s:.4g} s, MFU {mfu}, bubble {bubble}",
        f"memory {format_bytes(point.peak_memory_bytes or 0)} "
        f"(static {format_bytes(point.static_memory_bytes or 0)} + activations "
        f"{format_bytes(point.peak_activation_bytes or 0)})",
        "layers per stage: " + " ".join(str(n) for n in point.layers_per_stage),
    ]
    if point.reason:
        lines.append(point.reason)
    return "<br>".join(lines)


def _html_table(headers: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    head = "".join(f"<th>{html.escape(h)}</th>" for h in headers)
    body = "".join(
        "<tr>" + "".join(f"<td>{html.escape(x)}</td>" for x in row) + "</tr>" for row in rows
    )
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def _refusals(result: PlanResult) -> list[tuple[str, str]]:
    groups: dict[str, list[str]] = {}
    for point in result.points:
        if point.fits:
            continue
        text = (point.reason or "?").split(";")[0]
        groups.setdefault(re.sub(r"(?<![\w'-])\d+(\.\d+)?", "#", text), []).append(text)
    ranked = sorted(groups.values(), key=lambda texts: -len(texts))
    return [(str(len(texts)), texts[0]) for texts in ranked]


_STYLE = """
body { font-family: system-ui, sans-serif; margin: 2em auto; max-width: 1200px; color: #222; }
table { border-collapse: collapse; font-size: 0.85em; margin: 0.5em 0 1.5em; }
th, td { border-bottom: 1px solid #ddd; padding: 0.25em 0.6em; text-align: right; }
th { background: #f4f4f4; } td:nth-child(2), td:last-child { text-align: left; }
code { background: #f4f4f4; padding: 0.1em 0.3em; display: inline-block; }
.winner { font-size: 1.1em; background: #eef6ee; padding: 0.8em; border-radius: 6px; }
.warn { background: #fbeeee; }
"""


def report_html(result: PlanResult, /, *, cdn: bool = False, top: int = 15) -> str:
    """The ``plan.html`` report: the winner in a sentence with its Megatron-LM and
    torchtitan settings and the parts of its iteration, the top table, the Pareto
    front, why configurations were refused, and a key to every column (units included).
    """
    import plotly.io as pio

    best = result.recommended
    figure = pio.to_html(
        plan_figure(result),
        include_plotlyjs="cdn" if cdn else True,
        full_html=False,
        div_id="pipesim-plan",
        config={"displaylogo": False, "responsive": True},
    )
    title = (
        f"pipesim plan: {result.model} on {result.devices} x {result.accelerator.name}, "
        f"global batch {result.global_batch}"
    )
    parts = [f"<h1>{html.escape(title)}</h1>", *_summary_html(result, has_winner=best is not None)]
    if best is not None:
        parts += _winner_html(result, best)
    shown = list(result.fitting[:top]) or [p for p in result.points if p.feasible][:top]
    parts.append(f"<h2>Top {len(shown)} configurations</h2>")
    divisor, unit = _memory_unit(shown)
    parts.append(_html_table(_headers(unit), [_row(p, divisor) for p in shown]))
    parts.append("<h2>Step time against memory</h2>" + figure)
    refusals = _refusals(result)
    if refusals:
        parts.append("<h2>Why configurations were refused or do not fit</h2>")
        parts.append(_html_table(["count", "reason (one example of each kind)"], refusals[:20]))
    if result.n_duplicates:
        parts.append(
            f"<p>{result.n_duplicates} configurations identical to one listed (same per-rank "
            "orders and costs) are not repeated.</p>"
        )
    parts.append("<h2>Key</h2>")
    parts.append(_html_table(["column", "meaning (unit)"], COLUMN_KEY))
    body = "\n".join(parts)
    return (
        f"<!DOCTYPE html><html><head><meta charset='utf-8'><title>{html.escape(title)}"
        f"</title><style>{_STYLE}</style></head><body>{body}</body></html>\n"
    )


def _summary_html(result: PlanResult, *, has_winner: bool) -> list[str]:
    """How many configurations were searched, simulated and fit, then the verdict."""
    counts = (
        f"<p>{len(result.points)} configurations, {sum(p.feasible for p in result.points)} "
        f"simulated, {len(result.fitting)} fit in {format_bytes(result.usable_memory_bytes)} "
        f"per device ({format_bytes(result.memory_capacity_bytes)} less "
        f"{result.memory_headroom:.0%} headroom); engine {html.escape(result.engine)}.</p>"
    )
    css = "winner" if has_winner else "winner warn"
    return [counts, f'<p class="{css}">{html.escape(explain(result))}</p>']


def _winner_html(result: PlanResult, best: PlanPoint) -> list[str]:
    """The parts of the winner's iteration, and its Megatron-LM and torchtitan settings."""
    from pipesim.plan.frameworks import megatron_args, torchtitan_args

    split = best.parts_s() or {}
    iteration = _html_table(
        ["part", "seconds", "what"],
        [
            ("pipeline", f"{split['pipeline']:.4g}", "the schedule's makespan"),
            ("  tp comm", f"{split['tp_comm']:.4g}", "tensor-parallel traffic inside it"),
            ("  bubble", f"{split['bubble']:.4g}", "idle time inside it"),
            ("dp comm", f"{split['dp_comm']:.4g}", "data-parallel traffic not hidden"),
            ("optimizer", f"{split['optimizer']:.4g}", "Adam step"),
            ("step", f"{split['step']:.4g}", "pipeline + dp comm + optimizer"),
        ],
    )
    settings = (
        "<p>Megatron-LM: <code>"
        + html.escape(megatron_args(result, best))
        + "</code></p><p>torchtitan: <code>"
        + html.escape(torchtitan_args(result, best))
        + "</code></p>"
    )
    return ["<h2>The winner's iteration</h2>", iteration, settings]


def write_html(result: PlanResult, path: str | Path, /, *, cdn: bool = False) -> Path:
    """Write :func:`report_html` to ``path``; an unwritable path is a PipesimError."""
    return write_text(Path(path), report_html(result, cdn=cdn))
