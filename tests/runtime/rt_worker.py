"""torchrun worker for the test matrix: runs every case of one world size for a few steps, in sequence.

Usage: torchrun --standalone --nproc_per_node N rt_worker.py N OUT.json
Rank 0 writes {case: {"losses": [...], "orders": {pp_rank: ["0F0", ...]}}}. ``orders`` is the compute
order torch actually executed per pipeline rank, recorded with hooks on each stage module: a forward
pre-hook (F) and a hook on the stage output's gradient (B, when that stage's backward starts).
"""

from __future__ import annotations

import json
import sys

import torch
import torch.distributed as dist

from rt_cases import CASES, RESUME, RESUME_AT, RESUME_STEPS, STEPS
from rt_helpers import make_plan
from runtime.mesh import build_mesh
from runtime.train.data import TokenSource
from runtime.trainer import RunOptions, Trainer, run


def record_order(trainer: Trainer, log: list[tuple[int, str]]) -> None:
    for sid, model in zip(trainer.parts.stage_ids, trainer.parts.models):
        def pre(_m, _args, sid=sid):
            if torch.is_grad_enabled():
                log.append((sid, "F"))

        def post(_m, _args, out, sid=sid):
            if out.requires_grad:
                out.register_hook(lambda g, sid=sid: log.append((sid, "B")))

        model.register_forward_pre_hook(pre)
        model.register_forward_hook(post)


def as_actions(log: list[tuple[int, str]]) -> list[str]:
    """(stage, kind) events -> "2F0"-style actions, micro-batches numbered in order per stage and kind."""
    count: dict[tuple[int, str], int] = {}
    out = []
    for sid, kind in log:
        i = count.get((sid, kind), 0)
        count[(sid, kind)] = i + 1
        out.append(f"{sid}{kind}{i}")
    return out


def run_case(kw: dict) -> dict:
    plan = make_plan(**kw)
    pm = build_mesh(plan.pp, plan.dp, plan.tp, torch.device("cpu"), plan.model.tie_embeddings and plan.num_stages > 1)
    trainer = Trainer(plan, pm, TokenSource(plan.model.vocab_size, plan.training.seq_len, plan.training.seed))
    log: list[tuple[int, str]] = []
    recompute = any(s.full_recompute for s in plan.stages)  # recomputation reruns forwards: no order then
    if plan.num_stages > 1 and not recompute:
        record_order(trainer, log)
    losses, norms = [], []
    for step in range(STEPS):
        res = trainer.step(step)
        losses.append(res.loss)
        norms.append(res.grad_norm)
        # record the second step: the first also runs PipelineStage's shape-inference forwards
        if step == 0:
            log.clear()
        if step == 1:
            first_log = list(log)
    per_rank = [None] * dist.get_world_size()
    dist.all_gather_object(per_rank, (pm.pp_rank, pm.dp_rank, pm.tp_rank, as_actions(first_log) if log else []))
    orders = {str(p): acts for p, d, t, acts in per_rank if d == 0 and t == 0 and acts}
    return {"losses": losses, "grad_norms": norms, "orders": orders}


def fresh_trainer(kw: dict) -> Trainer:
    plan = make_plan(**kw)
    pm = build_mesh(plan.pp, plan.dp, plan.tp, torch.device("cpu"), plan.model.tie_embeddings and plan.num_stages > 1)
    return Trainer(plan, pm, TokenSource(plan.model.vocab_size, plan.training.seq_len, plan.training.seed))


def resume_case(kw: dict, ckpt_dir: str) -> dict:
    """Losses of 20 straight steps, and of steps 11-20 after a save at step 10 and a resume into a fresh
    trainer whose weights are first scrambled (so only the checkpoint can make it match)."""
    quiet = dict(log_every=0)
    straight = run(fresh_trainer(kw), RunOptions(RESUME_STEPS, **quiet))
    run(fresh_trainer(kw), RunOptions(RESUME_AT, checkpoint_dir=ckpt_dir, checkpoint_every=RESUME_AT, **quiet))
    resumed_trainer = fresh_trainer(kw)
    with torch.no_grad():
        for p in resumed_trainer.parts.parameters():
            p.mul_(0.5)
    resumed = run(resumed_trainer, RunOptions(RESUME_STEPS, checkpoint_dir=ckpt_dir, resume=True, **quiet))
    return {"straight": straight, "resumed": resumed}


def main() -> None:
    world, out_path = int(sys.argv[1]), sys.argv[2]
    dist.init_process_group("gloo")
    results = {}
    for name, kw in CASES[world].items():
        results[name] = run_case(kw)
        if dist.get_rank() == 0:
            print(name, results[name]["losses"], flush=True)
    for name, kw in RESUME.get(world, {}).items():
        results[name] = resume_case(kw, f"{out_path}.{name}.ckpt")
    if dist.get_rank() == 0:
        with open(out_path, "w") as f:
            json.dump(results, f)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
