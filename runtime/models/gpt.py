"""GPT-2 style reference model (nanoGPT-like): LayerNorm, GELU MLP, learned positions, biases.

Hugging Face's GPT2LMHeadModel computes the same function: its fused ``c_attn`` is q, k and v side by
side and its ``Conv1D`` weights are these Linears' transposed ([in, out]); ``spec.max_positions`` rows of
positions (``n_positions``) and ``spec.activation`` ``gelu_tanh`` (``gelu_new``) make it exact
(tests/runtime/test_hf_families.py compares the logits)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from autoplan.schema import ModelSpec
from runtime.models.common import AttentionCore, Skeleton, stage_layers
from runtime.models.dropout import LayoutFreeDropout, assign_sites


class Embedding(nn.Module):
    """tokens [B, T] -> token + learned position embedding [B, T, H]."""

    def __init__(self, spec: ModelSpec, seq_len: int, vocab_rows: int) -> None:
        super().__init__()
        self.tok = nn.Embedding(vocab_rows, spec.hidden_size)
        self.pos = nn.Embedding(spec.position_rows(seq_len), spec.hidden_size)  # rows past seq_len: never read
        self.drop = LayoutFreeDropout(spec.dropout)
        self.positions: torch.Tensor | None = None
        """Global positions of the tokens this rank holds (context parallelism); None: 0 .. T-1."""

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        t = tokens.shape[1]
        positions = self.positions if self.positions is not None else torch.arange(t, device=tokens.device)
        return self.drop(self.tok(tokens) + self.pos(positions))  # [B, T, H]


class Attention(nn.Module):
    """Multi-head causal self-attention with separate q/k/v/o projections (so TP can split each)."""

    def __init__(self, spec: ModelSpec) -> None:
        super().__init__()
        h = spec.hidden_size
        self.head_dim = spec.head_dim
        self.q, self.k, self.v, self.o = (nn.Linear(h, h) for _ in range(4))
        self.core = AttentionCore(spec.dropout)
        self.drop = LayoutFreeDropout(spec.dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, _ = x.shape
        # view(..., -1, d): under TP each rank holds heads / tp heads, so the head count is inferred
        q = self.q(x).view(b, t, -1, self.head_dim).transpose(1, 2)  # [B, h, T, d]
        k = self.k(x).view(b, t, -1, self.head_dim).transpose(1, 2)
        v = self.v(x).view(b, t, -1, self.head_dim).transpose(1, 2)
        y = self.core(q, k, v).transpose(1, 2).reshape(b, t, -1)  # [B, T, h*d]
        return self.drop(self.o(y))


class MLP(nn.Module):
    def __init__(self, spec: ModelSpec) -> None:
        super().__init__()
        self.fc1 = nn.Linear(spec.hidden_size, spec.ffn_hidden_size)
        self.fc2 = nn.Linear(spec.ffn_hidden_size, spec.hidden_size)
        self.drop = LayoutFreeDropout(spec.dropout)
        self.approximate = "tanh" if spec.mlp_activation == "gelu_tanh" else "none"
        """F.gelu's form: exact (erf) or GPT-2's tanh approximation."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # [B, T, H] -> [B, T, F] -> [B, T, H]
        return self.drop(self.fc2(F.gelu(self.fc1(x), approximate=self.approximate)))


class Block(nn.Module):
    def __init__(self, spec: ModelSpec) -> None:
        super().__init__()
        self.attn_norm = nn.LayerNorm(spec.hidden_size, eps=spec.norm_eps)
        self.attn = Attention(spec)
        self.mlp_norm = nn.LayerNorm(spec.hidden_size, eps=spec.norm_eps)
        self.mlp = MLP(spec)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.attn_norm(x))
        return x + self.mlp(self.mlp_norm(x))


class GPT(Skeleton):
    """The whole model, or one pipeline stage of it: ``layers`` (global block indices), with the
    embedding when ``first`` and the final norm and head when ``last``. Parameters are left as the
    constructors made them; ``runtime.models.init`` gives them their values. ``vocab_rows`` (default
    ``spec.vocab_size``) is the padded vocabulary the embedding and head are built with (Skeleton)."""

    def __init__(self, spec: ModelSpec, seq_len: int, layers=None, first: bool = True, last: bool = True,
                 vocab_rows: int | None = None) -> None:
        super().__init__()
        rows = self.set_vocab(spec, vocab_rows)
        self.embed = Embedding(spec, seq_len, rows) if first else None
        self.blocks = nn.ModuleDict({str(i): Block(spec) for i in stage_layers(spec.num_layers, layers)})
        self.norm = nn.LayerNorm(spec.hidden_size, eps=spec.norm_eps) if last else None
        self.head = nn.Linear(spec.hidden_size, rows, bias=False) if last else None
        if spec.tie_embeddings and first and last:
            self.head.weight = self.embed.tok.weight
        assign_sites(self)
