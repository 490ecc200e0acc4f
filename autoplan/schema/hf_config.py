"""A Hugging Face ``config.json`` as a ModelSpec, where the config describes a model the runtime builds.

``llama`` and ``mistral`` configs map onto ``architecture: llama`` (RMSNorm, SwiGLU, RoPE, GQA), ``gpt2``
onto ``architecture: gpt`` (LayerNorm, GELU, learned positions, tied embedding). The mapping keeps every
number the cost model and the runtime read; what it cannot keep is refused with the key that breaks it
(biases on the attention or MLP projections, another activation). Two differences do not change the cost
and are accepted: RoPE scaling (``rope_scaling``, Llama 3.1) and GPT-2's tanh-approximated GELU.

The training sequence length is not in a config: it is Mistral's ``sliding_window`` (the span it was
trained with; attention over at most that many tokens is plain causal attention), else
``max_position_embeddings`` (``n_positions`` for GPT-2). ``--seq-len`` overrides it as for any spec.

Torch-free (the planner reads configs without transformers or torch).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from autoplan.errors import SpecError
from autoplan.schema.model import ModelSpec


def is_hf_config(path: str | os.PathLike) -> bool:
    """A .json file with a ``model_type`` key."""
    p = Path(path)
    if p.suffix != ".json" or not p.is_file():
        return False
    try:
        return "model_type" in json.loads(p.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError, TypeError):
        return False


def spec_from_hf_config(path: str | os.PathLike, name: str | None = None) -> ModelSpec:
    p = Path(path)
    try:
        data = json.loads(p.read_text())
    except (OSError, json.JSONDecodeError) as err:
        raise SpecError(f"{p}: not a readable JSON config ({err})") from None
    kind = data.get("model_type")
    name = name or (p.parent.name if p.name == "config.json" else p.stem)
    if kind in ("llama", "mistral"):
        spec = _llama(data, name)
    elif kind == "gpt2":
        spec = _gpt2(data, name)
    else:
        raise SpecError(f"{p}: model_type {kind!r} has no ModelSpec mapping (llama, mistral and gpt2 have); "
                        "profile it with autoplan profile and plan the profile")
    try:
        spec.validate()
    except SpecError as err:
        raise SpecError(f"{p}: {err}") from None
    return spec


def _require(data: dict[str, Any], key: str, allowed: Any) -> None:
    value = data.get(key, allowed)
    if value != allowed:
        raise SpecError(f"{key}: {value!r} is not supported by the runtime's model (needs {allowed!r})")


def _llama(data: dict[str, Any], name: str) -> ModelSpec:
    _require(data, "attention_bias", False)
    _require(data, "mlp_bias", False)
    _require(data, "hidden_act", "silu")
    heads = data["num_attention_heads"]
    if data.get("head_dim") not in (None, data["hidden_size"] // heads):
        raise SpecError(f"head_dim: {data['head_dim']} differs from hidden_size / num_attention_heads, "
                        "which the runtime's model assumes")
    seq = data.get("sliding_window") or data.get("max_position_embeddings", 2048)
    return ModelSpec(
        name=name, architecture="llama", num_layers=data["num_hidden_layers"], hidden_size=data["hidden_size"],
        ffn_hidden_size=data["intermediate_size"], num_attention_heads=heads,
        num_kv_heads=data.get("num_key_value_heads") or heads, vocab_size=data["vocab_size"], seq_len=seq,
        tie_embeddings=bool(data.get("tie_word_embeddings", False)), dropout=float(data.get("attention_dropout", 0.0)),
        rope_theta=float(data.get("rope_theta", 10000.0)), norm_eps=float(data.get("rms_norm_eps", 1e-5)))


def _gpt2(data: dict[str, Any], name: str) -> ModelSpec:
    h = data.get("n_embd", 768)
    dropout = max(float(data.get(k, 0.1)) for k in ("resid_pdrop", "embd_pdrop", "attn_pdrop"))
    return ModelSpec(
        name=name, architecture="gpt", num_layers=data.get("n_layer", 12), hidden_size=h,
        ffn_hidden_size=data.get("n_inner") or 4 * h, num_attention_heads=data.get("n_head", 12),
        num_kv_heads=data.get("n_head", 12), vocab_size=data.get("vocab_size", 50257),
        seq_len=data.get("n_positions", 1024), tie_embeddings=bool(data.get("tie_word_embeddings", True)),
        dropout=dropout, norm_eps=float(data.get("layer_norm_epsilon", 1e-5)))
