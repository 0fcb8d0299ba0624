"""Transformer model specs: built-in presets or explicit fields.

A :class:`ModelSpec` is the architecture the planner's formulas need
(:mod:`pipesim.plan.layers`). Presets live in ``pipesim/data/models.json``,
each with the public source of its numbers.

>>> spec = get_model("gpt3-175b")
>>> spec.n_layers, spec.hidden, spec.seq_length
(96, 12288, 2048)
>>> round(spec.n_params / 1e9, 1)
174.6
>>> ModelSpec(n_layers=2, hidden=64, n_heads=4, seq_length=32, vocab_size=100).ffn
256
"""

from __future__ import annotations

from dataclasses import MISSING, dataclass, fields
from functools import cache
from pathlib import Path
from typing import Any

from pipesim.errors import ParseError, PlanError, UnknownNameError, brief
from pipesim.files import read_json, read_package_json
from pipesim.limits import MAX_LAYERS, check_range
from pipesim.suggest import did_you_mean

__all__ = [
    "DTYPE_BYTES",
    "FP8_RECIPES",
    "MLASpec",
    "MoESpec",
    "ModelSpec",
    "get_model",
    "load_model",
    "model_from_dict",
    "model_names",
]

#: Bytes per stored element of the training dtypes the planner knows. ``fp8`` trains the
#: linear layers' GEMMs in FP8 and keeps weights and activations in bf16, as Transformer
#: Engine's ``fp8_autocast`` does (its GEMM inputs are cast to FP8 per kernel).
DTYPE_BYTES = {"bf16": 2, "fp16": 2, "fp32": 4, "fp8": 2}
#: Bytes per gradient element the data-parallel reduction moves: Megatron-LM accumulates
#: and reduces bf16 models' gradients in fp32 (``megatron/training/arguments.py``:
#: "bfloat16 requires gradient accumulation and all-reduce to be done in fp32", unless
#: ``--grad-reduce-in-bf16``); fp8 training keeps bf16 weights (``--bf16 --fp8-format``), so
#: the same; fp16 models reduce in fp16 (``--accumulate-allreduce-grads-in-fp32`` is off).
GRAD_REDUCE_BYTES = {"bf16": 4, "fp16": 2, "fp32": 4, "fp8": 4}
#: Transformer Engine's per-tensor FP8 scaling recipes, by Megatron-Core's names
#: (``TransformerConfig.fp8_recipe``, ``megatron/core/transformer/transformer_config.py``):
#: ``delayed`` (TE's ``DelayedScaling``: each cast scales by an amax history and updates
#: it in the same kernel; Megatron-Core's default) and ``tensorwise`` (TE's
#: ``Float8CurrentScaling``: each tensor's amax is computed before its cast).
FP8_RECIPES = ("delayed", "tensorwise")


@dataclass(frozen=True, slots=True, kw_only=True)
class MoESpec:
    """The mixture-of-experts layers of a model (Shazeer et al. 2017; Fedus et al. 2022,
    "Switch Transformers"; DeepSeek-AI 2024, "DeepSeek-V3 Technical Report", section 2.1.2).

    Every block from ``dense_layers`` on replaces its MLP with ``experts`` routed experts
    of width ``expert_ffn_hidden`` (each token runs on ``top_k`` of them) and
    ``shared_experts`` experts every token runs on; the first ``dense_layers`` blocks
    keep the dense MLP of ``ffn_hidden``.
    """

    experts: int
    """Routed experts per MoE layer."""
    top_k: int
    """Routed experts each token runs on."""
    expert_ffn_hidden: int
    """Width of one expert's MLP (gated like the model's MLP)."""
    shared_experts: int = 0
    """Experts every token runs on, beside the routed ones (DeepSeekMoE's)."""
    dense_layers: int = 0
    """The first blocks keep a dense MLP (DeepSeek-V3's ``first_k_dense_replace``)."""
    capacity_factor: float | None = None
    """Tokens an expert takes, as a multiple of the balanced share, padded to it
    (Fedus et al. 2022, section 2.2); None: dropless routing."""
    node_limit: int | None = None
    """Nodes a token is dispatched to at most (DeepSeek-V3 section 2.1.2: "each token
    will be sent to at most M nodes"); None: no limit."""

    def __post_init__(self) -> None:
        for name in ("experts", "top_k", "expert_ffn_hidden"):
            _check_positive(f"moe {name}", getattr(self, name))
        for name in ("shared_experts", "dense_layers"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= 10**9:
                raise PlanError(f"moe {name} must be a whole number >= 0, got {brief(value)}")
        if self.top_k > self.experts:
            raise PlanError(
                f"moe top_k ({self.top_k}) must be at most the routed experts ({self.experts})"
            )
        if self.node_limit is not None:
            _check_positive("moe node_limit", self.node_limit)
        cf = self.capacity_factor
        if cf is not None and (
            isinstance(cf, bool) or not isinstance(cf, int | float) or not 1 <= cf <= 64
        ):
            raise PlanError(
                f"moe capacity_factor must be a number from 1 to 64 (or null: dropless), "
                f"got {brief(cf)}"
            )

    @property
    def load_factor(self) -> float:
        """Tokens the busiest expert runs over the balanced share: the capacity factor
        (experts padded to capacity), or 1 for dropless routing, which assumes balanced
        experts (DeepSeek-V3 section 2.1.2: auxiliary-loss-free balancing)."""
        return 1.0 if self.capacity_factor is None else float(self.capacity_factor)


@dataclass(frozen=True, slots=True, kw_only=True)
class MLASpec:
    """Multi-head latent attention (DeepSeek-AI 2024, "DeepSeek-V2", section 2.1.2;
    DeepSeek-V3 section 2.1.1): queries and keys/values projected through low-rank
    latents, each head a ``qk_nope_head_dim`` part and a shared-key rotary part of
    ``qk_rope_head_dim``, values of ``v_head_dim``."""

    q_lora_rank: int
    """Query latent width d_c' (``q_lora_rank`` in config.json)."""
    kv_lora_rank: int
    """Key/value latent width d_c (``kv_lora_rank``)."""
    qk_nope_head_dim: int
    """Per-head query/key width without rotary embedding."""
    qk_rope_head_dim: int
    """Per-head rotary query width, and the shared rotary key's."""
    v_head_dim: int
    """Per-head value width."""

    def __post_init__(self) -> None:
        for f in fields(self):
            _check_positive(f"mla {f.name}", getattr(self, f.name))


@dataclass(frozen=True, slots=True, kw_only=True)
class ModelSpec:
    """A decoder-only transformer: the shapes the FLOP and memory formulas need."""

    n_layers: int
    """Transformer blocks (embedding and LM head are extra layers)."""
    hidden: int
    """Model width h."""
    n_heads: int
    """Attention heads a."""
    seq_length: int
    """Sequence length s (tokens per sample)."""
    vocab_size: int
    """Vocabulary V."""
    n_kv_heads: int | None = None
    """Key/value heads for grouped-query attention; None: as many as ``n_heads``."""
    ffn_hidden: int | None = None
    """MLP width; None: ``4 * hidden``."""
    dtype: str = "bf16"
    """Training precision: bf16, fp16, fp32, or fp8 (FP8 GEMMs, bf16 storage)."""
    fp8_recipe: str = "delayed"
    """The FP8 scaling recipe of an fp8 model (:data:`FP8_RECIPES`): which quantization
    kernels Transformer Engine runs around each FP8 GEMM (``pipesim.plan.kernels``)."""
    grad_reduce_in_bf16: bool = False
    """A bf16 or fp8 model keeps its gradient buffer and reduces it over data parallelism
    in bf16, not fp32 (Megatron-LM's ``--grad-reduce-in-bf16``, Megatron-Core's
    ``DistributedDataParallelConfig.grad_reduce_in_fp32 = False``, as NVIDIA's
    Megatron-Bridge performance recipes set it); False: Megatron-LM's default."""
    gated_mlp: bool = False
    """SwiGLU-style MLP with three matrices (Llama) instead of two (GPT)."""
    bias: bool = True
    """Linear biases and LayerNorm (GPT); False: no biases and RMSNorm (Llama)."""
    learned_positions: bool = True
    """A learned position embedding table (GPT); False: rotary positions (Llama)."""
    tied_embeddings: bool = False
    """Input embedding and LM head share weights (counted once in ``n_params``; with
    pipelining the last stage still holds its own copy, as Megatron-LM does)."""
    dropout: bool = True
    """Dropout layers whose masks are stored for backward (Korthikanti et al. 2023)."""
    flash_attention: bool = False
    """Fused attention that stores no s x s score matrices (Dao et al. 2022)."""
    head_dim: int | None = None
    """Width of one attention head; None: ``hidden / n_heads`` (Qwen3 sets it apart)."""
    moe: MoESpec | None = None
    """Mixture-of-experts layers; None: a dense model."""
    mla: MLASpec | None = None
    """Multi-head latent attention instead of (grouped-query) multi-head attention."""
    name: str = "custom"
    """Preset name or ``custom``."""
    description: str = ""
    """One line for tables and reports."""

    def __post_init__(self) -> None:
        for name in ("n_layers", "hidden", "n_heads", "seq_length", "vocab_size"):
            _check_positive(name, getattr(self, name))
        check_range(
            self.n_layers, name="n_layers", maximum=MAX_LAYERS, limit="MAX_LAYERS", error=PlanError
        )
        for name in ("n_kv_heads", "ffn_hidden", "head_dim"):
            if getattr(self, name) is not None:
                _check_positive(name, getattr(self, name))
        if self.dtype not in DTYPE_BYTES:
            raise PlanError(
                f"dtype must be one of {', '.join(DTYPE_BYTES)}, got {brief(self.dtype)}"
            )
        if self.fp8_recipe not in FP8_RECIPES:
            raise PlanError(
                f"fp8_recipe must be one of {', '.join(FP8_RECIPES)}, got {brief(self.fp8_recipe)}"
            )
        kv = self.kv_heads
        if self.n_heads % kv:
            raise PlanError(
                f"n_kv_heads ({kv}) must divide n_heads ({self.n_heads}) for grouped-query "
                "attention; pick a divisor"
            )
        if kv != self.n_heads and self.hidden % self.n_heads and self.head_dim is None:
            raise PlanError(
                f"grouped-query attention needs hidden ({self.hidden}) divisible by n_heads "
                f"({self.n_heads}) to size the key/value projections"
            )
        for name in (
            "grad_reduce_in_bf16",
            "gated_mlp",
            "bias",
            "learned_positions",
            "tied_embeddings",
            "dropout",
            "flash_attention",
        ):
            if not isinstance(getattr(self, name), bool):
                raise PlanError(f"{name} must be true or false, got {brief(getattr(self, name))}")
        if self.grad_reduce_in_bf16 and self.dtype not in ("bf16", "fp8"):
            raise PlanError(
                f"grad_reduce_in_bf16 halves a bf16 or fp8 model's fp32 gradients; a model "
                f"trained in {self.dtype} reduces them in {self.dtype}: drop it "
                "(--grad-reduce-in-bf16) or train in bf16"
            )
        if self.moe is not None and self.moe.dense_layers > self.n_layers:
            raise PlanError(
                f"moe dense_layers ({self.moe.dense_layers}) exceeds n_layers ({self.n_layers})"
            )
        if self.mla is not None and not self.flash_attention:
            raise PlanError(
                "multi-head latent attention is priced as a fused (flash) attention kernel, "
                "as DeepSeek trains it; set flash_attention true"
            )

    @property
    def kv_heads(self) -> int:
        """Key/value heads (``n_heads`` without grouped-query attention)."""
        return self.n_heads if self.n_kv_heads is None else self.n_kv_heads

    @property
    def head_size(self) -> int:
        """Width of one attention head: ``head_dim``, else ``hidden / n_heads``."""
        return self.hidden // self.n_heads if self.head_dim is None else self.head_dim

    @property
    def q_hidden(self) -> int:
        """Width of the query projection (and of the attention output): ``hidden``, or
        ``n_heads * head_dim`` when the heads have their own width."""
        return self.hidden if self.head_dim is None else self.n_heads * self.head_dim

    @property
    def kv_hidden(self) -> int:
        """Width of the key (and of the value) projection: ``hidden * kv_heads / n_heads``
        (``kv_heads * head_dim`` when the heads have their own width)."""
        if self.head_dim is not None:
            return self.kv_heads * self.head_dim
        if self.kv_heads == self.n_heads:
            return self.hidden
        return self.hidden // self.n_heads * self.kv_heads

    @property
    def ffn(self) -> int:
        """MLP width f."""
        return 4 * self.hidden if self.ffn_hidden is None else self.ffn_hidden

    @property
    def dtype_bytes(self) -> int:
        """Bytes per weight / activation element."""
        return DTYPE_BYTES[self.dtype]

    @property
    def grad_reduce_bytes(self) -> int:
        """Bytes per gradient element in the data-parallel reduction (:data:`GRAD_REDUCE_BYTES`;
        2 with :attr:`grad_reduce_in_bf16`)."""
        return 2 if self.grad_reduce_in_bf16 else GRAD_REDUCE_BYTES[self.dtype]

    def vocab_rows(self, tensor: int, /) -> int:
        """Rows of the vocabulary-parallel word embedding (and head) one of ``tensor``
        ranks holds: ``vocab / t`` rounded up (Megatron-LM pads the vocabulary so that
        it divides)."""
        return -(-self.vocab_size // tensor)

    @property
    def n_params(self) -> int:
        """Parameters of the model, a tied embedding counted once."""
        from pipesim.plan.layers import model_layers

        total = int(sum(layer.params for layer in model_layers(self)))
        if self.tied_embeddings:
            total -= self.vocab_size * self.hidden  # the last stage's copy of the embedding
        return total

    def to_dict(self) -> dict[str, Any]:
        """The JSON form (explicit fields, as :func:`model_from_dict` reads them)."""
        out = {f.name: getattr(self, f.name) for f in fields(self)}
        for name in ("moe", "mla"):
            part = out[name]
            out[name] = (
                None if part is None else {f.name: getattr(part, f.name) for f in fields(part)}
            )
        return out


def _check_positive(name: str, value: object) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= 10**9:
        raise PlanError(f"model {name} must be a whole number from 1 to 10**9, got {brief(value)}")


_FIELDS = {f.name for f in fields(ModelSpec)}


def model_from_dict(data: object, /, *, source: str = "model") -> ModelSpec:
    """A ModelSpec from a JSON object of its fields (``source`` and ``*_source`` keys
    carrying citations are allowed and ignored)."""
    if not isinstance(data, dict):
        raise ParseError(f"{source}: expected a JSON object of model fields")
    values = {k: v for k, v in data.items() if k != "source" and not k.endswith("_source")}
    unknown = sorted(set(values) - _FIELDS)
    if unknown:
        raise ParseError(
            f"{source}: unknown model fields {unknown}; valid fields are {sorted(_FIELDS)}"
        )
    try:
        for name, kind in (("moe", MoESpec), ("mla", MLASpec)):
            values[name] = _part(kind, values.get(name), f"{source}: {name}")
        return ModelSpec(**values)
    except TypeError as exc:  # a required field is missing
        required = ("n_layers", "hidden", "n_heads", "seq_length", "vocab_size")
        missing = [f for f in required if f not in values]
        raise ParseError(f"{source}: missing model fields {missing} ({exc})") from None
    except PlanError as exc:
        raise PlanError(f"{source}: {exc}") from None


def _part(kind: type[Any], data: object, source: str) -> Any:
    """The ``moe`` or ``mla`` part of a model from its JSON object (None: absent)."""
    if data is None or isinstance(data, kind):
        return data
    if not isinstance(data, dict):
        raise ParseError(f"{source}: expected a JSON object of {kind.__name__} fields or null")
    values = {k: v for k, v in data.items() if not k.endswith("_source")}
    known = {f.name for f in fields(kind)}
    unknown = sorted(set(values) - known)
    if unknown:
        raise ParseError(f"{source}: unknown fields {unknown}; valid fields are {sorted(known)}")
    try:
        return kind(**values)
    except TypeError:
        required = sorted(f.name for f in fields(kind) if f.default is MISSING)
        raise ParseError(f"{source}: needs the fields {required}") from None


@cache
def _presets() -> dict[str, ModelSpec]:
    raw = read_package_json("models.json")["models"]
    return {
        name: model_from_dict({**entry, "name": name}, source=f"models.json: {name}")
        for name, entry in raw.items()
    }


def model_names() -> tuple[str, ...]:
    """Names of the built-in model presets.

    >>> "llama2-7b" in model_names()
    True
    """
    return tuple(_presets())


def get_model(name: str, /) -> ModelSpec:
    """The preset ``name``; UnknownNameError listing the presets otherwise."""
    try:
        return _presets()[name]
    except KeyError:
        raise UnknownNameError(
            f"unknown model {name!r}{did_you_mean(name, model_names())}; "
            f"presets are: {', '.join(model_names())} "
            "(or give a model JSON file, a pipesim cost file, or --layers/--hidden/... fields)"
        ) from None


def load_model(path: str | Path, /) -> ModelSpec:
    """Read a ModelSpec from a JSON file of its fields."""
    return model_from_dict(read_json(path, what="model"), source=str(path))
