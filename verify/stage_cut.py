"""Cut an ``nn.Sequential`` into pipeline stages.

A stage is an ``nn.Sequential`` over a contiguous run of the model's entries.
The stages hold the *same* module objects as the model, no copies, exactly as
the model-parallelism chapter builds ``tahap0 = nn.Sequential(*(model[i] for i
in range(4)))``: a gradient computed through a stage lands on the model's own
parameters.

Three ways to choose the cut, the last two made by :mod:`pipesim.partition`,
the partitioner ``pipesim plan`` uses too (see there for the tie-breaking
rule), so a cut the planner recommends is the cut run here:

- ``layer_counts``: entries per stage, e.g. ``(4, 3)``;
- ``balance="layers"`` (default): no costs, counts as even as possible, earlier
  stages taking one more when they do not divide (7 entries -> 4, 3, the
  chapter's split; :func:`pipesim.partition.even_split`);
- ``balance="params"`` or a sequence of per-entry costs (measured, or the
  planner's per-layer work): :func:`pipesim.partition.partition`, the
  contiguous cut minimising the largest stage cost.

>>> from verify.models import mlp
>>> model = mlp().layers
>>> stages = cut_stages(model, n_stages=2)
>>> [len(s) for s in stages], stages[1][0] is model[4]
([4, 3], True)
>>> param_bytes(stages[0]), param_bytes(stages[1])
(43776, 38800)
"""

from __future__ import annotations

from collections.abc import Sequence
from fractions import Fraction

from torch import nn

from pipesim.partition import even_split
from pipesim.partition import partition as cut
from verify.errors import VerifyError

__all__ = ["cut_stages", "param_bytes"]


def param_bytes(module: nn.Module, /) -> int:
    """Bytes of ``module``'s parameters (``numel * element_size`` summed)."""
    return sum(p.numel() * p.element_size() for p in module.parameters())


def cut_stages(
    model: nn.Sequential | Sequence[nn.Module],
    /,
    *,
    n_stages: int,
    layer_counts: Sequence[int] | None = None,
    balance: str | Sequence[float | int | Fraction] = "layers",
) -> tuple[nn.Sequential, ...]:
    """Cut ``model`` into ``n_stages`` stages that share its modules.

    ``layer_counts`` fixes the entries per stage; otherwise ``balance`` picks
    them: ``"layers"`` (even counts), ``"params"`` (balanced parameter
    counts), or one cost per entry. More stages than entries is refused.

    >>> from torch import nn
    >>> [len(s) for s in cut_stages([nn.Linear(2, 2)] * 3, n_stages=2, layer_counts=[1, 2])]
    [1, 2]
    """
    layers = list(model)
    if isinstance(n_stages, bool) or not isinstance(n_stages, int) or n_stages < 1:
        raise VerifyError(f"n_stages must be a whole number >= 1, got {n_stages!r}")
    if not all(isinstance(m, nn.Module) for m in layers):
        raise VerifyError("the model to partition must be an nn.Sequential or a list of modules")
    if layer_counts is not None:
        counts = tuple(layer_counts)
        if (
            len(counts) != n_stages
            or any(isinstance(c, bool) or not isinstance(c, int) or c < 1 for c in counts)
            or sum(counts) != len(layers)
        ):
            raise VerifyError(
                f"layer counts {list(counts)} do not cut {len(layers)} layers into {n_stages} "
                f"stages: give {n_stages} whole numbers >= 1 that sum to {len(layers)}"
            )
    elif balance == "layers":
        counts = even_split(len(layers), n_stages=n_stages)
    elif balance == "params":
        counts = cut([sum(p.numel() for p in m.parameters()) for m in layers], n_stages=n_stages)
    elif isinstance(balance, str):
        raise VerifyError(
            f"unknown balance {balance!r}; use 'layers', 'params' or a list of per-layer costs"
        )
    else:
        if len(balance) != len(layers):
            raise VerifyError(
                f"got {len(balance)} layer costs for a model of {len(layers)} layers; give one "
                "cost per layer"
            )
        counts = cut(balance, n_stages=n_stages)
    stages = []
    start = 0
    for count in counts:
        stages.append(nn.Sequential(*layers[start : start + count]))
        start += count
    return tuple(stages)
