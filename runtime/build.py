"""From a plan to this rank's runnable pieces, in torchtitan's order:
stage split -> TP -> recomputation -> DP/ZeRO (FSDP2) -> PipelineStage + schedule, then the optimizer."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import nn

from autoplan.schema import Plan
from runtime.device import MemoryMeter
from runtime.mesh import ParallelMesh
from runtime.models import build_model
from runtime.parallel.data_parallel import apply_data_parallel
from runtime.parallel.pipeline import build_pipeline, split_stage
from runtime.parallel.recompute import apply_recompute
from runtime.parallel.tensor_parallel import apply_tp
from runtime.train.optim import build_optimizer, param_groups


@dataclass
class Parts:
    """What one rank runs: its stage models (one per local stage), the schedule (None when there is a
    single stage), the optimizer, and the tied-embedding bookkeeping."""

    models: list[nn.Module]
    stage_ids: list[int]
    schedule: object | None
    optimizer: torch.optim.Optimizer
    has_first: bool
    has_last: bool
    loss_parallel: bool
    tied_params: list[nn.Parameter] = field(default_factory=list)
    """Embedding on stage 0 / head on the last stage: the two copies whose grads are summed."""
    clip_excluded: set[int] = field(default_factory=set)

    def parameters(self) -> list[nn.Parameter]:
        return [p for m in self.models for p in m.parameters()]

    def container(self) -> nn.Module:
        """One module for DCP: the stage model itself, or a ModuleList when a rank holds several."""
        return self.models[0] if len(self.models) == 1 else nn.ModuleList(self.models)


def cross_entropy(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Mean next-token loss; logits [B, T, V] (fp32 for the softmax under autocast), targets [B, T]."""
    return F.cross_entropy(logits.flatten(0, 1).float(), targets.flatten(0, 1))


def build_parts(plan: Plan, pm: ParallelMesh, meter: MemoryMeter | None = None) -> Parts:
    num_stages = plan.num_stages
    torch.manual_seed(plan.training.seed)  # every rank builds the same full model, then keeps its part
    full = build_model(plan.model, device=pm.device, seq_len=plan.training.seq_len)
    stage_ids = [i for i in range(num_stages) if i % plan.pp == pm.pp_rank]
    # loss_parallel keeps logits vocab-sharded into the loss; only where we compute the loss ourselves
    # (one stage): the pipelining schedule computes it on plain tensors
    loss_parallel = plan.tp > 1 and num_stages == 1
    models = []
    for sid in stage_ids:
        stage = plan.stages[sid]
        model = split_stage(full, stage, num_stages) if num_stages > 1 else full
        if plan.tp > 1:
            apply_tp(model, pm.tp_mesh, plan.sequence_parallel, loss_parallel)
        apply_recompute(model, stage)
        if meter is not None:
            for block in model.blocks.values():
                block.register_forward_hook(meter.hook)
        apply_data_parallel(model, pm.dp_mesh, plan.zero_stage, plan.offload_optimizer)
        models.append(model)
    del full
    has_first, has_last = 0 in stage_ids, num_stages - 1 in stage_ids
    parts_kw = {}
    if plan.model.tie_embeddings and num_stages > 1:
        tied = []
        if has_first:
            tied.append(models[stage_ids.index(0)].embed.tok.weight)
        if has_last:
            head = models[stage_ids.index(num_stages - 1)].head.weight
            tied.append(head)
            parts_kw["clip_excluded"] = {id(head)}  # counted once, on the first stage (Megatron)
        parts_kw["tied_params"] = tied
    zero1 = pm.group("dp") if plan.zero_stage == 1 and plan.dp > 1 and not plan.offload_optimizer else None
    optimizer = build_optimizer(param_groups(models, plan.training.weight_decay), plan.training, zero1)
    schedule = None
    if num_stages > 1:
        schedule = build_pipeline(models, stage_ids, num_stages, plan.schedule, plan.num_microbatches,
                                  cross_entropy, pm.device, pm.group("pp"))
    return Parts(models, stage_ids, schedule, optimizer, has_first, has_last, loss_parallel, **parts_kw)
