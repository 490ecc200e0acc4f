"""torchrun worker for the multi-process tests: runs many cases in one launch, in sequence.

Usage: torchrun --standalone --nproc_per_node N rt_worker.py N OUT.json            (rt_cases.CASES[N])
       torchrun --standalone --nproc_per_node N rt_worker.py jobs OUT.json JOBS.json (plan files)
A job is {"name", "plan": path, "steps": K} plus, optionally, "checkpoint_dir" with "save_every" (save)
or "resume": true (restore the newest checkpoint into a fresh trainer whose weights are first halved,
so only the checkpoint can make it match, and run to K).
Rank 0 writes {case: {"losses": [...], "grad_norms": [...], "orders": {pp_rank: ["0F0", ...]}}}.
``orders`` is the compute order torch actually executed per pipeline rank in the second step, recorded
with hooks on each stage module: a forward pre-hook (F) and a hook on the stage output's gradient (B,
when that stage's backward starts); recomputation reruns blocks inside the stage, not the stage.
"""

from __future__ import annotations

import json
import sys

import torch
import torch.distributed as dist

from autoplan.schema import Plan, load_plan
from rt_cases import CASES, RESUME, RESUME_AT, RESUME_STEPS, STEPS
from rt_helpers import finish_worker, make_plan
from runtime.mesh import mesh_of_plan
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
    return run_plan(make_plan(**kw), STEPS)


def run_plan(plan: Plan, steps: int) -> dict:
    trainer = fresh_trainer(plan)
    log: list[tuple[int, str]] = []
    if plan.num_stages > 1:
        record_order(trainer, log)
    losses, norms = [], []
    first_log: list[tuple[int, str]] = []
    for step in range(steps):
        res = trainer.step(step)
        losses.append(res.loss)
        norms.append(res.grad_norm)
        # record the second step: the first also runs PipelineStage's shape-inference forwards
        if step == 0:
            log.clear()
        if step == 1:
            first_log = list(log)
    per_rank = [None] * dist.get_world_size()
    pm = trainer.pm
    dist.all_gather_object(per_rank, (pm.pp_rank, (pm.dp_rank, pm.cp_rank, pm.tp_rank), as_actions(first_log)))
    orders = {str(p): acts for p, others, acts in per_rank if others == (0, 0, 0) and acts}
    return {"losses": losses, "grad_norms": norms, "orders": orders}


def fresh_trainer(plan: Plan) -> Trainer:
    pm = mesh_of_plan(plan, torch.device("cpu"))
    return Trainer(plan, pm, TokenSource(plan.model.vocab_size, plan.training.seq_len, plan.training.seed))


def resume_case(kw: dict, ckpt_dir: str) -> dict:
    """Losses of 20 straight steps, and of steps 11-20 after a save at step 10 and a resume into a fresh
    trainer whose weights are first scrambled (so only the checkpoint can make it match)."""
    quiet = dict(log_every=0)
    plan = make_plan(**kw)
    straight = run(fresh_trainer(plan), RunOptions(RESUME_STEPS, **quiet))
    run(fresh_trainer(plan), RunOptions(RESUME_AT, checkpoint_dir=ckpt_dir, checkpoint_every=RESUME_AT, **quiet))
    resumed = run(scrambled_trainer(plan), RunOptions(RESUME_STEPS, checkpoint_dir=ckpt_dir, resume=True, **quiet))
    return {"straight": straight, "resumed": resumed}


def scrambled_trainer(plan: Plan) -> Trainer:
    trainer = fresh_trainer(plan)
    with torch.no_grad():
        for p in trainer.parts.parameters():
            p.mul_(0.5)
    return trainer


def run_job(job: dict) -> dict:
    """One plan file: trained from scratch (recording losses, norms and the executed order), or with a
    checkpoint every ``save_every`` steps, or resumed from the newest checkpoint."""
    plan, quiet = load_plan(job["plan"]), dict(log_every=0)
    if job.get("resume"):
        opts = RunOptions(job["steps"], checkpoint_dir=job["checkpoint_dir"], resume=True, **quiet)
        return {"losses": run(scrambled_trainer(plan), opts)}
    if job.get("save_every"):
        opts = RunOptions(job["steps"], checkpoint_dir=job["checkpoint_dir"], checkpoint_every=job["save_every"], **quiet)
        return {"losses": run(fresh_trainer(plan), opts)}
    return run_plan(plan, job["steps"])


def main() -> None:
    mode, out_path = sys.argv[1], sys.argv[2]
    dist.init_process_group("gloo")
    results = {}
    if mode == "jobs":
        with open(sys.argv[3]) as f:
            for job in json.load(f):
                results[job["name"]] = run_job(job)
                if dist.get_rank() == 0:
                    print(job["name"], results[job["name"]]["losses"], flush=True)
    else:
        world = int(mode)
        for name, kw in CASES[world].items():
            results[name] = run_case(kw)
            if dist.get_rank() == 0:
                print(name, results[name]["losses"], flush=True)
        for name, kw in RESUME.get(world, {}).items():
            results[name] = resume_case(kw, f"{out_path}.{name}.ckpt")
    finish_worker(out_path, results)


if __name__ == "__main__":
    main()
