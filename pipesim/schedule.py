"""The Schedule: what every rank runs, in which order, and where each stage lives.

A :class:`Schedule` is the intermediate representation every part of pipesim
shares: generators emit one, files load into one, the engine simulates one,
``verify`` replays exactly one. It holds

- ``orders``: for each rank, the ordered actions it runs;
- ``placement``: for each stage, the rank that holds it (``placement[stage]``);
- ``n_microbatches``;
- ``happens_before``: optional extra cross-rank ordering constraints
  ``(a, b)`` meaning *b starts only after a ends*. Per-rank orders cannot say
  "rank 0 waits until micro-batch 0 has left the last stage"; a single
  controller driving plain model parallelism (the ``sequential`` schedule) does
  exactly that. Torch's CSV cannot carry them.

The constructor only checks the shape of the value; whether the schedule is
complete, consistent and deadlock-free is :func:`pipesim.graph.validate`'s job.

>>> s = Schedule.from_orders([["0F0", "0F1", "0B0", "0B1"], ["1F0", "1B0", "1F1", "1B1"]])
>>> s.n_ranks, s.n_stages, s.n_microbatches
(2, 2, 2)
>>> [str(a) for a in s.orders[1]]
['1F0', '1B0', '1F1', '1B1']
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import cast

from pipesim.actions import Action, Op, Overlap, Work, parse_action
from pipesim.errors import ScheduleError, and_more, brief
from pipesim.limits import (
    MAX_MICROBATCHES,
    MAX_RANKS,
    MAX_STAGES,
    as_int,
    check_actions,
    check_range,
)

__all__ = ["Schedule"]

# What an order may hold; a tuple, not ``Action | Overlap``, so no union is built per test.
_WORK_TYPES = (Action, Overlap)
_PLAIN = {Action, Overlap}


@dataclass(frozen=True, slots=True, kw_only=True)
class Schedule:
    """Per-rank action orders plus the stage -> rank placement."""

    orders: tuple[tuple[Work, ...], ...]
    """For each rank, the units of work it runs, in order."""
    placement: tuple[int, ...]
    """``placement[stage]`` is the rank that holds ``stage``."""
    n_microbatches: int
    """How many micro-batches one step processes."""
    name: str = "custom"
    """The generator that made it, or ``custom``."""
    happens_before: tuple[tuple[Action, Action], ...] = ()
    """Extra ``(a, b)`` constraints: ``b`` starts only after ``a`` ends."""
    n_copies: int = 1
    """Independent copies of the model the stages form (DualPipe keeps two).

    The stages split into ``n_copies`` equal runs of consecutive stages; copy
    ``c`` is a pipeline of its own (its first stage reads the input, its last
    computes the loss) and processes the ``n_microbatches / n_copies``
    micro-batches ``c * k .. (c + 1) * k - 1``. With 1 (the default) every
    stage processes every micro-batch.
    """

    def __post_init__(self) -> None:
        self._check_shapes()
        if not self.orders:
            raise ScheduleError("a schedule needs at least one rank, got an empty order list")
        if not self.placement:
            raise ScheduleError("a schedule needs at least one stage, got an empty placement")
        check_range(len(self.orders), name="ranks", maximum=MAX_RANKS, limit="MAX_RANKS")
        check_range(len(self.placement), name="stages", maximum=MAX_STAGES, limit="MAX_STAGES")
        object.__setattr__(
            self, "n_microbatches", _check_count("n_microbatches", self.n_microbatches)
        )
        check_range(
            self.n_microbatches,
            name="n_microbatches",
            maximum=MAX_MICROBATCHES,
            limit="MAX_MICROBATCHES",
        )
        if not all(type(rank) is int for rank in self.placement):  # numpy integers are fine
            object.__setattr__(self, "placement", _placement(self.placement))
        for stage, rank in enumerate(self.placement):
            if not 0 <= rank < len(self.orders):
                raise ScheduleError(
                    f"stage {stage} is placed on rank {brief(rank)}, but the schedule has "
                    f"{len(self.orders)} ranks (0..{len(self.orders) - 1}); fix the placement"
                )
        n_actions = 0
        for rank, order in enumerate(self.orders):
            if set(map(type, order)) <= {Action}:  # the common case, in bulk
                n_actions += len(order)
                continue
            for work in order:
                if type(work) is Action:
                    n_actions += 1
                elif isinstance(work, Action | Overlap):
                    n_actions += len(work.parts)
                else:
                    raise ScheduleError(f"rank {rank} order holds {brief(work)}, not an action")
        check_actions(n_actions, what=f"schedule {brief(self.name)}")
        object.__setattr__(self, "n_copies", _check_count("n_copies", self.n_copies))
        if len(self.placement) % self.n_copies or self.n_microbatches % self.n_copies:
            raise ScheduleError(
                f"n_copies={self.n_copies} must divide both the stages ({len(self.placement)}) "
                f"and the micro-batches ({self.n_microbatches}); each model copy gets an equal "
                "share of both"
            )

    def _check_shapes(self) -> None:
        """Lists become tuples; anything that is not a sequence is refused by name."""
        fields = (("orders", "one list of actions per rank"), ("placement", "one rank per stage"))
        for name, what in (*fields, ("happens_before", "(before, after) action pairs")):
            value = getattr(self, name)
            if not isinstance(value, tuple | list):
                raise ScheduleError(f"{name} must be a list of {what}, got {brief(value)}")
            object.__setattr__(self, name, tuple(value))
        if not all(type(order) is tuple for order in self.orders):
            if not all(isinstance(order, tuple | list) for order in self.orders):
                raise ScheduleError(
                    f"orders must hold one list of actions per rank, got {brief(self.orders)}"
                )
            object.__setattr__(self, "orders", tuple(tuple(order) for order in self.orders))
        for pair in self.happens_before:
            if not (
                isinstance(pair, tuple | list)
                and len(pair) == 2
                and all(isinstance(a, Action) for a in pair)
            ):
                raise ScheduleError(
                    f"each happens_before entry is a (before, after) pair of simple actions, "
                    f"got {brief(pair)}"
                )
        object.__setattr__(self, "happens_before", tuple(tuple(p) for p in self.happens_before))

    # -- construction -----------------------------------------------------------------
    @classmethod
    def from_orders(
        cls,
        orders: Sequence[Sequence[Work | str]],
        *,
        placement: Sequence[int] | None = None,
        n_microbatches: int | None = None,
        name: str = "custom",
        happens_before: Sequence[tuple[Action, Action]] = (),
        n_copies: int = 1,
    ) -> Schedule:
        """Build a schedule from per-rank lists of actions or action strings.

        Without ``placement`` each stage goes to the rank whose order mentions
        it (a stage found on two ranks is refused); without ``n_microbatches``
        it is one more than the largest micro-batch index used.
        """
        if not isinstance(orders, Sequence) or not all(isinstance(o, Sequence) for o in orders):
            raise ScheduleError(
                f"orders must be a list with one list of actions per rank, got {brief(orders)}"
            )
        parsed: tuple[tuple[Work, ...], ...] = tuple(
            tuple(cast("Sequence[Work]", order))
            if set(map(type, order)) <= _PLAIN  # nothing to parse, in bulk
            else tuple([w if isinstance(w, _WORK_TYPES) else parse_action(w) for w in order])
            for order in orders
        )
        if placement is None:
            placement = infer_placement(parsed)
        elif isinstance(placement, str | bytes | Mapping) or not isinstance(placement, Iterable):
            raise ScheduleError(
                f"placement must be a list with the rank of each stage, got {brief(placement)}"
            )
        if n_microbatches is None:
            used = [a.microbatch for order in parsed for w in order for a in w.parts]
            n_microbatches = max(used) + 1 if used else 0
        return cls(
            orders=parsed,
            placement=tuple(placement),
            n_microbatches=n_microbatches,
            name=name,
            happens_before=happens_before,  # type: ignore[arg-type]  # checked there
            n_copies=n_copies,
        )

    # -- derived facts ----------------------------------------------------------------
    @property
    def n_ranks(self) -> int:
        """Number of ranks (devices)."""
        return len(self.orders)

    @property
    def n_stages(self) -> int:
        """Number of stages (model slices); ``n_ranks * virtual`` when interleaved."""
        return len(self.placement)

    @property
    def forward_only(self) -> bool:
        """True when no rank runs any backward action (inference)."""
        return not any(a.op.is_backward for a in self.actions())

    @property
    def split_backward(self) -> bool:
        """True when backward is split into I and W actions (zero-bubble style)."""
        return any(a.op in (Op.I, Op.W) for a in self.actions())

    def actions(self) -> Iterator[Action]:
        """Every simple action of every rank, rank by rank, in order."""
        for order in self.orders:
            for work in order:
                yield from work.parts

    def copy_bounds(self, stage: int) -> tuple[range, range]:
        """The stages and the micro-batches of the model copy ``stage`` belongs to.

        >>> s = Schedule.from_orders([["0F0", "3F1"], ["1F0", "2F1"]], n_copies=2)
        >>> s.copy_bounds(3)
        (range(2, 4), range(1, 2))
        """
        stages = len(self.placement) // self.n_copies
        mbs = self.n_microbatches // self.n_copies
        copy = stage // stages
        return (
            range(copy * stages, (copy + 1) * stages),
            range(copy * mbs, (copy + 1) * mbs),
        )

    def stages_of(self, rank: int) -> tuple[int, ...]:
        """The stages held by ``rank``, ascending."""
        return tuple(s for s, r in enumerate(self.placement) if r == rank)

    def rank_of(self, stage: int) -> int:
        """The rank that holds ``stage``."""
        return self.placement[stage]


def infer_placement(orders: Sequence[Sequence[Work]]) -> tuple[int, ...]:
    """Stage -> rank from which rank's order mentions each stage.

    >>> infer_placement([[parse_action("0F0")], [parse_action("1F0")]])
    (0, 1)
    """
    owner: dict[int, int] = {}
    for rank, order in enumerate(orders):
        for work in order:
            for action in work.parts:
                previous = owner.setdefault(action.stage, rank)
                if previous != rank:
                    raise ScheduleError(
                        f"stage {action.stage} is placed on two ranks ({previous} and {rank}): "
                        f"action {action} appears on rank {rank}; each stage must live on "
                        "exactly one rank"
                    )
    if not owner:
        raise ScheduleError("cannot infer a placement: no rank runs any action")
    n_stages = max(owner) + 1
    if len(owner) < n_stages:
        # At most len(owner) + _LISTED stages are looked at: the work follows the actions
        # given, not the largest stage index named.
        missing = list(itertools.islice((s for s in range(n_stages) if s not in owner), _LISTED))
        raise ScheduleError(
            f"stages {missing}{and_more(len(missing), n_stages - len(owner))} appear "
            "in no rank's order, so their rank is unknown; give the placement explicitly or add "
            "their actions"
        )
    return tuple(owner[s] for s in range(n_stages))


_LISTED = 8  # stages named in one error message


def _check_count(name: str, value: object) -> int:
    count = as_int(value)
    if count is None or count < 1:
        raise ScheduleError(f"{name} must be a positive integer, got {brief(value)}")
    return count


def _placement(placement: Sequence[object]) -> tuple[int, ...]:
    ranks = []
    for stage, rank in enumerate(placement):
        index = as_int(rank)
        if index is None:
            raise ScheduleError(
                f"placement of stage {stage} must be a rank index, got {brief(rank)}"
            )
        ranks.append(index)
    return tuple(ranks)
