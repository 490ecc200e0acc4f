"""The ModelSpec fields the Hugging Face families need (issue 29): head_dim apart from hidden / heads, q/k/v
biases, q/k norms, Llama 3.1's RoPE scaling, gpt's position rows and GELU form, Mistral's window.

What must hold: a spec that does not use them serialises exactly as before (plan files, fingerprints and
checkpoint hashes of existing models unchanged), one that does round-trips through YAML, the parameter
formulas count the new tensors, the configs map onto them, and what the runtime cannot train is refused in
one line naming the field.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json

import pytest

from autoplan.errors import SpecError
from autoplan.schema import Layout, Stage, check_fits, load_cluster, load_model
from autoplan.schema._io import dump_yaml, from_dict, to_dict
from autoplan.schema.hf_config import spec_from_hf_config
from autoplan.schema.io import shipped_names
from autoplan.schema.model import ModelSpec, RopeScaling
from autoplan.schema.plan import LAYOUT_FIELDS, Plan, require_runnable, sequence_refusal, window_refusal
from autoplan.schema.training import TrainingSetup

OLD_KEYS = ["name", "architecture", "num_layers", "hidden_size", "ffn_hidden_size", "num_attention_heads",
            "num_kv_heads", "vocab_size", "seq_len", "tie_embeddings", "dropout", "rope_theta", "norm_eps",
            "make_vocab_size_divisible_by"]
LLAMA3 = RopeScaling(factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0, original_max_position_embeddings=8192)
QWEN3ISH = ModelSpec(name="q", architecture="llama", num_layers=2, hidden_size=64, ffn_hidden_size=96,
                     num_attention_heads=4, num_kv_heads=2, vocab_size=300, seq_len=64, head_dim=24, qkv_bias=True,
                     qk_norm=True, rope_scaling=LLAMA3)


@pytest.mark.parametrize("name", shipped_names("models"))
def test_shipped_models_serialise_as_before(name):
    """Every field added for the families holds its default, so it is left out of the written spec."""
    if load_model(name).moe is not None:
        pytest.skip("an MoE model (issue 31) writes its moe (mla, mtp_layers) fields: tests/planner/test_moe_models.py")
    assert list(to_dict(load_model(name))) == OLD_KEYS


BEFORE = {"gpt-tiny": "74a43fecd9628833", "llama-tiny": "89311562176de2fe", "mistral-7b": "6588da9a98c47a2c",
          "llama3-405b": "46a1fcb892500686", "gpt2-medium": "57db563777469b82"}
"""sha256 of each model's sorted JSON (runtime/train/manifest.py model_fingerprint, what checkpoints record;
the plan fingerprint hashes the same dict), computed with the code before the fields existed."""


@pytest.mark.parametrize("name", list(BEFORE))
def test_model_hashes_are_unchanged(name):
    text = json.dumps(to_dict(load_model(name)), sort_keys=True)
    assert hashlib.sha256(text.encode()).hexdigest()[:16] == BEFORE[name]


def test_defaults_given_explicitly_are_still_left_out():
    """head_dim equal to hidden / heads, qkv_bias false, ... is the spec that does not give them."""
    base = load_model("llama-tiny")
    same = dataclasses.replace(base, head_dim=base.hidden_size // base.num_attention_heads, qkv_bias=False,
                               qk_norm=False, rope_scaling=None, sliding_window=None)
    assert to_dict(same) == to_dict(base) and same == base


def test_yaml_round_trip_with_every_new_field(tmp_path):
    path = tmp_path / "qwen3ish.yaml"
    path.write_text(dump_yaml(QWEN3ISH))
    text = path.read_text()
    assert "head_dim: 24" in text and "rope_type: llama3" in text and "qk_norm: true" in text
    assert load_model(str(path)) == QWEN3ISH
    gpt = dataclasses.replace(load_model("gpt-tiny"), max_positions=1024, activation="gelu_tanh")
    (tmp_path / "gpt.yaml").write_text(dump_yaml(gpt))
    assert load_model(str(tmp_path / "gpt.yaml")) == gpt
    mistral = dataclasses.replace(load_model("mistral-7b"), sliding_window=4096)
    (tmp_path / "mistral.yaml").write_text(dump_yaml(mistral))
    assert load_model(str(tmp_path / "mistral.yaml")) == mistral


def test_parameter_formulas_count_the_new_tensors():
    h, f, heads, kv_heads, d, v = 64, 96, 4, 2, 24, 300
    q, kv = heads * d, kv_heads * d
    attn = h * q + 2 * h * kv + q * h  # q, k, v, o: q is 96 wide, not h
    block = attn + 3 * h * f + 2 * h + (q + 2 * kv) + 2 * d  # SwiGLU, two RMSNorms, q/k/v biases, q/k norms
    assert QWEN3ISH.q_size == 96 and QWEN3ISH.kv_size == 48
    assert QWEN3ISH.layer_params() == block
    assert QWEN3ISH.total_params() == v * h + 2 * block + h + v * h  # untied head
    gpt = load_model("gpt-tiny")
    longer = dataclasses.replace(gpt, max_positions=4 * gpt.seq_len)
    assert longer.embedding_params() - gpt.embedding_params() == 3 * gpt.seq_len * gpt.hidden_size
    assert longer.position_rows(32) == 4 * gpt.seq_len and gpt.position_rows(32) == 32


REFUSED = {
    "gpt with q/k/v biases": (dict(architecture="gpt", qkv_bias=True), "qkv_bias"),
    "gpt with q/k norms": (dict(architecture="gpt", qk_norm=True), "qk_norm"),
    "gpt with rope scaling": (dict(architecture="gpt", rope_scaling=LLAMA3), "rope_scaling"),
    "gpt with a decoupled head_dim": (dict(architecture="gpt", head_dim=24), "head_dim"),
    "gpt with silu": (dict(architecture="gpt", activation="silu"), "activation"),
    "llama with gelu": (dict(activation="gelu"), "activation"),
    "llama with a position table": (dict(max_positions=128), "max_positions"),
    "rope factor below 1": (dict(rope_scaling=dataclasses.replace(LLAMA3, factor=0.5)), "rope_scaling.factor"),
    "rope low >= high": (dict(rope_scaling=dataclasses.replace(LLAMA3, low_freq_factor=4.0)),
                         "rope_scaling.low_freq_factor"),
    "full-attention interval without a window": (dict(full_attention_interval=2), "full_attention_interval"),
    "full-attention interval of 1": (dict(sliding_window=32, full_attention_interval=1), "full_attention_interval"),
    "gpt with an o bias": (dict(architecture="gpt", o_bias=True), "o_bias"),
    "hidden not divisible without head_dim": (dict(hidden_size=66, head_dim=None), "hidden_size"),
}


@pytest.mark.parametrize("change, text", list(REFUSED.values()), ids=list(REFUSED))
def test_what_the_runtime_cannot_build_is_refused(change, text):
    fields = {**vars(QWEN3ISH), **change}
    if fields["architecture"] == "gpt":
        fields |= dict(num_kv_heads=4, qkv_bias=change.get("qkv_bias", False), qk_norm=change.get("qk_norm", False),
                       rope_scaling=change.get("rope_scaling"), head_dim=change.get("head_dim"))
    data = {k: v for k, v in to_dict(ModelSpec(**fields)).items()}
    with pytest.raises(SpecError, match=text) as err:
        from_dict(ModelSpec, data)
    assert "\n" not in str(err.value)


def test_rope_type_other_than_llama3_is_refused_in_yaml(tmp_path):
    data = to_dict(QWEN3ISH)
    data["rope_scaling"]["rope_type"] = "yarn"
    with pytest.raises(SpecError, match="rope_scaling.rope_type: 'yarn' is not allowed"):
        from_dict(ModelSpec, data)


def test_training_longer_than_the_positions_is_refused_and_past_the_window_only_run_refuses():
    """A plan (Plan.validate and the runtime's check both call check_fits) may not train past gpt's
    position table. Past Mistral's window it may: the planner prices the window (another stack runs it), and
    only `autoplan run`/`eval` and the ranks refuse it (``require_runnable``), the runtime's attention being
    full causal."""
    gpt = dataclasses.replace(load_model("gpt-tiny"), max_positions=32)
    training = TrainingSetup(global_batch_size=8, seq_len=64)
    assert "max_positions=32" in sequence_refusal(gpt, training)
    assert sequence_refusal(gpt, dataclasses.replace(training, seq_len=32)) is None
    window = dataclasses.replace(load_model("llama-tiny"), sliding_window=16, seq_len=16)
    assert sequence_refusal(window, training) is None
    assert "sliding_window=16" in window_refusal(window, training)
    assert window_refusal(window, dataclasses.replace(training, seq_len=16)) is None
    layout = Layout(tp=1, pp=1, dp=1, sequence_parallel=False, zero_stage=0, offload_optimizer=False,
                    schedule="gpipe", virtual_stages=1, micro_batch_size=1, num_microbatches=8,
                    stages=(Stage(index=0, rank=0, layers=(0, gpt.num_layers)),))
    check_fits(layout, gpt, dataclasses.replace(training, seq_len=32), None)
    refusal = "seq_len: 64 tokens exceed the model's max_positions=32 .* train with --seq-len 32"
    with pytest.raises(SpecError, match=refusal) as err:
        check_fits(layout, gpt, training, None)
    assert "\n" not in str(err.value)
    check_fits(layout, window, training, None)
    cluster = load_cluster("cpu-local")
    plan = Plan(**{f: getattr(layout, f) for f in LAYOUT_FIELDS}, model=window, cluster=cluster, training=training)
    with pytest.raises(SpecError, match="seq_len: 64 tokens exceed the model's sliding_window=16") as err:
        require_runnable(plan)
    assert "\n" not in str(err.value)
    require_runnable(dataclasses.replace(plan, training=dataclasses.replace(training, seq_len=16)))


def test_what_only_the_planner_prices_is_refused_by_run():
    """Nemotron-4's squared-ReLU MLP (two matrices), GPT-OSS's o bias, sinks and alternating windows: a spec
    holds them and counts them; `autoplan run` refuses them in one line naming the model."""
    base = load_model("llama-tiny")
    relu2 = dataclasses.replace(base, activation="relu2")
    assert relu2.mlp_matrices == 2 and base.mlp_matrices == 3
    h, f = base.hidden_size, base.ffn_hidden_size
    assert base.layer_params() - relu2.layer_params() == h * f
    oss = dataclasses.replace(base, o_bias=True, attention_sinks=True, sliding_window=8, full_attention_interval=2)
    assert oss.layer_params() - base.layer_params() == h + base.num_attention_heads
    assert [oss.is_windowed(i) for i in range(4)] == [True, False, True, False]
    assert oss.windowed_layers() == oss.num_layers // 2
    layout = Layout(tp=1, pp=1, dp=1, sequence_parallel=False, zero_stage=0, offload_optimizer=False,
                    schedule="gpipe", virtual_stages=1, micro_batch_size=1, num_microbatches=8,
                    stages=(Stage(index=0, rank=0, layers=(0, base.num_layers)),))
    training = TrainingSetup(global_batch_size=8, seq_len=8)
    for spec, phrase in ((relu2, "squared-ReLU"), (oss, "attention sinks")):
        plan = Plan(**{f: getattr(layout, f) for f in LAYOUT_FIELDS}, model=spec, cluster=load_cluster("cpu-local"),
                    training=training)
        with pytest.raises(SpecError, match=f"model: .*{phrase}") as err:
            require_runnable(plan)
        assert "\n" not in str(err.value)


@pytest.mark.parametrize("command", ["plan", "estimate"])
def test_plan_and_estimate_refuse_a_sequence_past_the_positions_before_searching(tmp_path, capsys, command):
    """`autoplan plan` never writes a plan `autoplan run` would refuse: --seq-len past GPT-2's n_positions is
    one line naming --seq-len, exit 2."""
    from autoplan.cli.main import main

    config = write(tmp_path, {"model_type": "gpt2", "n_embd": 64, "n_layer": 2, "n_head": 4, "vocab_size": 300,
                              "n_positions": 128})
    argv = [command, str(config), "--cluster", "cpu-local", "--devices-per-node", "1", "--global-batch-size", "4",
            "--seq-len", "256"] + (["--tp", "1", "--pp", "1", "--dp", "1", "--micro-batch-size", "1", "--zero-stage", "0",
                                    "--schedule", "1f1b"]
                                   if command == "estimate" else ["-o", str(tmp_path / "p.yaml")])
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert "--seq-len: 256 tokens exceed the model's max_positions=128" in err and "\n" not in err
    assert not (tmp_path / "p.yaml").exists()


# --------------------------------------------------------------------------- the Hugging Face configs
def write(tmp_path, data: dict):
    path = tmp_path / "m" / "config.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data))
    return path


BASE = {"num_hidden_layers": 2, "hidden_size": 64, "intermediate_size": 96, "num_attention_heads": 4,
        "num_key_value_heads": 2, "vocab_size": 300, "max_position_embeddings": 256}


def test_llama31_legacy_keys_and_transformers5_rope_parameters_agree(tmp_path):
    """A Hub Llama 3.1 config (rope_theta and rope_scaling at the top) and the same model as transformers 5
    writes it (one rope_parameters object) are one spec."""
    legacy = spec_from_hf_config(write(tmp_path / "a", {**BASE, "model_type": "llama", "rope_theta": 500000.0,
                                                        "rope_scaling": {"rope_type": "llama3", "factor": 8.0,
                                                                         "low_freq_factor": 1.0,
                                                                         "high_freq_factor": 4.0,
                                                                         "original_max_position_embeddings": 64}}))
    v5 = spec_from_hf_config(write(tmp_path / "b", {**BASE, "model_type": "llama", "rope_parameters": {
        "rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0, "low_freq_factor": 1.0,
        "high_freq_factor": 4.0, "original_max_position_embeddings": 64}}))
    assert legacy == v5
    assert v5.rope_theta == 500000.0 and v5.rope_scaling == RopeScaling(
        factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0, original_max_position_embeddings=64)
    plain = spec_from_hf_config(write(tmp_path / "c", {**BASE, "model_type": "llama",
                                                       "rope_parameters": {"rope_type": "default", "rope_theta": 1e6}}))
    assert plain.rope_scaling is None and plain.rope_theta == 1e6


def test_each_family_maps_its_features(tmp_path):
    qwen2 = spec_from_hf_config(write(tmp_path / "q2", {**BASE, "model_type": "qwen2", "sliding_window": 131072,
                                                        "use_sliding_window": False}))
    assert (qwen2.qkv_bias, qwen2.qk_norm, qwen2.sliding_window, qwen2.seq_len) == (True, False, None, 256)
    qwen3 = spec_from_hf_config(write(tmp_path / "q3", {**BASE, "model_type": "qwen3", "head_dim": 24}))
    assert (qwen3.qk_norm, qwen3.qkv_bias, qwen3.head_dim, qwen3.q_size) == (True, False, 24, 96)
    assert spec_from_hf_config(write(tmp_path / "q3d", {**BASE, "model_type": "qwen3"})).head_dim == 128
    llama = spec_from_hf_config(write(tmp_path / "l", {**BASE, "model_type": "llama", "head_dim": 32}))
    assert llama.head_dim == 32 and llama.q_size == 128
    mistral = spec_from_hf_config(write(tmp_path / "mi", {**BASE, "model_type": "mistral", "sliding_window": 128}))
    assert (mistral.sliding_window, mistral.seq_len) == (128, 128)
    gpt2 = spec_from_hf_config(write(tmp_path / "g", {"model_type": "gpt2", "n_positions": 512}))
    assert (gpt2.max_positions, gpt2.seq_len, gpt2.mlp_activation) == (512, 512, "gelu_tanh")
    exact = spec_from_hf_config(write(tmp_path / "ge", {"model_type": "gpt2", "activation_function": "gelu"}))
    assert exact.activation is None and exact.mlp_activation == "gelu"


def test_a_sliding_window_prices_the_causal_band_it_computes():
    """Past the window a query sees w keys: the attention core's Megatron count covers twice the band's
    (query, key) pairs, counted here one by one; GPT-OSS's alternating blocks average the windowed and the
    full count; a window at least as long as the sequence changes nothing."""
    from autoplan.cost.flops import attended_keys, block_fwd_flops

    s, w = 512, 128
    mistral = dataclasses.replace(load_model("llama-tiny"), sliding_window=w)
    pairs = sum(min(i + 1, w) for i in range(s))
    assert attended_keys(mistral, s) * s == pytest.approx(2 * pairs)
    assert attended_keys(mistral, w) is None and attended_keys(mistral, w // 2) is None
    full = dataclasses.replace(mistral, sliding_window=None)
    ratio = block_fwd_flops(mistral, 1, s).attn_core / block_fwd_flops(full, 1, s).attn_core
    assert ratio == pytest.approx(2 * pairs / s**2)
    oss = dataclasses.replace(mistral, full_attention_interval=2)
    assert attended_keys(oss, s) == pytest.approx((2 * pairs / s + s) / 2)
    assert attended_keys(oss, s, layer=0) == pytest.approx(2 * pairs / s) and attended_keys(oss, s, layer=1) == s
    from autoplan.schema.plan import context_parallel_refusal
    assert "window" in context_parallel_refusal(2, mistral, TrainingSetup(global_batch_size=8, seq_len=s))
