"""The exact check: the pipelined run against the unsplit model, bit for bit.

Splitting a model between layers changes no bits; splitting a batch into
micro-batches and accumulating gradients can (docs/architecture.md, "The JSON
contract"). So the reference is the *unsplit* model run on the *same*
micro-batches:

- outputs and losses of micro-batch ``k`` must be ``torch.equal`` to the
  unsplit model's on micro-batch ``k``;
- a stage's gradients must be ``torch.equal`` to the unsplit model's
  per-micro-batch gradients added in the order the Schedule runs that stage's
  backwards (B, or W when split), then divided once by the number of
  micro-batches, as torch.distributed.pipelining's ``scale_grads`` does for a
  mean loss. Micro-batches are ``torch.tensor_split`` along dimension 0, also
  as torch splits them, so uneven batches give the first micro-batches one
  more row.

The order comes from the Schedule, not from the executor's own record, so an
executor (or a schedule file) that adds gradients in another order fails.
Beside the exact check, the largest difference against the whole batch run at
once is reported (a tolerance figure; with uneven micro-batches the mean of
micro-batch means also weighs rows differently).

>>> from pipesim.schedules import generate
>>> report = verify(generate("1f1b", n_ranks=2, n_microbatches=2), model="mlp")
>>> report.bit_identical, report.param_bytes, report.transfer_bytes
(True, (43776, 38800), ((6144, 6144),))
"""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from pipesim.actions import Op
from pipesim.costs import CostModel
from pipesim.engine import simulate
from pipesim.exact import Time
from pipesim.graph import data_dependencies, validate
from pipesim.metrics import error_percent
from pipesim.schedule import Schedule
from pipesim.step.structure import step_structure
from pipesim.trace import Trace
from verify.bit_identity import exact_settings
from verify.calibrate import as_run_schedule, calibrate, measured_trace
from verify.errors import VerifyError
from verify.local import LocalRun, parse_devices, run_schedule
from verify.locate import first_gradient_difference, max_abs_diff, twin
from verify.models import VerifyModel, load_model
from verify.report import VerifyReport
from verify.stage_cut import cut_stages, param_bytes
from verify.timing import median_step_index

__all__ = [
    "Reference",
    "build_report",
    "build_stages",
    "locate_gradient_mismatch",
    "reference_run",
    "schedule_accumulation_orders",
    "split_microbatches",
    "step_rows",
    "verify",
]


def split_microbatches(batch: Tensor, n_microbatches: int, /) -> tuple[Tensor, ...]:
    """``torch.tensor_split`` along dimension 0, refusing empty micro-batches.

    >>> [tuple(t.shape) for t in split_microbatches(torch.zeros(5, 2), 2)]
    [(3, 2), (2, 2)]
    """
    rows = batch.shape[0]
    if rows < n_microbatches:
        raise VerifyError(
            f"a batch of {rows} rows cannot make {n_microbatches} micro-batches (each needs at "
            f"least one row); use a batch size of at least {n_microbatches}"
        )
    return tuple(torch.tensor_split(batch, n_microbatches, dim=0))


def step_rows(
    n_microbatches: int, /, *, batch_size: int | None = None, microbatch_size: int | None = None
) -> int:
    """Rows per step from rows per step (``batch_size``, ``--global-batch``) or rows per
    micro-batch (``microbatch_size``, ``--microbatch-size``); both must agree; neither: 32
    rounded up to whole micro-batches.

    >>> step_rows(4), step_rows(4, microbatch_size=8), step_rows(3, batch_size=10)
    (32, 32, 10)
    """
    for label, value in (("batch_size", batch_size), ("microbatch_size", microbatch_size)):
        whole = isinstance(value, int) and not isinstance(value, bool)
        if value is not None and (not whole or value < 1):
            raise VerifyError(f"{label} must be a whole number >= 1, got {value!r}")
    if microbatch_size is None:
        return -(-32 // n_microbatches) * n_microbatches if batch_size is None else batch_size
    rows = microbatch_size * n_microbatches
    if batch_size is not None and batch_size != rows:
        raise VerifyError(
            f"rows per step {batch_size} (--global-batch) disagree with {microbatch_size} rows "
            f"per micro-batch (--microbatch-size) x {n_microbatches} micro-batches = {rows}; "
            "give one of them, or sizes that agree"
        )
    return rows


def schedule_accumulation_orders(schedule: Schedule, /) -> tuple[tuple[int, ...], ...]:
    """Per stage, the micro-batches in the order the Schedule runs their weight gradients
    (B, or W when the backward is split).

    >>> from pipesim.schedules import generate
    >>> schedule_accumulation_orders(generate("gpipe", n_ranks=2, n_microbatches=3))
    ((0, 1, 2), (0, 1, 2))
    """
    orders: list[list[int]] = [[] for _ in range(schedule.n_stages)]
    for order in schedule.orders:
        for work in order:
            for action in work.parts:
                if action.op in (Op.B, Op.W):
                    orders[action.stage].append(action.microbatch)
    return tuple(tuple(o) for o in orders)


@dataclass(frozen=True, slots=True, kw_only=True, eq=False)
class Reference:
    """The unsplit model on the same micro-batches, and on the whole batch."""

    outputs: tuple[Tensor, ...]
    losses: tuple[Tensor, ...]
    grads: tuple[tuple[Tensor | None, ...], ...]
    """``grads[k][i]``: gradient of parameter ``i`` from micro-batch ``k`` alone."""
    full_output: Tensor
    full_loss: Tensor
    full_grads: tuple[Tensor | None, ...]


def reference_run(
    layers: nn.Module,
    /,
    *,
    inputs: Sequence[Tensor],
    targets: Sequence[Tensor],
    loss_fn: Callable[[Tensor, Tensor], Tensor],
    device: torch.device,
    forward_only: bool,
) -> Reference:
    """Run the unsplit ``layers`` on ``device``: per micro-batch and on the whole batch."""
    layers.to(device)
    params = [p for p in layers.parameters()]
    trainable = [p for p in params if p.requires_grad]

    def one(x: Tensor, target: Tensor) -> tuple[Tensor, Tensor, tuple[Tensor | None, ...]]:
        with torch.set_grad_enabled(not forward_only):
            out = layers(x.to(device))
            loss = loss_fn(out, target.to(device))
        grads: list[Tensor | None] = [None] * len(params)
        if not forward_only and loss.requires_grad and trainable:
            computed = torch.autograd.grad(loss, trainable, allow_unused=True)
            by_id = {id(p): g for p, g in zip(trainable, computed, strict=True)}
            grads = [by_id.get(id(p)) for p in params]
        return out.detach(), loss.detach(), tuple(grads)

    runs = [one(x, t) for x, t in zip(inputs, targets, strict=True)]
    full_out, full_loss, full_grads = one(torch.cat(list(inputs)), torch.cat(list(targets)))
    return Reference(
        outputs=tuple(r[0] for r in runs),
        losses=tuple(r[1] for r in runs),
        grads=tuple(r[2] for r in runs),
        full_output=full_out,
        full_loss=full_loss,
        full_grads=full_grads,
    )


def _order_followed(run: LocalRun) -> bool:
    """Each rank ran exactly its order, and every producer ran before its consumer."""
    schedule = run.schedule
    per_rank: list[list[object]] = [[] for _ in range(schedule.n_ranks)]
    position = {}
    for index, work in enumerate(run.executed):
        per_rank[schedule.rank_of(work.parts[0].stage)].append(work)
        for action in work.parts:
            position[action] = index
    if [list(o) for o in schedule.orders] != per_rank:
        return False
    return all(position[d.producer] < position[d.consumer] for d in data_dependencies(schedule))


def verify(
    schedule: Schedule,
    /,
    *,
    model: VerifyModel | str = "mlp",
    devices: str | Sequence[str] | None = None,
    batch_size: int | None = None,
    microbatch_size: int | None = None,
    stages: Sequence[nn.Module] | None = None,
    layer_counts: Sequence[int] | None = None,
    balance: str | Sequence[float] = "layers",
    accumulation_orders: Sequence[Sequence[int]] | None = None,
    apply_settings: bool = True,
    warmup: int = 1,
    timed_steps: int = 1,
) -> VerifyReport:
    """Replay ``schedule`` with ``model`` on ``devices`` and compare it with the unsplit model.

    ``model`` is a :class:`~verify.models.VerifyModel` or a name for
    :func:`~verify.models.load_model`; it is cut into ``schedule.n_stages``
    stages by ``layer_counts`` / ``balance`` unless ``stages`` gives the
    stage modules. ``devices``: one per rank, or one for all (default: the CUDA
    devices present, else the CPU). ``batch_size`` (rows per step) or
    ``microbatch_size`` (rows per micro-batch) size the batch (:func:`step_rows`).
    ``accumulation_orders`` overrides the per-stage order the reference adds
    gradients in (default: the Schedule's).
    ``warmup`` untimed runs come first so that one-time start-up costs stay out
    of the measurement; of ``timed_steps`` measured runs the report holds the one of
    median makespan (and every one's makespan). ``apply_settings``: see
    :func:`~verify.bit_identity.exact_settings`.
    """
    validate(schedule)
    if isinstance(model, str):
        model = load_model(model)
    n_mb = schedule.n_microbatches
    rank_devices = parse_devices(devices or "", n_ranks=schedule.n_ranks)
    if stages is None:
        stages = build_stages(model, schedule, layer_counts=layer_counts, balance=balance)
    elif len(stages) != schedule.n_stages:
        raise VerifyError(
            f"{len(stages)} stage modules for a schedule of {schedule.n_stages} stages"
        )
    rows = step_rows(n_mb, batch_size=batch_size, microbatch_size=microbatch_size)
    expected_orders = tuple(
        tuple(o) for o in (accumulation_orders or schedule_accumulation_orders(schedule))
    )
    x, target = model.make_batch(rows)
    replay = _Replay(
        schedule=schedule,
        model=model,
        stages=stages,
        devices=rank_devices,
        inputs=split_microbatches(x, n_mb),
        targets=split_microbatches(target, n_mb),
    )
    with exact_settings(model.layers, devices=rank_devices, apply=apply_settings):
        return _replay_and_compare(
            replay, orders=expected_orders, warmup=warmup, timed_steps=timed_steps
        )


@dataclass(frozen=True, slots=True, kw_only=True, eq=False)
class _Replay:
    """What every run of one verification shares: the schedule, the model and its stage
    modules, one device per rank, and the micro-batches."""

    schedule: Schedule
    model: VerifyModel
    stages: Sequence[nn.Module]
    devices: tuple[torch.device, ...]
    inputs: tuple[Tensor, ...]
    targets: tuple[Tensor, ...]

    def run(self, *, trace_grads: bool = False) -> LocalRun:
        """One step of the schedule (:func:`verify.local.run_schedule`)."""
        return run_schedule(
            self.schedule,
            self.stages,
            devices=self.devices,
            inputs=self.inputs,
            targets=self.targets,
            loss_fn=self.model.loss_fn,
            trace_grads=trace_grads,
        )


def _replay_and_compare(
    replay: _Replay,
    /,
    *,
    orders: tuple[tuple[int, ...], ...],
    warmup: int,
    timed_steps: int = 1,
) -> VerifyReport:
    """The reference, ``warmup`` untimed runs, the measured runs (the one of median
    makespan reported) and the report; on a gradient mismatch, a traced re-run that names
    the action where it arose."""
    schedule, model, rank_devices = replay.schedule, replay.model, replay.devices
    ref = reference_run(
        model.layers,
        inputs=replay.inputs,
        targets=replay.targets,
        loss_fn=model.loss_fn,
        device=rank_devices[0],
        forward_only=schedule.forward_only,
    )
    for _ in range(max(warmup, 0)):
        replay.run()
    run = _median_run([replay.run() for _ in range(max(timed_steps, 1))])

    report = build_report(
        schedule,
        model=model,
        stages=replay.stages,
        run=run,
        ref=ref,
        devices=rank_devices,
        microbatch_sizes=tuple(int(t.shape[0]) for t in replay.inputs),
        accumulation_orders=orders,
        as_run=as_run_schedule(schedule, executed=run.executed, devices=rank_devices),
    )
    if report.grads_equal is False:  # find the action: re-run, checking after each B / W
        traced = replay.run(trace_grads=True)
        report = locate_gradient_mismatch(
            report, traced, model=model, stages=replay.stages, ref=ref, orders=orders
        )
    return report


def locate_gradient_mismatch(
    report: VerifyReport,
    traced: LocalRun,
    /,
    *,
    model: VerifyModel,
    stages: Sequence[nn.Module],
    ref: Reference,
    orders: Sequence[Sequence[int]],
) -> VerifyReport:
    """``report`` with a mismatch line (the first after any output or loss) naming the
    action where the gradients first differ, the parameter and its largest difference,
    found in ``traced``, a re-run that kept the gradients after every B and W
    (:mod:`verify.locate`)."""
    where = first_gradient_difference(
        traced, layers=model.layers, stages=stages, reference_grads=ref.grads, orders=orders
    )
    if where is None:
        where = (
            "the gradients differ, but a re-run that checked them after every B and W found "
            "each partial sum equal: the difference did not reproduce, or arose in the final "
            "division by the micro-batch count"
        )
    # After the outputs and losses (their F ran before any B), before the gradients' lines.
    lines = report.mismatches
    at = sum(1 for m in lines if m.startswith(("output of ", "loss of ")))
    return dataclasses.replace(report, mismatches=(*lines[:at], where, *lines[at:]))


def _median_run(runs: Sequence[LocalRun], /) -> LocalRun:
    """Of several measured runs the one of median makespan
    (:func:`verify.timing.median_step_index`), with every run's makespan. Every run
    computes the same tensors: only its timings differ."""

    makespans = tuple(int(measured_trace(r).makespan) for r in runs)  # as the report's
    return dataclasses.replace(runs[median_step_index(makespans)], step_makespans_ns=makespans)


def build_stages(
    model: VerifyModel,
    schedule: Schedule,
    /,
    *,
    layer_counts: Sequence[int] | None = None,
    balance: str | Sequence[float] = "layers",
) -> tuple[nn.Module, ...]:
    """The stage modules ``schedule`` needs: ``model`` cut into ``n_stages / n_copies``
    stages sharing its modules, plus independent copies of them for each further model
    copy (DualPipe's ``Schedule.n_copies``), equal at the start.

    >>> from pipesim.schedules import generate
    >>> from verify.models import mlp
    >>> len(build_stages(mlp(), generate("dualpipe", n_ranks=2, n_microbatches=4)))
    4
    """
    base = cut_stages(
        model.layers,
        n_stages=schedule.n_stages // schedule.n_copies,
        layer_counts=layer_counts,
        balance=balance,
    )
    stages: tuple[nn.Module, ...] = base
    for _ in range(schedule.n_copies - 1):
        stages = stages + tuple(copy.deepcopy(m) for m in base)
    return stages


def build_report(
    schedule: Schedule,
    /,
    *,
    model: VerifyModel,
    stages: Sequence[nn.Module],
    run: LocalRun,
    ref: Reference,
    devices: Sequence[torch.device],
    microbatch_sizes: tuple[int, ...],
    accumulation_orders: tuple[tuple[int, ...], ...],
    as_run: Schedule,
) -> VerifyReport:
    """Compare ``run`` with ``ref`` and calibrate; ``as_run`` is the schedule whose
    simulation predicts the measured step (see :mod:`verify.calibrate`)."""
    exact = _compare_exactly(
        schedule, model=model, stages=stages, run=run, ref=ref, orders=accumulation_orders
    )
    timing = _calibrate_timing(schedule, stages=stages, run=run, devices=devices, as_run=as_run)
    losses_mean = (
        float(torch.stack([loss.cpu() for loss in run.losses]).mean()) if run.losses else None
    )
    return VerifyReport(
        schedule=schedule.name,
        model=model.name,
        n_ranks=schedule.n_ranks,
        n_stages=schedule.n_stages,
        n_microbatches=schedule.n_microbatches,
        devices=tuple(str(d) for d in devices),
        batch_size=sum(microbatch_sizes),
        microbatch_sizes=microbatch_sizes,
        layer_counts=tuple(len(list(m.children())) for m in stages),
        forward_only=schedule.forward_only,
        bit_identical=exact.bit_identical,
        outputs_equal=exact.outputs_equal,
        losses_equal=exact.losses_equal,
        grads_equal=exact.grads_equal,
        order_followed=exact.order_followed,
        mismatches=exact.mismatches,
        max_abs_diff_full_batch=exact.max_abs_diff_full_batch,
        loss_full_batch=float(ref.full_loss),
        loss_mean_microbatches=losses_mean,
        accumulation_orders=accumulation_orders,
        n_params=sum(p.numel() for p in model.layers.parameters()),
        model_param_bytes=param_bytes(model.layers),
        param_bytes=timing.param_sizes,
        transfer_bytes=run.transfer_bytes,
        activation_bytes=run.activation_bytes,
        grad_norms=_grad_norms(stages),
        measured_makespan=float(timing.measured) / 1e9,
        predicted_makespan=float(timing.predicted) / 1e9,
        predicted_makespan_parallel=float(timing.predicted_parallel) / 1e9,
        makespan_error_percent=timing.error_percent,
        costs=timing.costs,
        trace=timing.trace,
        precision=model.precision,
        wire_bytes=run.wire_bytes,
        wire_dtypes=run.wire_dtypes,
        page_faults=run.page_faults,
        step_makespans=tuple(ns / 1e9 for ns in run.step_makespans_ns),
        as_run=as_run,
    )


@dataclass(frozen=True, slots=True, kw_only=True)
class _Exactness:
    """What comparing a run with the reference, bit for bit, found."""

    outputs_equal: bool
    losses_equal: bool
    grads_equal: bool | None
    """None for forward-only schedules."""
    order_followed: bool
    mismatches: tuple[str, ...]
    max_abs_diff_full_batch: float

    @property
    def bit_identical(self) -> bool:
        """Everything equal (gradients unless not compared) and the order followed."""
        return (
            self.outputs_equal
            and self.losses_equal
            and self.grads_equal is not False
            and self.order_followed
        )


def _compare_exactly(
    schedule: Schedule,
    /,
    *,
    model: VerifyModel,
    stages: Sequence[nn.Module],
    run: LocalRun,
    ref: Reference,
    orders: tuple[tuple[int, ...], ...],
) -> _Exactness:
    """Outputs, losses and (when training) gradients of ``run`` against ``ref``, and whether
    the executor followed the Schedule's order."""
    mismatches: list[str] = []
    made_by, added_by = _where(schedule)
    outputs_equal, losses_equal = _compare_outputs(
        run, ref, made_by, n_microbatches=schedule.n_microbatches, mismatches=mismatches
    )
    grads_equal: bool | None = None
    full_diffs = [max_abs_diff(torch.cat([o.cpu() for o in run.outputs]), ref.full_output)]
    if not schedule.forward_only:
        grads_equal = _compare_grads(
            model.layers,
            stages,
            per_copy=schedule.n_stages // schedule.n_copies,
            ref=ref,
            orders=orders,
            n_microbatches=schedule.n_microbatches,
            mismatches=mismatches,
            full_diffs=full_diffs,
            added_by=added_by,
        )
    order_followed = _order_followed(run)
    if not order_followed:
        mismatches.append("the executor did not follow the Schedule's per-rank order")
    return _Exactness(
        outputs_equal=outputs_equal,
        losses_equal=losses_equal,
        grads_equal=grads_equal,
        order_followed=order_followed,
        mismatches=tuple(mismatches),
        max_abs_diff_full_batch=max(full_diffs),
    )


def _compare_outputs(
    run: LocalRun,
    ref: Reference,
    made_by: dict[int, str],
    /,
    *,
    n_microbatches: int,
    mismatches: list[str],
) -> tuple[bool, bool]:
    """Whether every micro-batch's output, and every loss, equals the reference's; a line
    in ``mismatches`` for each that does not."""
    outputs_equal = True
    losses_equal = True
    for k in range(n_microbatches):
        if not torch.equal(run.outputs[k].cpu(), ref.outputs[k].cpu()):
            outputs_equal = False
            mismatches.append(
                f"output of micro-batch {k} (max abs diff "
                f"{max_abs_diff(run.outputs[k], ref.outputs[k]):.3g}, made by {made_by[k]})"
            )
        if not torch.equal(run.losses[k].cpu(), ref.losses[k].cpu()):
            losses_equal = False
            mismatches.append(
                f"loss of micro-batch {k} (max abs diff "
                f"{max_abs_diff(run.losses[k], ref.losses[k]):.3g}, made by {made_by[k]})"
            )
    return outputs_equal, losses_equal


@dataclass(frozen=True, slots=True, kw_only=True, eq=False)
class _Timing:
    """The calibrated costs, the measured trace, and the makespans measured and predicted
    (ns)."""

    param_sizes: tuple[int, ...]
    costs: CostModel
    trace: Trace
    measured: Time
    predicted: Time
    predicted_parallel: Time

    @property
    def error_percent(self) -> float:
        """``(predicted - measured) / measured * 100``; 0 when nothing was measured."""
        return error_percent(self.predicted, self.measured) if self.measured else 0.0


def _calibrate_timing(
    schedule: Schedule,
    /,
    *,
    stages: Sequence[nn.Module],
    run: LocalRun,
    devices: Sequence[torch.device],
    as_run: Schedule,
) -> _Timing:
    """Calibrate costs on ``run`` and simulate ``as_run`` (the step as measured) and
    ``schedule`` (one device per rank) with them."""
    param_sizes = tuple(param_bytes(m) for m in stages)
    costs = calibrate(run, devices=devices, param_bytes=param_sizes, as_run=as_run)
    trace = measured_trace(run)
    return _Timing(
        param_sizes=param_sizes,
        costs=costs,
        trace=trace,
        measured=trace.makespan,
        predicted=simulate(as_run, costs=costs).metrics.makespan,
        predicted_parallel=simulate(schedule, costs=costs).metrics.makespan,
    )


def _grad_norms(stages: Sequence[nn.Module], /) -> tuple[float, ...]:
    """Per stage, the sum of its parameters' gradient norms."""
    return tuple(
        sum(float(p.grad.norm()) for p in m.parameters() if p.grad is not None) for m in stages
    )


def _compare_grads(
    layers: nn.Module,
    stages: Sequence[nn.Module],
    *,
    per_copy: int,
    ref: Reference,
    orders: Sequence[Sequence[int]],
    n_microbatches: int,
    mismatches: list[str],
    full_diffs: list[float],
    added_by: Sequence[str],
) -> bool:
    """Each stage's gradients against the reference added in that stage's order.

    A stage of model copy ``c > 0`` matches the model's parameters position by
    position through the same stage of copy 0 (which shares the model's modules).
    """
    named = list(layers.named_parameters())
    index_of = {id(p): i for i, (_, p) in enumerate(named)}
    equal = True
    covered: set[int] = set()
    combined: dict[int, Tensor] = {}  # the step's gradient: the copies' gradients added
    for s in range(len(stages)):
        pairs, lined_up = _model_parameters(stages, s, per_copy, index_of, mismatches)
        equal &= lined_up
        for i, p in pairs:
            covered.add(i)
            if not p.requires_grad:
                continue
            per_mb = [ref.grads[k][i] for k in range(n_microbatches)]
            expected = _accumulate(per_mb, orders[s], n_microbatches)
            where = f"{named[i][0]} (stage {s})"
            equal &= _grad_matches(where, expected, p.grad, added_by[s], mismatches)
            if expected is not None and p.grad is not None:
                total = combined.get(i)
                combined[i] = p.grad.cpu() if total is None else total + p.grad.cpu()
    for i, (name, p) in enumerate(named):
        if p.requires_grad and i not in covered:
            equal = False
            mismatches.append(f"parameter {name} is in no stage")
    for i, total in combined.items():
        full = ref.full_grads[i]
        if full is not None:
            full_diffs.append(max_abs_diff(total, full))
    return equal


def _model_parameters(
    stages: Sequence[nn.Module],
    s: int,
    per_copy: int,
    index_of: dict[int, int],
    mismatches: list[str],
) -> tuple[list[tuple[int, nn.Parameter]], bool]:
    """Stage ``s``'s parameters, each with the index of the model parameter it stands for
    (through its copy-0 twin), and whether all of them line up (else ``mismatches`` says
    how they do not)."""
    bases = list(twin(stages, s, per_copy=per_copy).parameters())
    owns = list(stages[s].parameters())
    if len(bases) != len(owns):
        mismatches.append(f"stage {s} does not have the parameters of its copy-0 twin")
        return [], False
    pairs = []
    for base, p in zip(bases, owns, strict=True):
        i = index_of.get(id(base))
        if i is None:
            mismatches.append(f"a parameter of stage {s} is not a parameter of the model")
            continue
        pairs.append((i, p))
    return pairs, len(pairs) == len(owns)


def _grad_matches(
    where: str, expected: Tensor | None, actual: Tensor | None, added_by: str, mismatches: list[str]
) -> bool:
    """Whether a parameter's gradient is bit-identical to the reference's (both absent
    counts); else ``mismatches`` says where and by how much."""
    if expected is None or actual is None:
        if (expected is None) != (actual is None):
            state = "missing" if actual is None else "unexpected"
            mismatches.append(f"gradient of {where}: {state}")
            return False
        return True
    if torch.equal(actual.cpu(), expected.cpu()):
        return True
    mismatches.append(
        f"gradient of {where} (max abs diff "
        f"{max_abs_diff(actual, expected):.3g}, added by {added_by})"
    )
    return False


def _where(schedule: Schedule) -> tuple[dict[int, str], list[str]]:
    """Per micro-batch, the action that made its output and loss (the F of the stage that
    computes the loss); per stage, the actions that add its gradients, in order."""
    structure = step_structure(schedule)
    made_by: dict[int, str] = {}
    added: list[list[str]] = [[] for _ in range(schedule.n_stages)]
    for order in schedule.orders:
        for work in order:
            for a in work.parts:
                if a.op is Op.F and structure.computes_loss(a.stage):
                    made_by[a.microbatch] = str(a)
                elif a.op in (Op.B, Op.W):
                    added[a.stage].append(str(a))
    spans = [f"{a[0]}..{a[-1]}" if len(a) > 1 else "".join(a) or "nothing" for a in added]
    return made_by, spans


def _accumulate(grads: Sequence[Tensor | None], order: Sequence[int], n_mb: int) -> Tensor | None:
    """Add per-micro-batch gradients in ``order`` the way ``.grad`` accumulates, then divide
    once by ``n_mb`` (torch's ``scale_grads``)."""
    total: Tensor | None = None
    for k in order:
        g = grads[k]
        if g is None:
            continue
        total = g.clone() if total is None else total.add_(g.to(total.device))
    if total is not None:
        total.div_(n_mb)
    return total
