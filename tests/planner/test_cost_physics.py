"""The kernel-level cost model against published per-kernel and per-layer numbers (none of which set it).

* activation memory per layer, flash against standard attention, from the formulas (Korthikanti et al.
  2022 for standard; a flash kernel keeps only its log-sum-exp of the attention core);
* one transformer layer's forward and backward time against Korthikanti et al. 2022 Table 4 (22B, 8 x A100,
  TP 8): the device profile's numbers come from single-kernel measurements, so this checks the model's
  sum of kernels and collectives against a measured layer;
* NCCL's own latency model, the fp8/bf16 GEMM ratio and the optimizer step bytes, term by term.
"""

import dataclasses

import pytest

from autoplan.cost.activations import block_saved_bytes
from autoplan.cost.comm import collective_time_s, group_link
from autoplan.cost.compute import matmul_time_s
from autoplan.cost.model_states import optimizer_step_bytes
from autoplan.cost.model_workload import workload_fn
from autoplan.cost.tables import build_table
from autoplan.cost.workload import LayerSplit
from autoplan.schema import ModelSpec, TrainingSetup, load_cluster, load_device, load_stack
from autoplan.schema.parallel_dims import GroupSpan
from tests.planner.random_problems import config


# The stack of the measured layers (Megatron-LM 2022, fused kernels, no TP overlap) at its kernel-level
# speed: what these tests check is the sum of kernels and collectives, not the stack's fitted efficiency.
KERNEL_STACK = dataclasses.replace(load_stack("megatron-lm"), gemm_efficiency=1.0, attention_efficiency=1.0, fitted=())


def analytic_workload(model, cluster, training, b, tp, sp):
    return workload_fn(model, cluster, training, KERNEL_STACK)(LayerSplit(b, tp, sp))

GB = 1e9
GPT3_175B = ModelSpec(name="gpt3-175b", architecture="gpt", num_layers=96, hidden_size=12288, ffn_hidden_size=49152,
                      num_attention_heads=96, num_kv_heads=96, vocab_size=51200, seq_len=2048, dropout=0.1)


@pytest.mark.parametrize("tp, sp, korthikanti_selective", [
    (1, False, lambda s, b, h, t: s * b * h * 34),          # Eq. 1 without the 5as/h term
    (8, False, lambda s, b, h, t: s * b * h * (10 + 24 / t)),  # Eq. 2 without 5as/(ht)
    (8, True, lambda s, b, h, t: 34 * s * b * h / t),        # Eq. 6
])
def test_flash_keeps_the_selective_count_plus_its_log_sum_exp(tp, sp, korthikanti_selective):
    """Flash attention stores no s x s scores: a layer keeps Korthikanti's count without the 5as^2b term,
    plus the kernel's fp32 log-sum-exp (4 bytes per query row and head), and selective recomputation
    has nothing left to drop. Standard attention keeps the 5as^2b/t bytes (Eq. 1/2/4)."""
    s, b, h, a = 2048, 1, 12288, 96
    flash = block_saved_bytes(GPT3_175B, LayerSplit(b, tp, sp), TrainingSetup(8, s, attention="flash"))
    standard = block_saved_bytes(GPT3_175B, LayerSplit(b, tp, sp), TrainingSetup(8, s, attention="standard"))
    lse = 4 * a * s * b / tp
    assert flash.none == pytest.approx(korthikanti_selective(s, b, h, tp) + lse, rel=1e-12)
    assert flash.selective == flash.none
    assert standard.none - standard.selective == pytest.approx(5 * a * s * s * b / tp, rel=1e-12)
    assert standard.selective == pytest.approx(korthikanti_selective(s, b, h, tp), rel=1e-12)


def test_flash_layer_memory_reaches_the_workload():
    """The per-layer bytes the planner stores are these (GPT-3 175B, TP 8 + SP: 0.107 GB flash against
    0.359 GB standard, Korthikanti Table 2)."""
    cluster = load_cluster("dgx-a100-80gb")
    flash = analytic_workload(GPT3_175B, cluster, TrainingSetup(64, 2048, attention="flash"), 1, 8, True)
    standard = analytic_workload(GPT3_175B, cluster, TrainingSetup(64, 2048, attention="standard"), 1, 8, True)
    assert flash.block.saved_bytes / GB == pytest.approx(0.107, rel=3e-3)
    assert standard.block.saved_bytes / GB == pytest.approx(0.359, rel=3e-3)
    assert flash.block.selective_extra_s == 0 and standard.block.selective_extra_s > 0


# Korthikanti et al. 2022 Table 4: one layer of the 22B model (h 6144, 64 heads, s 2048, micro-batch 4) on
# 8 x A100 with TP 8, forward / backward milliseconds as measured (benchmarks/data/dev_runs.yaml aux table).
TABLE4_MS = {
    "baseline": (False, 7.7, 11.9),
    "sequence parallel": (True, 7.2, 11.8),
}
TABLE4_RECOMPUTE_BWD_MS = {"full": (False, 19.5), "selective": (False, 13.2), "selective + SP": (True, 13.1)}
MODEL_22B = ModelSpec(name="22b", architecture="gpt", num_layers=48, hidden_size=6144, ffn_hidden_size=24576,
                      num_attention_heads=64, num_kv_heads=64, vocab_size=51200, seq_len=2048, dropout=0.1)


TRAINING_22B = TrainingSetup(global_batch_size=4, seq_len=2048, precision="fp16", attention="standard")


def layer_22b(sp: bool):
    return analytic_workload(MODEL_22B, load_cluster("dgx-a100-80gb"), TRAINING_22B, 4, 8, sp).block


@pytest.mark.parametrize("setup", list(TABLE4_MS))
def test_layer_times_match_korthikanti_table4(setup):
    """Forward and backward of one layer, kernels plus TP collectives, within 10% of the measured layer."""
    sp, fwd_ms, bwd_ms = TABLE4_MS[setup]
    layer = layer_22b(sp)
    assert 1e3 * (layer.fwd_s + layer.tp_fwd_s) == pytest.approx(fwd_ms, rel=0.10)
    assert 1e3 * (layer.bwd_s + layer.tp_bwd_s) == pytest.approx(bwd_ms, rel=0.10)


@pytest.mark.parametrize("setup", list(TABLE4_RECOMPUTE_BWD_MS))
def test_recompute_backward_matches_korthikanti_table4(setup):
    """Full recomputation adds the whole forward to the backward, selective the attention core only."""
    sp, bwd_ms = TABLE4_RECOMPUTE_BWD_MS[setup]
    cluster = load_cluster("dgx-a100-80gb")
    workload = analytic_workload(MODEL_22B, cluster, TRAINING_22B, 4, 8, sp)
    # the table the search and the evaluator read: a layer's backward and what recomputation adds to it
    table = build_table(workload, cluster, TRAINING_22B, config(tp=8, pp=1, dp=1, sequence_parallel=sp,
                                                                  micro_batch_size=4, num_microbatches=1))
    extra = table.full_extra_ns if setup == "full" else table.selective_extra_ns
    assert 1e-6 * (table.block.bwd_ns + extra) == pytest.approx(bwd_ms, rel=0.10)


def test_collective_latency_is_nccls_ring_model():
    """NCCL's ring/Simple model (src/graph/tuning.cc): baseLat 8.4 us + 2(n-1) x 3.4 us over NVLink for an
    all-reduce, (n-1) x 3.4 us for an all-gather; a tiny message costs just that."""
    cluster = load_cluster("dgx-h100-80gb")
    link = group_link(cluster, GroupSpan(8, 1))
    assert collective_time_s("all_reduce", 8, link) == pytest.approx((8.4 + 14 * 3.4) * 1e-6, rel=1e-3)
    assert collective_time_s("all_gather", 8, link) == pytest.approx((8.4 + 7 * 3.4) * 1e-6, rel=1e-3)


def test_tp_groups_price_all_reduces_by_the_tp_fit_and_other_groups_by_the_plain_one():
    """The shipped CPU calibration measures collectives both ways (distributed_overhead.py): a TP group of
    2 on 4 ranks takes the fits measured as DTensor issues them (all-reduce, and sequence parallelism's
    all-gather), any other group of 2 the plain loop's."""
    cluster = load_cluster("cpu-local-calibrated")
    tp_fit, plain_fit = cluster.collective_fit("tp_all_reduce", 2), cluster.collective_fit("all_reduce", 2)
    assert tp_fit is not None and plain_fit is not None and tp_fit.ranks == plain_fit.ranks == 4
    size = 128 * 1024
    expected = {True: tp_fit.alpha_us * 1e-6 + size / (tp_fit.busbw_gb_per_s * 1e9),
                False: plain_fit.alpha_us * 1e-6 + size / (plain_fit.busbw_gb_per_s * 1e9)}
    for tensor_parallel, t in expected.items():
        link = group_link(cluster, GroupSpan(2, 1), tensor_parallel=tensor_parallel)
        assert collective_time_s("all_reduce", size, link) == pytest.approx(t, rel=1e-9)
    gather = cluster.collective_fit("tp_all_gather", 2)  # sequence parallelism's all-gather, as DTensor issues it
    assert collective_time_s("all_gather", size, group_link(cluster, GroupSpan(2, 1), tensor_parallel=True)) == \
        pytest.approx(gather.alpha_us * 1e-6 + size / 2 / (gather.busbw_gb_per_s * 1e9), rel=1e-9)


def test_fp8_gemm_runs_at_the_fp8_curve():
    """A large GEMM in fp8 is faster by the ratio of the two measured ceilings x peaks (MAMF: 1402.6 against
    794.5 TFLOP/s on H100), and a device without fp8 tensor cores refuses fp8."""
    h100 = load_device("h100-sxm-80gb")
    flops = 2.0 * 16384 ** 3
    ratio = matmul_time_s(flops, h100, "bf16") / matmul_time_s(flops, h100, "fp8")
    assert ratio == pytest.approx(1402.6 / 794.5, rel=0.02)
    with pytest.raises(Exception, match="no fp8 tensor cores"):
        matmul_time_s(flops, load_device("a100-sxm-80gb"), "fp8")


def test_fp8_casts_cost_memory_time_and_states_stay_bf16():
    """fp8 makes the blocks' GEMMs faster and adds the per-tensor casts; activations stay bf16, so the saved
    bytes do not change (Llama 3 8B, 8k tokens, one H100)."""
    model = ModelSpec(name="l", architecture="llama", num_layers=32, hidden_size=4096, ffn_hidden_size=14336,
                      num_attention_heads=32, num_kv_heads=8, vocab_size=128256, seq_len=8192)
    cluster = load_cluster("dgx-h100-80gb")
    bf16 = analytic_workload(model, cluster, TrainingSetup(8, 8192, precision="bf16"), 1, 1, False)
    fp8 = analytic_workload(model, cluster, TrainingSetup(8, 8192, precision="fp8"), 1, 1, False)
    assert fp8.block.saved_bytes == bf16.block.saved_bytes
    assert fp8.block.fwd_flops == bf16.block.fwd_flops
    assert 0.5 * bf16.block.fwd_s < fp8.block.fwd_s < bf16.block.fwd_s
    assert fp8.head.fwd_s == bf16.head.fwd_s  # the output head stays in bf16


def test_optimizer_step_bytes():
    """Clip (norm 4 + scale 8) + AdamW 28 + bf16 copy 6 = 46; fp16 adds the 8-byte unscale; fp32 no copy."""
    assert optimizer_step_bytes(TrainingSetup(8, 64, precision="bf16")) == 46
    assert optimizer_step_bytes(TrainingSetup(8, 64, precision="fp16")) == 54
    assert optimizer_step_bytes(TrainingSetup(8, 64, precision="fp32")) == 40
    assert optimizer_step_bytes(dataclasses.replace(TrainingSetup(8, 64), grad_clip=0.0, optimizer="sgd")) == 26
