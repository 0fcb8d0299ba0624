"""pipesim: simulate, plot, plan and verify pipeline-parallel training schedules.

>>> import pipesim
>>> sched = pipesim.generate("1f1b", n_ranks=4, n_microbatches=8)
>>> pipesim.simulate(sched).metrics.makespan
33
"""

from __future__ import annotations

from pipesim.actions import Action, Op, Overlap, Work, parse_action
from pipesim.costs import (
    CostModel,
    Link,
    LinkPair,
    Links,
    StageCost,
    costs_from_dict,
    costs_to_dict,
    load_costs,
)
from pipesim.engine import Simulation, run_trace, simulate
from pipesim.errors import (
    CostError,
    DeadlockError,
    LimitError,
    ParseError,
    PartitionError,
    PipesimError,
    PlanError,
    ScheduleError,
    UnknownNameError,
)
from pipesim.fair import per_chunk_costs
from pipesim.graph import (
    CriticalPath,
    DataDependency,
    build_graph,
    critical_path,
    data_dependencies,
    find_deadlock,
    validate,
)
from pipesim.metrics import (
    Metrics,
    RankMetrics,
    compute_metrics,
    idle_intervals,
    idle_intervals_by_rank,
    metrics_from_totals,
)
from pipesim.schedule import Schedule
from pipesim.schedule_io import (
    load_schedule,
    save_schedule,
    schedule_from_csv,
    schedule_from_dict,
    schedule_from_json,
    schedule_to_csv,
    schedule_to_dict,
    schedule_to_json,
)
from pipesim.schedules import (
    ScheduleSpec,
    dualpipe,
    dualpipev,
    generate,
    get_spec,
    gpipe,
    interleaved_1f1b,
    interleaved_zero_bubble,
    looped_bfs,
    one_f_one_b,
    register,
    schedule_names,
    sequential,
    v_half,
    v_min,
    zb_h1,
    zb_h2,
    zbv,
)
from pipesim.trace import ActionRecord, MemoryRecord, Trace, TraceTotals, TransferRecord
from pipesim.trace_io import load_trace, save_trace, step_from_dict, step_to_dict
from pipesim.views import Viewable, step_of

__version__ = "0.1.0"

__all__ = [
    "Action",
    "ActionRecord",
    "CostError",
    "CostModel",
    "CriticalPath",
    "DataDependency",
    "DeadlockError",
    "LimitError",
    "Link",
    "LinkPair",
    "Links",
    "MemoryRecord",
    "Metrics",
    "Op",
    "Overlap",
    "ParseError",
    "PartitionError",
    "PipesimError",
    "PlanError",
    "RankMetrics",
    "Schedule",
    "ScheduleError",
    "ScheduleSpec",
    "Simulation",
    "StageCost",
    "Trace",
    "TraceTotals",
    "TransferRecord",
    "UnknownNameError",
    "Viewable",
    "Work",
    "__version__",
    "build_graph",
    "compute_metrics",
    "costs_from_dict",
    "costs_to_dict",
    "critical_path",
    "data_dependencies",
    "dualpipe",
    "dualpipev",
    "find_deadlock",
    "generate",
    "get_spec",
    "gpipe",
    "idle_intervals",
    "idle_intervals_by_rank",
    "interleaved_1f1b",
    "interleaved_zero_bubble",
    "load_costs",
    "load_schedule",
    "load_trace",
    "looped_bfs",
    "metrics_from_totals",
    "one_f_one_b",
    "parse_action",
    "per_chunk_costs",
    "register",
    "run_trace",
    "save_schedule",
    "save_trace",
    "schedule_from_csv",
    "schedule_from_dict",
    "schedule_from_json",
    "schedule_names",
    "schedule_to_csv",
    "schedule_to_dict",
    "schedule_to_json",
    "sequential",
    "simulate",
    "step_from_dict",
    "step_of",
    "step_to_dict",
    "v_half",
    "v_min",
    "validate",
    "zb_h1",
    "zb_h2",
    "zbv",
]
