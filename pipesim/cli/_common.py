"""Arguments shared by the verbs: where a schedule comes from and what it costs.

``add_schedule_arguments`` + ``schedule_from_args`` turn ``NAME | FILE
--pipeline-parallel P --microbatches M [--virtual V] [--forward-only] [--group-size N]``
into a :class:`~pipesim.schedule.Schedule`; ``add_cost_arguments`` +
``costs_from_args`` turn the cost flags (or ``--costs FILE``) into a
:class:`~pipesim.costs.CostModel`. ``plot``, ``trace``, ``verify`` reuse them.
"""

from __future__ import annotations

import argparse
import json
import math
import re
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pipesim.actions import Comm
from pipesim.cli._completion import mark_schedule_argument
from pipesim.costs import CostModel, Link, Links, StageCost, load_costs
from pipesim.errors import CostError, ParseError, PipesimError, UnknownNameError
from pipesim.exact import to_time
from pipesim.limits import MAX_LAYERS, MAX_MICROBATCHES, MAX_RANKS, MAX_STAGES
from pipesim.schedule import Schedule
from pipesim.schedule_io import load_schedule
from pipesim.schedules import generate, schedule_names
from pipesim.suggest import did_you_mean
from pipesim.units import TIME_UNITS, parse_bytes

if TYPE_CHECKING:
    from pipesim.comms import CommSchedule

__all__ = [
    "COUNT_TYPES",
    "LAYERS",
    "MICROBATCHES",
    "RANKS",
    "VALUE_READERS",
    "VIRTUAL",
    "WARMUP",
    "add_cost_arguments",
    "add_iteration_arguments",
    "add_require_fit_argument",
    "add_schedule_arguments",
    "check_suffix",
    "costs_for_stages",
    "costs_from_args",
    "iterations_from_args",
    "positive_int",
    "print_json",
    "read_value",
    "require_fit",
    "schedule_from_args",
    "schedule_from_source",
    "seconds",
    "usage_error",
    "value_argument",
    "whole_number",
]


_WHOLE = re.compile(r"\+?[0-9]+(?:_[0-9]+)*", re.ASCII)
_DECIMAL = re.compile(r"[-+]?(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][-+]?[0-9]+)?", re.ASCII)
_MAX_OPTION = 10**9  # any count given on the command line without a limit of its own


def whole_number(
    *, minimum: int = 1, maximum: int = _MAX_OPTION, limit: str | None = None
) -> Callable[[str], int]:
    """An argparse type: a whole number in ``minimum..maximum`` written with ASCII digits;
    anything else is a usage error (exit status 2) naming the value and the range.

    >>> whole_number(maximum=4096, limit="MAX_RANKS")("4")
    4
    >>> whole_number(maximum=4096, limit="MAX_RANKS")("5000")
    Traceback (most recent call last):
    ...
    argparse.ArgumentTypeError: expected a whole number from 1 to 4096 (MAX_RANKS in \
pipesim.limits), got 5000
    """
    bound = f"from {minimum} to {maximum}" + (f" ({limit} in pipesim.limits)" if limit else "")

    def parse(text: str) -> int:
        digits = text.strip()
        if len(digits) > 30 or not _WHOLE.fullmatch(digits):
            raise argparse.ArgumentTypeError(f"expected a whole number {bound}, got {text!r}")
        value = int(digits)
        if not minimum <= value <= maximum:
            raise argparse.ArgumentTypeError(f"expected a whole number {bound}, got {value}")
        return value

    parse.__name__ = "whole number"  # argparse names the type in some messages
    return parse


def usage_error(message: str) -> PipesimError:
    """A PipesimError that exits with status 2, as argparse's usage errors do: for a bad
    option value the CLI reads itself (plot's ``NAME:key=value`` settings)."""
    error = PipesimError(message)
    error.exit_status = 2  # type: ignore[attr-defined]  # read by pipesim.cli.main
    return error


def positive_int(text: str) -> int:
    """argparse type: a whole number from 1 to 10**9, with a message naming the value."""
    return _POSITIVE(text)


_POSITIVE = whole_number()

# The counts the verbs share, each bounded once by its pipesim.limits entry (a usage
# error, exit status 2, above it); plot's NAME:key=value settings parse with the same.
RANKS = whole_number(maximum=MAX_RANKS, limit="MAX_RANKS")
MICROBATCHES = whole_number(maximum=MAX_MICROBATCHES, limit="MAX_MICROBATCHES")
VIRTUAL = whole_number(maximum=MAX_STAGES, limit="MAX_STAGES")
LAYERS = whole_number(maximum=MAX_LAYERS, limit="MAX_LAYERS")
#: Untimed runs before a measured one (verify, calibrate).
WARMUP = whole_number(minimum=0, maximum=1000)
#: argparse type of each count flag, by dest.
COUNT_TYPES: dict[str, Callable[[str], int]] = {
    "n_ranks": RANKS,
    "microbatches": MICROBATCHES,
    "virtual": VIRTUAL,
    "group_size": MICROBATCHES,
    "ranks_per_node": RANKS,
    "link_concurrency": _POSITIVE,
}


def seconds(text: str) -> float:
    """argparse type: a finite, positive number of seconds, at most a year (timeouts).

    >>> seconds("2.5")
    2.5
    >>> seconds("nan")
    Traceback (most recent call last):
    ...
    argparse.ArgumentTypeError: expected a number of seconds above 0 and at most 31536000, \
got 'nan'
    """
    bound = f"above 0 and at most {_YEAR_S}"
    value = float(text) if _DECIMAL.fullmatch(text.strip()) else math.nan
    if not 0 < value <= _YEAR_S:  # also false for nan
        raise argparse.ArgumentTypeError(f"expected a number of seconds {bound}, got {text!r}")
    return value


_YEAR_S = 365 * 24 * 3600  # beyond it a timeout means "never" and overflows some waits


# -- values the library reads, the flag named in its errors -------------------------------
# A cost or size flag is read by the library's own reader (pipesim.units.parse_bytes,
# pipesim.exact.to_time, ...) with ``name`` the flag as typed, so its message names the
# flag, the value and the accepted forms; an error is a usage error (exit status 2).
Reader = Callable[[str, str], object]


def _per_stage(read: Callable[[str, str], object], /) -> Reader:
    """``read`` over a comma-separated list, one value per stage: a tuple."""

    def read_list(text: str, name: str) -> tuple[object, ...]:
        items = text.split(",")
        return tuple(
            read(item.strip(), name if len(items) == 1 else f"{name} (stage {stage})")
            for stage, item in enumerate(items)
        )

    return read_list


def _size(text: str, name: str) -> int:
    return parse_bytes(text, name=name)


def _capacity(text: str, name: str) -> int:
    return parse_bytes(text, name=name, minimum=1)


def _time(text: str, name: str) -> object:
    return to_time(text, name=name)


def _rate(text: str, name: str) -> object:
    return to_time(text, name=name, allow_zero=False)


def _share(*, include_one: bool) -> Reader:
    def read(text: str, name: str) -> object:
        from pipesim.plan.settings import check_share

        # A decimal is read as a float; anything else (nan, a word) is refused as written.
        value = float(text) if _DECIMAL.fullmatch(text.strip()) else text
        return check_share(value, name=name, include_one=include_one)

    return read


def _memory_limit(text: str, name: str) -> object:
    from pipesim.synth.problem import parse_memory_limit

    return parse_memory_limit(text, name=name)


#: The reader of each value flag, by dest (plot's ``NAME:key=value`` settings use them too).
VALUE_READERS: dict[str, Reader] = {
    "forward_time": _per_stage(_time),
    "backward_time": _per_stage(_time),
    "input_grad_time": _per_stage(_time),
    "weight_grad_time": _per_stage(_time),
    "overlap_time": _per_stage(_time),
    "optimizer_time": _per_stage(_time),
    "sync_time": _time,
    "activation_bytes": _per_stage(_size),
    "weight_grad_bytes": _per_stage(_size),
    "message_bytes": _per_stage(_size),
    "param_bytes": _per_stage(_size),
    "link_latency": _time,
    "link_bandwidth": _rate,
    "inter_node_latency": _time,
    "inter_node_bandwidth": _rate,
    "memory_capacity": _capacity,
    "memory_limit": _memory_limit,
    "memory_headroom": _share(include_one=False),  # what pipesim.plan.plan takes
    "min_mfu": _share(include_one=True),
}


def read_value(dest: str, text: str, /, *, name: str) -> object:
    """``text`` read as the value of flag ``dest``; an error naming ``name`` exits 2.

    >>> read_value("activation_bytes", "1GiB,2GB", name="--activation-bytes")
    (1073741824, 2000000000)
    >>> read_value("memory_capacity", "12XB", name="--memory-capacity")
    Traceback (most recent call last):
    ...
    pipesim.errors.PipesimError: --memory-capacity: unknown unit 'XB' in '12XB'; give a \
whole number of bytes (85899345920, 80e9) or a number with a unit: B, KB, MB, GB, TB \
(1000-based) or KiB, MiB, GiB, TiB (1024-based), e.g. 80GiB or 80GB
    """
    try:
        return VALUE_READERS[dest](text, name)
    except PipesimError as exc:
        raise usage_error(str(exc)) from None


class _ReadValue(argparse._StoreAction):
    """Store a flag's value as :func:`read_value` reads it, naming the flag as typed."""

    def __call__(
        self,
        parser: argparse.ArgumentParser,
        namespace: argparse.Namespace,
        values: Any,
        option_string: str | None = None,
    ) -> None:
        try:
            value = read_value(self.dest, values, name=option_string or self.dest)
        except PipesimError as exc:
            message = str(exc)
        else:
            setattr(namespace, self.dest, value)
            return
        parser.error(message)  # outside the except: nothing chained to the usage error


def value_argument(group: argparse._ActionsContainer, flag: str, /, **kwargs: Any) -> None:
    """Add ``flag``, whose value :data:`VALUE_READERS` reads when the command line is parsed."""
    group.add_argument(flag, action=_ReadValue, **kwargs)


def add_pipeline_parallel(
    group: argparse._ActionsContainer, *, required: bool = False, default: int | None = None
) -> None:
    """``--pipeline-parallel P`` (``-p``): the pipeline-parallel degree, the ranks one pipeline
    spans (``n_ranks`` in the API). ``--stages`` is its old spelling, still read, because with
    ``--virtual V`` the schedule has P x V stages and "stages" named the wrong count."""
    group.add_argument(
        "--pipeline-parallel",
        "-p",
        "--stages",
        dest="n_ranks",
        type=RANKS,
        required=required,
        default=default,
        metavar="P",
        help="pipeline-parallel degree P: ranks (devices) in the pipeline"
        + ("" if default is None else f", default {default}")
        + " (--stages: old spelling)",
    )


def add_size_arguments(
    group: argparse._ActionsContainer, *, required: bool, virtual_help: str
) -> None:
    """``--pipeline-parallel/-p``, ``--microbatches/-m`` and ``--virtual/-v``, bounded by
    pipesim.limits."""
    add_pipeline_parallel(group, required=required)
    group.add_argument(
        "--microbatches",
        "-m",
        type=MICROBATCHES,
        required=required,
        metavar="M",
        help="micro-batches per step",
    )
    group.add_argument(
        "--virtual",
        "-v",
        type=VIRTUAL,
        metavar="V",
        help=virtual_help,
    )


def add_schedule_arguments(parser: argparse.ArgumentParser, *, source: bool = True) -> None:
    """``SCHEDULE`` (a registered name or a .json/.csv file) and its size flags."""
    if source:
        action = parser.add_argument(
            "schedule",
            metavar="NAME|FILE",
            help="a built-in schedule (see `pipesim schedules`) or a .json / .csv schedule file",
        )
        mark_schedule_argument(action)
    group = parser.add_argument_group("schedule size")
    add_size_arguments(
        group,
        required=False,
        virtual_help="stages per rank for interleaved / V-shaped schedules (model cut into P*V "
        "stages); -v means virtual here, not verbose",
    )
    group.add_argument(
        "--forward-only", action="store_true", help="inference: forwards only (sequential, gpipe)"
    )
    group.add_argument(
        "--group-size",
        type=MICROBATCHES,
        metavar="N",
        help="interleaved-1f1b: micro-batches per group (Megatron; default P)",
    )


def add_comms_arguments(parser: argparse.ArgumentParser) -> None:
    """``--posted-receives``: how a comms schedule's receives run (:mod:`pipesim.engine`)."""
    parser.add_argument(
        "--posted-receives",
        action="store_true",
        help="for a comms schedule (a CSV with SEND/RECV actions, from `pipesim schedule "
        "NAME --comms`): a RECV posts the receive (irecv) and the work that needs the "
        "message waits for it, as torch's runtime and pipesim verify do; default: a RECV "
        "blocks its rank until the message has arrived. Refused for a compute schedule, "
        "whose work already waits only for the message it needs",
    )


def receive_mode(args: argparse.Namespace, comms: Sequence[CommSchedule | None], /) -> bool:
    """``blocking_receives`` for the engine. ``--posted-receives`` is refused unless some
    source is a comms schedule: a compute schedule has no RECV for it to change (its work
    already waits only for the message it needs, as posted receives do), so accepting it
    would silently do nothing."""
    if args.posted_receives and all(c is None for c in comms):
        source = args.schedule
        size = ""
        if source in schedule_names():  # a built-in: the lowering needs its size
            size = f" -p {args.n_ranks} -m {args.microbatches}"
            size += f" --virtual {args.virtual}" if getattr(args, "virtual", None) else ""
        lowered = f"{Path(source).stem}-comms.csv"
        raise PipesimError(
            f"--posted-receives changes how the RECV actions of a comms schedule run, and "
            f"{source!r} has none: it is a compute schedule, whose work already waits only "
            "for the message it needs, as with posted receives. To compare blocking and "
            f"posted receives, lower it first: `pipesim schedule {source}{size} --comms -o "
            f"{lowered}`, then simulate {lowered} with and without --posted-receives; "
            "else drop --posted-receives"
        )
    return not args.posted_receives


def comms_from_args(args: argparse.Namespace) -> CommSchedule | None:
    """The comms schedule when ``args.schedule`` is a CSV with sends and receives (torch's
    compute_comms format), else None. :func:`schedule_from_args` has validated it."""
    from pipesim.comms import comms_from_csv, is_comms_csv
    from pipesim.files import read_text

    path = Path(args.schedule)
    if path.suffix.lower() != ".csv" or not path.is_file():
        return None
    text = read_text(path, what="schedule")
    if not is_comms_csv(text):
        return None
    return comms_from_csv(text, name=path.stem, source=str(path))


def comms_counts(comms: CommSchedule, /) -> tuple[int, int]:
    """The sends and the receives of a comms schedule."""
    steps = [step for program in comms.programs for step in program]
    sends = sum(1 for s in steps if isinstance(s, Comm) and s.op.is_send)
    return sends, sum(1 for s in steps if isinstance(s, Comm)) - sends


def describe_comms(comms: CommSchedule, /, *, blocking_receives: bool) -> str:
    """One line saying a comms schedule's sends and receives were simulated, and how."""
    sends, receives = comms_counts(comms)
    how = (
        "blocking receives (--posted-receives: posted, as torch's runtime)"
        if blocking_receives
        else "posted receives"
    )
    return f"comms schedule: {sends} sends, {receives} receives, simulated as actions; {how}"


def schedule_from_source(
    source: str,
    *,
    n_ranks: int | None,
    microbatches: int | None,
    virtual: int | None = None,
    forward_only: bool = False,
    options: dict[str, Any] | None = None,
) -> Schedule:
    """A registered name is generated; anything else is read as a schedule file."""
    if source in schedule_names():
        missing = [
            flag
            for flag, v in (("--pipeline-parallel", n_ranks), ("--microbatches", microbatches))
            if v is None
        ]
        if missing:
            raise PipesimError(
                f"schedule {source!r} needs {' and '.join(missing)}, e.g. "
                f"`--pipeline-parallel 4 --microbatches 8`"
            )
        assert n_ranks is not None and microbatches is not None
        return generate(
            source,
            n_ranks=n_ranks,
            n_microbatches=microbatches,
            virtual=virtual,
            forward_only=forward_only,
            options=options,
        )
    path = Path(source)
    if path.suffix.lower() not in {".json", ".csv"} and not path.exists():
        raise UnknownNameError(
            f"unknown schedule {source!r}{did_you_mean(source, schedule_names())}; "
            f"valid schedules are: {', '.join(schedule_names())} "
            "(or give a .json / .csv schedule file)"
        )
    if not path.exists():
        raise ParseError(f"schedule file {source!r} does not exist")
    schedule = load_schedule(path)
    _check_file_flags(
        schedule,
        source,
        n_ranks=n_ranks,
        microbatches=microbatches,
        virtual=virtual,
        forward_only=forward_only,
        options=options or {},
    )
    return schedule


def _check_file_flags(
    schedule: Schedule,
    source: str,
    *,
    n_ranks: int | None,
    microbatches: int | None,
    virtual: int | None,
    forward_only: bool,
    options: dict[str, Any],
) -> None:
    """A size flag given with a schedule file must agree with the file: the file decides,
    and a flag that silently changed nothing would mislead."""
    for flag, given, actual, what in (
        ("--pipeline-parallel", n_ranks, schedule.n_ranks, "ranks"),
        ("--microbatches", microbatches, schedule.n_microbatches, "micro-batches"),
        ("--virtual", virtual, schedule.n_stages // schedule.n_ranks, "stages per rank"),
    ):
        if given is not None and given != actual:
            raise PipesimError(
                f"{flag} {given} disagrees with {source!r}, which has {actual} {what}; drop the "
                "flag or fix the file"
            )
    if forward_only and not schedule.forward_only:
        raise PipesimError(
            f"--forward-only disagrees with {source!r}, which has backward actions; drop the "
            "flag, or give a forward-only schedule file"
        )
    if options:
        flags = ", ".join("--" + name.replace("_", "-") for name in options)
        raise PipesimError(
            f"{flags} shapes a generated schedule, and {source!r} is a schedule file, whose "
            "order is already fixed; drop the flag"
        )


def schedule_from_args(args: argparse.Namespace) -> Schedule:
    """The schedule named by ``args.schedule`` and the size flags."""
    options = {}
    if getattr(args, "group_size", None) is not None:
        options["group_size"] = args.group_size
    return schedule_from_source(
        args.schedule,
        n_ranks=args.n_ranks,
        microbatches=args.microbatches,
        virtual=args.virtual,
        forward_only=args.forward_only,
        options=options,
    )


# -- costs -----------------------------------------------------------------------------
# flag -> (StageCost field, help). A comma-separated value gives one entry per stage.
_STAGE_FLAGS = {
    "forward_time": ("forward", "duration of F per stage and micro-batch (default 1)"),
    "backward_time": ("backward", "duration of a full backward B (default 2)"),
    "input_grad_time": ("input_grad", "duration of I, the input-gradient backward (default 1)"),
    "weight_grad_time": ("weight_grad", "duration of W, the weight-gradient backward (default 1)"),
    "overlap_time": ("overlap", "duration of an overlapped F&B pair (default: the sum)"),
    "activation_bytes": ("activation_bytes", "activation bytes one micro-batch holds per stage"),
    "weight_grad_bytes": (
        "weight_grad_bytes",
        "bytes a micro-batch holds per stage from the end of I until W ends: the "
        "matmul inputs W needs and the output gradients I hands it (may exceed the "
        "activation bytes); default 16/17 of the activation bytes, Qi et al. 2024's "
        "M_W/M_B = 32sbh/34sbh per transformer layer (Table 1, attention scores not "
        "stored)",
    ),
    "message_bytes": ("output_bytes", "bytes sent to the next stage per micro-batch"),
    "param_bytes": ("param_bytes", "parameter bytes per stage (reported, not simulated)"),
    "optimizer_time": (
        "optimizer",
        "duration of a stage's optimizer step, run between training iterations (--steps; "
        "default 0)",
    ),
}


def add_cost_arguments(parser: argparse.ArgumentParser) -> None:
    """The cost flags (docs/architecture.md, "Vocabulary") and ``--costs FILE``."""
    group = parser.add_argument_group(
        "costs",
        "per stage and per micro-batch (a stage of an interleaved rank is one chunk); "
        "a comma-separated list gives one value per stage. Times (T) are in --time-unit "
        "units, bandwidths in bytes per time unit; sizes (SIZE) are bytes or a number with "
        "a unit, any case: B, KB, MB, GB, TB (1000-based) or KiB, MiB, GiB, TiB "
        "(1024-based), so 80GiB = 80 * 2^30 bytes and 80GB = 80 * 10^9",
    )
    group.add_argument("--costs", metavar="FILE", help="a JSON cost file (instead of the flags)")
    for flag, (_, text) in _STAGE_FLAGS.items():
        # Every size goes through one parser, pipesim.units.parse_bytes.
        metavar = "SIZE[,SIZE...]" if flag.endswith("_bytes") else "T[,T...]"
        value_argument(group, "--" + flag.replace("_", "-"), metavar=metavar, help=text)
    value_argument(
        group,
        "--sync-time",
        metavar="T",
        help="time of the optimizer's synchronization between iterations (--steps): the "
        "gradient-norm all-reduce of --optimizer-sync global, one rank-to-rank hop of "
        "post-validation (default 0)",
    )
    value_argument(
        group, "--link-latency", metavar="T", help="link latency, in time units (default 0)"
    )
    value_argument(
        group,
        "--link-bandwidth",
        metavar="BYTES_PER_T",
        help="link bandwidth in bytes per time unit: 450e9 for 450 GB/s with --time-unit s, "
        "450e6 with ms (default: unlimited)",
    )
    group.add_argument(
        "--link-concurrency",
        type=positive_int,
        metavar="K",
        help="messages one link direction carries at once (default 1)",
    )
    group.add_argument(
        "--ranks-per-node",
        type=RANKS,
        metavar="N",
        help="ranks k*N .. k*N+N-1 share node k: the --link-* flags describe links inside a "
        "node, the --inter-node-* flags links between nodes",
    )
    value_argument(
        group,
        "--inter-node-latency",
        metavar="T",
        help="latency between nodes, in time units (default: --link-latency)",
    )
    value_argument(
        group,
        "--inter-node-bandwidth",
        metavar="BYTES_PER_T",
        help="bandwidth between nodes, in bytes per time unit (default: --link-bandwidth)",
    )
    value_argument(
        group,
        "--memory-capacity",
        metavar="SIZE",
        help="device memory capacity for the peak check (a SIZE: 80GiB, 85899345920)",
    )
    group.add_argument(
        "--blocking-sends",
        "--no-overlap-comm",  # the old spelling
        dest="blocking_sends",
        action="store_true",
        help="a send holds its rank until its message arrives (gloo's blocking send); "
        "--no-overlap-comm is the old spelling",
    )
    group.add_argument(
        "--time-unit",
        choices=TIME_UNITS,
        help="what one time value stands for: `unit` for abstract slots (the default), or "
        "s, ms, us, ns; a cost file may name its own (pipesim verify writes ns)",
    )


def add_require_fit_argument(parser: argparse._ActionsContainer, /, *, failing: str) -> None:
    """``--require-fit``: exit 1 when the memory does not fit (for CI); see
    :func:`require_fit`. ``simulate`` and ``plan`` share it; ``failing`` says when."""
    parser.add_argument(
        "--require-fit",
        action="store_true",
        help=f"exit with status 1 when {failing}, after printing the result; for CI "
        "(without it a result that does not fit exits 0)",
    )


def require_fit(args: argparse.Namespace, fits: bool | None, /, *, failure: str) -> None:
    """With ``--require-fit``: a PipesimError (exit 1) unless ``fits`` is True.

    ``fits`` None means no capacity was known, which cannot satisfy the check either.
    ``failure`` says what did not fit, for the message.
    """
    if not getattr(args, "require_fit", False) or fits:
        return
    if fits is None:
        raise PipesimError(
            "--require-fit needs a memory capacity to check against; give --memory-capacity "
            "SIZE (or memory_capacity_bytes in the cost file)"
        )
    raise PipesimError(f"--require-fit: {failure}")


def costs_from_args(args: argparse.Namespace, schedule: Schedule) -> CostModel:
    """The cost model of the flags (or ``--costs``), sized for ``schedule``."""
    return costs_for_stages(args, schedule.n_stages)


def costs_for_stages(args: argparse.Namespace, n_stages: int) -> CostModel:
    """The cost model of the flags (or ``--costs``), sized for ``n_stages`` stages."""
    flag_names = [
        *_STAGE_FLAGS,
        "link_latency",
        "link_bandwidth",
        "link_concurrency",
        "ranks_per_node",
        "inter_node_latency",
        "inter_node_bandwidth",
        "memory_capacity",
        "sync_time",
    ]
    given = [n for n in flag_names if getattr(args, n, None) is not None]
    if args.blocking_sends:
        given.append("blocking_sends")
    unit = getattr(args, "time_unit", None)
    if args.costs is not None:
        if given:
            flags = ", ".join("--" + n.replace("_", "-") for n in given)
            raise PipesimError(
                f"give either --costs or cost flags, not both (got --costs and {flags})"
            )
        costs = load_costs(args.costs).for_stages(n_stages)
        if unit is None or unit == costs.time_unit:
            return costs
        if costs.time_unit != "unit":
            raise PipesimError(
                f"--time-unit {unit} disagrees with {args.costs!r}, whose times are in "
                f"{costs.time_unit}; drop --time-unit"
            )
        return replace(costs, time_unit=unit)
    per_stage: list[dict[str, Any]] = [{} for _ in range(n_stages)]
    for flag, (field_name, _) in _STAGE_FLAGS.items():
        raw = getattr(args, flag, None)
        if raw is None:
            continue
        values = list(raw)  # one value per stage, read when the flags were parsed
        if len(values) == 1:
            values = values * n_stages
        if len(values) != n_stages:
            raise CostError(
                f"--{flag.replace('_', '-')} has {len(values)} values but the schedule has "
                f"{n_stages} stages; give one value, or exactly one per stage"
            )
        for stage, value in enumerate(values):
            per_stage[stage][field_name] = value
    stages = []
    for stage, fields in enumerate(per_stage):
        try:
            stages.append(StageCost(**fields))
        except CostError as exc:
            raise CostError(f"stage {stage}: {exc}") from None
    link = Link(
        latency=args.link_latency if args.link_latency is not None else 0,
        bandwidth_bytes_per_s=args.link_bandwidth,
        max_concurrent=args.link_concurrency if args.link_concurrency is not None else 1,
    )
    return CostModel(
        stages=tuple(stages),
        link=link,
        links=_node_links(args, link),
        memory_capacity_bytes=args.memory_capacity,
        blocking_sends=args.blocking_sends,
        time_unit=unit or "unit",
        sync_time=getattr(args, "sync_time", None) or 0,
    )


def add_iteration_arguments(parser: argparse.ArgumentParser) -> None:
    """``--steps K`` and ``--optimizer-sync`` (:mod:`pipesim.iterations`)."""
    from pipesim.iterations import DEFAULT_SYNC, SYNCS

    group = parser.add_argument_group(
        "training iterations",
        "run K iterations back to back, each a step of the schedule and then every rank's "
        "optimizer step (--optimizer-time, --sync-time); also reports the steady-state "
        "iteration period (docs/steady-state.md)",
    )
    group.add_argument(
        "--steps",
        type=whole_number(maximum=10_000),
        metavar="K",
        help="training iterations to simulate (default: one step, no optimizer)",
    )
    group.add_argument(
        "--optimizer-sync",
        choices=SYNCS,
        help=f"when a rank steps its optimizer: global (default, Megatron-LM's: after every "
        "rank's backward and the gradient-norm all-reduce), post-validation (the zero-bubble "
        "paper's: the partial norm passed rank to rank, checked during the next warm-up), "
        f"none (each rank on its own); default {DEFAULT_SYNC}",
    )


def iterations_from_args(args: argparse.Namespace, schedule: Schedule, costs: CostModel) -> Any:
    """The :class:`pipesim.iterations.Iterations` the flags ask for, or None when neither
    ``--steps`` nor ``--optimizer-sync`` is given (one step, as before)."""
    from pipesim.iterations import DEFAULT_SYNC, simulate_iterations

    steps, sync = getattr(args, "steps", None), getattr(args, "optimizer_sync", None)
    if steps is None and sync is None:
        return None
    return simulate_iterations(schedule, costs=costs, steps=steps or 1, sync=sync or DEFAULT_SYNC)


def check_suffix(path: str, suffixes: tuple[str, ...], /, *, verb: str, what: str) -> str:
    """The lower-case suffix of ``path`` when it is one of ``suffixes``; otherwise a
    PipesimError naming the suffixes (an output format is chosen by suffix, or refused,
    never guessed).

    >>> check_suffix("a/plot.PNG", (".html", ".png"), verb="plot", what="a picture")
    '.png'
    """
    suffix = Path(path).suffix.lower()
    if suffix not in suffixes:
        raise PipesimError(
            f"pipesim {verb} writes {what}; give -o a name ending in {' or '.join(suffixes)}, "
            f"got {path!r}"
        )
    return suffix


def _node_links(args: argparse.Namespace, link: Link) -> Links | None:
    """``--ranks-per-node`` and the ``--inter-node-*`` flags as a Links rule."""
    inter_latency = getattr(args, "inter_node_latency", None)
    inter_bandwidth = getattr(args, "inter_node_bandwidth", None)
    ranks_per_node = getattr(args, "ranks_per_node", None)
    if ranks_per_node is None:
        if inter_latency is not None or inter_bandwidth is not None:
            raise CostError(
                "--inter-node-latency and --inter-node-bandwidth need --ranks-per-node N "
                "(which ranks share a node)"
            )
        return None
    inter = replace(
        link,
        latency=inter_latency if inter_latency is not None else link.latency,
        bandwidth_bytes_per_s=(
            inter_bandwidth if inter_bandwidth is not None else link.bandwidth_bytes_per_s
        ),
    )
    return Links(ranks_per_node=ranks_per_node, intra_node=link, inter_node=inter)


def print_json(data: object) -> None:
    """Print ``data`` as indented JSON on stdout."""
    print(json.dumps(data, indent=2))
