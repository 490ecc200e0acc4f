"""benchmarks/megatron_moe_memory.py reproduces Megatron-LM's MoE-aware weight-and-optimizer formula
(PR #4687, megatron/training/theoretical_memory_usage.py at a7c9e8c44a): the PR's own worked case, a
Mixtral-8x7B case checked by hand, and the mapping from autoplan's ModelSpec."""

import importlib.util
import math
import sys
from pathlib import Path

import pytest

from autoplan.schema import load_model

_PATH = Path(__file__).resolve().parents[2] / "benchmarks" / "megatron_moe_memory.py"
_SPEC = importlib.util.spec_from_file_location("megatron_moe_memory", _PATH)
mm = importlib.util.module_from_spec(_SPEC)
sys.modules[_SPEC.name] = mm  # dataclasses look their module up there
_SPEC.loader.exec_module(mm)


def _pr_args(**changes):
    """The arguments of ``_make_args`` in Megatron's tests/unit_tests/training/test_weight_and_optimizer_memory.py
    (added by PR #4687): 2 layers (dense, MoE), h 8, 4 experts of width 16, a shared expert of width 8."""
    args = mm.MegatronArgs(
        num_layers=2, hidden_size=8, ffn_hidden_size=16, num_attention_heads=2, kv_channels=4,
        padded_vocab_size=32, tensor_model_parallel_size=2, pipeline_model_parallel_size=1, world_size=32,
        swiglu=False, normalization="RMSNorm", untie_embeddings_and_output_weights=False, add_bias_linear=False,
        num_experts=4, moe_ffn_hidden_size=16, moe_router_topk=1, moe_layer_freq=(0, 1),
        moe_shared_expert_intermediate_size=8, expert_model_parallel_size=2, expert_tensor_parallel_size=4)
    return mm.with_changes(args, **changes)


def test_pr_4687_worked_case():
    """The PR's test_weight_and_optimizer_memory_accounts_for_expert_parallelism: PP 2 on 64 ranks."""
    args = _pr_args(pipeline_model_parallel_size=2, world_size=64)
    assert (args.data_parallel_size, args.expert_data_parallel_size) == (16, 4)
    m = mm.weight_and_optimizer_memory(args)
    assert m.tp_sharded_params == ((256 + 256 + 256 + 128) / 2 + 256) / 2  # 352
    assert m.replicated_params == (16 + 16 + 32 + 8) / 2  # 36
    assert m.expert_params == 1024 / 2 / (4 * 2)  # 64
    expected = (352 + 36) * (6 + 12 / 16) + 64 * (6 + 12 / 4)
    assert math.isclose(m.total_bytes, expected) and expected == 3195.0


def test_pr_4687_memory_falls_with_expert_parallelism():
    """The PR's third test: (ep, etp) = (1,1), (2,1), (2,2), (4,2) strictly decrease the memory."""
    totals = [mm.weight_and_optimizer_memory(_pr_args(expert_model_parallel_size=ep,
                                                      expert_tensor_parallel_size=etp)).total_bytes
              for ep, etp in ((1, 1), (2, 1), (2, 2), (4, 2))]
    assert totals == sorted(totals, reverse=True) and len(set(totals)) == 4


def _mixtral_args():
    return mm.MegatronArgs(
        num_layers=32, hidden_size=4096, ffn_hidden_size=14336, num_attention_heads=32, kv_channels=128,
        num_query_groups=8, padded_vocab_size=32000, tensor_model_parallel_size=1, pipeline_model_parallel_size=1,
        world_size=64, num_experts=8, moe_ffn_hidden_size=14336, moe_router_topk=2, moe_layer_freq=1,
        expert_model_parallel_size=8)


def test_mixtral_8x7b_by_hand():
    """Mixtral-8x7B under NeMo's published layout (64 GPUs, TP1 PP1 EP8, distributed optimizer):
    DP = 64, EDP = 64 / 8 = 8. By hand, h = 4096:
    attention 2h^2 (1 + 8/32) = 41,943,040 per layer; experts 8 x 3 x 4096 x 14336 = 1,409,286,144 per layer;
    router 4096 x 8; two RMSNorms 2h; embedding = output layer = 4096 x 32000 (both on the only stage)."""
    m = mm.weight_and_optimizer_memory(_mixtral_args())
    assert m.tp_sharded_params == 32 * 41_943_040 + 2 * 131_072_000  # 1,604,321,280
    assert m.replicated_params == 32 * (8192 + 32768) + 4096  # 1,314,816
    assert m.expert_params == 32 * 1_409_286_144 / 8  # 5,637,144,576
    assert m.total_params == 46_702_792_704  # Mixtral's published 46.7B
    assert (m.dense_bytes_per_param, m.expert_bytes_per_param) == (6 + 12 / 64, 6 + 12 / 8)
    assert m.total_bytes == 1_605_636_096 * 6.1875 + 5_637_144_576 * 7.5  # 52,213,457,664 B = 48.6 GiB
    # the formula before #4687 divided every expert by TP only (here 1) with 6 + 12/DP bytes each:
    # 269 GiB, 5.5x the 48.6 GiB above (issue #4050)
    before = (m.tp_sharded_params + m.replicated_params + 32 * 1_409_286_144) * (6 + 12 / 64)
    assert round(before / 2**30) == 269 and round(m.total_bytes / 2**30, 1) == 48.6


def test_spec_mapping_matches_hand_args():
    """megatron_args_for(mixtral-8x7b) gives the same arguments as the hand-written ones; the formula's
    total for DeepSeek-V3 differs from autoplan's by the MTP module's eh_proj and norms only (Megatron's
    count leaves them out)."""
    spec_args = mm.megatron_args_for(load_model("mixtral-8x7b"), tp=1, pp=1, ep=8, world_size=64)
    assert mm.weight_and_optimizer_memory(spec_args) == mm.weight_and_optimizer_memory(_mixtral_args())
    ds = load_model("deepseek-v3")
    m = mm.weight_and_optimizer_memory(mm.megatron_args_for(ds, tp=2, pp=8, ep=64, vpp=4, world_size=1024))
    h = ds.hidden_size
    eh_proj_and_norms = 2 * h * h + 3 * h
    assert ds.total_params() - m.total_params == pytest.approx(eh_proj_and_norms, abs=2 * h)


def test_activation_formula_korthikanti_table2():
    """compute_activation_memory: s b h (18 + 4 ffn/h) per layer x layers, + 8 s b pp + s b h pp, x the
    interleaved penalty 1 + (pp - 1) / (pp vpp), / TP (a tiny case computed by hand)."""
    args = _pr_args(pipeline_model_parallel_size=2, world_size=64, seq_length=4, micro_batch_size=1,
                    virtual_pipeline_model_parallel_size=2)
    per_layer = 4 * 1 * 8 * (18 + 4 * 16 / 8)  # 832
    expected = (2 * per_layer + 8 * 4 * 2 + 4 * 8 * 2) * (1 + 1 / 4) / 2
    assert mm.activation_memory_with_sp(args, num_microbatches=8) == expected


def test_activation_without_sp_and_the_reported_choice():
    """compute_activation_memory_without_sp: s b h (10 + 24 / t) per layer x layers, + 8 s b pp + s b h pp,
    x min(1, m / pp) without interleaving, x 1.05; report_theoretical_memory takes it unless SP and
    selective recomputation are both on."""
    args = _pr_args(pipeline_model_parallel_size=2, world_size=64, seq_length=4, micro_batch_size=1)
    per_layer = 4 * 1 * 8 * (10 + 24 / 2)  # 704
    expected = (2 * per_layer + 8 * 4 * 2 + 4 * 8 * 2) * min(1, 1 / 2) * 1.05
    assert math.isclose(mm.activation_memory_without_sp(args, num_microbatches=1), expected)
    assert mm.reported_activation_memory(args, 1) == mm.activation_memory_without_sp(args, 1)
    sp = mm.with_changes(args, sequence_parallel=True, recompute_granularity="selective")
    assert mm.reported_activation_memory(sp, 1) == mm.activation_memory_with_sp(sp, 1)


def test_pipeline_layout_terms():
    """Megatron-Bridge's DeepSeek-V3 H100 layout string expands to 32 chunks (embedding + 1 layer, 30 x 2
    layers, MTP + loss); on one stage the per-rank terms equal the formula (its single rank is the most
    loaded), and bf16 gradients take 2 bytes off every parameter."""
    chunks = mm.parse_layout("Et|(tt|)*30mL")
    assert len(chunks) == 32 and chunks[0] == ["embedding", "decoder"] and chunks[-1] == ["mtp", "loss"]
    assert sum(c.count("decoder") for c in chunks) == 61
    args = _mixtral_args()
    one_stage = [["embedding"] + ["decoder"] * 32 + ["loss"]]
    m = mm.weight_and_optimizer_memory(args)
    assert mm.weight_and_optimizer_memory_by_rank(args, one_stage) == [pytest.approx(m.total_bytes)]
    bf16 = mm.weight_and_optimizer_memory_by_rank(args, one_stage, gradient_bytes=2)[0]
    assert bf16 == pytest.approx(m.total_bytes - 2 * m.params_on_rank)
    with pytest.raises(ValueError, match="decoder layers"):
        mm.weight_and_optimizer_memory_by_rank(args, [["embedding"] + ["decoder"] * 31 + ["loss"]])
