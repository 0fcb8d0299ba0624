"""Numbering a step's work: every unit of work's cost key and action key(s), and the
table from action key to node (:class:`pipesim.step.structure.StepStructure` keeps it).

An action's key is ``action_code(stage, op) * width + microbatch``: its *code*
``4 * stage + op index`` (:func:`pipesim.actions.action_code`, the cost key of a simple
action) times the micro-batch stride ``width`` (:func:`action_key`). An overlapped unit
(DualPipe's F&B pair) has a cost key of its own, ``4 * n_stages + j``, and one action key
per part.

>>> from pipesim.schedules import generate
>>> schedule = generate("1f1b", n_ranks=2, n_microbatches=2)
>>> works = [w for order in schedule.orders for w in order]
>>> numbering = number_works(schedule, works)
>>> numbering.width, list(numbering.keys), list(numbering.action_keys)
(2, [0, 0, 1, 1, 4, 5, 4, 5], [0, 1, 2, 3, 8, 10, 9, 11])
>>> numbering.table[10]  # 1B0 is node 5
5
"""

from __future__ import annotations

from array import array
from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol, cast

from pipesim.actions import N_OPS, OP_INDEX, Action, Overlap, Work, action_code
from pipesim.schedule import Schedule

__all__ = [
    "KeyTable",
    "Numbering",
    "SparseKeys",
    "action_key",
    "node_of_action",
    "number_works",
    "part_keys",
    "part_of",
]


class KeyTable(Protocol):
    """Action key -> node, -1 for a key no rank runs (see ``StepStructure.node_at``)."""

    def __getitem__(self, key: int, /) -> int: ...  # pragma: no cover

    def __len__(self) -> int: ...  # pragma: no cover


class SparseKeys(dict[int, int]):
    """A :class:`KeyTable` for keys too spread out for a dense array (a mistyped
    micro-batch of 10**6 in a four-action file): a dict answering -1 for an absent key."""

    __slots__ = ()

    def __missing__(self, key: int) -> int:
        return -1


_DENSE_SLOTS = 8  # a dense key table may take this many slots per action before a dict


@dataclass(frozen=True, slots=True, kw_only=True)
class Numbering:
    """Each work's action key(s) and the key -> node table (while building a structure)."""

    width: int
    keys: array[int]
    """Per node, its cost key (see ``StepStructure.keys``)."""
    action_keys: array[int]
    """Per node, its action key; -1 for an overlapped unit (its parts: ``overlap_keys``)."""
    overlap_keys: dict[int, tuple[int, ...]]
    """Per overlapped node, the action keys of its parts, in order."""
    overlaps: tuple[Overlap, ...]
    table: KeyTable
    n_keys: int


def action_key(action: Action, width: int) -> int:
    """The key of ``action`` at micro-batch stride ``width``."""
    return action_code(action.stage, action.op) * width + action.microbatch


def part_keys(work: Work, width: int) -> tuple[int, ...]:
    return tuple(action_key(a, width) for a in work.parts)


def number_works(schedule: Schedule, works: Sequence[Work]) -> Numbering:
    """Give every work its cost key and action key(s), and index the keys."""
    if not set(map(type, works)) <= {Action}:
        widest = max((a.microbatch for work in works for a in work.parts), default=0)
        return _number_each(schedule, works, max(schedule.n_microbatches, 1 + widest))
    actions = cast("Sequence[Action]", works)
    microbatches = [action.microbatch for action in actions]
    # A micro-batch past n_microbatches (an invalid schedule) widens the stride.
    width = max(schedule.n_microbatches, 1 + max(microbatches, default=0))
    # action_code and action_key inlined, in bulk: this runs once per action of the step.
    op_index, n_ops = OP_INDEX, N_OPS
    codes = [n_ops * action.stage + op_index[action.op] for action in actions]
    keys = array("l", codes)
    action_keys = array("l", [c * width + mb for c, mb in zip(codes, microbatches, strict=True)])
    size = _table_size(action_keys, {}, width)
    table: array[int] | SparseKeys
    if size:
        table = array("l", [-1]) * size
        # Assigned last to first, so that the first node of a duplicated key keeps it.
        deque(map(table.__setitem__, reversed(action_keys), range(len(works) - 1, -1, -1)), 0)
        n_keys = size - table.count(-1)
    else:
        table = SparseKeys(zip(reversed(action_keys), range(len(works) - 1, -1, -1), strict=True))
        n_keys = len(table)
    return Numbering(
        width=width,
        keys=keys,
        action_keys=action_keys,
        overlap_keys={},
        overlaps=(),
        table=table,
        n_keys=n_keys,
    )


def _number_each(schedule: Schedule, works: Sequence[Work], width: int) -> Numbering:
    """:func:`number_works` work by work, for a schedule with overlapped units."""
    keys, action_keys = array("l"), array("l")
    overlaps: list[Overlap] = []
    overlap_keys: dict[int, tuple[int, ...]] = {}
    overlap_base = N_OPS * schedule.n_stages
    for node, work in enumerate(works):
        if type(work) is Action:
            code = action_code(work.stage, work.op)
            keys.append(code)
            action_keys.append(code * width + work.microbatch)
            continue
        keys.append(overlap_base + len(overlaps))
        action_keys.append(-1)
        overlaps.append(work)  # type: ignore[arg-type]
        overlap_keys[node] = part_keys(work, width)
    size = _table_size(action_keys, overlap_keys, width)
    table: array[int] | SparseKeys = array("l", [-1]) * size if size else SparseKeys()
    n_keys = 0
    for node, key in enumerate(action_keys):
        for part_key in overlap_keys[node] if key < 0 else (key,):
            if table[part_key] < 0:
                table[part_key] = node
                n_keys += 1
    return Numbering(
        width=width,
        keys=keys,
        action_keys=action_keys,
        overlap_keys=overlap_keys,
        overlaps=tuple(overlaps),
        table=table,
        n_keys=n_keys,
    )


def _table_size(
    action_keys: array[int], overlap_keys: Mapping[int, tuple[int, ...]], width: int
) -> int:
    """The size of a dense key table, with room past the largest key for every
    prerequisite key (a prerequisite's code is less than 8 above); 0 when the keys are
    too spread out for one (a dict then)."""
    largest = max((max(k) for k in overlap_keys.values()), default=-1)
    largest = max(largest, max(action_keys, default=-1))
    size = (largest // width + 8) * width
    n_parts = len(action_keys) + sum(len(k) - 1 for k in overlap_keys.values())
    return size if size <= _DENSE_SLOTS * n_parts + 4096 else 0


def node_of_action(numbering: Numbering, action: Action) -> int | None:
    if action.microbatch >= numbering.width:
        return None
    key = action_key(action, numbering.width)
    table = numbering.table
    node = table[key] if type(table) is SparseKeys or key < len(table) else -1
    return None if node < 0 else node


def part_of(work: Work, key: int, width: int) -> Action:
    """The part of ``work`` with this action key."""
    for action in work.parts:
        if action_key(action, width) == key:
            return action
    raise AssertionError(f"{work} has no part with key {key}")  # pragma: no cover
