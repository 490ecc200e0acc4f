"""From a plan for a user's own module (``ModulePlan``) to this rank's runnable pieces: the same order as
runtime/build.py -- each local stage built alone on meta from the factory, TP per block (the adapter's
``tp_plan``), full recomputation per block, DP/ZeRO (FSDP2 / replicate), then ``to_empty`` -- and then the
factory's own initial values, each rank keeping its shards (runtime/models/adapter.py says why).
"""

from __future__ import annotations

import torch
from torch import nn
from torch.distributed.tensor import DTensor, distribute_tensor
from torch.distributed.tensor.parallel import parallelize_module

from autoplan.errors import SpecError
from autoplan.schema.plan import ModulePlan
from runtime.build import Parts, local_stage_ids, recompute_shard_materialize
from runtime.device import MemoryMeter, autocast_dtype
from runtime.mesh import ParallelMesh
from runtime.models.adapter import ModuleAdapter, build_whole, count_params, load_factory, shared_across, split, stage_module
from runtime.models.dropout import DropoutState
from runtime.models.init import WRAPPER_PREFIXES
from runtime.parallel.pipeline import DropoutRows, build_pipeline
from runtime.train.loss_scale import LossScale
from runtime.train.optim import Optimizers


def check_module(plan: ModulePlan) -> tuple[object, ModuleAdapter]:
    """The factory and its adapter, checked against the plan on meta (no memory): the parameter count and
    the blocks the profile saw, a TP plan where tp > 1, no parameter shared across pipeline stages."""
    ref = plan.module
    build, adapter = load_factory(ref.factory)
    with torch.device("meta"):
        whole = build_whole(build, ref.factory)
    count = count_params(whole)
    if count != ref.total_params:
        raise SpecError(f"module.total_params: {ref.factory} builds {count:,} parameters, the plan says "
                        f"{ref.total_params:,} (the factory changed since the profile); profile and plan it again")
    embed, blocks, head = split(whole, adapter, ref.factory)
    if len(blocks) != ref.num_blocks:
        raise SpecError(f"module.num_blocks: the adapter gives {len(blocks)} blocks, the plan {ref.num_blocks}; "
                        "profile and plan it again")
    if plan.tp > 1 and adapter.tp_plan(blocks[0]) is None:
        raise SpecError(f"tp: {plan.tp} needs the adapter's tp_plan(block) ({ref.factory}'s adapter has none); "
                        "write one, or re-plan with --tp 1")
    if plan.num_stages > 1 and shared_across([m for m in (embed, *blocks, head) if m is not None]):
        raise SpecError("pp: the module shares parameters between its parts (a tied embedding?), which separate "
                        "pipeline stages cannot; re-plan with --pp 1")
    return build, adapter


def canonical(name: str) -> str:
    for prefix in WRAPPER_PREFIXES:
        name = name.replace(prefix, "")
    return name


def reference_values(plan: ModulePlan, build, adapter: ModuleAdapter) -> dict[str, torch.Tensor]:
    """Every parameter and buffer of the whole module as the factory initialises it under the plan's
    seed, on the host, by the stage modules' names (``embed.*``, ``blocks.<i>.*``, ``head.*``)."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(plan.training.seed)
        with torch.device("cpu"):
            whole = stage_module(build_whole(build, plan.module.factory), adapter, plan.module.factory, None,
                                 True, True)
    return {**dict(whole.named_parameters()), **dict(whole.named_buffers())}


@torch.no_grad()
def fill(model: nn.Module, values: dict[str, torch.Tensor]) -> None:
    """Each parameter (possibly a TP / FSDP shard) and buffer takes its part of the full value."""
    for name, t in [*model.named_parameters(), *model.named_buffers()]:
        full = values[canonical(name)].to(t.device, t.dtype)
        if isinstance(t, DTensor):
            t.to_local().copy_(distribute_tensor(full, t.device_mesh, t.placements, src_data_rank=None).to_local())
        else:
            t.copy_(full)


def build_module_stage(plan: ModulePlan, pm: ParallelMesh, build, adapter: ModuleAdapter, stage_id: int,
                       meter: MemoryMeter | None, values: dict[str, torch.Tensor] | None) -> nn.Module:
    stage = plan.stages[stage_id]
    with torch.device("meta"):
        model = stage_module(build_whole(build, plan.module.factory), adapter, plan.module.factory,
                             range(*stage.layers), stage_id == 0, stage_id == plan.num_stages - 1)
    if plan.tp > 1:
        for block in model.blocks.values():
            parallelize_module(block, pm.tp_mesh, adapter.tp_plan(block))
    recompute_shard_materialize(model, plan, pm, stage, meter, values is not None)
    if values is not None:
        fill(model, values)
    return model


def build_module_parts(plan: ModulePlan, pm: ParallelMesh, meter: MemoryMeter | None = None,
                       materialize: bool = True) -> tuple[Parts, ModuleAdapter]:
    build, adapter = check_module(plan)
    values = reference_values(plan, build, adapter) if materialize else None
    stage_ids = local_stage_ids(plan, pm.pp_rank)
    models = [build_module_stage(plan, pm, build, adapter, sid, meter, values) for sid in stage_ids]
    dropout = DropoutState(plan.training.seed)  # unused: the module's own dropout draws from torch's generator
    optimizer = Optimizers(models, plan.training)
    loss_scale = LossScale(autocast_dtype(pm.device, plan.training.precision) == torch.float16)
    schedule = None
    if plan.num_stages > 1:
        def scaled_loss(output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
            return loss_scale.scale(adapter.loss(output, target))

        schedule = build_pipeline(plan, dict(zip(stage_ids, models)), pm, scaled_loss,
                                  DropoutRows(dropout, plan.micro_batch_size, 0))
    parts = Parts(models, stage_ids, schedule, optimizer, 0 in stage_ids, plan.num_stages - 1 in stage_ids,
                  False, dropout, loss_scale=loss_scale)
    return parts, adapter
