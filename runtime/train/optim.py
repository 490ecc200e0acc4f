"""AdamW, the LR schedule (linear warm-up then cosine decay) and gradient clipping across all axes."""

from __future__ import annotations

import math

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.tensor import DTensor

from autoplan.schema import TrainingSetup


def param_groups(models: list[nn.Module], weight_decay: float) -> list[dict]:
    """Decay matrices (dim >= 2), not biases and norm weights (nanoGPT's rule)."""
    params = [p for m in models for p in m.parameters() if p.requires_grad]
    return [{"params": [p for p in params if p.dim() >= 2], "weight_decay": weight_decay},
            {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0}]


def lr_at(step: int, t: TrainingSetup) -> float:
    """Learning rate for optimizer step ``step`` (0-based): warm-up to learning_rate over warmup_steps,
    cosine down to min_learning_rate at decay_steps, flat after."""
    if step < t.warmup_steps:
        return t.learning_rate * (step + 1) / t.warmup_steps
    progress = min(1.0, (step - t.warmup_steps) / max(1, t.decay_steps - t.warmup_steps))
    return t.min_learning_rate + 0.5 * (1 + math.cos(math.pi * progress)) * (t.learning_rate - t.min_learning_rate)


def set_lr(optimizer: torch.optim.Optimizer, lr: float) -> None:
    for group in optimizer.param_groups:
        group["lr"] = lr


def _sum_squares(grads: list[torch.Tensor]) -> torch.Tensor:
    """Sum of squared entries over all ranks' shards, for grads that are DTensors on one mesh with one
    placement (or plain tensors, identical on every rank that holds them)."""
    total = torch.nn.utils.get_total_norm(grads, 2.0, foreach=False)
    if isinstance(total, DTensor):
        total = total.full_tensor()  # reduces the Partial norm over the sharded mesh axes
    return total.float() ** 2


def clip_grad_norm(params: list[nn.Parameter], max_norm: float, pp_group, excluded: set[int]) -> torch.Tensor:
    """Clip to a global 2-norm over every parameter of the model, counted once; returns the norm.

    Why our own (around torch's get_total_norm / clip_grads_with_norm_): with TP some grads are DTensors
    on the tp mesh, some on the dp x tp mesh (FSDP), some plain tensors (norms without SP), and torch's
    clip_grad_norm_ cannot stack norms of different meshes; nor does it know that each pipeline rank
    holds different parameters. So: norm per (mesh, placements) group, squares summed, summed over the
    pp group. ``excluded`` holds ids of parameters that are copies counted elsewhere (the tied head on
    the last stage, whose twin is the first stage's embedding).
    """
    groups: dict[object, list[torch.Tensor]] = {}
    for p in params:
        if p.grad is None or id(p) in excluded:
            continue
        g = p.grad
        key = (g.device_mesh, g.placements) if isinstance(g, DTensor) else "plain"
        groups.setdefault(key, []).append(g)
    device = params[0].device if params else torch.device("cpu")
    sq = torch.zeros((), device=device)
    for key in sorted(groups, key=str):  # the same order on every rank of a mesh: the collectives match
        sq = sq + _sum_squares(groups[key]).to(device)
    if pp_group is not None and dist.get_world_size(pp_group) > 1:
        dist.all_reduce(sq, group=pp_group)
    norm = sq.sqrt()
    if max_norm > 0:
        # torch's formula (clip_grads_with_norm_), with a Python float so DTensor and plain grads both take it
        coef = max_norm / (float(norm) + 1e-6)
        if coef < 1.0:
            for p in params:
                if p.grad is not None:
                    p.grad.mul_(coef)
    return norm


def build_optimizer(groups: list[dict], t: TrainingSetup, zero1_group=None) -> torch.optim.Optimizer:
    kwargs = dict(lr=t.learning_rate, betas=(0.9, 0.95), eps=1e-8, foreach=False)
    if zero1_group is not None:
        from runtime.parallel.data_parallel import Zero1AdamW
        return Zero1AdamW(groups, zero1_group, **kwargs)
    return torch.optim.AdamW(groups, **kwargs)
