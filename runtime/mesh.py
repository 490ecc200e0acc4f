"""Process groups from the plan: one ``ParallelMesh`` object with named DeviceMesh axes ("pp", "dp", "cp", "tp").

Naming: an *axis* is a mesh axis (pp, dp, cp, tp); a *dim* is a tensor dimension. The rank order, the
groups and their members are ``ParallelDims``' (autoplan/schema/parallel_dims.py, torch-free and tested
without torch.distributed), the same object the cost model prices the groups with: the DeviceMesh is the
row-major grid of its ``mesh_shape`` in its ``AXES`` order (tp fastest, torchtitan's order), and
``build_mesh`` is the only place groups are made. The object is passed explicitly (no module-level globals).

The ranks of one (pp, tp) coordinate -- dp x cp of them -- hold the same parameters: data parallelism
and ZeRO (FSDP2) run over the flattened ("dp", "cp") axis ``dp_cp``, as torchtitan's ``dp_shard_cp``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from autoplan.schema.parallel_dims import AXES, Coords, ParallelDims


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

    def group(self, name: str) -> Any:
        """The ProcessGroup of this rank's group ``name`` (an axis, or "dp_cp")."""
        if name == "dp_cp":
            return self.dp_cp_mesh.get_group()
        return self.mesh[name].get_group()


def build_mesh(dims: ParallelDims, device: Any, need_embedding_group: bool) -> ParallelMesh:
    """Build the DeviceMesh of ``dims`` over the already initialised default process group."""
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
    return ParallelMesh(mesh, device, dims, dims.coords(rank), dp_cp, emb)


def mesh_of_plan(plan: Any, device: Any) -> ParallelMesh:
    """The plan's mesh (with the embedding groups a tied embedding split over pipeline ranks needs: none
    when the first and the last stage share a rank, as in a V-shaped schedule)."""
    from autoplan.schema.schedule import stage_rank

    apart = stage_rank(plan.schedule, 0, plan.pp) != stage_rank(plan.schedule, plan.num_stages - 1, plan.pp)
    return build_mesh(plan.dims, device, plan.model.tie_embeddings and plan.num_stages > 1 and apart)
