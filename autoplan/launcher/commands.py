"""The command lines ``autoplan run`` starts or prints: torchrun for one node, for each node of a
multi-node plan, and an sbatch script for Slurm.

Multi-node lines use torchrun's c10d rendezvous (one endpoint on node 0, one job id): every node starts
the same command with its own ``--node-rank``; ranks are contiguous per node, so a TP group (tp divides
devices per node) never spans two nodes, whatever order the nodes join in.
"""

from __future__ import annotations

import os
import shlex
from dataclasses import dataclass, field
from pathlib import Path

DEFAULT_PORT = 29500
ROOT = Path(__file__).resolve().parents[2]


@dataclass(frozen=True)
class Launch:
    """What to start on this machine, after the preflight: torchrun's shape and runtime.launch's options."""

    plan_path: str
    nproc_per_node: int
    nnodes: int = 1
    node_rank: int = 0
    rdzv_endpoint: str | None = None
    rdzv_id: str = "autoplan"
    runtime_args: tuple[str, ...] = field(default_factory=tuple)
    """Options for runtime.launch after the plan (``--steps 20 --metrics m.jsonl ...``)."""
    module: str = "runtime.launch"
    """The entry point every rank runs: runtime.launch (train) or runtime.eval_launch (autoplan eval)."""


def torchrun_options(nproc: int, nnodes: int = 1, node_rank: int | str = 0, endpoint: str | None = None,
                     rdzv_id: str = "autoplan") -> list[str]:
    if nnodes == 1:
        return ["--standalone", f"--nproc-per-node={nproc}"]
    return [f"--nnodes={nnodes}", f"--nproc-per-node={nproc}", f"--node-rank={node_rank}", "--rdzv-backend=c10d",
            f"--rdzv-endpoint={endpoint}", f"--rdzv-id={rdzv_id}"]


def runtime_command(launch: Launch) -> list[str]:
    return ["-m", launch.module, launch.plan_path, *launch.runtime_args]


def worker_env(nproc: int) -> dict[str, str]:
    """The environment torchrun and its ranks start with: this checkout importable, and one compute thread
    per rank unless the user chose (N ranks would oversubscribe the cores otherwise)."""
    env = dict(os.environ)
    env.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // nproc)))
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH", "")) if p)
    return env


def node_lines(launch: Launch, endpoint: str | None) -> list[str]:
    """One ``torchrun ...`` line per node (a template with $NODE_RANK beyond 16 nodes)."""
    ep = endpoint or f"NODE0_HOST:{DEFAULT_PORT}"
    tail = " ".join(shlex.quote(a) for a in runtime_command(launch))
    if launch.nnodes > 16:
        opts = torchrun_options(launch.nproc_per_node, launch.nnodes, "$NODE_RANK", ep, launch.rdzv_id)
        return [f"# on every node, with NODE_RANK = 0 .. {launch.nnodes - 1}:",
                "torchrun " + " ".join(opts) + " " + tail]
    lines = []
    for rank in range(launch.nnodes):
        opts = torchrun_options(launch.nproc_per_node, launch.nnodes, rank, ep, launch.rdzv_id)
        lines.append(f"torchrun {' '.join(opts)} {tail}    # node {rank}")
    return lines


def sbatch_script(launch: Launch, gpus: bool, job_name: str, partition: str | None = None, time: str | None = None,
                  account: str | None = None, env_setup: str | None = None) -> str:
    """A Slurm batch script that starts one torchrun per node; the rendezvous endpoint is the first node.
    ``env_setup`` runs on every node before torchrun (activating the environment autoplan is installed in)."""
    tail = " ".join(shlex.quote(a) for a in runtime_command(launch))
    gpu_line = f"#SBATCH --gpus-per-node={launch.nproc_per_node}\n" if gpus else ""
    for name, value in (("partition", partition), ("time", time), ("account", account)):
        if value is not None:
            gpu_line += f"#SBATCH --{name}={shlex.quote(value)}\n"
    setup = f"{env_setup} && " if env_setup else ""
    torchrun = (f"{setup}torchrun --nnodes=\"$SLURM_NNODES\" "
                f"--nproc-per-node={launch.nproc_per_node} --node-rank=\"$SLURM_NODEID\" --rdzv-backend=c10d "
                f"--rdzv-endpoint=\"$HEAD_NODE:{DEFAULT_PORT}\" --rdzv-id=\"$SLURM_JOB_ID\" {tail}")
    return (
        "#!/bin/bash\n"
        f"#SBATCH --job-name={shlex.quote(job_name)}\n"
        f"#SBATCH --nodes={launch.nnodes}\n"
        "#SBATCH --ntasks-per-node=1\n"
        f"{gpu_line}"
        "# written by autoplan run --slurm; submit with: sbatch <this file>\n"
        "set -euo pipefail\n"
        'export HEAD_NODE="$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)"\n'
        "# one task per node; each expands $SLURM_NODEID itself (hence the single quotes)\n"
        f"srun bash -c {shlex.quote(torchrun)}\n"
    )
