"""The plan's optimizer (AdamW or SGD with its hyper-parameters), the LR schedule (linear warm-up then
cosine decay) and gradient clipping across all axes."""

from __future__ import annotations

import math

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.tensor import DTensor, Replicate

from autoplan.schema import TrainingSetup


def param_groups(model: nn.Module, weight_decay: float) -> list[dict]:
    """Decay matrices (dim >= 2), not biases and norm weights (nanoGPT's rule)."""
    params = [p for p in model.parameters() if p.requires_grad]
    return [{"params": [p for p in params if p.dim() >= 2], "weight_decay": weight_decay},
            {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0}]


def lr_at(step: int, t: TrainingSetup) -> float:
    """Learning rate for optimizer step ``step`` (0-based): warm-up to learning_rate over warmup_steps, then
    (``lr_schedule``) cosine or linear down to min_learning_rate at decay_steps and flat after, or constant."""
    if step < t.warmup_steps:
        return t.learning_rate * (step + 1) / t.warmup_steps
    if t.lr_schedule == "constant":
        return t.learning_rate
    progress = min(1.0, (step - t.warmup_steps) / max(1, t.decay_steps - t.warmup_steps))
    share = 0.5 * (1 + math.cos(math.pi * progress)) if t.lr_schedule == "cosine" else 1.0 - progress
    return t.min_learning_rate + share * (t.learning_rate - t.min_learning_rate)


def set_lr(optimizer, lr: float) -> None:
    for group in optimizer.param_groups:
        group["lr"] = lr


def _local_sum_squares(grad: torch.Tensor, stage_ranks: int) -> torch.Tensor:
    """This rank's share of sum(grad**2) over the whole model, such that summing the shares of all
    ranks counts every entry once. A DTensor's local shard is counted once per replica: it is divided by
    the ranks of its stage holding the same data (the mesh's Replicate axes and, when the mesh does not
    span the whole stage, the ranks outside it). A plain tensor is a full copy on every rank of the stage."""
    if not isinstance(grad, DTensor):
        return grad.detach().float().square().sum() / stage_ranks
    copies = stage_ranks // grad.device_mesh.size()
    for axis, placement in enumerate(grad.placements):
        if placement.is_replicate():
            copies *= grad.device_mesh.size(axis)
    return grad._local_tensor.detach().float().square().sum() / copies


def clip_grad_norm(params: list[nn.Parameter], max_norm: float, stage_ranks: int, excluded: set[int]) -> torch.Tensor:
    """Clip to the global 2-norm over every parameter of the model, counted once; returns the norm.

    Why our own (on top of torch's formula): with TP some grads are DTensors on the tp mesh, some on the
    dp x tp mesh (FSDP / replicate), some plain tensors (norms without SP), and each pipeline rank holds
    different parameters; torch's clip_grad_norm_ cannot combine norms of different meshes and does not
    know about pp. So each rank sums its shares of the squares (``_local_sum_squares``), one all-reduce
    over the world adds them up. MoE expert weights are DTensors on another root mesh, the expert mesh
    (pp, edp, ep, etp: runtime/mesh.py), 1-D (ep) or 2-D (edp x ep under FSDP2): the share rule needs only
    that every mesh lies inside the stage's ranks, which holds, so they count once too
    (tests/runtime/test_moe_layouts.py compares the experts' and routers' norms with serial).
    ``stage_ranks`` = tp * cp * dp, the ranks that hold one pipeline stage.
    ``excluded`` holds ids of parameters that are copies counted elsewhere (the tied head on the last
    stage, whose twin is the first stage's embedding, as Megatron does).
    """
    device = params[0].device if params else torch.device("cpu")
    for p in params:
        # norms under sequence parallel get Partial(sum) grads (a sum still to be taken over tp); reduce
        # them now, in parameter order (the same on every rank of the mesh), for the norm and the step
        if isinstance(p.grad, DTensor) and any(pl.is_partial() for pl in p.grad.placements):
            p.grad = p.grad.redistribute(placements=[Replicate() if pl.is_partial() else pl for pl in p.grad.placements])
    sq = torch.zeros((), device=device, dtype=torch.float32)
    for p in params:
        if p.grad is not None and id(p) not in excluded:
            sq += _local_sum_squares(p.grad, stage_ranks).to(device)
    if dist.is_initialized() and dist.get_world_size() > 1:
        dist.all_reduce(sq)
    norm = sq.sqrt()
    if max_norm > 0:
        # torch's formula (clip_grads_with_norm_), with a Python float so DTensor and plain grads both take it
        coef = max_norm / (float(norm) + 1e-6)
        if coef < 1.0:
            for p in params:
                if p.grad is not None:
                    p.grad.mul_(coef)
    return norm


def build_optimizer(model: nn.Module, t: TrainingSetup) -> torch.optim.Optimizer:
    """The plan's optimizer over one stage model's parameters (sharded ones step only their shard).

    foreach=False: a stage mixes DTensors of different meshes (tp; dp x tp) and plain tensors, which
    the multi-tensor kernels cannot group."""
    groups = param_groups(model, t.weight_decay)
    if t.optimizer == "sgd":
        return torch.optim.SGD(groups, lr=t.learning_rate, momentum=t.sgd_momentum, foreach=False)
    return torch.optim.AdamW(groups, lr=t.learning_rate, betas=t.adam_betas, eps=t.adam_eps, foreach=False)


class Optimizers:
    """One optimizer per stage model of this rank, stepped together (torchtitan's OptimizersContainer):
    each stage's optimizer state is then keyed by that stage's parameter names -- the full model's --
    so checkpoints do not depend on how many stages a rank holds."""

    def __init__(self, models: list[nn.Module], t: TrainingSetup) -> None:
        self.optimizers = [build_optimizer(m, t) for m in models]

    @property
    def param_groups(self) -> list[dict]:
        return [g for opt in self.optimizers for g in opt.param_groups]

    def zero_grad(self, set_to_none: bool = True) -> None:
        for opt in self.optimizers:
            opt.zero_grad(set_to_none=set_to_none)

    def step(self) -> None:
        for opt in self.optimizers:
            opt.step()
