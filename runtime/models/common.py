"""Pieces shared by the reference models: the attention core (the part selective recomputation drops)
and the skeleton forward that skips the parts a pipeline stage does not hold."""

from __future__ import annotations

from collections.abc import Iterable

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

from runtime.models.dropout import DropoutState, attention_with_dropout


class AttentionCore(nn.Module):
    """softmax(q k^T / sqrt(d) + causal mask) v, with dropout on the probabilities.

    ``recompute = True`` is selective recomputation (Korthikanti et al. 2022): this core keeps only q, k, v
    for backward and recomputes scores/softmax/dropout. ``ring_group`` (a CP group) makes it ring attention
    over sequence shards (runtime/parallel/context_parallel.py). Both are set by the runtime, not the model.
    """

    def __init__(self, dropout: float) -> None:
        super().__init__()
        self.dropout = dropout
        self.recompute = False
        self.site = 0  # dropout bookkeeping (runtime/models/dropout.py)
        self.state: DropoutState | None = None
        self.head_shard = (0, 1)
        """(tp_rank, tp): this rank holds heads [tp_rank * h/tp, (tp_rank + 1) * h/tp)."""
        self.ring_group = None
        """Context parallelism: the CP group's ProcessGroup; q, k, v then hold this rank's sequence shard."""

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        # q: [B, h, T, d]; k, v: [B, kv, T, d] with h % kv == 0 (GQA when kv < h)
        if self.recompute and torch.is_grad_enabled():
            return checkpoint(self._attend, q, k, v, use_reentrant=False)
        return self._attend(q, k, v)

    def _attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        if self.ring_group is not None:  # plans with cp > 1 have dropout 0 (autoplan/schema/plan.py)
            from runtime.parallel.context_parallel import ring_attention
            return ring_attention(q, k, v, self.ring_group)
        p = self.dropout if self.training else 0.0
        if p > 0 and self.state is not None and not q.is_meta:
            return attention_with_dropout(self, q, k, v)
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


def stage_layers(num_layers: int, layers: Iterable[int] | None) -> list[int]:
    """The global indices of the blocks a (stage) model holds: all of them by default."""
    return list(range(num_layers)) if layers is None else list(layers)
