"""The settings a bit-identical comparison needs, set where possible and refused otherwise.

Splitting a model between layers changes no bits when every kernel is
deterministic and computes in full float32 precision. On CUDA that means
(PyTorch's reproducibility notes, docs.pytorch.org/docs/stable/notes/randomness.html):
no TF32 for matmuls or cuDNN convolutions, deterministic algorithms on (with
``CUBLAS_WORKSPACE_CONFIG=:4096:8`` for cuBLAS), cuDNN benchmarking off, and
every stage on the same GPU model (different GPUs pick different kernels).
On any device the model may not hold dropout or batch-norm in training mode:
dropout draws random masks, batch-norm normalises by each micro-batch's
statistics and updates running statistics on every call.

:func:`exact_settings` sets the CUDA settings for the duration of a ``with``
block (and restores them), then refuses, naming each offending setting, what it
cannot fix. With ``apply=False`` it only checks.

>>> import torch
>>> with exact_settings(torch.nn.Sequential(torch.nn.Linear(2, 2)), devices=["cpu"]):
...     pass
>>> exactness_problems(torch.nn.Sequential(torch.nn.Dropout(0.1)), devices=["cpu"])
["dropout layer '0' (Dropout, p=0.1) is in training mode: call .eval() on it or set p=0"]
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Sequence
from contextlib import contextmanager

import torch
from torch import nn

from verify.errors import ExactnessError

__all__ = ["exact_settings", "exactness_problems"]

_DROPOUT = (
    nn.Dropout,
    nn.Dropout1d,
    nn.Dropout2d,
    nn.Dropout3d,
    nn.AlphaDropout,
    nn.FeatureAlphaDropout,
)
_BATCHNORM = (nn.modules.batchnorm._BatchNorm, nn.SyncBatchNorm)


def exactness_problems(model: nn.Module, /, *, devices: Sequence[torch.device | str]) -> list[str]:
    """One line per setting that rules out a bit-identical result (empty when none)."""
    problems = []
    for name, module in model.named_modules():
        if not module.training:
            continue
        if isinstance(module, _DROPOUT) and module.p > 0:
            problems.append(
                f"dropout layer {name!r} ({type(module).__name__}, p={module.p}) is in training "
                "mode: call .eval() on it or set p=0"
            )
        elif isinstance(module, _BATCHNORM):
            problems.append(
                f"batch-norm layer {name!r} ({type(module).__name__}) is in training mode: its "
                "statistics depend on the micro-batch; call .eval() on it"
            )
    precision = torch.get_float32_matmul_precision()
    if precision != "highest":
        problems.append(
            f"torch.get_float32_matmul_precision() is {precision!r}: float32 matmuls may run in "
            "lower precision; call torch.set_float32_matmul_precision('highest')"
        )
    cuda = sorted({torch.device(d).index or 0 for d in devices if torch.device(d).type == "cuda"})
    if not cuda:
        return problems
    if any(torch.device(d).type != "cuda" for d in devices):
        problems.append(
            "some stages run on the CPU and some on CUDA: the two use different kernels, so "
            "the bits differ; put every rank on CUDA or every rank on the CPU"
        )
    if torch.backends.cuda.matmul.allow_tf32:
        problems.append(
            "TF32 is on for CUDA matmuls (torch.backends.cuda.matmul.allow_tf32=True); set it False"
        )
    if torch.backends.cudnn.allow_tf32:
        problems.append("TF32 is on for cuDNN (torch.backends.cudnn.allow_tf32=True); set it False")
    if not torch.are_deterministic_algorithms_enabled():
        problems.append(
            "non-deterministic algorithms are allowed; call "
            "torch.use_deterministic_algorithms(True)"
        )
    if torch.backends.cudnn.benchmark:
        problems.append(
            "cuDNN benchmarking is on (torch.backends.cudnn.benchmark=True); set it False"
        )
    if os.environ.get("CUBLAS_WORKSPACE_CONFIG") not in (":4096:8", ":16:8"):
        problems.append(
            "CUBLAS_WORKSPACE_CONFIG is not ':4096:8' or ':16:8', so cuBLAS may be "
            "non-deterministic; export CUBLAS_WORKSPACE_CONFIG=:4096:8 before starting"
        )
    names = {}
    if torch.cuda.is_available():
        names = {i: torch.cuda.get_device_name(i) for i in cuda if i < torch.cuda.device_count()}
    if len(set(names.values())) > 1:
        listed = ", ".join(f"cuda:{i} = {n}" for i, n in names.items())
        problems.append(
            f"the stages run on different GPU models ({listed}); use devices of one model"
        )
    return problems


@contextmanager
def exact_settings(
    model: nn.Module, /, *, devices: Sequence[torch.device | str], apply: bool = True
) -> Iterator[None]:
    """Inside the block, the settings are exact or ExactnessError was raised.

    With ``apply`` the float32 matmul precision is set to ``highest`` and, when
    a device is CUDA, TF32 off, deterministic algorithms on, cuDNN benchmarking
    off, ``CUBLAS_WORKSPACE_CONFIG`` set if unset; all are restored on exit.
    """
    saved = (
        torch.get_float32_matmul_precision(),
        torch.backends.cuda.matmul.allow_tf32,
        torch.backends.cudnn.allow_tf32,
        torch.are_deterministic_algorithms_enabled(),
        torch.backends.cudnn.benchmark,
        torch.backends.cudnn.deterministic,
        os.environ.get("CUBLAS_WORKSPACE_CONFIG"),
    )
    uses_cuda = any(torch.device(d).type == "cuda" for d in devices)
    try:
        if apply:
            torch.set_float32_matmul_precision("highest")
            if uses_cuda:
                os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
                torch.backends.cuda.matmul.allow_tf32 = False
                torch.backends.cudnn.allow_tf32 = False
                torch.use_deterministic_algorithms(True)
                torch.backends.cudnn.benchmark = False
                torch.backends.cudnn.deterministic = True
        problems = exactness_problems(model, devices=devices)
        if problems:
            raise ExactnessError(
                "a bit-identical check is impossible with these settings: " + "; ".join(problems),
                settings=tuple(problems),
            )
        yield
    finally:
        if apply:
            torch.set_float32_matmul_precision(saved[0])
            if uses_cuda:
                torch.backends.cuda.matmul.allow_tf32 = saved[1]
                torch.backends.cudnn.allow_tf32 = saved[2]
                torch.use_deterministic_algorithms(saved[3])
                torch.backends.cudnn.benchmark = saved[4]
                torch.backends.cudnn.deterministic = saved[5]
                if saved[6] is None:
                    os.environ.pop("CUBLAS_WORKSPACE_CONFIG", None)
