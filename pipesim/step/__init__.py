"""The compiled step: one pipeline step as tables every evaluator, view and executor reads.

This package holds the whole cluster that builds it, one rule per module.

A step is built in two layers, so that the planner builds the first once per schedule
and reuses it for many cost models:

- :func:`~pipesim.step.structure.step_structure` -> :class:`~pipesim.step.structure.StepStructure`,
  independent of costs (:mod:`pipesim.step.structure`, from :mod:`pipesim.step.numbering` and
  :mod:`pipesim.step.wiring`);
- :func:`compile_step` -> :class:`CompiledStep` (:mod:`pipesim.step.compile`), one row per unit of
  work: duration and memory effect, and per message its bytes, link, occupancy and
  latency.

The model's rules, each written once, live in one module each:

- **dependencies**: :mod:`pipesim.step.dependencies` (:func:`forward_source`,
  :func:`gradient_source`, :func:`prerequisites`);
- **message sizes** and what work costs: :mod:`pipesim.step.cost_tables`
  (:func:`message_bytes`, :func:`cost_tables`, the overheads);
- **memory**: :mod:`pipesim.step.memory`;
- **the deadlock error**: :mod:`pipesim.step.deadlock` (:func:`deadlock_error`).

Their public names are importable from here too (``__all__``); the code of pipesim
imports each from its home module. An example of the whole build is :mod:`pipesim.step.compile`'s.
"""

from __future__ import annotations

from pipesim.step.compile import (
    CompiledStep,
    StepRow,
    compile_step,
    message_columns,
    send_leads,
    send_order,
    structure_tables,
)
from pipesim.step.cost_tables import (
    CostTables,
    comm_durations,
    comm_overhead,
    cost_tables,
    message_bytes,
    overhead_tables,
    post_times,
)
from pipesim.step.deadlock import deadlock_error, find_cycle
from pipesim.step.dependencies import forward_source, gradient_source, prerequisites
from pipesim.step.structure import StepStructure, step_structure
from pipesim.step.wiring import MessageRow

__all__ = [
    "CompiledStep",
    "CostTables",
    "MessageRow",
    "StepRow",
    "StepStructure",
    "comm_durations",
    "comm_overhead",
    "compile_step",
    "cost_tables",
    "deadlock_error",
    "find_cycle",
    "forward_source",
    "gradient_source",
    "message_bytes",
    "message_columns",
    "overhead_tables",
    "post_times",
    "prerequisites",
    "send_leads",
    "send_order",
    "step_structure",
    "structure_tables",
]
