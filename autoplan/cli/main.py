"""The ``autoplan`` command: parse, delegate to one subcommand module, turn bad input into one line.

Each subcommand lives in its own module with ``register(subparsers)`` (adds its parser and sets
``func``); this file only wires them. Registering a subcommand imports only argparse-level code: each
module imports its heavy parts (the search and OR-Tools behind it, the cost model, torch) inside its
``run``, so ``autoplan --help`` and ``autoplan show`` stay fast and ``autoplan plan`` never imports torch
(tests/planner/test_cli.py checks both).

Exit status: 0 done; 2 bad input (one line on stderr, naming the option or file and the fix, never a
traceback: a SpecError, an option argparse refuses, or a file the system refuses to read or write);
130 interrupted; 141 the reader of stdout went away (``autoplan plan --json | head``), like any Unix
tool killed by SIGPIPE. ``autoplan run`` passes on the training job's status (see ``cli/run.py``).
Any other exception is a bug and keeps its traceback.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys

from autoplan.errors import SpecError

SUBCOMMANDS = ("plan", "estimate", "show", "export", "run", "eval", "compare", "profile", "profile_hardware",
               "calibrate", "prepare_data", "export_hf")
OUTPUT_OPTIONS = (("output", "-o"), ("cluster_out", "--cluster-out"), ("raw_out", "--raw-out"))
"""Options that name a file a subcommand writes at the end: checked before the (maybe long) work."""


class _OneLineParser(argparse.ArgumentParser):
    """argparse prints the whole usage before an error; one line that points to --help reads better."""

    def error(self, message: str):
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def build_parser() -> argparse.ArgumentParser:
    parser = _OneLineParser(
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


def _check_outputs(args: argparse.Namespace) -> None:
    from autoplan.schema._files import check_writable

    for dest, flag in OUTPUT_OPTIONS:
        path = getattr(args, dest, None)
        if path is not None:
            check_writable(path, flag)


def _stdout_gone() -> int:
    """stdout's reader closed the pipe: say nothing more (Python would print a BrokenPipeError at exit)."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError, AttributeError):  # stdout is not a real file (captured in tests)
        pass
    return 141


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exit_:  # --help (0) or a refused option (2, one line printed)
        return int(exit_.code or 0)
    try:
        _check_outputs(args)
        code = int(args.func(args) or 0)
        sys.stdout.flush()
        return code
    except SpecError as err:
        print(f"autoplan {args.command}: error: {err}", file=sys.stderr)
        return 2
    except BrokenPipeError:
        return _stdout_gone()
    except OSError as err:
        if err.filename is None:
            raise  # not about a path the user gave: a bug, keep the traceback
        print(f"autoplan {args.command}: error: {err.filename}: {err.strerror}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"autoplan {args.command}: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
