"""verify: replay a pipesim Schedule on real torch devices and prove it bit-identical.

This package imports torch; install it with ``pip install 'pipesim[verify]'``.

- :mod:`verify.models`: the chapter's MLP, a small GPT, ``package.module:factory`` models;
- :mod:`verify.partition`: cut an ``nn.Sequential`` into stages sharing its modules
  (the cut is :mod:`pipesim.partition`'s, the planner's);
- :mod:`verify.local`: run a Schedule in one process on a list of devices;
- :mod:`verify.dist`: one process per rank with torch.distributed (gloo, CPU ranks);
- :mod:`verify.compare`: the exact check against the unsplit model (:func:`verify`);
- :mod:`verify.calibrate`: measured times -> Trace, cost model, predicted vs measured;
- :mod:`verify.measured`: the measured step as a trace file for ``pipesim plot --measured``;
- :mod:`verify.exactness`: the settings exactness needs, set or refused;
- :mod:`verify.fidelity`: calibrate on real ranks once, measure other schedules.

>>> from pipesim.schedules import generate
>>> verify(generate("gpipe", n_ranks=2, n_microbatches=4), model="mlp").bit_identical
True
"""

from __future__ import annotations

from verify.calibrate import as_run_schedule, calibrate, measured_trace, save_costs
from verify.compare import (
    Reference,
    build_report,
    build_stages,
    reference_run,
    schedule_accumulation_orders,
    split_microbatches,
    verify,
)
from verify.dist import verify_distributed
from verify.errors import ExactnessError, VerifyError
from verify.exactness import exact_settings, exactness_problems
from verify.fidelity import Measurement, calibrate_cut, measure, threads_per_rank
from verify.local import (
    ActionTiming,
    LocalRun,
    TransferTiming,
    execution_order,
    parse_devices,
    run_schedule,
)
from verify.measured import as_run_trace, write_measured_trace
from verify.models import MODEL_NAMES, VerifyModel, from_factory, gpt, load_model, mlp
from verify.partition import param_bytes, partition
from verify.report import VerifyReport, format_report

__all__ = [
    "MODEL_NAMES",
    "ActionTiming",
    "ExactnessError",
    "LocalRun",
    "Measurement",
    "Reference",
    "TransferTiming",
    "VerifyError",
    "VerifyModel",
    "VerifyReport",
    "as_run_schedule",
    "as_run_trace",
    "build_report",
    "build_stages",
    "calibrate",
    "calibrate_cut",
    "exact_settings",
    "exactness_problems",
    "execution_order",
    "format_report",
    "from_factory",
    "gpt",
    "load_model",
    "measure",
    "measured_trace",
    "mlp",
    "param_bytes",
    "parse_devices",
    "partition",
    "reference_run",
    "run_schedule",
    "save_costs",
    "schedule_accumulation_orders",
    "split_microbatches",
    "threads_per_rank",
    "verify",
    "verify_distributed",
    "write_measured_trace",
]
