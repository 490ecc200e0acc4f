"""The ``autoplan`` command: parse, delegate to one subcommand module, turn SpecError into exit status 2.

Each subcommand lives in its own module with ``register(subparsers)`` (adds its parser and sets
``func``); this file only wires them. Registering a subcommand imports only argparse-level code: each
module imports its heavy parts (the search and OR-Tools behind it, the cost model, torch) inside its
``run``, so ``autoplan --help`` and ``autoplan show`` stay fast and ``autoplan plan`` never imports torch
(tests/planner/test_cli.py checks both).
"""

from __future__ import annotations

import argparse
import importlib
import sys

from autoplan.errors import SpecError

SUBCOMMANDS = ("plan", "estimate", "show", "run", "profile", "profile_hardware")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="autoplan",
        description="Plan and run parallel training for transformers: profile, plan, run.")
    subparsers = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name in SUBCOMMANDS:
        try:
            module = importlib.import_module(f"autoplan.cli.{name}")
        except ModuleNotFoundError as err:
            if err.name != f"autoplan.cli.{name}":
                raise
            continue  # a subcommand that is not part of this build
        module.register(subparsers)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except SpecError as err:
        print(f"autoplan {args.command}: error: {err}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
