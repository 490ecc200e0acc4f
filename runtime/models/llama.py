"""Llama style reference model: RMSNorm, SwiGLU MLP, rotary positions (RoPE), grouped-query attention;
optionally Qwen2's q/k/v biases, Qwen3's per-head q/k RMSNorm and head width, and Llama 3.1's RoPE scaling.

Computed as Hugging Face's LlamaForCausalLM family computes it (same parameter shapes, the rotate-half RoPE
convention, the same frequency formulas), so its weights load without permutation and the logits agree
(tests/runtime/test_hf_families.py).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from autoplan.schema import ModelSpec
from autoplan.schema.model import RopeScaling
from runtime.models.common import AttentionCore, Skeleton, stage_layers
from runtime.models.dropout import LayoutFreeDropout, assign_sites
from runtime.models.moe import MoE


class Embedding(nn.Module):
    def __init__(self, spec: ModelSpec, vocab_rows: int) -> None:
        super().__init__()
        self.tok = nn.Embedding(vocab_rows, spec.hidden_size)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.tok(tokens)  # [B, T] -> [B, T, H]


def inverse_frequencies(head_dim: int, theta: float, scaling: RopeScaling | None = None) -> torch.Tensor:
    """RoPE's d/2 angular frequencies theta^(-2i/d), fp32, with Llama 3.1's rule applied when ``scaling``
    is given: written as transformers' ``_compute_default_rope_parameters`` and ``_compute_llama3_parameters``
    write them, so the tables are theirs to the last bit."""
    inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.int64).to(dtype=torch.float) / head_dim))
    if scaling is None:
        return inv_freq
    low_freq_wavelen = scaling.original_max_position_embeddings / scaling.low_freq_factor
    high_freq_wavelen = scaling.original_max_position_embeddings / scaling.high_freq_factor
    wavelen = 2 * math.pi / inv_freq
    # shorter than high_freq_wavelen: kept; longer than low_freq_wavelen: divided by factor; between: blended
    scaled = torch.where(wavelen > low_freq_wavelen, inv_freq / scaling.factor, inv_freq)
    smooth = (scaling.original_max_position_embeddings / wavelen - scaling.low_freq_factor) / (
        scaling.high_freq_factor - scaling.low_freq_factor)
    smoothed = (1 - smooth) * scaled / scaling.factor + smooth * scaled
    medium = ~(wavelen < high_freq_wavelen) * ~(wavelen > low_freq_wavelen)
    return torch.where(medium, smoothed, scaled)


def rope_tables(seq_len: int, head_dim: int, theta: float,
                scaling: RopeScaling | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """cos, sin of shape [T, d/2] (Su et al. 2021), fp32: position t's angle for each frequency.
    Hugging Face keeps them duplicated to width d (``cat((freqs, freqs))``); half is the same numbers."""
    angles = torch.outer(torch.arange(seq_len, dtype=torch.float32), inverse_frequencies(head_dim, theta, scaling))
    return angles.cos(), angles.sin()


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate channel i with channel i + d/2 of x [B, h, T, d] by the position's angle for frequency i:
    Hugging Face's ``x * cos + rotate_half(x) * sin``, i.e. (x1 c - x2 s, x2 c + x1 s) for the halves x1,
    x2, the same products and sums (so the same bits). Written as a stack over a new axis and a flatten
    rather than a cat, the same kernels as the (even, odd) pairing it replaced, which the cost model's
    eager op counts (cost/analytic_ops.py HOST_OP_COUNTS, EAGER_ELEMENTS) were counted on."""
    half = x.shape[-1] // 2
    x1, x2 = x[..., :half], x[..., half:]
    c, s = cos[: x.shape[2]], sin[: x.shape[2]]  # [T, d/2], broadcast over B, h
    out = torch.stack((x1 * c - x2 * s, x2 * c + x1 * s), dim=-2)  # [B, h, T, 2, d/2]
    return out.flatten(-2).type_as(x)


class Attention(nn.Module):
    """Causal self-attention with num_kv_heads <= num_attention_heads (GQA), RoPE on q and k; q/k/v biases
    with ``qkv_bias`` (Qwen2), a per-head RMSNorm of q and k before RoPE with ``qk_norm`` (Qwen3)."""

    def __init__(self, spec: ModelSpec, seq_len: int) -> None:
        super().__init__()
        h, q, kv = spec.hidden_size, spec.q_size, spec.kv_size
        self.head_dim = spec.head_dim
        self.q = nn.Linear(h, q, bias=spec.qkv_bias)
        self.k = nn.Linear(h, kv, bias=spec.qkv_bias)
        self.v = nn.Linear(h, kv, bias=spec.qkv_bias)
        self.o = nn.Linear(q, h, bias=False)
        if spec.qk_norm:  # over one head's channels: each TP rank normalises its own heads (tensor_parallel.py)
            self.q_norm = nn.RMSNorm(spec.head_dim, eps=spec.norm_eps)
            self.k_norm = nn.RMSNorm(spec.head_dim, eps=spec.norm_eps)
        self.core = AttentionCore(spec.dropout)
        self.seq_len, self.rope_theta, self.rope_scaling = seq_len, spec.rope_theta, spec.rope_scaling
        cos, sin = rope_tables(seq_len, spec.head_dim, spec.rope_theta, spec.rope_scaling)
        # non-persistent: derived from the spec, so not part of checkpoints
        self.register_buffer("rope_cos", cos, persistent=False)
        self.register_buffer("rope_sin", sin, persistent=False)
        self.positions: torch.Tensor | None = None
        """Global positions of the tokens this rank holds (context parallelism); None: 0 .. T-1."""

    def init_buffers(self) -> None:
        """Recompute the RoPE tables on the buffers' device (after a meta build and ``to_empty``)."""
        cos, sin = rope_tables(self.seq_len, self.head_dim, self.rope_theta, self.rope_scaling)
        self.rope_cos.copy_(cos)
        self.rope_sin.copy_(sin)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, _ = x.shape
        q = self.q(x).view(b, t, -1, self.head_dim)  # [B, T, h, d] (h local under TP)
        k = self.k(x).view(b, t, -1, self.head_dim)  # [B, T, kv, d]
        if hasattr(self, "q_norm"):
            q, k = self.q_norm(q), self.k_norm(k)
        q, k = q.transpose(1, 2), k.transpose(1, 2)  # [B, h, T, d], [B, kv, T, d]
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
    """Attention then the feed-forward part: the dense SwiGLU ``MLP``, or for the spec's MoE blocks
    (``spec.is_moe_block(layer)``) the Mixture-of-Experts layer (runtime/models/moe.py: router, routed
    experts, shared experts), whose output dropout is the block's ``mlp_drop`` (the dense MLP holds its own)."""

    def __init__(self, spec: ModelSpec, seq_len: int, layer: int = 0) -> None:
        super().__init__()
        self.attn_norm = nn.RMSNorm(spec.hidden_size, eps=spec.norm_eps)
        self.attn = Attention(spec, seq_len)
        self.mlp_norm = nn.RMSNorm(spec.hidden_size, eps=spec.norm_eps)
        if spec.is_moe_block(layer):
            self.mlp = MoE(spec.hidden_size, spec.moe)
            self.mlp_drop = LayoutFreeDropout(spec.dropout)
        else:
            self.mlp = MLP(spec)
        self.drop = LayoutFreeDropout(spec.dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.drop(self.attn(self.attn_norm(x)))
        y = self.mlp(self.mlp_norm(x))
        return x + (self.mlp_drop(y) if hasattr(self, "mlp_drop") else y)


class Llama(Skeleton):
    """The whole model or one pipeline stage of it (see GPT)."""

    def __init__(self, spec: ModelSpec, seq_len: int, layers=None, first: bool = True, last: bool = True,
                 vocab_rows: int | None = None) -> None:
        super().__init__()
        rows = self.set_vocab(spec, vocab_rows)
        self.embed = Embedding(spec, rows) if first else None
        self.blocks = nn.ModuleDict({str(i): Block(spec, seq_len, i) for i in stage_layers(spec.num_layers, layers)})
        self.norm = nn.RMSNorm(spec.hidden_size, eps=spec.norm_eps) if last else None
        self.head = nn.Linear(spec.hidden_size, rows, bias=False) if last else None
        if spec.tie_embeddings and first and last:
            self.head.weight = self.embed.tok.weight
        assign_sites(self)
