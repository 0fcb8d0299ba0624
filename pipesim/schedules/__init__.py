"""Built-in schedule generators and the registry that names them.

>>> from pipesim.schedules import generate, schedule_names
>>> "1f1b" in schedule_names()
True
>>> [str(a) for a in generate("1f1b", n_ranks=2, n_microbatches=2).orders[1]]
['1F0', '1B0', '1F1', '1B1']
"""

from __future__ import annotations

from pipesim.schedules.gpipe import gpipe
from pipesim.schedules.interleaved import interleaved_1f1b
from pipesim.schedules.one_f_one_b import one_f_one_b
from pipesim.schedules.registry import (
    ScheduleSpec,
    generate,
    get_spec,
    register,
    schedule_names,
)
from pipesim.schedules.sequential import sequential

__all__ = [
    "ScheduleSpec",
    "generate",
    "get_spec",
    "gpipe",
    "interleaved_1f1b",
    "one_f_one_b",
    "register",
    "schedule_names",
    "sequential",
]

register(
    ScheduleSpec(
        name="sequential",
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
