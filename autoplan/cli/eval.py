"""``autoplan eval plan.yaml --data FILE --sequences N [--checkpoint-dir DIR [--step N] | --init-from DIR]``:
the mean next-token loss of the plan's model over the first N windows of a token file, in order, computed
under the plan's own layout, forward only -- to check a checkpoint, or weights loaded from Hugging Face.

Thin, as ``autoplan run``: every input is checked torch-free first (runtime/eval_inputs.py, which the ranks
run again: the plan, the token file against its vocabulary and length, the weights' folder and
checkpoint), then torchrun starts
``runtime.eval_launch`` with the plan's world size (launcher/preflight.py ``shape``: one node, or this
node's share with ``--nnodes/--node-rank/--rdzv-endpoint``), supervised like a training job but never
restarted. ``--json`` makes stdout exactly one line ``{"loss": ..., "tokens": ...}``.

Exit status: 0 done; 2 bad input; 4 a collective timed out; 5 a rank lost its peers.
"""

from __future__ import annotations

import argparse
import shlex
import sys

from autoplan.launcher.commands import runtime_command, torchrun_options, worker_env


def register(subparsers) -> None:
    p = subparsers.add_parser("eval", help="mean next-token loss of a plan's model on a token file, under the "
                              "plan's layout", description=__doc__.split("\n\n")[0])
    p.add_argument("plan", help="plan YAML written by `autoplan plan`")
    p.add_argument("--data", required=True, help="token file: little-endian uint16 or uint32 ids with a FILE.json "
                   "sidecar (autoplan prepare-data makes both)")
    p.add_argument("--sequences", type=int, required=True,
                   help="evaluate the first N windows of seq_len + 1 ids, in order (loss over N x seq_len targets)")
    weights = p.add_mutually_exclusive_group()
    weights.add_argument("--checkpoint-dir", metavar="DIR", help="the model weights of a checkpoint written by "
                         "autoplan run (any layout): the newest in DIR, or --step's")
    weights.add_argument("--init-from", metavar="DIR", help="the weights of a Hugging Face model folder")
    p.add_argument("--step", type=int, help="with --checkpoint-dir: evaluate step_N (default: the newest)")
    p.add_argument("--json", action="store_true", help='print one line {"loss": ..., "tokens": ...} on stdout')
    p.add_argument("--nproc", type=int, help="processes to start (default: the plan's tp * cp * pp * dp per node)")
    p.add_argument("--backend", choices=("gloo", "nccl"), help="override the default (nccl with CUDA, else gloo)")
    p.add_argument("--timeout", type=float, default=300.0,
                   help="seconds a collective or pipeline action may wait before the job ends (default 300)")
    p.add_argument("--nnodes", type=int, help="run this node's share of a multi-node plan (with --node-rank)")
    p.add_argument("--node-rank", type=int, default=0, help="this node's index, 0 .. nnodes-1 (default 0)")
    p.add_argument("--rdzv-endpoint", help="HOST:PORT of node 0, the same on every node (with --nnodes > 1)")
    p.add_argument("--print-command", action="store_true", help="check everything, print the torchrun line, exit")
    p.set_defaults(func=run, slurm=False, max_restarts=0)  # what launcher/preflight.py ``shape`` reads


def eval_runtime_args(args: argparse.Namespace) -> tuple[str, ...]:
    """runtime.eval_launch's options after the plan."""
    out = ["--data", args.data, "--sequences", str(args.sequences)]
    for flag, value in (("--checkpoint-dir", args.checkpoint_dir), ("--step", args.step),
                        ("--init-from", args.init_from), ("--backend", args.backend)):
        if value is not None:
            out += [flag, str(value)]
    out += ["--timeout", f"{args.timeout:g}"] + (["--json"] if args.json else [])
    return tuple(out)


def run(args: argparse.Namespace) -> int:
    from autoplan.errors import SpecError
    from autoplan.launcher.preflight import NeedsMoreNodes, shape
    from autoplan.launcher.supervise import run_attempts
    from autoplan.schema import load_plan
    from autoplan.schema.plan import require_runnable
    from runtime.eval_inputs import check_eval_inputs

    plan = load_plan(args.plan)
    require_runnable(plan)
    if args.nproc is not None and args.nproc < 1:
        raise SpecError(f"--nproc: {args.nproc} must be at least 1")
    notices: list[str] = []
    check_eval_inputs(args, plan, notices)
    try:
        launch = shape(args, plan, str(args.plan), eval_runtime_args(args), module="runtime.eval_launch")
    except NeedsMoreNodes as err:
        print("\n".join(err.lines), flush=True)
        if args.print_command:
            return 0
        raise
    cmd = [sys.executable, "-m", "runtime.torchrun",
           *torchrun_options(launch.nproc_per_node, launch.nnodes, launch.node_rank, launch.rdzv_endpoint,
                             launch.rdzv_id), *runtime_command(launch)]
    line = "torchrun " + " ".join(shlex.quote(a) for a in cmd[3:])
    if args.print_command:
        print(line)
        return 0
    print(f"autoplan eval: {line}", file=sys.stderr, flush=True)
    for note in notices:
        print(f"autoplan eval: note: {note}", file=sys.stderr, flush=True)
    return run_attempts(lambda _resume: cmd, worker_env(launch.nproc_per_node), 0, lambda: None)
