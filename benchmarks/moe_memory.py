"""Memory per GPU of DeepSeek-V3 (and Qwen3-235B-A22B) under the published layouts: Megatron-LM's formula
against autoplan's own.

Issue 31, must-show 3. For each layout of benchmarks/data/moe_published_layouts.yaml named below, prints

(i)  Megatron-LM's theoretical memory (benchmarks/megatron_moe_memory.py: PR #4687's weight-and-optimizer
     formula, term by term, and the dense activation formula of Korthikanti et al. that Megatron reports next
     to it), on Megatron's "most loaded" rank;
(ii) autoplan's prediction for the same configuration (``estimate_layout`` with the model's workload, the path
     ``autoplan estimate`` takes), its memory breakdown on the rank with the highest peak. If the cost model
     refuses the model (MoE pricing not wired in yet), the refusal is printed in one line.

Both price bf16 weights, fp32 main weights and Adam moments sharded by the distributed optimizer (ZeRO-1)
over DP for the dense parameters and over the experts' DP for the routed experts. Megatron keeps fp32
gradients (4 bytes), autoplan bf16 ones (2 bytes, the ZeRO paper's): the line "the same with bf16
gradients" applies Megatron's terms with 2 so the rest of the difference shows. The published runs used FP8
GEMMs, which change none of these states. Activations are not comparable term by term: Megatron's formula is
the dense one (no experts, no MLA) and autoplan's recomputation "selective" is not the recipes' module list.

    python benchmarks/moe_memory.py
"""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path

import yaml

from megatron_moe_memory import (
    in_flight_microbatches, megatron_args_for, parse_layout, reported_activation_memory,
    weight_and_optimizer_memory, weight_and_optimizer_memory_by_rank,
)

GIB = 2**30
DATA = Path(__file__).resolve().parent / "data" / "moe_published_layouts.yaml"

# model, device (as in the YAML), autoplan cluster, Megatron's sequence_parallel and recompute_granularity as
# the run set them. DeepSeek's own run (DualPipe over PP16) has no TP, hence no sequence parallelism; it
# recomputes RMSNorm and MLA's up-projections (sec. 3.2.3), Megatron's "selective".
CASES = [
    ("deepseek-v3", "H100 (DGX-H100)", "dgx-h100-80gb", True, "selective"),
    ("deepseek-v3", "H800 (hgx-h800)", "hgx-h800", False, "selective"),
    ("qwen3-235b-a22b", "H100 (DGX-H100)", "dgx-h100-80gb", True, None),  # the recipe recomputes nothing
]
# Megatron's H100 recipe lays DeepSeek-V3 out as 'Et|(tt|)*30mL': chunk 0 the embedding + 1 layer, 30 chunks of
# 2 layers, chunk 31 the MTP block and the loss without a decoder layer. autoplan's cost model puts a MoE
# model's leading dense blocks all on stage 0 (never recomputed) and gives every stage a layer, so autoplan's
# side uses its own even split (as ``autoplan estimate`` does), printed with the result.
MEGATRON_LAYOUTS = {("deepseek-v3", "H100 (DGX-H100)"): "Et|(tt|)*30mL"}  # MB-recipe deepseek_v3_pretrain_1024gpu_h100_*


def published(model: str, device: str) -> dict:
    runs = yaml.safe_load(DATA.read_text())["runs"]
    return next(r for r in runs if r["model"] == model and r["device"] == device)


def megatron_side(spec, run: dict, sequence_parallel: bool, recompute: str | None) -> list[str]:
    """Megatron's formula on its most loaded rank, each part named."""
    args = megatron_args_for(spec, tp=run["tp"], pp=run["pp"], ep=run["ep"], etp=run["etp"] or 1,
                             cp=run["cp"] or 1, vpp=run["vpp"], world_size=run["gpus"],
                             seq_length=run["seq_len"], micro_batch_size=run["micro_batch"] or 1,
                             sequence_parallel=sequence_parallel, recompute_granularity=recompute)
    m = weight_and_optimizer_memory(args)
    microbatches = run["global_batch"] // (args.data_parallel_size * args.micro_batch_size)
    act = reported_activation_memory(args, microbatches)
    formula = "SP + selective" if sequence_parallel and recompute == "selective" else "without SP"
    lines = [
        f"  (i) Megatron-LM formula (PR #4687, theoretical_memory_usage.py @ a7c9e8c44a), most loaded rank:",
        f"      params: {m.total_params / 1e9:.1f}B total, {m.active_params / 1e9:.1f}B active; "
        f"DP {args.data_parallel_size}, expert DP {args.expert_data_parallel_size}",
        f"      TP-sharded (attention, dense MLP, shared experts,",
        f"                  MTP block, embedding)  / TP  {m.tp_sharded_params / 1e9:7.3f}B"
        f" x {m.dense_bytes_per_param:.3f} B = {m.tp_sharded_params * m.dense_bytes_per_param / GIB:6.2f} GiB",
        f"      replicated (norms, routers)                 {m.replicated_params / 1e9:7.3f}B"
        f" x {m.dense_bytes_per_param:.3f} B = {m.replicated_params * m.dense_bytes_per_param / GIB:6.2f} GiB",
        f"      routed experts / (ETP x EP)                 {m.expert_params / 1e9:7.3f}B"
        f" x {m.expert_bytes_per_param:.3f} B = {m.expert_bytes / GIB:6.2f} GiB",
        f"      weights + gradients + optimizer             {m.params_on_rank / 1e9:7.3f}B"
        f"               = {m.total_bytes / GIB:6.2f} GiB",
    ]
    if m.other_shard_params is not None:
        lines.append(f"      (another pipeline rank: {m.other_shard_params / 1e9:.3f}B params)")
    layout = MEGATRON_LAYOUTS.get((run["model"], run["device"]))
    if layout is not None:
        by_rank = weight_and_optimizer_memory_by_rank(args, parse_layout(layout))
        lines.append(f"      same terms on the recipe's layout '{layout}', weights + gradients + optimizer per "
                     f"pipeline rank (GiB): " + " ".join(f"{b / GIB:.2f}" for b in by_rank))
    lines += [
        f"      activations (dense formula {formula}, {in_flight_microbatches(args)} micro-batches in flight)"
        f" = {act / GIB:6.2f} GiB",
        f"      total                                                        = {(m.total_bytes + act) / GIB:6.2f} GiB",
    ]
    return lines


def autoplan_layout(run: dict, spec, sequence_parallel: bool, recompute: str):
    """The run's configuration as an autoplan Layout, split as ``autoplan estimate`` splits it
    (autoplan/cli/estimate.py even_layout); ZeRO-1 is Megatron's distributed optimizer."""
    from autoplan.cost.estimate import layout_of
    from autoplan.cost.evaluate import StageShape
    from autoplan.schema import ParallelConfig
    from autoplan.search.space import dense_layers_of, table_splits

    vpp = run["vpp"] or 1
    dp, micro = run["dp"], run["micro_batch"] or 1
    config = ParallelConfig(
        tp=run["tp"], pp=run["pp"], dp=dp, cp=run["cp"] or 1, ep=run["ep"], etp=run["etp"] or 1,
        sequence_parallel=sequence_parallel, zero_stage=1, offload_optimizer=False,
        schedule="interleaved" if vpp > 1 else "1f1b", virtual_stages=vpp, micro_batch_size=micro,
        num_microbatches=run["global_batch"] // (dp * micro))
    dense = dense_layers_of(spec)
    split = table_splits(spec.num_layers, run["pp"] * vpp, 0, dense)[0]  # stage 0: its MoE blocks only
    selective = recompute == "selective"
    shapes = tuple(StageShape(n + (dense if i == 0 else 0), n if selective else 0, 0) for i, n in enumerate(split))
    return layout_of(config, shapes, dense)


def chunks_of(layout, spec) -> list[list[str]]:
    """autoplan's stages as Megatron pipeline-layout chunks (the embedding on stage 0; the MTP block and
    the output layer on the last stage, where autoplan prices them with the head)."""
    last = len(layout.stages) - 1
    return [(["embedding"] if s.index == 0 else []) + ["decoder"] * s.num_layers
            + (["mtp"] * spec.mtp_layers + ["loss"] if s.index == last else []) for s in layout.stages]


def autoplan_side(spec, run: dict, cluster_name: str, sequence_parallel: bool, recompute: str) -> list[str]:
    """autoplan's estimate of the same configuration, or the one-line reason it gives none; then its
    weight/gradient/optimizer bytes per pipeline rank beside Megatron's terms on the same stage split."""
    try:
        from autoplan.cost.estimate import estimate_layout
        from autoplan.cost.model_workload import workload_fn
        from autoplan.schema import TrainingSetup, check_fits, load_cluster

        cluster = load_cluster(cluster_name)
        cluster = dataclasses.replace(cluster, num_nodes=run["gpus"] // cluster.devices_per_node)
        training = TrainingSetup(global_batch_size=run["global_batch"], seq_len=run["seq_len"], precision="bf16")
        layout = autoplan_layout(run, spec, sequence_parallel, recompute)
        check_fits(layout, spec, training, cluster.num_devices)  # the checks ``autoplan estimate`` runs
        predicted, evaluation, _ = estimate_layout(workload_fn(spec, cluster, training), cluster, training, layout)
    except Exception as err:  # MoE pricing is being added to the cost model (issue 31)
        first = str(err).splitlines()[0] if str(err) else ""
        return [f"  (ii) autoplan: no estimate: {type(err).__name__}: {first}"]
    b = predicted.memory
    split = [s.num_layers for s in layout.stages]
    peak = max(evaluation.memory, key=lambda r: evaluation.memory[r].total_bytes)
    states = [evaluation.memory[r].states_bytes / GIB for r in sorted(evaluation.memory)]
    args = megatron_args_for(spec, tp=run["tp"], pp=run["pp"], ep=run["ep"], etp=run["etp"] or 1,
                             cp=run["cp"] or 1, vpp=run["vpp"], world_size=run["gpus"])
    same_split = weight_and_optimizer_memory_by_rank(args, chunks_of(layout, spec))
    bf16_grads = weight_and_optimizer_memory_by_rank(args, chunks_of(layout, spec), gradient_bytes=2)
    experts = getattr(b, "expert_states_gib", 0.0)  # the routed experts' states (sharded over edp)
    listed = b.weights_gib + b.gradients_gib + b.optimizer_gib + experts
    return [
        f"  (ii) autoplan estimate ({cluster_name} x {run['gpus'] // cluster.devices_per_node} nodes, layers per "
        f"stage {split[:4]}...{split[-2:]}, recompute {recompute or 'none'}), rank {peak} has the highest peak:",
        f"      weights + gradients + optimizer {states[peak]:6.2f} GiB, activations "
        f"{evaluation.memory[peak].activations_bytes / GIB:6.2f}, reserve {b.reserve_gib:5.2f}: total "
        f"{b.total_gib:6.2f} GiB of {predicted.capacity_gib:.1f} GiB",
        f"      its MemoryBreakdown: weights {b.weights_gib:.2f} + gradients {b.gradients_gib:.2f} + optimizer "
        f"{b.optimizer_gib:.2f} (non-expert) + expert states {experts:.2f} = {listed:.2f} GiB"
        + ("" if abs(listed - states[peak]) < 0.01 else f" (MISMATCH: the rank's states are {states[peak]:.2f} GiB)"),
        f"      weights + gradients + optimizer per pipeline rank (GiB):",
        f"        autoplan                              " + " ".join(f"{g:6.2f}" for g in states),
        f"        Megatron's terms on autoplan's split  " + " ".join(f"{g / GIB:6.2f}" for g in same_split),
        f"          the same with bf16 gradients (2 B) " + " ".join(f"{g / GIB:6.2f}" for g in bf16_grads),
        f"      total per pipeline rank (GiB): " + " ".join(f"{g:.1f}" for g in predicted.memory_gib_per_stage),
        f"      predicted {predicted.tokens_per_s / run['gpus']:.0f} tokens/s/GPU (published "
        f"{run['measured']['tokens_per_s_per_gpu']}), MFU {predicted.mfu:.1%}",
    ]


def main() -> int:
    from autoplan.schema import load_model

    for model, device, cluster, sequence_parallel, recompute in CASES:
        spec = load_model(model)
        run = published(model, device)
        measured = run["measured"]
        print(f"{model} on {run['gpus']} x {device}: TP{run['tp']} PP{run['pp']} VPP{run['vpp'] or 1} "
              f"EP{run['ep']} ETP{run['etp'] or 1} DP{run['dp']}, micro-batch {run['micro_batch'] or '1 (assumed)'},"
              f" global batch {run['global_batch']} x {run['seq_len']}")
        print(f"  published: {measured.get('tokens_per_s_per_gpu')} tokens/s/GPU, memory "
              f"{measured.get('memory') or 'not published'}")
        lines = (megatron_side(spec, run, sequence_parallel, recompute)
                 + autoplan_side(spec, run, cluster, sequence_parallel, recompute))
        for line in lines:
            print(line)
        print()
    return 0


if __name__ == "__main__":
    sys.exit(main())
