"""The winner of a plan as Megatron-LM and torchtitan command-line settings.

Megatron-LM (``megatron/training/arguments.py``): ``--tensor-model-parallel-size``,
``--pipeline-model-parallel-size``, ``--num-layers-per-virtual-pipeline-stage``
(interleaved 1F1B), ``--decoder-first-pipeline-num-layers`` /
``--decoder-last-pipeline-num-layers`` (uneven end stages), ``--sequence-parallel``,
``--micro-batch-size``, ``--global-batch-size``, ``--recompute-granularity``
(with ``--recompute-method uniform --recompute-num-layers 1`` for full),
``--use-distributed-optimizer``, ``--overlap-grad-reduce``,
``--overlap-param-gather``. Megatron-LM runs 1F1B and interleaved 1F1B only;
for other schedules the settings say so.

torchtitan (``torchtitan/config/job_config.py``): ``--parallelism.*`` degrees and
``pipeline_parallel_schedule`` (torch.distributed.pipelining class names),
``--activation_checkpoint.mode``. torchtitan shards data parallelism with FSDP2
(``data_parallel_shard_degree``; ZeRO-3, which needs no more memory than the
distributed optimizer's ZeRO-1) or replicates it (``data_parallel_replicate_degree``);
its tensor parallelism always splits the sequence too.

>>> from pipesim.plan.result import PlanPoint
>>> point = PlanPoint(schedule="interleaved-1f1b", pipeline=4, virtual=2, data_parallel=2,
...     microbatch_size=1, n_microbatches=64, tensor=8, sequence_parallel=True,
...     recompute="selective", distributed_optimizer=True,
...     layers_per_stage=(11,) + (10,) * 6 + (11,))
>>> for arg in megatron_line(point, global_batch=128, n_layers=80).split(" --"):
...     print(arg.removeprefix("--"))
tensor-model-parallel-size 8
pipeline-model-parallel-size 4
num-layers-per-virtual-pipeline-stage 10
sequence-parallel
micro-batch-size 1
global-batch-size 128
recompute-granularity selective
use-distributed-optimizer
overlap-grad-reduce
overlap-param-gather
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pipesim.plan.result import PlanPoint, PlanResult

__all__ = ["megatron_args", "megatron_line", "torchtitan_args", "torchtitan_line"]

#: pipesim schedule -> torch.distributed.pipelining class name torchtitan takes.
TORCH_SCHEDULES = {
    "gpipe": "GPipe",
    "1f1b": "1F1B",
    "interleaved-1f1b": "Interleaved1F1B",
    "looped-bfs": "LoopedBFS",
    "interleaved-zb": "InterleavedZeroBubble",
    "zbv": "ZBVZeroBubble",
    "dualpipev": "DualPipeV",
}


def _blocks_per_stage(point: PlanPoint, n_layers: int) -> list[int]:
    """Transformer blocks on each stage: the embedding (first) and head (last) removed."""
    sizes = list(point.layers_per_stage)
    if not sizes:
        return []
    sizes[0] -= 1
    sizes[-1] -= 1
    if sum(sizes) != n_layers:  # several model copies (DualPipe): not a Megatron layout
        return []
    return sizes


def megatron_line(point: PlanPoint, /, *, global_batch: int, n_layers: int) -> str:
    """Megatron-LM arguments for ``point`` (a comment replaces what it cannot express)."""
    args = [
        f"--tensor-model-parallel-size {point.tensor}",
        f"--pipeline-model-parallel-size {point.pipeline}",
    ]
    notes = []
    if point.schedule not in ("1f1b", "interleaved-1f1b", "sequential", "gpipe"):
        closest = "interleaved 1F1B" if point.virtual > 1 else "1F1B"
        notes.append(f"Megatron-LM has no {point.schedule} schedule; these run {closest}")
    blocks = _blocks_per_stage(point, n_layers)
    n_stages = len(blocks)
    if blocks and point.pipeline > 1:
        even = len(set(blocks)) == 1
        if n_stages > point.pipeline and even:
            args.append(f"--num-layers-per-virtual-pipeline-stage {blocks[0]}")
        elif n_stages == point.pipeline and not even:
            args.append(f"--decoder-first-pipeline-num-layers {blocks[0]}")
            args.append(f"--decoder-last-pipeline-num-layers {blocks[-1]}")
        elif not even:
            notes.append(
                "blocks per stage " + " ".join(map(str, blocks)) + " need Megatron-LM's "
                "--pipeline-model-parallel-layout"
            )
    if point.context_parallel > 1:
        args.append(f"--context-parallel-size {point.context_parallel}")
    if point.expert_parallel > 1:
        args.append(f"--expert-model-parallel-size {point.expert_parallel}")
    if point.expert_parallel > 1 or point.expert_tensor > 1:  # Megatron's default: t
        args.append(f"--expert-tensor-parallel-size {point.expert_tensor}")
    if point.sequence_parallel:
        args.append("--sequence-parallel")
    args += [f"--micro-batch-size {point.microbatch_size}", f"--global-batch-size {global_batch}"]
    if point.recompute == "selective":
        args.append("--recompute-granularity selective")
    elif point.recompute == "full":
        args.append(
            "--recompute-granularity full --recompute-method uniform --recompute-num-layers 1"
        )
    if point.distributed_optimizer:
        args.append("--use-distributed-optimizer")
    if point.data_parallel > 1:
        args.append("--overlap-grad-reduce")
        if point.distributed_optimizer:
            args.append("--overlap-param-gather")
    line = " ".join(args)
    return line + "".join(f"  # {note}" for note in notes)


def torchtitan_line(point: PlanPoint, /, *, global_batch: int, seq_length: int | None) -> str:
    """torchtitan arguments for ``point``."""
    args = [
        f"--parallelism.tensor_parallel_degree {point.tensor}",
        f"--parallelism.pipeline_parallel_degree {point.pipeline}",
    ]
    notes = []
    if point.pipeline > 1:
        name = TORCH_SCHEDULES.get(point.schedule)
        if name is None:
            notes.append(f"torchtitan has no {point.schedule} schedule")
        else:
            args.append(f"--parallelism.pipeline_parallel_schedule {name}")
        args.append(f"--parallelism.pipeline_parallel_microbatch_size {point.microbatch_size}")
    if point.context_parallel > 1:
        args.append(f"--parallelism.context_parallel_degree {point.context_parallel}")
    if point.expert_parallel > 1:
        args.append(f"--parallelism.expert_parallel_degree {point.expert_parallel}")
    if point.expert_tensor > 1:
        args.append(f"--parallelism.expert_tensor_parallel_degree {point.expert_tensor}")
    shard = "shard" if point.distributed_optimizer else "replicate"
    args.append(f"--parallelism.data_parallel_{shard}_degree {point.data_parallel}")
    args.append(f"--training.global_batch_size {global_batch}")
    if seq_length is not None:
        args.append(f"--training.seq_len {seq_length}")
    args.append(f"--activation_checkpoint.mode {point.recompute}")
    if point.tensor > 1 and not point.sequence_parallel:
        notes.append("torchtitan's tensor parallelism always splits the sequence too")
    return " ".join(args) + "".join(f"  # {note}" for note in notes)


def megatron_args(result: PlanResult, point: PlanPoint, /) -> str:
    """:func:`megatron_line` with the plan's global batch and the model's layer count, and
    the plan's precision and communication overlap (Transformer Engine's FP8 format,
    ``--fp8-format hybrid``, and its scaling recipe, ``--fp8-recipe``: Megatron-Core's
    ``TransformerConfig.fp8_recipe``, whose default is ``delayed``)."""
    line = megatron_line(point, global_batch=result.global_batch, n_layers=result.n_layers)
    extra = []
    if result.dtype == "fp8":
        extra.append("--fp8-format hybrid")
        if result.fp8_recipe not in (None, "delayed"):
            extra.append(f"--fp8-recipe {result.fp8_recipe}")
    if result.grad_reduce_in_bf16:
        extra.append("--grad-reduce-in-bf16")
    if result.tp_comm_overlap and point.tensor > 1:
        extra.append("--tp-comm-overlap")
    if result.overlap_p2p and point.pipeline > 1:
        extra.append("--overlap-p2p-communication")
    if not extra:
        return line
    head, sep, notes = line.partition("  # ")
    return " ".join([head, *extra]) + (sep + notes if sep else "")


def torchtitan_args(result: PlanResult, point: PlanPoint, /) -> str:
    """:func:`torchtitan_line` with the plan's global batch and sequence length."""
    return torchtitan_line(point, global_batch=result.global_batch, seq_length=result.seq_length)
