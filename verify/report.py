"""The verification report: what was compared, what matched, what it cost, how long it took.

``VerifyReport.to_dict()`` is the ``pipesim verify --json`` contract: at least
``bit_identical``, ``outputs_equal``, ``grads_equal``,
``max_abs_diff_full_batch``, ``param_bytes`` (per stage), ``transfer_bytes``
(per stage boundary, per micro-batch), ``measured_makespan`` and
``predicted_makespan`` (seconds). ``grads_equal`` is null for a forward-only
schedule (no gradients to compare). ``measured_trace`` is the measured step as a
pipesim trace file's object (times in ns, :mod:`verify.measured`), which
``pipesim plot --measured REPORT.json`` draws against its prediction. ``page_faults``
is, per rank process, the minor page faults of the measured step (null in process).
``precision`` names the model's dtypes (``bf16``, ``fp32, autocast bf16``); ``batch_size``
is rows per step and ``microbatch_sizes`` rows per micro-batch; ``wire_bytes`` /
``wire_dtypes`` what each rank process sent to the others (payload bytes, their dtypes;
null / empty in process).
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from pipesim.costs import CostModel, costs_to_dict
from pipesim.schedule import Schedule
from pipesim.trace import Trace

__all__ = [
    "PAGE_FAULTS_NOTICED",
    "VerifyReport",
    "format_report",
    "page_faults_line",
    "steps_line",
]


@dataclass(frozen=True, slots=True, kw_only=True, eq=False)
class VerifyReport:
    """The result of :func:`verify.verify`."""

    schedule: str
    model: str
    n_ranks: int
    n_stages: int
    n_microbatches: int
    devices: tuple[str, ...]
    """One device per rank."""
    batch_size: int
    """Rows per step (``--global-batch``, as ``pipesim plan`` names it)."""
    microbatch_sizes: tuple[int, ...]
    """Rows per micro-batch (``--microbatch-size``; ``torch.tensor_split``: the first ones
    get one more when uneven)."""
    layer_counts: tuple[int, ...]
    """Model entries per stage."""
    forward_only: bool
    bit_identical: bool
    """Outputs, losses and (when training) gradients all ``torch.equal`` to the reference."""
    outputs_equal: bool
    losses_equal: bool
    grads_equal: bool | None
    """None for forward-only schedules."""
    order_followed: bool
    """Every rank ran its actions in the Schedule's order and nothing ran before its inputs."""
    mismatches: tuple[str, ...]
    """One line per tensor that differs from the reference, first the first one: its largest
    difference and the action(s) that made it (``made by 1F3``, ``added by 1B0..1B3``)."""
    max_abs_diff_full_batch: float
    """Largest difference of outputs and gradients against the whole batch run at once."""
    loss_full_batch: float | None
    loss_mean_microbatches: float | None
    accumulation_orders: tuple[tuple[int, ...], ...]
    """Per stage, the micro-batch order the Schedule adds gradients in (the reference's)."""
    n_params: int
    model_param_bytes: int
    param_bytes: tuple[int, ...]
    transfer_bytes: tuple[tuple[int, ...], ...]
    """Per stage boundary ``s -> s+1``, bytes per micro-batch (0: it does not cross there)."""
    activation_bytes: tuple[int, ...]
    """Per stage, bytes saved for backward by one micro-batch's forward (parameters excluded)."""
    grad_norms: tuple[float, ...]
    """Per stage, the sum of its parameters' gradient norms (the chapter's check)."""
    measured_makespan: float
    """Seconds from the first action's start to the last action's end, as measured."""
    predicted_makespan: float
    """Seconds pipesim predicts for the run as executed (see :mod:`verify.calibrate`)."""
    predicted_makespan_parallel: float
    """Seconds pipesim predicts with one device per rank, the same calibrated costs."""
    makespan_error_percent: float
    """``(predicted - measured) / measured * 100``."""
    costs: CostModel
    """The calibrated cost model (time unit: ns)."""
    trace: Trace
    """The measured trace (times in ns)."""
    precision: str = "fp32"
    """The model's dtypes in words (:attr:`verify.models.VerifyModel.precision`): ``bf16``,
    ``fp32, autocast bf16``."""
    wire_bytes: tuple[int, ...] | None = None
    """Per rank process, the payload bytes it sent to other ranks in the measured step
    (:class:`verify.transport.OrderedTransport` counts them; headers excluded); None in
    process."""
    wire_dtypes: tuple[str, ...] = ()
    """The dtypes those payloads travelled in."""
    step_makespans: tuple[float, ...] = ()
    """Seconds, the makespan of each measured step (``--timed-steps``, in the order they
    ran); the measured step reported above is the one of median makespan."""
    page_faults: tuple[int, ...] | None = None
    """Per rank process, the minor page faults of the measured step (first touches of
    memory pages; each costs microseconds inside the op that touches it, about 10 us on a
    virtual machine); None where not counted (an in-process run). Thousands mean the
    warm-up did not reach a steady state: raise ``--warmup``."""
    as_run: Schedule | None = None
    """The schedule as the executor ran it (ranks sharing a host thread or a CUDA device
    merged, see :func:`verify.calibrate.as_run_schedule`), whose simulation predicts the
    measured step; :mod:`verify.measured` writes the trace in its ranks."""

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready; see the module docstring for the contract."""
        data: dict[str, Any] = {}
        for name in self.__dataclass_fields__:
            if name in ("costs", "trace", "as_run"):
                continue
            value = getattr(self, name)
            if isinstance(value, tuple):
                value = [list(v) if isinstance(v, tuple) else v for v in value]
            data[name] = value
        data["time_unit"] = "s"
        data["costs"] = costs_to_dict(self.costs)
        data["costs"]["meta"] = {"time_unit": "ns"}
        from verify.measured import measured_step_dict  # it builds on this module

        data["measured_trace"] = None if self.as_run is None else measured_step_dict(self)
        return data


def format_report(report: VerifyReport, /) -> str:
    """A readable summary of ``report`` for the terminal."""
    r = report
    verdict = "BIT-IDENTICAL" if r.bit_identical else "NOT bit-identical"
    grads = "n/a (forward-only)" if r.grads_equal is None else str(r.grads_equal)
    row_counts = sorted(set(r.microbatch_sizes), reverse=True)
    lines = [
        f"{r.schedule}: {r.n_ranks} ranks, {r.n_stages} stages, {r.n_microbatches} micro-batches; "
        f"model {r.model} ({r.precision}) cut {list(r.layer_counts)} on {','.join(r.devices)}",
        f"rows: {r.batch_size} per step (global batch), "
        + " or ".join(str(n) for n in row_counts)
        + " per micro-batch (micro-batch size)",
        f"{verdict}: outputs {r.outputs_equal}, losses {r.losses_equal}, gradients {grads}, "
        f"order followed {r.order_followed}",
    ]
    lines += [f"  differs: {m}" for m in r.mismatches[:10]]
    if len(r.mismatches) > 10:
        lines.append(f"  ... and {len(r.mismatches) - 10} more")
    lines.append(f"max abs diff against the full batch: {r.max_abs_diff_full_batch:.3g}")
    lines.append(
        f"parameters: {r.n_params:,} = {r.model_param_bytes:,} bytes; per stage "
        + ", ".join(f"{b:,}" for b in r.param_bytes)
        + " bytes"
    )
    for boundary, sizes in enumerate(r.transfer_bytes):
        lines.append(
            f"transfer stage {boundary} -> {boundary + 1}: "
            + ", ".join(f"{b:,}" for b in sizes)
            + " bytes per micro-batch"
        )
    if r.wire_bytes is not None:
        lines.append(
            "sent through the process group, per rank: "
            + ", ".join(f"{b:,}" for b in r.wire_bytes)
            + f" payload bytes ({', '.join(r.wire_dtypes) or 'none'})"
        )
    if not r.forward_only:
        lines.append("gradient norm per stage: " + ", ".join(f"{g:.4f}" for g in r.grad_norms))
    lines.append(
        f"makespan: measured {r.measured_makespan * 1e3:.3f} ms, predicted "
        f"{r.predicted_makespan * 1e3:.3f} ms ({r.makespan_error_percent:+.1f}%); "
        f"one device per rank would take {r.predicted_makespan_parallel * 1e3:.3f} ms"
    )
    if len(r.step_makespans) > 1:
        lines.append(steps_line(r.step_makespans))
    if r.page_faults is not None:
        lines.append(page_faults_line(r.page_faults))
    return "\n".join(lines)


def steps_line(makespans: Sequence[float], /) -> str:
    """The report's line on several measured steps: their median and spread.

    >>> steps_line((0.010, 0.012, 0.011))
    'measured steps: 3, makespan median 11.000 ms, 10.000-12.000 ms (spread 18.2% of the median)'
    """
    median = statistics.median_low(makespans)
    spread = (max(makespans) - min(makespans)) / median * 100 if median else 0.0
    return (
        f"measured steps: {len(makespans)}, makespan median {median * 1e3:.3f} ms, "
        f"{min(makespans) * 1e3:.3f}-{max(makespans) * 1e3:.3f} ms "
        f"(spread {spread:.1f}% of the median)"
    )


#: Page faults of one rank's measured step above which ``format_report`` suggests more
#: warm-up: about 10 ms of first touches at the ~10 us a fault costs on a virtual machine.
PAGE_FAULTS_NOTICED = 1000


def page_faults_line(faults: Sequence[int], /, *, label: str = "per rank") -> str:
    """The report's line on the measured step's page faults (``label`` says whose), with
    advice when many.

    >>> page_faults_line((12, 0))
    'page faults in the measured step, per rank: 12, 0'
    >>> page_faults_line((12, 5000)).endswith("(over 1,000 on a rank: the step still touched "
    ...     "new memory, which slows the ops that touch it); raise --warmup")
    True
    """
    line = f"page faults in the measured step, {label}: " + ", ".join(f"{f:,}" for f in faults)
    if max(faults, default=0) > PAGE_FAULTS_NOTICED:
        line += (
            f" (over {PAGE_FAULTS_NOTICED:,} on a rank: the step still touched new "
            "memory, which slows the ops that touch it); raise --warmup"
        )
    return line
