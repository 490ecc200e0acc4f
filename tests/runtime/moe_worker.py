"""torchrun worker for tests/runtime/test_moe_layouts.py: every Mixture-of-Experts layout of one world size in
one launch (a launch costs 4-17 s on 2 cores), trained by the runtime's Trainer from a Plan with ep set.

Usage: torchrun --standalone --nproc_per_node 4 moe_worker.py OUT.json [CASE ...]   (default: every case)
Rank 0 writes, per case: layouts {"losses", "grad_norms", "expert_norms", "router_norms", "bias_l1"};
checkpoints {"straight", "resumed"}; evaluations {"sum", "tokens"}; one-layer expert tensor parallel checks
{"diffs": {quantity: max relative difference}, "rows_to_experts_4_7"}. ``expert_norms`` / ``router_norms``: the
global 2-norm of the routed experts' / the routers' (clipped) gradients after each step, summed over the ranks
exactly as the runtime's clipping sums its norm (runtime/train/optim.py ``_local_sum_squares``): AdamW's update
does not depend on a gradient's scale, so a wrong expert or router gradient factor would move the losses
little; these norms show it at once. ``bias_l1``: the sigmoid routers' balancing biases after each step (sum
of |b|).
"""

from __future__ import annotations

import copy
import sys

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh

from moe_cases import CASES, ETP_LAYERS, EVAL, EVAL_SEQUENCES, RESUME, RESUME_AT, RESUME_STEPS, STEPS, moe_plan
from rt_launcher import ROOT
from rt_helpers import finish_worker
from rt_worker import fresh_trainer, scrambled_trainer
from autoplan.schema.moe import MoESpec
from runtime.models.init import canonical_name
from runtime.models.moe import MoE, moe_layers
from runtime.parallel.expert_parallel import apply_expert_parallel
from runtime.train.optim import _local_sum_squares
from runtime.trainer import RunOptions, Trainer, run


def class_norms(trainer: Trainer) -> tuple[float, float]:
    """Global 2-norms of the expert and of the router gradients (each parameter counted once)."""
    sq = torch.zeros(2, dtype=torch.float64)
    stage_ranks = trainer.pm.dims.stage_ranks
    for model in trainer.parts.models:
        for name, p in model.named_parameters():
            name = canonical_name(name, trainer.plan.model)
            if p.grad is None:
                continue
            if ".mlp.experts." in name:
                sq[0] += float(_local_sum_squares(p.grad, stage_ranks))
            elif ".mlp.router." in name:
                sq[1] += float(_local_sum_squares(p.grad, stage_ranks))
    dist.all_reduce(sq)
    return float(sq[0].sqrt()), float(sq[1].sqrt())


def bias_l1(trainer: Trainer) -> float:
    """Sum over the MoE layers of |expert_bias|_1 (sigmoid routers; 0 for softmax): each layer's bias is on
    every rank of its stage, so the world sum is divided by the stage's rank count."""
    total = torch.zeros((), dtype=torch.float64)
    for model in trainer.parts.models:
        for m in moe_layers(model):
            if hasattr(m.router, "expert_bias"):
                total += m.router.expert_bias.double().abs().sum()
    dist.all_reduce(total)
    return float(total) / trainer.pm.dims.stage_ranks


def run_case(kw: dict) -> dict:
    trainer = fresh_trainer(moe_plan(**kw))
    out: dict = {"losses": [], "grad_norms": [], "expert_norms": [], "router_norms": [], "bias_l1": []}
    for step in range(STEPS):
        res = trainer.step(step)
        out["bias_l1"].append(bias_l1(trainer))
        experts, routers = class_norms(trainer)
        out["losses"].append(res.loss)
        out["grad_norms"].append(res.grad_norm)
        out["expert_norms"].append(experts)
        out["router_norms"].append(routers)
    return out


def resume_case(saved_by: dict, resumed_into: dict, ckpt_dir: str) -> dict:
    """Losses of RESUME_STEPS straight steps of the ``saved_by`` layout, and of the steps after its save at
    RESUME_AT and a resume into a fresh ``resumed_into`` trainer whose weights are first halved (so only the
    checkpoint can make it match)."""
    quiet = dict(log_every=0)
    plan = moe_plan(**saved_by)
    straight = run(fresh_trainer(plan), RunOptions(RESUME_STEPS, **quiet))
    run(fresh_trainer(plan), RunOptions(RESUME_AT, checkpoint_dir=ckpt_dir, checkpoint_every=RESUME_AT, **quiet))
    resumed = run(scrambled_trainer(moe_plan(**resumed_into)),
                  RunOptions(RESUME_STEPS, checkpoint_dir=ckpt_dir, resume=True, **quiet))
    return {"straight": straight, "resumed": resumed}


EVAL_DATA = str(ROOT / "examples" / "shakespeare_bytes.bin")


def eval_case(kw: dict) -> dict:
    """``autoplan eval``'s evaluator on the initial weights: summed loss and token count."""
    from runtime.evaluate import EvalWindows, Evaluator

    trainer = fresh_trainer(moe_plan(**kw))
    summed, tokens = Evaluator(trainer.plan, trainer.pm, trainer.parts).loss(
        EvalWindows.open(EVAL_DATA, trainer.plan, EVAL_SEQUENCES))
    return {"sum": summed, "tokens": tokens}


def etp_layer_case(shape: tuple[int, ...], axes: tuple[str, ...], skew: bool) -> dict:
    """One MoE layer split over a (ep, etp) DeviceMesh of the 4 ranks (``apply_expert_parallel``, grad_mean:
    every rank a data-parallel replica whose loss is the mean over its rows, the serial loss the mean over the
    ranks) against the serial layer on the concatenated rows: the relative max difference of the outputs, the
    input gradients (world x the serial ones), the expert gradients (``full_tensor``: every slice in place;
    scaled 1/(ep x etp) by grad_mean) and the router's (averaged over the ranks, as data parallelism does)."""
    world, rank, rows = dist.get_world_size(), dist.get_rank(), 3
    torch.manual_seed(0)
    serial = MoE(16, MoESpec(num_experts=8, experts_per_token=2, expert_ffn_size=8, router="sigmoid"))
    serial.reset_parameters(std=0.15)
    if skew:
        serial.router.expert_bias.copy_(torch.tensor([10.0, 10.0] + [0.0] * 6))
    par = apply_expert_parallel(copy.deepcopy(serial), init_device_mesh("cpu", shape, mesh_dim_names=axes))
    torch.manual_seed(1)
    x, r = torch.randn(world * rows, 5, 16), torch.randn(world * rows, 5, 16)
    mine = slice(rank * rows, (rank + 1) * rows)
    xs, xp = x.clone().requires_grad_(), x[mine].clone().requires_grad_()
    ys, yp = serial(xs), par(xp)
    (ys * r).mean().backward()
    (yp * r[mine]).mean().backward()
    router = par.router.weight.grad.clone()
    dist.all_reduce(router)
    router /= world

    def rel(a: torch.Tensor, b: torch.Tensor) -> float:
        return float((a.detach() - b.detach()).abs().max() / b.detach().abs().max())

    out = {"out": rel(yp, ys[mine]), "x.grad": rel(xp.grad / world, xs.grad[mine]),
           "router.grad": rel(router, serial.router.weight.grad)}
    for name in ("gate", "up", "down"):
        out[f"{name}.grad"] = rel(getattr(par.experts, name).grad.full_tensor(), getattr(serial.experts, name).grad)
    errors = torch.tensor(list(out.values()), dtype=torch.float64)
    dist.all_reduce(errors, op=dist.ReduceOp.MAX)
    late_rows = par.tokens_per_expert[4:].sum()  # rows this rank routed to the experts of ep coordinate 1
    dist.all_reduce(late_rows)
    return {"diffs": dict(zip(out, errors.tolist())), "rows_to_experts_4_7": int(late_rows)}


def main(out_path: str, only: list[str]) -> None:
    dist.init_process_group("gloo")
    results = {}
    for name, kw in CASES.items():
        if only and name not in only:
            continue
        results[name] = run_case(kw)
        if dist.get_rank() == 0:
            print(name, results[name]["losses"], flush=True)
    for name, kw in EVAL.items():
        if not only or name in only:
            results[name] = eval_case(kw)
    for name, kw in ETP_LAYERS.items():
        if not only or name in only:
            results[name] = etp_layer_case(**kw)
    for name, (saved_by, resumed_into) in RESUME.items():
        if only and name not in only:
            continue
        results[name] = resume_case(saved_by, resumed_into, f"{out_path}.{name}.ckpt")
    finish_worker(out_path, results)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2:])
