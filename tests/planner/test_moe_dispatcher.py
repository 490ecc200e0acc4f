"""Stack-level MoE features (issue 31): the deduplicating token dispatcher (``ep_dispatcher``), Megatron's
module-level selective recomputation (``selective_recompute: modules``) and the fp8 saved activations
(``fp8_saved``), priced through cost/layer_ops.py ``SavedTensor``, ``ModuleRerun`` and ``RoutedExchange``."""

from __future__ import annotations

import dataclasses
import importlib.util
import sys
from pathlib import Path

import pytest

from autoplan.cost import moe_ops
from autoplan.cost.analytic_ops import block_ops
from autoplan.cost.comm import hierarchical_exchange_s, routed_copies
from autoplan.cost.layer_ops import (
    RoutedExchange, expert_comm_s, kernel_times, layer_cost, rerun_s, routed_exchange_s, saved_bytes_of,
)
from autoplan.cost.split import LayerSplit
from autoplan.cost.spec_workload import analytic_workload
from autoplan.errors import SpecError
from autoplan.schema import StackProfile, TrainingSetup, load_cluster, load_model, load_stack

MEGATRON = load_stack("megatron")
DEEPEP = load_stack("megatron-deepep")
HAI = load_stack("hai-llm")
H100 = load_cluster("dgx-h100-80gb")
H800 = load_cluster("hgx-h800")
DSV3 = load_model("deepseek-v3")
QWEN30 = load_model("qwen3-30b-a3b")
FP8 = TrainingSetup(global_batch_size=64, seq_len=4096, precision="fp8")
BF16 = TrainingSetup(global_batch_size=64, seq_len=4096)

BLOCKS = [("llama3-8b", LayerSplit(1, tp=2)), ("llama3-8b", LayerSplit(2, tp=4, sequence_parallel=True, cp=2)),
          ("gpt3-1.3b", LayerSplit(1, tp=2, sequence_parallel=True)),
          ("qwen3-30b-a3b", LayerSplit(1, ep=8)),
          ("qwen3-235b-a22b", LayerSplit(1, tp=4, sequence_parallel=True, ep=8)),
          ("deepseek-v3", LayerSplit(1, tp=2, sequence_parallel=True, ep=8)),
          ("deepseek-v3", LayerSplit(1, tp=2, sequence_parallel=True, ep=8, etp=2, cp=2))]


def _block(name: str, split: LayerSplit, training: TrainingSetup, stack: StackProfile, layer: int | None = None):
    model = load_model(name)
    if model.moe is None and model.mla is None:
        return block_ops(model, split, training, stack)
    return moe_ops.any_block_ops(model.num_layers - 1 if layer is None else layer, model, split, training, stack)


@pytest.mark.parametrize("name,split", BLOCKS)
@pytest.mark.parametrize("attention", ["flash", "standard"])
def test_saved_tensors_add_up_to_the_saved_bytes(name, split, attention):
    """Tensor by tensor in the activation dtype, every block (MoE, MLA, dense, each leading dense block) keeps
    exactly the bytes activations.py / moe_ops count for it, so stacks without the new fields price as before."""
    if split.cp > 1 and attention == "standard":
        pytest.skip("context parallelism runs flash attention")
    training = dataclasses.replace(BF16, attention=attention)
    for layer in (None, 0):
        ops = _block(name, split, training, DEEPEP, layer)
        assert ops.saved_tensors and ops.reruns
        assert saved_bytes_of(ops.saved_tensors, 2, frozenset()) == pytest.approx(ops.saved.none, rel=1e-12)
        assert not _block(name, split, training, MEGATRON, layer).saved_tensors  # nothing to list for megatron


def test_stacks_without_the_new_fields_price_from_the_totals():
    """A stack with no fp8 storage and attention-core selective recomputation prices the same LayerCost whether or
    not the layer lists its tensors (the pinned predictions rest on this)."""
    split = LayerSplit(1, tp=2, sequence_parallel=True, ep=8)
    listed = moe_ops.moe_block_ops(DSV3, split, FP8, dataclasses.replace(DEEPEP, ep_dispatcher="alltoall"))
    bare = moe_ops.moe_block_ops(DSV3, split, FP8, MEGATRON)
    assert listed.saved_tensors and not bare.saved_tensors
    assert layer_cost(listed, H800, FP8, MEGATRON, split.dims) == layer_cost(bare, H800, FP8, MEGATRON, split.dims)


def test_routed_experts_keep_fp8_gemm_inputs():
    """Transformer Engine's fp8 GEMMs keep their quantized inputs: the grouped fc1's and fc2's inputs (R h and R f
    rows x widths) and the QKV GEMM's input (its fused norm's output, T h) take 1 byte instead of 2; Qwen3 has no
    shared experts, so the MoE norm's output (kept by the bf16 router) stays; nothing changes in bf16 training."""
    split = LayerSplit(1, ep=8)
    ops = moe_ops.moe_block_ops(QWEN30, split, FP8, DEEPEP)
    rows = FP8.seq_len * QWEN30.moe.experts_per_token
    fp8 = layer_cost(ops, H100, FP8, DEEPEP, split.dims).saved_bytes
    plain = layer_cost(ops, H100, FP8, MEGATRON, split.dims).saved_bytes
    expected = rows * (QWEN30.hidden_size + QWEN30.moe.expert_ffn_size) + FP8.seq_len * QWEN30.hidden_size
    assert plain - fp8 == pytest.approx(expected, rel=1e-12)
    bf16 = moe_ops.moe_block_ops(QWEN30, split, BF16, DEEPEP)
    assert layer_cost(bf16, H100, BF16, DEEPEP, split.dims).saved_bytes == bf16.saved.none


def test_deepseek_caching_keeps_the_swiglu_input_and_attention_output_in_fp8():
    """hai-llm (DeepSeek-V3 sec. 3.3.3) keeps one fp8 copy of the attention output and of the SwiGLU inputs on top
    of Transformer Engine's fp8 GEMM inputs: per MLA MoE block at tp 1 that is a d_v + 2 f_routed R + 2 f_shared
    fewer bytes again (one of two), the shared experts' extra fp8 copy of the MoE norm output counted."""
    split = LayerSplit(1, ep=64)
    ops = moe_ops.moe_block_ops(DSV3, split, FP8, HAI)
    te = dataclasses.replace(HAI, fp8_saved=("gemm_inputs",))
    tokens, m = FP8.seq_len, DSV3
    rows = tokens * m.moe.experts_per_token
    got = (layer_cost(ops, H800, FP8, te, split.dims).saved_bytes
           - layer_cost(ops, H800, FP8, HAI, split.dims).saved_bytes)
    attention_output = tokens * m.num_attention_heads * m.mla.v_head_dim
    swiglu = rows * 2 * m.moe.expert_ffn_size + tokens * 2 * m.moe.shared_width
    assert got == pytest.approx(attention_output + swiglu, rel=1e-12)


def test_module_recomputation_drops_what_each_module_names_and_reruns_its_forward():
    """mla_up_proj drops q, k, v and the latent norms' outputs and reruns the two up-projections with RoPE and
    the latents' gather; moe_act drops the SwiGLU output and reruns the SwiGLU; both are priced as their own
    forward kernels (cost/layer_ops.py ``rerun_s``)."""
    split = LayerSplit(1, tp=2, sequence_parallel=True, ep=8)
    stack = dataclasses.replace(DEEPEP, fp8_saved=(), recompute_modules=("mla_up_proj",))
    ops = moe_ops.moe_block_ops(DSV3, split, BF16, stack)
    cost = layer_cost(ops, H800, BF16, stack, split.dims)
    tokens, a, mla = BF16.seq_len, DSV3.num_attention_heads, DSV3.mla
    own, latents = tokens // 2, mla.q_lora_rank + mla.kv_lora_rank
    dropped = 2 * (tokens * a * (2 * mla.qk_head_dim + mla.v_head_dim) / 2 + own * latents)
    assert cost.saved_bytes - cost.selective_saved_bytes == pytest.approx(dropped, rel=1e-12)
    (up,) = [r.ops for r in ops.reruns if r.module == "mla_up_proj"]
    assert [(g.k, g.n) for g in up.gemms] == [(mla.q_lora_rank, a * mla.qk_head_dim // 2),
                                             (mla.kv_lora_rank, a * (mla.qk_nope_head_dim + mla.v_head_dim) // 2)]
    assert cost.selective_extra_s == pytest.approx(rerun_s(up, H800, BF16, stack, split.dims), rel=1e-12)
    times = kernel_times(up, H800, BF16, stack)
    assert cost.selective_extra_s > times.gemm_fwd_s + times.elementwise_fwd_s  # and the latents' all-gather
    assert cost.selective_extra_flops == pytest.approx(sum(g.flops for g in up.gemms), rel=1e-12)

    act = dataclasses.replace(stack, recompute_modules=("moe_act",))
    cost = layer_cost(ops, H800, BF16, act, split.dims)
    rows = tokens // 2 * DSV3.moe.experts_per_token  # the rank's SP slice, k copies
    assert cost.saved_bytes - cost.selective_saved_bytes == pytest.approx(2 * rows * DSV3.moe.expert_ffn_size,
                                                                          rel=1e-12)
    assert cost.selective_extra_flops == 0.0 and cost.selective_extra_s > 0


def test_a_module_the_block_lacks_does_nothing():
    """mla_up_proj and mlp on a GQA MoE block: nothing dropped, nothing rerun."""
    split = LayerSplit(1, ep=8)
    stack = dataclasses.replace(DEEPEP, recompute_modules=("mla_up_proj", "mlp"))
    cost = layer_cost(moe_ops.moe_block_ops(QWEN30, split, FP8, stack), H100, FP8, stack, split.dims)
    assert cost.selective_saved_bytes == cost.saved_bytes and cost.selective_extra_s == 0.0


def test_whole_moe_recomputation_reruns_the_exchange():
    """``moe`` checkpoints the MoE layer: its rerun includes the router, the experts and the dispatch and combine."""
    split = LayerSplit(1, ep=16)
    stack = dataclasses.replace(DEEPEP, recompute_modules=("moe",))
    ops = moe_ops.moe_block_ops(QWEN30, split, FP8, stack)
    cost = layer_cost(ops, H100, FP8, stack, split.dims)
    (moe,) = [r.ops for r in ops.reruns if r.module == "moe"]
    assert expert_comm_s(moe, H100, split.dims)[0] == pytest.approx(cost.ep_fwd_s, rel=1e-12)
    assert cost.selective_extra_s > cost.ep_fwd_s
    routed = moe_ops.routed_ops(QWEN30, split, FP8, stack).saved_tensors
    dropped = saved_bytes_of(tuple(t for t in routed if "moe" in t.modules), 2, frozenset(stack.fp8_saved))
    assert cost.saved_bytes - cost.selective_saved_bytes == pytest.approx(dropped, rel=1e-12)


def test_dense_mlp_module_on_a_dense_block():
    """``mlp`` on a dense llama block drops the SwiGLU's tensors and its fused norm's output (4 f + h per token
    and TP shard) and reruns the MLP's GEMMs."""
    model, split = load_model("llama3-8b"), LayerSplit(1, tp=2)
    stack = dataclasses.replace(DEEPEP, fp8_saved=(), recompute_modules=("mlp",))
    ops = block_ops(model, split, BF16, stack)
    cost = layer_cost(ops, H100, BF16, stack, split.dims)
    tokens = BF16.seq_len
    expected = 2 * tokens * (4 * model.ffn_hidden_size / 2 + model.hidden_size)
    assert cost.saved_bytes - cost.selective_saved_bytes == pytest.approx(expected, rel=1e-12)
    mlp_flops = sum(g.flops for g in ops.gemms[-2:])
    assert cost.selective_extra_flops == pytest.approx(mlp_flops, rel=1e-12)


def test_the_deduplicating_dispatcher_prices_routed_copies_on_the_groups_nodes():
    """ep_dispatcher deduplicated: no all-to-all; the dispatch and combine cross the network once per remote node
    (routed_copies on the EP group's nodes) and NVLink once per other rank, priced by hierarchical_exchange_s."""
    split = LayerSplit(1, ep=16)
    ops = moe_ops.routed_ops(QWEN30, split, FP8, DEEPEP)
    assert not ops.ep_fwd and len(ops.dispatch_fwd) == 2
    cluster = dataclasses.replace(H100, num_nodes=2)
    tokens, h = FP8.seq_len, QWEN30.hidden_size
    nodes, ranks = routed_copies(128, 8, 16, 8)
    row = 2 * h + 4 * 8  # bf16 row and the k fp32 routing weights
    expected = hierarchical_exchange_s(cluster, tokens * row * nodes, tokens * row * ranks, 16)
    assert routed_exchange_s(ops.dispatch_fwd[0], cluster, split.dims) == pytest.approx(expected, rel=1e-12)
    alltoall = layer_cost(moe_ops.routed_ops(QWEN30, split, FP8, MEGATRON), cluster, FP8, MEGATRON, split.dims)
    dedup = layer_cost(ops, cluster, FP8, DEEPEP, split.dims)
    assert dedup.ep_fwd_s < alltoall.ep_fwd_s  # one network copy for ~4 of NCCL's
    fp8 = moe_ops.routed_ops(QWEN30, split, FP8, dataclasses.replace(DEEPEP, ep_dispatch_dtype="fp8"))
    assert fp8.dispatch_fwd[0].row_bytes == pytest.approx(h + 4 * h / 128 + 4 * 8, rel=1e-12)
    assert fp8.dispatch_fwd[1].row_bytes == 2 * h  # the combine stays in bf16


def test_group_limited_routing_caps_the_nodes_when_a_group_is_a_node():
    """DeepSeek-V3's 8 groups, top 4, at ep 64 on 8-GPU nodes: a group is a node's experts, a token reaches at most
    4 nodes (routed_copies' node_limit); at ep 32 a group spans half a node and the cap is not applied."""
    cluster = dataclasses.replace(H800, num_nodes=8)
    x = RoutedExchange(4096, 14336, 256, 8, groups=8, group_topk=4)
    split = LayerSplit(1, ep=64)
    nodes, ranks = routed_copies(256, 8, 64, 8, node_limit=4)
    expected = hierarchical_exchange_s(cluster, 4096 * 14336 * nodes, 4096 * 14336 * ranks, 64)
    assert routed_exchange_s(x, cluster, split.dims) == pytest.approx(expected, rel=1e-12)
    assert routed_exchange_s(x, cluster, split.dims) < routed_exchange_s(dataclasses.replace(x, groups=0), cluster,
                                                                        split.dims)


def test_stack_fields_validate():
    with pytest.raises(SpecError, match="recompute_modules"):
        dataclasses.replace(MEGATRON, recompute_modules=("moe_act",)).validate()
    with pytest.raises(SpecError, match="recompute_modules"):
        dataclasses.replace(MEGATRON, selective_recompute="modules").validate()
    for stack in (DEEPEP, HAI):
        stack.validate()
        sourced = {s.field for s in stack.sources}
        assert {"ep_dispatcher", "ep_dispatch_dtype", "fp8_saved", "recompute_modules", "selective_recompute",
                "ep_comm_overlap"} <= sourced


def test_the_published_moe_runs_fit_as_planned():
    """Issue 31: none of the published MoE runs is refused (predicted out of memory) on the stack its recipe ran
    on, with its published recomputation (benchmarks/moe_runs.py)."""
    path = Path(__file__).resolve().parents[2] / "benchmarks" / "moe_runs.py"
    spec = importlib.util.spec_from_file_location("moe_runs_under_test", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    runs = [r for r in module.read_yaml(module.DATA)["runs"]
            if r["device"] in module.CLUSTERS and r["measured"]["tokens_per_s_per_gpu"]]
    rows = [module.price(r) for r in runs]
    assert len(rows) == 4 and all(r["fits"] for r in rows)


def test_a_deepep_workload_prices_every_moe_model():
    for name, split in (("deepseek-v3", LayerSplit(1, tp=2, sequence_parallel=True, ep=8, etp=2, cp=2)),
                        ("qwen3-235b-a22b", LayerSplit(1, tp=4, sequence_parallel=True, ep=8)),
                        ("mixtral-8x7b", LayerSplit(1, tp=2, sequence_parallel=True, ep=4))):
        for stack in (DEEPEP, HAI):
            w = analytic_workload(load_model(name), H800, FP8, split, stack)
            assert w.block.ep_fwd_s > 0 and w.block.selective_saved_bytes < w.block.saved_bytes


def test_deepseek_v3_spec_routes_group_limited_through_the_deduplicating_dispatcher():
    """The shipped DeepSeek-V3 spec carries its 8 groups, top 4 (moe.router_groups, router_group_topk): on a
    deduplicating dispatcher at ep 64 over 8 nodes each token crosses the network to at most 4 nodes, priced as
    routed_copies' node limit; the same spec without groups pays for every node its experts lie on. The NCCL
    all-to-all sends every copy either way, so its price does not depend on the groups."""
    split = LayerSplit(1, ep=64)
    cluster = dataclasses.replace(H800, num_nodes=8)
    ops = moe_ops.routed_ops(DSV3, split, FP8, HAI)
    assert {(x.groups, x.group_topk) for x in (*ops.dispatch_fwd, *ops.dispatch_bwd)} == {(8, 4)}
    x = ops.dispatch_fwd[0]
    nodes, ranks = routed_copies(256, 8, 64, 8, node_limit=4)
    expected = hierarchical_exchange_s(cluster, x.rows * x.row_bytes * nodes, x.rows * x.row_bytes * ranks, 64)
    assert routed_exchange_s(x, cluster, split.dims) == pytest.approx(expected, rel=1e-12)
    ungrouped = dataclasses.replace(DSV3, moe=dataclasses.replace(DSV3.moe, router_groups=1, router_group_topk=1))
    free = moe_ops.routed_ops(ungrouped, split, FP8, HAI)
    assert {(x.groups, x.group_topk) for x in free.dispatch_fwd} == {(0, 0)}
    grouped_s = layer_cost(ops, cluster, FP8, HAI, split.dims).ep_fwd_s
    assert grouped_s < layer_cost(free, cluster, FP8, HAI, split.dims).ep_fwd_s
    nccl = [layer_cost(moe_ops.routed_ops(m, split, FP8, MEGATRON), cluster, FP8, MEGATRON, split.dims).ep_fwd_s
            for m in (DSV3, ungrouped)]
    assert nccl[0] == nccl[1]


def test_dualpipev_hides_the_exchange_of_a_stack_that_overlaps_it():
    """DualPipe runs one micro-batch's all-to-alls under the paired one's compute (DeepSeek-V3 sec. 3.2.1):
    ep_overlap_possible holds for dualpipev at any pp, as for interleaved; plain 1F1B and zbv under pp > 1 do not
    (Megatron-Core's condition), and without ep there is nothing to hide."""
    from autoplan.cost.workload import with_exposed_exchange
    from autoplan.schema.plan import ParallelConfig

    base = dict(tp=1, pp=4, dp=2, cp=1, ep=8, etp=1, sequence_parallel=False, zero_stage=1,
                offload_optimizer=False, micro_batch_size=1, num_microbatches=8)
    config = {s: ParallelConfig(**base, schedule=s, virtual_stages=v)
              for s, v in (("dualpipev", 2), ("zbv", 2), ("1f1b", 1), ("interleaved", 2))}
    assert config["dualpipev"].ep_overlap_possible and config["interleaved"].ep_overlap_possible
    assert not config["zbv"].ep_overlap_possible and not config["1f1b"].ep_overlap_possible
    assert not dataclasses.replace(config["dualpipev"], ep=1).ep_overlap_possible
    w = analytic_workload(DSV3, dataclasses.replace(H800, num_nodes=8), FP8, LayerSplit(1, ep=8), HAI)
    assert w.block.ep_hideable_fwd_s > 0
    assert with_exposed_exchange(w, config["dualpipev"]).block.ep_fwd_s == \
        pytest.approx(w.block.ep_fwd_s - w.block.ep_hideable_fwd_s, rel=1e-12)
    assert with_exposed_exchange(w, config["zbv"]) is w
