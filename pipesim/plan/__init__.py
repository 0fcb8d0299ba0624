"""Capacity planning: which pipeline degree, micro-batch size and schedule, and does it fit?

``plan(model, devices=N, accelerator=NAME, global_batch=B)`` sweeps every
configuration of a transformer on N devices, simulates each step, and ranks
them by step time among those that fit in device memory, marking the Pareto
front of step time versus memory.

- :mod:`~pipesim.plan.model`, :mod:`~pipesim.plan.layers`: model presets and the
  per-layer FLOP / activation formulas (Narayanan et al. 2021; Korthikanti et al. 2023);
  :mod:`~pipesim.plan.moe`, :mod:`~pipesim.plan.mla`: mixture-of-experts blocks and
  multi-head latent attention;
- :mod:`~pipesim.plan.hardware`: accelerator presets with sources;
  :mod:`~pipesim.plan.gemm_table`: GEMM rates measured by shape;
- :mod:`~pipesim.plan.kernels`: what one layer runs on one GPU, pass by pass;
  :mod:`~pipesim.plan.gpu`: what each kernel costs there;
  :mod:`~pipesim.plan.collectives`: ring collectives on a link;
  :mod:`~pipesim.plan.overlap`: an overlapped F&B pair (DualPipe) from its parts;
- :mod:`~pipesim.plan.workload`: the layers the planner cuts into stages
  (:mod:`~pipesim.partition` cuts them); :mod:`~pipesim.plan.measured`: a cost file's
  stages at any micro-batch size;
- :mod:`~pipesim.plan.iteration`: around the pipeline: static memory, data-parallel
  traffic and its overlap, the optimizer step;
- the plan, in the order it runs:
  :mod:`~pipesim.plan.planner`: ``plan()`` and ``configuration()``;
  :mod:`~pipesim.plan.settings`: its settings checked; the model, accelerator and sweep
  context resolved;
  :mod:`~pipesim.plan.dimensions`: the sweep's dimensions checked and combined into
  configurations;
  :mod:`~pipesim.plan.point`: a configuration (``Point``), the context it is evaluated
  in, its ``Evaluation``;
  :mod:`~pipesim.plan.sweep`: many configurations run on all cores (chunks, deadline,
  Ctrl-C);
  :mod:`~pipesim.plan.evaluation`: one configuration evaluated (its schedule, one
  simulated step);
  :mod:`~pipesim.plan.stage_costs`: its stages cut, priced and linked;
  :mod:`~pipesim.plan.ranks`: per rank its stages' load, static memory and the
  iteration around the pipeline;
  :mod:`~pipesim.plan.scoring`: the evaluations scored (step time, MFU, fit), twins
  dropped, ranked into a ``PlanResult``;
  :mod:`~pipesim.plan.budget`: a sweep's size, refused up front past the limit;
  :mod:`~pipesim.plan.backends`: where configurations run (processes, a Dask cluster);
- :mod:`~pipesim.plan.fastsim`, :mod:`~pipesim.plan.onepass`,
  :mod:`~pipesim.plan.fasttrace`: fast evaluators identical to the SimPy engine;
  :mod:`~pipesim.plan.steady`: the one-pass evaluator's exact steady-state extrapolation;
- :mod:`~pipesim.plan.splice`: long schedules of a family priced exactly from short ones
  (their orders are the short ones' with whole periods inserted);
- :mod:`~pipesim.plan.bounds`, :mod:`~pipesim.plan.prune`: exact lower bounds and the
  branch and bound over them (``prune=True``);
- :mod:`~pipesim.plan.period`: a configuration's steady-state period under an
  optimizer synchronization; :mod:`~pipesim.plan.cost_aware`: schedules made from the
  costs (``--schedules auto``);
- :mod:`~pipesim.plan.result`, :mod:`~pipesim.plan.report`: ranking, tables, JSON, CSV,
  HTML; :mod:`~pipesim.plan.frameworks`: the winner as Megatron-LM and torchtitan flags.

>>> result = plan("llama2-7b", devices=8, accelerator="h100-sxm", global_batch=64,
...               pipeline_parallel=[2, 4], microbatch_sizes=[1], workers=1)
>>> result.best.fits
True
"""

from __future__ import annotations

from pipesim.partition import partition, stage_sums
from pipesim.plan.fastsim import compile_schedule, evaluate, fast_metrics, metrics_of
from pipesim.plan.fasttrace import fast_trace
from pipesim.plan.hardware import (
    Accelerator,
    Interconnect,
    accelerator_from_dict,
    accelerator_names,
    get_accelerator,
    load_accelerator,
)
from pipesim.plan.layers import LayerCost, model_flops_per_sequence, model_layers
from pipesim.plan.model import ModelSpec, get_model, load_model, model_from_dict, model_names
from pipesim.plan.onepass import quick_step
from pipesim.plan.planner import configuration, plan, sweep_points
from pipesim.plan.result import PlanPoint, PlanResult, explain, rank_points
from pipesim.plan.workload import Layer, Workload, workload_from_costs, workload_from_model

__all__ = [
    "Accelerator",
    "Interconnect",
    "Layer",
    "LayerCost",
    "ModelSpec",
    "PlanPoint",
    "PlanResult",
    "Workload",
    "accelerator_from_dict",
    "accelerator_names",
    "compile_schedule",
    "configuration",
    "evaluate",
    "explain",
    "fast_metrics",
    "fast_trace",
    "get_accelerator",
    "get_model",
    "load_accelerator",
    "load_model",
    "metrics_of",
    "model_flops_per_sequence",
    "model_from_dict",
    "model_layers",
    "model_names",
    "partition",
    "plan",
    "quick_step",
    "rank_points",
    "stage_sums",
    "sweep_points",
    "workload_from_costs",
    "workload_from_model",
]
