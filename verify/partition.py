"""Cut an ``nn.Sequential`` into pipeline stages.

A stage is an ``nn.Sequential`` over a contiguous run of the model's entries.
The stages hold the *same* module objects as the model, no copies, exactly as
the model-parallelism chapter builds ``tahap0 = nn.Sequential(*(model[i] for i
in range(4)))``: a gradient computed through a stage lands on the model's own
parameters.

Three ways to choose the cut:

- ``layer_counts``: entries per stage, e.g. ``(4, 3)`` (the chapter's split);
- ``balance="layers"`` (default): layer counts as even as possible, earlier
  stages taking one more when they do not divide (7 entries -> 4, 3);
- ``balance="params"`` or a sequence of per-entry costs (measured or
  estimated): contiguous cut minimising the largest stage cost.

>>> from verify.models import mlp
>>> model = mlp().layers
>>> stages = partition(model, n_stages=2)
>>> [len(s) for s in stages], stages[1][0] is model[4]
([4, 3], True)
>>> param_bytes(stages[0]), param_bytes(stages[1])
(43776, 38800)
"""

from __future__ import annotations

from collections.abc import Sequence
from fractions import Fraction

from torch import nn

from verify.errors import VerifyError

__all__ = ["balanced_counts", "even_counts", "param_bytes", "partition"]


def param_bytes(module: nn.Module, /) -> int:
    """Bytes of ``module``'s parameters (``numel * element_size`` summed)."""
    return sum(p.numel() * p.element_size() for p in module.parameters())


def even_counts(n_layers: int, n_stages: int, /) -> tuple[int, ...]:
    """Layer counts as even as possible; the first ``n_layers % n_stages`` stages get one more.

    >>> even_counts(7, 2), even_counts(10, 4)
    ((4, 3), (3, 3, 2, 2))
    """
    _check_fit(n_layers, n_stages)
    base, extra = divmod(n_layers, n_stages)
    return tuple(base + (1 if s < extra else 0) for s in range(n_stages))


def balanced_counts(costs: Sequence[float | int | Fraction], n_stages: int, /) -> tuple[int, ...]:
    """Contiguous cut of per-layer ``costs`` into ``n_stages`` non-empty runs minimising the
    largest run's sum (the linear-partition problem, solved exactly by dynamic programming).

    Ties go to the cut whose earlier stages are longest, so uniform costs give
    :func:`even_counts`.

    >>> balanced_counts([1, 1, 1, 1, 4], 2)
    (4, 1)
    >>> balanced_counts([5, 1, 1, 1], 3)
    (1, 2, 1)
    """
    n = len(costs)
    _check_fit(n, n_stages)
    for i, c in enumerate(costs):
        if c < 0:
            raise VerifyError(f"layer {i} has a negative cost {c!r}; costs must be >= 0")
    prefix = [Fraction(0)]
    for c in costs:
        prefix.append(prefix[-1] + Fraction(c))
    # best[k][i]: the smallest largest-stage cost of cutting layers i.. into k stages.
    inf = None
    best: list[list[Fraction | None]] = [[inf] * (n + 1) for _ in range(n_stages + 1)]
    choice: list[list[int]] = [[0] * (n + 1) for _ in range(n_stages + 1)]
    for i in range(n):
        best[1][i] = prefix[n] - prefix[i]
        choice[1][i] = n - i
    for k in range(2, n_stages + 1):
        for i in range(n - k + 1):
            for length in range(n - i - k + 1, 0, -1):  # longest first: ties keep it
                rest = best[k - 1][i + length]
                if rest is None:
                    continue
                value = max(prefix[i + length] - prefix[i], rest)
                current = best[k][i]
                if current is None or value < current:
                    best[k][i] = value
                    choice[k][i] = length
    counts = []
    i = 0
    for k in range(n_stages, 0, -1):
        counts.append(choice[k][i])
        i += choice[k][i]
    return tuple(counts)


def partition(
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
    >>> [len(s) for s in partition([nn.Linear(2, 2)] * 3, n_stages=2, layer_counts=[1, 2])]
    [1, 2]
    """
    layers = list(model)
    if isinstance(n_stages, bool) or not isinstance(n_stages, int) or n_stages < 1:
        raise VerifyError(f"n_stages must be a whole number >= 1, got {n_stages!r}")
    if not all(isinstance(m, nn.Module) for m in layers):
        raise VerifyError("the model to partition must be an nn.Sequential or a list of modules")
    _check_fit(len(layers), n_stages)
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
        counts = even_counts(len(layers), n_stages)
    elif balance == "params":
        counts = balanced_counts([sum(p.numel() for p in m.parameters()) for m in layers], n_stages)
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
        counts = balanced_counts(balance, n_stages)
    stages = []
    start = 0
    for count in counts:
        stages.append(nn.Sequential(*layers[start : start + count]))
        start += count
    return tuple(stages)


def _check_fit(n_layers: int, n_stages: int) -> None:
    if n_stages > n_layers:
        raise VerifyError(
            f"cannot cut a model of {n_layers} layers into {n_stages} stages: each stage needs "
            f"at least one layer; use at most {n_layers} stages or a deeper model"
        )
