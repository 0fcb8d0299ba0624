"""Reference models for verification, and user models given as ``package.module:factory``.

A :class:`VerifyModel` bundles what a verification run needs: the layers as an
``nn.Sequential`` (the partitioner cuts between its entries), a deterministic
batch of inputs and targets, and the loss. Batches are drawn on the CPU from
the random stream that follows the model's seeded initialisation, so the same
model and batch size always give the same bits, whatever the devices.

- :func:`mlp`: the model-parallelism chapter's MLP, ``Linear 16->96, GELU,
  Linear 96->96, GELU, Linear 96->96, GELU, Linear 96->4`` after
  ``torch.manual_seed(21)``, with the chapter's loss ``((out - target)**2).mean()``;
  its first batch of 32 is the chapter's ``x`` and ``target``.
- :func:`gpt`: a small GPT-style decoder (token + position embedding, pre-norm
  blocks with causal self-attention and a GELU MLP, final norm + head), no
  dropout, as a sequence of ``n_layers + 2`` modules.
- :func:`llama`: a small Llama-style decoder (token embedding, pre-norm blocks
  with RMSNorm, rotary position embedding, grouped-query causal attention and a
  SwiGLU MLP, final RMSNorm + head), as a sequence of ``n_layers + 2`` modules.
- :func:`from_factory`: ``"package.module:factory"`` returning an
  ``nn.Sequential``, a list of modules, or a :class:`VerifyModel`.
- :func:`with_precision`: a model in another dtype (``bf16``, ``fp16``), or its
  forward under autocast (:mod:`verify.precision`).

>>> model = mlp()
>>> sum(p.numel() for p in model.layers.parameters())
20644
>>> x, target = model.make_batch(32)
>>> tuple(x.shape), tuple(target.shape)
((32, 16), (32, 4))
"""

from __future__ import annotations

import importlib
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from pipesim.errors import UnknownNameError
from verify.blocks import Block, Embedding, Head, LlamaBlock, LlamaHead
from verify.errors import VerifyError
from verify.precision import Autocast, dtype_name, parse_dtype

__all__ = [
    "MODEL_NAMES",
    "VerifyModel",
    "from_factory",
    "gpt",
    "llama",
    "llama_ffn_width",
    "load_model",
    "mlp",
    "next_token_loss",
    "with_precision",
]

#: The built-in model names ``load_model`` (and ``pipesim verify --model``) accepts.
MODEL_NAMES = ("mlp", "gpt", "llama")


@dataclass(frozen=True, slots=True, kw_only=True, eq=False)
class VerifyModel:
    """A model ready for verification: layers, a deterministic batch, a loss."""

    name: str
    """What it is called in reports (``mlp``, ``gpt``, or the factory path)."""
    layers: nn.Sequential
    """The model; the partitioner cuts it between entries."""
    make_batch: Callable[[int], tuple[Tensor, Tensor]]
    """``batch_size -> (inputs, targets)`` on the CPU; the same bits on every call."""
    loss_fn: Callable[[Tensor, Tensor], Tensor]
    """``(output, target) -> scalar loss`` of one micro-batch (a mean, like torch's)."""
    autocast: torch.dtype | None = None
    """The dtype the forward runs in under ``torch.autocast`` (:func:`with_precision`);
    None: no autocast."""

    @property
    def dtype(self) -> torch.dtype:
        """The dtype of the parameters (float32 for a model without floating ones)."""
        return next(
            (p.dtype for p in self.layers.parameters() if p.is_floating_point()), torch.float32
        )

    @property
    def precision(self) -> str:
        """The dtypes in words, for reports: ``bf16``, or ``fp32, autocast bf16``."""
        text = dtype_name(self.dtype)
        return text if self.autocast is None else f"{text}, autocast {dtype_name(self.autocast)}"

    def __post_init__(self) -> None:
        if not isinstance(self.layers, nn.Sequential) or len(self.layers) == 0:
            raise VerifyError(
                f"model {self.name!r}: layers must be a non-empty nn.Sequential, "
                f"got {type(self.layers).__name__}"
            )


def _seeded(seed: int, build: Callable[[], nn.Module]) -> tuple[nn.Module, Tensor]:
    """Build under ``torch.manual_seed(seed)`` without touching the caller's RNG;
    return the module and the CPU RNG state right after it was built."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        module = build()
        state = torch.get_rng_state()
    return module, state


def _from_state(state: Tensor, draw: Callable[[], tuple[Tensor, Tensor]]) -> tuple[Tensor, Tensor]:
    with torch.random.fork_rng(devices=[]):
        torch.set_rng_state(state)
        return draw()


def _check_batch(name: str, batch_size: int) -> None:
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise VerifyError(
            f"model {name!r}: batch size must be a whole number >= 1, got {batch_size!r}"
        )


# -- the chapter's MLP ---------------------------------------------------------------------
def mlp(*, seed: int = 21) -> VerifyModel:
    """The model-parallelism chapter's MLP (7 entries, 20,644 parameters).

    >>> mlp().layers[6]
    Linear(in_features=96, out_features=4, bias=True)
    """
    d_in, d_h, d_out = 16, 96, 4

    def build() -> nn.Module:
        return nn.Sequential(
            nn.Linear(d_in, d_h),
            nn.GELU(),
            nn.Linear(d_h, d_h),
            nn.GELU(),
            nn.Linear(d_h, d_h),
            nn.GELU(),
            nn.Linear(d_h, d_out),
        )

    layers, state = _seeded(seed, build)

    def make_batch(batch_size: int) -> tuple[Tensor, Tensor]:
        _check_batch("mlp", batch_size)
        # The chapter draws x, runs the model (no randomness), then draws the target.
        return _from_state(
            state, lambda: (torch.randn(batch_size, d_in), torch.randn(batch_size, d_out))
        )

    def loss_fn(out: Tensor, target: Tensor) -> Tensor:
        return ((out - target) ** 2).mean()  # the chapter's loss, spelled the same way

    assert isinstance(layers, nn.Sequential)
    return VerifyModel(name="mlp", layers=layers, make_batch=make_batch, loss_fn=loss_fn)


# -- a small GPT ---------------------------------------------------------------------------
def gpt(
    *,
    n_layers: int = 4,
    width: int = 64,
    n_heads: int = 4,
    vocab_size: int = 128,
    seq_len: int = 16,
    seed: int = 0,
) -> VerifyModel:
    """A small GPT-style decoder as ``n_layers + 2`` sequential entries.

    Entry 0 embeds token ids, entries 1..n_layers are transformer blocks, the
    last is the final norm and head; the loss is next-token cross-entropy.
    No dropout, no weight tying (tying would share a tensor between the first
    and last stage).

    >>> model = gpt(n_layers=2, width=32)
    >>> len(model.layers), tuple(model.make_batch(3)[0].shape)
    (4, (3, 16))
    """
    for label, value in (
        ("n_layers", n_layers),
        ("width", width),
        ("n_heads", n_heads),
        ("vocab_size", vocab_size),
        ("seq_len", seq_len),
    ):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise VerifyError(f"gpt: {label} must be a whole number >= 1, got {value!r}")

    def build() -> nn.Module:
        return nn.Sequential(
            Embedding(vocab_size=vocab_size, seq_len=seq_len, width=width),
            *(Block(width=width, n_heads=n_heads, seq_len=seq_len) for _ in range(n_layers)),
            Head(width=width, vocab_size=vocab_size),
        )

    layers, state = _seeded(seed, build)
    assert isinstance(layers, nn.Sequential)
    return VerifyModel(
        name="gpt",
        layers=layers,
        make_batch=_token_batch("gpt", vocab_size, seq_len, state),
        loss_fn=next_token_loss,
    )


def next_token_loss(logits: Tensor, target: Tensor) -> Tensor:
    """Mean next-token cross-entropy, in float32 whatever the logits' dtype (as
    Megatron-LM and Hugging Face's Llama compute it: ``logits.float()``)."""
    # Spelled out: torch's NLLLoss has no deterministic CUDA kernel
    # (torch.use_deterministic_algorithms refuses it), a one-hot product does.
    log_probs = logits.float().log_softmax(dim=-1)  # (batch, seq, vocab)
    picked = (log_probs * nn.functional.one_hot(target, logits.shape[-1])).sum(dim=-1)
    return -picked.mean()


def _token_batch(
    name: str, vocab_size: int, seq_len: int, state: Tensor
) -> Callable[[int], tuple[Tensor, Tensor]]:
    """``make_batch`` of a language model: random token ids and the next-token targets,
    drawn from ``state`` (the RNG state after the model was built)."""

    def make_batch(batch_size: int) -> tuple[Tensor, Tensor]:
        _check_batch(name, batch_size)

        def draw() -> tuple[Tensor, Tensor]:
            ids = torch.randint(vocab_size, (batch_size, seq_len + 1))
            return ids[:, :-1].contiguous(), ids[:, 1:].contiguous()  # next-token targets

        return _from_state(state, draw)

    return make_batch


# -- a small Llama -------------------------------------------------------------------------
def llama_ffn_width(width: int, /) -> int:
    """Llama's SwiGLU hidden width: 2/3 of 4 x ``width``, rounded up to a multiple of 32
    (Meta's ``multiple_of``, 256 at scale, smaller for a small model).

    >>> llama_ffn_width(64)
    192
    """
    return -(-(8 * width) // (3 * 32)) * 32


def llama(
    *,
    n_layers: int = 4,
    width: int = 64,
    n_heads: int = 4,
    n_kv_heads: int = 2,
    ffn_width: int | None = None,
    vocab_size: int = 128,
    seq_len: int = 16,
    seed: int = 0,
) -> VerifyModel:
    """A small Llama-style decoder as ``n_layers + 2`` sequential entries.

    Entry 0 embeds token ids (positions are rotary, inside attention), entries
    1..n_layers are :class:`LlamaBlock`, the last is the final RMSNorm and head;
    the loss is next-token cross-entropy in float32. ``ffn_width`` defaults to
    :func:`llama_ffn_width`. No dropout, no weight tying.

    >>> model = llama(n_layers=2, width=32, n_heads=4, n_kv_heads=2)
    >>> len(model.layers), model.layers[1].wk.out_features, model.layers[1].w1.out_features
    (4, 16, 96)
    """
    ffn = llama_ffn_width(width) if ffn_width is None else ffn_width
    for label, value in (
        ("n_layers", n_layers),
        ("width", width),
        ("n_heads", n_heads),
        ("n_kv_heads", n_kv_heads),
        ("ffn_width", ffn),
        ("vocab_size", vocab_size),
        ("seq_len", seq_len),
    ):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise VerifyError(f"llama: {label} must be a whole number >= 1, got {value!r}")
    if width % n_heads or (width // n_heads) % 2:
        raise VerifyError(
            f"llama: width {width} must split into n_heads {n_heads} heads of an even size "
            "(rotary embedding turns pairs of features); choose a width divisible by 2 x heads"
        )
    if n_heads % n_kv_heads:
        raise VerifyError(
            f"llama: n_heads {n_heads} is not a multiple of n_kv_heads {n_kv_heads} (each "
            "key/value head serves a whole number of query heads); choose a divisor of it"
        )

    def build() -> nn.Module:
        return nn.Sequential(
            nn.Embedding(vocab_size, width),
            *(
                LlamaBlock(
                    width=width,
                    n_heads=n_heads,
                    n_kv_heads=n_kv_heads,
                    ffn_width=ffn,
                    seq_len=seq_len,
                )
                for _ in range(n_layers)
            ),
            LlamaHead(width=width, vocab_size=vocab_size),
        )

    layers, state = _seeded(seed, build)
    assert isinstance(layers, nn.Sequential)
    return VerifyModel(
        name="llama",
        layers=layers,
        make_batch=_token_batch("llama", vocab_size, seq_len, state),
        loss_fn=next_token_loss,
    )


# -- user factories ------------------------------------------------------------------------
def from_factory(path: str, /, *, seed: int = 0) -> VerifyModel:
    """Import ``package.module:factory``, call it under ``torch.manual_seed(seed)``.

    The factory takes no arguments and returns an ``nn.Sequential``, a list of
    modules, or a :class:`VerifyModel` (to choose the batch and the loss).
    For plain layers the batch is guessed from the first layer with
    parameters (``nn.Linear``: random features; ``nn.Embedding``: random ids
    of length 8), the target is random with the output's shape, and the loss
    is the mean squared error. The current directory is importable, as for
    ``python -m``.

    >>> from_factory("verify.models:mlp").name
    'mlp'
    """
    module_name, _, attr = path.partition(":")
    if not module_name or not attr:
        raise VerifyError(
            f"model {path!r} is not a built-in model ({', '.join(MODEL_NAMES)}) nor an import "
            "path; write package.module:factory"
        )
    if os.getcwd() not in sys.path and "" not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        module = importlib.import_module(module_name)
    except Exception as exc:  # an import runs arbitrary code: report whatever it raised
        raise VerifyError(
            f"cannot import module {module_name!r} of model factory {path!r}: "
            f"{type(exc).__name__}: {exc}; check the name and that it is on PYTHONPATH"
        ) from None
    factory = getattr(module, attr, None)
    if not callable(factory):
        raise VerifyError(
            f"module {module_name!r} has no callable {attr!r} (model factory {path!r})"
        )
    try:
        built, state = _seeded(seed, factory)
    except Exception as exc:
        raise VerifyError(f"model factory {path!r} raised {type(exc).__name__}: {exc}") from None
    if isinstance(built, VerifyModel):
        return built
    if isinstance(built, list | tuple) and all(isinstance(m, nn.Module) for m in built):
        built = nn.Sequential(*built)
    if not isinstance(built, nn.Sequential) or len(built) == 0:
        raise VerifyError(
            f"model factory {path!r} returned {type(built).__name__}; return a non-empty "
            "nn.Sequential, a list of modules, or a verify.VerifyModel"
        )
    return _plain(path, built, state)


def _plain(name: str, layers: nn.Sequential, state: Tensor) -> VerifyModel:
    first = next((m for m in layers.modules() if isinstance(m, nn.Linear | nn.Embedding)), None)
    if first is None:
        raise VerifyError(
            f"model {name!r}: cannot guess its input (no nn.Linear or nn.Embedding layer); "
            "return a verify.VerifyModel with make_batch and loss_fn from the factory"
        )

    def draw_input(batch_size: int) -> Tensor:
        if isinstance(first, nn.Embedding):
            return torch.randint(first.num_embeddings, (batch_size, 8))
        assert isinstance(first, nn.Linear)
        # In the layer's own dtype: a bf16 model given float32 rows fails in its first
        # matmul ("mat1 and mat2 must have the same dtype").
        return torch.randn(batch_size, first.in_features, dtype=first.weight.dtype)

    def make_batch(batch_size: int) -> tuple[Tensor, Tensor]:
        _check_batch(name, batch_size)

        def draw() -> tuple[Tensor, Tensor]:
            x = draw_input(batch_size)
            with torch.no_grad():
                out = layers(x)
            return x, torch.randn(out.shape, dtype=out.dtype)

        return _from_state(state, draw)

    def loss_fn(out: Tensor, target: Tensor) -> Tensor:
        return nn.functional.mse_loss(out, target)

    return VerifyModel(name=name, layers=layers, make_batch=make_batch, loss_fn=loss_fn)


def load_model(
    spec: str,
    /,
    *,
    seed: int | None = None,
    dtype: str | torch.dtype | None = None,
    autocast: str | torch.dtype | None = None,
    n_layers: int = 4,
    width: int = 64,
    n_heads: int | None = None,
    n_kv_heads: int | None = None,
    ffn_width: int | None = None,
) -> VerifyModel:
    """``"mlp"``, ``"gpt"``, ``"llama"`` or ``"package.module:factory"`` -> a
    :class:`VerifyModel`, in ``dtype`` and/or under ``autocast`` (:func:`with_precision`).

    ``seed`` defaults to 21 for the MLP (the chapter's) and 0 otherwise;
    ``n_layers``, ``width`` and ``n_heads`` size the GPT and the Llama, ``n_kv_heads``
    and ``ffn_width`` the Llama (each builder's default where None).

    >>> load_model("gpt", n_layers=2, width=32).name
    'gpt'
    >>> load_model("llama", n_layers=2, width=32, dtype="bf16").precision
    'bf16'
    """
    if spec != "llama":
        for label, value in (("n_kv_heads", n_kv_heads), ("ffn_width", ffn_width)):
            if value is not None:
                raise VerifyError(
                    f"{label}={value} sizes the llama model, not {spec!r}; drop it or use llama"
                )
    heads = {} if n_heads is None else {"n_heads": n_heads}
    chosen = 0 if seed is None else seed
    if spec == "mlp":
        model = mlp(seed=21 if seed is None else seed)
    elif spec == "gpt":
        model = gpt(n_layers=n_layers, width=width, seed=chosen, **heads)
    elif spec == "llama":
        kv = {} if n_kv_heads is None else {"n_kv_heads": n_kv_heads}
        model = llama(
            n_layers=n_layers, width=width, ffn_width=ffn_width, seed=chosen, **heads, **kv
        )
    elif ":" in spec:
        model = from_factory(spec, seed=chosen)
    else:
        raise UnknownNameError(
            f"unknown model {spec!r}; valid models are: {', '.join(MODEL_NAMES)}, or an import "
            "path package.module:factory returning an nn.Sequential"
        )
    return with_precision(model, dtype=dtype, autocast=autocast)


def with_precision(
    model: VerifyModel,
    /,
    *,
    dtype: str | torch.dtype | None = None,
    autocast: str | torch.dtype | None = None,
) -> VerifyModel:
    """``model`` in ``dtype`` (parameters and floating buffers cast in place, floating
    inputs and targets cast as drawn: every tensor, the messages too, in that dtype), or
    with each entry's forward and the loss under ``torch.autocast`` to ``autocast``
    (float32 parameters; :class:`verify.precision.Autocast`). The model is built in
    float32 first, so every dtype starts from the same initialisation, rounded.

    >>> m = with_precision(mlp(), autocast="bf16")
    >>> m.precision, m.layers[0].module.weight.dtype
    ('fp32, autocast bf16', torch.float32)
    """
    cast = None if dtype is None else parse_dtype(dtype)
    under = None if autocast is None else parse_dtype(autocast)
    if under is not None:
        _check_autocast(model, cast, under)
    layers, make_batch, loss_fn = model.layers, model.make_batch, model.loss_fn
    if cast is not None:
        layers.to(cast)
        make_batch = _cast_batch(make_batch, cast)
    if under is not None:
        layers = nn.Sequential(*(Autocast(entry, dtype=under) for entry in layers))
        loss_fn = _autocast_loss(loss_fn, under)
    return VerifyModel(
        name=model.name,
        layers=layers,
        make_batch=make_batch,
        loss_fn=loss_fn,
        autocast=model.autocast if under is None else under,
    )


def _check_autocast(model: VerifyModel, cast: torch.dtype | None, under: torch.dtype) -> None:
    """Refuse an autocast that would do nothing or fight the parameters' dtype."""
    if under == torch.float32:
        raise VerifyError(
            "autocast fp32 computes nothing in lower precision; give bf16 or fp16, or drop it"
        )
    params = model.dtype if cast is None else cast
    if params != torch.float32 or model.autocast is not None:
        raise VerifyError(
            f"autocast {dtype_name(under)} runs float32 parameters in lower precision, but the "
            f"model is already {model.precision if cast is None else dtype_name(cast)}; give "
            "--dtype (every tensor in one dtype) or --autocast (float32 parameters), not both"
        )


def _cast_batch(
    make_batch: Callable[[int], tuple[Tensor, Tensor]], dtype: torch.dtype
) -> Callable[[int], tuple[Tensor, Tensor]]:
    """``make_batch`` with its floating tensors in ``dtype`` (token ids stay integers)."""

    def cast(t: Tensor) -> Tensor:
        return t.to(dtype) if t.is_floating_point() else t

    def make(batch_size: int) -> tuple[Tensor, Tensor]:
        x, target = make_batch(batch_size)
        return cast(x), cast(target)

    return make


def _autocast_loss(
    loss_fn: Callable[[Tensor, Tensor], Tensor], dtype: torch.dtype
) -> Callable[[Tensor, Tensor], Tensor]:
    """``loss_fn`` under autocast, as a training step computes its loss (AMP's recipe)."""

    def loss(out: Tensor, target: Tensor) -> Tensor:
        with torch.autocast(device_type=out.device.type, dtype=dtype):
            return loss_fn(out, target)

    return loss
