"""pipesim: simulate, plot, plan and verify pipeline-parallel training schedules.

>>> import pipesim
>>> sched = pipesim.generate("1f1b", n_ranks=4, n_microbatches=8)
>>> pipesim.simulate(sched).metrics.makespan
33
"""

from __future__ import annotations

from pipesim.actions import Action, Op, Overlap, Work, parse_action
from pipesim.costs import CostModel, Link, StageCost, costs_from_dict, costs_to_dict, load_costs
from pipesim.engine import Simulation, run_trace, simulate
from pipesim.errors import (
    CostError,
    DeadlockError,
    ParseError,
    PipesimError,
    ScheduleError,
    UnknownNameError,
)
from pipesim.graph import build_graph, critical_path, find_deadlock, validate
from pipesim.metrics import Metrics, RankMetrics, compute_metrics, idle_intervals
from pipesim.schedule import Schedule
from pipesim.schedule_io import (
    load_schedule,
    save_schedule,
    schedule_from_csv,
    schedule_from_json,
    schedule_to_csv,
    schedule_to_json,
)
from pipesim.schedules import ScheduleSpec, generate, get_spec, schedule_names
from pipesim.trace import ActionRecord, MemoryRecord, Trace, TransferRecord

__version__ = "0.1.0"

__all__ = [
    "Action",
    "ActionRecord",
    "CostError",
    "CostModel",
    "DeadlockError",
    "Link",
    "MemoryRecord",
    "Metrics",
    "Op",
    "Overlap",
    "ParseError",
    "PipesimError",
    "RankMetrics",
    "Schedule",
    "ScheduleError",
    "ScheduleSpec",
    "Simulation",
    "StageCost",
    "Trace",
    "TransferRecord",
    "UnknownNameError",
    "Work",
    "__version__",
    "build_graph",
    "compute_metrics",
    "costs_from_dict",
    "costs_to_dict",
    "critical_path",
    "find_deadlock",
    "generate",
    "get_spec",
    "idle_intervals",
    "load_costs",
    "load_schedule",
    "parse_action",
    "run_trace",
    "save_schedule",
    "schedule_from_csv",
    "schedule_from_json",
    "schedule_names",
    "schedule_to_csv",
    "schedule_to_json",
    "simulate",
    "validate",
]
