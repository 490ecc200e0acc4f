"""Process groups from the plan: one ``ParallelMesh`` object with named DeviceMesh axes ("pp", "dp", "cp", "tp").

Naming: an *axis* is a mesh axis (pp, dp, cp, tp); a *dim* is a tensor dimension. Rank order is the plan's:
``global_rank = tp_rank + tp * (cp_rank + cp * (dp_rank + dp * pp_rank))`` (Megatron's formula with the
context-parallel axis inside the data-parallel one), i.e. a row-major mesh of shape (pp, dp, cp, tp) with
tp fastest (torchtitan's order). The arithmetic is in pure functions (``coords_of``, ``axis_groups``,
``embedding_groups``) tested without torch.distributed; ``build_mesh`` is the only place groups are made,
and the object is passed explicitly (no module-level globals).

The ranks of one (pp, tp) coordinate -- dp x cp of them -- hold the same parameters: data parallelism
and ZeRO (FSDP2) run over the flattened ("dp", "cp") axis ``dp_cp``, as torchtitan's ``dp_shard_cp``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

AXES = ("pp", "dp", "cp", "tp")


def coords_of(rank: int, pp: int, dp: int, cp: int, tp: int) -> tuple[int, int, int, int]:
    """(pp_rank, dp_rank, cp_rank, tp_rank) of a global rank."""
    if not 0 <= rank < pp * dp * cp * tp:
        raise ValueError(f"rank {rank} outside a world of {pp * dp * cp * tp}")
    return rank // (dp * cp * tp), (rank // (cp * tp)) % dp, (rank // tp) % cp, rank % tp


def rank_of(pp_rank: int, dp_rank: int, cp_rank: int, tp_rank: int, dp: int, cp: int, tp: int) -> int:
    return tp_rank + tp * (cp_rank + cp * (dp_rank + dp * pp_rank))


def axis_groups(axis: str, pp: int, dp: int, cp: int, tp: int) -> list[list[int]]:
    """Every group along one axis: the ranks that differ only in that axis' coordinate, in axis order."""
    sizes = dict(zip(AXES, (pp, dp, cp, tp)))
    groups: dict[tuple[int, ...], list[int]] = {}
    for rank in range(pp * dp * cp * tp):
        c = dict(zip(AXES, coords_of(rank, pp, dp, cp, tp)))
        key = tuple(v for k, v in c.items() if k != axis)
        groups.setdefault(key, []).append(rank)
    assert all(len(g) == sizes[axis] for g in groups.values())
    return [groups[k] for k in sorted(groups)]


def embedding_groups(pp: int, dp: int, cp: int, tp: int) -> list[list[int]]:
    """Ranks holding the first and the last pipeline stage at the same (dp, cp, tp) coordinate.

    With tied embeddings and pp > 1 the first stage's token embedding and the last stage's head are two
    copies of one matrix; their gradients are summed over these groups (Megatron's embedding group).
    """
    if pp == 1:
        return []
    return [[rank_of(0, d, c, t, dp, cp, tp), rank_of(pp - 1, d, c, t, dp, cp, tp)]
            for d in range(dp) for c in range(cp) for t in range(tp)]


@dataclass
class ParallelMesh:
    """The device mesh and the handful of groups the runtime uses, for this rank."""

    mesh: Any  # torch DeviceMesh of shape (pp, dp, cp, tp)
    device: Any  # torch.device this rank computes on
    pp: int
    dp: int
    cp: int
    tp: int
    pp_rank: int
    dp_rank: int
    cp_rank: int
    tp_rank: int
    dp_cp_mesh: Any = None
    """1-D mesh over the flattened (dp, cp) axes: the ranks that hold the same parameters."""
    embedding_group: Any = None  # ProcessGroup, or None when this rank is in no embedding group

    @property
    def tp_mesh(self) -> Any:
        return self.mesh["tp"]

    @property
    def cp_mesh(self) -> Any:
        return self.mesh["cp"]

    def group(self, axis: str) -> Any:
        if axis == "dp_cp":
            return self.dp_cp_mesh.get_group()
        return self.mesh[axis].get_group()


def build_mesh(pp: int, dp: int, cp: int, tp: int, device: Any, need_embedding_group: bool) -> ParallelMesh:
    """Build the (pp, dp, cp, tp) DeviceMesh over the already initialised default process group."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    mesh = init_device_mesh(device.type, (pp, dp, cp, tp), mesh_dim_names=AXES)
    # every rank flattens (a collective group creation); private API, as torchtitan uses it (dp_shard_cp)
    dp_cp = mesh["dp", "cp"]._flatten("dp_cp") if cp > 1 else mesh["dp"]
    rank = dist.get_rank()
    pp_rank, dp_rank, cp_rank, tp_rank = coords_of(rank, pp, dp, cp, tp)
    emb = None
    if need_embedding_group:
        for ranks in embedding_groups(pp, dp, cp, tp):  # every rank must take part in every new_group call
            group = dist.new_group(ranks)
            if rank in ranks:
                emb = group
    return ParallelMesh(mesh, device, pp, dp, cp, tp, pp_rank, dp_rank, cp_rank, tp_rank, dp_cp, emb)


def mesh_of_plan(plan: Any, device: Any) -> ParallelMesh:
    """The plan's mesh (with the embedding groups a tied embedding split over pipeline stages needs)."""
    return build_mesh(plan.pp, plan.dp, plan.cp, plan.tp, device, plan.model.tie_embeddings and plan.num_stages > 1)
