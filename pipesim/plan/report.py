"""Plan results for people and machines: a table, CSV, and an interactive Plotly chart.

>>> from pipesim.plan.result import PlanPoint
>>> row = PlanPoint(schedule="1f1b", pipeline=2, virtual=1, data_parallel=1, microbatch_size=1,
...                 n_microbatches=4, fits=False, reason="needs more memory")
>>> format_csv([row]).splitlines()[0].split(",")[:4]
['rank', 'schedule', 'pipeline', 'virtual']
"""

from __future__ import annotations

import csv
import io
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from pipesim.files import write_text
from pipesim.plan.result import PlanPoint, PlanResult, explain

__all__ = ["COLUMN_KEY", "format_csv", "format_table", "plan_figure", "write_html"]

_HEADERS = (
    "rank",
    "schedule",
    "t",
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
    "memory GB",
    "fits",
    "pareto",
)

#: What each column of the table (and of the HTML report) means, with its unit.
COLUMN_KEY = (
    ("rank", "1 = recommended; only configurations that fit are ranked"),
    ("schedule", "pipeline schedule (`pipesim schedules`)"),
    ("t", "tensor-parallel size (--tensor-parallel), inside a node"),
    ("p", "pipeline degree: ranks per pipeline (--stages)"),
    ("v", "stages per rank (--virtual)"),
    ("d", "data-parallel replicas: devices / (t p)"),
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
    ("memory GB", "peak per device, 10^9 bytes: weights + grads + optimizer + activations"),
    ("fits", "peak within the usable memory (capacity less the headroom)"),
    ("pareto", "* on the step-time / memory Pareto front"),
)


def _row(point: PlanPoint) -> tuple[str, ...]:
    def fmt(value: float | None, spec: str) -> str:
        return "-" if value is None else format(value, spec)

    bubble = None if point.bubble is None else float(point.bubble)
    memory = None if point.peak_memory_bytes is None else point.peak_memory_bytes / 1e9
    return (
        "-" if point.rank is None else str(point.rank),
        point.schedule,
        str(point.tensor),
        str(point.pipeline),
        str(point.virtual),
        str(point.data_parallel),
        str(point.microbatch_size),
        str(point.n_microbatches),
        "yes" if point.sequence_parallel else "-",
        point.recompute,
        "yes" if point.distributed_optimizer else "-",
        fmt(point.step_time_s, ".4g"),
        fmt(None if point.allreduce_time_ns is None else point.allreduce_time_ns / 1e9, ".3g"),
        fmt(point.tokens_per_s, ",.0f"),
        fmt(point.mfu, ".1%"),
        fmt(bubble, ".1%"),
        fmt(memory, ".1f"),
        "-" if point.fits is None else ("yes" if point.fits else "no"),
        "*" if point.pareto else "",
    )


def _table(rows: Sequence[tuple[str, ...]]) -> list[str]:
    widths = [max(len(x) for x in col) for col in zip(_HEADERS, *rows, strict=True)]
    lines = ["  ".join(h.rjust(w) for h, w in zip(_HEADERS, widths, strict=True))]
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
        f"({result.memory_capacity_bytes / 1e9:.1f} GB each), global batch "
        f"{result.global_batch}: {len(result.points)} configurations, {len(simulated)} "
        f"simulated, {len(fitting)} fit"
    )
    shown = list(fitting[:top]) if fitting else simulated[:top]
    lines = [head, ""]
    if shown:
        lines += _table([_row(p) for p in shown])
        if not fitting:
            lines.append("(none fits: the least memory first)")
    pareto_more = [p for p in result.pareto if p not in shown]
    if pareto_more:
        lines += ["", "more of the Pareto front (step time vs memory):"]
        lines += _table([_row(p) for p in pareto_more[:top]])[1:]
    groups: dict[str, list[str]] = {}
    for point in infeasible:
        text = (point.reason or "?").split(";")[0]
        # one line per kind of reason: the same rule with other numbers is the same kind
        groups.setdefault(re.sub(r"(?<![\w'-])\d+", "#", text), []).append(text)
    if groups:
        lines += ["", f"{len(infeasible)} configurations not simulated, for example:"]
        ranked = sorted(groups.values(), key=lambda texts: -len(texts))
        for texts in ranked[:8]:
            lines.append(f"  {len(texts):5d} x {texts[0]}")
        if len(ranked) > 8:
            lines.append(f"  ... and {len(ranked) - 8} more kinds (see --json or --csv)")
    if result.n_duplicates:
        lines += [
            "",
            f"{result.n_duplicates} configurations identical to one listed (same per-rank "
            "orders and costs, e.g. interleaved-1f1b with v=1 is 1f1b) are not repeated",
        ]
    lines += ["", "winner: " + explain(result)]
    best = result.recommended
    if best is not None:
        from pipesim.plan.frameworks import megatron_args, torchtitan_args

        parts = best.parts_s() or {}
        lines += [
            "",
            "iteration (s): "
            + ", ".join(
                f"{name} {parts[name]:.3g}"
                for name in ("pipeline", "tp_comm", "bubble", "dp_comm", "optimizer", "step")
            )
            + " (tp_comm and bubble are inside pipeline)",
            "Megatron-LM: " + megatron_args(result, best),
            "torchtitan:  " + torchtitan_args(result, best),
        ]
    return "\n".join(lines)


_CSV_FIELDS = (
    "rank",
    "schedule",
    "pipeline",
    "virtual",
    "tensor_parallel",
    "data_parallel",
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
    """Plotly figure: step time vs peak memory per device, one colour per schedule,
    the Pareto front as a line, the memory capacity as a vertical line, the
    configuration on hover. Needs plotly (imported here, not at module load)."""
    import plotly.graph_objects as go

    fig = go.Figure()
    simulated = [p for p in result.points if p.feasible]
    for name in sorted({p.schedule for p in simulated}):
        mine = [p for p in simulated if p.schedule == name]
        fig.add_trace(
            go.Scatter(
                x=[(p.peak_memory_bytes or 0) / 1e9 for p in mine],
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
    front = result.pareto
    if front:
        ordered = sorted(front, key=lambda p: p.peak_memory_bytes or 0)
        fig.add_trace(
            go.Scatter(
                x=[(p.peak_memory_bytes or 0) / 1e9 for p in ordered],
                y=[p.step_time_s for p in ordered],
                mode="lines",
                name="Pareto front",
                line={"color": "black", "dash": "dot", "shape": "hv"},
                hoverinfo="skip",
            )
        )
    capacity = result.memory_capacity_bytes / 1e9
    fig.add_vline(
        x=capacity,
        line={"color": "red", "dash": "dash"},
        annotation_text=f"capacity {capacity:.0f} GB",
        annotation_position="top left",
    )
    fig.update_layout(
        title=(
            f"{result.model} on {result.devices} x {result.accelerator.name}, global batch "
            f"{result.global_batch}: step time vs memory (x: does not fit; large: Pareto front)"
        ),
        xaxis_title="peak memory per device (GB)",
        yaxis_title="step time (s)",
        legend_title="schedule",
        template="plotly_white",
    )
    return fig


def _hover(point: PlanPoint) -> str:
    bubble = "-" if point.bubble is None else f"{float(point.bubble):.1%}"
    mfu = "-" if point.mfu is None else f"{point.mfu:.1%}"
    lines = [
        f"<b>{point.schedule}</b> rank {point.rank if point.rank is not None else '-'}",
        f"p={point.pipeline} v={point.virtual} d={point.data_parallel} "
        f"b={point.microbatch_size} m={point.n_microbatches}",
        f"step {point.step_time_s:.4g} s, MFU {mfu}, bubble {bubble}",
        f"memory {(point.peak_memory_bytes or 0) / 1e9:.1f} GB "
        f"(static {(point.static_memory_bytes or 0) / 1e9:.1f} + activations "
        f"{(point.peak_activation_bytes or 0) / 1e9:.1f})",
        "layers per stage: " + " ".join(str(n) for n in point.layers_per_stage),
    ]
    if point.reason:
        lines.append(point.reason)
    return "<br>".join(lines)


def write_html(result: PlanResult, path: str | Path, /, *, cdn: bool = False) -> Path:
    """Write :func:`plan_figure` as a standalone HTML page (plotly.js embedded unless
    ``cdn``); an unwritable path is a PipesimError."""
    import plotly.io as pio

    path = Path(path)
    html = pio.to_html(
        plan_figure(result),
        include_plotlyjs="cdn" if cdn else True,
        full_html=True,
        div_id="pipesim-plan",
        config={"displaylogo": False, "responsive": True},
    )
    return write_text(path, html)
