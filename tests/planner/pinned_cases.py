"""The cases the pinned-predictions test re-evaluates: every shipped model on every shipped cluster.

``python -m tests.planner.pinned_cases`` writes ``data/pinned_predictions.json.gz``: for each (model, cluster)
a deterministic sample of layouts (every ZeRO stage, schedule, tp/sp, pp and, where the setup allows it,
cp; recomputation cycling none / selective / full / mixed), each with the cost model's step time, memory
per pipeline rank and time breakdown, and the planner's own choice with its step time. The file is
written once from a known-good cost model; ``test_pinned_predictions.py`` then checks that a change
meant to move no prediction (a refactor) moves none, to 1e-9 relative. A change that does move
predictions regenerates the file and says in its commit which ones moved and why.
"""

from __future__ import annotations

import dataclasses
import gzip
import json
from pathlib import Path

from autoplan.schema import Layout, TrainingSetup, load_cluster, load_model
from autoplan.schema._io import to_dict

DATA = Path(__file__).parent / "data" / "pinned_predictions.json.gz"
MODELS = ("gpt-tiny", "llama-tiny", "gpt2-medium", "gpt3-1.3b", "llama2-7b", "mistral-7b", "llama3-8b",
          "llama3-70b", "gpt3-175b", "llama3-405b")
CLUSTERS = ("cpu-local", "cpu-local-calibrated", "dgx-a100-40gb", "dgx-a100-80gb", "dgx-h100-80gb", "dgx-h200",
            "hgx-h800", "dgx-b200")
LAYOUTS_PER_PAIR = 10


def setup(model_name: str, cluster_name: str):
    """The model, the cluster (2 GPU nodes; one CPU node) and the training setup of one pair."""
    model, cluster = load_model(model_name), load_cluster(cluster_name)
    gpu = cluster.device.kind == "gpu"
    if gpu:
        cluster = dataclasses.replace(cluster, num_nodes=2)
    seq = model.seq_len if model.seq_len <= 4096 else 4096
    training = TrainingSetup(global_batch_size=32 if gpu else 16, seq_len=seq, precision="bf16" if gpu else "fp32")
    return model, cluster, training


def variants(cluster_name: str) -> list[dict]:
    """Training-setup variants beside the default: standard attention (and fp8 where the device has it)."""
    out = [{}, {"attention": "standard"}]
    if load_cluster(cluster_name).device.peak_fp8_tflops > 0:
        out.append({"precision": "fp8"})
    return out


def layout_dict(layout: Layout) -> dict:
    """The configuration, and per stage (layers, selectively recomputed, fully recomputed)."""
    d = {f.name: getattr(layout, f.name) for f in dataclasses.fields(Layout) if f.name != "stages"}
    d["shapes"] = [[s.num_layers, len(s.selective_recompute), len(s.full_recompute)] for s in layout.stages]
    return d


def predicted_dict(p) -> dict:
    return {"step_time_s": p.step_time_s, "peak_memory_gib": p.peak_memory_gib,
            "memory_gib_per_stage": list(p.memory_gib_per_stage),
            "time": to_dict(p.time), "memory": to_dict(p.memory)}  # fields added later omitted at their defaults


def _sample_layouts(model, cluster, training) -> list[Layout]:
    from autoplan.cost.estimate import layout_of
    from autoplan.cost.evaluate import StageShape
    from autoplan.search.space import Pins, SearchLimits, configs, stage_splits

    limits = SearchLimits(min_cp_seq_len=1, max_microbatches=64)
    every = sorted(configs(model, cluster, training, Pins(), limits), key=lambda c: dataclasses.astuple(c))
    if not every:
        return []
    step = max(1, len(every) // LAYOUTS_PER_PAIR)
    chosen = every[::step][:LAYOUTS_PER_PAIR]
    cps = [c for c in every if c.cp > 1]
    if cps and not any(c.cp > 1 for c in chosen):
        chosen.append(cps[len(cps) // 2])
    layouts = []
    for i, config in enumerate(chosen):
        split = stage_splits(model.num_layers, config.num_stages, 0)[0]
        mode = i % 4  # none, selective, full, mixed
        shapes = tuple(StageShape(n, n if mode == 1 else (n // 2 if mode == 3 else 0),
                                  n if mode == 2 else (n - n // 2 if mode == 3 else 0)) for n in split)
        layouts.append(layout_of(config, shapes))
    return layouts


def generate() -> dict:
    """Every case with today's predictions (see the module doc)."""
    from autoplan.cost.model_workload import workload_fn
    from autoplan.cost.estimate import estimate_layout
    from autoplan.search.planner import search
    from autoplan.search.space import Pins

    cases = []
    for model_name in MODELS:
        for cluster_name in CLUSTERS:
            model, cluster, base = setup(model_name, cluster_name)
            for change in variants(cluster_name):
                training = dataclasses.replace(base, **change)
                fn = workload_fn(model, cluster, training)
                for layout in _sample_layouts(model, cluster, training):
                    predicted, _, _ = estimate_layout(fn, cluster, training, layout)
                    cases.append({"model": model_name, "cluster": cluster_name, "training": change,
                                  "layout": layout_dict(layout), "predicted": predicted_dict(predicted)})
            result = search(model, workload_fn(model, cluster, base), cluster, base, Pins(), time_limit_s=60)
            best = result.best
            cases.append({"model": model_name, "cluster": cluster_name, "training": {}, "search": True,
                          "status": result.status,
                          "step_ns": best.step_ns if best else None,
                          "config": to_dict(best.config) if best else None,
                          "shapes": [dataclasses.astuple(s) for s in best.shapes] if best else None})
    return {"about": __doc__.strip().splitlines()[0], "cases": cases}


if __name__ == "__main__":
    data = generate()
    DATA.write_bytes(gzip.compress(json.dumps(data, separators=(",", ":")).encode(), mtime=0))
    print(f"{len(data['cases'])} cases -> {DATA}")
