"""Pieces shared by the reference models: the attention core (the part selective recomputation drops)
and the skeleton forward that skips the parts a pipeline stage does not hold."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint


class AttentionCore(nn.Module):
    """softmax(q k^T / sqrt(d) + causal mask) v, with dropout on the probabilities.

    ``recompute = True`` is selective recomputation (Korthikanti et al. 2022): this core keeps only q, k, v
    for backward and recomputes scores/softmax/dropout. It is set by the runtime, not by the model.
    """

    def __init__(self, dropout: float) -> None:
        super().__init__()
        self.dropout = dropout
        self.recompute = False

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        # q: [B, h, T, d]; k, v: [B, kv, T, d] with h % kv == 0 (GQA when kv < h)
        if self.recompute and torch.is_grad_enabled():
            return checkpoint(self._attend, q, k, v, use_reentrant=False)
        return self._attend(q, k, v)

    def _attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        p = self.dropout if self.training else 0.0
        gqa = k.shape[1] != q.shape[1]
        return F.scaled_dot_product_attention(q, k, v, dropout_p=p, is_causal=True, enable_gqa=gqa)


class Skeleton(nn.Module):
    """embed -> blocks -> norm -> head, skipping whichever is None (pipeline stages)."""

    embed: nn.Module | None
    blocks: nn.ModuleDict
    norm: nn.Module | None
    head: nn.Module | None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # first stage: x = tokens [B, T]; later stages: x = hidden [B, T, H]
        h = self.embed(x) if self.embed is not None else x
        for block in self.blocks.values():
            h = block(h)
        if self.norm is not None:
            h = self.norm(h)
        if self.head is not None:
            h = self.head(h)  # logits [B, T, V]
        return h

    def init_weights(self, num_layers: int) -> None:
        """nanoGPT/GPT-2 init: N(0, 0.02) everywhere, residual output projections scaled by 1/sqrt(2L)."""
        for name, p in self.named_parameters():
            if p.dim() == 1:
                nn.init.ones_(p) if "norm" in name and name.endswith("weight") else nn.init.zeros_(p)
            elif name.endswith(("attn.o.weight", "mlp.fc2.weight", "mlp.down.weight")):
                nn.init.normal_(p, 0.0, 0.02 / math.sqrt(2 * num_layers))
            else:
                nn.init.normal_(p, 0.0, 0.02)
