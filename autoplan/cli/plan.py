"""``autoplan plan``: search the fastest plan that fits, print the best few, write the winner."""

from __future__ import annotations

import argparse
import json
import sys

from autoplan.cli.common import add_input_arguments, add_layout_arguments, load_inputs, runnable_spec, workload_fn
from autoplan.errors import SpecError
from autoplan.report.tables import breakdown_table, ranking_table
from autoplan.report.why import why_winner
from autoplan.schema import dump_plan, plan_to_dict
from autoplan.schema._io import to_dict, write_atomic
from autoplan.search.planner import search, stderr_progress
from autoplan.search.result import explain_infeasible, plan_of, predicted_of, require_plan, solver_info
from autoplan.search.space import Pins, tp_options


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
    spec = runnable_spec(model)
    if args.output and spec is None:
        raise SpecError(f"-o: a plan file embeds a model the runtime can build, and profile {model.name!r} "
                        f"(of {model.source}) is not a shipped model or spec file; plan it without -o")
    pins = pins_of(args)
    allowed = tp_options(model, cluster)
    if pins.tp is not None and pins.tp not in allowed:
        raise SpecError(f"--tp: {pins.tp} must divide the devices per node ({cluster.devices_per_node}) and the "
                        f"model's heads, KV heads, FFN width and vocabulary; use one of {allowed}")
    make = lambda m, c, t: workload_fn(m, c, t, args.rescale_profile)  # noqa: E731
    result = search(model, make(model, cluster, training), cluster, training, pins, solver=args.solver,
                    top_k=max(1, args.top), progress=None if args.json else stderr_progress)
    if sys.stderr.isatty() and not args.json:
        print("\r" + " " * 60 + "\r", end="", file=sys.stderr)
    require_plan(result, lambda: explain_infeasible(model, make, cluster, training, pins))
    info = solver_info(result, args.solver)
    ranked = [predicted_of(c, cluster, training) for c in result.ranked]
    if spec is not None:
        best = plan_of(spec, cluster, training, result.best, info)
        if args.output:
            write_atomic(args.output, dump_plan(best))
        data = {k: v for k, v in plan_to_dict(best).items() if k not in ("model", "cluster", "training")}
    else:
        layout, predicted = ranked[0]
        data = {**to_dict(layout), "predicted": to_dict(predicted), "solver": to_dict(info)}
    if args.json:
        data["model"], data["cluster"] = model.name, cluster.name
        print(json.dumps(data))
        return 0
    print(f"{model.name} on {cluster.name}: {cluster.num_nodes} x {cluster.devices_per_node} {cluster.device.name}, "
          f"global batch {training.global_batch_size} x {training.seq_len} tokens, {training.precision}")
    print(f"solver {args.solver}: {result.status} in {result.wall_s:.2f} s "
          f"({result.considered} configurations, {result.evaluated} solved, the rest pruned by bounds)\n")
    print(ranking_table(ranked))
    print("\n" + why_winner(ranked))
    print("\n" + breakdown_table(ranked[0][1]))
    if args.output:
        print(f"\nwrote {args.output}")
    return 0
