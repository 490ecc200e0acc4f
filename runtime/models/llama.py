"""Llama style reference model: RMSNorm, SwiGLU MLP, rotary positions (RoPE), grouped-query attention."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from autoplan.schema import ModelSpec
from runtime.models.common import AttentionCore, Skeleton, stage_layers
from runtime.models.dropout import LayoutFreeDropout, assign_sites


class Embedding(nn.Module):
    def __init__(self, spec: ModelSpec, vocab_rows: int) -> None:
        super().__init__()
        self.tok = nn.Embedding(vocab_rows, spec.hidden_size)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.tok(tokens)  # [B, T] -> [B, T, H]


def rope_tables(seq_len: int, head_dim: int, theta: float) -> tuple[torch.Tensor, torch.Tensor]:
    """cos, sin of shape [T, d/2] for rotary embedding (Su et al. 2021), fp32."""
    inv_freq = 1.0 / theta ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim)
    angles = torch.outer(torch.arange(seq_len, dtype=torch.float32), inv_freq)
    return angles.cos(), angles.sin()


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate the (even, odd) channel pairs of x [B, h, T, d] by the position angle."""
    x1, x2 = x[..., 0::2], x[..., 1::2]
    c, s = cos[: x.shape[2]], sin[: x.shape[2]]  # [T, d/2], broadcast over B, h
    out = torch.stack((x1 * c - x2 * s, x1 * s + x2 * c), dim=-1)
    return out.flatten(-2).type_as(x)


class Attention(nn.Module):
    """Causal self-attention with num_kv_heads <= num_attention_heads (GQA), RoPE on q and k, no biases."""

    def __init__(self, spec: ModelSpec, seq_len: int) -> None:
        super().__init__()
        h, kv = spec.hidden_size, spec.kv_size
        self.head_dim = spec.head_dim
        self.q = nn.Linear(h, h, bias=False)
        self.k = nn.Linear(h, kv, bias=False)
        self.v = nn.Linear(h, kv, bias=False)
        self.o = nn.Linear(h, h, bias=False)
        self.core = AttentionCore(spec.dropout)
        self.seq_len, self.rope_theta = seq_len, spec.rope_theta
        cos, sin = rope_tables(seq_len, spec.head_dim, spec.rope_theta)
        # non-persistent: derived from the spec, so not part of checkpoints
        self.register_buffer("rope_cos", cos, persistent=False)
        self.register_buffer("rope_sin", sin, persistent=False)
        self.positions: torch.Tensor | None = None
        """Global positions of the tokens this rank holds (context parallelism); None: 0 .. T-1."""

    def init_buffers(self) -> None:
        """Recompute the RoPE tables on the buffers' device (after a meta build and ``to_empty``)."""
        cos, sin = rope_tables(self.seq_len, self.head_dim, self.rope_theta)
        self.rope_cos.copy_(cos)
        self.rope_sin.copy_(sin)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, _ = x.shape
        q = self.q(x).view(b, t, -1, self.head_dim).transpose(1, 2)  # [B, h, T, d] (h local under TP)
        k = self.k(x).view(b, t, -1, self.head_dim).transpose(1, 2)  # [B, kv, T, d]
        v = self.v(x).view(b, t, -1, self.head_dim).transpose(1, 2)
        cos, sin = self.rope_cos, self.rope_sin
        if self.positions is not None:  # a sequence shard: rotate by the tokens' global positions
            cos, sin = cos[self.positions], sin[self.positions]
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        y = self.core(q, k, v).transpose(1, 2).reshape(b, t, -1)  # [B, T, h*d]
        return self.o(y)


class MLP(nn.Module):
    """SwiGLU: down(silu(gate(x)) * up(x))."""

    def __init__(self, spec: ModelSpec) -> None:
        super().__init__()
        h, f = spec.hidden_size, spec.ffn_hidden_size
        self.gate = nn.Linear(h, f, bias=False)
        self.up = nn.Linear(h, f, bias=False)
        self.down = nn.Linear(f, h, bias=False)
        self.drop = LayoutFreeDropout(spec.dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.drop(self.down(F.silu(self.gate(x)) * self.up(x)))


class Block(nn.Module):
    def __init__(self, spec: ModelSpec, seq_len: int) -> None:
        super().__init__()
        self.attn_norm = nn.RMSNorm(spec.hidden_size, eps=spec.norm_eps)
        self.attn = Attention(spec, seq_len)
        self.mlp_norm = nn.RMSNorm(spec.hidden_size, eps=spec.norm_eps)
        self.mlp = MLP(spec)
        self.drop = LayoutFreeDropout(spec.dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.drop(self.attn(self.attn_norm(x)))
        return x + self.mlp(self.mlp_norm(x))


class Llama(Skeleton):
    """The whole model or one pipeline stage of it (see GPT)."""

    def __init__(self, spec: ModelSpec, seq_len: int, layers=None, first: bool = True, last: bool = True,
                 vocab_rows: int | None = None) -> None:
        super().__init__()
        rows = self.set_vocab(spec, vocab_rows)
        self.embed = Embedding(spec, rows) if first else None
        self.blocks = nn.ModuleDict({str(i): Block(spec, seq_len) for i in stage_layers(spec.num_layers, layers)})
        self.norm = nn.RMSNorm(spec.hidden_size, eps=spec.norm_eps) if last else None
        self.head = nn.Linear(spec.hidden_size, rows, bias=False) if last else None
        if spec.tie_embeddings and first and last:
            self.head.weight = self.embed.tok.weight
        assign_sites(self)
