"""Everything ``autoplan run`` can check before a process starts, each mistake one SpecError line.

Before this, the ranks found bad options only after torchrun had started them (60-260 lines per
mistake, after up to a minute), and a plan for 128 nodes started 1,024 processes on one machine.
Checked here: the plan; the numbers (steps, checkpoint interval, timeout, restarts) and the training
knobs; the data file (schema/token_file.py ``describe``: its sidecar, dtype and vocabulary against the
model's, long enough, its first ids below the vocabulary; no silent default); the metrics file (writable);
the checkpoint folder (a writable folder, not locked by another run, holding a checkpoint of this
model when resuming and none when not); the Hugging Face folders (``--init-from``: its config.json is the
plan's model and its safetensors hold every tensor in shape; ``--save-hf``: new or empty; hf_folders.py);
the trace and TensorBoard folders (paths of an sbatch script are
left to the ranks on the cluster); the plan's memory per pipeline rank,
re-derived from its model and layout by the cost model rather than read from its ``predicted`` block
(autoplan/report/recheck.py); and the devices: the plan's processes per node against the
GPUs this machine shows (or, for gloo plans, what its cores can run), with the torchrun line for every
node when the plan needs more than one.
"""

from __future__ import annotations

import argparse
import importlib.util
import math
import os
import re
import sys
from pathlib import Path

from autoplan.errors import SpecError
from autoplan.launcher.commands import Launch, node_lines
from autoplan.launcher.hf_folders import check_hf_folders
from autoplan.launcher.knobs import knob_arguments, knobs_of
from autoplan.launcher.validation import check_validation
from autoplan.schema.training import with_knobs
from autoplan.report.recheck import recheck
from autoplan.schema import Plan
from autoplan.schema._files import check_folder, check_writable
from autoplan.schema._io import to_dict
from autoplan.schema.limits import MAX_NODES, MAX_STEPS
from autoplan.schema.token_file import describe

SAMPLE_TEXT = Path(__file__).resolve().parents[2] / "examples" / "shakespeare_bytes.bin"
SAMPLE_VOCAB = 256
"""The sample text's ids are UTF-8 bytes: only a byte-level model (vocabulary 256) may default to it."""
DATA_HELP = ("token file: little-endian uint16 or uint32 ids with a FILE.json sidecar beside it (dtype, "
             "vocab_size, tokens; `autoplan prepare-data` makes both from text); without the sidecar it is read "
             "as uint16, for models of at most 65,536 tokens; or 'synthetic' for seeded random tokens. Default: "
             "the shipped sample text for byte-level models (vocabulary 256); other models need --data")
"""The ``--data`` help text for ``autoplan run`` (kept beside the rule it describes)."""
MAX_RESTARTS = 100
MAX_TIMEOUT_S = 7 * 86400.0
_ENDPOINT = re.compile(r"^\[?[A-Za-z0-9_.:-]+\]?:([0-9]{1,5})$")


class NeedsMoreNodes(SpecError):
    """The plan needs more than this machine: ``lines`` are the commands to run instead (for stdout)."""

    def __init__(self, message: str, lines: list[str]) -> None:
        super().__init__(message)
        self.lines = lines


def check_numbers(args: argparse.Namespace) -> None:
    for flag, value, low, high in (("--steps", args.steps, 1, MAX_STEPS),
                                   ("--checkpoint-every", args.checkpoint_every, 0, MAX_STEPS),
                                   ("--max-restarts", args.max_restarts, 0, MAX_RESTARTS)):
        if not low <= value <= high:
            raise SpecError(f"{flag}: {value} must be in [{low}, {high:,}]")
    if not (math.isfinite(args.timeout) and 0 < args.timeout <= MAX_TIMEOUT_S):
        raise SpecError(f"--timeout: {args.timeout} must be a number of seconds in (0, {MAX_TIMEOUT_S:g}]")
    if args.nproc is not None and args.nproc < 1:
        raise SpecError(f"--nproc: {args.nproc} must be at least 1")
    if args.resume and not args.checkpoint_dir:
        raise SpecError("--resume: needs --checkpoint-dir (the folder to resume from)")
    if args.checkpoint_every and not args.checkpoint_dir:
        raise SpecError("--checkpoint-every: needs --checkpoint-dir (where to save)")


def data_path(data: str | None, plan: Plan, on_this_host: bool = True, notices: list[str] | None = None) -> str | None:
    """The token file runtime.launch gets (None: seeded synthetic tokens), checked like the ranks would.

    No silent default: only byte-level models (vocabulary of exactly 256, gpt-tiny and llama-tiny) fall
    back to the shipped sample text, since its ids are bytes; any other model would train on ids that mean
    nothing to it, so it needs ``--data FILE`` or ``--data synthetic``. ``on_this_host=False`` (an sbatch
    script for a cluster whose file system this host does not see) checks the name only. ``notices``
    collects one-line notes for the user (the sample text in use, a file read as uint16 without a
    sidecar): the caller prints them after its other checks, so a refused run still says one line;
    without a list they are not printed.
    """
    note = notices.append if notices is not None else (lambda line: None)
    if data == "synthetic":
        return None
    model, t = plan.model, plan.training
    if data is None:
        if model.vocab_size != SAMPLE_VOCAB:
            raise SpecError(f"--data: model {model.name} has a vocabulary of {model.vocab_size:,} tokens; give a token "
                            "file (autoplan prepare-data makes one) or --data synthetic")
        if not SAMPLE_TEXT.is_file():
            raise SpecError(f"--data: the shipped sample text {SAMPLE_TEXT} is missing (an install without "
                            "examples/); give a token file or --data synthetic")
        if on_this_host:
            describe(SAMPLE_TEXT, model.vocab_size, t.seq_len)
        note(f"no --data: model {model.name} is byte-level, so it trains on the shipped sample text {SAMPLE_TEXT}; "
             "give --data FILE or --data synthetic for other data")
        return str(SAMPLE_TEXT)
    if data == "":
        raise SpecError("--data: empty; give a token file (autoplan prepare-data makes one) or 'synthetic'")
    if not on_this_host:
        return data  # read where the job runs; runtime.launch checks it there, each rank in one line
    info = describe(data, model.vocab_size, t.seq_len)  # missing, not a file, dtype, vocabulary, length, head ids
    if info.notice is not None:
        note(info.notice)
    return data


def check_checkpoint_dir(args: argparse.Namespace, plan: Plan) -> None:
    from runtime.train.lock import check_free
    from runtime.train.manifest import complete_checkpoints, model_fingerprint, read_manifest

    if args.checkpoint_dir is None:
        return
    folder = Path(args.checkpoint_dir)
    flag = "--checkpoint-dir"
    check_folder(args.checkpoint_dir, flag)  # a folder we may write in, or a new one whose parent we may
    found = []
    if folder.is_dir():
        check_free(folder)
        found = complete_checkpoints(folder)
    if not args.resume:
        if found:
            raise SpecError(f"{flag} {folder}: already holds checkpoints (newest {found[0][1].name}); pass --resume "
                            "to continue that run, or choose an empty folder")
        return
    if not found:
        raise SpecError(f"--resume: no complete checkpoint in {folder} (nothing to resume); drop --resume to start "
                        "from step 1")
    step, newest = found[0]
    try:
        manifest = read_manifest(newest)
    except (OSError, ValueError):
        manifest = None  # damaged: the ranks verify every file, report it and fall back
    if manifest is not None and manifest.model_sha256 != model_fingerprint(to_dict(plan.model)):
        raise SpecError(f"--resume: {newest} was written for another model than the plan's {plan.model.name!r}; "
                        "resume with the plan it was trained with, or use another --checkpoint-dir")
    if step >= args.steps:
        raise SpecError(f"--resume: {newest} is already at step {step}, --steps {args.steps} leaves nothing to run; "
                        "raise --steps")


def _gpu_count() -> int:
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def local_capacity(plan: Plan, backend: str | None) -> tuple[int, str]:
    """How many processes of this plan one node (this machine) can run, and what limits it."""
    if backend == "nccl" or (backend is None and plan.cluster.backend == "nccl"):
        gpus = _gpu_count()
        if gpus == 0:
            if backend == "nccl":
                raise SpecError("--backend nccl: no CUDA device is visible on this machine")
            raise SpecError(f"plan: made for {plan.cluster.name} (nccl, GPUs) but no CUDA device is visible; "
                            "plan for cpu-local, or pass --backend gloo to run it on CPU anyway")
        return gpus, f"this machine shows {gpus} GPUs"
    cores = os.cpu_count() or 1
    # gloo on CPU: one process per rank; oversubscribing the cores 4x still trains (the tests run 8 on 2)
    limit = max(8, 4 * cores)
    return limit, f"this machine's {cores} cores run at most {limit} gloo processes"


def _endpoint(value: str | None, nnodes: int) -> str | None:
    if nnodes == 1:
        return None
    if value is None:
        raise SpecError("--rdzv-endpoint: needed with --nnodes > 1; give node 0's HOST:PORT (the same on every node)")
    match = _ENDPOINT.match(value)
    if match is None or not 1 <= int(match.group(1)) <= 65535:
        raise SpecError(f"--rdzv-endpoint {value}: expected HOST:PORT with a port in 1..65535")
    return value


def shape(args: argparse.Namespace, plan: Plan, plan_path: str, runtime_args: tuple[str, ...],
          check_devices: bool = True, module: str = "runtime.launch") -> Launch:
    """Nodes and processes per node for this machine's torchrun; NeedsMoreNodes when one node cannot do.
    ``module``: what the ranks run (``Launch.module``)."""
    world, c = plan.world_size, plan.cluster
    rdzv_id = f"autoplan-{plan.module.name if hasattr(plan, 'module') else plan.model.name}"
    if args.nnodes is None and not args.slurm:
        if c.num_nodes > 1:
            launch = Launch(plan_path, c.devices_per_node, c.num_nodes, 0, args.rdzv_endpoint, rdzv_id, runtime_args,
                            module)
            command = getattr(args, "command", "run")
            raise NeedsMoreNodes(
                f"plan: made for {c.num_nodes} nodes x {c.devices_per_node} devices; run one torchrun per node "
                f"(the lines on stdout), `autoplan {command} --nnodes N --node-rank R --rdzv-endpoint HOST:PORT` on "
                "each node" + (", or `autoplan run --slurm` for an sbatch script" if command == "run" else ""),
                node_lines(launch, args.rdzv_endpoint))
        nnodes, node_rank = 1, 0
    else:
        nnodes = args.nnodes or c.num_nodes
        node_rank = args.node_rank
        if not 1 <= nnodes <= MAX_NODES:
            raise SpecError(f"--nnodes: {nnodes} must be in [1, {MAX_NODES:,}]")
        if world % nnodes:
            raise SpecError(f"--nnodes: the plan's {world} ranks do not split evenly over {nnodes} nodes")
        if not 0 <= node_rank < nnodes:
            raise SpecError(f"--node-rank: {node_rank} must be in [0, {nnodes - 1}]")
        if nnodes > 1 and args.max_restarts:
            raise SpecError("--max-restarts: restarts are done on one node only; drop it with --nnodes > 1")
    nproc = world // nnodes
    if args.nproc is not None and args.nproc != nproc:
        raise SpecError(f"--nproc {args.nproc}: the plan needs tp * cp * pp * dp = {world} processes"
                        + (f" ({nproc} per node)" if nnodes > 1 else ""))
    endpoint = None if args.slurm else _endpoint(args.rdzv_endpoint, nnodes)
    if check_devices and not args.slurm:
        capacity, what = local_capacity(plan, args.backend)
        if nproc > capacity:
            raise SpecError(f"plan: needs {nproc} processes on one node, but {what}; plan for fewer devices, "
                            "or run it on more nodes (--nnodes)")
    return Launch(plan_path, nproc, nnodes, node_rank, endpoint, rdzv_id, runtime_args, module)


def runtime_args(args: argparse.Namespace, data: str | None, knobs: dict | None = None) -> tuple[str, ...]:
    """runtime.launch's options (``--resume`` is added per attempt by the launcher); ``knobs``: the
    training knobs given on the command line (launcher/knobs.py)."""
    out = ["--steps", str(args.steps)]
    for flag, value in (("--backend", args.backend), ("--data", data), ("--metrics", args.metrics),
                        ("--checkpoint-dir", args.checkpoint_dir), ("--trace", getattr(args, "trace", None)),
                        ("--timeline", getattr(args, "timeline", None)),
                        ("--tensorboard", getattr(args, "tensorboard", None)),
                        ("--eval-data", getattr(args, "eval_data", None)),
                        ("--eval-sequences", getattr(args, "eval_sequences", None)),
                        ("--init-from", getattr(args, "init_from", None)),
                        ("--save-hf", getattr(args, "save_hf", None))):
        if value is not None:
            out += [flag, str(value)]
    if args.checkpoint_every:
        out += ["--checkpoint-every", str(args.checkpoint_every)]
    if getattr(args, "eval_every", 0):
        out += ["--eval-every", str(args.eval_every)]
    out += ["--timeout", f"{args.timeout:g}"]
    out += knob_arguments(knobs or {})
    return tuple(out)


def preflight(args: argparse.Namespace) -> tuple[Plan, Launch]:
    from autoplan.schema.io import load_any_plan
    from autoplan.schema.plan import ModulePlan, require_runnable

    plan = load_any_plan(args.plan)
    require_runnable(plan)
    if isinstance(plan, ModulePlan):
        return module_preflight(args, plan)
    check_numbers(args)
    knobs = knobs_of(args, args.steps)
    with_knobs(plan.training, knobs)  # one line naming the flag
    # an sbatch script runs elsewhere: paths that exist only on the cluster are checked by the ranks at start
    here = not args.slurm
    notices: list[str] = []
    data = data_path(args.data, plan, on_this_host=here, notices=notices)
    check_validation(args, plan, on_this_host=here)  # --eval-data / --eval-every / --eval-sequences
    if args.metrics == "":
        raise SpecError("--metrics: empty; give a file name")
    if here:
        if args.metrics is not None:
            check_writable(args.metrics, "--metrics")
        if getattr(args, "timeline", None) is not None:
            check_writable(args.timeline, "--timeline")
        if getattr(args, "trace", None) is not None:
            check_folder(args.trace, "--trace")
        if getattr(args, "tensorboard", None) is not None:
            check_folder(args.tensorboard, "--tensorboard")
        check_checkpoint_dir(args, plan)
    check_hf_folders(args, plan, on_this_host=here)
    if getattr(args, "tensorboard", None) is not None and importlib.util.find_spec("tensorboard") is None:
        raise SpecError("--tensorboard: needs the tensorboard package (torch writes its files with it): "
                        "pip install tensorboard")
    launch = shape(args, plan, str(args.plan), runtime_args(args, data, knobs))
    again = recheck(plan)  # after the cheap checks: it runs the cost model (~0.1 s)
    again.require_fits()
    if again.stale:
        print(f"autoplan run: warning: {again.stale}", file=sys.stderr, flush=True)
    for line in notices:  # last: a refusal above stays one line
        print(f"autoplan run: note: {line}", file=sys.stderr, flush=True)
    return plan, launch


def module_preflight(args: argparse.Namespace, plan) -> tuple:
    """The checks for a plan of a user's own module (schema/plan.py ``ModulePlan``): the options it cannot
    take refused in one line, the numbers and the metrics file, then the launch shape. No re-evaluation by
    the cost model: the plan embeds the module's reference, not its profile (the ranks check the factory's
    parameter count against it before the first collective)."""
    from autoplan.schema.plan import refuse_module_run_options

    refuse_module_run_options(args)
    check_numbers(args)
    knobs = knobs_of(args, args.steps)
    with_knobs(plan.training, knobs)
    if args.metrics == "":
        raise SpecError("--metrics: empty; give a file name")
    if args.metrics is not None and not args.slurm:
        check_writable(args.metrics, "--metrics")
    return plan, shape(args, plan, str(args.plan), runtime_args(args, None, knobs))
