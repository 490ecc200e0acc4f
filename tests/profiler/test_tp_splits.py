"""TP splits found from the traced graph equal the known Megatron splits, for our zoo, an HF Llama and a
user model the tracer has never seen (the MLP-Mixer in examples/custom_model)."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from autoplan.profiler.model_profile import ProfileOptions, profile_model
from autoplan.schema.profile import TpSplit

GPT = (TpSplit(("attn.q", "attn.k", "attn.v"), "attn.o"), TpSplit(("mlp.fc1",), "mlp.fc2"))
LLAMA = (TpSplit(("attn.q", "attn.k", "attn.v"), "attn.o"), TpSplit(("mlp.gate", "mlp.up"), "mlp.down"))
HF = (TpSplit(("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"), "self_attn.o_proj"),
      TpSplit(("mlp.gate_proj", "mlp.up_proj"), "mlp.down_proj"))
MIXER = (TpSplit(("token_mlp.fc1",), "token_mlp.fc2"), TpSplit(("channel_mlp.fc1",), "channel_mlp.fc2"))


def test_zoo_splits(gpt_profile, llama_profile):
    assert all(block.tp_splits == GPT for block in gpt_profile.blocks)
    assert all(block.tp_splits == LLAMA for block in llama_profile.blocks)
    assert gpt_profile.layer("embedding").tp_splits == () and gpt_profile.layer("head").tp_splits == ()


def test_hf_llama_splits(hf_profile):
    assert all(block.tp_splits == HF for block in hf_profile.blocks)


def test_custom_mixer_splits_and_layers(mixer_profile):
    """The tracer finds the Mixer's four blocks and both MLPs' column -> row splits on its own."""
    assert [layer.kind for layer in mixer_profile.layers] == ["embedding"] + ["block"] * 4 + ["head"]
    assert all(block.tp_splits == MIXER for block in mixer_profile.blocks)
    assert mixer_profile.seq_len is None  # images: no token axis
    from examples.custom_model.mixer import build
    model, _ = build()
    assert mixer_profile.total_params == sum(p.numel() for p in model.parameters())
    for i, block in enumerate(model.blocks):
        assert mixer_profile.layers[1 + i].params == sum(p.numel() for p in block.parameters())
    m = mixer_profile.blocks[0].measurement(1)
    assert m.shard(2).fwd_flops * 2 == m.fwd_flops  # all four matmuls split


class NormBetween(nn.Module):
    """fc1 -> LayerNorm -> fc2: the norm reduces over fc1's output features, so no TP split exists."""

    def __init__(self) -> None:
        super().__init__()
        self.fc1, self.norm, self.fc2 = nn.Linear(16, 32), nn.LayerNorm(32), nn.Linear(32, 16)

    def forward(self, x):
        return x + self.fc2(self.norm(self.fc1(x)))


class ResidualInto(nn.Module):
    """fc2 reads fc1's output plus the block input: the replicated input breaks the row split."""

    def __init__(self) -> None:
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(16, 16), nn.Linear(16, 16)

    def forward(self, x):
        return self.fc2(torch.relu(self.fc1(x)) + x)


class Stack(nn.Module):
    def __init__(self, cls) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(cls() for _ in range(2))

    def forward(self, x):
        for block in self.blocks:
            x = block(x)
        return x


def build_norm_between():
    return Stack(NormBetween), torch.randn(2, 8, 16)


def build_residual_into():
    return Stack(ResidualInto), torch.randn(2, 8, 16)


def test_no_split_through_a_norm_or_a_replicated_input():
    options = ProfileOptions(micro_batch_sizes=(1,), tp_sizes=(1, 2), progress=False)
    for factory in ("build_norm_between", "build_residual_into"):
        profile = profile_model(f"tests.profiler.test_tp_splits:{factory}", options)
        assert all(block.tp_splits == () for block in profile.blocks), factory
        assert all(block.measurements[0].tp_shards == () for block in profile.blocks)


class PerHeadNorm(nn.Module):
    """q -> per-head RMSNorm over head_dim (Qwen3's q_norm) -> o: the norm stays inside a head, so it splits."""

    def __init__(self) -> None:
        super().__init__()
        self.q, self.norm, self.o = nn.Linear(16, 16), nn.RMSNorm(4), nn.Linear(16, 16)

    def forward(self, x):
        b, t, _ = x.shape
        q = self.norm(self.q(x).view(b, t, -1, 4))  # [B, T, heads, head_dim]
        return x + self.o(q.reshape(b, t, -1))


def build_per_head_norm():
    return Stack(PerHeadNorm), torch.randn(2, 8, 16)


def test_split_through_a_per_head_norm():
    options = ProfileOptions(micro_batch_sizes=(1,), tp_sizes=(1, 2), progress=False)
    profile = profile_model("tests.profiler.test_tp_splits:build_per_head_norm", options)
    assert all(block.tp_splits == (TpSplit(("q",), "o"),) for block in profile.blocks)


GPT2_HF = (TpSplit(("attn.c_attn",), "attn.c_proj"), TpSplit(("mlp.c_fc",), "mlp.c_proj"))


def test_hf_gpt2_conv1d_splits(tmp_path):
    """transformers' GPT-2 projects with ``Conv1D`` (weight [in, out]), not nn.Linear: the tracer records
    it as a linear, so the fused q/k/v ``c_attn`` splits by columns into ``c_proj`` and ``c_fc`` into the
    MLP's ``c_proj``; a TP shard (c_attn's ``split_size`` cut with it) runs half of the block's GEMMs."""
    pytest.importorskip("transformers")
    config = tmp_path / "gpt2-tiny" / "config.json"
    config.parent.mkdir()
    config.write_text('{"model_type": "gpt2", "n_layer": 2, "n_embd": 64, "n_head": 4, "vocab_size": 256, '
                      '"n_positions": 64, "bos_token_id": 0, "eos_token_id": 0}')
    profile = profile_model(str(config), ProfileOptions(device="meta", micro_batch_sizes=(1,), tp_sizes=(1, 2),
                                                        progress=False))
    assert [block.tp_splits for block in profile.blocks] == [GPT2_HF, GPT2_HF]
    m = profile.blocks[0].measurement(1)
    half = m.shard(2)
    assert half.fwd_flops * 2 == m.fwd_flops  # every GEMM of the block split; attention per head halves too
    replicated = 4 * 64 + 2 * 64  # two LayerNorms (weight, bias) and the row-parallel projections' biases
    assert half.params == (profile.blocks[0].params - replicated) // 2 + replicated
