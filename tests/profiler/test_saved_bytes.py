"""Saved-activation bytes: what the real CPU kernels keep, against the cost model's Korthikanti count
(``autoplan.cost.activations.block_saved_bytes``), with every difference named and sized.

The differences (found term by term with ``benchmarks/profile_saved_bytes.py``), fp32, flash SDPA, no
dropout; e = 4 bytes, sb = tokens:
* LayerNorm keeps its mean and rstd: 2 norms x 2 x e*sb.
* RMSNorm (Llama) also keeps its normalised input x*rstd (the weight's gradient needs it): 2 x e*sbh, and
  its fp32 rstd: 2 x 4*sb.
* RoPE keeps its cos and sin tables (the multiply by a constant saves the constant): 2 x 4*s*d/2.
* Llama's q is contiguous [b, a, s, d] after RoPE, so the flash output has that layout and the output
  projection's input is a copy: e*sbh more (GPT's transposed q makes it a view of the flash output).
On meta the profiler's flash emulation must reproduce the same bytes.
"""

from __future__ import annotations

import pytest
import torch

from autoplan.cost.activations import block_saved_bytes
from autoplan.cost.workload import LayerSplit
from autoplan.profiler.model_profile import ProfileOptions, profile_model
from autoplan.profiler.timing import materialize, saved_bytes
from autoplan.schema import TrainingSetup, load_model
from runtime.models import build_model

B = 2


def real_cpu_saved(name: str) -> int:
    spec = load_model(name)
    block = materialize(build_model(spec, device="meta").blocks["0"], torch.device("cpu")).train()
    x = torch.randn(B, spec.seq_len, spec.hidden_size, requires_grad=True)
    return saved_bytes(block, (x,), {})


def expected_saved(name: str) -> int:
    spec = load_model(name)
    s, h, e = spec.seq_len, spec.hidden_size, 4
    sb, sbh = s * B, s * B * h
    model = block_saved_bytes(spec, LayerSplit(B), TrainingSetup(B, s, precision="fp32", attention="flash")).none
    if spec.architecture == "gpt":
        return int(model + 2 * 2 * e * sb)
    rope = 2 * 4 * s * spec.head_dim // 2
    return int(model + 2 * e * sbh + 2 * 4 * sb + rope + e * sbh)


@pytest.mark.parametrize("name", ["gpt-tiny", "llama-tiny"])
def test_real_cpu_saved_bytes_equal_cost_model_plus_named_terms(name):
    assert real_cpu_saved(name) == expected_saved(name)


@pytest.mark.parametrize("fixture,name", [("gpt_profile", "gpt-tiny"), ("llama_profile", "llama-tiny")])
def test_meta_flash_emulation_matches_real_cpu_kernels(request, fixture, name):
    profile = request.getfixturevalue(fixture)
    assert profile.attention_memory == "flash-emulated"
    # each reference Llama block owns its RoPE buffers, so every block keeps the same bytes
    real = real_cpu_saved(name)
    assert all(block.measurement(B).saved_activation_bytes == real for block in profile.blocks)


def test_cpu_profile_times_blocks_and_measures_saved_bytes():
    profile = profile_model("gpt-tiny", ProfileOptions(device="cpu", micro_batch_sizes=(B,), tp_sizes=(1, 2),
                                                       warmup=1, repeats=2, progress=False))
    assert profile.attention_memory == "measured" and profile.device_name
    for block in profile.blocks:
        m = block.measurement(B)
        assert m.fwd_time_s > 0 and m.bwd_time_s > 0
        assert m.saved_activation_bytes == expected_saved("gpt-tiny")
        assert m.shard(2).fwd_time_s > 0
    assert profile.layer("embedding").measurements[0].fwd_time_s is None  # only blocks are timed
