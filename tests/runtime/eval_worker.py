"""torchrun worker for tests/runtime/test_eval_layouts.py: evaluates several plans in one launch.

Usage: torchrun --standalone --nproc_per_node N eval_worker.py OUT.json JOBS.json
A job is {"name", "plan": make_plan() keyword arguments, "data": token file, "sequences": N} and optionally
"checkpoint": a step folder whose weights are loaded (runtime/train/checkpoint.py load_weights).
Per job rank 0 writes {"sum", "tokens"} of the evaluation, "again" (a second evaluation after one
training step taken from the same weights reloaded: the pass is repeatable and training runs on after
it), and what every rank saw right after the first evaluation: "train_mode" (every module back in
training mode) and "sharded" (every FSDP parameter group resharded: the gathered parameters freed).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch
import torch.distributed as dist
from torch.distributed.fsdp import FSDPModule

from rt_helpers import finish_worker, make_plan
from runtime.evaluate import EvalWindows, Evaluator
from runtime.mesh import mesh_of_plan
from runtime.train.checkpoint import load_weights
from runtime.train.data import TokenSource
from runtime.trainer import Trainer


def fsdp_groups_sharded(models) -> bool:
    """Every FSDP2 parameter group of these models holds only its shards (private state, test-only)."""
    for model in models:
        for module in model.modules():
            if isinstance(module, FSDPModule):
                group = module._get_fsdp_state()._fsdp_param_group
                if group is not None and not group.is_sharded:
                    return False
    return True


def run_job(job: dict) -> dict:
    plan = make_plan(**job["plan"])
    pm = mesh_of_plan(plan, torch.device("cpu"))
    trainer = Trainer(plan, pm, TokenSource(plan.model.vocab_size, plan.training.seq_len, plan.training.seed,
                                            job["data"]))
    models = trainer.parts.models
    if job.get("checkpoint"):
        load_weights(Path(job["checkpoint"]), models, plan.model)
    evaluator = Evaluator(plan, pm, trainer.parts)
    windows = EvalWindows.open(job["data"], plan, job["sequences"])
    summed, tokens = evaluator.loss(windows)
    mine = {"train_mode": all(m.training for model in models for m in model.modules()),
            "sharded": fsdp_groups_sharded(models)}
    trainer.step(0)  # training goes on after an evaluation (and its own pipeline stages) ...
    if job.get("checkpoint"):
        load_weights(Path(job["checkpoint"]), models, plan.model)
    again = evaluator.loss(windows)  # ... and evaluation after training, on the same weights again
    every = [None] * dist.get_world_size()
    dist.all_gather_object(every, mine)
    return {"sum": summed, "tokens": tokens, "again": list(again),
            "train_mode": all(r["train_mode"] for r in every), "sharded": all(r["sharded"] for r in every)}


def main() -> None:
    out_path, jobs_path = sys.argv[1], sys.argv[2]
    dist.init_process_group("gloo")
    results = {job["name"]: run_job(job) for job in json.loads(Path(jobs_path).read_text())}
    finish_worker(out_path, results)


if __name__ == "__main__":
    main()
