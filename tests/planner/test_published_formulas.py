"""The cost model reproduces the published numbers in ../shared/reference/formulas.md (copied here with
their sources, so the tests need nothing outside the repository)."""

import dataclasses

import pytest

from autoplan.cost.activations import block_saved_bytes
from autoplan.cost.flops import model_flops_per_step, narayanan_flops_per_step
from autoplan.cost.model_states import state_bytes_per_param
from autoplan.schema.schedule import build_schedule
from autoplan.cost.simulate import simulate
from autoplan.cost.workload import LayerSplit
from autoplan.schema import ModelSpec, TrainingSetup

GB = 1e9


@pytest.mark.parametrize("stage, expected_gb", [(0, 120.0), (1, 31.4), (2, 16.6), (3, 1.88)])
def test_zero_paper_figure1_7p5b_on_64_gpus(stage, expected_gb):
    """Rajbhandari et al. 2020, Figure 1: Psi = 7.5B, N_d = 64, mixed-precision Adam (K = 12)."""
    training = TrainingSetup(global_batch_size=64, seq_len=1024, precision="fp16", optimizer="adamw")
    per_param = state_bytes_per_param(training, zero_stage=stage, dp=64, offload=False)
    assert 7.5e9 * per_param.total / GB == pytest.approx(expected_gb, abs=0.06)


GPT3_175B = ModelSpec(name="gpt3-175b", architecture="gpt", num_layers=96, hidden_size=12288, ffn_hidden_size=49152,
                      num_attention_heads=96, num_kv_heads=96, vocab_size=51200, seq_len=2048, dropout=0.1)


@pytest.mark.parametrize("tp, sp, mode, expected_gb", [
    (1, False, "none", 2.869),      # Eq. 1: sbh(34 + 5as/h)
    (8, False, "none", 0.579),      # Eq. 2: sbh(10 + 24/t + 5as/(ht))
    (8, True, "none", 0.359),       # Eq. 4: sbh/t (34 + 5as/h)
    (8, False, "selective", 0.327),  # sbh(10 + 24/t)
    (8, True, "selective", 0.107),  # Eq. 6: 34 sbh / t
    (8, False, "full", 0.0503),     # 2 sbh
])
def test_korthikanti_activation_memory_gpt3_175b(tp, sp, mode, expected_gb):
    """Korthikanti et al. 2022, Table 2, with s = 2048, b = 1, h = 12288, a = 96 (formulas.md section 3)."""
    saved = block_saved_bytes(GPT3_175B, LayerSplit(1, tp, sp), TrainingSetup(8, 2048, attention="standard"))
    assert getattr(saved, mode) / GB == pytest.approx(expected_gb, rel=2e-3)


def test_korthikanti_first_stage_holds_l_layers_worth():
    """Eq. 5: with 1F1B the first of p stages keeps p micro-batches of L/p layers: 34.4 GB for TP8+SP."""
    saved = block_saved_bytes(GPT3_175B, LayerSplit(1, 8, True), TrainingSetup(8, 2048, attention="standard"))
    assert 96 * saved.none / GB == pytest.approx(34.4, rel=2e-3)


def test_megatron_flops_formulas():
    """Korthikanti Eq. 7 (model FLOPs) and Narayanan Eq. 3 (with full recomputation): 145.6B example."""
    model = dataclasses.replace(GPT3_175B, num_layers=80, hidden_size=12288, ffn_hidden_size=49152)
    B, s, l, h, v = 2304, 2048, 80, 12288, 51200
    assert model_flops_per_step(model, B, s) == pytest.approx(72 * B * l * s * h * h * (1 + s / (6 * h) + v / (12 * h * l)))
    assert narayanan_flops_per_step(model, B, s) == pytest.approx(5.642e18, rel=1e-3)


@pytest.mark.parametrize("schedule", ["gpipe", "1f1b"])
@pytest.mark.parametrize("p, m", [(2, 4), (4, 8), (8, 64), (4, 4), (3, 7)])
def test_bubble_fraction_equal_stages(schedule, p, m):
    """Equal stages, no transfer cost: idle share (T - m(f+b)) / (m(f+b)) = (p-1)/m (Narayanan 2021, 2.2)."""
    f, b = 1.0, 2.0
    timeline = simulate(build_schedule(schedule, p, 1, m), [f] * p, [b] * p, [0.0] * (p - 1))
    step = max(timeline.rank_end.values())
    assert (step - m * (f + b)) / (m * (f + b)) == pytest.approx((p - 1) / m)


@pytest.mark.parametrize("p, v, m", [(2, 2, 4), (4, 2, 8), (4, 3, 8), (8, 3, 64)])
def test_interleaved_bubble_equal_stages(p, v, m):
    """Interleaving v chunks per rank divides the bubble by v: (p-1)/(v m) (Narayanan 2021, 2.2.2)."""
    f, b = 1.0 / v, 2.0 / v
    timeline = simulate(build_schedule("interleaved", p, v, m), [f] * (p * v), [b] * (p * v), [0.0] * (p * v - 1))
    step = max(timeline.rank_end.values())
    assert (step - m * 3.0) / (m * 3.0) == pytest.approx((p - 1) / (v * m))


@pytest.mark.parametrize("tp, padded", [(1, 50304), (2, 50432), (4, 50688), (8, 51200)])
def test_megatron_vocab_padding(tp, padded):
    """Megatron-LM's _vocab_size_with_padding: round 50,257 (GPT-2) up to a multiple of 128 x tp."""
    gpt2 = dataclasses.replace(GPT3_175B, vocab_size=50257)
    assert gpt2.padded_vocab_size(tp) == padded
