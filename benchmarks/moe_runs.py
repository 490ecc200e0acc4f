"""Published MoE pre-training runs against the cost model: each run's own layout estimated for the stack it ran
on, predicted tokens/s/GPU against the published figure, and the same layout's breakdown (issue 31).

The runs are benchmarks/data/moe_published_layouts.yaml (each with its source). Nothing here is fitted: no
stack field was set from these figures (profiles/stacks/ name their sources). Only the rows on devices this
project has profiles for (H100, H800) are priced; NVIDIA's rows ran on Megatron-Core (stack ``megatron``),
DeepSeek's on its own framework, priced as ``megatron`` too, the nearest shipped stack (DualPipe's overlap of
the all-to-all is what ``ep_comm_overlap`` models; its node-limited fp8 dispatch is not modelled).

What a published layout has that a plan cannot say is approximated and printed: Megatron's module-level
recomputation (``recompute_modules``: DeepSeek-V3's ``mla_up_proj``, ``mlp``) is priced as the nearest the
plan expresses (none when the layout fits without it, else full recomputation of every block), DeepSeek's
unpublished micro-batch as 1, DualPipe as ``dualpipev``, and a custom pipeline layout as the even split.

The columns "as run" price each layout as its own recipe ran it (``RECIPES``, each with its source) where that
differs from what the plan can say: a node-deduplicating dispatcher (HybridEP, DeepEP: cost/moe_ops.py
``routed_copies``, cost/comm.py ``hierarchical_exchange_s``) instead of NCCL's all-to-all, the exchange exposed
where the recipe does not overlap it (or hidden beside the paired micro-batch where it does, DualPipe included),
and only MLA's up-projections recomputed (no recomputation plus their rerun in backward; the peak printed is then
the plan's for no recomputation, which still counts the up-projections' outputs those runs drop). The plan cannot
choose any of these yet (no stack or plan field); the columns show what they are worth. Nothing is fitted.

    python benchmarks/moe_runs.py [--json]
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

import dataclasses

from autoplan.cost.comm import hierarchical_exchange_s
from autoplan.cost.estimate import estimate_layout, layout_of
from autoplan.cost.compute import memory_time_s
from autoplan.cost.layer_ops import kernel_times
from autoplan.cost.moe_ops import mla_attention_ops, routed_copies
from autoplan.cost.evaluate import StageShape
from autoplan.cost.model_workload import workload_fn
from autoplan.schema import TrainingSetup, load_cluster, load_model, load_stack
from autoplan.schema._io import read_yaml
from autoplan.schema.plan import ParallelConfig
from autoplan.search.space import stage_splits

DATA = Path(__file__).with_name("data") / "moe_published_layouts.yaml"
CLUSTERS = {"H100 (DGX-H100)": "dgx-h100-80gb", "H800 (hgx-h800)": "hgx-h800"}
MB = "NVIDIA-NeMo/Megatron-Bridge@067f987d "


@dataclasses.dataclass(frozen=True)
class Recipe:
    """How a published run exchanged its routed tokens, as its recipe or paper states."""

    dispatcher: str
    """"alltoall" (Megatron's MoEAlltoAllTokenDispatcher over NCCL, what the cost model prices) or "dedup" (a
    token crosses the network once per destination node: HybridEP, DeepEP)."""
    overlap: bool
    """The exchange runs beside the paired micro-batch's kernels (overlap_moe_expert_parallel_comm, DualPipe)."""
    node_limit: int | None
    """Node-limited routing: a token's experts lie on at most this many nodes (DeepSeek-V3's groups)."""
    dispatch_bytes: int
    """Bytes per element of the forward dispatch (DeepSeek sends fp8 activations, combines in bf16)."""
    up_proj_recompute: bool
    """Only MLA's up-projections (and RoPE) rerun in backward, every activation else kept (Megatron's
    recompute_modules mla_up_proj, DeepSeek's sec. 3.2.3): priced as no recomputation plus that rerun."""
    source: str


RECIPES = {
    ("deepseek-v3", 2048): Recipe(
        "dedup", True, 4, 1, True,
        "DSV3 arXiv 2412.19437 sec. 3.2.1 (DualPipe hides the all-to-all), 3.2.2 (each token to at most 4 nodes, "
        "crossing IB once per node, forwarded over NVLink), 3.3.3 (activations quantized to fp8 before dispatch, "
        "combine in bf16), 3.2.3 (RMSNorm and MLA up-projections recomputed)"),
    ("deepseek-v3", 1024): Recipe(
        "dedup", False, 4, 2, True,
        MB + "src/megatron/bridge/recipes/deepseek/h100/deepseek_v3.py (moe_flex_dispatcher_backend hybridep, "
        "overlap_moe_expert_parallel_comm False; the fp8cs perf recipe keeps both); HF config n_group 8, topk_group "
        "4 -> moe_router_num_groups / moe_router_group_topk (models/conversion/model_bridge.py); perf_recipes/"
        "deepseek/h100/deepseek_v3.py recompute_modules [mla_up_proj, mlp] (mlp: the 3 dense blocks' MLP only, "
        "Megatron transformer_layer.py; its rerun not priced)"),
    ("qwen3-235b-a22b", 256): Recipe(
        "alltoall", True, None, 2, False, MB + "src/megatron/bridge/perf_recipes/qwen/h100/qwen3_moe.py qwen3_235b_"
        "a22b_pretrain_256gpu_h100_fp8cs_config (alltoall dispatcher, overlap_moe_expert_parallel_comm True)"),
    ("qwen3-30b-a3b", 16): Recipe(
        "dedup", False, None, 2, False, MB + "src/megatron/bridge/perf_recipes/qwen/h100/qwen3_moe.py qwen3_30b_a3b_"
        "pretrain_16gpu_h100_fp8cs_config (flex dispatcher, hybridep backend; CommOverlapConfig(tp_comm_overlap="
        "True) leaves overlap_moe_expert_parallel_comm off, moe_a2a_overlap False)"),
}


def up_projection_s(model, cluster, training: TrainingSetup, split) -> float:
    """Forward seconds of one MLA block's up-projections (q and kv) and RoPE on ``split``: what Megatron's
    ``mla_up_proj`` recomputation reruns in backward (cost/moe_ops.py ``mla_attention_ops``: GEMMs q_down,
    q_up, kv_down, kv_up, o in that order)."""
    ops = mla_attention_ops(model, split, training)
    calls = kernel_times(ops, cluster, training, load_stack("megatron")).gemm_call_fwd_s
    mla, tokens = model.mla, split.micro_batch_size * training.seq_len
    rope = 2 * 2 * tokens * 2 * model.num_attention_heads * mla.qk_head_dim / split.tp
    return calls[1] + calls[3] + memory_time_s(rope, cluster.device)


def recipe_exchange_s(run: dict, model, cluster, training: TrainingSetup, recipe: Recipe) -> tuple[float, float]:
    """(forward, backward) seconds of one MoE block's dispatch and combine under a deduplicating ``recipe`` on
    the run's split (forward: dispatch and combine; backward: their gradients, in bf16)."""
    tp, ep = run["tp"], run["ep"]
    tokens = (run["micro_batch"] or 1) * run["seq_len"] // tp  # the rank's sequence-parallel slice
    moe, h = model.moe, model.hidden_size
    remote_nodes, remote_ranks = routed_copies(moe.num_experts, moe.experts_per_token, ep, cluster.devices_per_node,
                                               recipe.node_limit)

    def once(e: int) -> float:
        # one copy per remote node through the NIC; every copy for another rank crosses NVLink once (on the
        # sending node for the own node's ranks, on the receiving node when forwarded there)
        return hierarchical_exchange_s(cluster, e * tokens * h * remote_nodes, e * tokens * h * remote_ranks, ep)

    return once(recipe.dispatch_bytes) + once(2), 2 * once(2)


def layout_for(run: dict, model, recompute: str):
    """The run's layout as a plan's: its sizes, interleaved when it has virtual stages, DualPipe as dualpipev,
    ZeRO-1 (the distributed optimizer), sequence parallelism under TP, stages split evenly."""
    pp, vpp = run["pp"], run["vpp"] or 1
    schedule = "dualpipev" if "DualPipe" in run.get("notes", "") else ("interleaved" if vpp > 1 else "1f1b")
    virtual = 2 if schedule == "dualpipev" else vpp
    dp = run["gpus"] // (run["tp"] * pp * (run["cp"] or 1))
    mbs = run["micro_batch"] or 1
    config = ParallelConfig(tp=run["tp"], pp=pp, dp=dp, cp=run["cp"] or 1, ep=run["ep"], etp=run["etp"] or 1,
                            sequence_parallel=run["tp"] > 1, zero_stage=1, offload_optimizer=False, schedule=schedule,
                            virtual_stages=virtual, micro_batch_size=mbs,
                            num_microbatches=run["global_batch"] // (dp * mbs))
    split = list(stage_splits(model.num_layers, config.num_stages, 0)[0])
    moved = max(0, model.moe.first_dense_layers - split[0])  # the leading dense blocks sit on stage 0
    split[0] += moved
    for i in range(len(split) - 1, 0, -1):  # taken back from the last stages
        take = min(moved, split[i] - 1)
        split[i] -= take
        moved -= take
    shapes = tuple(StageShape(n, 0, n if recompute == "full" else 0) for n in split)
    return layout_of(config, shapes)


def price(run: dict) -> dict:
    model = load_model(run["model"])
    cluster = load_cluster(CLUSTERS[run["device"]])
    cluster = dataclasses.replace(cluster, num_nodes=run["gpus"] // cluster.devices_per_node)
    precision = "fp8" if "fp8" in run["precision"] else "bf16"
    training = TrainingSetup(global_batch_size=run["global_batch"], seq_len=run["seq_len"], precision=precision)
    stack = load_stack("megatron")
    for recompute in ("none", "full"):
        layout = layout_for(run, model, recompute)
        predicted, _, _ = estimate_layout(workload_fn(model, cluster, training, stack), cluster, training, layout)
        if predicted.peak_memory_gib <= cluster.device.memory_gib * (1 - training.memory_margin) or recompute == "full":
            break
    tokens = run["global_batch"] * run["seq_len"] / (predicted.step_time_s * run["gpus"])
    recipe = RECIPES.get((run["model"], run["gpus"]))
    as_run, as_run_peak, run_estimate = tokens, predicted.peak_memory_gib, predicted
    if recipe is not None:
        fn = workload_fn(model, cluster, training, stack)
        block_s = recipe_exchange_s(run, model, cluster, training, recipe) if recipe.dispatcher == "dedup" else None

        def exchanged(layer):
            """A layer's exchange as the recipe runs it: its own (dedup) times per MoE block it holds, exposed
            in full without overlap, less what the paired micro-batch's kernels hide with it."""
            if layer is None or not layer.ep_fwd_s:
                return layer
            fwd, bwd = layer.ep_fwd_s, layer.ep_bwd_s
            if block_s is not None:
                blocks = round(layer.ep_fwd_s / base.block.ep_fwd_s)  # the head holds the MTP block's
                fwd, bwd = blocks * block_s[0], blocks * block_s[1]
            if recipe.overlap:
                fwd, bwd = fwd - min(fwd, layer.ep_hideable_fwd_s), bwd - min(bwd, layer.ep_hideable_bwd_s)
            return dataclasses.replace(layer, ep_fwd_s=fwd, ep_bwd_s=bwd, ep_hideable_fwd_s=0.0, ep_hideable_bwd_s=0.0)

        def rerun(layer, blocks: int):
            """A layer with ``blocks`` MLA blocks whose up-projections rerun in backward."""
            if layer is None or not up_s:
                return layer
            return dataclasses.replace(layer, bwd_s=layer.bwd_s + blocks * up_s)

        def recipe_fn(split):
            nonlocal base, up_s
            base = fn(split)
            up_s = up_projection_s(model, cluster, training, split) if recipe.up_proj_recompute else 0.0
            return dataclasses.replace(base, block=rerun(exchanged(base.block), 1),
                                       head=rerun(exchanged(base.head), model.mtp_layers),
                                       dense_block=rerun(exchanged(base.dense_block), 1))

        base, up_s = None, 0.0
        run_layout = layout_for(run, model, "none") if recipe.up_proj_recompute else layout
        run_estimate, _, _ = estimate_layout(recipe_fn, cluster, training, run_layout)
        as_run = run["global_batch"] * run["seq_len"] / (run_estimate.step_time_s * run["gpus"])
        as_run_peak = run_estimate.peak_memory_gib
    published = run["measured"]["tokens_per_s_per_gpu"]
    t = predicted.time
    return {"model": run["model"], "gpus": run["gpus"], "device": run["device"], "precision": precision,
            "layout": f"tp{run['tp']} pp{run['pp']} ep{run['ep']} vpp{run['vpp'] or 1} {layout.schedule}",
            "recompute": recompute, "published": published, "predicted": round(tokens),
            "error": tokens / published - 1, "as_run": round(as_run), "as_run_error": as_run / published - 1,
            "as_run_peak_gib": as_run_peak, "as_run_step_s": run_estimate.step_time_s,
            "as_run_compute_s": run_estimate.time.compute_s, "as_run_ep_comm_s": run_estimate.time.ep_comm_s,
            "as_run_bubble_s": run_estimate.time.bubble_s,
            "exchange": (f"{recipe.dispatcher}{'+overlap' if recipe.overlap else ''}"
                         f"{' up_proj' if recipe.up_proj_recompute else ''}") if recipe else "",
            "peak_gib": predicted.peak_memory_gib,
            "fits": predicted.peak_memory_gib <= cluster.device.memory_gib * (1 - training.memory_margin),
            "compute_s": t.compute_s, "recompute_s": t.recompute_s, "ep_comm_s": t.ep_comm_s,
            "bubble_s": t.bubble_s, "step_s": predicted.step_time_s}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", action="store_true", help="print the rows as JSON")
    args = parser.parse_args()
    runs = [r for r in read_yaml(DATA)["runs"] if r["device"] in CLUSTERS and r["measured"]["tokens_per_s_per_gpu"]]
    rows = [price(r) for r in runs]
    if args.json:
        print(json.dumps(rows, indent=1))
        return
    print(f"{'model':16s} {'gpus':>5s} {'prec':4s} {'layout':34s} {'recompute':9s} {'published':>9s} "
          f"{'predicted':>9s} {'error':>7s} {'peak GiB':>8s}  step s: compute / recompute / all-to-all / bubble"
          f"  | as run: exchange, recompute  tokens/s  error  peak GiB")
    for r in rows:
        print(f"{r['model']:16s} {r['gpus']:5d} {r['precision']:4s} {r['layout']:34s} {r['recompute']:9s} "
              f"{r['published']:9,d} {r['predicted']:9,d} {100 * r['error']:+6.1f}% {r['peak_gib']:7.1f}"
              f"{'' if r['fits'] else '!'}  {r['step_s']:.1f}: {r['compute_s']:.1f} / {r['recompute_s']:.1f} / "
              f"{r['ep_comm_s']:.1f} / {r['bubble_s']:.1f}  | {r['exchange']:26s} {r['as_run']:9,d} "
              f"{100 * r['as_run_error']:+6.1f}% {r['as_run_peak_gib']:6.1f}")
    errors = [abs(r["error"]) for r in rows]
    print(f"median |error| {100 * statistics.median(errors):.1f}%, max {100 * max(errors):.1f}% over {len(rows)} runs; "
          f"{sum(not r['fits'] for r in rows)} predicted not to fit ('!')")
    as_run = [abs(r["as_run_error"]) for r in rows]
    print(f"as run (each recipe's exchange and recomputation): median |error| {100 * statistics.median(as_run):.1f}%, "
          f"max {100 * max(as_run):.1f}%")


if __name__ == "__main__":
    main()
