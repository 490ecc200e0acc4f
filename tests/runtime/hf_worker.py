"""torchrun worker for ``--init-from`` under parallel layouts: many plans in one launch, in sequence.

Usage: torchrun --standalone --nproc_per_node N hf_worker.py OUT.json JOBS.json
A job is {"name", "plan": path, "steps": K, "init_from": folder}: a trainer is built as runtime.launch
builds it, filled from the folder by the function runtime.launch calls (runtime/hf/in_training.py), and
trained K steps. Rank 0 writes {name: {"losses": [...], "boxes": what the ranks read (read_boxes)}}.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch
import torch.distributed as dist

from torch.distributed.tensor import DTensor

from autoplan.schema import load_plan
from rt_helpers import finish_worker
from runtime.hf.load import held_indices, one_range
from runtime.mesh import mesh_of_plan
from runtime.models.init import canonical_name
from runtime.train.data import TokenSource
from runtime.trainer import Trainer


def read_boxes(trainer: Trainer, plan) -> str:
    """What each rank read: one box per parameter (held indices one range per dimension, as many as the
    local shard has), and over all ranks every element of every parameter read at least once."""
    mine = {}
    for model in trainer.parts.models:
        for name, p in model.named_parameters():
            index = held_indices(p)
            local = p.to_local() if isinstance(p, DTensor) else p
            if not all(one_range(i) for i in index) or tuple(i.numel() for i in index) != tuple(local.shape):
                return f"rank {dist.get_rank()}: {name} is not read as one box of its local shard"
            box = [(int(i[0]), int(i[0]) + i.numel()) if i.numel() else (0, 0) for i in index]
            mine.setdefault(canonical_name(name, plan.model), (tuple(p.shape), []))[1].append(box)
    every = [None] * dist.get_world_size()
    dist.all_gather_object(every, mine)
    counts: dict[str, torch.Tensor] = {}
    for held in every:
        for name, (shape, boxes) in held.items():
            count = counts.setdefault(name, torch.zeros(shape, dtype=torch.int32))
            for box in boxes:
                count[tuple(slice(lo, hi) for lo, hi in box)] += 1
    missed = [name for name, count in counts.items() if not bool((count > 0).all())]
    return f"not every element held: {missed}" if missed else "one box per parameter, every element held"


def main() -> None:
    out_path, jobs_path = sys.argv[1], sys.argv[2]
    dist.init_process_group("gloo")
    results = {}
    with open(jobs_path) as f:
        jobs = json.load(f)
    for job in jobs:
        plan = load_plan(job["plan"])
        pm = mesh_of_plan(plan, torch.device("cpu"))
        trainer = Trainer(plan, pm, TokenSource(plan.model.vocab_size, plan.training.seq_len, plan.training.seed),
                          init_from=Path(job["init_from"]))
        boxes = read_boxes(trainer, plan)
        losses = [trainer.step(step).loss for step in range(job["steps"])]
        results[job["name"]] = {"losses": losses, "boxes": boxes}
        if dist.get_rank() == 0:
            print(job["name"], losses, flush=True)
    finish_worker(out_path, results)


if __name__ == "__main__":
    main()
