"""The ``config.json`` written beside exported weights: the keys ``transformers`` needs to build the same
model the runtime trained (``AutoModelForCausalLM.from_pretrained``). Torch-free.

RoPE is written the way both generations of ``transformers`` read it: ``rope_theta`` and
``rope_scaling`` at the top level (4.x writes these; 5.x converts them into its ``rope_parameters``).
The family (``names.family``) is the one whose model computes exactly the runtime's: qwen3 for per-head
q/k norms, qwen2 for q/k/v biases, mistral for a sliding window, llama otherwise, gpt2 for gpt; for an MoE
model mixtral (Mistral's attention, every block MoE) or qwen3_moe (Qwen3's attention; leading dense
blocks as ``mlp_only_layers``), written with the keys autoplan/schema/hf_config.py reads back to the same
``moe`` (its ``router_aux_loss_coef`` is the spec's ``aux_loss_coefficient``, as that mapping reads it).
"""

from __future__ import annotations

from typing import Any

from autoplan.errors import SpecError
from autoplan.schema import ModelSpec
from runtime.hf.names import family

ARCHITECTURES = {"llama": "LlamaForCausalLM", "mistral": "MistralForCausalLM", "qwen2": "Qwen2ForCausalLM",
                 "qwen3": "Qwen3ForCausalLM", "gpt2": "GPT2LMHeadModel", "mixtral": "MixtralForCausalLM",
                 "qwen3_moe": "Qwen3MoeForCausalLM"}
GPT2_ACTIVATIONS = {"gelu": "gelu", "gelu_tanh": "gelu_new"}
"""ModelSpec activation -> GPT-2's ``activation_function`` (``gelu_new`` is the tanh approximation)."""


def hf_config(spec: ModelSpec, positions: int | None = None) -> dict[str, Any]:
    """``config.json`` for ``spec``. ``positions``: the rows of gpt's exported position table (GPT-2's
    ``n_positions``); llama's ``max_position_embeddings`` is the spec's sequence length."""
    kind = family(spec)
    common = {"architectures": [ARCHITECTURES[kind]], "model_type": kind, "vocab_size": spec.vocab_size,
              "tie_word_embeddings": bool(spec.tie_embeddings), "torch_dtype": "float32"}
    if kind == "gpt2":
        return common | {
            "n_layer": spec.num_layers, "n_embd": spec.hidden_size, "n_head": spec.num_attention_heads,
            "n_inner": spec.ffn_hidden_size, "n_positions": positions or spec.position_rows(),
            "activation_function": GPT2_ACTIVATIONS[spec.mlp_activation], "layer_norm_epsilon": spec.norm_eps,
            "resid_pdrop": spec.dropout, "embd_pdrop": spec.dropout, "attn_pdrop": spec.dropout,
            "scale_attn_weights": True, "scale_attn_by_inverse_layer_idx": False, "reorder_and_upcast_attn": False}
    if spec.qk_norm and spec.qkv_bias:
        raise SpecError("export: a model with both q/k norms and q/k/v biases has no transformers family "
                        "(Qwen3's attention_bias also biases o_proj)")
    out = common | {
        "hidden_size": spec.hidden_size, "intermediate_size": spec.ffn_hidden_size,
        "num_hidden_layers": spec.num_layers, "num_attention_heads": spec.num_attention_heads,
        "num_key_value_heads": spec.num_kv_heads, "head_dim": spec.head_dim, "hidden_act": "silu",
        "max_position_embeddings": spec.seq_len, "rms_norm_eps": spec.norm_eps, "rope_theta": spec.rope_theta,
        "attention_dropout": spec.dropout}
    if spec.rope_scaling is not None:
        r = spec.rope_scaling
        out["rope_scaling"] = {"rope_type": r.rope_type, "factor": r.factor, "low_freq_factor": r.low_freq_factor,
                               "high_freq_factor": r.high_freq_factor,
                               "original_max_position_embeddings": r.original_max_position_embeddings}
    if kind in ("llama", "mistral", "qwen3", "qwen3_moe"):
        out["attention_bias"] = False  # qwen2 biases q, k, v always (and o never)
    if kind in ("llama", "mistral"):
        out["mlp_bias"] = False
    if kind in ("mistral", "mixtral"):
        out["sliding_window"] = spec.sliding_window
    if kind in ("qwen2", "qwen3", "qwen3_moe"):
        out |= {"use_sliding_window": False, "sliding_window": None}
    return out | _moe_keys(spec, kind)


def _moe_keys(spec: ModelSpec, kind: str) -> dict[str, Any]:
    """The routed experts of an MoE family's config (names.moe_family chose a family that has them)."""
    if spec.moe is None:
        return {}
    moe = spec.moe
    common = {"num_experts_per_tok": moe.experts_per_token, "router_aux_loss_coef": moe.aux_loss_coefficient,
              "output_router_logits": False}
    if kind == "mixtral":  # the experts are intermediate_size wide; every block is MoE
        return common | {"num_local_experts": moe.num_experts, "intermediate_size": moe.expert_ffn_size,
                         "router_jitter_noise": 0.0}
    # qwen3_moe: block i is MoE when i is not in mlp_only_layers and (i + 1) % decoder_sparse_step == 0
    # (names.moe_family: first_dense_layers is a multiple of the step, so the leading run is those blocks)
    dense = [i for i in range(moe.first_dense_layers) if (i + 1) % moe.layer_frequency == 0]
    return common | {"num_experts": moe.num_experts, "moe_intermediate_size": moe.expert_ffn_size,
                     "norm_topk_prob": moe.normalize_top_k, "decoder_sparse_step": moe.layer_frequency,
                     "mlp_only_layers": dense}
