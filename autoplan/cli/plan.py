"""``autoplan plan``: search the fastest plan that fits, print the best few, write the winner."""

from __future__ import annotations

import argparse
import json
import sys

from autoplan.cli.common import add_input_arguments, add_layout_arguments, load_inputs, workload_fn
from autoplan.report.tables import breakdown_table, ranking_table
from autoplan.report.why import why_winner
from autoplan.schema import dump_plan, plan_to_dict
from autoplan.schema._io import write_atomic
from autoplan.search.planner import search, stderr_progress
from autoplan.search.result import explain_infeasible, plan_of, require_plan, solver_info
from autoplan.search.space import Pins


def register(subparsers) -> None:
    p = subparsers.add_parser("plan", help="find the fastest parallel plan that fits and write it as YAML")
    add_input_arguments(p)
    add_layout_arguments(p, required=False)
    p.add_argument("-o", "--output", help="write the winning plan to this YAML file")
    p.add_argument("--top", type=int, default=5, help="how many plans to list (5)")
    p.add_argument("--solver", choices=["cpsat", "bruteforce"], default="cpsat")
    p.set_defaults(func=run)


def pins_of(args: argparse.Namespace) -> Pins:
    return Pins(tp=args.tp, pp=args.pp, dp=args.dp, zero_stage=args.zero_stage, schedule=args.schedule,
                virtual_stages=args.virtual_stages, micro_batch_size=args.micro_batch_size,
                sequence_parallel=args.sequence_parallel, offload_optimizer=args.offload_optimizer,
                recompute=args.recompute)


def run(args: argparse.Namespace) -> int:
    model, cluster, training = load_inputs(args)
    pins = pins_of(args)
    result = search(model, workload_fn(model, cluster, training), cluster, training, pins, solver=args.solver,
                    top_k=max(1, args.top), progress=None if args.json else stderr_progress)
    if sys.stderr.isatty() and not args.json:
        print("\r" + " " * 60 + "\r", end="", file=sys.stderr)
    require_plan(result, lambda: explain_infeasible(model, workload_fn, cluster, training, pins))
    info = solver_info(result, args.solver)
    plans = [plan_of(model, cluster, training, c, info if i == 0 else None) for i, c in enumerate(result.ranked)]
    best = plans[0]
    if args.output:
        write_atomic(args.output, dump_plan(best))
    if args.json:
        data = plan_to_dict(best)
        data = {k: v for k, v in data.items() if k not in ("model", "cluster", "training")}
        data["model"], data["cluster"] = model.name, cluster.name
        print(json.dumps(data))
        return 0
    print(f"{model.name} on {cluster.name}: {cluster.num_nodes} x {cluster.devices_per_node} {cluster.device.name}, "
          f"global batch {training.global_batch_size} x {training.seq_len} tokens, {training.precision}")
    print(f"solver {args.solver}: {result.status} in {result.wall_s:.2f} s "
          f"({result.considered} configurations, {result.evaluated} solved, the rest pruned by bounds)\n")
    print(ranking_table([(p, p.predicted) for p in plans]))
    print("\n" + why_winner(plans))
    print("\n" + breakdown_table(best.predicted))
    if args.output:
        print(f"\nwrote {args.output}")
    return 0
