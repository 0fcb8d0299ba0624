"""The model flags ``verify`` and ``calibrate`` share beyond ``--model`` and ``--gpt-*``:
the dtype (``--dtype``, ``--autocast``) and the Llama's sizes (``--llama-*``), and the
keyword options of :func:`verify.models.load_model` they make (no torch imported here).

>>> import argparse
>>> parser = argparse.ArgumentParser()
>>> add_model_flags(parser)
>>> args = parser.parse_args(["--dtype", "bf16", "--llama-heads", "8"])
>>> args.model, args.gpt_layers, args.gpt_width = "llama", 4, 64
>>> model_options(args)
{'dtype': 'bf16', 'n_layers': 4, 'width': 64, 'n_heads': 8}
"""

from __future__ import annotations

import argparse
from typing import Any

from pipesim.cli._common import LAYERS, positive_int
from pipesim.errors import PipesimError

__all__ = ["DTYPE_NAMES", "add_model_flags", "model_options"]

#: verify.precision.DTYPES's names, without importing torch.
DTYPE_NAMES = ("fp32", "bf16", "fp16")

# flag -> (dest, load_model keyword, help)
_LLAMA = (
    ("--llama-layers", "llama_layers", "n_layers", "Llama blocks of --model llama (default 4)"),
    ("--llama-width", "llama_width", "width", "hidden width of --model llama (default 64)"),
    ("--llama-heads", "llama_heads", "n_heads", "query heads of --model llama (default 4)"),
    (
        "--llama-kv-heads",
        "llama_kv_heads",
        "n_kv_heads",
        "key/value heads of --model llama, a divisor of the query heads (default 2; "
        "grouped-query attention)",
    ),
    (
        "--llama-ffn",
        "llama_ffn",
        "ffn_width",
        "SwiGLU hidden width of --model llama (default 8/3 x width rounded up to 32)",
    ),
)
_LLAMA_DEFAULTS = {"n_layers": 4, "width": 64}


def add_model_flags(parser: Any) -> None:
    """Add ``--dtype``, ``--autocast`` and ``--llama-*`` to ``parser`` (or a group)."""
    parser.add_argument(
        "--dtype",
        choices=DTYPE_NAMES,
        help="the model's dtype: parameters, inputs and the messages between stages "
        "(default: the model's own, fp32 for the built-in ones)",
    )
    parser.add_argument(
        "--autocast",
        choices=DTYPE_NAMES[1:],
        help="run each layer's forward and the loss under torch.autocast to this dtype, "
        "float32 parameters (mixed precision, as AMP trains); not with --dtype bf16/fp16",
    )
    for flag, dest, _, text in _LLAMA:
        kind = LAYERS if dest == "llama_layers" else positive_int
        parser.add_argument(flag, dest=dest, type=kind, metavar="N", help=text)


def model_options(args: argparse.Namespace, /) -> dict[str, Any]:
    """The keyword options of ``load_model(args.model, ...)``: the dtype, and the sizes
    of the model named (``--gpt-*`` for gpt, ``--llama-*`` for llama); a ``--llama-*``
    flag with another model is refused."""
    options: dict[str, Any] = {}
    for name in ("dtype", "autocast"):
        if getattr(args, name, None) is not None:
            options[name] = getattr(args, name)
    given = {
        key: getattr(args, dest) for _, dest, key, _ in _LLAMA if getattr(args, dest) is not None
    }
    if args.model == "llama":
        return {**options, **_LLAMA_DEFAULTS, **given}
    if given:
        flags = ", ".join(flag for flag, dest, _, _ in _LLAMA if getattr(args, dest) is not None)
        raise PipesimError(f"{flags} size --model llama, not --model {args.model}; drop them")
    if args.model == "gpt":
        options.update(n_layers=args.gpt_layers, width=args.gpt_width)
    return options
