"""Built-in schedule generators and the registry that names them.

One module per family, each citing its source: :mod:`~pipesim.schedules.sequential`,
:mod:`~pipesim.schedules.gpipe`, :mod:`~pipesim.schedules.one_f_one_b`,
:mod:`~pipesim.schedules.interleaved`, :mod:`~pipesim.schedules.interleaved_zb`,
:mod:`~pipesim.schedules.looped_bfs`, :mod:`~pipesim.schedules.zero_bubble` (ZB-H1,
ZB-H2), :mod:`~pipesim.schedules.zbv`, :mod:`~pipesim.schedules.controllable` (V-Half,
V-Min), :mod:`~pipesim.schedules.dualpipe` (DualPipe, DualPipeV); the checks and builders
they share in :mod:`~pipesim.schedules._common`; the names, rules and sources in
:mod:`~pipesim.schedules.registry`. A new family is a new module and its registry entry.

>>> from pipesim.schedules import generate, schedule_names
>>> "1f1b" in schedule_names()
True
>>> [str(a) for a in generate("1f1b", n_ranks=2, n_microbatches=2).orders[1]]
['1F0', '1B0', '1F1', '1B1']
"""

from __future__ import annotations

from pipesim.schedules.controllable import v_half, v_min
from pipesim.schedules.dualpipe import dualpipe, dualpipev
from pipesim.schedules.gpipe import gpipe
from pipesim.schedules.interleaved import interleaved_1f1b
from pipesim.schedules.interleaved_zb import interleaved_zero_bubble
from pipesim.schedules.looped_bfs import looped_bfs
from pipesim.schedules.one_f_one_b import one_f_one_b
from pipesim.schedules.registry import (
    ScheduleSpec,
    generate,
    get_spec,
    register,
    schedule_names,
)
from pipesim.schedules.sequential import sequential
from pipesim.schedules.zbv import zbv
from pipesim.schedules.zero_bubble import zb_h1, zb_h2

__all__ = [
    "ScheduleSpec",
    "dualpipe",
    "dualpipev",
    "generate",
    "get_spec",
    "gpipe",
    "interleaved_1f1b",
    "interleaved_zero_bubble",
    "looped_bfs",
    "one_f_one_b",
    "register",
    "schedule_names",
    "sequential",
    "v_half",
    "v_min",
    "zb_h1",
    "zb_h2",
    "zbv",
]

register(
    ScheduleSpec(
        name="sequential",
        virtual_values=(1,),
        generator=sequential,
        summary="plain model parallelism: one micro-batch through every stage before the next",
        rules="ranks >= 1, micro-batches >= 1, virtual = 1; --forward-only allowed",
        source="the model-parallelism chapter's single-controller loop",
        forward_only=True,
    )
)
register(
    ScheduleSpec(
        name="gpipe",
        virtual_values=(1,),
        generator=gpipe,
        summary="fill-drain: all forwards, then all backwards",
        rules="ranks >= 1, micro-batches >= 1, virtual = 1; --forward-only allowed",
        source="Huang et al., GPipe, NeurIPS 2019; torch ScheduleGPipe",
        forward_only=True,
    )
)
register(
    ScheduleSpec(
        name="1f1b",
        virtual_values=(1,),
        generator=one_f_one_b,
        summary="PipeDream-Flush: p-r-1 warm-up forwards on rank r, then one forward one backward",
        rules="ranks >= 1, micro-batches >= 1, virtual = 1; training only",
        source="Narayanan et al., PipeDream-Flush, ICML 2021; torch Schedule1F1B",
    )
)
register(
    ScheduleSpec(
        name="interleaved-1f1b",
        generator=interleaved_1f1b,
        summary="Megatron's virtual pipeline: v stages per rank, micro-batches in groups of N",
        rules=(
            "virtual v >= 1 (default 2); group size N (default p) with p <= N <= m and "
            "m mod N = 0 or >= p; training only"
        ),
        source="Narayanan et al., Megatron-LM, SC 2021; megatron/core/pipeline_parallel",
        default_virtual=2,
        options=("group_size",),
    )
)
register(
    ScheduleSpec(
        name="looped-bfs",
        generator=looped_bfs,
        summary="breadth-first looped: all micro-batches through chunk 0, then chunk 1, ...; "
        "backwards chunk by chunk, last micro-batch first",
        rules="virtual v >= 1 (default 2), any ranks and micro-batches; training only",
        source="Lamy-Poirier, Breadth-First Pipeline Parallelism, MLSys 2023; "
        "torch ScheduleLoopedBFS",
        default_virtual=2,
    )
)
register(
    ScheduleSpec(
        name="zb-h1",
        virtual_values=(1,),
        generator=zb_h1,
        summary="zero bubble H1: 1F1B with I and W split, rank r deferring r W passes into "
        "the cool-down; 1F1B's memory",
        rules="ranks >= 1, micro-batches >= 1, virtual = 1; training only",
        source="Qi et al., Zero Bubble Pipeline Parallelism, ICLR 2024, sec. 3.1",
    )
)
register(
    ScheduleSpec(
        name="zb-h2",
        virtual_values=(1,),
        generator=zb_h2,
        summary="zero bubble H2: 2(p-r)-1 warm-up forwards, W moved to the tail, up to 2p-1 "
        "micro-batches held; no gap on any rank when F=I=W and m >= 2p-1",
        rules="ranks >= 1, micro-batches >= 1, virtual = 1; training only",
        source="Qi et al., Zero Bubble Pipeline Parallelism, ICLR 2024, sec. 3.1",
    )
)
register(
    ScheduleSpec(
        name="interleaved-zb",
        generator=interleaved_zero_bubble,
        summary="interleaved 1F1B with I and W split (ZB1P on v looped chunks per rank)",
        rules="virtual v >= 1 (default 2); micro-batches a multiple of max(1, m // p) "
        "(torch's rounds); training only",
        source="Qi et al., ICLR 2024; torch ScheduleInterleavedZeroBubble",
        default_virtual=2,
    )
)
register(
    ScheduleSpec(
        name="zbv",
        virtual_values=(2,),
        generator=zbv,
        summary="zero bubble V: two stages per rank in a V (rank r holds r and 2p-1-r), "
        "I and W split; 1F1B's memory",
        rules="virtual = 2 (2P stages on P ranks), micro-batches >= 1 (zero bubble from "
        "2p-1); training only",
        source="Qi et al., Zero Bubble Pipeline Parallelism, sec. 6; torch ScheduleZBVZeroBubble",
        default_virtual=2,
    )
)
register(
    ScheduleSpec(
        name="dualpipe",
        virtual_values=(2,),
        generator=dualpipe,
        summary="DeepSeek's bidirectional pipeline: two model copies (n_copies=2), half the "
        "micro-batches from each end, overlapped F&B pairs",
        rules="ranks P even, virtual = 2 (two copies of a P-stage model, 2P stages); "
        "micro-batches even and >= 2P; training only",
        source="DeepSeek-V3 Technical Report, sec. 3.2.1; github.com/deepseek-ai/DualPipe",
        default_virtual=2,
        n_copies=2,
    )
)
register(
    ScheduleSpec(
        name="dualpipev",
        virtual_values=(2,),
        generator=dualpipev,
        summary="DualPipe cut in half: one 2P-stage model in a V on P ranks, overlapped F&B pairs",
        rules="virtual = 2 (2P stages on P ranks); micro-batches >= 2P; training only",
        source="DeepSeek DualPipe (DualPipeV); torch ScheduleDualPipeV",
        default_virtual=2,
    )
)
register(
    ScheduleSpec(
        name="v-half",
        virtual_values=(2,),
        generator=v_half,
        summary="controllable memory, V-Half: a V-shaped building block repeated every 6 "
        "slots; half of 1F1B's activation memory ((p+2)//2 micro-batches), about half its bubble",
        rules="virtual = 2 (2P stages on P ranks in a V), any ranks and micro-batches; "
        "training only",
        source="Qi et al., Pipeline Parallelism with Controllable Memory, NeurIPS 2024 "
        "(arXiv 2405.15362); github.com/sail-sg/zero-bubble-pipeline-parallelism",
        default_virtual=2,
    )
)
register(
    ScheduleSpec(
        name="v-min",
        virtual_values=(2,),
        generator=v_min,
        summary="controllable memory, V-Min: the tightest V-shaped building block; a third of "
        "1F1B's activation memory ((p+4)//3 micro-batches), about 2/3 of its bubble",
        rules="virtual = 2 (2P stages on P ranks in a V), any ranks and micro-batches; "
        "training only",
        source="Qi et al., Pipeline Parallelism with Controllable Memory, NeurIPS 2024 "
        "(arXiv 2405.15362); github.com/sail-sg/zero-bubble-pipeline-parallelism",
        default_virtual=2,
    )
)
