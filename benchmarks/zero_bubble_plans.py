"""What the zero-bubble schedules buy on real sizes: each job planned twice, with the classic schedules
only (gpipe, 1f1b, interleaved) and with all six (+ zb1p, zbv, dualpipev), side by side, plus the best
plan that uses a zero-bubble schedule (when the winner does not).

    python benchmarks/zero_bubble_plans.py                 # llama3-70b and llama3-405b, 1,024 and 16,384 H100
    python benchmarks/zero_bubble_plans.py --jobs 70b@128  # one job: MODEL@NODES

Each row: the layout, recomputation, predicted step time, tokens/s, MFU, peak memory per GPU, and the
search's wall time (cost model only; figures are predictions for the autoplan stack, not measurements).
Zero-bubble plans pay two costs the cost model prices (cost/stage_terms.py, cost/simulate.py): the
activations a rank keeps until its weight backward runs, and, with full recomputation, torch 2.13's weight
backward rerunning a recomputed block once per weight group (torchtitan #773: 13 against 128 tokens/s
with activation checkpointing on 512 GPUs).
"""

from __future__ import annotations

import argparse
import dataclasses
import time

from autoplan.cost.model_workload import workload_fn
from autoplan.report.tables import layout_label, recompute_label, render
from autoplan.schema import TrainingSetup, load_cluster, load_model
from autoplan.search.planner import search
from autoplan.search.result import predicted_of
from autoplan.search.space import Pins, SearchLimits
from autoplan.schema.schedule import ZERO_BUBBLE

CLASSIC = ("gpipe", "1f1b", "interleaved")
JOBS = {"70b@128": ("llama3-70b", 128, 1024), "405b@128": ("llama3-405b", 128, 1024),
        "70b@2048": ("llama3-70b", 2048, 2048), "405b@2048": ("llama3-405b", 2048, 2048)}
"""MODEL@NODES: (model, nodes of 8 H100, global batch in sequences of 8,192 tokens)."""


def row(label: str, cluster, training, candidate, wall_s: float) -> list[str]:
    layout, p = predicted_of(candidate, cluster, training)
    return [label, layout_label(layout), recompute_label(layout), f"{p.step_time_s:.3f}", f"{p.tokens_per_s:,.0f}",
            f"{p.mfu:.1%}", f"{p.peak_memory_gib:.1f}", f"{wall_s:.2f}"]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--jobs", default=",".join(JOBS), help=f"comma-separated of {', '.join(JOBS)}")
    args = ap.parse_args()
    cluster0 = load_cluster("dgx-h100-80gb")
    rows = []
    for key in args.jobs.split(","):
        name, nodes, batch = JOBS[key]
        model = load_model(name)
        cluster = dataclasses.replace(cluster0, num_nodes=nodes)
        training = TrainingSetup(global_batch_size=batch, seq_len=8192)
        fn = workload_fn(model, cluster, training)
        found = {}
        for label, schedules in (("classic", CLASSIC), ("all six", CLASSIC + ZERO_BUBBLE)):
            t0 = time.perf_counter()
            result = search(model, fn, cluster, training, Pins(), top_k=1,
                            limits=SearchLimits(schedules=schedules))
            found[label] = (result, time.perf_counter() - t0)
        best_zb = None
        if found["all six"][0].best.config.schedule not in ZERO_BUBBLE:
            t0 = time.perf_counter()
            options = [search(model, fn, cluster, training, Pins(schedule=s), top_k=1) for s in ZERO_BUBBLE]
            options = [r.best for r in options if r.best is not None]
            if options:
                best_zb = (min(options, key=lambda c: c.step_ns), time.perf_counter() - t0)
        job = f"{name} on {nodes * 8:,} H100, {batch} x 8192"
        for label, (result, wall) in found.items():
            rows.append(row(f"{job}: {label}", cluster, training, result.best, wall))
        if best_zb is not None:
            rows.append(row(f"{job}: best zero-bubble", cluster, training, *best_zb))
        print(f"{job}: done", flush=True)
    print()
    print(render(rows, ["job: schedules searched", "layout", "recompute", "step s", "tokens/s", "MFU", "peak GiB",
                        "search s"]))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
