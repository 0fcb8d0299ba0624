"""``interleaved-1f1b``: Megatron-LM's virtual pipeline (Narayanan et al., "Efficient
Large-Scale Language Model Training on GPU Clusters Using Megatron-LM", SC 2021).

Each of the ``p`` ranks holds ``v`` stages ("model chunks"); stage ``c * p + r``
lives on rank ``r`` (chunk ``c``), so the model is cut into ``p * v`` stages and
a micro-batch loops through the ranks ``v`` times. The bubble shrinks by ``v``:
for uniform stages the makespan is ``m (F + B) + (p - 1)(F + B) / v``, where F
and B are a whole rank's times (each chunk takes ``F / v`` and ``B / v``).

Order of work, following Megatron-LM's ``get_schedule_table``
(``megatron/core/pipeline_parallel/schedules.py``): micro-batches are taken in
groups of ``N`` (``microbatch_group_size_per_vp_stage``, default ``p``); within
a group every micro-batch runs chunk 0, then every one runs chunk 1, and so on;
the last group takes whatever micro-batches remain. Backwards walk the same
table with the chunks reversed. Rank ``r`` first runs
``(p - r - 1) * 2 + (v - 1) * N`` warm-up forwards (capped at ``m * v``), then
one forward / one backward, then the remaining backwards.

Rules (Megatron's): ``p <= N <= m``, and ``m mod N`` is 0 or at least ``p``;
otherwise a rank would wait on a micro-batch that no other rank has produced.
With ``v = 1`` this is exactly ``1f1b``.
"""

from __future__ import annotations

from pipesim.actions import Action, Op, trusted_action
from pipesim.errors import ScheduleError
from pipesim.schedule import Schedule
from pipesim.schedules._common import check_count, refuse_forward_only


def schedule_table(n_microbatches: int, virtual: int, group_size: int) -> list[tuple[int, int]]:
    """Megatron's (micro-batch, chunk) order of forwards on every rank.

    >>> schedule_table(5, 2, 3)
    [(0, 0), (1, 0), (2, 0), (0, 1), (1, 1), (2, 1), (3, 0), (4, 0), (3, 1), (4, 1)]
    """
    table = []
    for first in range(0, n_microbatches, group_size):
        last = n_microbatches if first + group_size >= n_microbatches else first + group_size
        table += [(mb, chunk) for chunk in range(virtual) for mb in range(first, last)]
    return table


def check_interleaved_rules(n_ranks: int, n_microbatches: int, group_size: int) -> None:
    """Megatron's rules for the micro-batch group size; ScheduleError with the fix."""
    p, m, n = n_ranks, n_microbatches, group_size
    if not p <= n <= m:
        raise ScheduleError(
            f"interleaved-1f1b needs ranks <= group size <= micro-batches, got ranks={p}, "
            f"group size={n}, micro-batches={m}; use at least {p} micro-batches "
            f"(and a group size between {p} and the micro-batch count)"
        )
    remainder = m % n
    if remainder and remainder < p:
        raise ScheduleError(
            f"interleaved-1f1b needs micro-batches mod group size to be 0 or >= ranks, got "
            f"{m} mod {n} = {remainder} < {p}; use a micro-batch count that is a multiple of "
            f"{n} (e.g. {m - remainder} or {m - remainder + n}) or change the group size"
        )


def interleaved_1f1b(
    *,
    n_ranks: int,
    n_microbatches: int,
    virtual: int = 2,
    forward_only: bool = False,
    group_size: int | None = None,
) -> Schedule:
    """Megatron's interleaved 1F1B with ``virtual`` stages per rank.

    >>> s = interleaved_1f1b(n_ranks=2, n_microbatches=4, virtual=2)
    >>> s.n_stages, s.placement
    (4, (0, 1, 0, 1))
    >>> [str(a) for a in s.orders[1]][:4]
    ['1F0', '1F1', '3F0', '3B0']
    """
    p = check_count("n_ranks", n_ranks)
    m = check_count("n_microbatches", n_microbatches)
    v = check_count("virtual", virtual)
    refuse_forward_only("interleaved-1f1b", forward_only)
    n = p if group_size is None else check_count("group_size", group_size)
    check_interleaved_rules(p, m, n)
    table = schedule_table(m, v, n)
    total = m * v
    orders: list[list[Action]] = []
    for rank in range(p):

        def fwd(k: int, rank: int = rank) -> Action:
            mb, chunk = table[k]
            return trusted_action(chunk * p + rank, Op.F, mb)

        def bwd(k: int, rank: int = rank) -> Action:
            mb, chunk = table[k]
            return trusted_action((v - 1 - chunk) * p + rank, Op.B, mb)

        # Megatron: num_warmup = (p - r - 1) * 2 + (v - 1) * group size, at most m * v.
        # This is the rule of Megatron-LM since microbatch_group_size_per_vp_stage exists;
        # older releases also made every forward a warm-up when m == p (same makespan,
        # more memory on the last ranks).
        # One chunk per rank is Megatron's non-interleaved 1F1B: p - r - 1 warm-up forwards.
        if v == 1:
            warmup = min(p - rank - 1, total)
        else:
            warmup = min((p - rank - 1) * 2 + (v - 1) * n, total)
        order = [fwd(k) for k in range(warmup)]
        for k in range(total - warmup):
            order += [fwd(warmup + k), bwd(k)]
        order += [bwd(k) for k in range(total - warmup, total)]
        orders.append(order)
    placement = tuple(stage % p for stage in range(p * v))
    return Schedule.from_orders(
        orders, placement=placement, n_microbatches=m, name="interleaved-1f1b"
    )
