"""Fair comparisons: the same model, whatever the stages per rank.

A schedule with V stages per rank (interleaved 1F1B, ZB-V, DualPipe-V) cuts the
model into P x V stages, so each stage is 1/V of what a stage of a V = 1
schedule is: 1/V of the layers, hence 1/V of the compute time, of the
activation bytes a micro-batch leaves behind and of the parameters. What crosses
a stage boundary (``output_bytes``) is one layer's activation, the same size
whatever the cut. Comparing 1F1B and interleaved 1F1B with the *same* per-stage
costs compares two different models (the interleaved one twice as big); these
functions give each schedule the per-stage costs of the same model.

Costs given for V = 1 describe one rank's share of the model, the *layer block*
that Megatron's virtual pipeline splits into V chunks (Narayanan et al. 2021,
section 2.2: "each device ... is assigned multiple model chunks").

>>> from pipesim.costs import CostModel
>>> costs = CostModel.uniform(forward=1, backward=2, activation_bytes=1000, output_bytes=10)
>>> chunk = per_chunk_costs(costs, virtual=2).stage(0)
>>> chunk.forward, chunk.backward, chunk.activation_bytes, chunk.output_bytes
(Fraction(1, 2), 1, 500, 10)
"""

from __future__ import annotations

from dataclasses import replace
from fractions import Fraction

from pipesim.costs import CostModel, StageCost
from pipesim.errors import CostError
from pipesim.exact import Time

__all__ = ["per_chunk_costs"]

_TIMES = ("forward", "backward", "input_grad", "weight_grad")
_BYTES = ("activation_bytes", "weight_grad_bytes", "param_bytes")


def _split_time(value: Time, parts: int) -> Time:
    exact = Fraction(value) / parts
    return exact.numerator if exact.denominator == 1 else exact


def _split_stage(stage: StageCost, virtual: int) -> StageCost:
    fields: dict[str, object] = {
        name: _split_time(getattr(stage, name), virtual) for name in _TIMES
    }
    if stage.overlap is not None:
        fields["overlap"] = _split_time(stage.overlap, virtual)
    for name in _BYTES:  # bytes are whole: a remainder goes, at most V - 1 bytes per stage
        fields[name] = getattr(stage, name) // virtual
    return replace(stage, **fields)  # type: ignore[arg-type]


def per_chunk_costs(costs: CostModel, /, *, virtual: int) -> CostModel:
    """``costs`` given per layer block (one rank's share of the model, V = 1) as the
    per-stage costs of a schedule with ``virtual`` stages per rank: times and
    activation / weight-gradient / parameter bytes divided by ``virtual``; message
    bytes, links and capacity unchanged.

    Only a cost model whose stages all cost the same can be split: different
    per-stage entries already say what each stage costs (CostError otherwise).
    """
    if virtual == 1:
        return costs
    if len(set(costs.stages)) != 1:
        raise CostError(
            f"cannot split {len(costs.stages)} per-stage cost entries into {virtual} chunks "
            "per rank: give one entry for every stage (costs of one rank's layer block), or "
            "per-stage costs that already describe each chunk"
        )
    chunk = _split_stage(costs.stages[0], virtual)
    return replace(costs, stages=(chunk,) * len(costs.stages))
