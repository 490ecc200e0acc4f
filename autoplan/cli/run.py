"""``autoplan run plan.yaml [--steps K] [--nproc N] ...``: start torchrun with the runtime for the user.

Thin: checks the plan, picks the process count (the plan's world size unless --nproc says otherwise) and
runs ``python -m torch.distributed.run --standalone --nproc_per_node N -m runtime.launch plan.yaml ...``.
It imports neither torch nor the runtime, so planning stays torch-free.

Data: byte-level models (vocab >= 256) train on the shipped sample text (examples/) unless ``--data``
names a token file or ``--data synthetic`` asks for seeded random tokens (runtime.launch's default).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path

from autoplan.errors import SpecError

SAMPLE_TEXT = Path(__file__).resolve().parents[2] / "examples" / "shakespeare_bytes.bin"


def register(subparsers) -> None:
    p = subparsers.add_parser("run", help="train a plan with torchrun (gloo on CPU, NCCL on GPUs)",
                              description=__doc__.split("\n\n")[0])
    p.add_argument("plan", help="plan YAML written by `autoplan plan`")
    p.add_argument("--steps", type=int, default=20, help="optimizer steps in total (default 20)")
    p.add_argument("--nproc", type=int, help="processes to start (default: the plan's tp * pp * dp)")
    p.add_argument("--backend", choices=("gloo", "nccl"), help="override the default (nccl with CUDA, else gloo)")
    p.add_argument("--data", help="token file (uint16 LE), or 'synthetic'; default: the shipped sample text "
                                  "for byte-level models")
    p.add_argument("--metrics", default="metrics.jsonl", help="JSON lines per step (default metrics.jsonl)")
    p.add_argument("--checkpoint-dir", help="DCP checkpoint folder")
    p.add_argument("--checkpoint-every", type=int, default=0, help="save every K steps (0: never)")
    p.add_argument("--resume", action="store_true", help="continue from the newest complete checkpoint")
    p.add_argument("--trace", metavar="DIR", help="profile a few steps after warm-up into DIR (merged.json: the "
                   "measured step per rank, for autoplan compare --trace and Perfetto)")
    p.add_argument("--dry-run", action="store_true", help="build ranks of the plan on the meta device with a fake "
                   "process group (no training, no cluster) and compare their parameters with the plan's")
    p.add_argument("--rank", type=int, action="append", help="with --dry-run: a rank to build (repeatable; default: "
                   "rank 0 and the last rank)")
    p.add_argument("--json", action="store_true", help="with --dry-run: print a JSON list, one object per rank")
    p.set_defaults(func=run)


def launch_command(args: argparse.Namespace, nproc: int, data: str | None) -> list[str]:
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}",
           "-m", "runtime.launch", str(args.plan), "--steps", str(args.steps)]
    for flag, value in (("--backend", args.backend), ("--data", data), ("--metrics", args.metrics),
                        ("--checkpoint-dir", args.checkpoint_dir), ("--trace", getattr(args, "trace", None))):
        if value:
            cmd += [flag, str(value)]
    if args.checkpoint_every:
        cmd += ["--checkpoint-every", str(args.checkpoint_every)]
    if args.resume:
        cmd.append("--resume")
    return cmd


def run(args: argparse.Namespace) -> int:
    from autoplan.schema import load_plan

    plan = load_plan(args.plan)
    if args.dry_run:
        from autoplan.cli.dry_run import dry_run
        return dry_run(args.plan, plan, args.rank, args.json)
    if args.rank or args.json:
        raise SpecError(f"{'--rank' if args.rank else '--json'}: only with --dry-run")
    nproc = args.nproc or plan.world_size
    if nproc != plan.world_size:
        raise SpecError(f"--nproc {nproc}: the plan needs tp * pp * dp = {plan.world_size} processes")
    data = args.data
    if data is None and plan.model.vocab_size >= 256 and SAMPLE_TEXT.is_file():
        data = str(SAMPLE_TEXT)
    elif data == "synthetic":
        data = None
    env = dict(os.environ)
    # one compute thread per rank unless the user chose: N ranks would oversubscribe the cores otherwise
    env.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // nproc)))
    root = str(Path(__file__).resolve().parents[2])
    env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH", "")) if p)
    print("autoplan run: " + " ".join(launch_command(args, nproc, data)[1:]), file=sys.stderr, flush=True)
    return subprocess.call(launch_command(args, nproc, data), env=env)
