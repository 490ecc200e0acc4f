"""Dropout whose masks do not depend on the parallel layout, so a plan with dropout trains like serial.

A mask entry is drawn from a generator seeded by (seed, step, dropout site, global row of the sequence in
the step's global batch[, global attention head]) -- never from a rank's running RNG. Every layout
therefore draws the same bits for the same element: TP ranks holding the same (replicated) activations
draw the same mask; under sequence parallel each rank draws its rows' full [T, H] mask and keeps its
sequence shard; the attention core seeds per (row, global head), so each TP rank gets the masks of its
own heads; pipeline stages, data-parallel replicas, micro-batching and recomputation only change which
rows a call sees, not their masks. Exact under every layout (the serial run uses the same scheme).

Why not DTensor's RNG tracker: it offsets CUDA's Philox counters for DTensor random ops only (our
dropouts run on local tensors, SDPA's dropout inside the kernel) and is not offered on CPU/gloo.
Cost: one small generator per row (and per row and head in attention, where SDPA runs once per (row,
head) so that its own kernel -- flash on GPUs, which saves only its RNG state -- still draws the mask).
With dropout 0 (most LLM plans) or in eval, none of this runs.

``DropoutState`` is the one mutable piece: the step and the global row of the current micro-batch's
first sequence. The runtime builds one per rank and passes it to the model (``attach``); the trainer
and the pipeline stages set it before each forward and backward (recomputation reruns forwards then).
A model without a state (the profiler's meta models) uses torch's dropout.
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

MASK_64 = (1 << 64) - 1


@dataclass
class DropoutState:
    """Where the current micro-batch sits: what makes a mask a function of the element, not the rank."""

    seed: int
    step: int = 0
    first_row: int = 0
    """Global batch row of the micro-batch's first sequence (dp offset + micro-batch offset)."""


def _splitmix64(x: int) -> int:
    x = (x + 0x9E3779B97F4A7C15) & MASK_64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & MASK_64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & MASK_64
    return x ^ (x >> 31)


def mix(*values: int) -> int:
    """One 63-bit generator seed from a few non-negative integers (SplitMix64 chained)."""
    h = 0
    for v in values:
        h = _splitmix64(h ^ (v & MASK_64))
    return h >> 1


def site_id(name: str) -> int:
    """Stable id of a dropout site from its full-model name (``blocks.3.attn.drop``)."""
    return zlib.crc32(name.encode())


class DropoutSite(nn.Module):
    """A module that draws dropout masks: ``site`` (its id, from its name) and ``state`` (the rank's
    ``DropoutState``, None in a model without one) are what its masks are seeded by. ``assign_sites`` and
    ``attach`` find every site of a model by this class."""

    def __init__(self) -> None:
        super().__init__()
        self.site = 0
        self.state: DropoutState | None = None


class LayoutFreeDropout(DropoutSite):
    """Dropout on hidden states x [B, T_local, H]; ``seq_shard = (index, count)`` under sequence parallel."""

    def __init__(self, p: float) -> None:
        super().__init__()
        self.p = p
        self.seq_shard = (0, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.training or self.p == 0:
            return x
        if self.state is None or x.is_meta:
            return F.dropout(x, self.p, True)
        b, t, h = x.shape
        index, count = self.seq_shard
        s = self.state
        rows = []
        for r in range(b):  # the full [T, H] mask of each global row, then this rank's sequence shard
            gen = torch.Generator(device=x.device).manual_seed(mix(s.seed, s.step, self.site, s.first_row + r))
            rows.append(torch.rand((t * count, h), generator=gen, device=x.device)[index * t:(index + 1) * t])
        drop = torch.stack(rows) < self.p  # bool: the 1-byte mask torch's dropout saves too
        return x.masked_fill(drop, 0.0) * (1.0 / (1.0 - self.p))


def attention_with_dropout(core, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """SDPA with dropout once per (row, head), the global RNG seeded by (seed, step, site, row, head).

    q [B, h_local, T, d], k/v [B, kv_local, T, d]; ``core.head_shard = (tp_rank, tp)`` gives the global
    head index. fork_rng leaves the rank's own RNG stream as it was.
    """
    s, (index, _count) = core.state, core.head_shard
    b, heads = q.shape[0], q.shape[1]
    group = heads // k.shape[1]
    devices = [q.device] if q.device.type == "cuda" else []
    out_rows = []
    with torch.random.fork_rng(devices=devices, device_type=q.device.type):
        for r in range(b):
            out_heads = []
            for j in range(heads):
                seed = mix(s.seed, s.step, core.site, s.first_row + r, index * heads + j)
                torch.manual_seed(seed) if q.device.type == "cpu" else torch.cuda.manual_seed(seed)
                kv = slice(j // group, j // group + 1)
                out_heads.append(F.scaled_dot_product_attention(
                    q[r:r + 1, j:j + 1], k[r:r + 1, kv], v[r:r + 1, kv], dropout_p=core.dropout, is_causal=True))
            out_rows.append(torch.cat(out_heads, dim=1))
    return torch.cat(out_rows, dim=0)


def assign_sites(model: nn.Module) -> None:
    """Give every dropout site its id from its name; call on a freshly built (full or stage) model."""
    for name, module in model.named_modules():
        if isinstance(module, DropoutSite):
            module.site = site_id(name)


def attach(model: nn.Module, state: DropoutState) -> None:
    """Let every dropout site of ``model`` read ``state`` (one state per rank, shared by its stages)."""
    for module in model.modules():
        if isinstance(module, DropoutSite):
            module.state = state
