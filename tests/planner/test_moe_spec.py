"""MoE and MLA shapes (autoplan/schema/moe.py) count the parameters their publishers state.

Whole-model totals are assembled here from the config.json values each model ships with (attention, two
norms per block, embedding and head): the totals test the MoE layer counts (router, routed and shared
experts, leading dense layers) and the MLA count, which make up 97-99% of these models.
"""

from __future__ import annotations

import pytest

from autoplan.errors import SpecError
from autoplan.schema._io import from_dict
from autoplan.schema.moe import MLASpec, MoESpec


def gqa(h: int, heads: int, kv: int, head_dim: int, qkv_bias: bool = False, o_bias: bool = False,
        qk_norm: bool = False, sinks: bool = False) -> int:
    params = h * heads * head_dim + 2 * h * kv * head_dim + heads * head_dim * h
    params += (heads * head_dim + 2 * kv * head_dim) * qkv_bias + h * o_bias
    return params + 2 * head_dim * qk_norm + heads * sinks


def model_params(h: int, layers: int, vocab: int, attention: int, moe: MoESpec, dense_ffn: int = 0) -> tuple[int, int]:
    """(total, active per token) of an untied model: embedding, blocks, final norm, head."""
    n_moe = moe.num_moe_layers(layers)
    dense = attention + 3 * h * dense_ffn + 2 * h
    outside = 2 * vocab * h + h
    total = (layers - n_moe) * dense + n_moe * (attention + moe.layer_mlp_params(h) + 2 * h) + outside
    active = (layers - n_moe) * dense + n_moe * (attention + moe.active_mlp_params(h) + 2 * h) + outside
    return total, active


DEEPSEEK_V3_MLA = MLASpec(kv_lora_rank=512, qk_nope_head_dim=128, qk_rope_head_dim=64, v_head_dim=128, q_lora_rank=1536)

# (name, total, active, stated total, stated active, tolerance): stated figures from each model card
CASES = [
    ("mixtral-8x7b", *model_params(4096, 32, 32000, gqa(4096, 32, 8, 128), MoESpec(8, 2, 14336)),
     46_702_792_704, 12.9e9, 0.005),
    ("qwen3-30b-a3b", *model_params(2048, 48, 151936, gqa(2048, 32, 4, 128, qk_norm=True), MoESpec(128, 8, 768)),
     30.5e9, 3.3e9, 0.02),
    ("qwen3-235b-a22b", *model_params(4096, 94, 151936, gqa(4096, 64, 4, 128, qk_norm=True), MoESpec(128, 8, 1536)),
     235e9, 22e9, 0.02),
    ("deepseek-v3", *model_params(7168, 61, 129280, DEEPSEEK_V3_MLA.params(7168, 128),
                                  MoESpec(256, 8, 2048, num_shared_experts=1, first_dense_layers=3, router="sigmoid",
                                          routed_scaling_factor=2.5), dense_ffn=18432),
     671e9, 37e9, 0.02),
    ("qwen2-57b-a14b", *model_params(3584, 28, 151936, gqa(3584, 28, 4, 128, qkv_bias=True),
                                     MoESpec(64, 8, 2560, num_shared_experts=1, shared_expert_ffn_size=20480,
                                             shared_expert_gate=True)),
     57.4e9, 14e9, 0.02),
    # GPT-OSS states active parameters without the input embedding (201,088 x 2,880 = 0.58e9), as counted here
    ("gpt-oss-120b", *model_params(2880, 36, 201088, gqa(2880, 64, 8, 64, qkv_bias=True, o_bias=True, sinks=True),
                                   MoESpec(128, 4, 2880, router_bias=True, expert_bias=True)),
     116.83e9, 5.13e9 + 201088 * 2880, 0.005),
    ("gpt-oss-20b", *model_params(2880, 24, 201088, gqa(2880, 64, 8, 64, qkv_bias=True, o_bias=True, sinks=True),
                                  MoESpec(32, 4, 2880, router_bias=True, expert_bias=True)),
     20.91e9, 3.61e9 + 201088 * 2880, 0.005),
]


@pytest.mark.parametrize(("name", "total", "active", "stated_total", "stated_active", "tolerance"), CASES,
                         ids=[c[0] for c in CASES])
def test_counts_match_the_published_totals(name, total, active, stated_total, stated_active, tolerance):
    assert abs(total - stated_total) <= tolerance * stated_total, f"{name}: {total:,} vs {stated_total:,.0f}"
    assert abs(active - stated_active) <= 2 * tolerance * stated_active, f"{name}: {active:,} vs {stated_active:,.0f}"


def test_mixtral_is_exact():
    """transformers' MixtralForCausalLM(config of Mixtral-8x7B-v0.1).num_parameters() is 46,702,792,704."""
    assert CASES[0][1] == 46_702_792_704


def test_deepseek_v3_layers():
    moe = MoESpec(256, 8, 2048, num_shared_experts=1, first_dense_layers=3, router="sigmoid")
    assert [moe.is_moe_layer(i) for i in range(5)] == [False, False, False, True, True]
    assert moe.num_moe_layers(61) == 58
    # MLA: q down 7168x1536 + norm + up 1536x(128x192); kv down 7168x576 + norm + up 512x(128x256); o 16384x7168
    assert DEEPSEEK_V3_MLA.params(7168, 128) == 187_107_328


def test_layer_frequency_every_other_block():
    moe = MoESpec(8, 2, 64, layer_frequency=2)
    assert [moe.is_moe_layer(i) for i in range(6)] == [False, True, False, True, False, True]


@pytest.mark.parametrize(("data", "message"), [
    ({"num_experts": 8, "experts_per_token": 9, "expert_ffn_size": 64}, "experts_per_token"),
    ({"num_experts": 8, "experts_per_token": 2, "expert_ffn_size": 64, "router": "relu"}, "router"),
    ({"num_experts": 8, "experts_per_token": 2, "expert_ffn_size": 64, "capacity_factor": 0.0}, "capacity_factor"),
    ({"num_experts": 8, "experts_per_token": 2, "expert_ffn_size": 64, "shared_expert_ffn_size": 128},
     "shared_expert_ffn_size: needs num_shared_experts"),
])
def test_bad_values_name_the_field(data, message):
    with pytest.raises(SpecError, match=message):
        from_dict(MoESpec, data)


@pytest.mark.parametrize(("data", "message"), [
    ({"kv_lora_rank": 512, "qk_nope_head_dim": 128, "qk_rope_head_dim": 64, "v_head_dim": 128,
      "rope_scaling": {"factor": 0.5, "original_max_position_embeddings": 4096}}, "rope_scaling.factor"),
    ({"kv_lora_rank": 512, "qk_nope_head_dim": 128, "qk_rope_head_dim": 64, "v_head_dim": 128,
      "rope_scaling": {"factor": 40.0, "original_max_position_embeddings": 4096, "beta_slow": 64.0}},
     "rope_scaling.beta_slow"),
    ({"kv_lora_rank": 0, "qk_nope_head_dim": 128, "qk_rope_head_dim": 64, "v_head_dim": 128}, "kv_lora_rank"),
])
def test_bad_mla_values_name_the_field(data, message):
    with pytest.raises(SpecError, match=message):
        from_dict(MLASpec, data)
