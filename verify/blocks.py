"""The layers of the built-in transformers: a GPT's blocks and a Llama's.

:func:`verify.models.gpt` and :func:`verify.models.llama` stack them into an
``nn.Sequential`` (embedding, blocks, head), the unit the partitioner cuts.
Attention is written out (no fused kernel) so that it is deterministic on
every device.

>>> import torch
>>> block = LlamaBlock(width=32, n_heads=4, n_kv_heads=2, ffn_width=96, seq_len=8)
>>> tuple(block(torch.zeros(2, 8, 32)).shape)
(2, 8, 32)
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from verify.errors import VerifyError

__all__ = ["Block", "Embedding", "Head", "LlamaBlock", "LlamaHead"]


# -- GPT (nanoGPT's layout) ----------------------------------------------------------------
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


# -- Llama -------------------------------------------------------------------------------
def _rotate(x: Tensor) -> Tensor:
    """Rotary position embedding (Su et al., RoFormer, 2021) of ``(batch, heads, seq, head)``
    in the half-split layout of Hugging Face's Llama (``rotate_half``), computed in float32
    as Meta's Llama does, then back to ``x``'s dtype."""
    seq, head = x.shape[-2], x.shape[-1]
    inv_freq = 1.0 / (
        10000.0 ** (torch.arange(0, head, 2, device=x.device, dtype=torch.float32) / head)
    )
    angles = torch.outer(torch.arange(seq, device=x.device, dtype=torch.float32), inv_freq)
    angles = torch.cat((angles, angles), dim=-1)  # (seq, head)
    xf = x.float()
    half = head // 2
    rotated = torch.cat((-xf[..., half:], xf[..., :half]), dim=-1)
    return (xf * angles.cos() + rotated * angles.sin()).to(x.dtype)


class LlamaBlock(nn.Module):
    """Pre-norm Llama block (Touvron et al., 2023): RMSNorm, causal attention with rotary
    positions and grouped-query heads (Ainslie et al., GQA, 2023: ``n_kv_heads`` key/value
    heads, each shared by ``n_heads / n_kv_heads`` query heads), RMSNorm, SwiGLU MLP
    (Shazeer, 2020: ``w2(silu(w1 x) * w3 x)``); no biases. Attention is written out (no
    fused kernel) so that it is deterministic on every device; its softmax runs in
    float32, as Hugging Face's Llama does."""

    def __init__(
        self, *, width: int, n_heads: int, n_kv_heads: int, ffn_width: int, seq_len: int
    ) -> None:
        super().__init__()
        self.n_heads, self.n_kv_heads = n_heads, n_kv_heads
        head = width // n_heads
        self.norm1 = nn.RMSNorm(width, eps=1e-5)
        self.wq = nn.Linear(width, n_heads * head, bias=False)
        self.wk = nn.Linear(width, n_kv_heads * head, bias=False)
        self.wv = nn.Linear(width, n_kv_heads * head, bias=False)
        self.wo = nn.Linear(n_heads * head, width, bias=False)
        self.norm2 = nn.RMSNorm(width, eps=1e-5)
        self.w1 = nn.Linear(width, ffn_width, bias=False)
        self.w3 = nn.Linear(width, ffn_width, bias=False)
        self.w2 = nn.Linear(ffn_width, width, bias=False)
        mask = torch.ones(seq_len, seq_len, dtype=torch.bool).tril()
        self.register_buffer("mask", mask, persistent=False)

    def forward(self, x: Tensor) -> Tensor:
        batch, seq, width = x.shape
        head = width // self.n_heads
        h = self.norm1(x)
        # (batch, heads, seq, head)
        q = self.wq(h).view(batch, seq, self.n_heads, head).transpose(1, 2)
        k = self.wk(h).view(batch, seq, self.n_kv_heads, head).transpose(1, 2)
        v = self.wv(h).view(batch, seq, self.n_kv_heads, head).transpose(1, 2)
        q, k = _rotate(q), _rotate(k)
        shared = self.n_heads // self.n_kv_heads  # query heads per key/value head
        k = k.repeat_interleave(shared, dim=1)
        v = v.repeat_interleave(shared, dim=1)
        scores = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(head))  # (batch, heads, seq, seq)
        mask: Tensor = self.mask  # type: ignore[assignment]  # a registered buffer
        scores = scores.masked_fill(~mask[:seq, :seq], float("-inf"))
        y = scores.float().softmax(dim=-1).to(v.dtype) @ v  # (batch, heads, seq, head)
        x = x + self.wo(y.transpose(1, 2).reshape(batch, seq, width))
        h = self.norm2(x)
        out: Tensor = x + self.w2(nn.functional.silu(self.w1(h)) * self.w3(h))
        return out


class LlamaHead(nn.Module):
    """Final RMSNorm and the vocabulary projection: ``(batch, seq, vocab)`` logits."""

    def __init__(self, *, width: int, vocab_size: int) -> None:
        super().__init__()
        self.norm = nn.RMSNorm(width, eps=1e-5)
        self.out = nn.Linear(width, vocab_size, bias=False)

    def forward(self, x: Tensor) -> Tensor:
        logits: Tensor = self.out(self.norm(x))  # (batch, seq, vocab)
        return logits
