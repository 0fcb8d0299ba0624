"""``zb-h1`` and ``zb-h2``: the handcrafted zero-bubble schedules of Qi et al.,
"Zero Bubble Pipeline Parallelism", ICLR 2024, section 3.1.

Both split every backward into ``I`` (input gradient, on the critical path)
and ``W`` (weight gradient, free to move), one stage per rank.

**ZB-H1** keeps 1F1B's memory: rank ``r`` runs ``p - 1 - r`` warm-up
forwards, then alternates one ``F`` with one ``I``; after its first ``r``
``I`` passes it follows each ``I`` with the oldest pending ``W``, so rank
``r`` holds back ``r`` weight-gradient passes and runs them in the
cool-down, where 1F1B idles. For uniform stages with ``W <= min(F, I)`` the
makespan is ``m (F + I + W) + (p - 1)(F + I - W)`` and every rank holds at
most ``p`` micro-batches (the paper's ``p M_B``). It is torch's
``ScheduleInterleavedZeroBubble`` with one stage per rank (see
:mod:`pipesim.schedules.interleaved_zb`).

**ZB-H2** spends up to ``2p - 1`` micro-batches of memory to remove the bubble
(Qi et al. 2024, sec. 3.1 and fig. 3): extra warm-up forwards fill the wait
for the first ``I`` and ``W`` passes move to the tail, turning the trapezoid
into a parallelogram. The paper draws the schedule for ``F = I = W`` and gives
its rules in words; pipesim builds the order from exactly those rules on unit
times: at every slot a rank runs an ``I`` whose gradient has arrived, else a
forward whose input has arrived while it holds fewer than ``2p - 1``
micro-batches (the paper's peak ``(2p - 1) M_B``, Table 2), else its oldest
pending ``W``. Rank ``r`` so runs ``2 (p - r) - 1`` warm-up forwards. The
order is kept for any costs; then each rank idles ``(p - 1 - r)(F + I - 2W)``
between its first and last action when ``W <= min(F, I)`` and links are free:
the paper's bubble ``(p - 1)(T_F + T_B - 2 T_W)`` on rank 0 (Table 2). With
``F = I = W`` and ``m >= 2p - 1`` every rank works without a gap ("bubble
0": the paper counts each rank's span, since its optimizer post-validation
lets the next step's parallelogram start early); the ramp of ``r`` slots
before rank ``r`` starts remains in pipesim's ``bubble_ratio``, which counts
the whole step. For ``p = 3, m = 6`` and unit times (one slot per action)::

    rank 0  F0 F1 F2 F3 F4 I0 W0 I1 F5 I2 W1 I3 W2 I4 W3 W4 I5 W5
    rank 1     F0 F1 F2 I0 F3 I1 F4 I2 W0 I3 F5 I4 W1 W2 I5 W3 W4 W5
    rank 2        F0 I0 F1 I1 F2 I2 F3 I3 F4 I4 W0 F5 I5 W1 W2 W3 W4 W5

Rules: ranks >= 1, micro-batches >= 1, one stage per rank, training only.
"""

from __future__ import annotations

from pipesim.actions import Action, Op, trusted_action
from pipesim.schedule import Schedule
from pipesim.schedules._common import check_count, refuse_forward_only, refuse_virtual
from pipesim.schedules.interleaved_zb import split_backward_orders

__all__ = ["zb_h1", "zb_h2"]


def zb_h1(
    *, n_ranks: int, n_microbatches: int, virtual: int = 1, forward_only: bool = False
) -> Schedule:
    """ZB-H1: 1F1B with I and W split, rank ``r`` deferring ``r`` W passes.

    >>> [str(a) for a in zb_h1(n_ranks=2, n_microbatches=3).orders[1]]
    ['1F0', '1I0', '1F1', '1I1', '1W0', '1F2', '1I2', '1W1', '1W2']
    """
    p = check_count("n_ranks", n_ranks)
    m = check_count("n_microbatches", n_microbatches)
    refuse_virtual("zb-h1", virtual)
    refuse_forward_only("zb-h1", forward_only)
    # One chunk per rank: the round size does not change the order.
    orders = split_backward_orders(n_ranks=p, n_microbatches=m, virtual=1, group=m)
    return Schedule.from_orders(orders, placement=tuple(range(p)), n_microbatches=m, name="zb-h1")


def zb_h2(
    *, n_ranks: int, n_microbatches: int, virtual: int = 1, forward_only: bool = False
) -> Schedule:
    """ZB-H2: the parallelogram, up to ``2p - 1`` micro-batches held per rank.

    >>> s = zb_h2(n_ranks=2, n_microbatches=3)
    >>> [str(a) for a in s.orders[0]]
    ['0F0', '0F1', '0F2', '0I0', '0W0', '0I1', '0W1', '0I2', '0W2']
    >>> [str(a) for a in s.orders[1]]
    ['1F0', '1I0', '1F1', '1I1', '1F2', '1I2', '1W0', '1W1', '1W2']
    """
    p = check_count("n_ranks", n_ranks)
    m = check_count("n_microbatches", n_microbatches)
    refuse_virtual("zb-h2", virtual)
    refuse_forward_only("zb-h2", forward_only)
    orders = _unit_time_greedy(p, m, cap=2 * p - 1)
    return Schedule.from_orders(orders, placement=tuple(range(p)), n_microbatches=m, name="zb-h2")


def _unit_time_greedy(p: int, m: int, *, cap: int) -> list[list[Action]]:
    """Per-rank orders of a slot-by-slot list schedule with F = I = W = 1.

    Priority on each rank: a ready I, else a ready F while fewer than ``cap``
    micro-batches are held (F done, W not), else the oldest pending W.
    Ranks decide from what had finished before the slot began, so the
    orders come from a real execution and cannot deadlock.
    """
    f_end = [[-1] * m for _ in range(p)]  # slot after which F of (rank, mb) is done
    i_end = [[-1] * m for _ in range(p)]
    n_f, n_i, n_w = [0] * p, [0] * p, [0] * p
    orders: list[list[Action]] = [[] for _ in range(p)]
    slot = 0
    while any(done < m for done in n_w):
        ran: list[tuple[int, Op, int]] = []
        for rank in range(p):
            k = n_i[rank]
            grad_ready = k < n_f[rank] and (rank == p - 1 or 0 <= i_end[rank + 1][k] <= slot)
            j = n_f[rank]
            input_ready = j < m and (rank == 0 or 0 <= f_end[rank - 1][j] <= slot)
            if grad_ready:
                ran.append((rank, Op.I, k))
                n_i[rank] += 1
            elif input_ready and n_f[rank] - n_w[rank] < cap:
                ran.append((rank, Op.F, j))
                n_f[rank] += 1
            elif n_w[rank] < n_i[rank]:
                ran.append((rank, Op.W, n_w[rank]))
                n_w[rank] += 1
        for rank, op, mb in ran:
            orders[rank].append(trusted_action(rank, op, mb))
            if op is Op.F:
                f_end[rank][mb] = slot + 1
            elif op is Op.I:
                i_end[rank][mb] = slot + 1
        slot += 1
    return orders
