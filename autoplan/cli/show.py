"""``autoplan show plan.yaml``: a plan file as tables (and, with --timeline, the pipeline drawn)."""

from __future__ import annotations

import argparse

from autoplan.report.tables import breakdown_table, layout_label, recompute_label, render
from autoplan.schema import load_plan


def register(subparsers) -> None:
    p = subparsers.add_parser("show", help="print a plan file as tables")
    p.add_argument("plan", help="a plan YAML written by autoplan plan or estimate")
    p.add_argument("--timeline", action="store_true", help="draw the simulated pipeline timeline per rank")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    plan = load_plan(args.plan)
    c = plan.cluster
    print(f"plan for {plan.model.name} on {c.name} ({c.num_nodes} x {c.devices_per_node} {c.device.name}); "
          f"global batch {plan.training.global_batch_size} x {plan.training.seq_len} tokens, {plan.training.precision}")
    print(f"{layout_label(plan)}, recompute {recompute_label(plan)}")
    if plan.solver:
        print(f"solver {plan.solver.name}: {plan.solver.status}, objective {plan.solver.objective:.4f} s, "
              f"{plan.solver.wall_s:.2f} s")
    rows = [[str(s.index), str(s.rank), f"{s.layers[0]}-{s.layers[1] - 1}", str(s.num_layers),
             str(len(s.full_recompute)), str(len(s.selective_recompute))] for s in plan.stages]
    print("\n" + render(rows, ["stage", "pp rank", "layers", "count", "full recompute", "selective"]))
    if plan.predicted:
        print("\n" + breakdown_table(plan.predicted))
    if args.timeline:  # the cost model is imported only to draw: printing a plan stays fast
        from autoplan.cli.common import workload_fn
        from autoplan.cost.estimate import estimate_layout
        from autoplan.report.timeline import draw_timeline

        workload = workload_fn(plan.model, plan.cluster, plan.training)
        _, evaluation, _ = estimate_layout(workload, plan.cluster, plan.training, plan.layout())
        recomputing = {s.index for s in plan.stages if s.full_recompute or s.selective_recompute}
        print("\npipeline timeline (simulated):\n" + draw_timeline(evaluation, recomputing))
    return 0
