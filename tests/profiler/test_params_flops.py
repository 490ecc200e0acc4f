"""Per-layer parameter counts equal the real modules' ``sum(p.numel())``; traced forward FLOPs equal the
analytic formulas (within 2%: the tracer counts only matmul-class ops, the formula only the GEMMs and the
attention core, so in practice they agree exactly)."""

from __future__ import annotations

import json

import pytest
import torch

from autoplan.schema import load_model
from runtime.models import build_model
from tests.profiler.conftest import HF_LLAMA_CONFIG


def numel(module) -> int:
    return sum(p.numel() for p in module.parameters())


def block_flops(b: int, s: int, h: int, kv: int, f: int, mlp_matrices: int) -> float:
    """2bs(h(h+2kv) + h^2 + m h f) + 4 b s^2 h: qkv, output projection, MLP, scores + attention-over-V."""
    return 2 * b * s * (h * (h + 2 * kv) + h * h + mlp_matrices * h * f) + 4 * b * s * s * h


@pytest.mark.parametrize("fixture,name", [("gpt_profile", "gpt-tiny"), ("llama_profile", "llama-tiny")])
def test_zoo_params_equal_real_module(request, fixture, name):
    profile = request.getfixturevalue(fixture)
    spec = load_model(name)
    real = build_model(spec, device="cpu")
    layers = {layer.name: layer for layer in profile.layers}
    assert profile.total_params == numel(real) == spec.total_params()
    assert layers["embedding"].params == numel(real.embed) == spec.embedding_params()
    for key, block in real.blocks.items():
        assert layers[f"blocks.{key}"].params == numel(block) == spec.layer_params()
    head_real = numel(real.norm) + (0 if spec.tie_embeddings else real.head.weight.numel())
    assert layers["head"].params == head_real == spec.head_params()
    assert profile.tied_params == (spec.vocab_size * spec.hidden_size if spec.tie_embeddings else 0)


@pytest.mark.parametrize("fixture,name", [("gpt_profile", "gpt-tiny"), ("llama_profile", "llama-tiny")])
def test_zoo_flops_equal_formula(request, fixture, name):
    profile = request.getfixturevalue(fixture)
    spec = load_model(name)
    s, h, f, kv = spec.seq_len, spec.hidden_size, spec.ffn_hidden_size, spec.kv_size
    for b in profile.micro_batch_sizes:
        for block in profile.blocks:
            expected = block_flops(b, s, h, kv, f, spec.mlp_matrices)
            assert block.measurement(b).fwd_flops == pytest.approx(expected, rel=0.02)
        logits = 2 * b * s * h * spec.vocab_size
        assert profile.layer("head").measurement(b).fwd_flops == pytest.approx(logits, rel=0.02)


def test_hf_llama_params_and_flops(hf_profile):
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.from_pretrained(str(HF_LLAMA_CONFIG).rsplit("/", 1)[0])
    real = AutoModelForCausalLM.from_config(config)  # built from the config only, real (small) weights
    assert hf_profile.total_params == numel(real)
    layers = {layer.name: layer for layer in hf_profile.layers}
    for i, layer in enumerate(real.model.layers):
        assert layers[f"model.layers.{i}"].params == numel(layer)
    assert layers["embedding"].params == numel(real.model.embed_tokens)
    assert layers["head"].params == numel(real.model.norm) + numel(real.lm_head)
    cfg = json.load(open(HF_LLAMA_CONFIG))
    h, f = cfg["hidden_size"], cfg["intermediate_size"]
    kv = cfg["num_key_value_heads"] * h // cfg["num_attention_heads"]
    s = hf_profile.seq_len
    for b in hf_profile.micro_batch_sizes:
        for block in hf_profile.blocks:
            assert block.measurement(b).fwd_flops == pytest.approx(block_flops(b, s, h, kv, f, 3), rel=0.02)
        assert hf_profile.layer("head").measurement(b).fwd_flops == pytest.approx(
            2 * b * s * h * cfg["vocab_size"], rel=0.02)


def test_output_bytes_are_hidden_states_and_logits(gpt_profile):
    spec = load_model("gpt-tiny")
    for b in gpt_profile.micro_batch_sizes:
        hidden = 4 * b * spec.seq_len * spec.hidden_size  # fp32
        assert gpt_profile.layer("embedding").measurement(b).output_bytes == hidden
        assert all(block.measurement(b).output_bytes == hidden for block in gpt_profile.blocks)
        assert gpt_profile.layer("head").measurement(b).output_bytes == 4 * b * spec.seq_len * spec.vocab_size


def test_tp_shards_split_params_and_flops(llama_profile):
    """At tp=t a rank holds 1/t of q/k/v/o and gate/up/down (norms replicated) and runs 1/t of the FLOPs."""
    spec = load_model("llama-tiny")
    h = spec.hidden_size
    for block in llama_profile.blocks:
        for m in block.measurements:
            assert [s.tp for s in m.tp_shards] == [2, 4]  # 8 heads, 4 KV heads: both divide
            for shard in m.tp_shards:
                assert shard.params == (spec.layer_params() - 2 * h) // shard.tp + 2 * h
                assert shard.fwd_flops == pytest.approx(m.fwd_flops / shard.tp, rel=1e-9)
                assert shard.saved_activation_bytes < m.saved_activation_bytes


def test_meta_profile_is_fast_and_dtype_aware():
    from autoplan.profiler.model_profile import ProfileOptions, profile_model

    bf16 = profile_model("gpt-tiny", ProfileOptions(dtype="bf16", progress=False))
    fp32 = profile_model("gpt-tiny", ProfileOptions(dtype="fp32", progress=False))
    assert bf16.layers[1].param_bytes * 2 == fp32.layers[1].param_bytes
    assert bf16.layers[1].measurements[0].output_bytes * 2 == fp32.layers[1].measurements[0].output_bytes
    assert torch.__version__.startswith(fp32.torch_version.split("+")[0])
