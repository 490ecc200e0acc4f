"""Pieces shared by the reference models: the attention core (the part selective recomputation drops)
and the skeleton forward that skips the parts a pipeline stage does not hold."""

from __future__ import annotations

from collections.abc import Callable, Iterable

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

from runtime.models.dropout import DropoutSite, attention_with_dropout


class AttentionCore(DropoutSite):
    """softmax(q k^T / sqrt(d) + causal mask) v, with dropout on the probabilities.

    ``recompute = True`` is selective recomputation (Korthikanti et al. 2022): this core keeps only q, k, v
    for backward and recomputes scores/softmax/dropout. ``ring`` replaces the local kernel by attention
    over sequence shards (context parallelism sets ring attention there: runtime/parallel/
    context_parallel.py). Both are set by the runtime, not the model, which knows no process groups.
    """

    def __init__(self, dropout: float) -> None:
        super().__init__()
        self.dropout = dropout
        self.recompute = False
        self.head_shard = (0, 1)
        """(tp_rank, tp): this rank holds heads [tp_rank * h/tp, (tp_rank + 1) * h/tp)."""
        self.ring: Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor] | None = None
        """Context parallelism: (q, k, v) -> output, where q, k, v hold this rank's sequence shard."""

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        # q: [B, h, T, d]; k, v: [B, kv, T, d] with h % kv == 0 (GQA when kv < h)
        if self.recompute and torch.is_grad_enabled():
            return checkpoint(self._attend, q, k, v, use_reentrant=False)
        return self._attend(q, k, v)

    def _attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        if self.ring is not None:  # plans with cp > 1 have dropout 0 (autoplan/schema/plan.py)
            return self.ring(q, k, v)
        p = self.dropout if self.training else 0.0
        if p > 0 and self.state is not None and not q.is_meta:
            return attention_with_dropout(self, q, k, v)
        gqa = k.shape[1] != q.shape[1]
        return F.scaled_dot_product_attention(q, k, v, dropout_p=p, is_causal=True, enable_gqa=gqa)


class Skeleton(nn.Module):
    """embed -> blocks -> norm -> head, skipping whichever is None (pipeline stages).

    Vocabulary padding (Megatron's ``--make-vocab-size-divisible-by``, the plan's ``padded_vocab_size``):
    the embedding and head have ``vocab_rows >= vocab_size`` rows so that TP splits them evenly. The
    padded rows are never looked up (token ids < vocab_size), start at zero (init.py), and their logits
    are set to -inf here, so softmax gives them probability 0 and gradient 0: loss, gradients and the
    real rows' values are the unpadded serial model's, at any padding.
    """

    embed: nn.Module | None
    blocks: nn.ModuleDict
    norm: nn.Module | None
    head: nn.Module | None
    vocab_size: int
    vocab_rows: int

    def set_vocab(self, spec, vocab_rows: int | None) -> int:
        rows = spec.vocab_size if vocab_rows is None else vocab_rows
        if rows < spec.vocab_size:
            raise ValueError(f"vocab_rows {rows} < vocab_size {spec.vocab_size}")
        self.vocab_size, self.vocab_rows = spec.vocab_size, rows
        return rows

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # first stage: x = tokens [B, T]; later stages: x = hidden [B, T, H]
        h = self.embed(x) if self.embed is not None else x
        for block in self.blocks.values():
            h = block(h)
        if self.norm is not None:
            h = self.norm(h)
        if self.head is not None:
            h = self.head(h)  # logits [B, T, V]
            if self.vocab_rows > self.vocab_size:
                h = mask_padded_logits(h, self.vocab_size)
        return h


def mask_padded_logits(logits: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """Logits [B, T, V_padded] with the padded columns (index >= vocab_size) at -inf. Vocab-sharded
    logits (a DTensor under ``loss_parallel``) get a mask with the same placements, so each rank masks
    its own columns without communication."""
    from torch.distributed.tensor import DTensor, Replicate, Shard, distribute_tensor

    padded = torch.arange(logits.shape[-1], device=logits.device) >= vocab_size  # [V_padded], broadcast
    if isinstance(logits, DTensor):  # the [V] mask sharded like the logits' last dim, replicated elsewhere
        last = logits.ndim - 1
        placements = [Shard(0) if isinstance(p, Shard) and p.dim % logits.ndim == last else Replicate()
                      for p in logits.placements]
        padded = distribute_tensor(padded, logits.device_mesh, placements, src_data_rank=None)
    return logits.masked_fill(padded, float("-inf"))


def stage_layers(num_layers: int, layers: Iterable[int] | None) -> list[int]:
    """The global indices of the blocks a (stage) model holds: all of them by default."""
    return list(range(num_layers)) if layers is None else list(layers)
