"""torchrun worker for the tests of a user's own module: runs module plan files in one launch, in sequence.

Usage: torchrun --standalone --nproc_per_node N module_worker.py OUT.json JOBS.json
A job is {"name", "plan": path, "steps": K}; rank 0 writes {name: {"losses": [...]}}.
"""

from __future__ import annotations

import json
import sys

import torch
import torch.distributed as dist

from autoplan.schema.io import load_any_plan
from rt_helpers import finish_worker
from runtime.mesh import build_mesh
from runtime.module_trainer import ModuleTrainer


def run_job(job: dict) -> dict:
    plan = load_any_plan(job["plan"])
    trainer = ModuleTrainer(plan, build_mesh(plan.dims, torch.device("cpu"), need_embedding_group=False))
    return {"losses": [trainer.step(step).loss for step in range(job["steps"])]}


def main() -> None:
    out_path, jobs_path = sys.argv[1], sys.argv[2]
    dist.init_process_group("gloo")
    results = {}
    with open(jobs_path) as f:
        for job in json.load(f):
            results[job["name"]] = run_job(job)
            if dist.get_rank() == 0:
                print(job["name"], results[job["name"]]["losses"], flush=True)
    finish_worker(out_path, results)


if __name__ == "__main__":
    main()
