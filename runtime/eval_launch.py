"""``torchrun --nproc_per_node N -m runtime.eval_launch plan.yaml --data FILE --sequences N [options]``:
the mean next-token loss of the plan's model over the first N windows of a token file, computed under the
plan's own layout, forward only (runtime/evaluate.py). ``autoplan eval`` checks and starts this.

Weights: ``--checkpoint-dir DIR [--step N]`` (the model half of one of our DCP checkpoints, from any
layout: runtime/train/checkpoint.py ``load_weights``), ``--init-from DIR`` (a Hugging Face folder, read
while the stages are built as ``autoplan run --init-from`` reads it: runtime/hf/load.py
``load_hf_weights``), or neither: the plan's seeded initial values, said in one line on stderr.
The checkpoint's files are not hashed as a resume does (autoplan run): evaluation reads only the
weights, and hashing would read the optimizer state too, twice the weights' bytes again under AdamW.

Output (rank 0, stdout): ``eval loss X  perplexity P  over T tokens ...``, or with ``--json`` exactly one
line ``{"loss": X, "tokens": T}`` (T = N x seq_len). Every rank checks its input before the first
collective, so bad input is one line per rank and exit status 2 (runtime.launch's ``guarded``).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
from pathlib import Path

from runtime.launch import guarded
from runtime.train.watchdog import DEFAULT_TIMEOUT_S


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="runtime.eval_launch",
                                description="Mean next-token loss of a plan's model, under the plan's layout.")
    p.add_argument("plan", help="plan YAML written by `autoplan plan`")
    p.add_argument("--data", required=True, help="token file (uint16 or uint32 ids, described by FILE.json)")
    p.add_argument("--sequences", type=int, required=True, help="evaluate the first N windows of seq_len + 1 ids")
    weights = p.add_mutually_exclusive_group()
    weights.add_argument("--checkpoint-dir", metavar="DIR", help="weights of a checkpoint in DIR (newest, or --step)")
    weights.add_argument("--init-from", metavar="DIR", help="weights of a Hugging Face model folder")
    p.add_argument("--step", type=int, help="with --checkpoint-dir: the checkpoint of step N (default: the newest)")
    p.add_argument("--json", action="store_true", help='print one line {"loss": ..., "tokens": ...}')
    p.add_argument("--backend", choices=("gloo", "nccl"), help="override: default nccl with CUDA, else gloo")
    p.add_argument("--timeout", type=float, default=DEFAULT_TIMEOUT_S,
                   help="seconds a collective or pipeline action may wait before the job ends (default 300)")
    return p


def main(argv: list[str] | None = None) -> int:
    return guarded("runtime.eval_launch", _main, build_parser().parse_args(argv))


def _main(args: argparse.Namespace) -> int:
    from autoplan.schema import load_plan
    from autoplan.schema.plan import require_runnable
    from runtime.eval_inputs import check_eval_inputs

    plan = load_plan(args.plan)  # SpecError on a missing file or a bad plan
    require_runnable(plan)
    folder = check_eval_inputs(args, plan)

    import torch.distributed as dist

    from runtime.build import build_parts
    from runtime.device import pick_device
    from runtime.evaluate import EvalWindows, Evaluator
    from runtime.mesh import mesh_of_plan
    from runtime.train.data import TokenSource
    from runtime.train.watchdog import quiet_schedule_logs, set_timeout
    from runtime.validate import check_plan

    world = int(os.environ.get("WORLD_SIZE", "1"))
    device, backend = pick_device(args.backend, int(os.environ.get("LOCAL_RANK", "0")))
    check_plan(plan, world, device.type, int(os.environ.get("LOCAL_WORLD_SIZE", "1")))
    t = plan.training  # the file was checked above (check_eval_inputs)
    windows = EvalWindows(TokenSource(plan.model.vocab_size, t.seq_len, t.seed, args.data), args.sequences)
    if "RANK" not in os.environ:  # plain `python -m runtime.eval_launch` on a 1-device plan: a world of one
        os.environ.update(RANK="0", WORLD_SIZE="1", MASTER_ADDR="127.0.0.1",
                          MASTER_PORT=os.environ.get("MASTER_PORT", "29518"))
    rank0 = os.environ["RANK"] == "0"
    quiet_schedule_logs()
    dist.init_process_group(backend, timeout=set_timeout(args.timeout))
    pm = mesh_of_plan(plan, device)
    # --init-from: each rank reads its shards of the Hugging Face tensors as it builds (runtime/hf/load.py)
    parts = build_parts(plan, pm, init_from=None if args.init_from is None else Path(args.init_from))
    source = _weights(args, folder, parts.models, plan, rank0)
    summed, tokens = Evaluator(plan, pm, parts).loss(windows)
    if rank0:
        loss = summed / tokens
        if args.json:
            print(json.dumps({"loss": loss, "tokens": tokens}), flush=True)
        else:
            print(f"eval loss {loss:.6f}  perplexity {math.exp(min(loss, 700.0)):.6g}  over {tokens:,} tokens "
                  f"({args.sequences:,} sequences of {plan.training.seq_len}, {args.data}; weights: {source})",
                  flush=True)
    dist.barrier()  # before teardown: exits are flaky otherwise (runtime-notes §7)
    dist.destroy_process_group()
    return 0


def _weights(args: argparse.Namespace, folder, models, plan, rank0: bool) -> str:
    """Fill the stage models from the checkpoint, if one was chosen; returns how the output line names
    where the weights came from."""
    if folder is not None:
        from runtime.train.checkpoint import load_weights

        step = load_weights(folder, models, plan.model)
        return f"{folder} (step {step})"
    if args.init_from is not None:
        return args.init_from
    if rank0:
        print(f"runtime.eval_launch: note: no --checkpoint-dir or --init-from: evaluating the plan's seeded random "
              f"initialisation (seed {plan.training.seed})", file=sys.stderr, flush=True)
    return f"random initialisation, seed {plan.training.seed}"


if __name__ == "__main__":
    sys.exit(main())
