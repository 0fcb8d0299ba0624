"""verify: replay a pipesim Schedule on real torch devices and prove it bit-identical.

This package imports torch; install it with ``pip install 'pipesim[verify]'``.

- :mod:`verify.models`: the chapter's MLP, a small GPT, a small Llama,
  ``package.module:factory`` models, in bf16 / fp16 or under autocast;
- :mod:`verify.blocks`: the GPT's and the Llama's layers;
- :mod:`verify.precision`: dtype names, autocast inside a model's layers;
- :mod:`verify.stage_cut`: cut an ``nn.Sequential`` into stages sharing its modules
  (the cut is :mod:`pipesim.partition`'s, the planner's);
- :mod:`verify.runtime`: what F, B, I, W do to a stage (both executors drive it);
- :mod:`verify.split_backward`: a backward as I now and W later, W from I's saved gradients;
- :mod:`verify.local`: run a Schedule in one process on a list of devices;
- :mod:`verify.dist`: one process per rank with torch.distributed (gloo on the CPU);
- :mod:`verify.launch`: start the rank processes, watch them with a deadline, stop them all;
- :mod:`verify.rank_status`: what each rank is doing, in words when a run fails or hangs;
- :mod:`verify.rank`: one rank's step (its program of compute, sends and receives);
- :mod:`verify.rank_results`: the ranks' results merged and checked against the unsplit model;
- :mod:`verify.timing`: when each unit ran (CUDA events read once per step on GPUs);
- :mod:`verify.transport`: untagged, ordered, header-checked messages between ranks;
- :mod:`verify.torchrun`: one rank per process under ``torchrun -m verify`` (NCCL on GPUs);
- :mod:`verify.crosscheck`: the same run by torch.distributed.pipelining, bit for bit;
- :mod:`verify.compare`: the exact check against the unsplit model (:func:`verify`);
- :mod:`verify.locate`: the action where a wrong gradient arose (a re-run checked per B / W);
- :mod:`verify.calibrate`: measured times -> Trace, cost model, predicted vs measured;
- :mod:`verify.measured`: the measured step as a trace file for ``pipesim plot --measured``;
- :mod:`verify.bit_identity`: the settings bit-identity needs, set or refused;
- :mod:`verify.fidelity`: calibrate on real ranks once, measure other schedules;
- :mod:`verify.allocator`: whether CPU rank processes keep the memory they free;
- :mod:`verify.report`: the report (what was compared, what matched, what it cost);
- :mod:`verify.errors`: verify's errors, part of pipesim's one hierarchy.

>>> from pipesim.schedules import generate
>>> verify(generate("gpipe", n_ranks=2, n_microbatches=4), model="mlp").bit_identical
True
"""

from __future__ import annotations

from verify.allocator import (
    ALLOCATOR_ENV,
    ALLOCATOR_MODES,
    DEFAULT_ALLOCATOR_MODE,
    allocator_mode,
    configure_allocator,
    minor_page_faults,
)
from verify.bit_identity import exact_settings, exactness_problems
from verify.blocks import Block, Embedding, Head, LlamaBlock, LlamaHead
from verify.calibrate import (
    as_run_schedule,
    calibrate,
    calibration_fit,
    calibration_meta,
    cost_file,
    measured_trace,
    save_costs,
    stage_bytes,
)
from verify.compare import (
    Reference,
    build_report,
    build_stages,
    locate_gradient_mismatch,
    reference_run,
    schedule_accumulation_orders,
    split_microbatches,
    step_rows,
    verify,
)
from verify.crosscheck import CrossCheck, crosscheck, crosscheck_all
from verify.dist import verify_distributed, verify_distributed_all
from verify.errors import ExactnessError, RunFailedError, VerifyError
from verify.fidelity import (
    BURN_IN,
    COPIES,
    MAX_REPEATS,
    MIN_SAMPLES,
    Measurement,
    burn_in_steps,
    calibrate_cut,
    fit_cut,
    measure,
    measure_all,
    threads_per_rank,
)
from verify.launch import PIN_ENV, as_rank, launch, pin_ranks, rank_cpus, shared_cores
from verify.local import (
    ActionTiming,
    LocalRun,
    TransferTiming,
    execution_order,
    parse_devices,
    run_schedule,
    transfer_table,
)
from verify.locate import first_gradient_difference, max_abs_diff, twin
from verify.measured import as_run_trace, measured_step_dict, write_measured_trace
from verify.models import (
    MODEL_NAMES,
    VerifyModel,
    from_factory,
    gpt,
    llama,
    llama_ffn_width,
    load_model,
    mlp,
    next_token_loss,
    with_precision,
)
from verify.precision import DTYPES, Autocast, dtype_name, parse_dtype
from verify.rank import (
    RankRunner,
    RankSpec,
    message_shapes,
    prepare_spec,
    run_rank,
    run_specs,
)
from verify.rank_results import assemble, locate_from_results, median_step, report_from_results
from verify.rank_status import (
    COMPUTING,
    FINISHED,
    STARTING,
    WAITING,
    current_schedule,
    describe_failure,
    describe_states,
    set_current_schedule,
    set_state,
    status_length,
)
from verify.report import (
    PAGE_FAULTS_NOTICED,
    VerifyReport,
    format_report,
    page_faults_line,
    steps_line,
)
from verify.runtime import PROFILE_ENV, SavedBytes, StageRuntime, profiled
from verify.split_backward import PendingWeights, input_backward, weight_backward
from verify.stage_cut import cut_stages, param_bytes
from verify.timing import (
    DeviceEvent,
    UnitClock,
    cuda_event,
    cuda_synchronize,
    median_step_index,
)
from verify.torchrun import TorchrunPlace, torchrun_place, verify_torchrun
from verify.transport import (
    HEADER_LENGTH,
    OrderedTransport,
    TransportError,
    decode_header,
    encode_header,
)

#: The old name of :func:`cut_stages`, still importable (``pipesim.partition.partition``
#: is the partitioner that picks the cut; this one cuts the torch model).
partition = cut_stages

__all__ = [
    "ALLOCATOR_ENV",
    "ALLOCATOR_MODES",
    "BURN_IN",
    "COMPUTING",
    "COPIES",
    "DEFAULT_ALLOCATOR_MODE",
    "DTYPES",
    "FINISHED",
    "HEADER_LENGTH",
    "MAX_REPEATS",
    "MIN_SAMPLES",
    "MODEL_NAMES",
    "PAGE_FAULTS_NOTICED",
    "PIN_ENV",
    "PROFILE_ENV",
    "STARTING",
    "WAITING",
    "ActionTiming",
    "Autocast",
    "Block",
    "CrossCheck",
    "DeviceEvent",
    "Embedding",
    "ExactnessError",
    "Head",
    "LlamaBlock",
    "LlamaHead",
    "LocalRun",
    "Measurement",
    "OrderedTransport",
    "PendingWeights",
    "RankRunner",
    "RankSpec",
    "Reference",
    "RunFailedError",
    "SavedBytes",
    "StageRuntime",
    "TorchrunPlace",
    "TransferTiming",
    "TransportError",
    "UnitClock",
    "VerifyError",
    "VerifyModel",
    "VerifyReport",
    "allocator_mode",
    "as_rank",
    "as_run_schedule",
    "as_run_trace",
    "assemble",
    "build_report",
    "build_stages",
    "burn_in_steps",
    "calibrate",
    "calibrate_cut",
    "calibration_fit",
    "calibration_meta",
    "configure_allocator",
    "cost_file",
    "crosscheck",
    "crosscheck_all",
    "cuda_event",
    "cuda_synchronize",
    "current_schedule",
    "cut_stages",
    "decode_header",
    "describe_failure",
    "describe_states",
    "dtype_name",
    "encode_header",
    "exact_settings",
    "exactness_problems",
    "execution_order",
    "first_gradient_difference",
    "fit_cut",
    "format_report",
    "from_factory",
    "gpt",
    "input_backward",
    "launch",
    "llama",
    "llama_ffn_width",
    "load_model",
    "locate_from_results",
    "locate_gradient_mismatch",
    "max_abs_diff",
    "measure",
    "measure_all",
    "measured_step_dict",
    "measured_trace",
    "median_step",
    "median_step_index",
    "message_shapes",
    "minor_page_faults",
    "mlp",
    "next_token_loss",
    "page_faults_line",
    "param_bytes",
    "parse_devices",
    "parse_dtype",
    "partition",  # old name of cut_stages
    "pin_ranks",
    "prepare_spec",
    "profiled",
    "rank_cpus",
    "reference_run",
    "report_from_results",
    "run_rank",
    "run_schedule",
    "run_specs",
    "save_costs",
    "schedule_accumulation_orders",
    "set_current_schedule",
    "set_state",
    "shared_cores",
    "split_microbatches",
    "stage_bytes",
    "status_length",
    "step_rows",
    "steps_line",
    "threads_per_rank",
    "torchrun_place",
    "transfer_table",
    "twin",
    "verify",
    "verify_distributed",
    "verify_distributed_all",
    "verify_torchrun",
    "weight_backward",
    "with_precision",
    "write_measured_trace",
]
