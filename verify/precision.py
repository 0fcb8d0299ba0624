"""Floating-point formats for verification: dtype names, and autocast inside the model.

A model runs in one of two ways people train with:

- its parameters, inputs and messages in one dtype (``--dtype bf16``: every
  tensor bf16, the messages between stages too);
- float32 parameters with the forward under ``torch.autocast`` (``--autocast
  bf16``: matmuls in bf16, the ops autocast keeps in float32 in float32; the
  messages have whatever dtype the stage's last op gives, as in a training job;
  PyTorch's AMP notes, docs.pytorch.org/docs/stable/amp.html).

:class:`Autocast` wraps one entry of a model's ``nn.Sequential`` so that its
forward runs under autocast wherever it runs: the unsplit reference, each
stage of the pipelined run, the pass that finds the messages' shapes and
dtypes, torch's own pipelining runtime. Backward runs outside autocast, as
the AMP notes ask, in the dtypes the forward chose.

>>> parse_dtype("bf16"), dtype_name(torch.float16)
(torch.bfloat16, 'fp16')
>>> import torch
>>> layer = Autocast(torch.nn.Linear(2, 2), dtype=torch.bfloat16)
>>> layer(torch.ones(1, 2)).dtype, layer.module.weight.dtype
(torch.bfloat16, torch.float32)
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from verify.errors import VerifyError

__all__ = ["DTYPES", "Autocast", "dtype_name", "parse_dtype"]

#: The dtype names ``--dtype`` and ``--autocast`` take, as torch's own short names.
DTYPES: dict[str, torch.dtype] = {
    "fp32": torch.float32,
    "bf16": torch.bfloat16,
    "fp16": torch.float16,
}


def parse_dtype(name: str | torch.dtype, /) -> torch.dtype:
    """``"bf16"`` (or a torch dtype among :data:`DTYPES`) -> ``torch.bfloat16``."""
    if isinstance(name, torch.dtype):
        if name in DTYPES.values():
            return name
    elif name in DTYPES:
        return DTYPES[name]
    raise VerifyError(f"unknown dtype {name!r}; use one of {', '.join(DTYPES)}")


def dtype_name(dtype: torch.dtype, /) -> str:
    """``torch.bfloat16`` -> ``"bf16"``; other dtypes by torch's name (``float64``)."""
    for name, known in DTYPES.items():
        if known == dtype:
            return name
    return str(dtype).removeprefix("torch.")


class Autocast(nn.Module):
    """``module`` with its forward under ``torch.autocast(device, dtype)`` on its input's
    device; the parameters keep their dtype (float32 master weights)."""

    def __init__(self, module: nn.Module, /, *, dtype: torch.dtype) -> None:
        super().__init__()
        self.module = module
        self.dtype = dtype

    def forward(self, x: Tensor) -> Tensor:
        with torch.autocast(device_type=x.device.type, dtype=self.dtype):
            out: Tensor = self.module(x)
        return out
