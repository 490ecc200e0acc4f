"""A sanity check on modern public runs (bf16, flash attention, FSDP and 3D parallelism): printed against the
cost model's predictions. NOT used to set anything: the device profiles come from kernel-level measurements,
the stacks' fitted parameters from benchmarks/data/stack_runs.yaml and the dev set only.

Each run is predicted for the stack that ran it: torchtitan's A100 runs (early 2024, eager, FSDP2) for
``torchtitan``; Meta's Llama 3 405B runs (its own stack, Megatron-like: TP and PP with fused kernels) for
``megatron`` with Meta's FSDP as section 3.3.2 describes it (``meta_stack``).

Each run is predicted with its published layout pinned (TP, PP, DP, ZeRO stage, and recomputation where
the source gives it) and the rest searched. Throughput is compared as tokens/s per GPU where the source
gives it (torchtitan's WPS) and as TFLOP/s per GPU otherwise (Llama 3; its counting convention is close
to ours, 6N plus attention). Sources:

* torchtitan, docs/performance.md (pytorch/torchtitan): Llama 3 8B / 70B (seq 8192) and Llama 2 13B / 70B
  (seq 4096) on 64 A100 80GB with FSDP2, local batch 1 or 2.
* Llama 3 paper (Dubey et al. 2024, arXiv 2407.21783), Table 4: 405B on 8,192 and 16,384 H100 with TP 8,
  PP 16, seq 8192, 16M tokens per batch, 430 and 400 TFLOP/s per GPU (the same table as Balaji's SC'24 slide,
  glennklockwood.com/garden/llama-3.1). Section 3.3.2 gives the rest of the layout, pinned here: an
  interleaved pipeline schedule (its Figure 6; the number of stages per rank is not published, so it is
  searched) and FSDP that shards parameters, gradients and optimizer states (ZeRO-3), "synchronizes after
  each training step" and does not reshard parameters after the forward. Megatron-Core's own FSDP reduces
  sharded gradients in every backward and gathers parameters again for each micro-batch, so these rows run
  on ``meta_stack``: the ``megatron`` stack's kernels with a stage's parameters gathered once for the step
  and its gradients accumulated whole for one reduction (``pipeline_keeps_params_gathered``,
  ``pipeline_reduces_once``), as torch's pipelining runs FSDP. Nothing is fitted to these rows.

    python benchmarks/modern_runs.py
"""

from __future__ import annotations

import dataclasses
import sys
import time
from dataclasses import dataclass

from autoplan.cost.model_workload import workload_fn
from autoplan.schema import ModelSpec, StackProfile, TrainingSetup, load_cluster, load_model, load_stack
from autoplan.search.planner import search
from autoplan.search.result import predicted_of
from autoplan.search.space import Pins

LLAMA2_13B = ModelSpec(name="llama2-13b", architecture="llama", num_layers=40, hidden_size=5120,
                       ffn_hidden_size=13824, num_attention_heads=40, num_kv_heads=40, vocab_size=32000, seq_len=4096)
LLAMA2_70B = ModelSpec(name="llama2-70b", architecture="llama", num_layers=80, hidden_size=8192,
                       ffn_hidden_size=28672, num_attention_heads=64, num_kv_heads=8, vocab_size=32000, seq_len=4096)


@dataclass(frozen=True)
class Run:
    name: str
    model: ModelSpec
    cluster: str
    nodes: int
    global_batch: int
    pins: Pins
    published: float
    unit: str  # "tok/s/GPU" or "TF/GPU"
    stack: str


def meta_stack() -> StackProfile:
    """Meta's Llama 3 stack as the paper describes it (module doc): Megatron-like kernels, FSDP that keeps a
    stage's parameters gathered for the step and reduces its gradients once, after the step's backwards."""
    return dataclasses.replace(load_stack("megatron"), name="megatron+meta-fsdp", pipeline_reduces_once=True,
                               pipeline_keeps_params_gathered=True)


def stack_of(run: Run) -> StackProfile:
    return meta_stack() if run.stack == "megatron+meta-fsdp" else load_stack(run.stack)


def fsdp(dp: int, mbs: int, recompute: str | None) -> Pins:
    return Pins(tp=1, pp=1, dp=dp, zero_stage=3, micro_batch_size=mbs, recompute=recompute, offload_optimizer=False)


def meta_405b(dp: int) -> Pins:
    """Llama 3 405B's published layout (module doc): TP 8, PP 16 interleaved, FSDP (ZeRO-3)."""
    return Pins(tp=8, pp=16, dp=dp, zero_stage=3, sequence_parallel=True, schedule="interleaved",
                offload_optimizer=False)


RUNS = [
    Run("torchtitan llama3-8b, selective op AC", load_model("llama3-8b"), "dgx-a100-80gb", 8, 64,
        fsdp(64, 1, "selective"), 2973, "tok/s/GPU", "torchtitan"),
    Run("torchtitan llama3-70b, full AC", load_model("llama3-70b"), "dgx-a100-80gb", 8, 64,
        fsdp(64, 1, "full"), 331, "tok/s/GPU", "torchtitan"),
    Run("torchtitan llama2-13b, bs 2, no AC", LLAMA2_13B, "dgx-a100-80gb", 8, 128, fsdp(64, 2, "none"), 2162,
        "tok/s/GPU", "torchtitan"),
    Run("torchtitan llama2-70b, bs 2, full AC", LLAMA2_70B, "dgx-a100-80gb", 8, 128, fsdp(64, 2, "full"), 353,
        "tok/s/GPU", "torchtitan"),
    Run("Llama 3 405B, 8,192 H100 (Table 4)", load_model("llama3-405b"), "dgx-h100-80gb", 1024, 2048,
        meta_405b(dp=64), 430, "TF/GPU", "megatron+meta-fsdp"),
    Run("Llama 3 405B, 16,384 H100 (Table 4)", load_model("llama3-405b"), "dgx-h100-80gb", 2048, 2048,
        meta_405b(dp=128), 400, "TF/GPU", "megatron+meta-fsdp"),
]


def predict(run: Run) -> tuple[float, str]:
    cluster = dataclasses.replace(load_cluster(run.cluster), num_nodes=run.nodes)
    training = TrainingSetup(global_batch_size=run.global_batch, seq_len=run.model.seq_len)
    fn = workload_fn(run.model, cluster, training, stack_of(run))
    result = search(run.model, fn, cluster, training, run.pins, top_k=1)
    if result.best is None:
        return float("nan"), "nothing fits"
    layout, predicted = predicted_of(result.best, cluster, training)
    value = predicted.tokens_per_s / cluster.num_devices if run.unit == "tok/s/GPU" else predicted.tflops_per_gpu
    shape = result.best.shapes
    recompute = sum(s.full for s in shape), sum(s.selective for s in shape)
    return value, (f"{layout.schedule}{layout.virtual_stages if layout.virtual_stages > 1 else ''} "
                   f"mbs{layout.micro_batch_size} full-recompute {recompute[0]}/{run.model.num_layers} "
                   f"MFU {100 * predicted.mfu:.1f}%")


def main() -> int:
    print(f"{'run':40s} {'stack':18s} {'published':>16s} {'predicted':>16s} {'error':>7s}  searched")
    t0 = time.perf_counter()
    for run in RUNS:
        value, note = predict(run)
        error = value / run.published - 1
        print(f"{run.name:40s} {run.stack:18s} {run.published:8.0f} {run.unit:>7s} {value:8.0f} {run.unit:>7s} {100 * error:+6.1f}%  {note}",
              flush=True)
    print(f"({time.perf_counter() - t0:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
