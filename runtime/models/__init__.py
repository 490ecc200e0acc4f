"""Reference models built from a ``ModelSpec``: ``build_model(spec, device=...)``.

Both models share one skeleton (the attribute names the runtime's parallel transforms and the profiler
rely on):

* ``model.embed``  -- token embedding (``embed.tok``; GPT also has learned positions ``embed.pos``):
  tokens [B, T] (int64) -> hidden [B, T, H]
* ``model.blocks`` -- ``nn.ModuleDict`` keyed by the *global* layer index as a string ("0", "1", ...), so
  a pipeline stage that keeps only some blocks keeps the full model's parameter names. Each block has
  ``attn_norm``, ``attn`` (``q``, ``k``, ``v``, ``o`` Linears and a ``core`` attention module),
  ``mlp_norm`` and ``mlp`` (GPT: ``fc1``, ``fc2``; Llama: ``gate``, ``up``, ``down``).
* ``model.norm``   -- final norm, ``model.head`` -- output projection hidden [B, T, H] -> logits [B, T, V].

A pipeline stage sets ``embed`` (all but the first stage) and ``norm``/``head`` (all but the last) to
None; ``forward`` skips what is None, so a stage's forward maps its input to its output.
With ``tie_embeddings`` the head shares ``embed.tok.weight`` (``head.weight is embed.tok.weight``).
"""

from __future__ import annotations

import torch
from torch import nn

from autoplan.schema import ModelSpec
from runtime.models.gpt import GPT
from runtime.models.llama import Llama


def build_model(spec: ModelSpec, device: str | torch.device = "cpu", seq_len: int | None = None) -> nn.Module:
    """The reference model for ``spec`` with fp32 parameters on ``device``.

    Initialisation draws from torch's global RNG: seed it (``torch.manual_seed``) before calling so that
    every rank builds identical weights. ``seq_len`` (default ``spec.seq_len``) sizes GPT's learned
    position table and Llama's rotary cache.
    """
    cls = {"gpt": GPT, "llama": Llama}[spec.architecture]
    with torch.device(device):
        return cls(spec, seq_len or spec.seq_len)


__all__ = ["GPT", "Llama", "build_model"]
