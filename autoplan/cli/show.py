"""``autoplan show plan.yaml``: a plan file as tables; with --timeline the pipeline drawn in text, with
--trace a Chrome/Perfetto trace of the simulated step, with --png a Gantt chart and memory per rank."""

from __future__ import annotations

import argparse
import sys

from autoplan.report.recheck import recheck
from autoplan.report.tables import breakdown_table, layout_label, recompute_label, render
from autoplan.schema import load_plan
from autoplan.schema._files import check_writable


def register(subparsers) -> None:
    p = subparsers.add_parser("show", help="print a plan file as tables, draw its simulated step")
    p.add_argument("plan", help="a plan YAML written by autoplan plan or estimate")
    p.add_argument("--timeline", action="store_true", help="draw the simulated pipeline timeline per rank")
    p.add_argument("--trace", metavar="OUT.json",
                   help="write the simulated step as a Chrome/Perfetto trace (one process per pipeline rank)")
    p.add_argument("--png", metavar="OUT.png",
                   help="draw the pipeline per rank and memory per rank against capacity (needs matplotlib)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    if args.png:
        from autoplan.report.figures import require_matplotlib
        require_matplotlib()
    if args.trace is not None:  # written at the end: refused now, before anything is drawn
        check_writable(args.trace, "--trace")
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
    # the file's figures are text a user may have edited: say so when the model and layout disagree with them
    again = recheck(plan)
    problem = again.too_big or again.stale
    if problem:
        print(f"autoplan show: warning: {problem}", file=sys.stderr, flush=True)
    if not (args.timeline or args.trace or args.png):
        return 0
    # the cost model is imported only to draw: printing a plan stays fast
    from autoplan.report.simulated import simulate_plan

    sim = simulate_plan(plan)
    if args.timeline:
        from autoplan.report.timeline import draw_timeline

        recomputing = {s.index for s in plan.stages if s.full_recompute or s.selective_recompute}
        print("\npipeline timeline (simulated):\n" + draw_timeline(sim.evaluation, recomputing))
    if args.trace:
        from autoplan.report.chrome_trace import simulated_trace, write_trace
        write_trace(args.trace, simulated_trace(sim))
        print(f"\nwrote {args.trace}: the simulated step as a Chrome trace (open it in https://ui.perfetto.dev)")
    if args.png:
        from autoplan.report.figures import figure_size_px, write_png
        write_png(sim, args.png)
        w, h = figure_size_px(sim)
        print(f"\nwrote {args.png} ({w} x {h} px): pipeline per rank and memory per rank")
    return 0
