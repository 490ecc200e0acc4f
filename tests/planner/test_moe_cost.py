"""MoE blocks, multi-head latent attention and multi-token prediction in the analytic cost model
(autoplan/cost/moe_ops.py): FLOPs, parameters, messages and links, the grouped-GEMM curve, saved bytes."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest

from autoplan.cost import moe_ops
from autoplan.cost.analytic_ops import block_ops
from autoplan.cost.spec_workload import analytic_workload
from autoplan.cost.comm import collective_time_s, group_link, hierarchical_exchange_s
from autoplan.cost.flops import model_flops_per_step
from autoplan.cost.layer_ops import kernel_times, layer_cost
from autoplan.cost.split import LayerSplit
from autoplan.errors import SpecError
from autoplan.schema import ParallelDims, TrainingSetup, load_cluster, load_model, load_stack
from autoplan.schema.moe import MoESpec

STACK = load_stack("megatron")
H800 = load_cluster("hgx-h800")
DSV3 = load_model("deepseek-v3")
TRAIN_4K = TrainingSetup(global_batch_size=64, seq_len=4096)


def executed_gemm_flops(ops) -> float:
    return sum(g.flops for g in ops.gemms)


def test_top1_single_expert_prices_the_dense_mlp_plus_router():
    """One expert of width f, top-1, ep 1: the routed GEMMs are the dense SwiGLU's (gate and up as one [h -> 2f]
    GEMM), plus the [h -> 1] router."""
    f = 256
    base = load_model("moe-tiny")
    model = replace(base, moe=MoESpec(num_experts=1, experts_per_token=1, expert_ffn_size=f))
    dense = replace(base, moe=None, ffn_hidden_size=f)
    training = TrainingSetup(global_batch_size=8, seq_len=64)
    split = LayerSplit(2)
    tokens = 2 * 64
    moe = moe_ops.moe_block_ops(model, split, training, STACK)
    router = 2.0 * tokens * base.hidden_size * 1
    assert executed_gemm_flops(moe) == pytest.approx(executed_gemm_flops(block_ops(dense, split, training, STACK))
                                                      + router, rel=1e-12)
    assert moe.params == pytest.approx(dense.layer_params() + base.hidden_size, rel=1e-12)  # + the router row


def test_deepseek_v3_moe_block_flops_are_its_active_params():
    """fwd_flops = 2 x (active block params but norm weights) x tokens + the MLA core 2 b s^2 a (d_qk + d_v)."""
    split = LayerSplit(1, ep=64)
    cost = layer_cost(moe_ops.moe_block_ops(DSV3, split, TRAIN_4K, STACK), H800, TRAIN_4K, STACK, split.dims)
    mla, h, s, a = DSV3.mla, DSV3.hidden_size, 4096, DSV3.num_attention_heads
    norms = 2 * h + mla.q_lora_rank + mla.kv_lora_rank
    active = DSV3.block_params(3, active=True) - norms
    core = 2.0 * s * s * a * (mla.qk_head_dim + mla.v_head_dim)
    assert cost.fwd_flops == pytest.approx(2.0 * active * s + core, rel=1e-12)


def test_mfu_counts_the_balanced_share_under_imbalance():
    """The busiest rank executes 1.5 x its routed GEMMs; MFU's count does not change."""
    split = LayerSplit(1, ep=8)
    skewed = replace(TRAIN_4K, moe_imbalance=1.5)
    even = moe_ops.moe_block_ops(DSV3, split, TRAIN_4K, STACK)
    busy = moe_ops.moe_block_ops(DSV3, split, skewed, STACK)
    routed = moe_ops.routed_ops(DSV3, split, TRAIN_4K)
    experts = routed.gemms[1].flops + routed.gemms[2].flops
    assert executed_gemm_flops(busy) - executed_gemm_flops(even) == pytest.approx(0.5 * experts, rel=1e-12)
    assert busy.model_flops == pytest.approx(even.model_flops, rel=1e-12)


def test_deepseek_v3_expert_params_at_ep64():
    w = analytic_workload(DSV3, H800, TRAIN_4K, LayerSplit(1, ep=64), STACK)
    assert w.block.expert_params == 256 / 64 * 3 * 7168 * 2048
    assert w.head.expert_params == w.block.expert_params  # the MTP module's MoE block
    assert w.dense_layers == 3 and w.dense_block.expert_params == 0


def test_whole_model_params_at_tp1_ep1():
    """Every layer's params add up to the spec's total (the MTP module inside the head; the padded vocabulary)."""
    w = analytic_workload(DSV3, H800, TRAIN_4K, LayerSplit(1), STACK)
    h, padded = DSV3.hidden_size, DSV3.padded_vocab_size(1)
    layers = w.dense_layers * w.dense_block.params + (DSV3.num_layers - w.dense_layers) * w.block.params
    total = w.embedding.params + layers + w.head.params
    assert total == pytest.approx(DSV3.total_params() + 2 * (padded - DSV3.vocab_size) * h, rel=1e-12)
    assert w.head.params == pytest.approx(h + padded * h + DSV3.mtp_params(), rel=1e-12)


def test_mtp_keeps_an_embedding_copy_on_the_last_stage():
    """Megatron's GPTModel builds the embedding on the MTP stage too (gpt_model.py ``mtp_process``)."""
    w = analytic_workload(DSV3, H800, TRAIN_4K, LayerSplit(1, tp=2, sequence_parallel=True, ep=8), STACK)
    assert w.tied_copy_params == DSV3.padded_vocab_size(2) * DSV3.hidden_size / 2


def test_model_flops_per_step_equals_the_layers_sum():
    """flops.py's whole-model count (MoE by active params, MLA, MTP) is the per-layer costs' sum."""
    w = analytic_workload(DSV3, H800, TRAIN_4K, LayerSplit(1, ep=8), STACK)
    per_micro = (w.embedding.fwd_flops + w.dense_layers * w.dense_block.fwd_flops
                 + (DSV3.num_layers - w.dense_layers) * w.block.fwd_flops + w.head.fwd_flops)
    assert 3 * per_micro == pytest.approx(model_flops_per_step(DSV3, 1, 4096, DSV3.padded_vocab_size(1)), rel=1e-12)


def test_all_to_all_bytes():
    """Dispatch and combine each move the rank's T k hidden rows (T = b s / (cp tp)), the weights 4 T k bytes
    more; both scale with the busiest rank's load."""
    split = LayerSplit(2, tp=2, sequence_parallel=True, cp=2, ep=8)
    routed = moe_ops.routed_ops(DSV3, split, TRAIN_4K)
    t, k, h = 2 * 4096 // 4, 8, 7168
    assert [m.size_bytes for m in routed.ep_fwd] == [2 * t * k * h, 4 * t * k, 2 * t * k * h]
    assert sorted(m.size_bytes for m in routed.ep_bwd) == sorted(m.size_bytes for m in routed.ep_fwd)
    skewed = moe_ops.routed_ops(DSV3, split, replace(TRAIN_4K, moe_imbalance=1.25))
    assert skewed.ep_fwd[0].size_bytes == 1.25 * 2 * t * k * h


def test_context_parallel_halves_expert_rows_and_messages():
    one = moe_ops.routed_ops(DSV3, LayerSplit(1, ep=8), TRAIN_4K)
    two = moe_ops.routed_ops(DSV3, LayerSplit(1, ep=8, cp=2), TRAIN_4K)
    assert [g.m for g in two.gemms] == [g.m / 2 for g in one.gemms]
    assert [m.size_bytes for m in two.ep_fwd] == [m.size_bytes / 2 for m in one.ep_fwd]
    assert two.saved.none == one.saved.none / 2


def _ep_time(ep: int) -> tuple[float, float]:
    split = LayerSplit(1, ep=ep)
    routed = moe_ops.routed_ops(DSV3, split, TRAIN_4K)
    cost = layer_cost(routed, H800, TRAIN_4K, STACK, split.dims)
    return cost.ep_fwd_s, sum(m.size_bytes for m in routed.ep_fwd)


def test_all_to_all_inside_a_node_runs_on_nvlink():
    n = 8
    t, total = _ep_time(n)
    link = H800.intra_node
    latency = 3 * (H800.collective_latency_us + (n - 1) * link.latency_us) * 1e-6
    assert t == pytest.approx(latency + (n - 1) / n * total / (link.bandwidth_gb_per_s * 1e9), rel=1e-12)


def test_all_to_all_across_nodes_runs_on_the_network():
    """ep 16 on 8-GPU nodes: each rank sends 8/16 of its buffer off its node through its own NIC (46 GB/s), the
    on-node 7/16 over NVLink meanwhile; the NIC share sets the time."""
    n, g = 16, 8
    t, total = _ep_time(n)
    inter = H800.inter_node
    latency = 3 * (H800.collective_latency_us + (n - 1) * inter.latency_us) * 1e-6
    assert t == pytest.approx(latency + (n - g) / n * total / (inter.bandwidth_gb_per_s * 1e9), rel=1e-12)
    across, inside = (group_link(H800, ParallelDims(ep=ep).expert_span("ep")) for ep in (16, 8))
    assert collective_time_s("all_to_all", 1e9, across) > 2 * collective_time_s("all_to_all", 1e9, inside)


def test_expert_tp_gathers_on_its_own_group():
    """etp 2: the dispatcher's all-gather and reduce-scatter of etp x the received rows, on the etp group."""
    split = LayerSplit(1, ep=8, etp=2)
    routed = moe_ops.routed_ops(DSV3, split, TRAIN_4K)
    rows = 2 * 4096 * 8 * 7168
    assert [m.kind for m in routed.etp_fwd] == ["all_gather", "all_gather", "reduce_scatter"]
    assert routed.etp_fwd[0].size_bytes == 2 * rows
    assert routed.expert_params == 256 / 8 * 3 * 7168 * 2048 / 2
    fc1 = routed.gemms[1]  # each of the 32 local experts: the tokens of the 8 x 2 ranks that share it, top 8 of 256
    assert (fc1.m, fc1.n, fc1.k, fc1.count) == (4096 * 8 * 2 * 8 / 256, 2 * 2048 // 2, 7168, 32)


def test_grouped_gemm_time_per_flop_rises_as_tokens_per_expert_fall():
    per_flop = []
    for seq in (8192, 2048, 512, 128):
        routed = moe_ops.routed_ops(DSV3, LayerSplit(1, ep=8), replace(TRAIN_4K, seq_len=seq))
        experts = replace(routed, gemms=routed.gemms[1:])
        per_flop.append(kernel_times(experts, H800, TRAIN_4K, STACK).gemm_fwd_s / executed_gemm_flops(experts))
    assert per_flop == sorted(per_flop) and per_flop[-1] > 2 * per_flop[0]


def test_saved_bytes_grow_linearly_with_top_k():
    """Each extra expert per token keeps one more copy of the routed rows: e h + e 3 f + 4 bytes per token."""
    def saved(k: int) -> float:
        model = replace(DSV3, moe=replace(DSV3.moe, experts_per_token=k))
        return moe_ops.moe_block_ops(model, LayerSplit(1, ep=8), TRAIN_4K, STACK).saved.none

    s1, s2, s4, s8 = (saved(k) for k in (1, 2, 4, 8))
    slope = 4096 * (2 * (7168 + 3 * 2048) + 4)
    assert (s2 - s1, s4 - s2, s8 - s4) == pytest.approx((slope, 2 * slope, 4 * slope), rel=1e-12)


def test_attention_and_mlp_parts_make_the_dense_block():
    """A dense llama block assembled from moe_ops' parts is analytic_ops.block_ops's (what the MoE block shares)."""
    llama = load_model("llama3-8b")
    training = TrainingSetup(global_batch_size=8, seq_len=2048)
    cases = [(model, split, stack) for model in (llama, replace(llama, qk_norm=True))
             for split in (LayerSplit(1), LayerSplit(2, tp=4), LayerSplit(2, tp=4, sequence_parallel=True),
                           LayerSplit(1, tp=2, cp=2, sequence_parallel=True))
             for stack in (STACK, load_stack("autoplan"))]
    for model, split, stack in cases:
        whole = block_ops(model, split, training, stack)
        mlp = moe_ops.sequence_split(lambda s: moe_ops.swiglu_ops(model.ffn_hidden_size, model, s, training, stack),
                                     split)
        parts = moe_ops.merge(moe_ops.attention_ops(model, split, training, stack), mlp)
        assert parts.params == pytest.approx(whole.params, rel=1e-12)
        assert sorted(g.flops for g in parts.gemms) == pytest.approx(sorted(g.flops for g in whole.gemms), rel=1e-12)
        assert parts.elementwise_bytes == pytest.approx(whole.elementwise_bytes, rel=1e-12)
        assert parts.elementwise_kernels == whole.elementwise_kernels
        assert (parts.saved.none, parts.saved.full) == pytest.approx((whole.saved.none, whole.saved.full), rel=1e-12)
        assert sorted(parts.tp_fwd + parts.tp_bwd, key=repr) == sorted(whole.tp_fwd + whole.tp_bwd, key=repr)
        assert parts.ring == whole.ring


def test_every_shipped_moe_model_prices():
    for name, split, seq in (("moe-tiny", LayerSplit(2, ep=4), 64),
                             ("mixtral-8x7b", LayerSplit(1, tp=2, sequence_parallel=True, ep=4), 4096),
                             ("qwen3-30b-a3b", LayerSplit(1, ep=8, cp=2), 4096),
                             ("qwen3-235b-a22b", LayerSplit(1, tp=4, sequence_parallel=True, ep=8), 4096),
                             ("deepseek-v3", LayerSplit(1, tp=2, sequence_parallel=True, ep=8, etp=2, cp=2), 4096)):
        model = load_model(name)
        w = analytic_workload(model, H800, replace(TRAIN_4K, seq_len=seq), split, STACK)
        assert w.block.ep_fwd_s > 0 and w.block.expert_params > 0
        assert (w.dense_block is not None) == (model.moe.first_dense_layers > 0)


def test_interleaved_moe_layers_are_refused():
    model = replace(DSV3, moe=replace(DSV3.moe, layer_frequency=2))
    with pytest.raises(SpecError, match="moe.layer_frequency"):
        analytic_workload(model, H800, TRAIN_4K, LayerSplit(1), STACK)


def test_a_stack_that_overlaps_the_exchange_hides_it_where_megatron_can():
    """Megatron-Core overlaps the experts' all-to-all with the paired micro-batch's kernels under interleaved
    stages (or pp = 1), not under plain 1F1B with pp > 1: the estimate's ep_comm_s is the raw exchange less
    min(exchange, the other direction's kernels) per layer there, the raw exchange elsewhere, and the raw
    exchange for this project's runtime, which overlaps nothing. The table and the breakdown agree."""
    from autoplan.cost.estimate import estimate_layout, layout_of
    from autoplan.cost.evaluate import StageShape
    from autoplan.cost.model_workload import workload_fn
    from autoplan.schema.plan import ParallelConfig

    model, cluster = load_model("qwen3-30b-a3b"), replace(load_cluster("dgx-h100-80gb"), num_nodes=2)
    training = TrainingSetup(global_batch_size=64, seq_len=4096)

    def ep_comm(stack: str, schedule: str) -> tuple[float, float]:
        v = 2 if schedule == "interleaved" else 1
        config = ParallelConfig(tp=1, pp=2, dp=8, cp=1, ep=8, etp=1, sequence_parallel=False, zero_stage=1,
                                offload_optimizer=False, schedule=schedule, virtual_stages=v, micro_batch_size=1,
                                num_microbatches=8)
        per = model.num_layers // (2 * v)
        layout = layout_of(config, tuple(StageShape(per, 0, 0) for _ in range(2 * v)))
        predicted, _, table = estimate_layout(workload_fn(model, cluster, training, load_stack(stack)), cluster,
                                              training, layout)
        return predicted.time.ep_comm_s, table.block.fwd_ns + table.block.bwd_ns

    raw, raw_block = ep_comm("autoplan", "interleaved")
    megatron_1f1b, _ = ep_comm("megatron", "1f1b")
    megatron_interleaved, block = ep_comm("megatron", "interleaved")
    split = LayerSplit(1, ep=8)
    cost = analytic_workload(model, cluster, training, split, STACK).block
    assert cost.ep_hideable_fwd_s == pytest.approx(min(cost.ep_fwd_s, cost.bwd_s), rel=0.05)
    assert 0 < cost.ep_hideable_bwd_s <= cost.ep_bwd_s
    per_block = (cost.ep_hideable_fwd_s + cost.ep_hideable_bwd_s) * 1e9
    assert megatron_1f1b == pytest.approx(raw, rel=0.02)  # the same exchange, not hidden
    assert megatron_interleaved < 0.8 * megatron_1f1b
    assert megatron_interleaved == pytest.approx(megatron_1f1b * (1 - per_block / ((cost.ep_fwd_s + cost.ep_bwd_s)
                                                                                   * 1e9)), rel=0.02)
    assert raw_block - block > 0.5 * per_block  # the table's block carries the same hiding (kernels differ a little)


def _brute_copies(experts: int, k: int, ep: int, per_node: int, node_limit: int | None) -> tuple[float, float]:
    """The same expectation by enumeration, for a token on rank 0: the chosen nodes drawn uniformly, then k
    distinct experts among theirs."""
    from itertools import combinations
    nodes, per_rank = ep // per_node, experts // ep
    node_sets = list(combinations(range(nodes), node_limit or nodes))
    remote_nodes = remote_ranks = 0.0
    for chosen in node_sets:
        pool = [x for x in range(experts) if x // per_rank // per_node in chosen]
        picks = list(combinations(pool, k))
        for pick in picks:
            ranks = {x // per_rank for x in pick}
            remote_ranks += len(ranks - {0}) / len(picks) / len(node_sets)
            remote_nodes += len({r // per_node for r in ranks} - {0}) / len(picks) / len(node_sets)
    return remote_nodes, remote_ranks


@pytest.mark.parametrize("experts,k,ep,per_node,limit", [(8, 2, 4, 2, None), (16, 3, 8, 2, 2), (12, 2, 6, 3, 1),
                                                         (8, 1, 8, 8, None)])
def test_deduplicated_copies_equal_enumeration(experts, k, ep, per_node, limit):
    got = moe_ops.routed_copies(experts, k, ep, per_node, limit)
    assert got == pytest.approx(_brute_copies(experts, k, ep, per_node, limit), rel=1e-12)


def test_deduplicated_dispatch_sends_a_token_once_per_remote_node():
    """Qwen3-30B-A3B on 2 nodes (ep 16, top 8 of 128): almost every token has an expert on the other node, so
    one network copy (against 4 of NCCL's all-to-all); DeepSeek-V3 at ep 64 with at most 4 of 8 nodes: 3.18."""
    nodes, _ = moe_ops.routed_copies(128, 8, 16, 8)
    assert nodes == pytest.approx(1 - math.comb(64, 8) / math.comb(128, 8), rel=1e-12)
    nodes, _ = moe_ops.routed_copies(256, 8, 64, 8, node_limit=4)
    assert nodes == pytest.approx(4 * (1 - math.comb(96, 8) / math.comb(128, 8)) * 7 / 8, rel=1e-12)
    assert moe_ops.routed_copies(128, 8, 8, 8)[0] == 0.0


def test_hierarchical_exchange_runs_at_the_slower_path():
    h100 = load_cluster("dgx-h100-80gb")
    net, nvl = 1e8, 2e8
    expected = (h100.collective_latency_us + h100.inter_node.latency_us) * 1e-6 + max(
        net / (h100.inter_node.bandwidth_gb_per_s * 1e9), nvl / (h100.intra_node.bandwidth_gb_per_s * 1e9))
    assert hierarchical_exchange_s(h100, net, nvl, 16) == pytest.approx(expected, rel=1e-12)
    assert hierarchical_exchange_s(h100, net, nvl, 1) == 0.0
