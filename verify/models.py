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
- :func:`from_factory`: ``"package.module:factory"`` returning an
  ``nn.Sequential``, a list of modules, or a :class:`VerifyModel`.

>>> model = mlp()
>>> sum(p.numel() for p in model.layers.parameters())
20644
>>> x, target = model.make_batch(32)
>>> tuple(x.shape), tuple(target.shape)
((32, 16), (32, 4))
"""

from __future__ import annotations

import importlib
import math
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from pipesim.errors import UnknownNameError
from verify.errors import VerifyError

__all__ = ["MODEL_NAMES", "VerifyModel", "from_factory", "gpt", "load_model", "mlp"]

#: The built-in model names ``load_model`` (and ``pipesim verify --model``) accepts.
MODEL_NAMES = ("mlp", "gpt")


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
class Embedding(nn.Module):
    """Token + learned position embedding: ``(batch, seq)`` ids -> ``(batch, seq, width)``."""

    def __init__(self, *, vocab_size: int, seq_len: int, width: int) -> None:
        super().__init__()
        self.token = nn.Embedding(vocab_size, width)
        self.position = nn.Embedding(seq_len, width)

    def forward(self, ids: Tensor) -> Tensor:
        positions = torch.arange(ids.shape[1], device=ids.device)
        embedded: Tensor = self.token(ids) + self.position(positions)  # (batch, seq, width)
        return embedded


class Block(nn.Module):
    """Pre-norm transformer block (nanoGPT's layout): causal attention, then a GELU MLP.

    Attention is written out (no fused kernel) so that it is deterministic on
    every device.
    """

    def __init__(self, *, width: int, n_heads: int, seq_len: int) -> None:
        super().__init__()
        if width % n_heads:
            raise VerifyError(f"gpt: width {width} is not divisible by n_heads {n_heads}")
        self.n_heads = n_heads
        self.norm1 = nn.LayerNorm(width)
        self.qkv = nn.Linear(width, 3 * width)
        self.proj = nn.Linear(width, width)
        self.norm2 = nn.LayerNorm(width)
        self.fc = nn.Linear(width, 4 * width)
        self.act = nn.GELU()
        self.fc_out = nn.Linear(4 * width, width)
        mask = torch.ones(seq_len, seq_len, dtype=torch.bool).tril()
        self.register_buffer("mask", mask, persistent=False)

    def forward(self, x: Tensor) -> Tensor:
        batch, seq, width = x.shape
        head = width // self.n_heads
        q, k, v = self.qkv(self.norm1(x)).split(width, dim=2)
        # (batch, heads, seq, head)
        q = q.view(batch, seq, self.n_heads, head).transpose(1, 2)
        k = k.view(batch, seq, self.n_heads, head).transpose(1, 2)
        v = v.view(batch, seq, self.n_heads, head).transpose(1, 2)
        scores = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(head))  # (batch, heads, seq, seq)
        mask: Tensor = self.mask  # type: ignore[assignment]  # a registered buffer
        scores = scores.masked_fill(~mask[:seq, :seq], float("-inf"))
        y = scores.softmax(dim=-1) @ v  # (batch, heads, seq, head)
        y = y.transpose(1, 2).reshape(batch, seq, width)
        x = x + self.proj(y)
        out: Tensor = x + self.fc_out(self.act(self.fc(self.norm2(x))))
        return out


class Head(nn.Module):
    """Final layer norm and the vocabulary projection: ``(batch, seq, vocab)`` logits."""

    def __init__(self, *, width: int, vocab_size: int) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(width)
        self.out = nn.Linear(width, vocab_size, bias=False)

    def forward(self, x: Tensor) -> Tensor:
        logits: Tensor = self.out(self.norm(x))  # (batch, seq, vocab)
        return logits


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

    def make_batch(batch_size: int) -> tuple[Tensor, Tensor]:
        _check_batch("gpt", batch_size)

        def draw() -> tuple[Tensor, Tensor]:
            ids = torch.randint(vocab_size, (batch_size, seq_len + 1))
            return ids[:, :-1].contiguous(), ids[:, 1:].contiguous()  # next-token targets

        return _from_state(state, draw)

    def loss_fn(logits: Tensor, target: Tensor) -> Tensor:
        # Cross-entropy spelled out: torch's NLLLoss has no deterministic CUDA kernel
        # (torch.use_deterministic_algorithms refuses it), a one-hot product does.
        log_probs = logits.log_softmax(dim=-1)  # (batch, seq, vocab)
        picked = (log_probs * nn.functional.one_hot(target, logits.shape[-1])).sum(dim=-1)
        return -picked.mean()

    assert isinstance(layers, nn.Sequential)
    return VerifyModel(name="gpt", layers=layers, make_batch=make_batch, loss_fn=loss_fn)


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
        return torch.randn(batch_size, first.in_features)

    def make_batch(batch_size: int) -> tuple[Tensor, Tensor]:
        _check_batch(name, batch_size)

        def draw() -> tuple[Tensor, Tensor]:
            x = draw_input(batch_size)
            with torch.no_grad():
                shape = layers(x).shape
            return x, torch.randn(shape)

        return _from_state(state, draw)

    def loss_fn(out: Tensor, target: Tensor) -> Tensor:
        return nn.functional.mse_loss(out, target)

    return VerifyModel(name=name, layers=layers, make_batch=make_batch, loss_fn=loss_fn)


def load_model(
    spec: str, /, *, seed: int | None = None, n_layers: int = 4, width: int = 64
) -> VerifyModel:
    """``"mlp"``, ``"gpt"`` or ``"package.module:factory"`` -> a :class:`VerifyModel`.

    ``seed`` defaults to 21 for the MLP (the chapter's) and 0 otherwise;
    ``n_layers`` and ``width`` size the GPT.

    >>> load_model("gpt", n_layers=2, width=32).name
    'gpt'
    """
    if spec == "mlp":
        return mlp(seed=21 if seed is None else seed)
    if spec == "gpt":
        return gpt(n_layers=n_layers, width=width, seed=0 if seed is None else seed)
    if ":" in spec:
        return from_factory(spec, seed=0 if seed is None else seed)
    raise UnknownNameError(
        f"unknown model {spec!r}; valid models are: {', '.join(MODEL_NAMES)}, or an import "
        "path package.module:factory returning an nn.Sequential"
    )
