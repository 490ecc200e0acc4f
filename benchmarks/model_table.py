"""The cost model's prediction (MFU) for every shipped model on every shipped GPU cluster, at a typical
configuration, with the kernel-level numbers that make each figure plausible.

For each model a typical layout is pinned (TP, PP, DP, ZeRO, sequence parallelism; the search chooses the
micro-batch, schedule and recomputation): data parallel with ZeRO for the small ones, FSDP for the 7-8B
ones (as torchtitan trains them), TP 8 within a node plus PP across nodes for the large ones (as Megatron-LM
and Llama 3 do). The "why" columns are what bounds the MFU, from the device profile's kernel curves:

* gemm: the share of peak the block's GEMMs reach at their shapes (GEMM curve: MAMF ceiling, half size
  fitted to XLA's measured GEMM table);
* attn: the flash kernel's forward share of peak at this sequence length (FlashAttention-2 figures);
* the step's split into compute, TP/DP/PP communication and pipeline bubble.

MFU is at most gemm x (compute share of the step): a model whose GEMMs reach 75% of peak cannot show more
than 75% MFU. ``--quick`` runs one cluster.

    python benchmarks/model_table.py [--quick]
"""

from __future__ import annotations

import dataclasses
import sys
import time

from autoplan.cost.analytic_ops import block_ops
from autoplan.cost.compute import flash_attention_time_s
from autoplan.cost.layer_ops import kernel_times
from autoplan.cost.model_workload import stack_or_default, workload_fn
from autoplan.cost.workload import LayerSplit
from autoplan.errors import SpecError
from autoplan.schema import TrainingSetup, load_cluster, load_model
from autoplan.schema.io import shipped_names
from autoplan.search.planner import search
from autoplan.search.result import predicted_of
from autoplan.search.space import Pins

# model: (nodes, global batch, tp, pp, zero stage, sequence parallel)
TYPICAL = {
    "gpt-tiny": (1, 64, 1, 1, 1, False),
    "llama-tiny": (1, 64, 1, 1, 1, False),
    "gpt2-medium": (1, 256, 1, 1, 1, False),
    "gpt3-1.3b": (1, 256, 1, 1, 1, False),
    "llama2-7b": (1, 64, 1, 1, 3, False),
    "mistral-7b": (1, 64, 1, 1, 3, False),
    "llama3-8b": (1, 64, 1, 1, 3, False),
    "llama3-70b": (8, 256, 8, 2, 1, True),
    "gpt3-175b": (16, 512, 8, 8, 1, True),
    "llama3-405b": (64, 512, 8, 8, 1, True),
}


def gpu_clusters() -> list[str]:
    return [n for n in shipped_names("clusters") if load_cluster(n).device.kind == "gpu"]


def row(model_name: str, cluster_name: str) -> str:
    model = load_model(model_name)
    nodes, gbs, tp, pp, zero, sp = TYPICAL[model_name]
    cluster = dataclasses.replace(load_cluster(cluster_name), num_nodes=nodes)
    training = TrainingSetup(global_batch_size=gbs, seq_len=model.seq_len)
    dp = cluster.num_devices // (tp * pp)
    pins = Pins(tp=tp, pp=pp, dp=dp, zero_stage=zero if dp > 1 else 0, sequence_parallel=sp,
                offload_optimizer=False)
    label = f"{model_name:12s} {cluster_name:14s} {cluster.num_devices:4d} tp{tp} pp{pp} dp{dp:<3d} z{pins.zero_stage}"
    try:
        result = search(model, workload_fn(model, cluster, training), cluster, training, pins, top_k=1)
    except SpecError as err:
        return f"{label}  refused: {err}"
    if result.best is None:
        return f"{label}  nothing fits in {cluster.device.memory_gib:.0f} GiB"
    layout, predicted = predicted_of(result.best, cluster, training)
    stack = stack_or_default()
    ops = block_ops(model, LayerSplit(layout.micro_batch_size, tp, sp), training, stack)
    times = kernel_times(ops, cluster, training, stack)
    gemm_eff = sum(g.flops for g in ops.gemms) / (times.gemm_fwd_s * cluster.device.peak_bf16_tflops * 1e12)
    executed = 0.5 * ops.attention.flops
    attn_eff = executed / (flash_attention_time_s(executed, training.seq_len, cluster.device, "bf16", "fwd")
                           * cluster.device.peak_bf16_tflops * 1e12)
    t = predicted.time
    step = predicted.step_time_s
    comm = (t.tp_comm_s + t.dp_comm_s + t.pp_comm_s + t.zero3_gather_s) / step
    return (f"{label} mbs{layout.micro_batch_size:<2d} {layout.schedule:11s} {100 * predicted.mfu:5.1f}%  "
            f"{predicted.peak_memory_gib:5.1f}/{predicted.capacity_gib:5.1f} GiB  gemm {100 * gemm_eff:3.0f}%  "
            f"attn {100 * attn_eff:3.0f}%  compute {100 * (t.compute_s + t.recompute_s) / step:3.0f}%  "
            f"comm {100 * comm:3.0f}%  bubble {100 * t.bubble_s / step:3.0f}%")


def main() -> int:
    clusters = gpu_clusters()[:1] if "--quick" in sys.argv else gpu_clusters()
    print(f"{'model':12s} {'cluster':14s} {'gpus':>4s} layout            searched          MFU    "
          "memory            why: kernel shares of peak, step split")
    t0 = time.perf_counter()
    for cluster in clusters:
        for model in TYPICAL:
            print(row(model, cluster), flush=True)
        print()
    print(f"({time.perf_counter() - t0:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
