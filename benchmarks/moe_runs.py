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

    python benchmarks/moe_runs.py [--json]
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

import dataclasses

from autoplan.cost.estimate import estimate_layout, layout_of
from autoplan.cost.evaluate import StageShape
from autoplan.cost.model_workload import workload_fn
from autoplan.schema import TrainingSetup, load_cluster, load_model, load_stack
from autoplan.schema._io import read_yaml
from autoplan.schema.plan import ParallelConfig
from autoplan.search.space import stage_splits

DATA = Path(__file__).with_name("data") / "moe_published_layouts.yaml"
CLUSTERS = {"H100 (DGX-H100)": "dgx-h100-80gb", "H800 (hgx-h800)": "hgx-h800"}


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
    published = run["measured"]["tokens_per_s_per_gpu"]
    t = predicted.time
    return {"model": run["model"], "gpus": run["gpus"], "device": run["device"], "precision": precision,
            "layout": f"tp{run['tp']} pp{run['pp']} ep{run['ep']} vpp{run['vpp'] or 1} {layout.schedule}",
            "recompute": recompute, "published": published, "predicted": round(tokens),
            "error": tokens / published - 1, "peak_gib": predicted.peak_memory_gib,
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
          f"{'predicted':>9s} {'error':>7s} {'peak GiB':>8s}  step s: compute / recompute / all-to-all / bubble")
    for r in rows:
        print(f"{r['model']:16s} {r['gpus']:5d} {r['precision']:4s} {r['layout']:34s} {r['recompute']:9s} "
              f"{r['published']:9,d} {r['predicted']:9,d} {100 * r['error']:+6.1f}% {r['peak_gib']:7.1f}"
              f"{'' if r['fits'] else '!'}  {r['step_s']:.1f}: {r['compute_s']:.1f} / {r['recompute_s']:.1f} / "
              f"{r['ep_comm_s']:.1f} / {r['bubble_s']:.1f}")
    errors = [abs(r["error"]) for r in rows]
    print(f"median |error| {100 * statistics.median(errors):.1f}%, max {100 * max(errors):.1f}% over {len(rows)} runs; "
          f"{sum(not r['fits'] for r in rows)} predicted not to fit ('!')")


if __name__ == "__main__":
    main()
