"""Mixture-of-Experts and MLA models as model specs (issue 31, the description part): the shipped MoE specs
count the published totals, the Hugging Face MoE families' config.json files map onto them (and count what
``transformers`` builds from the same config), they round-trip through YAML, what a spec cannot express is
refused in one line naming the key, and ``plan`` / ``estimate`` refuse an MoE spec in one line until the cost
model prices MoE layers.

Counting conventions (ModelSpec.total_params / active_params): a tied embedding once; DeepSeek-V3's
``e_score_correction_bias`` is a buffer in transformers 5 (as in runtime/models/moe.py) and counted by
neither side; DeepSeek-V3's multi-token-prediction module is counted by ``total_params`` without second
copies of the embedding and head it shares (transformers' DeepseekV3ForCausalLM does not build the module:
the meta-model comparison is with ``mtp_layers=0``), the Hub's 685B counts those copies too.
"""

from __future__ import annotations

import dataclasses
import json

import pytest

from autoplan.cli.main import main
from autoplan.errors import SpecError
from autoplan.schema import load_model
from autoplan.schema._io import dump_yaml, from_dict, to_dict
from autoplan.schema.hf_config import spec_from_hf_config
from autoplan.schema.model import ModelSpec
from autoplan.schema.moe import MoESpec
from tests.planner.test_moe_spec import CASES

MOE_MODELS = ("mixtral-8x7b", "qwen3-30b-a3b", "qwen3-235b-a22b", "deepseek-v3", "moe-tiny")
PUBLISHED = {c[0]: c[1:] for c in CASES}
"""name -> (total, active, stated total, stated active, tolerance), assembled independently in test_moe_spec."""

# ------------------------------------------------------------------ published config.json files (the Hub's)
MIXTRAL_8X7B = {  # mistralai/Mixtral-8x7B-v0.1
    "architectures": ["MixtralForCausalLM"], "attention_dropout": 0.0, "bos_token_id": 1, "eos_token_id": 2,
    "hidden_act": "silu", "hidden_size": 4096, "initializer_range": 0.02, "intermediate_size": 14336,
    "max_position_embeddings": 32768, "model_type": "mixtral", "num_attention_heads": 32, "num_experts_per_tok": 2,
    "num_hidden_layers": 32, "num_key_value_heads": 8, "num_local_experts": 8, "output_router_logits": False,
    "rms_norm_eps": 1e-05, "rope_theta": 1000000.0, "router_aux_loss_coef": 0.02, "sliding_window": None,
    "tie_word_embeddings": False, "torch_dtype": "bfloat16", "transformers_version": "4.36.0.dev0",
    "use_cache": True, "vocab_size": 32000}
QWEN3_30B_A3B = {  # Qwen/Qwen3-30B-A3B
    "architectures": ["Qwen3MoeForCausalLM"], "attention_bias": False, "attention_dropout": 0.0,
    "bos_token_id": 151643, "decoder_sparse_step": 1, "eos_token_id": 151645, "head_dim": 128, "hidden_act": "silu",
    "hidden_size": 2048, "initializer_range": 0.02, "intermediate_size": 6144, "max_position_embeddings": 40960,
    "max_window_layers": 48, "mlp_only_layers": [], "model_type": "qwen3_moe", "moe_intermediate_size": 768,
    "norm_topk_prob": True, "num_attention_heads": 32, "num_experts": 128, "num_experts_per_tok": 8,
    "num_hidden_layers": 48, "num_key_value_heads": 4, "output_router_logits": False, "rms_norm_eps": 1e-06,
    "rope_scaling": None, "rope_theta": 1000000.0, "router_aux_loss_coef": 0.001, "sliding_window": None,
    "tie_word_embeddings": False, "torch_dtype": "bfloat16", "transformers_version": "4.51.0", "use_cache": True,
    "use_sliding_window": False, "vocab_size": 151936}
QWEN3_235B_A22B = dict(QWEN3_30B_A3B, hidden_size=4096, intermediate_size=12288, max_window_layers=94,
                       moe_intermediate_size=1536, num_attention_heads=64, num_hidden_layers=94)  # Qwen/Qwen3-235B-A22B
QWEN2_57B_A14B = {  # Qwen/Qwen2-57B-A14B
    "architectures": ["Qwen2MoeForCausalLM"], "attention_dropout": 0.0, "bos_token_id": 151643,
    "decoder_sparse_step": 1, "eos_token_id": 151643, "hidden_act": "silu", "hidden_size": 3584,
    "initializer_range": 0.02, "intermediate_size": 18944, "max_position_embeddings": 131072,
    "max_window_layers": 28, "model_type": "qwen2_moe", "moe_intermediate_size": 2560, "norm_topk_prob": False,
    "num_attention_heads": 28, "num_experts": 64, "num_experts_per_tok": 8, "num_hidden_layers": 28,
    "num_key_value_heads": 4, "output_router_logits": False, "rms_norm_eps": 1e-06, "rope_theta": 1000000.0,
    "router_aux_loss_coef": 0.001, "shared_expert_intermediate_size": 20480, "sliding_window": 65536,
    "tie_word_embeddings": False, "torch_dtype": "bfloat16", "transformers_version": "4.40.1", "use_cache": True,
    "use_sliding_window": False, "vocab_size": 151936}
DEEPSEEK_V3 = {  # deepseek-ai/DeepSeek-V3 (auto_map left out)
    "architectures": ["DeepseekV3ForCausalLM"], "attention_bias": False, "attention_dropout": 0.0,
    "aux_loss_alpha": 0.001, "bos_token_id": 0, "eos_token_id": 1, "ep_size": 1, "first_k_dense_replace": 3,
    "hidden_act": "silu", "hidden_size": 7168, "initializer_range": 0.02, "intermediate_size": 18432,
    "kv_lora_rank": 512, "max_position_embeddings": 163840, "model_type": "deepseek_v3",
    "moe_intermediate_size": 2048, "moe_layer_freq": 1, "n_group": 8, "n_routed_experts": 256, "n_shared_experts": 1,
    "norm_topk_prob": True, "num_attention_heads": 128, "num_experts_per_tok": 8, "num_hidden_layers": 61,
    "num_key_value_heads": 128, "num_nextn_predict_layers": 1, "q_lora_rank": 1536, "qk_nope_head_dim": 128,
    "qk_rope_head_dim": 64, "quantization_config": {"activation_scheme": "dynamic", "fmt": "e4m3",
                                                    "quant_method": "fp8", "weight_block_size": [128, 128]},
    "rms_norm_eps": 1e-06, "rope_scaling": {"beta_fast": 32, "beta_slow": 1, "factor": 40, "mscale": 1.0,
                                            "mscale_all_dim": 1.0, "original_max_position_embeddings": 4096,
                                            "type": "yarn"},
    "rope_theta": 10000, "routed_scaling_factor": 2.5, "scoring_func": "sigmoid", "seq_aux": True,
    "tie_word_embeddings": False, "topk_group": 4, "topk_method": "noaux_tc", "torch_dtype": "bfloat16",
    "transformers_version": "4.33.1", "use_cache": True, "v_head_dim": 128, "vocab_size": 129280}
CONFIGS = {"mixtral-8x7b": MIXTRAL_8X7B, "qwen3-30b-a3b": QWEN3_30B_A3B, "qwen3-235b-a22b": QWEN3_235B_A22B,
           "deepseek-v3": DEEPSEEK_V3}


GPT_OSS_120B = {  # openai/gpt-oss-120b's config.json on the Hub (the keys that shape it)
    "model_type": "gpt_oss", "num_hidden_layers": 36, "num_local_experts": 128, "vocab_size": 201088,
    "hidden_size": 2880, "intermediate_size": 2880, "swiglu_limit": 7.0, "head_dim": 64, "num_attention_heads": 64,
    "num_key_value_heads": 8, "sliding_window": 128, "initial_context_length": 4096, "rope_theta": 150000,
    "rope_scaling": {"beta_fast": 32.0, "beta_slow": 1.0, "factor": 32.0, "original_max_position_embeddings": 4096,
                     "rope_type": "yarn", "truncate": False},
    "experts_per_token": 4, "num_experts_per_tok": 4, "router_aux_loss_coef": 0.9, "hidden_act": "silu",
    "rms_norm_eps": 1e-05, "tie_word_embeddings": False, "attention_bias": True,
    "layer_types": ["sliding_attention", "full_attention"] * 18}
DEEPSEEK_V2 = {  # deepseek-ai/DeepSeek-V2's config.json on the Hub (the keys that shape it)
    "model_type": "deepseek_v2", "hidden_size": 5120, "intermediate_size": 12288, "moe_intermediate_size": 1536,
    "num_hidden_layers": 60, "num_attention_heads": 128, "num_key_value_heads": 128, "n_routed_experts": 160,
    "n_shared_experts": 2, "num_experts_per_tok": 6, "first_k_dense_replace": 1, "moe_layer_freq": 1,
    "kv_lora_rank": 512, "q_lora_rank": 1536, "qk_rope_head_dim": 64, "qk_nope_head_dim": 128, "v_head_dim": 128,
    "vocab_size": 102400, "routed_scaling_factor": 16.0, "topk_method": "group_limited_greedy", "n_group": 8,
    "topk_group": 3, "scoring_func": "softmax", "norm_topk_prob": False, "aux_loss_alpha": 0.003,
    "max_position_embeddings": 163840, "rms_norm_eps": 1e-06, "tie_word_embeddings": False,
    "rope_scaling": {"beta_fast": 32, "beta_slow": 1, "factor": 40, "mscale": 0.707, "mscale_all_dim": 0.707,
                     "original_max_position_embeddings": 4096, "type": "yarn"}}


def write(tmp_path, data: dict, name: str = "config.json") -> str:
    path = tmp_path / name
    path.write_text(json.dumps(data))
    return str(path)


def without_mtp(spec: ModelSpec) -> ModelSpec:
    return dataclasses.replace(spec, mtp_layers=0)


# ---------------------------------------------------------------------------------- the shipped specs
@pytest.mark.parametrize("name", MOE_MODELS[:4])
def test_shipped_specs_count_the_published_totals(name):
    """The spec's formulas give what test_moe_spec assembles by hand, within the model cards' rounding."""
    spec = without_mtp(load_model(name))
    total, active, stated_total, stated_active, tolerance = PUBLISHED[name]
    assert (spec.total_params(), spec.active_params()) == (total, active)
    assert abs(spec.total_params() - stated_total) <= tolerance * stated_total
    assert abs(spec.active_params() - stated_active) <= 2 * tolerance * stated_active


def test_mixtral_total_is_exact():
    assert load_model("mixtral-8x7b").total_params() == 46_702_792_704


def test_deepseek_v3_with_its_mtp_module():
    """671B without the MTP module; total_params counts the module (a MoE block, eh_proj, three norms) but not
    its copies of the embedding and head, which the Hub's 685B adds (DeepSeek: 671B + 14B of MTP module)."""
    spec = load_model("deepseek-v3")
    h, v = spec.hidden_size, spec.vocab_size
    assert spec.mtp_layers == 1 and spec.is_moe_block(spec.num_layers)
    assert spec.mtp_params() == spec.block_params(3) + 2 * h * h + 3 * h
    assert spec.total_params() == without_mtp(spec).total_params() + spec.mtp_params()
    assert spec.total_params() + 2 * v * h == pytest.approx(685e9, rel=0.005)
    assert 11e9 < spec.mtp_params() < 12e9


def test_moe_tiny_is_small_and_byte_level():
    spec = load_model("moe-tiny")
    assert spec.vocab_size == 256 and spec.seq_len == 64 and spec.num_layers == 4
    assert [spec.is_moe_block(i) for i in range(4)] == [False, True, True, True]
    assert spec.total_params() == spec.embedding_params() + spec.block_params(0) + 3 * spec.block_params(1) \
        + spec.head_params()
    assert spec.active_params() < spec.total_params() < 300_000


@pytest.mark.parametrize("name", MOE_MODELS)
def test_yaml_round_trip(tmp_path, name):
    spec = load_model(name)
    path = tmp_path / f"{name}.yaml"
    path.write_text(dump_yaml(spec))
    assert load_model(str(path)) == spec
    data = to_dict(spec)
    assert "moe" in data and ("mla" in data) == (spec.mla is not None)
    assert ("mtp_layers" in data) == (spec.mtp_layers > 0)


def test_layer_params_refuses_an_moe_spec():
    """The cost model multiplies layer_params by a stage's layers: an MoE spec has two kinds of block."""
    spec = load_model("moe-tiny")
    with pytest.raises(SpecError, match="layer_params: the model has MoE blocks and dense ones") as err:
        spec.layer_params()
    assert "\n" not in str(err.value)
    dense = dataclasses.replace(spec, moe=None)
    assert dense.layer_params() == dense.block_params(1) and dense.unpriced() is None
    assert spec.unpriced() is None
    sparse_step = dataclasses.replace(spec, moe=dataclasses.replace(spec.moe, layer_frequency=2))
    assert "moe.layer_frequency 2" in sparse_step.unpriced()


@pytest.mark.parametrize(("change", "message"), [
    (dict(architecture="gpt", num_kv_heads=8), "moe: is a llama feature"),
    (dict(moe=MoESpec(8, 2, 32, first_dense_layers=4)), "moe.first_dense_layers: 4 .*leaves no MoE block"),
    (dict(moe=MoESpec(8, 9, 32)), "moe.experts_per_token"),
    (dict(mtp_layers=-1), "mtp_layers"),
])
def test_bad_moe_specs_name_the_field(change, message):
    data = {**to_dict(load_model("moe-tiny")), **to_dict(change)}
    with pytest.raises(SpecError, match=message):
        from_dict(ModelSpec, data)


def test_mla_head_dim_and_kv_heads():
    data = to_dict(load_model("deepseek-v3"))
    assert load_model("deepseek-v3").head_dim == 192  # qk_nope_head_dim + qk_rope_head_dim; not written
    assert "head_dim" not in data
    with pytest.raises(SpecError, match="head_dim: 56 is not the MLA query/key head width"):
        from_dict(ModelSpec, {**data, "head_dim": 56})
    with pytest.raises(SpecError, match="num_kv_heads: 8: multi-head latent attention"):
        from_dict(ModelSpec, {**data, "num_kv_heads": 8})


# ------------------------------------------------------------------------ Hugging Face configs
@pytest.mark.parametrize("name", list(CONFIGS))
def test_published_configs_map_onto_the_shipped_specs(tmp_path, name):
    """Equal but for the training sequence length (the config's is its longest context)."""
    spec = spec_from_hf_config(write(tmp_path, CONFIGS[name]), name=name)
    shipped = load_model(name)
    assert spec.seq_len == CONFIGS[name]["max_position_embeddings"]
    assert dataclasses.replace(spec, seq_len=shipped.seq_len) == shipped


def test_qwen2_moe_config_counts_the_published_total(tmp_path):
    spec = spec_from_hf_config(write(tmp_path, QWEN2_57B_A14B))
    assert spec.moe.shared_expert_gate and spec.moe.shared_width == 20480 and spec.qkv_bias
    assert (spec.total_params(), spec.active_params()) == PUBLISHED["qwen2-57b-a14b"][:2]


TINY = dict(hidden_size=64, intermediate_size=96, num_hidden_layers=4, num_attention_heads=4, vocab_size=300,
            max_position_embeddings=256)
MLA_TINY = dict(TINY, num_key_value_heads=4, n_routed_experts=4, num_experts_per_tok=2, moe_intermediate_size=32,
                kv_lora_rank=16, qk_rope_head_dim=8, qk_nope_head_dim=16, v_head_dim=16, n_group=2, topk_group=1)
TINY_FAMILIES = {
    "mixtral": ("MixtralConfig", dict(TINY, num_key_value_heads=2, num_local_experts=4, num_experts_per_tok=2)),
    "qwen2_moe (leading dense block)": ("Qwen2MoeConfig", dict(
        TINY, num_key_value_heads=2, num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32,
        shared_expert_intermediate_size=48, mlp_only_layers=[0])),
    "qwen2_moe (every other block)": ("Qwen2MoeConfig", dict(
        TINY, num_key_value_heads=2, num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32,
        shared_expert_intermediate_size=48, decoder_sparse_step=2)),
    "qwen3_moe": ("Qwen3MoeConfig", dict(TINY, num_key_value_heads=2, head_dim=32, num_experts=4, num_experts_per_tok=2,
                                         moe_intermediate_size=32, mlp_only_layers=[0, 1], norm_topk_prob=True)),
    "deepseek_v3": ("DeepseekV3Config", dict(MLA_TINY, n_shared_experts=1, first_k_dense_replace=1, q_lora_rank=24)),
    "deepseek_v2 (group-limited softmax routing)": ("DeepseekV2Config", dict(
        MLA_TINY, n_shared_experts=2, first_k_dense_replace=1, q_lora_rank=24, topk_method="group_limited_greedy")),
    "deepseek_v2 (lite: full-rank q)": ("DeepseekV2Config", dict(MLA_TINY, n_shared_experts=1, q_lora_rank=None)),
    "gpt_oss": ("GptOssConfig", dict(TINY, num_key_value_heads=2, head_dim=16, num_local_experts=4, num_experts_per_tok=2,
                                     sliding_window=8)),
    "deepseek_v3 (full-rank q, yarn)": ("DeepseekV3Config", dict(
        MLA_TINY, n_shared_experts=2, first_k_dense_replace=2, q_lora_rank=None, rope_parameters={
            "rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 64, "mscale": 1.0,
            "mscale_all_dim": 1.0, "rope_theta": 10000.0})),
}


@pytest.mark.parametrize("label", list(TINY_FAMILIES))
def test_tiny_configs_count_what_transformers_builds(tmp_path, label):
    """A config saved by transformers' own class maps onto a spec whose total_params is the parameters of
    the model transformers builds from it (on meta). DeepSeek-V3: transformers builds no MTP module and keeps
    e_score_correction_bias as a buffer, so the count is the spec's without mtp_layers."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    cls, kwargs = TINY_FAMILIES[label]
    config = getattr(transformers, cls)(**kwargs)
    config.save_pretrained(tmp_path)
    with torch.device("meta"):
        model = transformers.AutoModelForCausalLM.from_config(config)
    spec = spec_from_hf_config(tmp_path / "config.json")
    assert spec.moe is not None and (spec.mla is not None) == label.startswith("deepseek")
    assert without_mtp(spec).total_params() == model.num_parameters()
    assert all("e_score_correction_bias" not in name for name, _ in model.named_parameters())
    if label.startswith("deepseek_v3"):
        assert spec.mtp_layers == 1  # DeepseekV3Config's default, written as num_nextn_predict_layers
    if label.startswith("deepseek_v2"):
        assert spec.mtp_layers == 0 and spec.moe.router == "softmax"
    if label.startswith("deepseek"):  # n_group 2, topk_group 1: kept where the class's routing reads them
        routed_by_groups = label.startswith("deepseek_v3") or "group-limited" in label
        assert (spec.moe.router_groups, spec.moe.router_group_topk) == ((2, 1) if routed_by_groups else (1, 1))
    if label == "gpt_oss":  # windows on blocks 0 and 2, full attention on 1 and 3, as layer_types says
        assert [spec.is_windowed(i) for i in range(4)] == [t == "sliding_attention" for t in config.layer_types]
        assert spec.runtime_refusal() is not None
    if "yarn" in label:
        assert spec.mla.rope_scaling.factor == 4.0 and spec.mla.q_lora_rank is None


def test_qwen3_moe_saved_by_transformers_names_experts_num_local_experts(tmp_path):
    """Qwen3MoeConfig.save_pretrained writes num_local_experts (its attribute_map), the Hub's files num_experts."""
    transformers = pytest.importorskip("transformers")
    transformers.Qwen3MoeConfig(**dict(TINY, num_experts=6, num_experts_per_tok=2)).save_pretrained(tmp_path)
    saved = json.loads((tmp_path / "config.json").read_text())
    assert "num_local_experts" in saved and spec_from_hf_config(tmp_path / "config.json").moe.num_experts == 6


REFUSED = {
    "dbrx": ({"model_type": "dbrx", "hidden_size": 64}, "model_type 'dbrx' has no ModelSpec mapping yet"),
    "deepseek_v2 without top-k": ({k: v for k, v in DEEPSEEK_V2.items() if k != "num_experts_per_tok"},
                                  "num_experts_per_tok: missing \\(deepseek_v2's config class has no default\\)"),
    "gpt_oss irregular layer types": (dict(GPT_OSS_120B, layer_types=["full_attention"] * 2 + ["sliding_attention"] * 34),
                                      "layer_types: .* is not windowed blocks with every n-th one full attention"),
    "dense blocks not leading": (dict(QWEN3_30B_A3B, mlp_only_layers=[3]),
                                 "mlp_only_layers: \\[3\\] makes dense blocks other than one leading run"),
    "no MoE block": (dict(QWEN3_30B_A3B, decoder_sparse_step=64), "decoder_sparse_step: 64 leaves no MoE block"),
    "mlp_only_layers not a list": (dict(QWEN3_30B_A3B, mlp_only_layers=3), "mlp_only_layers: 3 is not a list"),
    "mlp_only_layers item": (dict(QWEN3_30B_A3B, mlp_only_layers=[0.0]), "mlp_only_layers\\[0\\]: 0.0 is not a block"),
    "experts as text": (dict(QWEN3_30B_A3B, num_experts="128"), "num_experts: \"128\" is not an integer"),
    "experts named twice": (dict(QWEN3_30B_A3B, num_local_experts=64),
                            "num_local_experts: 64 differs from num_experts"),
    "top-k above experts": (dict(MIXTRAL_8X7B, num_experts_per_tok=9), "num_experts_per_tok: 9 is more than"),
    "norm_topk_prob as text": (dict(QWEN3_30B_A3B, norm_topk_prob="true"),
                               "norm_topk_prob: \"true\" is not true or false"),
    "router jitter": (dict(MIXTRAL_8X7B, router_jitter_noise=0.1), "router_jitter_noise: 0.1 is not supported"),
    "aux loss out of range": (dict(MIXTRAL_8X7B, router_aux_loss_coef=1.5), "router_aux_loss_coef: 1.5 must be in"),
    "softmax scoring": (dict(DEEPSEEK_V3, scoring_func="softmax"), "scoring_func: \"softmax\" is not deepseek_v3's"),
    "greedy top-k": (dict(DEEPSEEK_V3, topk_method="greedy"), "topk_method: \"greedy\" is not deepseek_v3's"),
    "MoE every other block": (dict(DEEPSEEK_V3, moe_layer_freq=2), "moe_layer_freq: 2 is not deepseek_v3's"),
    "n_group as a float": (dict(DEEPSEEK_V3, n_group=8.0), "n_group: 8.0 is not an integer"),
    "n_group not dividing the experts": (dict(DEEPSEEK_V3, n_group=7), "n_group: 7 does not divide the 256 routed"),
    "topk_group above n_group": (dict(DEEPSEEK_V3, topk_group=9), "topk_group: 9 must be a number of groups from 1"),
    "groups opening fewer than top-k": (dict(DEEPSEEK_V3, n_group=64, topk_group=1),
                                        "topk_group: 1 of 64 groups open 4 experts, fewer than num_experts_per_tok=8"),
    "kv heads other than heads": (dict(DEEPSEEK_V3, num_key_value_heads=8), "num_key_value_heads: 8 is not"),
    "attention bias": (dict(DEEPSEEK_V3, attention_bias=True), "attention_bias: true is not supported"),
    "linear rope": (dict(DEEPSEEK_V3, rope_scaling={"type": "linear", "factor": 2.0}),
                    "rope_scaling.rope_type: \"linear\" is not supported"),
    "q_lora_rank zero": (dict(DEEPSEEK_V3, q_lora_rank=0), "q_lora_rank: 0 must be from 1"),
    "mtp as a bool": (dict(DEEPSEEK_V3, num_nextn_predict_layers=True), "num_nextn_predict_layers: true is not an"),
    "every block dense": (dict(DEEPSEEK_V3, first_k_dense_replace=61), "first_k_dense_replace: 61 leaves no MoE"),
}


@pytest.mark.parametrize("label", list(REFUSED))
def test_what_a_spec_cannot_express_is_one_line(tmp_path, label, capsys):
    data, message = REFUSED[label]
    path = write(tmp_path, data)
    with pytest.raises(SpecError, match=message):
        spec_from_hf_config(path)
    assert main(["plan", path, "--cluster", "cpu-local", "--global-batch-size", "8"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "config.json" in err


def test_group_limited_routing_is_kept_and_changes_no_shape(tmp_path):
    """n_group / topk_group change which experts a token reaches, not the parameters: the spec keeps them (the
    deduplicating dispatcher's cost reads them) and counts as without them."""
    a = spec_from_hf_config(write(tmp_path, DEEPSEEK_V3, "a.json"), name="x")
    b = spec_from_hf_config(write(tmp_path, dict(DEEPSEEK_V3, n_group=1, topk_group=1), "b.json"), name="x")
    assert (a.moe.router_groups, a.moe.router_group_topk, b.moe.router_groups, b.moe.router_group_topk) == (8, 4, 1, 1)
    assert dataclasses.replace(a, moe=dataclasses.replace(a.moe, router_groups=1, router_group_topk=1)) == b
    assert (a.total_params(), a.active_params()) == (b.total_params(), b.active_params())


@pytest.mark.parametrize(("config", "total", "active_without_embedding"), [
    # OpenAI's gpt-oss model card, Table 1: 116.83B total and 5.13B active (the input embedding not counted
    # active); gpt-oss-20b 20.91B and 3.61B
    (GPT_OSS_120B, 116.83e9, 5.13e9),
    ({**GPT_OSS_120B, "num_hidden_layers": 24, "num_local_experts": 32,
      "layer_types": ["sliding_attention", "full_attention"] * 12}, 20.91e9, 3.61e9),
    # DeepSeek-V2 paper (arXiv 2405.04434), abstract: 236B total, 21B activated per token
    (DEEPSEEK_V2, 236e9, 21e9),
])
def test_gpt_oss_and_deepseek_v2_configs_count_the_published_totals(tmp_path, config, total, active_without_embedding):
    spec = spec_from_hf_config(write(tmp_path, config))
    digits = 0.005 if config is not DEEPSEEK_V2 else 0.02  # the card gives 4 figures, the paper 2-3
    assert spec.total_params() == pytest.approx(total, rel=digits)
    embedding = spec.vocab_size * spec.hidden_size
    assert spec.active_params() - embedding == pytest.approx(active_without_embedding, rel=digits * 4)
    if config["model_type"] == "gpt_oss":
        assert (spec.seq_len, spec.sliding_window, spec.full_attention_interval) == (4096, 128, 2)
        assert spec.o_bias and spec.qkv_bias and spec.attention_sinks and spec.moe.router_bias
    else:
        assert spec.moe.router == "softmax" and spec.mla.rope_scaling.factor == 40 and spec.mtp_layers == 0


# ------------------------------------------------------------------------ group-limited routing
def test_group_limited_routing_is_read_from_deepseek_configs(tmp_path):
    """DeepSeek-V3 always routes within its topk_group best of n_group groups (absent: the class's 8 and 4);
    DeepSeek-V2 only under topk_method group_limited_greedy (the Hub's 8 and 3), greedy ignores the groups; groups
    that restrict nothing (topk_group = n_group) are the defaults, left out of files."""
    def groups(config: dict) -> tuple[int, int]:
        moe = spec_from_hf_config(write(tmp_path, config)).moe
        return moe.router_groups, moe.router_group_topk

    assert groups(DEEPSEEK_V3) == (8, 4)
    assert groups({k: v for k, v in DEEPSEEK_V3.items() if k not in ("n_group", "topk_group")}) == (8, 4)
    assert groups(dict(DEEPSEEK_V3, n_group=8, topk_group=8)) == (1, 1)
    assert groups(DEEPSEEK_V2) == (8, 3)
    assert groups(dict(DEEPSEEK_V2, topk_method="greedy")) == (1, 1)
    assert groups({k: v for k, v in DEEPSEEK_V2.items() if k != "topk_method"}) == (1, 1)  # the class's greedy


def test_router_groups_validate_and_are_left_out_of_files_at_their_defaults():
    """Groups must split the experts evenly, the chosen groups be at most the groups and hold top-k experts; each
    a one-line error naming the field. Specs without groups write no group fields, so their files and plans'
    fingerprints are as before; DeepSeek-V3's round-trip."""
    deepseek = load_model("deepseek-v3")
    for change, message in ((dict(router_groups=7), "^moe.router_groups: 7 does not divide the 256 experts"),
                            (dict(router_group_topk=9), "^moe.router_group_topk: 9 must be at most 8"),
                            (dict(router_group_topk=0), "^moe.router_group_topk: 0 must be at least 1"),
                            (dict(router_groups=64, router_group_topk=1),
                             "^moe.router_group_topk: 1 of 64 groups open 4 experts, fewer than experts_per_token=8")):
        with pytest.raises(SpecError, match=message) as err:
            dataclasses.replace(deepseek, moe=dataclasses.replace(deepseek.moe, **change)).validate()
        assert "\n" not in str(err.value)
    for name in MOE_MODELS:
        moe = to_dict(load_model(name))["moe"]
        grouped = name == "deepseek-v3"
        assert ("router_groups" in moe, "router_group_topk" in moe) == (grouped, grouped), name
    assert (deepseek.moe.router_groups, deepseek.moe.router_group_topk) == (8, 4)
    assert from_dict(ModelSpec, to_dict(deepseek)) == deepseek


def test_the_runtime_refuses_group_limited_routing():
    """runtime/models/moe.py routes top-k over every expert: a group-limited spec is refused in one line naming
    the fields, an ungrouped one is not refused for routing."""
    qwen = load_model("qwen3-30b-a3b")
    grouped = dataclasses.replace(qwen, moe=dataclasses.replace(qwen.moe, router_groups=8, router_group_topk=4))
    grouped.validate()
    assert qwen.runtime_refusal() is None
    assert grouped.runtime_refusal() == "group-limited routing (moe.router_groups, moe.router_group_topk)"
    assert "moe.router_groups" in load_model("deepseek-v3").runtime_refusal()
