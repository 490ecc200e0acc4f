"""The plan the search picks for one job under each shipped stack, side by side: what changes when the
software that runs the plan changes.

    python benchmarks/stack_plans.py                       # llama3-70b on 1,024 H100, 1,024 x 8,192 tokens
    python benchmarks/stack_plans.py --model llama3-8b --nodes 8 --global-batch-size 256

For each stack: the layout, step time, MFU, peak memory (allocated and what the allocator reserves) and
the three largest terms of the step besides compute, then the runner-up of the same search, so a reader
sees by how much the winner wins under that stack.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import time

from autoplan.cost.model_workload import workload_fn
from autoplan.report.tables import layout_label, recompute_label
from autoplan.schema import TrainingSetup, load_cluster, load_model, load_stack
from autoplan.schema.io import shipped_names
from autoplan.search.planner import search
from autoplan.search.result import predicted_of
from autoplan.search.space import Pins

TERMS = ("recompute_s", "tp_comm_s", "pp_comm_s", "zero3_gather_s", "bubble_s", "dp_comm_s", "optimizer_s", "cp_comm_s")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="llama3-70b")
    p.add_argument("--cluster", default="dgx-h100-80gb")
    p.add_argument("--nodes", type=int, default=128)
    p.add_argument("--global-batch-size", type=int, default=1024)
    p.add_argument("--seq-len", type=int, default=8192)
    args = p.parse_args(argv)
    model = load_model(args.model)
    cluster = dataclasses.replace(load_cluster(args.cluster), num_nodes=args.nodes)
    training = TrainingSetup(global_batch_size=args.global_batch_size, seq_len=args.seq_len)
    print(f"{model.name} on {cluster.num_devices} x {cluster.device.name}, {args.global_batch_size} x {args.seq_len} "
          f"tokens per step, bf16")
    header = f"{'stack':28s} {'layout':46s} {'recompute':24s} {'step s':>7s} {'MFU':>6s} {'GiB':>5s} {'resv':>5s}  largest other terms"
    print(header)
    print("-" * len(header))
    t0 = time.perf_counter()
    for name in shipped_names("stacks"):
        stack = load_stack(name)
        result = search(model, workload_fn(model, cluster, training, stack), cluster, training, Pins(), top_k=2)
        if result.best is None:
            print(f"{name:28s} nothing fits")
            continue
        ranked = [predicted_of(c, cluster, training) for c in result.ranked]
        layout, pred = ranked[0]
        terms = sorted(((getattr(pred.time, t), t.removesuffix("_s")) for t in TERMS), reverse=True)[:3]
        other = ", ".join(f"{label} {100 * v / pred.step_time_s:.0f}%" for v, label in terms if v > 0)
        print(f"{name:28s} {layout_label(layout):46s} {recompute_label(layout):24s} {pred.step_time_s:7.2f} "
              f"{100 * pred.mfu:5.1f}% {pred.peak_memory_gib:5.1f} {pred.memory.reserved_gib:5.1f}  {other}")
        if len(ranked) > 1:
            second, p2 = ranked[1]
            print(f"{'  runner-up':28s} {layout_label(second):46s} {recompute_label(second):24s} {p2.step_time_s:7.2f} "
                  f"{100 * p2.mfu:5.1f}% {p2.peak_memory_gib:5.1f} {p2.memory.reserved_gib:5.1f}  "
                  f"+{100 * (p2.step_time_s / pred.step_time_s - 1):.1f}%")
    print(f"({time.perf_counter() - t0:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
