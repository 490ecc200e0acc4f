"""``autoplan run plan.yaml [--steps K] ...``: check everything, then start torchrun with the runtime.

Thin: the preflight (``launcher/preflight.py``) checks the plan, every option and path, and the devices
of this machine before any process starts; the supervisor (``launcher/supervise.py``) runs
``python -m runtime.torchrun --standalone --nproc-per-node N -m runtime.launch plan.yaml ...`` as a
process group that signals reach, and restarts it from the newest complete checkpoint after a failure
(``--max-restarts``). A plan for several nodes prints the torchrun line for each node (``--slurm``: an
sbatch script); ``--nnodes/--node-rank/--rdzv-endpoint`` run this node's share. Torch is imported only
to count GPUs for a GPU plan.

Data: ``--data FILE`` (uint16 or uint32 ids described by ``FILE.json``; ``autoplan prepare-data`` makes
both) or ``--data synthetic``; only byte-level models default to the shipped sample text (examples/).
Training knobs (``--lr``, ``--lr-schedule``, ``--seed`` ...; launcher/knobs.py) override the plan's
``training`` section for this run.

Hugging Face folders (runtime/hf/): ``--init-from DIR`` starts from a model folder's weights (checked
before launch: its config.json must be the plan's model, its safetensors must hold every tensor);
``--save-hf DIR`` writes the final weights as a folder transformers loads (``autoplan export-hf`` does
the same for any checkpoint).

Exit status: 0 done; 2 bad input; 3 stopped on a non-finite loss, gradient norm or weights; 4 a collective
timed out; 5 a rank lost its peers; 128 + N killed by (or stopped on) signal N.
"""

from __future__ import annotations

import argparse
import shlex
import sys
from pathlib import Path

from autoplan.errors import SpecError
from autoplan.launcher.commands import runtime_command, sbatch_script, torchrun_options, worker_env
from autoplan.launcher.knobs import add_knob_arguments
from autoplan.launcher.preflight import DATA_HELP, NeedsMoreNodes, preflight
from autoplan.launcher.supervise import run_attempts
from autoplan.schema import DEFAULT_STACK, Plan


def register(subparsers) -> None:
    p = subparsers.add_parser("run", help="train a plan with torchrun (gloo on CPU, NCCL on GPUs)",
                              description=__doc__.split("\n\n")[0])
    p.add_argument("plan", help="plan YAML written by `autoplan plan`")
    p.add_argument("--steps", type=int, default=20, help="optimizer steps in total (default 20)")
    p.add_argument("--nproc", type=int, help="processes to start (default: the plan's tp * cp * pp * dp per node)")
    p.add_argument("--backend", choices=("gloo", "nccl"), help="override the default (nccl with CUDA, else gloo)")
    p.add_argument("--data", help=DATA_HELP)
    p.add_argument("--metrics", default="metrics.jsonl", help="JSON lines per step (default metrics.jsonl)")
    p.add_argument("--checkpoint-dir", help="DCP checkpoint folder (one run at a time: it is locked)")
    p.add_argument("--checkpoint-every", type=int, default=0, help="save every K steps (0: never)")
    p.add_argument("--resume", action="store_true", help="continue from the newest intact checkpoint")
    p.add_argument("--init-from", metavar="DIR", help="start from the weights of a Hugging Face model folder "
                   "(config.json + model.safetensors or its shards; llama, mistral, qwen2, qwen3, gpt2) instead of "
                   "random ones; each rank reads only its shards. Its config must describe the plan's model. With "
                   "--resume (and after a restart) the checkpoint wins")
    p.add_argument("--save-hf", metavar="DIR", help="after the last step, write the weights as a Hugging Face folder "
                   "that transformers loads (config.json + safetensors; a new or empty folder)")
    p.add_argument("--max-restarts", type=int, default=0,
                   help="after a failed attempt (a killed rank, a timeout) start again from the newest "
                        "complete checkpoint, up to N times (default 0)")
    p.add_argument("--timeout", type=float, default=300.0,
                   help="seconds a collective or pipeline action may wait before the job ends (default 300)")
    p.add_argument("--nnodes", type=int, help="run this node's share of a multi-node plan (with --node-rank)")
    p.add_argument("--node-rank", type=int, default=0, help="this node's index, 0 .. nnodes-1 (default 0)")
    p.add_argument("--rdzv-endpoint", help="HOST:PORT of node 0, the same on every node (with --nnodes > 1)")
    p.add_argument("--slurm", action="store_true", help="print an sbatch script for the plan's nodes and exit")
    slurm = p.add_argument_group("with --slurm (paths may exist only on the cluster: the ranks check them at start)")
    slurm.add_argument("--partition", help="#SBATCH --partition")
    slurm.add_argument("--time", help="#SBATCH --time, e.g. 24:00:00")
    slurm.add_argument("--account", help="#SBATCH --account")
    slurm.add_argument("--env-setup", metavar="COMMAND",
                       help='run on every node before torchrun, e.g. "source .venv/bin/activate"')
    p.add_argument("--print-command", action="store_true", help="check everything, print the torchrun line, exit")
    p.add_argument("--trace", metavar="DIR", help="profile a few steps after warm-up into DIR (merged.json: the "
                   "measured step per rank, for autoplan compare --trace and Perfetto)")
    p.add_argument("--timeline", metavar="FILE", help="every step's phases per rank with wall and CPU time, as a "
                   "Perfetto trace (a few us per phase: unlike --trace, steps run at full speed)")
    p.add_argument("--tensorboard", metavar="DIR", help="write every step's loss, lr, grad norm, tokens/s, memory and "
                   "the predicted step time as TensorBoard scalars into DIR (needs the tensorboard package)")
    p.add_argument("--eval-data", metavar="FILE", help="validation token file (FILE.json beside it): its first "
                   "windows, in order, evaluated under the plan's layout (as autoplan eval); the loss is printed and "
                   "recorded as eval_loss in the metrics and TensorBoard")
    p.add_argument("--eval-every", type=int, default=0, help="with --eval-data: evaluate every K steps and after the "
                   "last (default 0: after the last only)")
    p.add_argument("--eval-sequences", type=int, help="with --eval-data: windows evaluated (default: one global batch)")
    p.add_argument("--dry-run", action="store_true", help="build ranks of the plan on the meta device with a fake "
                   "process group (no training, no cluster) and compare their parameters with the plan's")
    p.add_argument("--rank", type=int, action="append", help="with --dry-run: a rank to build (repeatable; default: "
                   "rank 0 and the last rank)")
    p.add_argument("--json", action="store_true", help="with --dry-run: print a JSON list, one object per rank")
    knobs = p.add_argument_group("training knobs (override the plan's training section for this run; recorded in "
                                 "the metrics and the checkpoints)")
    add_knob_arguments(knobs)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    if args.dry_run:
        from autoplan.cli.dry_run import dry_run
        from autoplan.schema import load_plan

        from autoplan.schema.plan import require_runnable

        plan = load_plan(args.plan, "autoplan run --dry-run")
        require_runnable(plan)
        return dry_run(args.plan, plan, args.rank, args.json)
    if args.rank or args.json:
        raise SpecError(f"{'--rank' if args.rank else '--json'}: only with --dry-run")
    for flag in ("partition", "time", "account", "env_setup"):
        value = getattr(args, flag)
        if value is not None and not args.slurm:
            raise SpecError(f"--{flag.replace('_', '-')}: only with --slurm")
        if value is not None and (value == "" or any(ord(c) < 32 for c in value)):
            raise SpecError(f"--{flag.replace('_', '-')}: {value!r} is empty or has a control character (a line break "
                            "would end the #SBATCH line); give one line")
    try:
        plan, launch = preflight(args)
    except NeedsMoreNodes as err:
        print("\n".join(err.lines), flush=True)
        if args.print_command:  # the lines were asked for: printing them is the whole job
            return 0
        raise
    if plan.stack_name != DEFAULT_STACK:
        print(f"autoplan run: warning: this plan was made for stack {plan.stack_name!r} and runs on {DEFAULT_STACK!r} "
              f"(this runtime), so its predicted step time and memory are not this run's; re-plan with --stack "
              f"{DEFAULT_STACK}, or hand it to its stack (autoplan export)", file=sys.stderr, flush=True)
    if args.slurm:
        print(sbatch_script(launch, gpus=plan.cluster.device.kind == "gpu", job_name=f"autoplan-{_name(plan)}",
                            partition=args.partition, time=args.time, account=args.account,
                            env_setup=args.env_setup), end="")
        return 0
    torchrun = torchrun_options(launch.nproc_per_node, launch.nnodes, launch.node_rank, launch.rdzv_endpoint,
                                launch.rdzv_id)

    def make_cmd(resume: bool) -> list[str]:
        extra = ["--resume"] if resume or args.resume else []
        return [sys.executable, "-m", "runtime.torchrun", *torchrun, *runtime_command(launch), *extra]

    line = "autoplan run: torchrun " + " ".join(shlex.quote(a) for a in make_cmd(False)[3:])
    if args.print_command:
        print(line.split(": ", 1)[1])
        return 0
    print(line, file=sys.stderr, flush=True)

    def newest_checkpoint() -> Path | None:
        from runtime.train.manifest import complete_checkpoints

        found = complete_checkpoints(args.checkpoint_dir) if args.checkpoint_dir else []
        return found[0][1] if found else None

    status = run_attempts(make_cmd, worker_env(launch.nproc_per_node), args.max_restarts, newest_checkpoint)
    if status == 0 and launch.nnodes == 1 and isinstance(plan, Plan):  # rank 0 wrote the metrics here
        _print_at_host_speed(plan, args.metrics)
    return status


def _name(plan) -> str:
    """The model's name, or a user's module's (a ``ModulePlan``)."""
    return plan.module.name if hasattr(plan, "module") else plan.model.name


def _print_at_host_speed(plan: Plan, metrics: str) -> None:
    """On a calibrated CPU host, the run's last line: the plan re-evaluated at the speed the host ran
    (autoplan compare's figure; the runtime's own summary cannot run the cost model)."""
    d = plan.cluster.device
    if d.probe_gemm_us <= 0 or d.probe_op_us <= 0 or not Path(metrics).is_file():
        return
    from autoplan.cost.model_workload import workload_fn
    from autoplan.report.compare import at_speed_line, comparison, measured_run, read_metrics
    from autoplan.report.simulated import simulate_plan

    try:
        run = measured_run(read_metrics(metrics))
    except SpecError:  # e.g. a file continued by a resume under another layout: compare says why, if asked
        return
    # what ran is this runtime: compare with the autoplan stack's prediction, whatever the plan was made for
    data = comparison(simulate_plan(plan, workload_fn(plan.model, plan.cluster, plan.training)), run, None)
    if data["host_speed"] is not None:
        print(at_speed_line(data), flush=True)
