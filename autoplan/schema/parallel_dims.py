"""The parallel dimensions of a layout and every piece of rank arithmetic on them, in one torch-free object.

Naming: an *axis* is one dimension of the grid of ranks (``pp``, ``dp``, ``cp``, ``tp``; a named mesh axis
in the runtime's DeviceMesh); a *dim* is a tensor dimension; a *group* is a set of ranks that differ only
along some axes (``"tp"``, ``"cp"``, ``"dp"``, ``"pp"``, ``"dp_cp"``, ``"world"``), plus the pairs of
``embedding_groups``.

Rank order (what the cost model assumes and the runtime builds; schema/plan.py says why): ``tp`` varies
fastest, then ``cp``, then ``dp``, then ``pp``:

    global_rank = tp_rank + tp * (cp_rank + cp * (dp_rank + dp * pp_rank)),   world = tp * cp * dp * pp

Megatron-LM's formula with the context-parallel axis inside the data-parallel one, torchtitan's mesh order
(pp, dp, cp, tp).

Expert layers (Mixture of Experts) fold the same ranks another way, as Megatron-Core does (its
``RankGenerator`` with order "tp-ep-dp-pp" for experts): the tp x cp x dp ranks of one pipeline rank are
regrouped as etp x ep x edp, expert tensor parallel fastest, then expert parallel, then the experts' own
data parallel (``EXPERT_AXES``). So with etp = 1 an EP group is ep consecutive ranks (inside a node when
ep <= devices per node), taking the TP ranks first and then data-parallel replicas, and the ranks that
hold the same experts (``edp``) are ep x etp apart. Attention and dense layers keep the four axes above. So axis a has stride = the product of the sizes of the axes after it; a group along
adjacent axes (``dp_cp``: dp and cp) is a regular strided set too. The cost model prices a group's
collectives on the links its ``span`` crosses (cost/comm.py), the runtime builds its DeviceMesh from
``mesh_shape`` and the same group lists (runtime/mesh.py): both read this object, so the groups a plan
is priced with are the groups it runs with.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, NamedTuple

AXES = ("pp", "dp", "cp", "tp")
"""Outermost first: the order of a row-major grid (and of torch's DeviceMesh) with tp varying fastest."""

GROUPS: dict[str, tuple[str, ...]] = {
    "tp": ("tp",),
    "cp": ("cp",),
    "dp": ("dp",),
    "pp": ("pp",),
    "dp_cp": ("dp", "cp"),
    "world": AXES,
}
"""Each named group and the axes its members differ in. ``dp_cp``: the ranks that hold the same parameters
(one pipeline rank, one TP shard): gradients are averaged and ZeRO shards over them, torchtitan's
``dp_shard_cp``, because CP ranks hold the same weights and see different tokens, like data replicas."""


EXPERT_AXES = ("pp", "edp", "ep", "etp")
"""The expert layers' grid, outermost first (etp fastest): the same ranks as ``AXES``, folded differently."""

EXPERT_GROUPS: dict[str, tuple[str, ...]] = {
    "ep": ("ep",),
    "etp": ("etp",),
    "edp": ("edp",),
    "ep_etp": ("ep", "etp"),
}
"""Named groups of the expert grid. ``ep``: the ranks tokens are dispatched among (all-to-all); ``etp``: the
ranks one expert's matrices are split over; ``edp``: the ranks holding the same experts, over which expert
gradients are reduced and ZeRO shards expert states."""


class ExpertCoords(NamedTuple):
    """A rank's coordinate along each expert axis."""

    pp: int
    edp: int
    ep: int
    etp: int


class Coords(NamedTuple):
    """A rank's coordinate along each axis."""

    pp: int
    dp: int
    cp: int
    tp: int


@dataclass(frozen=True)
class GroupSpan:
    """How one group lies among the ranks: ``size`` members, consecutive members ``stride`` ranks apart
    (regular for every group of ``GROUPS``). Nodes fill with consecutive ranks, so this says which links the
    group's collectives cross."""

    size: int
    stride: int

    def fits_in_node(self, devices_per_node: int) -> bool:
        """All members on one node (a group of one is always there)."""
        return self.size <= 1 or self.size * self.stride <= devices_per_node

    def members_per_node(self, devices_per_node: int) -> int:
        """Members that share a node when the group spans several (at least 1)."""
        return max(1, devices_per_node // self.stride)


@dataclass(frozen=True)
class ParallelDims:
    """The sizes of the four axes; the rank order, strides, groups and nodes follow from them. Sizes are
    checked where they are read (``Layout.validate``), not here."""

    pp: int = 1
    dp: int = 1
    cp: int = 1
    tp: int = 1
    ep: int = 1
    """Expert parallel size: the routed experts are split over ep ranks (1 for a dense model)."""
    etp: int = 1
    """Expert tensor parallel size: each expert's matrices are split over etp ranks."""

    @classmethod
    def of(cls, layout: Any) -> "ParallelDims":
        """The dimensions of anything that has the four sizes (a ``ParallelConfig``, ``Layout`` or ``Plan``),
        and ``ep`` / ``etp`` where it has them."""
        return cls(pp=layout.pp, dp=layout.dp, cp=layout.cp, tp=layout.tp, ep=getattr(layout, "ep", 1),
                   etp=getattr(layout, "etp", 1))

    @classmethod
    def filling(cls, world_size: int, pp: int = 1, cp: int = 1, tp: int = 1) -> "ParallelDims | None":
        """The dimensions whose data-parallel size takes the ranks tp x cp x pp leave of ``world_size``
        (None when they do not divide it)."""
        inner = pp * cp * tp
        if inner < 1 or world_size % inner:
            return None
        return cls(pp=pp, dp=world_size // inner, cp=cp, tp=tp)

    # sizes and strides ------------------------------------------------------------------------------------

    @property
    def world_size(self) -> int:
        return self.pp * self.dp * self.cp * self.tp

    @property
    def mesh_shape(self) -> tuple[int, ...]:
        """Sizes in ``AXES`` order: the shape of the runtime's DeviceMesh."""
        return tuple(getattr(self, axis) for axis in AXES)

    @property
    def dp_cp(self) -> int:
        """Ranks holding the same parameters (see ``GROUPS``)."""
        return self.dp * self.cp

    @property
    def stage_ranks(self) -> int:
        """Ranks of one pipeline rank: tp x cp x dp, consecutive."""
        return self.tp * self.cp * self.dp

    def size(self, group: str) -> int:
        """Members of one group named in ``GROUPS``."""
        size = 1
        for axis in GROUPS[group]:
            size *= getattr(self, axis)
        return size

    def stride(self, axis: str) -> int:
        """Rank distance between neighbours along ``axis``: the product of the sizes of the faster axes."""
        stride = 1
        for inner in AXES[AXES.index(axis) + 1:]:
            stride *= getattr(self, inner)
        return stride

    def span(self, group: str) -> GroupSpan:
        """Size and member stride of a group of ``GROUPS`` (its axes are adjacent, so it is regular)."""
        return GroupSpan(self.size(group), self.stride(GROUPS[group][-1]))

    def embedding_span(self) -> GroupSpan:
        """The pair of an embedding group: the first and the last pipeline rank, (pp - 1) x stage_ranks apart."""
        return GroupSpan(2 if self.pp > 1 else 1, self.stage_ranks * max(1, self.pp - 1))

    # ranks and coordinates -------------------------------------------------------------------------------

    def coords(self, rank: int) -> Coords:
        if not 0 <= rank < self.world_size:
            raise ValueError(f"rank {rank} outside a world of {self.world_size}")
        return Coords(*(rank // self.stride(axis) % getattr(self, axis) for axis in AXES))

    def rank(self, pp: int = 0, dp: int = 0, cp: int = 0, tp: int = 0) -> int:
        """The global rank at a coordinate (axes left out at 0)."""
        coords = {"pp": pp, "dp": dp, "cp": cp, "tp": tp}
        for axis, c in coords.items():
            if not 0 <= c < getattr(self, axis):
                raise ValueError(f"{axis} coordinate {c} outside 0..{getattr(self, axis) - 1}")
        return sum(c * self.stride(axis) for axis, c in coords.items())

    def groups(self, group: str) -> list[list[int]]:
        """Every group of one kind, each in rank order (which is axis order for the group's axes), sorted."""
        axes = GROUPS[group]
        found: dict[tuple[int, ...], list[int]] = {}
        for rank in range(self.world_size):
            c = self.coords(rank)._asdict()
            found.setdefault(tuple(v for k, v in c.items() if k not in axes), []).append(rank)
        return [found[key] for key in sorted(found)]

    def group_of(self, rank: int, group: str) -> list[int]:
        """The members of ``rank``'s group of one kind, in rank order."""
        c = self.coords(rank)._asdict()
        axes = GROUPS[group]
        members = [0]
        for axis in AXES:
            if axis in axes:
                members = [m + i * self.stride(axis) for m in members for i in range(getattr(self, axis))]
            else:
                members = [m + c[axis] * self.stride(axis) for m in members]
        return sorted(members)

    def embedding_groups(self) -> list[list[int]]:
        """Ranks holding the first and the last pipeline stage at the same (dp, cp, tp) coordinate.

        With tied embeddings and pp > 1 the first stage's token embedding and the last stage's head are two
        copies of one matrix; their gradients are summed over these pairs (Megatron's embedding group)."""
        if self.pp == 1:
            return []
        return [[self.rank(0, d, c, t), self.rank(self.pp - 1, d, c, t)]
                for d in range(self.dp) for c in range(self.cp) for t in range(self.tp)]

    def first_rank(self, pp_rank: int) -> int:
        """The lowest global rank of a pipeline rank (its dp 0, cp 0, tp 0 replica)."""
        return self.rank(pp=pp_rank)

    # nodes -------------------------------------------------------------------------------------------------

    def node_of(self, rank: int, devices_per_node: int) -> int:
        """Nodes fill with consecutive ranks: rank // devices per node."""
        return rank // devices_per_node

    def ranks_on_node(self, devices_per_node: int) -> int:
        """Ranks sharing one node (fewer than its devices when the world is smaller)."""
        return min(devices_per_node, self.world_size)

    def pipeline_nodes(self, devices_per_node: int) -> tuple[int, ...]:
        """The node of each pipeline rank's first replica, pipeline rank 0 first."""
        return tuple(self.node_of(self.first_rank(r), devices_per_node) for r in range(self.pp))

    def as_dict(self) -> dict[str, int]:
        """{axis: size} in ``AXES`` order, for metrics, manifests and traces (ep and etp only when used, so a
        dense layout's record is what it always was)."""
        sizes = {axis: getattr(self, axis) for axis in AXES}
        return sizes | {axis: getattr(self, axis) for axis in ("ep", "etp") if getattr(self, axis) > 1}

    # expert layers -----------------------------------------------------------------------------------------

    @property
    def edp(self) -> int:
        """Ranks of one pipeline rank holding the same experts: tp x cp x dp / (ep x etp)."""
        return self.stage_ranks // (self.ep * self.etp)

    def expert_fold_error(self) -> str | None:
        """Why ep x etp cannot fold into the ranks of one pipeline rank, or None when it can."""
        if self.ep < 1 or self.etp < 1:
            return f"ep {self.ep} and etp {self.etp} must be at least 1"
        if self.stage_ranks % (self.ep * self.etp):
            return (f"ep x etp = {self.ep * self.etp} must divide the tp x cp x dp = {self.stage_ranks} ranks of a "
                    "pipeline rank, which the expert layers regroup")
        return None

    def expert_stride(self, axis: str) -> int:
        """Rank distance between neighbours along an expert axis (etp 1, ep etp, edp ep x etp, pp stage_ranks)."""
        return {"etp": 1, "ep": self.etp, "edp": self.ep * self.etp, "pp": self.stage_ranks}[axis]

    def expert_coords(self, rank: int) -> ExpertCoords:
        local = self.coords(rank)  # checks the rank
        within = rank % self.stage_ranks
        return ExpertCoords(local.pp, within // (self.ep * self.etp), within // self.etp % self.ep, within % self.etp)

    def expert_span(self, group: str) -> GroupSpan:
        """Size and member stride of an expert group (``EXPERT_GROUPS``)."""
        axes = EXPERT_GROUPS[group]
        size = 1
        for axis in axes:
            size *= getattr(self, axis)
        return GroupSpan(size, self.expert_stride(axes[-1]))

    def expert_group_of(self, rank: int, group: str) -> list[int]:
        """The members of ``rank``'s expert group of one kind, in rank order."""
        c = self.expert_coords(rank)._asdict()
        members = [0]
        for axis in EXPERT_AXES:
            stride = self.expert_stride(axis)
            if axis in EXPERT_GROUPS[group]:
                members = [m + i * stride for m in members for i in range(getattr(self, axis))]
            else:
                members = [m + c[axis] * stride for m in members]
        return sorted(members)

    def expert_groups(self, group: str) -> list[list[int]]:
        """Every expert group of one kind, each in rank order, sorted (what the runtime creates, in this order)."""
        seen: dict[int, list[int]] = {}
        for rank in range(self.world_size):
            members = self.expert_group_of(rank, group)
            seen.setdefault(members[0], members)
        return [seen[k] for k in sorted(seen)]
