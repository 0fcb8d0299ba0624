"""How long an overlapped F&B pair takes, from its parts (DualPipe's computation-
communication overlap).

DeepSeek-V3 Technical Report (arXiv 2412.19437), section 3.2.1 and Figure 4: DualPipe
splits each chunk into attention, all-to-all dispatch, MLP and all-to-all combine (the
backward's attention and MLP further into input- and weight-gradient parts), and runs a
forward chunk of one micro-batch together with a backward chunk of another, rearranged
so that each all-to-all of one runs while the other computes; a share of the SMs runs
the communication (section 3.2.2). So the pair is two streams:

- compute: the forward's and the backward's kernels (GEMMs, attention, streaming
  kernels and the communication they expose on their own, tensor-parallel collectives
  included), one after the other;
- communication: the forward's dispatch and combine and the backward's;

and takes as long as the busier stream, and never less than either half's own chain
(its attention, dispatch, MLP and combine run in order; the backward's weight-gradient
part W hangs off that chain and fills the compute stream wherever it has room, which
is why DualPipe splits it off):

``pair = max(k (C_F + C_B), A_F + A_B, k C_F + A_F, k (C_B - W) + A_B)``,

where ``k = SMs / (SMs - 20)``: DeepSeek's dispatch and combine kernels occupy 20 of
the GPU's SMs while they run ("only 20 SMs are sufficient to fully utilize the
bandwidths of IB and NVLink", section 3.2.2), so the pair's compute has the rest
(``k = 1`` when the accelerator's SM count is unknown). The pair never takes longer
than ``F + B``, its parts one after the other on all SMs.

Without all-to-all (a dense model, expert parallelism 1) the pair is ``F + B``: the
overlap buys nothing. The pipeline sends are priced by the schedule's links, as for
every schedule.

>>> f = PassParts(compute_s=3.0, all_to_all_s=2.0)
>>> b = PassParts(compute_s=6.0, all_to_all_s=2.0, deferrable_s=2.0)
>>> pair_seconds(f, b)   # 4 s of all-to-all hide under 9 s of compute: 9, not 13
9.0
>>> pair_seconds(PassParts(compute_s=1.0, all_to_all_s=5.0), b)   # communication bound
7.0
>>> pair_seconds(f, PassParts(compute_s=6.0, all_to_all_s=6.0, deferrable_s=4.0))  # W off
9.0
>>> round(pair_seconds(f, b, sm_count=120), 9)   # compute on 100 of 120 SMs: 9 x 1.2
10.8
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from pipesim.actions import Overlap
from pipesim.plan.gpu import PassTime
from pipesim.schedule import Schedule

__all__ = ["COMMUNICATION_SMS", "PassParts", "overlap_partners", "pair_seconds", "pass_parts"]

#: SMs DeepSeek-V3's all-to-all kernels take while a pair runs (its report, section 3.2.2).
COMMUNICATION_SMS = 20


@dataclass(frozen=True, slots=True, kw_only=True)
class PassParts:
    """One pass of a stage (F, or a full backward B) as the two streams see it."""

    compute_s: float
    """Everything but the expert-parallel all-to-alls (exposed communication included)."""
    all_to_all_s: float
    """The expert-parallel dispatch and combine."""
    deferrable_s: float = 0.0
    """The part of ``compute_s`` off the pass's chain: a backward's weight gradients."""


def pass_parts(passes: Iterable[PassTime], /, *, deferrable: Iterable[PassTime] = ()) -> PassParts:
    """The parts of priced passes (a stage's forwards; or its input gradients, with its
    weight gradients ``deferrable``)."""
    compute = all_to_all = later = 0.0
    for p in passes:
        compute += p.total_s - p.ep_comm_s
        all_to_all += p.ep_comm_s
    for p in deferrable:
        later += p.total_s - p.ep_comm_s
        all_to_all += p.ep_comm_s
    return PassParts(compute_s=compute + later, all_to_all_s=all_to_all, deferrable_s=later)


def pair_seconds(
    forward: PassParts, backward: PassParts, /, *, sm_count: int | None = None
) -> float:
    """Seconds of an overlapped F&B pair on a device of ``sm_count`` SMs (see the module
    docstring; None: the communication's SMs not counted)."""
    cf, af = forward.compute_s, forward.all_to_all_s
    cb, ab = backward.compute_s, backward.all_to_all_s
    k = 1.0
    if sm_count is not None and sm_count > COMMUNICATION_SMS and af + ab > 0:
        k = sm_count / (sm_count - COMMUNICATION_SMS)
    pair = max(k * (cf + cb), af + ab, k * cf + af, k * (cb - backward.deferrable_s) + ab)
    return min(pair, cf + af + cb + ab)


def overlap_partners(schedule: Schedule, /) -> tuple[int, ...] | None:
    """Per stage, the stage whose backward its forward is overlapped with (-1: none);
    None when the schedule overlaps nothing. DualPipe pairs the two stages of a rank."""
    partners = [-1] * schedule.n_stages
    found = False
    for order in schedule.orders:
        for work in order:
            if isinstance(work, Overlap):
                partners[work.parts[0].stage] = work.parts[1].stage
                found = True
    return tuple(partners) if found else None
