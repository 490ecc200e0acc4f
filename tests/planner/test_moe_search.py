"""Expert parallelism in the search (issue 31): the branch-and-bound search and brute force agree on random
small Mixture-of-Experts problems; expert states are sharded over the experts' own data-parallel group;
--ep pins; the leading dense blocks stay on stage 0; the bounds' schedule facts hold."""

import dataclasses
import math
import random

import pytest

from autoplan.cost.evaluate import StageShape, evaluate, plan_shapes, table_shapes
from autoplan.cost.layer_ops import LayerCost
from autoplan.cost.split import LayerSplit
from autoplan.cost.stage_table import device_table, with_schedule
from autoplan.cost.tables import build_table, host_model
from autoplan.cost.workload import Workload
from autoplan.errors import SpecError
from autoplan.schema import Cluster, Link, ModelSpec, TrainingSetup, load_cluster, load_model, load_stack
from autoplan.schema.moe import MoESpec
from autoplan.schema.schedule import build_schedule
from autoplan.cost.simulate import inflight_peaks
from autoplan.search.bounds import least_inflight
from autoplan.search.planner import search
from autoplan.search.space import Pins, expert_options, groups, table_splits

from .random_problems import DEVICE, config, workload_of

SEED = 3131


def random_moe_problem(rng: random.Random):
    """A llama-like MoE model of 2-5 blocks (experts, top-k, expert width, shared experts and leading dense
    blocks drawn at random) on 4 to 16 devices, with a device memory that binds for some layouts."""
    heads = rng.choice([2, 4])
    h = 64 * heads
    layers = rng.randint(2, 5)
    experts = rng.choice([2, 4, 8])
    moe = MoESpec(num_experts=experts, experts_per_token=rng.randint(1, min(2, experts)),
                  expert_ffn_size=rng.choice([64, 128]), num_shared_experts=rng.choice([0, 0, 1]),
                  first_dense_layers=rng.choice([0, 0, 1, min(2, layers - 1)]))
    model = ModelSpec(name="random-moe", architecture="llama", num_layers=layers, hidden_size=h,
                      ffn_hidden_size=4 * h, num_attention_heads=heads, num_kv_heads=heads, vocab_size=1024,
                      seq_len=256, moe=moe)
    per_node, nodes = rng.choice([(2, 2), (4, 1), (4, 2), (8, 1), (8, 2)])
    memory = rng.choice([0.03, 0.06, 0.2, 80.0])
    cluster = Cluster(name="random", device=dataclasses.replace(DEVICE, memory_gib=memory), devices_per_node=per_node,
                      num_nodes=nodes, intra_node=Link(100.0, 5.0), inter_node=Link(10.0, 20.0))
    training = TrainingSetup(global_batch_size=rng.choice([4, 8]), seq_len=256, attention="flash",
                             overlap_grad_reduce=rng.random() < 0.5, moe_imbalance=rng.choice([1.0, 1.0, 1.5]))
    pins = Pins(recompute=rng.choice([None, None, "full", "none"]),
                schedule=rng.choice([None, None, "1f1b", "gpipe", "interleaved", "zb1p", "zbv"]))
    # megatron hides the experts' exchange behind the paired micro-batch where the layout allows it: tables
    # that do and tables that do not, one search
    stack = load_stack(rng.choice(["autoplan", "megatron"]))
    if stack.schedules and pins.schedule not in (None, *stack.schedules):  # megatron runs 1f1b, interleaved
        pins = dataclasses.replace(pins, schedule=None)
    return model, cluster, training, pins, stack


def moe_agree_on(problems: int, seed: int = SEED) -> tuple[int, int, int]:
    """(problems with a plan, without one, with a plan using ep > 1); asserts bnb's K best step times, and its
    optimum's configuration, equal brute force's."""
    rng = random.Random(seed)
    agreed = infeasible = expert_parallel = 0
    for i in range(problems):
        model, cluster, training, pins, stack = random_moe_problem(rng)
        workload = workload_of(model, cluster, training, stack)
        fast = search(model, workload, cluster, training, pins, solver="bnb", top_k=3)
        slow = search(model, workload, cluster, training, pins, solver="bruteforce", top_k=3)
        assert (fast.best is None) == (slow.best is None), i
        if fast.best is None:
            infeasible += 1
            continue
        assert fast.status == "OPTIMAL" and fast.bound_ns == fast.best.step_ns
        assert [c.step_ns for c in fast.ranked] == [c.step_ns for c in slow.ranked], (i, model.moe, cluster, pins)
        assert fast.best.config == slow.best.config and fast.best.shapes == slow.best.shapes, i
        assert fast.best.shapes[0].layers >= model.moe.first_dense_layers  # stage 0 holds the dense blocks
        agreed += 1
        expert_parallel += any(c.config.ep > 1 for c in fast.ranked)
    return agreed, infeasible, expert_parallel


def test_bnb_and_bruteforce_agree_on_50_random_moe_problems():
    """50 problems with ep (and etp under tp) searched: the same K best as trying every layout."""
    agreed, infeasible, expert_parallel = moe_agree_on(50)
    assert agreed >= 25 and infeasible >= 1  # memory binds in some; the comparison is not vacuous
    assert expert_parallel >= 10  # and expert parallelism is among the best plans of many


@pytest.mark.slow
def test_bnb_and_bruteforce_agree_on_200_more_random_moe_problems():
    agreed, _, expert_parallel = moe_agree_on(200, SEED + 1)
    assert agreed >= 100 and expert_parallel >= 40


# expert states -----------------------------------------------------------------------------------------------

def hand_layer(params: float, experts: float = 0.0, **times) -> LayerCost:
    base = dict(fwd_s=1e-3, bwd_s=2e-3, fwd_flops=1e9, saved_bytes=1e6, selective_saved_bytes=5e5,
                full_saved_bytes=1e5, selective_extra_s=1e-4, selective_extra_flops=1e8, tp_fwd_s=0.0,
                tp_bwd_s=0.0)
    return LayerCost(params=params, expert_params=experts, **{**base, **times})


def hand_workload(split: LayerSplit, dense_layers: int = 0, num_layers: int = 8) -> Workload:
    from autoplan.cost.model_workload import stack_or_default

    return Workload(split=split, stack=stack_or_default(), num_layers=num_layers,
                    embedding=hand_layer(1e6), block=hand_layer(1.2e8, 1.0e8, ep_fwd_s=3e-4, ep_bwd_s=6e-4),
                    head=hand_layer(1e6), tied_copy_params=0.0, output_bytes=1e6, logits_transient_bytes=1e6,
                    dense_layers=dense_layers, dense_block=hand_layer(5e7) if dense_layers else None)


def test_expert_states_are_sharded_over_the_expert_data_parallel_group():
    """16 ranks, tp 2, dp 8, ep 4: edp = 2 x 8 / 4 = 4. Under mixed-precision Adam with ZeRO-1 a block holds
    2 + 4 bytes per parameter of weights and gradients (the default stack accumulates gradients in fp32, its
    reduce dtype) and 12 / N of optimizer state, N = dp x cp = 8 for its 20M dense parameters and N = edp = 4
    for its 100M expert parameters (Megatron-Core's expert data-parallel group)."""
    cluster = load_cluster("dgx-h100-80gb")
    cluster = dataclasses.replace(cluster, num_nodes=2)
    training = TrainingSetup(global_batch_size=64, seq_len=1024)
    c = config(tp=2, pp=1, dp=8, ep=4, sequence_parallel=True, zero_stage=1, num_microbatches=8)
    assert c.dims.edp == 4
    w = hand_workload(LayerSplit(micro_batch_size=1, tp=2, sequence_parallel=True, ep=4))
    t = device_table(w, cluster, training, c)
    expected = 2e7 * (2 + 4 + 12 / 8) + 1e8 * (2 + 4 + 12 / 4)
    assert t.block_state_bytes == math.ceil(expected)
    assert t.expert_edp == 4
    # the optimizer steps 20M / 8 + 100M / 4 parameters of the block
    dense_only = device_table(dataclasses.replace(w, block=dataclasses.replace(w.block, expert_params=0.0)),
                              cluster, training, c)
    assert t.optim_block_ns == pytest.approx(dense_only.optim_block_ns * (2e7 / 8 + 1e8 / 4) / (1.2e8 / 8), rel=1e-6)
    # the all-to-all is on the block's critical path: forward and backward grow by it
    assert t.block.fwd_ns - dense_only.block.fwd_ns == 0 and t.block.fwd_ns == round((1e-3 + 3e-4) * 1e9)
    assert t.block.bwd_ns == round((2e-3 + 6e-4) * 1e9)


def test_expert_gradients_reduce_even_without_data_parallelism():
    """tp 4, dp 1, ep 2: the experts are replicated over edp = 2 ranks of the TP group, so their gradients are
    all-reduced there although dp x cp = 1 (the table says it reduces)."""
    cluster = load_cluster("dgx-h100-80gb")
    c = config(tp=4, pp=2, dp=1, ep=2, sequence_parallel=True)
    w = hand_workload(LayerSplit(micro_batch_size=1, tp=4, sequence_parallel=True, ep=2))
    t = device_table(w, cluster, TrainingSetup(global_batch_size=8, seq_len=1024), c)
    assert c.dp_cp == 1 and t.expert_edp == 2 and t.reduces and t.sync_block_ns > 0


def test_leading_dense_blocks_are_stage_zero_constants():
    """Stage 0 holds the 2 dense blocks besides its MoE blocks; the table counts MoE blocks only, and a plan's
    counts convert back and forth; recomputing a dense block is refused."""
    cluster = load_cluster("dgx-h100-80gb")
    training = TrainingSetup(global_batch_size=8, seq_len=1024)
    c = config(tp=1, pp=2, dp=1, ep=1)
    w = hand_workload(LayerSplit(micro_batch_size=1), dense_layers=2)
    t = device_table(w, cluster, training, c)
    dense = device_table(dataclasses.replace(w, block=w.dense_block, dense_layers=0, dense_block=None), cluster,
                         training, c)
    assert t.num_layers == 6 and t.dense_layers == 2
    assert t.dense.fwd_ns == 2 * dense.block.fwd_ns and t.dense_state_bytes == 2 * dense.block_state_bytes
    plan = (StageShape(4, 0, 2), StageShape(4, 1, 0))
    assert plan_shapes(t, table_shapes(t, plan)) == plan
    ev = evaluate(t, table_shapes(t, plan))
    # stage 0's forward: embedding + 2 dense blocks + 2 MoE blocks
    assert ev.timeline is not None
    with pytest.raises(ValueError, match="dense"):
        table_shapes(t, (StageShape(4, 1, 2), StageShape(4)))
    with pytest.raises(ValueError, match="dense"):
        table_shapes(t, (StageShape(1), StageShape(7)))
    # or all of them fully recomputed: their forward again in their backward, only their inputs kept, and one
    # block's activations rebuilt at a time on the rank holding stage 0
    f = device_table(w, cluster, training, c, dense_full=True)
    rerun = round(w.dense_block.fwd_s * 1e9)
    assert f.dense.bwd_ns - t.dense.bwd_ns == 2 * rerun and f.dense.fwd_ns == t.dense.fwd_ns
    assert f.dense_act_bytes == 2 * math.ceil(w.dense_block.full_saved_bytes)
    assert f.dense_transient_bytes == math.ceil(w.dense_block.saved_bytes - w.dense_block.full_saved_bytes)
    plan = (StageShape(4, 0, 3), StageShape(4))  # the 2 dense blocks and 1 MoE block fully recomputed
    assert table_shapes(f, plan) == (StageShape(2, 0, 1), StageShape(4)) and plan_shapes(f, table_shapes(f, plan)) == plan
    with pytest.raises(ValueError, match="dense"):
        table_shapes(f, (StageShape(4, 0, 1), StageShape(4)))
    kept, redone = evaluate(t, (StageShape(2, 0, 1), StageShape(4))), evaluate(f, (StageShape(2, 0, 1), StageShape(4)))
    assert redone.memory[0].fixed_bytes - kept.memory[0].fixed_bytes == f.dense_transient_bytes


def test_table_splits_keep_the_dense_blocks_on_stage_zero():
    assert table_splits(8, 2, 0) == [(4, 4)]
    assert table_splits(8, 2, 0, dense_layers=2) == [(2, 4)]
    # 7 blocks on 4 stages, 3 dense: no split of the family gives stage 0 three blocks, so it holds them alone
    splits = table_splits(7, 4, 2, dense_layers=3)
    assert splits and all(split[0] == 0 and sum(split) == 4 and min(split[1:]) >= 1 for split in splits)


def test_a_schedule_change_needs_no_new_table():
    cluster = load_cluster("dgx-h100-80gb")
    training = TrainingSetup(global_batch_size=32, seq_len=1024)
    w = hand_workload(LayerSplit(micro_batch_size=1, tp=2, sequence_parallel=True, ep=2), dense_layers=1)
    base = config(tp=2, pp=4, dp=1, ep=2, sequence_parallel=True, zero_stage=0, num_microbatches=16)
    t = device_table(w, cluster, training, base)
    for dense_full in (False, True):
        t = device_table(w, cluster, training, base, dense_full)
        for schedule, v in (("gpipe", 1), ("interleaved", 2), ("zb1p", 1), ("zbv", 2), ("dualpipev", 2)):
            c = dataclasses.replace(base, schedule=schedule, virtual_stages=v)
            derived = with_schedule(t, w, cluster, c)
            assert derived == device_table(w, cluster, training, c, dense_full), (schedule, dense_full)
            back = dataclasses.replace(base, schedule="1f1b")
            assert with_schedule(derived, w, cluster, back) == device_table(w, cluster, training, back, dense_full)


# the search space ---------------------------------------------------------------------------------------------

def test_expert_options_and_pins():
    model = load_model("qwen3-30b-a3b")  # 128 experts of width 768
    options = expert_options(model, tp=2, cp=1, dp=4, sequence_parallel=True, pins=Pins())
    assert {ep for ep, _ in options} == {1, 2, 4, 8} and {etp for _, etp in options} == {1, 2}
    assert all(8 % (ep * etp) == 0 for ep, etp in options)
    assert expert_options(model, 2, 1, 4, True, Pins(ep=4)) == [(4, 1), (4, 2)]
    assert expert_options(model, 2, 1, 4, False, Pins()) == []  # MoE under TP needs sequence parallelism
    dense = load_model("llama3-8b")
    assert expert_options(dense, 2, 1, 4, True, Pins()) == [(1, 1)]


def test_ep_pins_the_search_and_a_dense_model_refuses_it():
    rng = random.Random(7)
    model, cluster, training, _, _ = random_moe_problem(rng)
    model = dataclasses.replace(model, moe=dataclasses.replace(model.moe, num_experts=4))
    cluster = dataclasses.replace(cluster, devices_per_node=4, num_nodes=1,
                                  device=dataclasses.replace(DEVICE, memory_gib=80.0))
    result = search(model, workload_of(model, cluster, training), cluster, training, Pins(ep=4), top_k=3)
    assert result.ranked and {c.config.ep for c in result.ranked} == {4}
    dense = dataclasses.replace(model, moe=None)
    with pytest.raises(SpecError, match="--ep 2"):
        next(groups(dense, cluster, training, Pins(ep=2)))


def test_dense_models_search_no_expert_dimension():
    model = load_model("llama3-8b")
    cluster = dataclasses.replace(load_cluster("dgx-h100-80gb"), num_nodes=2)
    training = TrainingSetup(global_batch_size=64, seq_len=4096)
    assert {(g.ep, g.etp) for g in groups(model, cluster, training, Pins())} == {(1, 1)}


# the bounds' facts about schedules ------------------------------------------------------------------------------

def test_least_inflight_holds_for_every_rank_of_every_schedule():
    """bounds.least_inflight (what the search prunes memory with before it builds a schedule's lists) is at
    most what ``inflight_peaks`` finds on each rank, over a grid of pp, v and m (including m < pp and m not
    a multiple of pp)."""
    checked = 0
    for kind, vs in (("gpipe", [1]), ("1f1b", [1]), ("interleaved", [2, 3, 4]), ("zb1p", [1, 2, 3, 4]),
                     ("zbv", [2]), ("dualpipev", [2])):
        for pp in (1, 2, 3, 4, 5, 8):
            for v in vs:
                for m in sorted({1, 2, pp - 1, pp, pp + 1, 2 * pp - 1, 2 * pp, 2 * pp + 1, 3 * pp + 1} - {0}):
                    try:
                        orders = build_schedule(kind, pp, v, m)
                    except Exception:  # noqa: BLE001 - a combination the schedule refuses
                        continue
                    peaks = inflight_peaks(orders)
                    for r in range(pp):
                        held = max(sum(vec.values()) for vec in peaks[r])
                        assert held >= least_inflight(kind, pp, v, m, r), (kind, pp, v, m, r)
                        stage0 = max(vec.get(0, 0) for vec in peaks[0])
                        assert stage0 >= (m if kind == "gpipe" else min(pp, m)), (kind, pp, v, m)
                    checked += 1
    assert checked > 150


def test_bnb_and_bruteforce_agree_on_moe_tiny_on_the_cpu_host():
    """The CPU test bed's host re-prices layers (cost/cpu_host/); tables.py puts the all-to-all and the dense
    block back: both solvers agree on moe-tiny over 4 gloo ranks, and the all-to-all is in the step."""
    model = load_model("moe-tiny")
    cluster = load_cluster("cpu-local-calibrated")
    training = TrainingSetup(global_batch_size=8, seq_len=64, precision="fp32")
    workload = workload_of(model, cluster, training)
    fast = search(model, workload, cluster, training, Pins(ep=2), top_k=3)
    slow = search(model, workload, cluster, training, Pins(ep=2), solver="bruteforce", top_k=3)
    assert fast.ranked and [c.step_ns for c in fast.ranked] == [c.step_ns for c in slow.ranked]
    split = LayerSplit(micro_batch_size=1, ep=2)
    w = workload(split)
    c = config(tp=1, pp=2, dp=2, ep=2, num_microbatches=4)
    on_host = build_table(w, cluster, training, c)
    without = host_model(cluster).apply(device_table(w, cluster, training, c), w, training)
    assert w.block.ep_fwd_s > 0
    assert on_host.block.fwd_ns - without.block.fwd_ns == round(w.block.ep_fwd_s * 1e9)
    assert on_host.full_extra_ns - without.full_extra_ns == round(w.block.ep_fwd_s * 1e9)
    assert on_host.dense_layers == 1 and on_host.dense.fwd_ns != without.dense.fwd_ns  # the host's own pricing
