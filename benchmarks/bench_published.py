"""Predicted against published: tables of Megatron-LM training runs.

Every row is predicted by the planner as it ships (``pipesim.plan.plan`` with every
dimension pinned to the row's configuration), with the accelerator presets as shipped:
no number is fitted to any row. Each table's source prints some of the configuration;
what it leaves out is assumed *once for the whole table* (``ASSUMED`` below, printed
with the table). Run: ``python benchmarks/bench_published.py`` (about a minute).

1. Korthikanti et al., "Reducing Activation Recomputation in Large Transformer Models"
   (MLSys 2023, arXiv 2205.05198), Table 3 (configurations) and Table 5 (seconds per
   iteration, "full recompute" and "present work"), A100 80GB. Interleaving as
   Calculon's validation encodes it (calculon-ai/calculon ``validation/seqsel/tab5``:
   3 stages per rank for 175B and 530B), since the paper does not print it.
2. Narayanan et al., "Efficient Large-Scale Language Model Training on GPU Clusters
   Using Megatron-LM" (SC 2021, arXiv 2104.04473), Table 1: achieved teraFLOP/s per
   GPU with the paper's FLOP count (its Eq. 3, recomputation included), A100 80GB.
   Micro-batch sizes, interleaving and data-parallel implementation as the authors'
   reproduction script sets them (NVIDIA/Megatron-LM ``examples/sc21/run_table_1.sh``,
   "scripts that were used to produce the results in the Megatron paper"), since the
   table does not print them.
3. NVIDIA/Megatron-LM README, H100 weak-scaling table (``images/model_table.png``,
   Megatron-Core r0.8.0): teraFLOP/s per GPU with Megatron's model FLOP count (no
   recomputation), H100 SXM, vocabulary 131072, sequence 4096, with
   ``--overlap-grad-reduce --overlap-param-gather --tp-comm-overlap``.
4. Grattafiori et al. 2024 ("The Llama 3 Herd of Models"), Table 4: the 405B's
   pre-training teraFLOP/s per GPU, H100.
5. NVIDIA's measured runs, every parallel dimension printed, tokens/s per GPU on DGX-H100
   in FP8: the Megatron-Bridge performance summary (NVIDIA-NeMo/Megatron-Bridge
   ``docs/performance-summary-archive.md``, 25.11 and 26.02 containers: Llama 3 8B / 70B,
   Llama 3.1 405B) and the NeMo 24.07 performance summary (NVIDIA/NeMo
   ``docs/source/performance/performance_summary.md``: GPT-3 175B, Llama 2 7B / 13B /
   70B, Nemotron-4 340B, Llama 3 8B / 70B). What the tables do not print is taken from
   the recipes of the release (Megatron-Bridge ``scripts/performance`` at v0.2.0 and
   v0.3.0; NeMo-Framework-Launcher 24.07's model configs and H100 FP8 example scripts).
6. The same Megatron-Bridge summary's DGX-H100 mixture-of-experts rows (Qwen3 30B-A3B and
   235B-A22B, 25.11 and 26.02, FP8 current scaling), the recipes read the same way
   (``scripts/performance/configs/qwen*`` and ``src/megatron/bridge/recipes/qwen/
   qwen3_moe.py`` at v0.2.0 and v0.3.0).

Before the tables, the direct check of the layer model: Korthikanti et al. 2023, Table 4
(one transformer layer of the 22B model of its Table 3, forward and backward
milliseconds for each recomputation mode and sequence parallelism) against the
planner's F and B (= I + W) of that block, and what the 22B's Table 5 steps leave
outside their 48 layers; then the same check on an H100: Transformer Engine v2.12's
Getting Started benchmark (NVIDIA/TransformerEngine ``docs/getting_started/``: forward
and backward milliseconds of one GPT layer, hidden 4096, on one H100) against the
planner's F + I + W, with the preset's sustained GEMM caps and without them.
"""

from __future__ import annotations

import os
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

from pipesim.plan import ModelSpec, plan
from pipesim.plan.gpu import LayerTime, kernel_seconds, layer_times
from pipesim.plan.hardware import Accelerator, get_accelerator
from pipesim.plan.kernels import Shard, layer_kernels
from pipesim.plan.layers import model_flops_per_sequence
from pipesim.plan.model import get_model
from pipesim.plan.result import PlanPoint, PlanResult


@dataclass(frozen=True, slots=True, kw_only=True)
class Run:
    """One published run: its shapes, degrees and what was measured."""

    name: str
    layers: int
    hidden: int
    heads: int
    tensor: int
    pipeline: int
    gpus: int
    global_batch: int
    published: float
    """Seconds per iteration (Table 5) or teraFLOP/s per GPU (the other two)."""
    virtual: int = 1
    microbatch: int = 1
    recompute: str = "none"
    sequence_parallel: bool = False
    overlap_grad_reduce: bool | None = None
    """Whether the data-parallel reduction hides behind the backward; None: the table's."""
    context: int = 1
    seq: int | None = None
    """Tokens per sequence where a table's rows differ in it; None: the table's model's."""
    preset: str = ""
    """The model preset (pipesim/data/models.json) where a table's rows differ in it."""
    dtype: str = ""
    """The training precision where a table's rows differ in it (``fp8``, ``bf16``)."""
    fp8_recipe: str = ""
    """An fp8 run's scaling recipe (``delayed``, ``tensorwise``); empty: the model's."""
    tp_comm_overlap: bool | None = None
    """Whether tensor-parallel collectives hide under the GEMMs; None: the table's."""
    overlap_p2p: bool | None = None
    """Whether pipeline sends run beside compute; None: the table's."""
    expert: int = 1
    """Expert-parallel size (a mixture-of-experts preset's routed experts split over it)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Table:
    title: str
    accelerator: str
    runs: tuple[Run, ...]
    assumed: str
    """What the source does not print, assumed for every row."""
    model: Callable[[Run], ModelSpec]
    measure: str
    """``seconds``, ``tflops`` or ``tokens`` (tokens a second per GPU)."""
    flops: Callable[[Run, ModelSpec], float] | None = None
    """FLOPs of one iteration as the source counts them (for teraFLOP/s); for ``tokens``,
    the tokens of one iteration."""
    distributed_optimizer: bool = False
    tp_comm_overlap: bool = False
    overlap_p2p: bool = False
    overlap_grad_reduce: bool = False
    target_mean: float = 0.06
    target_max: float | None = None
    must_fit: bool = True
    """Whether the memory model must find every run fits (tests/test_plan_kernels.py): every
    table but Llama 3's, whose sharded gradients the planner does not model
    (docs/planner-model.md, "How close it is")."""


def _gpt(
    run: Run, *, seq: int, vocab: int, dtype: str, flash: bool, tied: bool = True
) -> ModelSpec:
    # tied embeddings: Megatron-LM's GPT shares the input embedding with the LM head
    # unless --untie-embeddings-and-output-weights is passed (megatron/training/arguments.py)
    return ModelSpec(
        tied_embeddings=tied,
        n_layers=run.layers,
        hidden=run.hidden,
        n_heads=run.heads,
        seq_length=seq,
        vocab_size=vocab,
        dtype=dtype,
        flash_attention=flash,
        dropout=not flash,
        name=run.name,
    )


def _korthikanti_runs() -> tuple[Run, ...]:
    rows = (  # name, layers, hidden, heads, t, p, v, GPUs, micro-batch, global, full s, present s
        ("22B", 48, 6144, 64, 8, 1, 1, 8, 4, 4, 1.42, 1.10),
        ("175B", 96, 12288, 96, 8, 8, 3, 64, 1, 64, 18.13, 13.75),
        ("530B", 105, 20480, 128, 8, 35, 3, 280, 1, 280, 49.05, 37.83),
        ("1T", 128, 25600, 160, 8, 64, 1, 512, 1, 512, 94.42, 71.49),
    )
    runs = []
    for name, layers, hidden, heads, t, p, v, gpus, b, batch, full, present in rows:
        base = Run(
            name=f"{name} full",
            layers=layers,
            hidden=hidden,
            heads=heads,
            tensor=t,
            pipeline=p,
            virtual=v,
            gpus=gpus,
            microbatch=b,
            global_batch=batch,
            recompute="full",
            published=full,
        )
        runs.append(base)
        runs.append(
            replace(
                base,
                name=f"{name} present",
                recompute="selective",
                sequence_parallel=True,
                published=present,
            )
        )
    return tuple(runs)


def _narayanan_runs() -> tuple[Run, ...]:
    # params (B), heads, hidden, layers, t, p, GPUs, global batch, TFLOP/s (Table 1); then
    # from examples/sc21/run_table_1.sh: MBS, layers per virtual stage
    # (--num-layers-per-virtual-pipeline-stage; 0: none) and --DDP-impl
    rows = (
        (1.7, 24, 2304, 24, 1, 1, 32, 512, 137, 16, 0, "torch"),
        (3.6, 32, 3072, 30, 2, 1, 64, 512, 138, 16, 0, "torch"),
        (7.5, 32, 4096, 36, 4, 1, 128, 512, 142, 16, 0, "torch"),
        (18.4, 48, 6144, 40, 8, 1, 256, 1024, 135, 8, 0, "torch"),
        (39.1, 64, 8192, 48, 8, 2, 512, 1536, 138, 4, 0, "local"),
        (76.1, 80, 10240, 60, 8, 4, 1024, 1792, 140, 2, 5, "local"),
        (145.6, 96, 12288, 80, 8, 8, 1536, 2304, 148, 2, 5, "local"),
        (310.1, 128, 16384, 96, 8, 16, 1920, 2160, 155, 1, 3, "local"),
        (529.6, 128, 20480, 105, 8, 35, 2520, 2520, 163, 1, 1, "local"),
        (1008.0, 160, 25600, 128, 8, 64, 3072, 3072, 163, 1, 0, "local"),
    )
    return tuple(
        Run(
            name=f"{params:g}B",
            heads=heads,
            hidden=hidden,
            layers=layers,
            tensor=t,
            pipeline=p,
            gpus=gpus,
            global_batch=batch,
            published=tflops,
            microbatch=mbs,
            virtual=layers // (p * per_virtual) if per_virtual else 1,
            recompute="full",
            # torch's DistributedDataParallel all-reduces its buckets during the
            # backward; Megatron-LM's local DDP of 2021 after it (allreduce_gradients)
            overlap_grad_reduce=ddp == "torch",
        )
        for params, heads, hidden, layers, t, p, gpus, batch, tflops, mbs, per_virtual, ddp in rows
    )


def _megatron_h100_runs() -> tuple[Run, ...]:
    rows = (  # name, heads, hidden, layers, t, p, DP, GPUs, global batch, TFLOP/s
        ("1.7B", 16, 2048, 24, 1, 1, 48, 48, 192, 408.8),
        ("7.1B", 32, 4096, 30, 2, 1, 48, 96, 192, 465.9),
        ("16B", 48, 6144, 32, 4, 1, 48, 192, 192, 489.1),
        ("32B", 56, 7168, 48, 8, 1, 48, 384, 192, 459.6),
        ("70B", 64, 8192, 84, 8, 2, 48, 768, 384, 419.7),
        ("119B", 80, 10240, 92, 8, 4, 48, 1536, 768, 420.5),
        ("177B", 96, 12288, 96, 8, 6, 48, 2304, 1152, 432.8),
        ("314B", 128, 16384, 96, 8, 8, 48, 3072, 1536, 474.4),
        ("462B", 144, 18432, 112, 8, 16, 48, 6144, 3072, 459.9),
    )
    return tuple(
        Run(
            name=name,
            heads=heads,
            hidden=hidden,
            layers=layers,
            tensor=t,
            pipeline=p,
            gpus=gpus,
            global_batch=batch,
            published=tflops,
            sequence_parallel=t > 1,
        )
        for name, heads, hidden, layers, t, p, _dp, gpus, batch, tflops in rows
    )


#: Table 4's third row: the 128K-token stage, context parallel 16.
LONG_CONTEXT_ROW = ("405B 128K", 16384, 8, 16, 16, 8, 131072, 16, 380.0)


def _llama3_runs(*, long_context: bool = False) -> tuple[Run, ...]:
    # Grattafiori et al. 2024 ("The Llama 3 Herd of Models", arXiv 2407.21783), Table 4:
    # GPUs, TP, CP, PP, DP, sequence length, batch size per DP replica (sequences),
    # TFLOP/s per GPU
    rows = (
        ("405B 8K", 8192, 8, 1, 16, 64, 8192, 32, 430.0),
        ("405B 8K", 16384, 8, 1, 16, 128, 8192, 16, 400.0),
    ) + ((LONG_CONTEXT_ROW,) if long_context else ())
    spec = get_model("llama3.1-405b")
    return tuple(
        _preset_run(
            "llama3.1-405b",
            name=name,
            tensor=t,
            context=c,
            pipeline=p,
            gpus=gpus,
            global_batch=dp * per_replica,
            seq=seq,
            published=tflops,
            sequence_parallel=True,
            # section 3.3.2 balances the pipeline by taking one layer from the first and
            # the last stage, so that "the first model chunk on the first stage has only
            # the embedding, and the last model chunk on the last stage has only output
            # projection and loss calculation": chunks of one layer, 126 + 2 = 16 x 8
            virtual=(spec.n_layers + 2) // p,
        )
        for name, gpus, t, c, p, dp, seq, per_replica, tflops in rows
    )


def _llama3_model(run: Run) -> ModelSpec:
    spec = get_model(run.preset)
    return replace(spec, seq_length=run.seq or spec.seq_length)


def _preset_run(preset: str, /, **fields: Any) -> Run:
    """A Run of ``preset``'s shapes (layers, hidden, heads) and the row's ``fields``."""
    spec = get_model(preset)
    return Run(
        preset=preset, layers=spec.n_layers, hidden=spec.hidden, heads=spec.n_heads, **fields
    )


def _nvidia_run(
    name: str,
    preset: str,
    gpus: int,
    batch: int,
    mbs: int,
    seq: int,
    t: int,
    p: int,
    c: int,
    v: int,
    tokens: float,
    **settings: object,
) -> Run:
    return _preset_run(
        preset,
        name=name,
        gpus=gpus,
        global_batch=batch,
        microbatch=mbs,
        seq=seq,
        tensor=t,
        pipeline=p,
        context=c,
        virtual=v,
        published=tokens,
        # Megatron-Bridge's WorkloadBaseConfig.sequence_parallel (tp > 1) and the NeMo
        # 24.07 launcher's model configs (sequence_parallel true wherever t > 1)
        sequence_parallel=t > 1,
        dtype="fp8",
        **settings,
    )


def _bridge_runs() -> tuple[Run, ...]:
    # NVIDIA-NeMo/Megatron-Bridge docs/performance-summary-archive.md, "25.11 NeMo
    # Container" and "26.02 NeMo Container", DGX-H100 rows of the dense models pipesim has
    # presets for, all FP8 (current scaling): name, preset, GPUs, GBS, MBS, sequence, TP,
    # PP, CP, VP (n/a: 1), tokens/s/GPU. FSDP is 0 on every row but the 8B's (8).
    rows = (
        ("8B 25.11", "llama3-8b", 8, 128, 1, 8192, 1, 1, 1, 1, 14451),
        ("70B 25.11", "llama3-70b", 64, 128, 1, 8192, 4, 8, 1, 5, 1602),
        ("405B 25.11", "llama3.1-405b", 1024, 512, 1, 8192, 8, 8, 2, 8, 292),
        ("70B 26.02", "llama3-70b", 64, 256, 1, 8192, 4, 8, 1, 5, 1621),
        ("405B 26.02", "llama3.1-405b", 1024, 1536, 1, 8192, 8, 8, 2, 8, 311),
    )
    # tp_comm_overlap: the recipes' CommOverlapConfig(tp_comm_overlap=True) with the
    # userbuffers_fp8_h100_* configs (70B, 405B); the 8B's is tp > 1 (off at t = 1).
    # overlap_p2p: Megatron-Bridge's CommOverlapConfig turns overlap_p2p_comm on where
    # PP > 1 and VP > 1 (every pipelined row here). fp8_recipe: the performance scripts'
    # compute_dtype fp8_cs is bf16_with_fp8_current_scaling_mixed (fp8_recipe
    # "tensorwise", src/megatron/bridge/training/mixed_precision.py at v0.2.0 and v0.3.0)
    return tuple(
        _nvidia_run(
            name, preset, gpus, gbs, mbs, seq, t, p, c, v, tokens,
            tp_comm_overlap=t > 1, overlap_p2p=v > 1, fp8_recipe="tensorwise",
        )
        for name, preset, gpus, gbs, mbs, seq, t, p, c, v, tokens in rows
    )  # fmt: skip


def _nemo_runs() -> tuple[Run, ...]:
    # NVIDIA/NeMo docs/source/performance/performance_summary.md, "Pretraining", NeMo 24.07
    # container, DGX-H100, FP8: name, preset, GPUs, GBS, MBS, sequence, TP, PP, CP, VP,
    # tokens/s/GPU; then from the NeMo-Framework-Launcher 24.07 model configs
    # (launcher_scripts/conf/training/...): ub_tp_comm_overlap, overlap_p2p_comm, recompute
    rows = (
        ("GPT3-175B 128", "gpt3-175b", 128, 256, 1, 2048, 4, 8, 1, 6, 726, False, True, "none"),
        ("GPT3-175B 512", "gpt3-175b", 512, 2048, 2, 2048, 4, 8, 1, 6, 782, False, True, "none"),
        ("LLAMA2-7B", "llama2-7b", 8, 128, 1, 4096, 1, 1, 1, 1, 16847, False, False, "none"),
        ("LLAMA2-13B", "llama2-13b", 16, 128, 1, 4096, 1, 4, 1, 10, 8646, False, True, "none"),
        ("LLAMA2-70B", "llama2-70b", 64, 128, 1, 4096, 4, 4, 1, 20, 1707, True, True, "none"),
        ("Nemotron-340B", "nemotron4-340b", 128, 32, 1, 4096, 8, 8, 1, 12, 322, False, False,
         "selective"),
        ("LLAMA3-8B", "llama3-8b", 8, 128, 1, 8192, 1, 1, 2, 1, 12036, False, False, "none"),
        ("LLAMA3-70B", "llama3-70b", 64, 128, 1, 8192, 4, 4, 2, 5, 1533, True, True, "none"),
    )  # fmt: skip
    return tuple(
        _nvidia_run(
            name, preset, gpus, gbs, mbs, seq, t, p, c, v, tokens,
            tp_comm_overlap=tp, overlap_p2p=p2p, recompute=recompute,
        )
        for name, preset, gpus, gbs, mbs, seq, t, p, c, v, tokens, tp, p2p, recompute in rows
    )  # fmt: skip


def _bridge_moe_runs() -> tuple[Run, ...]:
    # NVIDIA-NeMo/Megatron-Bridge docs/performance-summary-archive.md, "26.02 NeMo
    # Container" and "25.11 NeMo Container", DGX-H100 rows of the MoE models pipesim has
    # presets for, FP8 (26.02) / FP8-CS (25.11), FSDP 0, CP 1, "token-dropless" with the
    # token distribution "force-balance[d]": name, preset, GPUs, GBS, MBS, sequence, TP,
    # PP, VP, EP, tokens/s/GPU.
    # Left out: GPT OSS 120B (no preset: attention sinks, alternating sliding-window
    # layers and biased experts, none modelled); DeepSeekV3 (25.09, 1024 GPUs, TP2 PP8 VP4
    # EP64, 1297 tokens/s/GPU): the table prints no precision, and the 25.09 H100 script
    # (scripts/performance/run_script.py at v0.1.0rc4) recomputes the modules
    # ["mla_up_proj", "mlp"] (the MLA up-projections and the whole MoE MLP, its
    # all-to-alls included) and keeps the recipe's multi-token-prediction layer
    # (mtp_num_layers 1, layout "Et|(tt|)*30mL"), none of which pipesim expresses.
    rows = (
        ("30B-A3B 26.02", "qwen3-30b-a3b", 16, 1024, 1, 4096, 1, 2, 12, 8, 5113),
        ("235B-A22B 26.02", "qwen3-235b-a22b", 256, 8192, 1, 4096, 2, 8, 4, 32, 1633),
        ("30B-A3B 25.11", "qwen3-30b-a3b", 16, 512, 2, 4096, 1, 2, 24, 8, 5275),
        ("235B-A22B 25.11", "qwen3-235b-a22b", 256, 2048, 1, 4096, 2, 8, 4, 32, 1575),
    )
    # tp_comm_overlap: the 235B H100 configs pass CommOverlapConfig(tp_comm_overlap=False)
    # (qwen3_235b_a22b_h100_config at v0.2.0, qwen3_235b_a22b_pretrain_config_h100 at
    # v0.3.0); the 30B runs at t = 1. overlap_p2p: CommOverlapConfig turns it on with
    # VP > 1 (every row); fp8_recipe: the scripts' fp8_cs, as for the dense rows above
    return tuple(
        _nvidia_run(
            name, preset, gpus, gbs, mbs, seq, t, p, 1, v, tokens,
            expert=e, tp_comm_overlap=False, overlap_p2p=v > 1, fp8_recipe="tensorwise",
        )
        for name, preset, gpus, gbs, mbs, seq, t, p, v, e, tokens in rows
    )  # fmt: skip


def _nvidia_model(run: Run) -> ModelSpec:
    """``run``'s preset at its sequence length and precision, the vocabulary padded as
    Megatron pads it (to a multiple of 128 t: ``make_vocab_size_divisible_by`` 128 times
    the tensor-parallel size; Megatron-Bridge's ``should_pad_vocab``, NeMo's
    ``_vocab_size_with_padding``), attention in Transformer Engine's fused kernel."""
    spec = get_model(run.preset)
    multiple = 128 * run.tensor
    return replace(
        spec,
        seq_length=run.seq or spec.seq_length,
        vocab_size=-(-spec.vocab_size // multiple) * multiple,
        dtype=run.dtype or spec.dtype,
        fp8_recipe=run.fp8_recipe or spec.fp8_recipe,
        # both releases' recipes keep and reduce the gradients in bf16 (Megatron-Bridge's
        # grad_reduce_in_fp32 False; NeMo 24.07's grad_sync_dtype bf16)
        grad_reduce_in_bf16=True,
        # GPT-3 175B's preset is the 2020 paper's unfused attention; NeMo 24.07 runs
        # Megatron-Core with Transformer Engine (mcore_gpt, transformer_engine: true),
        # whose DotProductAttention picks the fused kernel, dropout 0.1 kept (its config)
        flash_attention=True,
    )


def _tokens_per_second(run: Run, spec: ModelSpec) -> float:
    """Tokens of one iteration (the measure divides them by seconds and GPUs)."""
    return run.global_batch * spec.seq_length


def _narayanan_flops(run: Run, spec: ModelSpec) -> float:
    # Narayanan et al. 2021, Eq. 3: 96 B s l h^2 (1 + s / 6h + V / 16lh)
    s, h, l, v = spec.seq_length, spec.hidden, spec.n_layers, spec.vocab_size
    return 96 * run.global_batch * s * l * h * h * (1 + s / (6 * h) + v / (16 * l * h))


def _model_flops(run: Run, spec: ModelSpec) -> float:
    # Megatron-LM's num_floating_point_operations: the model FLOPs, no recomputation
    return model_flops_per_sequence(spec) * run.global_batch


TABLES = (
    Table(
        title="Korthikanti et al. 2023, Table 5 (seconds per iteration), A100 80GB",
        accelerator="a100-80gb",
        runs=_korthikanti_runs(),
        assumed="fp16, dropout, unfused attention (the paper's setting), tied embeddings "
        "(Megatron-LM's default); no data "
        "parallelism; interleaving as Calculon's validation encodes it",
        model=lambda run: _gpt(run, seq=2048, vocab=51200, dtype="fp16", flash=False),
        measure="seconds",
        target_mean=0.035,
        target_max=0.08,
    ),
    Table(
        title="Narayanan et al. 2021, Table 1 (teraFLOP/s per GPU), A100 80GB",
        accelerator="a100-80gb",
        runs=_narayanan_runs(),
        assumed="micro-batch size, interleaving and DDP as examples/sc21/run_table_1.sh "
        "sets them (torch DDP: the all-reduce overlaps the backward; local: after it), "
        "full recomputation (the paper's Eq. 3 counts it; the script's uniform "
        "checkpointing), fp16, unfused attention, no distributed optimizer, no sequence "
        "parallelism, tied embeddings (Megatron-LM's default)",
        model=lambda run: _gpt(run, seq=2048, vocab=51200, dtype="fp16", flash=False),
        measure="tflops",
        flops=_narayanan_flops,
    ),
    Table(
        title="Megatron-LM README, H100 weak scaling (teraFLOP/s per GPU), H100 SXM",
        accelerator="h100-sxm",
        runs=_megatron_h100_runs(),
        assumed="GPT shapes (ffn 4h, GeLU, multi-head attention, no GQA), bf16, flash "
        "attention, no dropout, micro-batch 1, no recomputation, no interleaving, no "
        "context parallelism, sequence parallelism wherever t > 1, distributed optimizer, "
        "blocking pipeline sends (no interleaving, so Megatron-LM overlaps none), "
        "untied embeddings (the rows' names are the untied parameter counts)",
        # the names are the untied counts (1.75B, 7.13B, 16.1B, ... 461.5B; tied they
        # would read 1.49B, 6.60B, 15.3B, ... 459.1B): --untie-embeddings-and-output-weights
        model=lambda run: _gpt(run, seq=4096, vocab=131072, dtype="bf16", flash=True, tied=False),
        measure="tflops",
        flops=_model_flops,
        distributed_optimizer=True,
        tp_comm_overlap=True,
        # the README overlaps "pipeline-parallel communication (enabled by default)", but
        # Megatron-LM turns overlap_p2p_comm off without interleaving ("non-interleaved
        # schedule does not support overlapping p2p communication", arguments.py and
        # schedules.py at core_r0.8.0), and the table prints no interleaving
        overlap_p2p=False,
        overlap_grad_reduce=True,
    ),
    Table(
        title="Grattafiori et al. 2024 (Llama 3), Table 4: 405B pre-training (teraFLOP/s per "
        "GPU), H100 SXM; outside ../shared/PUBLISHED_RUNS.md",
        accelerator="h100-sxm",
        runs=_llama3_runs(),
        assumed="the llama3.1-405b preset (bf16, fused attention, SwiGLU, 8 KV heads), "
        "micro-batch 1 (one sequence), interleaved 1F1B with chunks of one layer (the "
        "paper's layer balancing), sequence parallelism, no recomputation (the paper "
        "names none), the paper's FSDP as Megatron-LM's distributed optimizer (optimizer "
        "state sharded; its sharded gradients are not modelled), the reduction and the "
        "weight all-gather overlapped, "
        "asynchronous pipeline sends, tensor-parallel collectives exposed (the paper "
        "names no overlap of them), Megatron-LM's FLOP count (the paper prints none)",
        model=_llama3_model,
        measure="tflops",
        flops=_model_flops,
        distributed_optimizer=True,
        overlap_p2p=True,
        overlap_grad_reduce=True,
        must_fit=False,
    ),
    Table(
        title="NVIDIA Megatron-Bridge performance summary (25.11 and 26.02 NeMo containers), "
        "DGX-H100, FP8 current scaling (tokens/s per GPU); outside ../shared/PUBLISHED_RUNS.md",
        accelerator="h100-sxm",
        runs=_bridge_runs(),
        assumed="the rows print GPUs, GBS, MBS, sequence, FSDP, TP, PP, CP, VP, EP, GA; "
        "the rest as the H100 recipes at the release tags set it (Megatron-Bridge v0.2.0 for "
        "25.11, v0.3.0 for 26.02: scripts/performance/configs/llama*, "
        "src/megatron/bridge/recipes/llama/llama3.py): presets llama3-8b / llama3-70b / "
        "llama3.1-405b, vocabulary 128256 padded to 128 t, FP8 GEMMs in every layer "
        "(first_last_layers_bf16 False), Transformer Engine's current-scaling casts "
        "(fp8_recipe tensorwise: an amax pass before each cast; the amax all-reduces "
        "not priced), the LM head in bf16 (Megatron-Core's ColumnParallelLinear), "
        "sequence parallelism where t > 1, no recomputation, no CUDA graphs (the H100 "
        "configs set none), distributed optimizer with the gradient reduce-scatter and "
        "the weight all-gather overlapped, TP communication overlap (userbuffers) where "
        "t > 1, asynchronous pipeline sends (overlap_p2p_comm, VP > 1), gradients kept and "
        "reduced in bf16 (grad_reduce_in_fp32 False). Not expressible, priced as the "
        "nearest: the 8B row's "
        "Megatron FSDP (optim_grads_params: weights, gradients and optimizer state "
        "sharded over 8) as the distributed optimizer (optimizer state sharded); the "
        "405B's account_for_embedding/loss_in_pipeline_split as pipesim's own balancing",
        model=_nvidia_model,
        measure="tokens",
        flops=_tokens_per_second,
        distributed_optimizer=True,
        overlap_grad_reduce=True,
    ),
    Table(
        title="NVIDIA NeMo performance summary (NeMo 24.07 container), DGX-H100, FP8 "
        "(tokens/s per GPU); outside ../shared/PUBLISHED_RUNS.md",
        accelerator="h100-sxm",
        runs=_nemo_runs(),
        assumed="the rows print GPUs, GBS, MBS, sequence, TP, PP, CP, VP; the rest as the "
        "NeMo-Framework-Launcher 24.07 model configs (launcher_scripts/conf/training/"
        "gpt3/175b, llama/llama2_*, llama/llama3_*, nemotron/nemotron_340b) and its H100 "
        "FP8 example scripts (examples/training/*/h100/*_fp8*.sh) set it: FP8 delayed "
        "scaling (hybrid: Transformer Engine's casts priced, its amax bookkeeping not; "
        "the LM head in bf16), sequence parallelism where "
        "t > 1, recomputation none but the 340B's (selective), TP communication overlap "
        "on the Llama 2 / 3 70B only (ub_tp_comm_overlap; off in the GPT-3 and 340B "
        "configs), asynchronous pipeline sends where the config sets overlap_p2p_comm "
        "(GPT-3, Llama 2 13B / 70B, Llama 3 70B; the 340B's batch_p2p_comm blocks), "
        "distributed_fused_adam with overlap_grad_sync and overlap_param_sync (the "
        "distributed optimizer, both overlapped), vocabulary padded to 128 t (GPT-3 50257, "
        "Llama 2 32000, Llama 3 128256, Nemotron-4 256000), GPT-3 with its hidden and "
        "attention dropout 0.1 and tied embeddings in the fused attention kernel, "
        "gradients kept and reduced in bf16 (grad_sync_dtype bf16, the example scripts' "
        "and the 340B config's; apex's distributed Adam also shards them, not modelled). "
        "The GPT-3 scripts set VP 12; the table prints 6, used here; "
        "the 340B has no 24.07 example script, so its config file's settings are used",
        model=_nvidia_model,
        measure="tokens",
        flops=_tokens_per_second,
        distributed_optimizer=True,
        overlap_grad_reduce=True,
    ),
    Table(
        title="NVIDIA Megatron-Bridge performance summary (25.11 and 26.02 NeMo containers), "
        "DGX-H100 mixture-of-experts rows, FP8 current scaling (tokens/s per GPU); outside "
        "../shared/PUBLISHED_RUNS.md",
        accelerator="h100-sxm",
        runs=_bridge_moe_runs(),
        assumed="the rows print GPUs, GBS, MBS, sequence, FSDP, TP, PP, CP, VP, EP, GA; "
        "the rest as the H100 recipes at the release tags set it (Megatron-Bridge v0.2.0 for "
        "25.11, v0.3.0 for 26.02: scripts/performance/configs/qwen3*/, "
        "src/megatron/bridge/recipes/qwen/qwen3_moe.py, models/qwen/qwen_provider.py): "
        "presets qwen3-30b-a3b / qwen3-235b-a22b, vocabulary 151936 padded to 128 t, FP8 "
        "GEMMs in every layer (first_last_layers_bf16 False), Transformer Engine's "
        "current-scaling casts of the attention and dense linears (fp8_recipe tensorwise; "
        "the grouped expert GEMMs' casts and the amax all-reduces not priced), the LM head "
        "in bf16, expert tensor parallelism 1, grouped expert GEMMs "
        "(moe_grouped_gemm), dropless balanced routing (moe_router_force_load_balancing), "
        "sequence parallelism where t > 1, no recomputation (set_qwen3_common_configs "
        "clears the recipe's), distributed optimizer with the gradient reduce-scatter and "
        "the weight all-gather overlapped, gradients kept and reduced in bf16 "
        "(grad_reduce_in_fp32 False), TP communication overlap off (the 235B's H100 "
        "config; the 30B runs at t = 1), asynchronous pipeline sends (VP > 1). Not "
        "expressible, priced as the nearest: the expert all-to-all overlapped with the "
        "other micro-batch's compute (moe_a2a_overlap: overlap_moe_expert_parallel_comm "
        "and delay_wgrad_compute, every row) as exposed; the 26.02 30B's DeepEP dispatcher "
        "(moe_flex_dispatcher_backend deepep) as the all-to-all dispatcher the others use; "
        "the 235B's account_for_embedding/loss_in_pipeline_split as pipesim's own "
        "balancing; the TE-fused cross-entropy (cross_entropy_fusion_impl te) as "
        "Megatron-LM's unfused loss; the 25.11 30B's "
        "MBS 2 and VP 24 as the table prints them (the v0.2.0 config: MBS 1, VP 12)",
        model=_nvidia_model,
        measure="tokens",
        flops=_tokens_per_second,
        distributed_optimizer=True,
        overlap_grad_reduce=True,
        # pipesim's memory model refuses the 25.11 30B row (MBS 2, VP 24): 86.1 GiB a
        # GPU, 53.9 of it activations (docs/planner-model.md, "How close it is")
        must_fit=False,
    ),
)


@dataclass(frozen=True, slots=True, kw_only=True)
class LayerRun:
    """One row of Korthikanti et al. 2023, Table 4: one layer of the 22B model."""

    name: str
    recompute: str
    sequence_parallel: bool
    forward_ms: float
    backward_ms: float


#: Korthikanti et al. 2023 (arXiv 2205.05198), Table 4, "Time to complete the forward and
#: backward pass of a single transformer layer of the 22B model" (its Table 3: 64 heads,
#: hidden 6144, t = 8, micro-batch 4, sequence 2048; A100 80GB, mixed precision).
TABLE4 = (
    LayerRun(name="baseline", recompute="none", sequence_parallel=False,
             forward_ms=7.7, backward_ms=11.9),
    LayerRun(name="sequence parallel", recompute="none", sequence_parallel=True,
             forward_ms=7.2, backward_ms=11.8),
    LayerRun(name="full recompute", recompute="full", sequence_parallel=False,
             forward_ms=7.7, backward_ms=19.5),
    LayerRun(name="selective", recompute="selective", sequence_parallel=False,
             forward_ms=7.7, backward_ms=13.2),
    LayerRun(name="selective + sp", recompute="selective", sequence_parallel=True,
             forward_ms=7.2, backward_ms=13.1),
)  # fmt: skip
#: Table 4's 22B as Table 3 runs it (t = 8, micro-batch 4): the first Table 5 row's shapes.
TABLE4_RUN = _korthikanti_runs()[0]


def layer_time(row: LayerRun) -> LayerTime:
    """The planner's F, I and W of one 22B block in ``row``'s mode (Table 5's model)."""
    korthikanti = TABLES[0]
    shard = Shard(
        microbatch_size=TABLE4_RUN.microbatch,
        tensor=TABLE4_RUN.tensor,
        sequence_parallel=row.sequence_parallel,
        recompute=row.recompute,
    )
    spec = korthikanti.model(TABLE4_RUN)
    return layer_times(spec, shard, get_accelerator(korthikanti.accelerator))["block"]


def layer_check() -> None:
    """Print Table 4 against the planner's layer, and the 22B steps outside the layers."""
    print("\nKorthikanti et al. 2023, Table 4 (ms for one layer of the 22B, t = 8, micro-batch 4)")
    header = ("experiment", "F pub", "F", "error", "B pub", "B", "error", "F+B pub", "F+B")
    widths = (18, 6, 6, 7, 6, 6, 7, 8, 6)
    cells = " ".join(f"{name:>{width}}" for name, width in zip(header, widths, strict=True))
    print(f"  {cells} {'error':>7}  B: compute + exposed TP")
    sums: dict[str, tuple[float, float]] = {}
    for row in TABLE4:
        t = layer_time(row)
        f = t.forward.total_s * 1e3
        b = (t.input_grad.total_s + t.weight_grad.total_s) * 1e3
        compute = (t.input_grad.compute_s + t.weight_grad.compute_s) * 1e3
        pub = row.forward_ms + row.backward_ms
        sums[row.name] = (pub, f + b)
        print(
            f"  {row.name:>18} {row.forward_ms:>6.1f} {f:>6.2f} {f / row.forward_ms - 1:>+7.1%} "
            f"{row.backward_ms:>6.1f} {b:>6.2f} {b / row.backward_ms - 1:>+7.1%} {pub:>8.1f} "
            f"{f + b:>6.2f} {(f + b) / pub - 1:>+7.1%}  {compute:.2f} + {b - compute:.2f}"
        )
    # Table 5's 22B rows are Table 4's "full recompute" and "selective + sp" layers, 48 of
    # them, and what the step runs besides (embedding, head and loss, optimizer)
    korthikanti = TABLES[0]
    for run, mode in zip(korthikanti.runs[:2], ("full recompute", "selective + sp"), strict=True):
        pub_layer, our_layer = sums[mode]
        pub_rest = run.published - run.layers * pub_layer / 1e3
        our_rest = predict_seconds(korthikanti, run) - run.layers * our_layer / 1e3
        print(
            f"  {run.name} (Table 5): outside the {run.layers} layers published "
            f"{pub_rest * 1e3:.0f} ms, predicted {our_rest * 1e3:.0f} ms"
        )


@dataclass(frozen=True, slots=True, kw_only=True)
class H100LayerRun:
    """One row of Transformer Engine's Getting Started benchmark: one GPT layer's
    forward and backward on one H100, the mean of 100 iterations."""

    name: str
    dtype: str
    dropout: bool
    fwd_bwd_ms: float


#: NVIDIA/TransformerEngine v2.12, ``docs/getting_started/``: ``getting_started_pytorch.py``
#: builds one GPT decoder layer (LayerNorm, QKV, causal attention, projection, GeLU MLP,
#: biases) of hidden 4096, ffn 16384, 32 heads, sequence 2048, batch 8, bf16, on one GPU;
#: ``speedometer`` (``getting_started_utils_pytorch.py``) times 100 iterations of forward,
#: ``y.sum()`` and backward between two CUDA events after 10 warm-up ones;
#: ``getting_started_pytorch.out`` holds the means; ``index.rst``: "on an NVIDIA H100 GPU"
#: (SXM or PCIe not said). The two rows pipesim can express: TE's fused attention with
#: TE's Linear and LayerNorm (bf16, attention and hidden dropout 0.1, the GeLU, dropouts
#: and residual adds unfused torch ops, pipesim's fused), and ``te.TransformerLayer`` in
#: FP8 (delayed scaling, HYBRID format, dropout 0).
TE_GETTING_STARTED = (
    H100LayerRun(name="TE Unfused + TE Attention", dtype="bf16", dropout=True,
                 fwd_bwd_ms=35.709),
    H100LayerRun(name="TE TransformerLayer + FP8", dtype="fp8", dropout=False,
                 fwd_bwd_ms=21.670),
)  # fmt: skip
TE_GETTING_STARTED_SHARD = Shard(microbatch_size=8, tensor=1)


def te_getting_started_model(row: H100LayerRun) -> ModelSpec:
    """The Getting Started layer as a one-layer GPT (fused attention, delayed scaling)."""
    return ModelSpec(
        n_layers=1, hidden=4096, n_heads=32, seq_length=2048, vocab_size=32768,
        ffn_hidden=16384, dtype=row.dtype, fp8_recipe="delayed", dropout=row.dropout,
        flash_attention=True, name="te-getting-started",
    )  # fmt: skip


def _kernel_class_ms(spec: ModelSpec, shard: Shard, accelerator: Accelerator) -> dict[str, float]:
    """F + I + W milliseconds of the block's kernels, by kind (GEMM, attention, ...)."""
    kernels = layer_kernels(spec, "block", shard)
    total: dict[str, float] = {}
    for kernel in (*kernels.forward, *kernels.input_grad, *kernels.weight_grad):
        seconds = kernel_seconds(
            kernel, accelerator, shard=shard, dtype_bytes=spec.dtype_bytes,
            fp8=spec.dtype == "fp8",
        )  # fmt: skip
        kind = type(kernel).__name__
        total[kind] = total.get(kind, 0.0) + seconds * 1e3
    return total


def h100_layer_check() -> None:
    """Print TE's Getting Started layer (H100) against the planner's F + I + W, with the
    sustained GEMM caps of the preset and without them (the burst rates)."""
    capped = get_accelerator("h100-sxm")
    burst = replace(capped, sustained_matmul_flops=None, fp8_sustained_matmul_flops=None)
    print(
        "\nTransformer Engine v2.12, Getting Started (ms forward + backward of one GPT layer, "
        "h 4096, s 2048, b 8, t 1, one H100)"
    )
    print(
        f"  {'experiment':>26} {'pub':>6} {'capped':>7} {'error':>7} {'burst':>7} "
        f"{'error':>7}  capped: GEMM + attention + streaming"
    )
    for row in TE_GETTING_STARTED:
        spec, shard = te_getting_started_model(row), TE_GETTING_STARTED_SHARD
        ms = {}
        for name, accelerator in (("capped", capped), ("burst", burst)):
            t = layer_times(spec, shard, accelerator)["block"]
            ms[name] = (t.forward.total_s + t.input_grad.total_s + t.weight_grad.total_s) * 1e3
        kinds = _kernel_class_ms(spec, shard, capped)
        pub = row.fwd_bwd_ms
        print(
            f"  {row.name:>26} {pub:>6.2f} {ms['capped']:>7.2f} {ms['capped'] / pub - 1:>+7.1%} "
            f"{ms['burst']:>7.2f} {ms['burst'] / pub - 1:>+7.1%}  {kinds['Gemm']:.2f} + "
            f"{kinds['Attention']:.2f} + {kinds['Streaming']:.2f}"
        )


#: Korthikanti et al. 2023, section 6.3: the 530B "present work" row at 8-way data
#: parallelism (2240 GPUs, the batch per model instance kept): "the time per iteration
#: increases slightly from 37.83 seconds to 39.15 seconds" (gradient all-reduces not
#: overlapped with the backward, as the table's rows).
DATA_PARALLEL_CHECK = (8, 39.15)


def data_parallel_check() -> None:
    """Print the 530B present row at 8-way data parallelism against section 6.3."""
    korthikanti = TABLES[0]
    run = next(r for r in korthikanti.runs if r.name == "530B present")
    d, published = DATA_PARALLEL_CHECK
    wide = replace(run, gpus=run.gpus * d, global_batch=run.global_batch * d)
    one, many = predict_seconds(korthikanti, run), predict_seconds(korthikanti, wide)
    print(
        f"\nKorthikanti et al. 2023, section 6.3: {run.name} at {d}-way data parallelism "
        f"({wide.gpus} GPUs)\n  published {published:.2f} s ({published - run.published:+.2f} "
        f"over {run.published:.2f}), predicted {many:.2f} s ({many - one:+.2f} over {one:.2f})"
    )


def long_context_check() -> None:
    """Llama 3's 128K-token row apart: at 128K tokens attention outweighs the rest of the
    model, so its teraFLOP/s depend on whether the paper counts the causal mask's half of
    the attention FLOPs, which it does not say; both counts are printed."""
    table = next(t for t in TABLES if t.model is _llama3_model)
    (run,) = _llama3_runs(long_context=True)[2:]
    spec = table.model(run)
    seconds = predict_seconds(table, run)
    full = _model_flops(run, spec)
    # Megatron-LM's count holds 12 s^2 l h of full attention per sequence (F and B)
    causal = full - 6 * spec.seq_length**2 * spec.n_layers * spec.hidden * run.global_batch
    print(f"\n{table.title.split(':')[0]}: the 128K-token row (context parallel 16), apart")
    for name, flops in (("full attention", full), ("causal half", causal)):
        predicted = flops / (seconds * run.gpus) / 1e12
        print(
            f"  counting {name:>14}: published {run.published:.1f} TFLOP/s, predicted "
            f"{predicted:.1f} ({predicted / run.published - 1:+.1%})"
        )


def moe_breakdown() -> None:
    """Where the MoE rows' predicted step goes (busiest rank): the pipeline, its bubble, the
    exposed tensor-parallel and data-parallel traffic, the optimizer, and the expert
    all-to-all of the rank's layers (inside the pipeline, all of it exposed)."""
    table = next(t for t in TABLES if t.runs == _bridge_moe_runs())
    print(f"\n{table.title.split(',')[0]}: where the MoE rows' predicted step goes (ms)")
    print(
        "  run: step = pipeline (bubble share; exposed TP; all-to-all; blocks' compute) + "
        "exposed DP + optimizer"
    )
    for run in table.runs:
        point = predict(table, run)
        spec = table.model(run)
        shard = Shard(
            microbatch_size=run.microbatch,
            tensor=run.tensor,
            sequence_parallel=run.sequence_parallel,
            expert=run.expert,
        )
        moe = layer_times(spec, shard, get_accelerator(table.accelerator))["moe block"]
        per_layer = moe.forward.ep_comm_s + moe.input_grad.ep_comm_s
        layers = point.n_microbatches * spec.n_layers / run.pipeline  # passes on a rank
        a2a = per_layer * layers
        passes = (moe.forward, moe.input_grad, moe.weight_grad)
        compute = sum(t.compute_s for t in passes) * layers
        parts = point.parts_s()
        assert parts is not None  # every row was simulated
        ms = {k: v * 1e3 for k, v in parts.items()}
        print(
            f"  {run.name}: {ms['step']:.0f} = {ms['pipeline']:.0f} "
            f"({float(point.bubble or 0):.1%}; {ms['tp_comm']:.0f}; {a2a * 1e3:.0f}; "
            f"{compute * 1e3:.0f}) + {ms['dp_comm']:.0f} + {ms['optimizer']:.0f}"
        )


def predict(table: Table, run: Run) -> PlanPoint:
    """The planner's configuration of ``run``, every dimension pinned."""
    return plan_of(table, run)[1]


def plan_of(table: Table, run: Run) -> tuple[PlanResult, PlanPoint]:
    """The planner's plan of ``run`` (every dimension pinned) and its configuration."""
    spec = table.model(run)
    overlap_grad_reduce = (
        table.overlap_grad_reduce if run.overlap_grad_reduce is None else run.overlap_grad_reduce
    )
    tp_comm_overlap = table.tp_comm_overlap if run.tp_comm_overlap is None else run.tp_comm_overlap
    overlap_p2p = table.overlap_p2p if run.overlap_p2p is None else run.overlap_p2p
    result = plan(
        spec,
        devices=run.gpus,
        accelerator=table.accelerator,
        global_batch=run.global_batch,
        tensor=[run.tensor],
        context_parallel=[run.context],
        expert_parallel=[run.expert],
        pipeline_parallel=[run.pipeline],
        virtual=[run.virtual],
        microbatch_sizes=[run.microbatch],
        schedules=["interleaved-1f1b" if run.virtual > 1 else "1f1b"],
        recompute=[run.recompute],
        sequence_parallel=[run.sequence_parallel],
        distributed_optimizer=[table.distributed_optimizer],
        tp_comm_overlap=tp_comm_overlap,
        overlap_p2p=overlap_p2p,
        overlap_grad_reduce=overlap_grad_reduce,
        memory_headroom=0.0,
        min_mfu=0.0,
        workers=1,
    )
    return result, next(p for p in result.points if p.feasible)


def predict_seconds(table: Table, run: Run) -> float:
    """The planner's step time of ``run``; says so when it would not fit."""
    point = predict(table, run)
    assert point.step_time_s is not None
    if not point.fits:  # every published run trained: the memory model must agree
        print(f"    {run.name}: does not fit by pipesim's memory model: {point.reason}")
    return point.step_time_s


def predicted_value(table: Table, run: Run) -> float:
    seconds = predict_seconds(table, run)
    if table.measure == "seconds":
        return seconds
    assert table.flops is not None
    per_gpu = table.flops(run, table.model(run)) / (seconds * run.gpus)
    return per_gpu if table.measure == "tokens" else per_gpu / 1e12


def main() -> int:
    print(f"cores: {os.cpu_count()}, load average: {os.getloadavg()[0]:.1f}")
    layer_check()
    h100_layer_check()
    data_parallel_check()
    long_context_check()
    moe_breakdown()
    missed = 0
    for table in TABLES:
        unit = {"seconds": "s", "tflops": "TFLOP/s", "tokens": "tokens/s"}[table.measure]
        print(f"\n{table.title}\n  assumed for every row: {table.assumed}")
        print(f"  {'run':>14} {'GPUs':>5} {'published ' + unit:>18} {'predicted':>10} {'error':>7}")
        errors = []
        start = time.perf_counter()
        for run in table.runs:
            predicted = predicted_value(table, run)
            error = predicted / run.published - 1
            errors.append(abs(error))
            print(
                f"  {run.name:>14} {run.gpus:>5} {run.published:>18.2f} {predicted:>10.2f} "
                f"{error:>+7.1%}"
            )
        mean, worst = statistics.fmean(errors), max(errors)
        goal = f"<= {table.target_mean:.1%} mean" + (
            f", <= {table.target_max:.0%} max" if table.target_max is not None else ""
        )
        met = mean <= table.target_mean and (table.target_max is None or worst <= table.target_max)
        missed += not met
        print(
            f"  mean |error| {mean:.1%}, max |error| {worst:.1%}  (goal {goal}: "
            f"{'met' if met else 'NOT met'}; {time.perf_counter() - start:.1f} s)"
        )
    return 1 if missed else 0


if __name__ == "__main__":
    sys.exit(main())
