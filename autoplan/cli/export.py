"""``autoplan export PLAN --to torchtitan|megatron [-o FILE]``: the plan in the configuration language of
the stack that will run it (autoplan/export/): a torchtitan job TOML, or Megatron-LM's arguments."""

from __future__ import annotations

import argparse
import sys

from autoplan.schema import load_plan


def register(subparsers) -> None:
    p = subparsers.add_parser("export", help="write a plan as a torchtitan job file or Megatron-LM arguments")
    p.add_argument("plan", help="a plan YAML written by autoplan plan or estimate (best made with --stack of the target)")
    p.add_argument("--to", required=True, choices=("torchtitan", "megatron"), dest="target",
                   help="torchtitan: a job TOML for torchtitan.train --job.config_file; megatron: the arguments "
                        "of Megatron-LM's pretrain_gpt.py as a bash array")
    p.add_argument("-o", "--output", help="write here (atomically) instead of printing")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from autoplan.export import megatron_arguments, torchtitan_toml
    from autoplan.export.megatron import render_megatron
    from autoplan.schema._files import write_atomic

    plan = load_plan(args.plan)
    stack = plan.stack_name
    if not stack.startswith(args.target):
        print(f"autoplan export: note: this plan was priced for stack {stack!r}; re-plan with --stack "
              f"{args.target} for {args.target}'s predicted step time and memory", file=sys.stderr)
    text = torchtitan_toml(plan) if args.target == "torchtitan" else render_megatron(plan, megatron_arguments(plan))
    if args.output:
        write_atomic(args.output, text)
        print(f"wrote {args.output}")
    else:
        print(text, end="")
    return 0
