"""Process groups from the plan: one ``ParallelMesh`` object with named DeviceMesh axes ("pp", "dp", "cp", "tp").

Naming: an *axis* is a mesh axis (pp, dp, cp, tp); a *dim* is a tensor dimension. The rank order, the
groups and their members are ``ParallelDims``' (autoplan/schema/parallel_dims.py, torch-free and tested
without torch.distributed), the same object the cost model prices the groups with: the DeviceMesh is the
row-major grid of its ``mesh_shape`` in its ``AXES`` order (tp fastest, torchtitan's order), and
``build_mesh`` is the only place groups are made. The object is passed explicitly (no module-level globals).

The ranks of one (pp, tp) coordinate -- dp x cp of them -- hold the same parameters: data parallelism
and ZeRO (FSDP2) run over the flattened ("dp", "cp") axis ``dp_cp``, as torchtitan's ``dp_shard_cp``.

Mixture of Experts: a second DeviceMesh over the same ranks, ``expert_mesh``, with axes ``EXPERT_AXES``
(pp, edp, ep, etp): the fold ParallelDims defines and the cost model prices (Megatron-Core's expert
RankGenerator). Its grid is laid out from ``ParallelDims.expert_coords`` rank by rank, and each of this rank's
groups is checked against ``ParallelDims.expert_group_of``. Expert weights are DTensors on its ep (and etp) axes,
FSDP2 / replicate runs over its ``edp`` axis: FSDP2 needs the EP and the DP mesh of one parameter to come from
one root mesh (tests/runtime/ep_worker.py ``fsdp_case``), which is why the expert axes are one mesh of their own
rather than slices of the dense mesh. ``stage_group`` (all tp x cp x dp ranks of this pipeline rank) is the
group the MoE auxiliary loss counts expert loads over. Made with the device type only: gloo and NCCL alike.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from autoplan.schema.parallel_dims import AXES, EXPERT_AXES, Coords, ParallelDims


@dataclass
class ParallelMesh:
    """The device mesh and the handful of groups the runtime uses, for this rank."""

    mesh: Any  # torch DeviceMesh of shape dims.mesh_shape, axes AXES
    device: Any  # torch.device this rank computes on
    dims: ParallelDims
    coords: Coords
    """This rank's coordinate along each axis."""
    dp_cp_mesh: Any = None
    """1-D mesh over the flattened (dp, cp) axes: the ranks that hold the same parameters."""
    embedding_group: Any = None  # ProcessGroup, or None when this rank is in no embedding group
    expert_mesh: Any = None
    """MoE models: DeviceMesh of shape (pp, edp, ep, etp), axes ``EXPERT_AXES`` (None for a dense model)."""
    stage_group: Any = None
    """MoE models: the ProcessGroup of the tp x cp x dp ranks of this pipeline rank (None for a dense model)."""

    @property
    def pp_rank(self) -> int:
        return self.coords.pp

    @property
    def dp_rank(self) -> int:
        return self.coords.dp

    @property
    def cp_rank(self) -> int:
        return self.coords.cp

    @property
    def tp_rank(self) -> int:
        return self.coords.tp

    @property
    def tp_mesh(self) -> Any:
        return self.mesh["tp"]

    @property
    def ep_mesh(self) -> Any:
        return self.expert_mesh["ep"]

    @property
    def edp_mesh(self) -> Any:
        return self.expert_mesh["edp"]

    def group(self, name: str) -> Any:
        """The ProcessGroup of this rank's group ``name`` (an axis, or "dp_cp")."""
        if name == "dp_cp":
            return self.dp_cp_mesh.get_group()
        return self.mesh[name].get_group()


def build_expert_mesh(dims: ParallelDims, device: Any) -> tuple[Any, Any]:
    """The expert DeviceMesh (pp, edp, ep, etp) and this rank's stage group, every rank taking part in every
    group creation. Raises if a group torch made differs from ``ParallelDims``' (which the cost model prices)."""
    import torch
    import torch.distributed as dist
    from torch.distributed.device_mesh import DeviceMesh

    fold = dims.expert_fold_error()
    if fold is not None:
        raise ValueError(f"ep: {fold}")
    grid = torch.empty(tuple(getattr(dims, axis) for axis in EXPERT_AXES), dtype=torch.int)
    for rank in range(dims.world_size):
        grid[tuple(dims.expert_coords(rank))] = rank
    mesh = DeviceMesh(device.type, grid, mesh_dim_names=EXPERT_AXES)
    rank = dist.get_rank()
    for axis in ("ep", "edp", "etp"):
        got = sorted(dist.get_process_group_ranks(mesh[axis].get_group()))
        if got != dims.expert_group_of(rank, axis):
            raise RuntimeError(f"expert group {axis} of rank {rank}: torch made {got}, the plan's fold is "
                               f"{dims.expert_group_of(rank, axis)}")
    stage = mesh["edp", "ep", "etp"]._flatten("stage").get_group() if dims.pp > 1 else dist.group.WORLD
    return mesh, stage


def build_mesh(dims: ParallelDims, device: Any, need_embedding_group: bool,
               need_expert_mesh: bool = False) -> ParallelMesh:
    """Build the DeviceMesh of ``dims`` over the already initialised default process group (and, for a
    Mixture-of-Experts model, the expert mesh: ``build_expert_mesh``)."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    mesh = init_device_mesh(device.type, dims.mesh_shape, mesh_dim_names=AXES)
    # every rank flattens (a collective group creation); private API, as torchtitan uses it (dp_shard_cp)
    dp_cp = mesh["dp", "cp"]._flatten("dp_cp") if dims.cp > 1 else mesh["dp"]
    rank = dist.get_rank()
    emb = None
    if need_embedding_group:
        for ranks in dims.embedding_groups():  # every rank must take part in every new_group call
            group = dist.new_group(ranks)
            if rank in ranks:
                emb = group
    experts, stage = build_expert_mesh(dims, device) if need_expert_mesh else (None, None)
    return ParallelMesh(mesh, device, dims, dims.coords(rank), dp_cp, emb, experts, stage)


def mesh_of_plan(plan: Any, device: Any) -> ParallelMesh:
    """The plan's mesh (with the embedding groups a tied embedding split over pipeline ranks needs: none
    when the first and the last stage share a rank, as in a V-shaped schedule)."""
    from autoplan.schema.schedule import stage_rank

    apart = stage_rank(plan.schedule, 0, plan.pp) != stage_rank(plan.schedule, plan.num_stages - 1, plan.pp)
    return build_mesh(plan.dims, device, plan.model.tie_embeddings and plan.num_stages > 1 and apart,
                      need_expert_mesh=getattr(plan.model, "moe", None) is not None)
