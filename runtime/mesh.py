"""Process groups from the plan: one ``ParallelMesh`` object with named DeviceMesh axes ("pp", "dp", "tp").

Naming: an *axis* is a mesh axis (pp, dp, tp); a *dim* is a tensor dimension. Rank order is the plan's:
``global_rank = tp_rank + tp * (dp_rank + dp * pp_rank)`` (Megatron's formula), i.e. a row-major mesh of
shape (pp, dp, tp) with tp fastest. The arithmetic is in pure functions (``coords_of``, ``axis_groups``,
``embedding_groups``) tested without torch.distributed; ``build_mesh`` is the only place groups are made,
and the object is passed explicitly (no module-level globals).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


def coords_of(rank: int, pp: int, dp: int, tp: int) -> tuple[int, int, int]:
    """(pp_rank, dp_rank, tp_rank) of a global rank."""
    if not 0 <= rank < pp * dp * tp:
        raise ValueError(f"rank {rank} outside a world of {pp * dp * tp}")
    return rank // (dp * tp), (rank // tp) % dp, rank % tp


def rank_of(pp_rank: int, dp_rank: int, tp_rank: int, dp: int, tp: int) -> int:
    return tp_rank + tp * (dp_rank + dp * pp_rank)


def axis_groups(axis: str, pp: int, dp: int, tp: int) -> list[list[int]]:
    """Every group along one axis: the ranks that differ only in that axis' coordinate, in axis order."""
    sizes = {"pp": pp, "dp": dp, "tp": tp}
    groups: dict[tuple[int, ...], list[int]] = {}
    for rank in range(pp * dp * tp):
        c = dict(zip(("pp", "dp", "tp"), coords_of(rank, pp, dp, tp)))
        key = tuple(v for k, v in c.items() if k != axis)
        groups.setdefault(key, []).append(rank)
    assert all(len(g) == sizes[axis] for g in groups.values())
    return [groups[k] for k in sorted(groups)]


def embedding_groups(pp: int, dp: int, tp: int) -> list[list[int]]:
    """Ranks holding the first and the last pipeline stage at the same (dp, tp) coordinate.

    With tied embeddings and pp > 1 the first stage's token embedding and the last stage's head are two
    copies of one matrix; their gradients are summed over these groups (Megatron's embedding group).
    """
    if pp == 1:
        return []
    return [[rank_of(0, d, t, dp, tp), rank_of(pp - 1, d, t, dp, tp)] for d in range(dp) for t in range(tp)]


@dataclass
class ParallelMesh:
    """The device mesh and the handful of groups the runtime uses, for this rank."""

    mesh: Any  # torch DeviceMesh of shape (pp, dp, tp)
    device: Any  # torch.device this rank computes on
    pp: int
    dp: int
    tp: int
    pp_rank: int
    dp_rank: int
    tp_rank: int
    embedding_group: Any = None  # ProcessGroup, or None when this rank is in no embedding group

    @property
    def tp_mesh(self) -> Any:
        return self.mesh["tp"]

    @property
    def dp_mesh(self) -> Any:
        return self.mesh["dp"]

    def group(self, axis: str) -> Any:
        return self.mesh[axis].get_group()


def build_mesh(pp: int, dp: int, tp: int, device: Any, need_embedding_group: bool) -> ParallelMesh:
    """Build the (pp, dp, tp) DeviceMesh over the already initialised default process group."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    mesh = init_device_mesh(device.type, (pp, dp, tp), mesh_dim_names=("pp", "dp", "tp"))
    rank = dist.get_rank()
    pp_rank, dp_rank, tp_rank = coords_of(rank, pp, dp, tp)
    emb = None
    if need_embedding_group:
        for ranks in embedding_groups(pp, dp, tp):  # every rank must take part in every new_group call
            group = dist.new_group(ranks)
            if rank in ranks:
                emb = group
    return ParallelMesh(mesh, device, pp, dp, tp, pp_rank, dp_rank, tp_rank, emb)
