"""Everything ``autoplan run`` can check before a process starts, each mistake one SpecError line.

Before this, the ranks found bad options only after torchrun had started them (60-260 lines per
mistake, after up to a minute), and a plan for 128 nodes started 1,024 processes on one machine.
Checked here: the plan; the numbers (steps, checkpoint interval, timeout, restarts); the data file (a
regular file of uint16 tokens, long enough, every id below the vocabulary); the metrics file (writable);
the checkpoint folder (a writable folder, not locked by another run, holding a checkpoint of this
model when resuming and none when not); the trace folder; the plan's memory per pipeline rank,
re-derived from its model and layout by the cost model rather than read from its ``predicted`` block
(autoplan/report/recheck.py); and the devices: the plan's processes per node against the
GPUs this machine shows (or, for gloo plans, what its cores can run), with the torchrun line for every
node when the plan needs more than one.
"""

from __future__ import annotations

import argparse
import math
import os
import re
import stat
import sys
import tempfile
from pathlib import Path

from autoplan.errors import SpecError
from autoplan.launcher.commands import Launch, node_lines
from autoplan.report.recheck import recheck
from autoplan.schema import Plan
from autoplan.schema._files import check_folder, check_writable
from autoplan.schema._io import to_dict
from autoplan.schema.limits import MAX_NODES, MAX_STEPS

SAMPLE_TEXT = Path(__file__).resolve().parents[2] / "examples" / "shakespeare_bytes.bin"
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


def data_path(data: str | None, plan: Plan) -> str | None:
    """The token file runtime.launch gets (None: seeded synthetic tokens), checked like the ranks would."""
    if data == "synthetic":
        return None
    if data is None:
        return str(SAMPLE_TEXT) if plan.model.vocab_size >= 256 and SAMPLE_TEXT.is_file() else None
    if data == "":
        raise SpecError("--data: empty; give a token file (uint16 little-endian) or 'synthetic'")
    p = Path(data)
    try:
        st = p.stat()
    except OSError:
        raise SpecError(f"--data {data}: no such file (expected uint16 little-endian token ids)") from None
    if not stat.S_ISREG(st.st_mode):
        raise SpecError(f"--data {data}: not a regular file (expected uint16 little-endian token ids)")
    if st.st_size % 2:
        raise SpecError(f"--data {data}: odd byte count; expected uint16 little-endian token ids")
    need = plan.training.seq_len + 2
    if st.st_size // 2 < need:
        raise SpecError(f"--data {data}: {st.st_size // 2} tokens, need at least seq_len + 2 = {need}")
    import numpy as np  # a dependency of torch; fast even for GB files (memory-mapped)

    try:
        top = int(np.memmap(p, dtype="<u2", mode="r").max())
    except OSError as err:
        raise SpecError(f"--data {data}: cannot read ({err.strerror})") from None
    if top >= plan.model.vocab_size:
        raise SpecError(f"--data {data}: token id {top} >= model.vocab_size {plan.model.vocab_size}")
    return data


def _probe_folder(folder: Path, flag: str) -> None:
    try:
        fd, tmp = tempfile.mkstemp(dir=folder, prefix=".autoplan-probe-")
    except OSError as err:
        raise SpecError(f"{flag} {folder}: cannot write there ({err.strerror})") from None
    os.close(fd)
    os.unlink(tmp)


def check_checkpoint_dir(args: argparse.Namespace, plan: Plan) -> None:
    from runtime.train.lock import check_free
    from runtime.train.manifest import complete_checkpoints, model_fingerprint, read_manifest

    if args.checkpoint_dir is None:
        return
    folder = Path(args.checkpoint_dir)
    flag = "--checkpoint-dir"
    if str(args.checkpoint_dir) == "":
        raise SpecError(f"{flag}: empty; give a folder")
    if folder.exists() and not folder.is_dir():
        raise SpecError(f"{flag} {folder}: is a file, not a folder; give a folder for the checkpoints")
    if not folder.exists():
        if not folder.parent.is_dir():
            raise SpecError(f"{flag} {folder}: its parent {folder.parent} does not exist; create it first")
        _probe_folder(folder.parent, flag)
        found = []
    else:
        _probe_folder(folder, flag)
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
          check_devices: bool = True) -> Launch:
    """Nodes and processes per node for this machine's torchrun; NeedsMoreNodes when one node cannot do."""
    world, c = plan.world_size, plan.cluster
    rdzv_id = f"autoplan-{plan.model.name}"
    if args.nnodes is None and not args.slurm:
        if c.num_nodes > 1:
            launch = Launch(plan_path, c.devices_per_node, c.num_nodes, 0, args.rdzv_endpoint, rdzv_id, runtime_args)
            raise NeedsMoreNodes(
                f"plan: made for {c.num_nodes} nodes x {c.devices_per_node} devices; run one torchrun per node "
                "(the lines on stdout), `autoplan run --nnodes N --node-rank R --rdzv-endpoint HOST:PORT` on each "
                "node, or `autoplan run --slurm` for an sbatch script", node_lines(launch, args.rdzv_endpoint))
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
    return Launch(plan_path, nproc, nnodes, node_rank, endpoint, rdzv_id, runtime_args)


def runtime_args(args: argparse.Namespace, data: str | None) -> tuple[str, ...]:
    """runtime.launch's options (``--resume`` is added per attempt by the launcher)."""
    out = ["--steps", str(args.steps)]
    for flag, value in (("--backend", args.backend), ("--data", data), ("--metrics", args.metrics),
                        ("--checkpoint-dir", args.checkpoint_dir), ("--trace", getattr(args, "trace", None)),
                        ("--timeline", getattr(args, "timeline", None))):
        if value is not None:
            out += [flag, str(value)]
    if args.checkpoint_every:
        out += ["--checkpoint-every", str(args.checkpoint_every)]
    out += ["--timeout", f"{args.timeout:g}"]
    return tuple(out)


def preflight(args: argparse.Namespace) -> tuple[Plan, Launch]:
    from autoplan.schema import load_plan
    from autoplan.schema.training import require_runnable_precision

    plan = load_plan(args.plan)
    require_runnable_precision(plan.training)
    check_numbers(args)
    data = data_path(args.data, plan)
    if args.metrics is not None:
        if args.metrics == "":
            raise SpecError("--metrics: empty; give a file name")
        check_writable(args.metrics, "--metrics")
    if getattr(args, "timeline", None) is not None:
        check_writable(args.timeline, "--timeline")
    if getattr(args, "trace", None) is not None:
        check_folder(args.trace, "--trace")
    check_checkpoint_dir(args, plan)
    launch = shape(args, plan, str(args.plan), runtime_args(args, data))
    again = recheck(plan)  # after the cheap checks: it runs the cost model (~0.1 s)
    again.require_fits()
    if again.stale:
        print(f"autoplan run: warning: {again.stale}", file=sys.stderr, flush=True)
    return plan, launch
