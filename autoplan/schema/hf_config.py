"""A Hugging Face ``config.json`` as a ModelSpec, where the config describes a model the runtime builds.

``llama``, ``mistral``, ``qwen2`` and ``qwen3`` configs map onto ``architecture: llama`` (RMSNorm, SwiGLU,
RoPE, GQA; Qwen2 adds biases on q, k and v, Qwen3 a per-head RMSNorm on q and k and a head width of its
own), ``gpt2`` onto ``architecture: gpt`` (LayerNorm, GELU, learned positions, tied embedding). The mapping
keeps every number the runtime's model needs to compute what ``transformers`` computes from the same
weights (tests/runtime/test_hf_families.py compares the logits); what it cannot keep is refused with the
key that breaks it: biases on o or on the MLP, another activation, a RoPE scaling other than Llama 3.1's
(``rope_type: llama3``), sliding-window layers in a Qwen model.

Mixture-of-Experts families map onto ``architecture: llama`` with ``moe`` (schema/moe.py): ``mixtral``
(Mistral's attention, every MLP 8 experts of ``intermediate_size``), ``qwen2_moe`` (Qwen2's attention,
routed experts of ``moe_intermediate_size`` plus one sigmoid-gated shared expert of
``shared_expert_intermediate_size``), ``qwen3_moe`` (Qwen3's attention, routed experts only) and
``deepseek_v3`` (multi-head latent attention, ``mla``; ``first_k_dense_replace`` dense blocks, then routed
experts with sigmoid scores and shared experts; ``num_nextn_predict_layers`` multi-token-prediction
modules, ``mtp_layers``; YaRN RoPE kept on ``mla.rope_scaling``). Qwen's ``mlp_only_layers`` and
``decoder_sparse_step`` must make the dense blocks one leading run (then every step-th block is MoE);
another pattern is refused. DeepSeek's group-limited routing (``n_group``, ``topk_group``; V2 under
``topk_method: group_limited_greedy`` only) is kept as ``moe.router_groups`` / ``moe.router_group_topk``: it
changes which experts a token goes to, not the shapes, but under a node-deduplicating dispatcher it bounds the
nodes a token crosses the network to. The numbers
of experts are read under every name the config classes accept (``num_local_experts``, ``num_experts``,
``n_routed_experts``: ``save_pretrained`` of transformers 5 writes Qwen3-MoE's as ``num_local_experts``).
``deepseek_v2`` maps as V3 does, with softmax routing (greedy or group-limited) and no MTP module.
``gpt_oss`` maps for planning only (``_gpt_oss``): its biases, attention sinks and alternating windows are
in the spec and priced, and the runtime refuses them (``ModelSpec.runtime_refusal``). Other MoE families
are refused by model_type (``_UNMAPPED``).

RoPE settings are read where either generation of ``transformers`` writes them: ``rope_theta`` and
``rope_scaling`` at the top level (4.x, the Hub's configs), or one ``rope_parameters`` object holding
``rope_theta`` and ``rope_type`` (5.x, ``save_pretrained``); as in ``transformers``, the object wins.

The training sequence length is not in a config: it is Mistral's ``sliding_window`` (the span it was
trained with; attention over at most that many tokens is plain causal attention), else
``max_position_embeddings`` (``n_positions`` for GPT-2, which is also the rows of its position table).
``--seq-len`` overrides it as for any spec, up to the window or the table (plan.py ``sequence_refusal``).

Every key the mapping reads is checked once, before anything is derived from it (``_FIELDS``): its JSON
type (an integer is a JSON integer, never ``4.0``, ``"4"`` or ``true``; a number is finite; a flag is
``true`` or ``false``), whether it may be ``null`` (where Hugging Face allows it), and its range. A
mistake is one SpecError line: the file, the key, what is wrong and the fix. llama, mistral and qwen
configs must give their five sizes; GPT-2's config class has a default for every key, so a gpt2 config
may omit any. A key that is absent takes the default of the family's config class in ``transformers``
(``_ABSENT``). Keys the mapping does not read are ignored, as Hugging Face ignores them.

Torch-free (the planner reads configs without transformers or torch).
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from autoplan.errors import SpecError
from autoplan.schema._files import decode_utf8, read_bytes
from autoplan.schema.limits import MAX_HIDDEN_SIZE, MAX_LAYERS, MAX_SEQ_LEN, MAX_VOCAB_SIZE, MAX_YAML_BYTES
from autoplan.schema.model import ModelSpec, RopeScaling
from autoplan.schema.moe import MLASpec, MoESpec, YarnRope

FAMILIES = ("llama", "mistral", "qwen2", "qwen3", "gpt2", "mixtral", "qwen2_moe", "qwen3_moe", "deepseek_v2",
            "deepseek_v3", "gpt_oss")
_ATTENTION = {"mixtral": "mistral", "qwen2_moe": "qwen2", "qwen3_moe": "qwen3"}
"""The dense family whose attention (and sliding-window rule) each MoE family shares."""
_UNMAPPED = {"qwen3_next": "it mixes linear-attention (gated DeltaNet) and gated-attention layers",
             "dbrx": "its attention and experts are fused differently", "jamba": "it mixes Mamba and attention layers",
             "olmoe": "its q/k norms span all heads", "granitemoe": "its experts and scalings differ",
             "phimoe": "its router (sparsemixer) differs", "jetmoe": "it has mixture-of-attention-heads"}
"""MoE families a ModelSpec cannot express yet, and why."""
GPT2_GELUS = {"gelu": "gelu", "gelu_new": "gelu_tanh", "gelu_pytorch_tanh": "gelu_tanh"}
"""Hugging Face's GELU names the runtime computes, and the ModelSpec ``activation`` each is: the exact erf
form, or the tanh approximation GPT-2 uses (``gelu_new``)."""


# ------------------------------------------------------------------------------------------ the keys
@dataclass(frozen=True)
class _Field:
    kind: str
    """"int" (a JSON integer), "float" (a finite JSON number), "bool", "str", "object" or "list" (a JSON
    array; its items are checked where it is read)."""
    what: str
    """What the key means, for the message."""
    example: Any
    """A typical value, for the fix."""
    nullable: bool = False
    low: float | None = None
    high: float | None = None
    low_open: bool = False
    high_open: bool = False


def _count(what: str, example: int, high: int, nullable: bool = False) -> _Field:
    return _Field("int", what, example, nullable, low=1, high=high)


_PROBABILITY = dict(low=0.0, high=1.0, high_open=True)
_EPSILON = dict(low=0.0, high=1.0, low_open=True, high_open=True)

_LLAMA: dict[str, _Field] = {
    "num_hidden_layers": _count("the number of transformer blocks", 32, MAX_LAYERS),
    "hidden_size": _count("the model width", 4096, MAX_HIDDEN_SIZE),
    "intermediate_size": _count("the MLP width", 11008, 4 * MAX_HIDDEN_SIZE),
    "num_attention_heads": _count("the number of query heads", 32, MAX_HIDDEN_SIZE),
    "vocab_size": _count("the number of tokens", 32000, MAX_VOCAB_SIZE),
    "num_key_value_heads": _count("the number of key/value heads; null means one per query head", 8,
                                  MAX_HIDDEN_SIZE, nullable=True),
    "head_dim": _count("the width of one head; null means hidden_size / num_attention_heads", 128,
                       MAX_HIDDEN_SIZE, nullable=True),
    "max_position_embeddings": _count("the longest sequence in tokens", 4096, MAX_SEQ_LEN),
    "sliding_window": _count("the attention window in tokens; null means none", 4096, MAX_SEQ_LEN,
                             nullable=True),
    "rope_theta": _Field("float", "the RoPE base", 10000.0, low=1.0, high=1e12, low_open=True),
    "rms_norm_eps": _Field("float", "the RMSNorm epsilon; 1e-05 or 1e-06 usually", 1e-05, **_EPSILON),
    "attention_dropout": _Field("float", "a dropout probability; 0.0 disables it", 0.0, **_PROBABILITY),
    "tie_word_embeddings": _Field("bool", "whether the output projection shares the embedding", False),
    "attention_bias": _Field("bool", "biases on the attention projections", False),
    "mlp_bias": _Field("bool", "biases on the MLP projections", False),
    "hidden_act": _Field("str", "the MLP activation", "silu"),
    "rope_scaling": _Field("object", "the RoPE scaling rule", {"rope_type": "llama3"}, nullable=True),
    "rope_parameters": _Field("object", "the RoPE base and scaling rule", {"rope_type": "default"}, nullable=True),
    "use_sliding_window": _Field("bool", "sliding-window attention in the upper layers (Qwen)", False),
}
_LLAMA_REQUIRED = ("num_hidden_layers", "hidden_size", "intermediate_size", "num_attention_heads", "vocab_size")

_ABSENT: dict[str, dict[str, Any]] = {
    # what each family's config class in transformers 5 takes for a key the file does not give
    "llama": {"num_key_value_heads": None, "head_dim": None, "max_position_embeddings": 2048, "rms_norm_eps": 1e-6,
              "sliding_window": None},
    "mistral": {"num_key_value_heads": 8, "head_dim": None, "max_position_embeddings": 4096 * 32,
                "rms_norm_eps": 1e-6, "sliding_window": 4096},
    "qwen2": {"num_key_value_heads": 32, "head_dim": None, "max_position_embeddings": 32768, "rms_norm_eps": 1e-6,
              "sliding_window": None},
    "qwen3": {"num_key_value_heads": 32, "head_dim": 128, "max_position_embeddings": 32768, "rms_norm_eps": 1e-6,
              "sliding_window": None},
    "mixtral": {"num_key_value_heads": 8, "head_dim": None, "max_position_embeddings": 4096 * 32, "rms_norm_eps": 1e-5,
                "sliding_window": None, "rope_theta": 1e6, "num_local_experts": 8, "num_experts_per_tok": 2,
                "router_aux_loss_coef": 0.001, "router_jitter_noise": 0.0},
    "qwen2_moe": {"num_key_value_heads": 16, "head_dim": None, "max_position_embeddings": 32768, "rms_norm_eps": 1e-6,
                  "sliding_window": None, "num_experts": 60, "num_experts_per_tok": 4, "moe_intermediate_size": 1408,
                  "shared_expert_intermediate_size": 5632, "norm_topk_prob": False, "router_aux_loss_coef": 0.001,
                  "decoder_sparse_step": 1, "mlp_only_layers": None, "qkv_bias": True},
    "qwen3_moe": {"num_key_value_heads": 4, "head_dim": None, "max_position_embeddings": 32768, "rms_norm_eps": 1e-6,
                  "sliding_window": None, "num_experts": 128, "num_experts_per_tok": 8, "moe_intermediate_size": 768,
                  "norm_topk_prob": False, "router_aux_loss_coef": 0.001, "decoder_sparse_step": 1,
                  "mlp_only_layers": None},
    "deepseek_v2": {"num_key_value_heads": 32, "max_position_embeddings": 2048, "rms_norm_eps": 1e-6,
                    "n_routed_experts": 64, "num_experts_per_tok": None, "moe_intermediate_size": 1407,
                    "n_shared_experts": 2, "first_k_dense_replace": 0, "norm_topk_prob": False,
                    "routed_scaling_factor": 1.0, "aux_loss_alpha": 0.001, "num_nextn_predict_layers": 0,
                    "n_group": None, "topk_group": None, "topk_method": "greedy",
                    "kv_lora_rank": 512, "q_lora_rank": 1536, "qk_rope_head_dim": 64, "qk_nope_head_dim": 128,
                    "v_head_dim": 128},
    "gpt_oss": {"num_key_value_heads": 8, "head_dim": 64, "max_position_embeddings": 131072, "rms_norm_eps": 1e-5,
                "sliding_window": 128, "num_local_experts": 128, "num_experts_per_tok": 4,
                "router_aux_loss_coef": 0.001, "attention_bias": True, "rope_theta": 150000.0},
    "deepseek_v3": {"num_key_value_heads": 128, "max_position_embeddings": 4096, "rms_norm_eps": 1e-6,
                    "n_routed_experts": 256, "num_experts_per_tok": 8, "moe_intermediate_size": 2048,
                    "n_shared_experts": 1, "first_k_dense_replace": 3, "norm_topk_prob": True,
                    "routed_scaling_factor": 2.5, "aux_loss_alpha": 0.0, "num_nextn_predict_layers": 1,
                    "n_group": 8, "topk_group": 4, "topk_method": "noaux_tc",
                    "kv_lora_rank": 512, "q_lora_rank": 1536, "qk_rope_head_dim": 64, "qk_nope_head_dim": 128,
                    "v_head_dim": 128},
}
_REFUSED_FLAGS: dict[str, dict[str, str]] = {
    # keys whose true the runtime's model cannot compute, by family, and why
    "llama": {"attention_bias": "it biases o_proj too, which the runtime's llama has no bias on",
              "mlp_bias": "the runtime's llama has no MLP biases"},
    "mistral": {"attention_bias": "it biases o_proj too, which the runtime's llama has no bias on",
                "mlp_bias": "the runtime's llama has no MLP biases"},
    "qwen2": {"use_sliding_window": "the runtime's attention is full causal in every layer"},
    "qwen3": {"attention_bias": "it biases o_proj too, which the runtime's model has no bias on",
              "use_sliding_window": "the runtime's attention is full causal in every layer"},
    "mixtral": {},
    "qwen2_moe": {"use_sliding_window": "the runtime's attention is full causal in every layer"},
    "qwen3_moe": {"attention_bias": "it biases o_proj too, which the runtime's model has no bias on",
                  "use_sliding_window": "the runtime's attention is full causal in every layer"},
    "deepseek_v3": {"attention_bias": "it biases q_a_proj, kv_a_proj_with_mqa and o_proj, which a ModelSpec's MLA "
                                      "has no bias on"},
    "deepseek_v2": {"attention_bias": "it biases q_a_proj, kv_a_proj_with_mqa and o_proj, which a ModelSpec's MLA "
                                      "has no bias on"},
    "gpt_oss": {"mlp_bias": "its experts' biases are implied, not a flag"},
}
_EXPERTS = {"mixtral": ("num_local_experts", "num_experts"), "qwen2_moe": ("num_experts",),
            "qwen3_moe": ("num_experts", "num_local_experts"), "deepseek_v3": ("n_routed_experts", "num_local_experts"),
            "deepseek_v2": ("n_routed_experts", "num_local_experts"), "gpt_oss": ("num_local_experts", "num_experts")}
"""The keys each family's config class reads the number of routed experts from (the first is its own)."""
_MOE: dict[str, _Field] = {
    "num_local_experts": _count("the number of routed experts", 8, 2**16),
    "num_experts": _count("the number of routed experts", 64, 2**16),
    "n_routed_experts": _count("the number of routed experts", 256, 2**16),
    "num_experts_per_tok": _count("the experts each token is routed to", 8, 2**16),
    "experts_per_token": _count("the experts each token is routed to", 4, 2**16),
    "swiglu_limit": _Field("float", "the clamp of GPT-OSS's SwiGLU", 7.0, low=0.0, high=1e6, low_open=True),
    "swiglu_alpha": _Field("float", "the sigmoid slope of GPT-OSS's SwiGLU", 1.702, low=0.0, high=1e6, low_open=True),
    "layer_types": _Field("list", "each block's attention (sliding_attention or full_attention)",
                          ["sliding_attention", "full_attention"], nullable=True),
    "moe_intermediate_size": _count("the width of one routed expert", 1408, 4 * MAX_HIDDEN_SIZE),
    "shared_expert_intermediate_size": _count("the width of the shared expert", 5632, 4 * MAX_HIDDEN_SIZE),
    "n_shared_experts": _Field("int", "the number of shared experts", 1, low=0, high=2**10),
    "first_k_dense_replace": _Field("int", "the number of leading dense blocks", 3, low=0, high=MAX_LAYERS),
    "decoder_sparse_step": _count("every how many blocks one is MoE", 1, 2**10),
    "mlp_only_layers": _Field("list", "the indices of the dense blocks", [0, 1], nullable=True),
    "norm_topk_prob": _Field("bool", "renormalising the chosen experts' weights", True),
    "routed_scaling_factor": _Field("float", "the routed experts' output scale", 2.5, low=0.0, high=1e3,
                                    low_open=True),
    "router_aux_loss_coef": _Field("float", "the load-balancing loss weight", 0.001, **_PROBABILITY),
    "aux_loss_alpha": _Field("float", "the load-balancing loss weight", 0.001, **_PROBABILITY),
    "router_jitter_noise": _Field("float", "the router's input jitter in training", 0.0, **_PROBABILITY),
    "qkv_bias": _Field("bool", "biases on q, k and v", True),
    "scoring_func": _Field("str", "the router's scoring function", "sigmoid"),
    "topk_method": _Field("str", "the expert choice rule", "noaux_tc"),
    "moe_layer_freq": _count("every how many blocks past the dense ones one is MoE", 1, 2**10),
    "n_group": _count("the expert groups of group-limited routing", 8, 2**16, nullable=True),
    "topk_group": _count("the groups a token's experts come from", 4, 2**16, nullable=True),
}
_MLA: dict[str, _Field] = {
    "kv_lora_rank": _count("the rank of the key/value latent", 512, 2**16),
    "q_lora_rank": _count("the rank of the query latent; null means a full-rank q_proj", 1536, 2**16, nullable=True),
    "qk_rope_head_dim": _count("the RoPE channels of a query/key head", 64, 2**16),
    "qk_nope_head_dim": _count("the channels of a query/key head without RoPE", 128, 2**16),
    "v_head_dim": _count("the channels of a value head", 128, 2**16),
    "rope_interleave": _Field("bool", "the RoPE channel order (shapes do not depend on it)", True),
    "num_nextn_predict_layers": _Field("int", "the multi-token-prediction modules", 1, low=0, high=16),
    "num_mtp_layers": _Field("int", "the multi-token-prediction modules", 1, low=0, high=16),
}
_ROPE_YARN: dict[str, _Field] = {
    "factor": _Field("float", "the context extension factor", 40.0, low=1.0, high=1e6),
    "original_max_position_embeddings": _count("the pretraining context in tokens", 4096, MAX_SEQ_LEN),
    "beta_fast": _Field("float", "YaRN's fast boundary", 32.0, low=0.0, high=1e6, low_open=True, nullable=True),
    "beta_slow": _Field("float", "YaRN's slow boundary", 1.0, low=0.0, high=1e6, low_open=True, nullable=True),
    "mscale": _Field("float", "YaRN's attention scale exponent", 1.0, low=0.0, high=1e3, nullable=True),
    "mscale_all_dim": _Field("float", "YaRN's softmax scale exponent", 1.0, low=0.0, high=1e3, nullable=True),
    "rope_theta": _Field("float", "the RoPE base", 10000.0, low=1.0, high=1e12, low_open=True),
    "partial_rotary_factor": _Field("float", "the share of each head RoPE rotates", 1.0, low=0.0, high=1.0,
                                    low_open=True),
    "truncate": _Field("bool", "whether YaRN rounds its correction range (GPT-OSS: false)", False, nullable=True),
    "attention_factor": _Field("float", "YaRN's attention scale", 1.0, low=0.0, high=1e3, low_open=True,
                               nullable=True),
}
_ROPE_LLAMA3: dict[str, _Field] = {
    "factor": _Field("float", "the divisor of the low frequencies", 8.0, low=1.0, high=1e6),
    "low_freq_factor": _Field("float", "the low-frequency bound", 1.0, low=0.0, high=1e6, low_open=True),
    "high_freq_factor": _Field("float", "the high-frequency bound", 4.0, low=0.0, high=1e6, low_open=True),
    "original_max_position_embeddings": _count("the pretraining context in tokens", 8192, MAX_SEQ_LEN),
    "rope_theta": _Field("float", "the RoPE base", 10000.0, low=1.0, high=1e12, low_open=True),
    "partial_rotary_factor": _Field("float", "the share of each head RoPE rotates", 1.0, low=0.0, high=1.0,
                                    low_open=True),
}

_GPT2: dict[str, _Field] = {
    "n_layer": _count("the number of transformer blocks", 12, MAX_LAYERS),
    "n_embd": _count("the model width", 768, MAX_HIDDEN_SIZE),
    "n_inner": _count("the MLP width; null means 4 * n_embd", 3072, 4 * MAX_HIDDEN_SIZE, nullable=True),
    "n_head": _count("the number of attention heads", 12, MAX_HIDDEN_SIZE),
    "vocab_size": _count("the number of tokens", 50257, MAX_VOCAB_SIZE),
    "n_positions": _count("the longest sequence in tokens", 1024, MAX_SEQ_LEN),
    "resid_pdrop": _Field("float", "a dropout probability; 0.0 disables it", 0.1, **_PROBABILITY),
    "embd_pdrop": _Field("float", "a dropout probability; 0.0 disables it", 0.1, **_PROBABILITY),
    "attn_pdrop": _Field("float", "a dropout probability; 0.0 disables it", 0.1, **_PROBABILITY),
    "layer_norm_epsilon": _Field("float", "the LayerNorm epsilon; 1e-05 usually", 1e-05, **_EPSILON),
    "tie_word_embeddings": _Field("bool", "whether the output projection shares the embedding", True),
    "activation_function": _Field("str", "the MLP activation", "gelu_new"),
    "scale_attn_weights": _Field("bool", "scaling the attention scores by 1 / sqrt(head_dim)", True),
    "scale_attn_by_inverse_layer_idx": _Field("bool", "scaling the scores by 1 / (layer + 1) too", False),
    "add_cross_attention": _Field("bool", "cross-attention layers (encoder-decoder use)", False),
}


# ----------------------------------------------------------------------------------- reading the file
def is_hf_config(path: str | os.PathLike) -> bool:
    """A .json file with a ``model_type`` key. Also, so that ``spec_from_hf_config`` says what is wrong with
    it rather than the model-spec loader: a file named ``config.json`` that is an object without
    ``architecture`` (a ModelSpec's key; Hugging Face's is ``architectures``), and a .json file that is not
    a JSON object at all (empty, not UTF-8, broken JSON, a list, a string) and is named ``config.json`` or
    mentions ``model_type``. Never raises."""
    p = Path(path)
    try:
        if p.suffix != ".json" or not p.is_file():
            return False
        raw = _read(p)
    except (OSError, ValueError):  # SpecError is a ValueError: too large, unreadable; the spec loader says so
        return False
    try:
        data = _parse(p, raw)
    except SpecError:
        data = None
    if isinstance(data, dict):
        return "model_type" in data or (p.name == "config.json" and "architecture" not in data)
    return p.name == "config.json" or b"model_type" in raw


def spec_from_hf_config(path: str | os.PathLike, name: str | None = None) -> ModelSpec:
    p = Path(path)
    data = _parse(p, _read(p))
    if not isinstance(data, dict):
        raise SpecError(f"{p}: the top level is a JSON {_json_type(data)}, not an object; a Hugging Face "
                        "config.json is one {...} object with a model_type key")
    if "model_type" not in data:
        raise SpecError(f"{p}: model_type: missing; a Hugging Face config names its family "
                        f"({', '.join(FAMILIES)} map onto a ModelSpec)")
    kind = data["model_type"]
    if name is None:
        name = (Path(os.path.abspath(p)).parent.name if p.name == "config.json" else p.stem)[:200] or "model"
    if kind in ("llama", "mistral", "qwen2", "qwen3"):
        spec = _llama(p, data, name)
    elif kind in ("mixtral", "qwen2_moe", "qwen3_moe"):
        spec = _llama(p, data, name)
        spec = dataclasses.replace(spec, moe=_moe(p, data, kind, spec.num_layers), head_dim=spec.head_dim)
    elif kind in ("deepseek_v2", "deepseek_v3"):
        spec = _deepseek(p, data, name)
    elif kind == "gpt_oss":
        spec = _gpt_oss(p, data, name)
    elif kind == "gpt2":
        spec = _gpt2(p, data, name)
    elif isinstance(kind, str) and kind in _UNMAPPED:
        raise SpecError(f"{p}: model_type {kind!r} has no ModelSpec mapping yet ({_UNMAPPED[kind]}); "
                        "profile it with autoplan profile and plan the profile")
    else:
        shown = repr(kind) if isinstance(kind, str) and len(kind) <= 60 else _show(kind)
        raise SpecError(f"{p}: model_type {shown} has no ModelSpec mapping ({', '.join(FAMILIES)} have); "
                        "profile it with autoplan profile and plan the profile")
    try:
        spec.validate()
    except SpecError as err:
        raise SpecError(f"{p}: {err}") from None
    return spec


def _read(p: Path) -> bytes:
    """The bytes of a regular file of at most MAX_YAML_BYTES (a config.json is a few KiB)."""
    return read_bytes(p, MAX_YAML_BYTES, "a JSON config file", "a config.json")


def _parse(p: Path, raw: bytes) -> Any:
    text = decode_utf8(raw, str(p))
    if not text.strip():
        raise SpecError(f"{p}: empty file; a Hugging Face config.json is one {{...}} object with a model_type key")
    try:
        return json.loads(text)
    except json.JSONDecodeError as err:
        raise SpecError(f"{p}: not valid JSON (line {err.lineno} column {err.colno}: {err.msg})") from None
    except RecursionError:
        raise SpecError(f"{p}: JSON nested too deeply to be a config (a config.json nests a few levels)") from None
    except ValueError as err:  # an integer of more than sys.get_int_max_str_digits() digits
        raise SpecError(f"{p}: not a config: a number in it is too long "
                        f"({str(err).split(';')[0].strip()})") from None


# ------------------------------------------------------------------------------- checking the values
def _check(p: Path, data: dict[str, Any], family: str, fields: dict[str, _Field],
           required: tuple[str, ...] = ()) -> None:
    """Each key of ``fields`` that ``data`` has is of its type, null only where allowed, and in range."""
    for key in required:
        if key not in data:
            f = fields[key]
            raise SpecError(f"{p}: {key}: missing; a {family} config must give it ({f.what}), e.g. "
                            f"\"{key}\": {_show(f.example)}")
    for key, f in fields.items():
        if key in data:
            _check_value(p, key, data[key], f, key in required)


def _check_value(p: Path, key: str, value: Any, f: _Field, required: bool) -> None:
    where = f"{p}: {key}: {_show(value)}"
    if value is None:
        if f.nullable:
            return
        default = "" if required else " or delete the key (the default applies)"
        raise SpecError(f"{where} is not allowed ({f.what}); write a value such as {_show(f.example)}{default}")
    or_null = " or null" if f.nullable else ""
    if f.kind == "int" and not (isinstance(value, int) and not isinstance(value, bool)):
        raise SpecError(f"{where} is not an integer ({f.what}); write {_int_fix(value, f.example)}{or_null}")
    if f.kind == "float":
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise SpecError(f"{where} is not a number ({f.what}); write {_float_fix(value, f.example)}{or_null}")
        if isinstance(value, float) and not math.isfinite(value):
            raise SpecError(f"{where} is not a finite number ({f.what}); write a number such as "
                            f"{_show(f.example)}{or_null}")
    if f.kind == "bool" and not isinstance(value, bool):
        raise SpecError(f"{where} is not true or false ({f.what}); write {_bool_fix(value)} (JSON, no quotes)")
    if f.kind == "str" and not isinstance(value, str):
        raise SpecError(f"{where} is not a string ({f.what}); write {_show(f.example)}")
    if f.kind == "object" and not isinstance(value, dict):
        raise SpecError(f"{where} is not an object ({f.what}); write {{...}}{or_null}")
    if f.kind == "list" and not isinstance(value, list):
        raise SpecError(f"{where} is not a list ({f.what}); write {_show(f.example)}{or_null}")
    if f.kind in ("int", "float"):
        too_low = f.low is not None and (value <= f.low if f.low_open else value < f.low)
        too_high = f.high is not None and (value >= f.high if f.high_open else value > f.high)
        if too_low or too_high:
            raise SpecError(f"{where} must be {_interval(f)} ({f.what})")


def _interval(f: _Field) -> str:
    if f.kind == "int":
        return f"at least {f.low:,}" if f.high is None else f"from {f.low:,} to {f.high:,}"
    return f"in {'(' if f.low_open else '['}{f.low:g}, {f.high:g}{')' if f.high_open else ']'}"


def _int_fix(value: Any, example: Any) -> str:
    if isinstance(value, float) and math.isfinite(value) and value.is_integer() and abs(value) < 1e18:
        return str(int(value))
    if isinstance(value, str) and 0 < len(value.strip()) <= 20 and value.strip().lstrip("+-").isdigit() \
            and value.strip().isascii():
        return f"{int(value.strip())} without quotes"
    return f"a whole number such as {_show(example)}"


def _float_fix(value: Any, example: Any) -> str:
    if isinstance(value, str) and len(value) <= 40:
        try:
            number = float(value)
        except ValueError:
            pass
        else:
            if math.isfinite(number):
                return f"{value.strip()} without quotes"
    return f"a number such as {_show(example)}"


def _bool_fix(value: Any) -> str:
    if isinstance(value, str) and value.strip().lower() in ("true", "yes", "1", "on"):
        return "true"
    if isinstance(value, str) and value.strip().lower() in ("false", "no", "0", "off"):
        return "false"
    if isinstance(value, int) and value in (0, 1):
        return "true" if value else "false"
    return "true or false"


def _json_type(value: Any) -> str:
    if isinstance(value, bool):
        return "boolean"
    return {dict: "object", list: "array", str: "string", int: "number", float: "number"}.get(type(value), "null")


def _show(value: Any, depth: int = 0) -> str:
    """A JSON value for a message: as JSON writes it, bounded in length and depth, always one line."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return "NaN" if math.isnan(value) else ("Infinity" if value > 0 else "-Infinity") \
            if math.isinf(value) else repr(value)
    if isinstance(value, int):
        text = str(value)
        return text if len(text) <= 24 else f"{text[:12]}... ({len(text.lstrip('-'))} digits)"
    if isinstance(value, str):
        text = json.dumps(value)  # escapes newlines and control characters
        return text if len(text) <= 40 else text[:36] + '..."'
    if isinstance(value, list):
        if depth >= 2:
            return "[...]"
        items = [_show(v, depth + 1) for v in value[:3]] + (["..."] if len(value) > 3 else [])
        text = "[" + ", ".join(items) + "]"
    elif isinstance(value, dict):
        if depth >= 2:
            return "{...}"
        items = [f"{_show(k, depth + 1)}: {_show(v, depth + 1)}" for k, v in list(value.items())[:3]]
        text = "{" + ", ".join(items + (["..."] if len(value) > 3 else [])) + "}"
    else:
        text = type(value).__name__
    return text if len(text) <= 60 else text[:56] + " ..."


def _require(p: Path, data: dict[str, Any], key: str, allowed: Any) -> None:
    value = data.get(key, allowed)
    if value != allowed:
        raise SpecError(f"{p}: {key}: {_show(value)} is not supported by the runtime's model "
                        f"(needs {_show(allowed)})")


def _divides(p: Path, key: str, value: int, other: str, total: int, why: str) -> None:
    if total % value:
        raise SpecError(f"{p}: {key}: {value} does not divide {other}={total} ({why})")


# ------------------------------------------------------------------------------------------ mappings
def _llama(p: Path, data: dict[str, Any], name: str) -> ModelSpec:
    """llama, mistral, qwen2 and qwen3: Hugging Face's LlamaForCausalLM family of decoders; mixtral,
    qwen2_moe and qwen3_moe as the dense family whose attention they share (``_ATTENTION``), without moe."""
    family = data["model_type"]
    attn = _ATTENTION.get(family, family)
    if family == "qwen2_moe" and data.get("sliding_window") == 0 and data.get("use_sliding_window") is not True:
        data = {**data, "sliding_window": None}  # what Qwen2MoeConfig writes for "no window" (its __post_init__)
    _check(p, data, family, _LLAMA, _LLAMA_REQUIRED)
    for key, why in _REFUSED_FLAGS[family].items():
        if data.get(key) is True:
            raise SpecError(f"{p}: {key}: true is not supported ({why}); write false")
    _require(p, data, "hidden_act", "silu")
    absent = _ABSENT[family]
    get = lambda key: data.get(key, absent[key])  # noqa: E731
    heads, h = data["num_attention_heads"], data["hidden_size"]
    if attn == "qwen3" and "head_dim" in data and data["head_dim"] is None:
        raise SpecError(f"{p}: head_dim: null is not allowed (Qwen3Config needs the width of one head); "
                        f"write a value such as 128")
    head_dim = get("head_dim")
    if head_dim is None:
        _divides(p, "num_attention_heads", heads, "hidden_size", h, "each head gets hidden_size / heads channels; "
                 "or give head_dim")
    kv_heads = get("num_key_value_heads") or heads
    shown = "num_key_value_heads" + ("" if "num_key_value_heads" in data else f" (absent: {family}'s default)")
    _divides(p, shown, kv_heads, "num_attention_heads", heads,
             "each key/value head serves an equal group of query heads")
    theta, scaling = _rope(p, data)
    window = get("sliding_window") if attn == "mistral" else None  # Qwen's applies only with use_sliding_window
    seq = (None if attn.startswith("qwen") else data.get("sliding_window")) or get("max_position_embeddings")
    qkv_bias = attn == "qwen2" and (family != "qwen2_moe" or _moe_get(p, data, family, "qkv_bias"))
    return ModelSpec(
        name=name, architecture="llama", num_layers=data["num_hidden_layers"], hidden_size=h,
        ffn_hidden_size=data["intermediate_size"], num_attention_heads=heads, num_kv_heads=kv_heads,
        vocab_size=data["vocab_size"], seq_len=min(seq, window) if window else seq,
        tie_embeddings=bool(data.get("tie_word_embeddings", False)), dropout=float(data.get("attention_dropout", 0.0)),
        rope_theta=theta, norm_eps=float(get("rms_norm_eps")), head_dim=head_dim,
        qkv_bias=qkv_bias, qk_norm=attn == "qwen3", rope_scaling=scaling, sliding_window=window)


def _rope_fields(p: Path, data: dict[str, Any], fields: dict[str, _Field],
                 rotates: str) -> tuple[str, dict[str, Any], float, str]:
    """(key, its object, rope_theta, rope_type) as ``transformers`` 5 reads them
    (``convert_rope_params_to_dict``): the legacy ``rope_scaling`` object if given, else ``rope_parameters``;
    its ``rope_theta`` before the top-level one; its ``rope_type`` (or legacy ``type``), "default" if none.
    Refused for every family: RoPE parameters per layer type, and a partial rotary factor (``rotates`` says
    what the model rotates instead)."""
    key = "rope_scaling" if data.get("rope_scaling") else "rope_parameters"
    params = data.get(key) or {}
    _check(p, {f"{key}.{k}": v for k, v in params.items()}, data["model_type"],
           {f"{key}.{k}": f for k, f in fields.items()})
    if any(isinstance(v, dict) for v in params.values()):
        raise SpecError(f"{p}: {key}: RoPE parameters per layer type are not supported (the model rotates every "
                        "layer alike); give one flat object")
    if params.get("partial_rotary_factor", 1.0) != 1.0:
        raise SpecError(f"{p}: {key}.partial_rotary_factor: {_show(params['partial_rotary_factor'])} is not "
                        f"supported ({rotates}); write 1.0")
    theta = float(params.get("rope_theta",
                             data.get("rope_theta", _ABSENT[data["model_type"]].get("rope_theta", 10000.0))))
    return key, params, theta, params.get("rope_type", params.get("type", "default"))


def _rope(p: Path, data: dict[str, Any]) -> tuple[float, RopeScaling | None]:
    """(rope_theta, the llama3 scaling or None) of a llama-family config (``_rope_fields``)."""
    key, params, theta, rope_type = _rope_fields(p, data, _ROPE_LLAMA3, "the runtime's RoPE rotates the whole head")
    if rope_type == "default":
        return theta, None
    if rope_type != "llama3":
        raise SpecError(f"{p}: {key}.rope_type: {_show(rope_type)} is not supported by the runtime's model "
                        "(it implements Llama 3.1's \"llama3\" scaling or none); write null for plain RoPE")
    for field in ("factor", "low_freq_factor", "high_freq_factor"):
        if field not in params:
            raise SpecError(f"{p}: {key}.{field}: missing; llama3 scaling needs it, e.g. "
                            f"\"{field}\": {_show(_ROPE_LLAMA3[field].example)}")
    if not params["low_freq_factor"] < params["high_freq_factor"]:
        raise SpecError(f"{p}: {key}.low_freq_factor: {_show(params['low_freq_factor'])} must be below "
                        f"high_freq_factor={_show(params['high_freq_factor'])} (1.0 and 4.0 in Llama 3.1)")
    original = params.get("original_max_position_embeddings",
                          data.get("max_position_embeddings", _ABSENT[data["model_type"]]["max_position_embeddings"]))
    return theta, RopeScaling(factor=float(params["factor"]), low_freq_factor=float(params["low_freq_factor"]),
                              high_freq_factor=float(params["high_freq_factor"]),
                              original_max_position_embeddings=original)


def _gpt2(p: Path, data: dict[str, Any], name: str) -> ModelSpec:
    _check(p, data, "gpt2", _GPT2)
    act = data.get("activation_function", "gelu_new")
    if act not in GPT2_GELUS:
        raise SpecError(f"{p}: activation_function: {_show(act)} is not supported by the runtime's model "
                        f"(it computes {', '.join(GPT2_GELUS)})")
    _require(p, data, "scale_attn_weights", True)
    _require(p, data, "scale_attn_by_inverse_layer_idx", False)
    _require(p, data, "add_cross_attention", False)
    h, heads = data.get("n_embd", 768), data.get("n_head", 12)
    _divides(p, "n_head", heads, "n_embd", h, "each head gets n_embd / n_head channels")
    dropout = max(float(data.get(k, 0.1)) for k in ("resid_pdrop", "embd_pdrop", "attn_pdrop"))
    positions = data.get("n_positions", 1024)
    return ModelSpec(
        name=name, architecture="gpt", num_layers=data.get("n_layer", 12), hidden_size=h,
        ffn_hidden_size=data.get("n_inner") or 4 * h, num_attention_heads=heads,
        num_kv_heads=heads, vocab_size=data.get("vocab_size", 50257),
        seq_len=positions, tie_embeddings=bool(data.get("tie_word_embeddings", True)),
        dropout=dropout, norm_eps=float(data.get("layer_norm_epsilon", 1e-5)), max_positions=positions,
        activation=None if GPT2_GELUS[act] == "gelu" else GPT2_GELUS[act])


# ------------------------------------------------------------------------------- Mixture of Experts
def _moe_get(p: Path, data: dict[str, Any], family: str, key: str) -> Any:
    """``key`` of an MoE family's config, checked (``_MOE``, ``_MLA``), or its config class's default."""
    fields = _MOE if key in _MOE else _MLA
    if key in data:
        _check_value(p, key, data[key], fields[key], False)
        return data[key]
    return _ABSENT[family][key]


def _experts(p: Path, data: dict[str, Any], family: str) -> int:
    """The number of routed experts, under whichever of the class's names the file uses (one value)."""
    given = [k for k in _EXPERTS[family] if k in data]
    for key in given:
        _check_value(p, key, data[key], _MOE[key], False)
    if len(given) > 1 and data[given[0]] != data[given[1]]:
        raise SpecError(f"{p}: {given[1]}: {_show(data[given[1]])} differs from {given[0]}="
                        f"{_show(data[given[0]])} (both name the number of routed experts); keep one")
    return data[given[0]] if given else _ABSENT[family][_EXPERTS[family][0]]


def _top_k(p: Path, data: dict[str, Any], family: str) -> int:
    """The experts each token goes to: ``num_experts_per_tok`` (GPT-OSS's hub files also say
    ``experts_per_token``: one value), required where the config class has no default (DeepSeek-V2)."""
    given = [k for k in ("num_experts_per_tok", "experts_per_token") if k in data]
    for key in given:
        _check_value(p, key, data[key], _MOE[key], False)
    if len(given) == 2 and data[given[0]] != data[given[1]]:
        raise SpecError(f"{p}: experts_per_token: {_show(data['experts_per_token'])} differs from "
                        f"num_experts_per_tok={_show(data['num_experts_per_tok'])} (both name top-k); keep one")
    top_k = data[given[0]] if given else _ABSENT[family]["num_experts_per_tok"]
    if top_k is None:
        raise SpecError(f"{p}: num_experts_per_tok: missing ({family}'s config class has no default); give the "
                        "experts each token is routed to, e.g. \"num_experts_per_tok\": 6")
    return top_k


def _leading_dense(p: Path, data: dict[str, Any], family: str, num_layers: int) -> tuple[int, int]:
    """(first_dense_layers, layer_frequency) giving exactly the MoE blocks of Qwen's rule (block i is MoE
    when i is not in mlp_only_layers and (i + 1) % decoder_sparse_step == 0), or a one-line refusal."""
    step = _moe_get(p, data, family, "decoder_sparse_step")
    dense = _moe_get(p, data, family, "mlp_only_layers") or []
    for i, item in enumerate(dense):
        if isinstance(item, bool) or not isinstance(item, int) or item < 0:
            raise SpecError(f"{p}: mlp_only_layers[{i}]: {_show(item)} is not a block index (a whole number from 0)")
    dense = set(dense)
    moe_blocks = [i for i in range(num_layers) if i not in dense and (i + 1) % step == 0]
    if not moe_blocks:
        key = "mlp_only_layers" if dense else "decoder_sparse_step"
        raise SpecError(f"{p}: {key}: {_show(data.get(key))} leaves no MoE block in {num_layers} layers; "
                        "map a dense model with its dense model_type")
    first = moe_blocks[0] - step + 1
    spec = MoESpec(1, 1, 1, first_dense_layers=first, layer_frequency=step)
    if [i for i in range(num_layers) if spec.is_moe_layer(i)] != moe_blocks:
        key = "mlp_only_layers" if dense else "decoder_sparse_step"
        raise SpecError(f"{p}: {key}: {_show(data.get(key))} makes dense blocks other than one leading run "
                        f"(then every {step}-th block MoE), which a ModelSpec cannot express; write the leading "
                        "dense blocks as mlp_only_layers [0, 1, ..., k - 1]")
    return first, step


def _moe(p: Path, data: dict[str, Any], family: str, num_layers: int) -> MoESpec:
    """The routed feed-forward layers of a mixtral, qwen2_moe, qwen3_moe or deepseek_v3 config."""
    get = lambda key: _moe_get(p, data, family, key)  # noqa: E731
    experts, top_k = _experts(p, data, family), _top_k(p, data, family)
    if top_k > experts:
        raise SpecError(f"{p}: num_experts_per_tok: {top_k} is more than the {experts} routed experts")
    if family == "mixtral":
        if get("router_jitter_noise") != 0:
            raise SpecError(f"{p}: router_jitter_noise: {_show(data['router_jitter_noise'])} is not supported (a "
                            "ModelSpec's router has no input jitter); write 0.0")
        return MoESpec(experts, top_k, data["intermediate_size"], normalize_top_k=True,
                       aux_loss_coefficient=float(get("router_aux_loss_coef")))
    if family == "gpt_oss":  # top-k of the router logits, softmax over those k: softmax, top-k, renormalised
        return MoESpec(experts, top_k, data["intermediate_size"], normalize_top_k=True, router_bias=True,
                       expert_bias=True, aux_loss_coefficient=float(get("router_aux_loss_coef")))
    if family in _DEEPSEEK_ROUTING:
        for key, allowed in (*_DEEPSEEK_ROUTING[family].items(), ("moe_layer_freq", (1,))):
            if key in data:
                _check_value(p, key, data[key], _MOE[key], False)
                if data[key] not in allowed:
                    raise SpecError(f"{p}: {key}: {_show(data[key])} is not {family}'s (it has "
                                    f"{' or '.join(map(_show, allowed))}); write {_show(allowed[0])}")
        groups, group_topk = _router_groups(p, data, family, experts, top_k)
        first = get("first_k_dense_replace")
        if first >= num_layers:
            raise SpecError(f"{p}: first_k_dense_replace: {first} leaves no MoE block in {num_layers} layers")
        return MoESpec(experts, top_k, get("moe_intermediate_size"), num_shared_experts=get("n_shared_experts"),
                       first_dense_layers=first, router="sigmoid" if family == "deepseek_v3" else "softmax",
                       normalize_top_k=get("norm_topk_prob"),
                       routed_scaling_factor=float(get("routed_scaling_factor")),
                       aux_loss_coefficient=float(get("aux_loss_alpha")), router_groups=groups,
                       router_group_topk=group_topk)
    first, step = _leading_dense(p, data, family, num_layers)
    shared = dict(num_shared_experts=1, shared_expert_ffn_size=get("shared_expert_intermediate_size"),
                  shared_expert_gate=True) if family == "qwen2_moe" else {}
    return MoESpec(experts, top_k, get("moe_intermediate_size"), first_dense_layers=first, layer_frequency=step,
                   normalize_top_k=get("norm_topk_prob"), aux_loss_coefficient=float(get("router_aux_loss_coef")),
                   **shared)


def _router_groups(p: Path, data: dict[str, Any], family: str, experts: int, top_k: int) -> tuple[int, int]:
    """(router_groups, router_group_topk) of a DeepSeek config: V3's ``noaux_tc`` always draws a token's experts
    from its ``topk_group`` best of ``n_group`` groups, V2 only under ``topk_method: group_limited_greedy``
    (greedy ignores the groups); (1, 1) where the groups restrict nothing. They matter to the cost: under a
    node-deduplicating dispatcher a token reaches at most topk_group nodes when a group is one node's experts."""
    groups, group_topk = (_moe_get(p, data, family, key) for key in ("n_group", "topk_group"))
    if data.get("topk_method", _ABSENT[family]["topk_method"]) == "greedy" or groups is None:
        return 1, 1
    if experts % groups:
        raise SpecError(f"{p}: n_group: {groups} does not divide the {experts} routed experts into equal groups")
    if group_topk is None or group_topk > groups:
        raise SpecError(f"{p}: topk_group: {_show(group_topk)} must be a number of groups from 1 to n_group={groups}")
    if group_topk * experts // groups < top_k:
        raise SpecError(f"{p}: topk_group: {group_topk} of {groups} groups open {group_topk * experts // groups} "
                        f"experts, fewer than num_experts_per_tok={top_k}")
    return (1, 1) if group_topk == groups else (groups, group_topk)


_DEEPSEEK_ROUTING: dict[str, dict[str, tuple[Any, ...]]] = {
    "deepseek_v2": {"scoring_func": ("softmax",), "topk_method": ("greedy", "group_limited_greedy")},
    "deepseek_v3": {"scoring_func": ("sigmoid",), "topk_method": ("noaux_tc",)},
}
"""The routing each DeepSeek family's modelling code computes (the first value is its config class's
default). Group-limited choice is read by ``_router_groups``."""


def _deepseek(p: Path, data: dict[str, Any], name: str) -> ModelSpec:
    """DeepSeek-V2 and V3: multi-head latent attention, leading dense blocks, routed (V2: softmax, V3:
    sigmoid scores) and shared experts; V3's multi-token-prediction modules. ``head_dim`` and ``qk_head_dim``
    in the file are derived by the config class (qk_rope_head_dim and qk_nope + qk_rope) and not read."""
    family = data["model_type"]
    _check(p, data, family, {k: f for k, f in _LLAMA.items() if k not in ("head_dim", "sliding_window")},
           _LLAMA_REQUIRED)
    if data.get("attention_bias") is True:
        raise SpecError(f"{p}: attention_bias: true is not supported ({_REFUSED_FLAGS[family]['attention_bias']}); "
                        "write false")
    _require(p, data, "hidden_act", "silu")
    get = lambda key: _moe_get(p, data, family, key) if key in _MOE or key in _MLA else \
        data.get(key, _ABSENT[family][key])  # noqa: E731
    heads = data["num_attention_heads"]
    kv_heads = get("num_key_value_heads") or heads
    if kv_heads != heads:
        shown = "num_key_value_heads" + ("" if "num_key_value_heads" in data else f" (absent: {family}'s default)")
        raise SpecError(f"{p}: {shown}: {kv_heads} is not num_attention_heads={heads}; multi-head latent attention "
                        "gives every head its own key and value: write null or the number of heads")
    for key in ("rope_interleave", "num_mtp_layers"):
        if key in data:
            _check_value(p, key, data[key], _MLA[key], False)
    if "num_mtp_layers" in data and "num_nextn_predict_layers" in data \
            and data["num_mtp_layers"] != data["num_nextn_predict_layers"]:
        raise SpecError(f"{p}: num_mtp_layers: {_show(data['num_mtp_layers'])} differs from num_nextn_predict_layers="
                        f"{_show(data['num_nextn_predict_layers'])} (both name the MTP modules); keep one")
    mtp = data["num_mtp_layers"] if "num_mtp_layers" in data and "num_nextn_predict_layers" not in data \
        else get("num_nextn_predict_layers")
    theta, yarn = _rope_mla(p, data)
    mla = MLASpec(kv_lora_rank=get("kv_lora_rank"), qk_nope_head_dim=get("qk_nope_head_dim"),
                  qk_rope_head_dim=get("qk_rope_head_dim"), v_head_dim=get("v_head_dim"),
                  q_lora_rank=get("q_lora_rank"), rope_scaling=yarn)
    layers = data["num_hidden_layers"]
    return ModelSpec(
        name=name, architecture="llama", num_layers=layers, hidden_size=data["hidden_size"],
        ffn_hidden_size=data["intermediate_size"], num_attention_heads=heads, num_kv_heads=heads,
        vocab_size=data["vocab_size"], seq_len=get("max_position_embeddings"),
        tie_embeddings=bool(data.get("tie_word_embeddings", False)), dropout=float(data.get("attention_dropout", 0.0)),
        rope_theta=theta, norm_eps=float(get("rms_norm_eps")), moe=_moe(p, data, family, layers), mla=mla,
        mtp_layers=mtp)


def _rope_mla(p: Path, data: dict[str, Any]) -> tuple[float, YarnRope | None]:
    """(rope_theta, YaRN or None) of a deepseek_v2 or deepseek_v3 config (``_rope_fields``)."""
    key, params, theta, rope_type = _rope_fields(p, data, _ROPE_YARN, "MLA rotates all qk_rope_head_dim channels")
    if rope_type == "default":
        return theta, None
    if rope_type != "yarn":
        raise SpecError(f"{p}: {key}.rope_type: {_show(rope_type)} is not supported for multi-head latent attention "
                        "(a ModelSpec holds DeepSeek-V3's \"yarn\" or none); write null for plain RoPE")
    for extra in ("attention_factor", "truncate"):
        if params.get(extra) is not None:
            raise SpecError(f"{p}: {key}.{extra}: {_show(params[extra])} is not supported (a ModelSpec's YaRN "
                            "derives it as DeepSeek-V3 does); delete the key")
    if "factor" not in params:
        raise SpecError(f"{p}: {key}.factor: missing; yarn scaling needs it, e.g. \"factor\": 40.0")
    original = params.get("original_max_position_embeddings") or data.get(
        "max_position_embeddings", _ABSENT[data["model_type"]]["max_position_embeddings"])
    mscales = {k: None if params.get(k) is None else float(params[k]) for k in ("mscale", "mscale_all_dim")}
    return theta, YarnRope(factor=float(params["factor"]), original_max_position_embeddings=original,
                           beta_fast=float(params.get("beta_fast") or 32.0),
                           beta_slow=float(params.get("beta_slow") or 1.0), **mscales)


def _gpt_oss(p: Path, data: dict[str, Any], name: str) -> ModelSpec:
    """GPT-OSS (OpenAI 2025): GQA with biases on q, k, v and o and a learned sink logit per head, windowed
    and full-attention blocks alternating (``layer_types``), every block an MoE of ``intermediate_size``-wide
    experts with biases, routed by a biased router (top-k logits, softmax over them). For planning: the
    runtime's models compute none of the biases, sinks or windows (``ModelSpec.runtime_refusal``). Its
    clamped SwiGLU (``swiglu_limit``, ``swiglu_alpha``) costs what SwiGLU costs and is held as ``silu``; its
    YaRN RoPE (shapes and cost do not depend on it) is read, not kept. The training length is YaRN's
    ``original_max_position_embeddings`` (the pretraining context), else ``max_position_embeddings``."""
    family = "gpt_oss"
    fields = {**_LLAMA, **{k: _MOE[k] for k in ("layer_types", "swiglu_limit", "swiglu_alpha")}}
    _check(p, data, family, fields, _LLAMA_REQUIRED)
    if data.get("mlp_bias") is True:
        raise SpecError(f"{p}: mlp_bias: true is not supported ({_REFUSED_FLAGS[family]['mlp_bias']}); write false")
    _require(p, data, "hidden_act", "silu")
    get = lambda key: data.get(key, _ABSENT[family][key])  # noqa: E731
    heads, layers = data["num_attention_heads"], data["num_hidden_layers"]
    kv_heads = get("num_key_value_heads") or heads
    _divides(p, "num_key_value_heads", kv_heads, "num_attention_heads", heads,
             "each key/value head serves an equal group of query heads")
    key, params, theta, rope_type = _rope_fields(p, data, _ROPE_YARN, "the model rotates the whole head")
    if rope_type not in ("default", "yarn"):
        raise SpecError(f"{p}: {key}.rope_type: {_show(rope_type)} is not GPT-OSS's (yarn); write \"yarn\"")
    window = get("sliding_window")
    bias = get("attention_bias")
    return ModelSpec(
        name=name, architecture="llama", num_layers=layers, hidden_size=data["hidden_size"],
        ffn_hidden_size=data["intermediate_size"], num_attention_heads=heads, num_kv_heads=kv_heads,
        vocab_size=data["vocab_size"],
        seq_len=params.get("original_max_position_embeddings") or get("max_position_embeddings"),
        tie_embeddings=bool(data.get("tie_word_embeddings", False)), dropout=float(data.get("attention_dropout", 0.0)),
        rope_theta=theta, norm_eps=float(get("rms_norm_eps")), head_dim=get("head_dim") or data["hidden_size"] // heads,
        qkv_bias=bias, o_bias=bias, attention_sinks=True, sliding_window=window,
        full_attention_interval=_full_attention_interval(p, data, layers) if window else None,
        moe=_moe(p, data, family, layers))


def _full_attention_interval(p: Path, data: dict[str, Any], layers: int) -> int:
    """The n with block i full-attention exactly when i % n == n - 1, from ``layer_types`` (GptOssConfig's
    default when absent: windowed blocks first, alternating), or a one-line refusal of another pattern."""
    kinds = data.get("layer_types") or ["sliding_attention" if (i + 1) % 2 else "full_attention" for i in range(layers)]
    if len(kinds) != layers or any(k not in ("sliding_attention", "full_attention") for k in kinds):
        raise SpecError(f"{p}: layer_types: {_show(kinds)} is not one of sliding_attention or full_attention per "
                        f"block ({layers} blocks)")
    full = [i for i, k in enumerate(kinds) if k == "full_attention"]
    interval = full[0] + 1 if full else 0
    if interval < 2 or full != list(range(interval - 1, layers, interval)):
        raise SpecError(f"{p}: layer_types: {_show(kinds)} is not windowed blocks with every n-th one full "
                        "attention (n >= 2), which a ModelSpec expresses; write that pattern")
    return interval
