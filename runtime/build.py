"""From a plan to this rank's runnable pieces, torchtitan's way: each local stage is built alone on the
meta device, then TP -> context parallelism -> recomputation -> DP/ZeRO (FSDP2, over the dp x cp ranks)
are applied to it while it holds no memory;
only then is it materialised (``to_empty``: each rank allocates just its shards) and initialised with
layout-free values (runtime/models/init.py). Then PipelineStage + the plan's schedule, and the optimizer.

``materialize=False`` stops before ``to_empty``: what ``autoplan run --dry-run`` inspects (parameters
and their sharding, layers per stage) for any plan size, on a fake process group.

``init_from`` (a Hugging Face model folder, ``--init-from``): the materialised shards are read from its
safetensors files (runtime/hf/load.py, each rank its own boxes) instead of drawn.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from autoplan.schema import Plan
from autoplan.schema.schedule import stages_of_rank
from runtime.device import MemoryMeter, autocast_dtype
from runtime.mesh import ParallelMesh
from runtime.models import build_stage_model
from runtime.models.dropout import DropoutState, attach
from runtime.models.init import init_buffers, init_parameters
from runtime.parallel.context_parallel import apply_context_parallel, shard_positions
from runtime.parallel.data_parallel import apply_data_parallel
from runtime.parallel.expert_parallel import apply_plan_experts
from runtime.parallel.pipeline import DropoutRows, build_pipeline
from runtime.parallel.recompute import apply_recompute
from runtime.parallel.tensor_parallel import apply_tp
from runtime.train.loss_scale import LossScale
from runtime.train.optim import Optimizers
from runtime.validate import check_runtime_support


@dataclass
class Parts:
    """What one rank runs: its stage models (one per local stage), the schedule (None when there is a
    single stage), the optimizers (one per stage model), the dropout state, the tied-embedding bookkeeping."""

    models: list[nn.Module]
    stage_ids: list[int]
    schedule: object | None
    optimizer: Optimizers
    has_first: bool
    has_last: bool
    loss_parallel: bool
    dropout: DropoutState
    tied_params: list[nn.Parameter] = field(default_factory=list)
    """Embedding on stage 0 / head on the last stage: the two copies whose grads are summed."""
    clip_excluded: set[int] = field(default_factory=set)
    positions: torch.Tensor | None = None
    """Context parallelism: the global positions of this rank's tokens (None: the whole sequence)."""
    loss_scale: LossScale = field(default_factory=lambda: LossScale(False))
    """fp16: the dynamic loss scale the losses are multiplied by before backward (runtime/train/loss_scale.py)."""

    def parameters(self) -> list[nn.Parameter]:
        return [p for m in self.models for p in m.parameters()]


def cross_entropy(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Mean next-token loss; logits [B, T, V] (fp32 for the softmax under autocast), targets [B, T]."""
    return F.cross_entropy(logits.flatten(0, 1).float(), targets.flatten(0, 1))


def local_stage_ids(plan: Plan, pp_rank: int) -> list[int]:
    """Stages of one pipeline rank, as the plan's schedule places them (schema/schedule.py)."""
    return list(stages_of_rank(plan.schedule, pp_rank, plan.pp, plan.virtual_stages))


def build_stage(plan: Plan, pm: ParallelMesh, stage_id: int, loss_parallel: bool, meter: MemoryMeter | None,
                materialize: bool, positions: torch.Tensor | None = None, init_from: Path | None = None) -> nn.Module:
    """One stage of the plan for this rank: meta build, TP, CP, recomputation, DP/ZeRO, then real memory,
    filled with layout-free initial values or, with ``init_from``, a Hugging Face folder's weights."""
    stage, last = plan.stages[stage_id], plan.num_stages - 1
    model = build_stage_model(plan.model, plan.training.seq_len, range(*stage.layers), stage_id == 0,
                              stage_id == last, device="meta", vocab_rows=plan.padded_vocab_size)
    if plan.tp > 1:
        apply_tp(model, pm.tp_mesh, plan.sequence_parallel, loss_parallel)
    if positions is not None:
        apply_context_parallel(model, pm.group("cp"), positions)
    if pm.expert_mesh is not None:
        apply_plan_experts(model, pm)
    recompute_shard_materialize(model, plan, pm, stage, meter, materialize)
    if materialize:
        init_buffers(model)
        if init_from is not None:
            from runtime.hf.load import load_hf_weights
            load_hf_weights([model], plan.model, init_from)
        else:
            init_parameters(model, plan.model, plan.training.seed)
    return model


def recompute_shard_materialize(model: nn.Module, plan, pm: ParallelMesh, stage, meter: MemoryMeter | None,
                                materialize: bool) -> None:
    """The part of a stage's build after its tensor (and context) parallelism, the same for the reference
    models and a user's module (runtime/module_build.py): recomputation per block, the memory meter's hooks,
    DP/ZeRO (FSDP2 / replicate), then, with ``materialize``, real memory for this rank's shards (values are
    the caller's to fill)."""
    apply_recompute(model, stage)
    if meter is not None:
        for block in model.blocks.values():
            block.register_forward_hook(meter.hook)
    apply_data_parallel(model, pm.dp_cp_mesh, plan.zero_stage, plan.offload_optimizer,
                        autocast_dtype(pm.device, plan.training.precision),
                        pm.edp_mesh if pm.expert_mesh is not None else None)
    if materialize:
        # with offload FSDP2 keeps the sharded parameters on the host (torchtitan's init_device)
        to_empty_keeping_ties(model, torch.device("cpu") if plan.offload_optimizer else pm.device)
        move_buffers(model, pm.device)


def to_empty_keeping_ties(model: nn.Module, device: torch.device) -> None:
    """``model.to_empty(device)`` with shared parameters still shared. ``to_empty`` makes a new Parameter
    for every module slot, so a tied head (``head.weight is embed.tok.weight``) comes out as two tensors:
    the one-rank plan then trained an untied model and its checkpoints lacked the head's optimizer state
    (issue 30). Under a data-parallel wrapper FSDP2 already keeps one parameter per tensor; re-tying is
    then a no-op. Our own code because torch's ``to_empty`` has no option to keep ties."""
    slots: dict[int, list[tuple[nn.Module, str]]] = {}
    for module in model.modules():
        for name, param in module._parameters.items():
            if param is not None:
                slots.setdefault(id(param), []).append((module, name))
    model.to_empty(device=device)
    for shared in slots.values():
        owner, name = shared[0]
        for module, other in shared[1:]:
            if module._parameters[other] is not owner._parameters[name]:
                module._parameters[other] = owner._parameters[name]


def move_buffers(model: nn.Module, device: torch.device) -> None:
    for module in model.modules():
        for name, buf in module._buffers.items():
            if buf is not None and buf.device != device:
                module._buffers[name] = buf.to(device)


def build_parts(plan: Plan, pm: ParallelMesh, meter: MemoryMeter | None = None, materialize: bool = True,
                init_from: Path | None = None) -> Parts:
    check_runtime_support(plan)
    num_stages = plan.num_stages
    stage_ids = local_stage_ids(plan, pm.pp_rank)
    # loss_parallel keeps logits vocab-sharded into the loss under any tp > 1, pipelined too (the last
    # stage's output goes to no other stage; the schedule's step runs inside the loss_parallel context, as
    # torchtitan's train step): whole logits on every TP rank would cost tp times the loss's memory
    loss_parallel = plan.tp > 1
    positions = None
    if plan.cp > 1:
        positions = torch.tensor(shard_positions(plan.training.seq_len, plan.cp, pm.cp_rank), device=pm.device)
    models = [build_stage(plan, pm, sid, loss_parallel, meter, materialize, positions, init_from) for sid in stage_ids]
    dropout = DropoutState(plan.training.seed)
    for model in models:
        attach(model, dropout)
    has_first, has_last = 0 in stage_ids, num_stages - 1 in stage_ids
    parts_kw: dict = {"positions": positions}
    if plan.model.tie_embeddings and num_stages > 1:
        tied = []
        if has_first:
            tied.append(models[stage_ids.index(0)].embed.tok.weight)
        if has_last:
            head = models[stage_ids.index(num_stages - 1)].head.weight
            tied.append(head)
            parts_kw["clip_excluded"] = {id(head)}  # counted once, on the first stage (Megatron)
        parts_kw["tied_params"] = tied
    optimizer = Optimizers(models, plan.training)
    loss_scale = LossScale(autocast_dtype(pm.device, plan.training.precision) == torch.float16)
    schedule = None
    if num_stages > 1:
        rows_per_replica = plan.training.global_batch_size // plan.dp

        def scaled_loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
            return loss_scale.scale(cross_entropy(logits, targets))

        schedule = build_pipeline(plan, dict(zip(stage_ids, models)), pm, scaled_loss,
                                  DropoutRows(dropout, plan.micro_batch_size, pm.dp_rank * rows_per_replica))
    return Parts(models, stage_ids, schedule, optimizer, has_first, has_last, loss_parallel, dropout,
                 loss_scale=loss_scale, **parts_kw)
