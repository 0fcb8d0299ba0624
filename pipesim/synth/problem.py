"""What a synthesis is asked: ranks, placement, micro-batches, costs and a memory limit.

A :class:`Problem` fixes everything a schedule of split backwards (F, I, W)
depends on; every method of :mod:`pipesim.synth` (the greedy heuristic, the
lower bound, the exact solver) reads the same object, so the rules are
written once.

Memory limit (``memory_limit``): a per-rank ceiling on activation bytes, in
the engine's model (:mod:`pipesim.step.memory`: F allocates its stage's
``activation_bytes`` at its start, I turns them into the ``weight_grad_bytes``
W needs, output gradients included, W frees those). :func:`parse_memory_limit`
reads it as

- a number of micro-batches (``8``, ``2.5``, ``16/3``): that many times the
  most one micro-batch holds on *each rank* in that model
  (:func:`pipesim.step.memory.microbatch_peak` summed over the stages the rank
  holds; with ``virtual = 2`` one micro-batch is both chunks), the unit of Qi
  et al.'s ``p M_B`` and ``(2p - 1) M_B``. That is ``activation_bytes`` unless
  ``weight_grad_bytes`` is larger: then a micro-batch between I and W holds
  more than ``M_B`` and Qi et al.'s ``M_W <= M_B`` (their Table 1) no longer
  holds, so a limit of ``p`` activations would not fit ZB-H1 (a rank holding
  one micro-batch before I and ``p - 1`` after it needs
  ``act + (p - 1) * weight_grad_bytes``); counted in peaks, ZB-H1's ``p``
  micro-batches in flight fit ``p`` and ZB-H2's ``2p - 1`` fit ``2p``;
- bytes with a unit (``512MiB``, ``20GB``, ``1e9B``), read by
  :func:`pipesim.units.parse_bytes` as every size pipesim reads.

When the cost model gives no activation bytes at all, pipesim counts each
stage's activations as 1 byte held from F to W (``weight_grad_bytes`` 1), so a
limit in micro-batches still means what it says.

>>> parse_memory_limit("8")
MemoryLimit(microbatches=Fraction(8, 1), n_bytes=None)
>>> parse_memory_limit("1.5GiB").n_bytes
1610612736
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from fractions import Fraction

from pipesim.actions import Action, Op, Overlap
from pipesim.costs import CostModel, StageCost, require_eager
from pipesim.errors import CostError, PipesimError, ScheduleError, brief
from pipesim.exact import Time, to_fraction
from pipesim.limits import MAX_MICROBATCHES, MAX_RANKS, MAX_STAGES, check_actions, check_range
from pipesim.schedules.zbv import v_placement
from pipesim.step.cost_tables import cost_tables
from pipesim.step.memory import microbatch_peak
from pipesim.units import parse_bytes

__all__ = ["PLACEMENTS", "MemoryLimit", "Problem", "make_problem", "parse_memory_limit"]

#: Stage -> rank layouts the synthesizer knows (``--placement``).
PLACEMENTS = ("looped", "v")


@dataclass(frozen=True, slots=True, kw_only=True)
class MemoryLimit:
    """A per-rank activation-memory ceiling: micro-batches or bytes (exactly one)."""

    microbatches: Fraction | None = None
    """Micro-batches of the rank's own activations."""
    n_bytes: int | None = None
    """Bytes."""

    def __post_init__(self) -> None:
        if (self.microbatches is None) == (self.n_bytes is None):
            raise CostError("a memory limit is either micro-batches or bytes, give exactly one")
        if self.microbatches is not None and self.microbatches <= 0:
            raise CostError(f"the memory limit must be positive, got {self.microbatches}")
        if self.n_bytes is not None and self.n_bytes <= 0:
            raise CostError(f"the memory limit must be positive, got {self.n_bytes} bytes")

    def __str__(self) -> str:
        if self.microbatches is not None:
            return f"{self.microbatches} micro-batches"
        return f"{self.n_bytes:,} bytes"


def parse_memory_limit(
    text: str | int | Fraction | MemoryLimit, /, *, name: str = "the memory limit"
) -> MemoryLimit:
    """Read ``8``, ``2.5``, ``16/3`` (micro-batches) or ``512MiB`` / ``2e9B`` (bytes, read
    by :func:`pipesim.units.parse_bytes`, as every size pipesim reads); an error names
    ``name`` (the CLI passes the flag, ``--memory-limit``).

    >>> parse_memory_limit("-3", name="--memory-limit")
    Traceback (most recent call last):
    ...
    pipesim.errors.CostError: --memory-limit must be positive, got '-3'; give a number of \
micro-batches without a unit (8, 2.5, 16/3) or a size with a unit (20GiB, 20GB)
    """
    if isinstance(text, MemoryLimit):
        return text
    if isinstance(text, int | Fraction) and not isinstance(text, bool):
        return MemoryLimit(microbatches=Fraction(text))
    raw = str(text).strip()
    microbatches = "a number of micro-batches without a unit (8, 2.5, 16/3)"
    if raw[-1:].isalpha():  # a unit: bytes
        n_bytes = parse_bytes(raw, name=name, minimum=1, plain=microbatches)
        return MemoryLimit(n_bytes=n_bytes)
    try:
        value = to_fraction(raw, name=name)
    except CostError:
        # Not a number either: parse_bytes refuses it too, naming every accepted form.
        parse_bytes(raw, name=name, plain=microbatches)
        raise
    if value <= 0:
        raise CostError(
            f"{name} must be positive, got {brief(raw)}; give {microbatches} or a size with "
            "a unit (20GiB, 20GB)"
        )
    return MemoryLimit(microbatches=value)


@dataclass(frozen=True, slots=True, kw_only=True)
class Problem:
    """One synthesis problem, sized and checked (use :func:`make_problem`)."""

    n_ranks: int
    virtual: int
    placement: tuple[int, ...]
    """``placement[stage]`` is its rank."""
    placement_name: str
    n_microbatches: int
    costs: CostModel
    """The user's costs, one entry per stage."""
    memory_costs: CostModel
    """``costs``, or with 1-byte activations when the user gave none (see the module)."""
    limit: MemoryLimit
    limit_bytes: tuple[int, ...]
    """Per rank: the most activation bytes it may hold (in ``memory_costs``)."""
    overlap_fb: bool = False
    """Whether a rank may run a forward of one chunk and the full backward of its other
    chunk as one overlapped unit (DualPipe's F&B pair, :class:`pipesim.actions.Overlap`,
    priced by ``StageCost.overlap``); V placement only."""

    @property
    def n_stages(self) -> int:
        """``n_ranks * virtual``."""
        return len(self.placement)

    def stages_of(self, rank: int) -> tuple[int, ...]:
        """The stages ``rank`` holds, ascending."""
        return tuple(s for s, r in enumerate(self.placement) if r == rank)

    def microbatch_bytes(self, rank: int) -> int:
        """The unit of a limit in micro-batches: the most one micro-batch holds on each
        of ``rank``'s stages, summed (:func:`pipesim.step.memory.microbatch_peak`)."""
        return sum(microbatch_peak(self.memory_costs.stage(s)) for s in self.stages_of(rank))


def durations_of(problem: Problem, /) -> list[Time]:
    """Per action code (:func:`pipesim.actions.action_code`): compute plus the dispatch
    and message overheads (:func:`pipesim.step.cost_tables.cost_tables`, the engine's own
    table)."""
    tables = cost_tables(
        problem.costs,
        n_stages=problem.n_stages,
        forward_only=False,
        placement=problem.placement,
    )
    return list(tables.durations)


def fb_pairs(problem: Problem, /) -> dict[tuple[int, int], Time]:
    """Per ``(forward stage, backward stage)`` pair a rank may overlap (its two chunks, either
    way round; none without ``overlap_fb``): the pair's duration as the engine takes it
    (:func:`pipesim.step.cost_tables.cost_tables`: ``StageCost.overlap`` of the forward's
    stage, else the parts' sum, one dispatch, the parts' message overheads).

    >>> from pipesim.costs import CostModel
    >>> costs = CostModel.uniform(forward=2, backward=4, overlap=5)
    >>> pb = make_problem(n_ranks=2, n_microbatches=2, memory_limit=2, virtual=2,
    ...                   placement="v", overlap_fb=True, costs=costs)
    >>> fb_pairs(pb)
    {(0, 3): 5, (3, 0): 5, (1, 2): 5, (2, 1): 5}
    """
    if not problem.overlap_fb:
        return {}
    keys = []
    for rank in range(problem.n_ranks):
        first, second = problem.stages_of(rank)
        keys += [(first, second), (second, first)]
    overlaps = [
        Overlap(
            parts=(
                Action(stage=f, op=Op.F, microbatch=0),
                Action(stage=b, op=Op.B, microbatch=0),
            )
        )
        for f, b in keys
    ]
    tables = cost_tables(
        problem.costs,
        n_stages=problem.n_stages,
        forward_only=False,
        overlaps=overlaps,
        placement=problem.placement,
    )
    base = 4 * problem.n_stages
    return {key: tables.durations[base + j] for j, key in enumerate(keys)}


def make_problem(
    *,
    n_ranks: int,
    n_microbatches: int,
    costs: CostModel | None = None,
    memory_limit: str | int | Fraction | MemoryLimit,
    virtual: int = 1,
    placement: str = "looped",
    overlap_fb: bool = False,
) -> Problem:
    """Check and size a synthesis problem.

    >>> pb = make_problem(n_ranks=4, n_microbatches=8, memory_limit=4)
    >>> pb.limit_bytes
    (4, 4, 4, 4)
    >>> v = make_problem(n_ranks=2, n_microbatches=4, memory_limit=2, virtual=2, placement="v")
    >>> v.placement
    (0, 1, 1, 0)
    """
    _check_sizes(n_ranks=n_ranks, n_microbatches=n_microbatches, virtual=virtual)
    stage_ranks = _stage_ranks(n_ranks, virtual=virtual, placement=placement, overlap_fb=overlap_fb)
    costs = (costs or CostModel()).for_stages(len(stage_ranks))
    require_eager(costs, evaluator="pipesim synth")
    memory_costs = _memory_costs(costs)
    limit = parse_memory_limit(memory_limit)
    limit_bytes = tuple(
        _rank_limit_bytes(
            limit,
            rank=rank,
            held=[memory_costs.stage(s) for s, r in enumerate(stage_ranks) if r == rank],
            costs_give_bytes=memory_costs is costs,
        )
        for rank in range(n_ranks)
    )
    return Problem(
        n_ranks=n_ranks,
        virtual=virtual,
        placement=stage_ranks,
        placement_name=placement,
        n_microbatches=n_microbatches,
        costs=costs,
        memory_costs=memory_costs,
        limit=limit,
        limit_bytes=limit_bytes,
        overlap_fb=overlap_fb,
    )


def _check_sizes(*, n_ranks: int, n_microbatches: int, virtual: int) -> None:
    """Whole numbers >= 1 within the documented limits, before anything is built."""
    for name, value in (
        ("n_ranks", n_ranks),
        ("n_microbatches", n_microbatches),
        ("virtual", virtual),
    ):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ScheduleError(f"{name} must be a whole number >= 1, got {brief(value)}")
    # A synthesised schedule splits every backward into I and W, three actions per stage
    # and micro-batch.
    check_range(n_ranks, name="n_ranks", maximum=MAX_RANKS, limit="MAX_RANKS")
    check_range(
        n_microbatches, name="n_microbatches", maximum=MAX_MICROBATCHES, limit="MAX_MICROBATCHES"
    )
    check_range(n_ranks * virtual, name="stages", maximum=MAX_STAGES, limit="MAX_STAGES")
    check_actions(
        3 * n_ranks * virtual * n_microbatches,
        what=f"a synthesised schedule of {n_ranks} ranks x {virtual} stages x "
        f"{n_microbatches} micro-batches",
    )


def _stage_ranks(
    n_ranks: int, *, virtual: int, placement: str, overlap_fb: bool
) -> tuple[int, ...]:
    """``placement``'s rank of each stage; F&B pairs need the v placement."""
    if placement not in PLACEMENTS:
        raise ScheduleError(
            f"unknown placement {placement!r}; valid placements are: {', '.join(PLACEMENTS)}"
        )
    if placement == "v":
        if virtual != 2:
            raise ScheduleError(
                f"the v placement holds two stages per rank (rank r holds r and 2p-1-r), got "
                f"virtual={virtual}; pass --virtual 2"
            )
        return v_placement(n_ranks)
    if overlap_fb:
        raise ScheduleError(
            "overlapped F&B pairs join a forward of one chunk with a backward of the rank's "
            f"other chunk, which needs the v placement, got {placement!r}; pass --placement v "
            "--virtual 2, or drop --overlap-fb"
        )
    return tuple(stage % n_ranks for stage in range(n_ranks * virtual))


def _memory_costs(costs: CostModel) -> CostModel:
    """``costs``, or with 1-byte activations held from F to W when it gives none (so a
    limit in micro-batches still means what it says)."""
    if all(s.activation_bytes == 0 for s in costs.stages):
        return replace(
            costs,
            stages=tuple(replace(s, activation_bytes=1, weight_grad_bytes=1) for s in costs.stages),
        )
    return costs


def _rank_limit_bytes(
    limit: MemoryLimit, *, rank: int, held: list[StageCost], costs_give_bytes: bool
) -> int:
    """The most activation bytes ``rank`` may hold, holding the stages ``held``; refused
    below one micro-batch, or in bytes when the cost model gives none (``costs_give_bytes``)."""
    one = sum(microbatch_peak(cost) for cost in held)
    if limit.n_bytes is not None:
        if not costs_give_bytes:
            raise PipesimError(
                f"a memory limit in bytes ({limit}) needs activation bytes in the cost "
                "model; give --activation-bytes (and --weight-grad-bytes), or a limit in "
                "micro-batches"
            )
        allowed = limit.n_bytes
    else:
        assert limit.microbatches is not None
        allowed = math.floor(limit.microbatches * one)
    if allowed < one:
        raise PipesimError(
            f"the memory limit {limit} is below one micro-batch (the most it holds) on rank "
            f"{rank} ({one:,} bytes): no schedule fits; raise --memory-limit to at least "
            "1 micro-batch"
        )
    return allowed
