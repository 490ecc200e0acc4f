"""Predicted vs published throughput on the dev set (benchmarks/data/dev_runs.yaml).

For each run, ``autoplan plan`` is run with the published TP, PP, DP, ZeRO stage, sequence parallelism,
recomputation, micro-batch size and interleaving pinned (Narayanan's from the paper's launch script, see
dev_runs.yaml) and the DP all-reduce overlapped or not as the run's DDP implementation does; what a run
does not publish is searched among what Megatron-LM could run (micro-batch size; 1F1B, or interleaved
with layers divisible into pp x v equal chunks; equal stages). The prediction is compared as the source
counts it (Narayanan: TFLOP/s with recomputation, i.e. hardware_tflops_per_gpu; Korthikanti: MFU).
Every run is predicted for the stack that ran it: ``megatron-lm`` (profiles/stacks/megatron-lm.yaml,
Megatron-LM 2021-22 with Apex kernels), whose GEMM efficiency is fitted to these runs
(``python benchmarks/stack_runs.py --fit`` prints the fit and each run's leave-one-out error).
Prints a table and the largest relative error.

    python benchmarks/dev_set.py
"""

from __future__ import annotations

import dataclasses
import sys
import time
from pathlib import Path

import yaml

from autoplan.cost.model_workload import workload_fn
from autoplan.schema import ModelSpec, StackProfile, TrainingSetup, load_cluster, load_stack
from autoplan.search.planner import search
from autoplan.search.result import plan_of, solver_info
from autoplan.search.space import Pins, SearchLimits

RUNS = Path(__file__).parent / "data" / "dev_runs.yaml"
STACK = "megatron-lm"


def load_runs() -> list[dict]:
    return yaml.safe_load(RUNS.read_text())


def predict_run(run: dict, cluster_name: str = "dgx-a100-80gb", stack: StackProfile | None = None):
    model = ModelSpec(name=run["name"], architecture="gpt", num_layers=run["layers"], hidden_size=run["hidden_size"],
                      ffn_hidden_size=run["ffn_hidden_size"], num_attention_heads=run["heads"],
                      num_kv_heads=run["heads"], vocab_size=run["vocab_size"], seq_len=run["seq_len"], dropout=0.1)
    cluster = dataclasses.replace(load_cluster(cluster_name), num_nodes=run["gpus"] // 8)
    training = TrainingSetup(global_batch_size=run["global_batch_size"], seq_len=run["seq_len"], precision="fp16",
                             attention="standard", overlap_grad_reduce=overlaps_grad_reduce(run),
                             grad_accumulation_fusion=False)
    pins = Pins(tp=run["tp"], pp=run["pp"], dp=run["dp"], zero_stage=run["zero_stage"],
                sequence_parallel=run["sp"], recompute=run["recompute"], offload_optimizer=False)
    fn = workload_fn(model, cluster, training, stack or load_stack(STACK))
    best = None
    if run.get("micro_batch_size"):  # published (Korthikanti): the micro-batch and the interleaving are known
        pins = dataclasses.replace(pins, micro_batch_size=run["micro_batch_size"])
        v = run.get("virtual_stages") or 1
        schedules = [{"schedule": "interleaved" if v > 1 else "1f1b", "virtual_stages": v}]
    else:
        schedules = megatron_schedules(run["layers"], run["pp"])
    for schedule in schedules:
        result = search(model, fn, cluster, training, dataclasses.replace(pins, **schedule), top_k=1,
                        limits=MEGATRON_SPLITS)
        if result.best is not None and (best is None or result.best.step_ns < best.best.step_ns):
            best = result
    if best is None:
        return None, result
    return plan_of(model, cluster, training, best.best, solver_info(best, "bnb")), best


def overlaps_grad_reduce(run: dict) -> bool:
    """torch DDP (``--DDP-impl torch``) all-reduces buckets during the backward of the last micro-batch
    (Megatron runs the others under ``no_sync``); Megatron's ``local`` DDP all-reduces after the backward."""
    return run["ddp_impl"] == "torch"


# Megatron-LM gives every pipeline stage the same number of layers: no uneven splits
MEGATRON_SPLITS = SearchLimits(max_edge_trim=0)


def megatron_schedules(layers: int, pp: int) -> list[dict]:
    """The schedules Megatron-LM 2021-22 could run: 1F1B, and the interleaved schedule with v model chunks
    per rank only when the layers divide into pp * v equal chunks (its ``num_layers % (pp * v) == 0``)."""
    options = [{"schedule": "1f1b", "virtual_stages": 1}]
    if pp > 1:
        options += [{"schedule": "interleaved", "virtual_stages": v} for v in range(2, SearchLimits().max_virtual_stages + 1)
                    if layers % (pp * v) == 0]
    return options


def error_of(run: dict, plan) -> tuple[float, float, str]:
    """(published, predicted, unit) as the run's source counts it."""
    if run["counted_as"] == "hardware_tflops":
        return run["published_tflops_per_gpu"], plan.predicted.hardware_tflops_per_gpu, "TF"
    return run["published_mfu_pct"], 100 * plan.predicted.mfu, "%MFU"


def main() -> int:
    runs = load_runs()
    print(f"stack: {STACK} (profiles/stacks/{STACK}.yaml)")
    header = f"{'run':45s} {'tp':>3s} {'pp':>3s} {'dp':>3s} {'searched':28s} {'published':>10s} {'predicted':>10s} {'error':>7s}"
    print(header)
    print("-" * len(header))
    worst = 0.0
    t0 = time.perf_counter()
    for run in runs:
        plan, result = predict_run(run)
        if plan is None:
            print(f"{run['name']:45s} nothing fits")
            worst = float("inf")
            continue
        published, predicted, unit = error_of(run, plan)
        error = predicted / published - 1
        worst = max(worst, abs(error))
        searched = f"{plan.schedule}{'' if plan.virtual_stages == 1 else plan.virtual_stages} mbs{plan.micro_batch_size} m{plan.num_microbatches}"
        print(f"{run['name']:45s} {plan.tp:3d} {plan.pp:3d} {plan.dp:3d} {searched:28s} {published:8.1f}{unit:>2s} "
              f"{predicted:8.1f}{unit:>2s} {100 * error:+6.1f}%")
    print(f"\nlargest |error|: {100 * worst:.1f}%  ({time.perf_counter() - t0:.1f} s)")
    return 0 if worst <= 0.15 else 1


if __name__ == "__main__":
    sys.exit(main())
