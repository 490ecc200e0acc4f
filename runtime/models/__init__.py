"""Reference models built from a ``ModelSpec``: ``build_model(spec, device=...)``.

Both models share one skeleton (the attribute names the runtime's parallel transforms and the profiler
rely on):

* ``model.embed``  -- token embedding (``embed.tok``; GPT also has learned positions ``embed.pos``):
  tokens [B, T] (int64) -> hidden [B, T, H]
* ``model.blocks`` -- ``nn.ModuleDict`` keyed by the *global* layer index as a string ("0", "1", ...), so
  a pipeline stage that keeps only some blocks keeps the full model's parameter names. Each block has
  ``attn_norm``, ``attn`` (``q``, ``k``, ``v``, ``o`` Linears and a ``core`` attention module; Llama with
  ``qk_norm`` also ``q_norm`` and ``k_norm``, RMSNorms over one head), ``mlp_norm`` and ``mlp`` (GPT:
  ``fc1``, ``fc2``; Llama: ``gate``, ``up``, ``down``; a Llama MoE block, ``spec.is_moe_block(i)``: the
  Mixture-of-Experts layer of runtime/models/moe.py -- ``router``, ``experts`` (3-D ``gate``, ``up``,
  ``down``), ``shared`` -- and ``mlp_drop``). Hugging Face checkpoints map onto the dense names.
* ``model.norm``   -- final norm, ``model.head`` -- output projection hidden [B, T, H] -> logits [B, T, V].

A pipeline stage sets ``embed`` (all but the first stage) and ``norm``/``head`` (all but the last) to
None; ``forward`` skips what is None, so a stage's forward maps its input to its output.
With ``tie_embeddings`` the head shares ``embed.tok.weight`` (``head.weight is embed.tok.weight``); a last
stage on another pipeline rank keeps its own copy, initialised from the embedding's name.

Initial values come from ``runtime.models.init`` (a generator per parameter name), so they do not depend
on the layout; dropout masks from ``runtime.models.dropout`` (seeded per element position), ditto.
"""

from __future__ import annotations

import torch
from torch import nn

from autoplan.errors import SpecError
from autoplan.schema import ModelSpec
from runtime.models.gpt import GPT
from runtime.models.init import init_parameters
from runtime.models.llama import Llama


def build_model(spec: ModelSpec, device: str | torch.device = "cpu", seq_len: int | None = None,
                seed: int = 0) -> nn.Module:
    """The whole reference model for ``spec`` with fp32 parameters on ``device``, initialised from
    ``seed`` (on ``meta``: shapes only). ``seq_len`` (default ``spec.seq_len``) sizes Llama's rotary cache
    and, unless ``spec.max_positions`` does, GPT's learned position table."""
    model = build_stage_model(spec, seq_len or spec.seq_len, None, True, True, device)
    if torch.device(device).type != "meta":
        init_parameters(model, spec, seed)
    return model


def check_buildable(spec: ModelSpec) -> None:
    """Refuse, in one line, what a spec describes and the reference models do not build
    (``ModelSpec.runtime_refusal``: multi-head latent attention, multi-token prediction, a squared-ReLU MLP,
    GPT-OSS's biases, sinks and alternating windows, MoE options the MoE layer does not compute), and MoE
    layers in a GPT model. MoE layers in a Llama model are built."""
    unbuilt = spec.runtime_refusal()
    if unbuilt:
        raise SpecError(f"{spec.name}: the model has {unbuilt}, which the runtime's reference models do not build "
                        "yet; plan it only (autoplan export --to megatron), or remove it")
    if spec.moe is not None and spec.architecture != "llama":
        raise SpecError(f"{spec.name}: moe: MoE blocks are built for architecture llama only, not "
                        f"{spec.architecture}; use architecture: llama")


def build_stage_model(spec: ModelSpec, seq_len: int, layers, first: bool, last: bool,
                      device: str | torch.device = "meta", vocab_rows: int | None = None) -> nn.Module:
    """One pipeline stage (blocks ``layers``; the embedding if ``first``; norm and head if ``last``),
    uninitialised: on ``meta`` by default, so a rank of a 70B plan allocates nothing before sharding.
    ``vocab_rows``: the padded vocabulary (a plan's ``padded_vocab_size``); default unpadded."""
    check_buildable(spec)
    cls = {"gpt": GPT, "llama": Llama}[spec.architecture]
    with torch.device(device):
        return cls(spec, seq_len, layers, first, last, vocab_rows)


__all__ = ["GPT", "Llama", "build_model", "build_stage_model", "check_buildable"]
