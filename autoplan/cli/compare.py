"""``autoplan compare PLAN METRICS.jsonl [--trace DIR] [--json]``: the cost model's prediction for a plan
against what ``autoplan run`` measured, term by term with a trace; see autoplan/report/compare.py.

Reads files only: no torch, no runtime."""

from __future__ import annotations

import argparse
import json

from autoplan.report.compare import comparison, measured_run, read_measured_trace, read_metrics, render_comparison
from autoplan.report.simulated import simulate_plan
from autoplan.schema import load_plan


def register(subparsers) -> None:
    p = subparsers.add_parser("compare", help="predicted vs measured step time, tokens/s, memory and time split",
                              description=__doc__.split("\n\n")[0])
    p.add_argument("plan", help="the plan YAML the run trained")
    p.add_argument("metrics", help="the run's metrics JSON lines (autoplan run --metrics)")
    p.add_argument("--trace", metavar="DIR", help="the run's trace folder (autoplan run --trace DIR), or its merged.json")
    p.add_argument("--warmup-steps", type=int, default=1, help="steps left out of the medians (default 1)")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    plan = load_plan(args.plan)
    measured = measured_run(read_metrics(args.metrics), args.warmup_steps, source=args.metrics)
    trace = read_measured_trace(args.trace) if args.trace else None
    sim = simulate_plan(plan)
    data = comparison(sim, measured, trace)
    print(json.dumps(data) if args.json else render_comparison(data, args.metrics))
    return 0
