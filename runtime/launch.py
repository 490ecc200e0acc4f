"""``torchrun --nproc_per_node N -m runtime.launch plan.yaml [options]``: train as the plan says.

Every rank loads and checks the plan (and the data file) before the first collective, so bad input
gives the same one-line error on every rank and a non-zero exit (2), never a hang or a traceback.
"""

from __future__ import annotations

import argparse
import os
import sys

from autoplan.errors import SpecError
from autoplan.schema.training import KNOB_FLAGS, knob_argument
from runtime.train.watchdog import DEFAULT_TIMEOUT_S, PEER_LOST_EXIT, TIMEOUT_EXIT, report


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="runtime.launch", description="Train a model exactly as an autoplan plan says.")
    p.add_argument("plan", help="plan YAML written by `autoplan plan`")
    p.add_argument("--steps", type=int, default=20, help="optimizer steps to run in total (default 20)")
    p.add_argument("--backend", choices=("gloo", "nccl"), help="override: default nccl with CUDA, else gloo")
    p.add_argument("--data", help="token file (uint16 or uint32 ids, described by FILE.json; runtime/train/data.py); "
                   "default: seeded synthetic tokens")
    p.add_argument("--metrics", help="append one JSON line per step to this file (rank 0)")
    p.add_argument("--checkpoint-dir", help="folder for DCP checkpoints (step_N/ with a COMPLETE marker)")
    p.add_argument("--checkpoint-every", type=int, default=0, help="save every K steps (0: never)")
    p.add_argument("--resume", action="store_true", help="continue from the newest complete checkpoint")
    p.add_argument("--log-every", type=int, default=1, help="print a line every K steps (0: summary only)")
    p.add_argument("--trace", metavar="DIR", help="profile a few steps after warm-up on every rank into DIR "
                   "(torch traces, per-rank and merged step traces; runtime/train/profiling.py)")
    p.add_argument("--timeline", metavar="FILE", help="every step's phases per rank, wall and CPU time, as a "
                   "Chrome/Perfetto trace written by rank 0 (runtime/train/phase_clock.py)")
    p.add_argument("--tensorboard", metavar="DIR", help="TensorBoard scalars of every step (rank 0)")
    p.add_argument("--init-from", metavar="DIR", help="start from a Hugging Face model folder (config.json + "
                   "safetensors; runtime/hf/) instead of random weights; with --resume and a checkpoint to "
                   "resume from, the checkpoint wins")
    p.add_argument("--save-hf", metavar="DIR", help="after the last step, write the weights as a Hugging Face "
                   "folder (config.json + safetensors) that transformers loads")
    p.add_argument("--eval-data", metavar="FILE", help="token file for validation (runtime/evaluate.py)")
    p.add_argument("--eval-every", type=int, default=0, help="with --eval-data: evaluate every K steps and after "
                   "the last (default 0: after the last only)")
    p.add_argument("--eval-sequences", type=int, help="windows evaluated each time (default: one global batch)")
    p.add_argument("--timeout", type=float, default=DEFAULT_TIMEOUT_S,
                   help="seconds a collective or pipeline action may wait before the job ends (default 300)")
    for flag, name in KNOB_FLAGS.items():  # autoplan run's training knobs, passed on (launcher/knobs.py)
        p.add_argument(flag, help=f"override the plan's training.{name} for this run", **knob_argument(name))
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return guarded("runtime.launch", _main, args)


def guarded(prog: str, body, args: argparse.Namespace) -> int:
    """``body(args)`` with bad input as one line per rank (status 2) and timeouts, lost peers and non-finite
    stops as their statuses (runtime/train/watchdog.py); shared by every torchrun entry point."""
    rank = int(os.environ.get("RANK", "0"))
    try:
        return body(args)
    except SpecError as err:
        print(f"{prog} (rank {rank}): error: {err}", file=sys.stderr, flush=True)
        return 2
    except Exception as err:  # a non-finite stop, a timeout or a lost peer: one line; anything else: a bug
        status = report(err, rank, args.timeout)
        if status is None:
            raise
        if status in (TIMEOUT_EXIT, PEER_LOST_EXIT):
            _exit_now(status)
        return status


def _exit_now(status: int) -> None:
    """Leave without tearing down: a gloo group whose collective timed out or lost its peer still owns
    worker threads, and destroying it at interpreter exit can abort the process (SIGABRT, "terminate
    called without an active exception"); torchrun would then report signal 6, not this status. The
    metrics and checkpoints are already on disk (each written and flushed when made)."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(status)


def _main(args: argparse.Namespace) -> int:
    import dataclasses

    from autoplan.schema.io import load_any_plan
    from autoplan.schema.plan import ModulePlan
    from autoplan.schema.training import knobs_given, with_knobs
    plan = load_any_plan(args.plan)  # SpecError on a missing file or a bad plan
    if isinstance(plan, ModulePlan):  # a user's own module (runtime/models/adapter.py)
        from autoplan.schema.plan import refuse_module_run_options
        refuse_module_run_options(args)
    knobs = knobs_given(args)
    if knobs:
        plan = dataclasses.replace(plan, training=with_knobs(plan.training, knobs))
    if args.steps < 1:
        raise SpecError("--steps: must be at least 1")
    if args.resume and not args.checkpoint_dir:
        raise SpecError("--resume: needs --checkpoint-dir")
    if args.checkpoint_every < 0:
        raise SpecError("--checkpoint-every: must be >= 0")
    if args.eval_data is None and (args.eval_every or args.eval_sequences is not None):
        raise SpecError(f"{'--eval-every' if args.eval_every else '--eval-sequences'}: needs --eval-data")
    if args.eval_every < 0:
        raise SpecError("--eval-every: must be >= 0")
    if not 0 < args.timeout < float("inf"):
        raise SpecError(f"--timeout: {args.timeout} must be a positive number of seconds")
    if args.init_from is not None:  # headers only, on every rank: one line before any collective
        from runtime.hf.files import check_init_folder
        check_init_folder(args.init_from, plan.model, plan.training.seq_len)
    if args.save_hf is not None and os.environ.get("RANK", "0") == "0":
        from runtime.hf.files import check_output
        check_output(args.save_hf, force=False, flag="--save-hf", can_force=False, spec=plan.model)
    if args.metrics is not None and os.environ.get("RANK", "0") == "0":  # `autoplan run` checked it already
        from autoplan.schema._files import check_writable
        check_writable(args.metrics, "--metrics")

    import torch.distributed as dist

    from runtime.device import pick_device
    from runtime.mesh import mesh_of_plan
    from runtime.train.data import TokenSource
    from runtime.trainer import RunOptions, Trainer, run
    from runtime.train.lock import DirectoryLock
    from runtime.train.watchdog import quiet_schedule_logs, set_timeout
    from runtime.validate import check_plan

    world = int(os.environ.get("WORLD_SIZE", "1"))
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    device, backend = pick_device(args.backend, local_rank)
    check_plan(plan, world, device.type, int(os.environ.get("LOCAL_WORLD_SIZE", "1")))
    module = isinstance(plan, ModulePlan)
    data = None if module else TokenSource(plan.model.vocab_size, plan.training.seq_len, plan.training.seed, args.data)
    if module:  # import the factory and check it against the plan on every rank, before any collective
        from runtime.module_build import check_module
        check_module(plan)
    if "RANK" not in os.environ:  # plain `python -m runtime.launch` on a 1-device plan: a world of one
        os.environ.update(RANK="0", WORLD_SIZE="1", MASTER_ADDR="127.0.0.1", MASTER_PORT=os.environ.get("MASTER_PORT", "29517"))
    lock = DirectoryLock(args.checkpoint_dir).acquire() if args.checkpoint_dir and os.environ["RANK"] == "0" else None
    quiet_schedule_logs()
    dist.init_process_group(backend, timeout=set_timeout(args.timeout))
    if module:
        from runtime.mesh import build_mesh
        from runtime.module_trainer import ModuleTrainer
        trainer = ModuleTrainer(plan, build_mesh(plan.dims, device, need_embedding_group=False))
    else:
        pm = mesh_of_plan(plan, device)
        init_from = None
        if args.init_from is not None:
            from runtime.hf.in_training import folder_to_read
            init_from = folder_to_read(args.init_from, args.checkpoint_dir, args.resume)
        trainer = Trainer(plan, pm, data, init_from=init_from)
    run(trainer, RunOptions(args.steps, args.metrics, args.checkpoint_dir, args.checkpoint_every, args.resume,
                            args.log_every, args.trace, args.timeline, args.tensorboard, eval_data=args.eval_data,
                            eval_every=args.eval_every, eval_sequences=args.eval_sequences))
    saved = None
    if args.save_hf is not None:
        from runtime.hf.in_training import export_at_end, save_at_end
        saved = save_at_end(trainer, args.steps, args.checkpoint_dir, args.save_hf)
    # barrier before teardown: exits are flaky otherwise (runtime-notes §7). Not in a `finally`: a rank
    # that failed must exit (torchrun then stops the others) rather than wait here for ranks that cannot come.
    dist.barrier()
    dist.destroy_process_group()
    if saved is not None and os.environ["RANK"] == "0":  # after the collectives: no rank waits on it
        export_at_end(saved, args.save_hf, plan.model)
    if lock is not None:
        lock.release()
    return 0


if __name__ == "__main__":
    sys.exit(main())
