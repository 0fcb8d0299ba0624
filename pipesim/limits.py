"""The documented limits: every input is refused up front, naming the limit, when it is
larger than pipesim can read, check and simulate in bounded time and memory.

Work and memory grow with what an input really holds (its actions, its bytes), never
with the magnitude of a number written in it: a two-line CSV naming stage 10^25, a
``--microbatches 100000000000`` or a cost of ``1e99999999`` is refused at once with
the limit it passes, instead of allocating or computing without bound.

============================  =================  ========================================
limit                         value              what it bounds
============================  =================  ========================================
``MAX_RANKS``                 4 096              ranks (devices) of one pipeline
``MAX_STAGES``                65 536             stages (ranks x virtual stages per rank)
``MAX_MICROBATCHES``          1 000 000          micro-batches of one step
``MAX_ACTIONS``               10 000 000         simple actions in one schedule
``MAX_SWEEP_ACTIONS``         1 000 000 000      simple actions a ``pipesim plan`` sweep
                                                 simulates, all configurations together
``MAX_LAYERS``                1 024              transformer layers of a model to plan
``MAX_DEVICES``               1 000 000          devices of a plan
``MAX_INDEX_DIGITS``          9                  digits of a stage or micro-batch index
``MAX_NUMBER_DIGITS``         40                 digits of a cost value's exact numerator
                                                 and denominator (and of its text)
``MAX_DENOMINATOR_DIGITS``    100                digits of the common denominator of a
                                                 cost model's times
``MAX_FILE_BYTES``            256 MiB            size of a file pipesim reads
``MAX_JSON_DEPTH``            64                 nesting of arrays and objects in JSON
============================  =================  ========================================

>>> check_range(5, name="--pipeline-parallel", maximum=MAX_RANKS, limit="MAX_RANKS")
5
>>> check_range(10**25, name="stage", maximum=MAX_STAGES - 1, limit="MAX_STAGES")
Traceback (most recent call last):
...
pipesim.errors.LimitError: stage 10000000000000000000000000 is above pipesim's limit of \
65535 (MAX_STAGES in pipesim.limits); see docs/guide/limits.md
"""

from __future__ import annotations

import operator

from pipesim.errors import LimitError, PipesimError, brief

__all__ = [
    "MAX_ACTIONS",
    "MAX_DENOMINATOR_DIGITS",
    "MAX_DEVICES",
    "MAX_FILE_BYTES",
    "MAX_INDEX_DIGITS",
    "MAX_JSON_DEPTH",
    "MAX_LAYERS",
    "MAX_MICROBATCHES",
    "MAX_NUMBER_DIGITS",
    "MAX_RANKS",
    "MAX_STAGES",
    "MAX_SWEEP_ACTIONS",
    "as_int",
    "check_actions",
    "check_range",
]

#: Ranks (devices) of one pipeline. Real pipelines have tens to a few hundred.
MAX_RANKS = 4_096
#: Stages of one schedule: ranks times the stages each rank holds.
MAX_STAGES = 65_536
#: Micro-batches of one step.
MAX_MICROBATCHES = 1_000_000
#: Simple actions (F, B, I, W) in one schedule: about 1 KiB of memory each to simulate.
MAX_ACTIONS = 10_000_000
#: Simple actions one ``pipesim plan`` sweep simulates, summed over its configurations:
#: a hundred of the largest schedules (MAX_ACTIONS). The sweep's time grows with them; at
#: the planner's ~0.5 M actions per CPU-second (``plan`` of 1f1b and interleaved 1F1B,
#: 8 ranks, 40 000 micro-batches, one worker, on the 2-core development machine at load
#: 4) this is about half an hour of CPU, the default 600 s ``--timeout`` on three cores,
#: so a sweep past it is refused up front instead of being timed out.
MAX_SWEEP_ACTIONS = 100 * MAX_ACTIONS
#: Transformer layers of a model given to ``pipesim plan`` (real models have < 200).
MAX_LAYERS = 1_024
#: Devices of a capacity plan (pipeline times data parallel).
MAX_DEVICES = 1_000_000
#: Digits of one stage or micro-batch index in an action string such as ``0F3``.
MAX_INDEX_DIGITS = 9
#: Digits of a cost value's exact numerator and of its denominator (10**40 is
#: refused, 1e-39 and 123456789/987654321 are fine); also the most digits its
#: text may spell.
MAX_NUMBER_DIGITS = 40
#: Digits of the common denominator of a cost model's times (durations, latency,
#: bytes / bandwidth): exact sums stay fast while it is this small.
MAX_DENOMINATOR_DIGITS = 100
#: Bytes of one file read (schedules, costs, models, accelerators).
MAX_FILE_BYTES = 256 * 1024 * 1024
#: Nesting of JSON arrays and objects (pipesim's own files nest 3 deep).
MAX_JSON_DEPTH = 64

_SEE = "see docs/guide/limits.md"


def as_int(value: object) -> int | None:
    """``value`` as a plain int when it is an integer (int, numpy integer, anything with
    ``__index__``), else None; bool is not an integer here.

    >>> as_int(3), as_int(True), as_int(2.0), as_int("3")
    (3, None, None, None)
    """
    if isinstance(value, bool):
        return None
    if type(value) is int:
        return value
    try:
        return operator.index(value)  # type: ignore[arg-type]
    except TypeError:
        return None


def check_range(
    value: int,
    *,
    name: str,
    maximum: int,
    limit: str,
    error: type[PipesimError] = LimitError,
) -> int:
    """``value`` when it is at most ``maximum``; ``error`` (a LimitError unless the
    caller's kind of error fits better) naming ``limit`` otherwise."""
    if value > maximum:
        raise error(
            f"{name} {brief(value)} is above pipesim's limit of {maximum} ({limit} in "
            f"pipesim.limits); {_SEE}"
        )
    return value


def check_actions(count: int, *, what: str) -> None:
    """Refuse a schedule of more than :data:`MAX_ACTIONS` simple actions.

    >>> check_actions(4 * 10**6 * 3, what="1f1b with 4 ranks and 4000000 micro-batches")
    Traceback (most recent call last):
    ...
    pipesim.errors.LimitError: 1f1b with 4 ranks and 4000000 micro-batches has at least \
12000000 actions, above pipesim's limit of 10000000 (MAX_ACTIONS in pipesim.limits); use fewer \
ranks or micro-batches
    """
    if count > MAX_ACTIONS:
        raise LimitError(
            f"{what} has at least {count} actions, above pipesim's limit of {MAX_ACTIONS} "
            "(MAX_ACTIONS in pipesim.limits); use fewer ranks or micro-batches"
        )
