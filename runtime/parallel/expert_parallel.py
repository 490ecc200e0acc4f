"""Expert parallelism (EP) for ``runtime.models.moe.MoE``: the E routed experts split over the ep ranks of
an EP group, the tokens sent to them and back with two all-to-alls (GShard, Lepikhin et al. 2020;
Megatron-Core's ``MoEAlltoAllTokenDispatcher``; torchtitan's ``AllToAllTokenDispatcher``).

Rank r of the EP group holds experts [r*E/ep, (r+1)*E/ep). The EP ranks are data-parallel replicas: each
sees its own tokens (Megatron-Core carves the EP group out of the data-parallel ranks). Per MoE forward:
1. route locally and sort the (token, slot) pairs by expert (``MoE.routed``);
2. exchange the per-expert counts (all_to_all_single of E integers, no autograd), so each rank knows how
   many rows it sends to and receives from every other (one device-to-host copy of the split sizes);
3. all-to-all the token rows (autograd), regroup the received rows from rank-major to expert-major and
   run the local experts;
4. undo the regrouping and all-to-all the outputs back; the source rank weights and sums them.
Backward runs the two all-to-alls in reverse, so an expert's weight gradient sums the contributions of
every EP rank's tokens.

The autograd all-to-all is ``torch.distributed._functional_collectives.all_to_all_single_autograd``
(torchtitan's choice). Checked in torch 2.13 on gloo (CPU), with uneven and zero splits: it and the older
``torch.distributed.nn.functional.all_to_all_single`` both give the right values and gradients; the
latter warns that it is deprecated in favour of the functional collectives. NCCL supports the same call.

Parameter layout: the expert weights become DTensors ``Shard(0)`` on the 1-D EP DeviceMesh (local
[E/ep, ...] tensors; the forward uses ``to_local()``). Why not plain local tensors: a DTensor knows its
global shape [E, F, H] and which slice it is, so (a) ``init.init_parameters`` draws the full tensor by
name and keeps this rank's slice, the layout-free rule, unchanged; (b) DCP saves the shards under one
name with their offsets and reshards them into another ep (plain tensors with one name and different
values per rank would be taken as replicated and saved once); (c) FSDP2 composes with it as torchtitan
does: ``fully_shard(moe.experts, mesh=edp_mesh)`` then ``fully_shard(model, mesh=dp_mesh)``, where the
ep and edp meshes are the axes of one (edp, ep) DeviceMesh and dp_mesh their flattening, turns the
expert weights into 2-D (edp x ep) DTensors and gives the serial gradients with FSDP2's default averaging
(tests/runtime/ep_worker.py ``fsdp_case``; the EP axis must therefore come from the same root mesh as
the data-parallel one). The slicing is local (``src_data_rank=None``): the EP layout starts from whatever
values the serial layer held.

Which gradients need which reduction (EP inside data parallelism; none is done here):
* Dense parameters -- router, shared experts and the rest of the model: each rank's gradient comes from
  its own tokens. Average over the whole data-parallel group, which includes the EP ranks (runtime's
  FSDP2 / replicate over dp_cp already does this when the EP group lies inside it).
* Routed-expert weights: the backward all-to-all already summed every EP rank's contributions on the
  owning rank; with ``grad_mean=True`` that sum is scaled by 1/ep in backward, i.e. the gradient of the
  mean of the EP ranks' losses, the same convention as the dense average. Ranks holding the same experts
  (the expert-data-parallel group, dp/ep of them) then average over that group -- never over the EP
  group (different experts) nor the full dp group. (Megatron-Core: expert gradients all-reduced over
  expert-dp and scaled by 1/dp, which is the same number.)
With FSDP2 as in (c) both happen with no extra call. ``reduce_gradients`` does both for a model without
a data-parallel wrapper (the tests, or a trainer that reduces by hand).

Expert tensor parallelism (etp > 1; Megatron-Core's expert-tp: experts.py ``TEGroupedMLP`` / ``SequentialMLP``
with the expert-tp group, token_dispatcher.py ``MoEAlltoAllTokenDispatcher``): each expert's matrices are split
over the etp ranks of an ETP group, gate and up by columns (Shard(1) of [E, F, H], fc1 column-parallel) and
down by rows (Shard(2) of [E, H, F], fc2 row-parallel), so the expert weights are DTensors on the 2-D
(ep, etp) mesh (Shard(0), Shard(1 or 2)), or on the etp axis alone when ep = 1. The ETP ranks of one EP
coordinate hold the same experts' slices but route their own tokens; after the EP all-to-all, 3'. the rows
are all-gathered over the ETP group (every slice must see every row; Megatron's
``gather_from_sequence_parallel_region`` over the expert-tp group), each rank computes silu(x g_k) * (x u_k)
d_k on its width slice k, a partial sum of the output, and 4'. the partial outputs are reduce-scattered back
over ETP (each rank summing its own rows) before the EP all-to-all back. The counts are exchanged first (an
all-to-all over EP, then an all-gather over ETP: ``received_counts``), so every split size is known. Backward
mirrors it: the reduce-scatter's backward all-gathers the output gradients, the all-gather's backward
reduce-scatters the input gradients, and each slice's weight gradient sums the whole ep x etp group's rows
(``grad_mean`` scales it by 1/(ep x etp)). FSDP2 over edp then makes the weights 3-D (edp, ep, etp) DTensors:
torch 2.13's FSDP2 takes parameters on at most a 2-D "EP+TP" mesh (_fsdp_param.py ``_init_sharding_spec_tp``),
which this is, and DCP reshards them into any other (ep, etp, edp) like the 1-D ones. The router, the aux
loss and the bias rule do not change. Uneven row counts per rank (routing decides them) are why the ETP
collectives are our own (``gather_rows``, ``reduce_scatter_rows``: autograd all-to-alls).

In the runtime (``apply_plan_experts``, called by runtime/build.py on each stage after TP): the EP group is
the plan's (runtime/mesh.py's expert mesh, ParallelDims' fold: with tp > 1 it takes the TP ranks first, and
under TP + SP each TP rank routes its own sequence slice), the experts are FSDP2 / replicate units over the
edp axis of that mesh (runtime/parallel/data_parallel.py), and the expert gradient scale is
``expert_grad_scale`` (edp / (dp x cp), which is ``grad_mean``'s 1/(ep x etp) only without TP and CP). The
ETP group is the plan's too (etp fastest in the fold: with etp = tp it is the TP group, each rank's sequence
slice gathered as Megatron-Core gathers it).

Load balancing over the group: ``MoE.aux_group`` (set here) makes the auxiliary loss count the expert
loads over that group; ``update_expert_bias`` (sigmoid router) all-reduces the loads over the group it is
given, so every replica applies the same bias change and stays identical.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed._functional_collectives import all_to_all_single_autograd
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor, Shard, distribute_tensor

from runtime.models.moe import MoE, GroupedExperts, moe_layers

EXPERT_WEIGHTS = ("gate", "up", "down")


class AllToAllDispatcher:
    """Sends sorted (token, slot) rows to the ranks holding their experts, computes them, returns them.
    Holds no parameters (a plain object on ``MoE.dispatcher``).

    ``group`` / ``ep``: the EP group (None / 1: every rank holds every expert, no all-to-all);
    ``etp_group`` / ``etp``: the ranks that split each local expert's matrices (None / 1: whole experts)."""

    def __init__(self, group: Any, ep: int, num_experts: int, etp_group: Any = None, etp: int = 1) -> None:
        self.group, self.ep, self.local_experts = group, ep, num_experts // ep
        self.etp_group, self.etp = etp_group, etp
        self.etp_rank = dist.get_rank(etp_group) if etp > 1 else 0

    def __call__(self, xs: torch.Tensor, counts: torch.Tensor, experts: GroupedExperts) -> torch.Tensor:
        """xs [N, H] sorted by global expert, counts [E] rows per expert -> expert outputs [N, H], same order."""
        ep, e = self.ep, self.local_experts
        with torch.no_grad():
            recv = self.received_counts(counts)  # [etp, ep, e]
            # rows to / from each EP rank, and each ETP rank's rows after its EP all-to-all: one host sync on a GPU
            sizes = torch.cat([counts.view(ep, e).sum(1), recv[self.etp_rank].sum(1), recv.sum((1, 2))]).tolist()
            send_splits, recv_splits, etp_splits = sizes[:ep], sizes[ep:2 * ep], sizes[2 * ep:]
            expert_of_row = torch.arange(e, device=xs.device).repeat(self.etp * ep).repeat_interleave(
                recv.flatten(), output_size=sum(etp_splits))  # the size given: no second sync
            perm = expert_of_row.argsort(stable=True)  # [R] (etp rank, EP rank, expert)-major -> expert-major
            inverse = torch.empty_like(perm)
            inverse[perm] = torch.arange(perm.numel(), device=perm.device)
        xr = self.exchange(xs, recv_splits, send_splits)  # [R_own, H] EP-rank-major
        xg = gather_rows(xr, etp_splits, self.etp_group)  # [R, H] every ETP rank's rows, ETP-rank-major
        ye = experts(xg[perm], recv.sum((0, 1)))  # [R, H] expert-major (partial sums under etp > 1)
        yr = reduce_scatter_rows(ye[inverse], etp_splits, self.etp_rank, self.etp_group)  # [R_own, H]
        return self.exchange(yr, send_splits, recv_splits)  # [N, H]

    def received_counts(self, counts: torch.Tensor) -> torch.Tensor:
        """[etp, ep, e]: entry [k, i, j] = rows EP rank i of ETP rank k's EP group sends to local expert j (all
        ETP ranks of one expert slice hold the same experts). Megatron-Core all-gathers the counts over the
        expert tp x ep group in one call; here an all-to-all over EP, then an all-gather over ETP (no flattened
        group needed). No autograd."""
        recv = torch.empty_like(counts)
        if self.ep > 1:
            dist.all_to_all_single(recv, counts, group=self.group)
        else:
            recv.copy_(counts)
        if self.etp > 1:
            everyone = recv.new_empty(self.etp * recv.numel())
            _all_gather_single(everyone, recv, group=self.etp_group)
            recv = everyone
        return recv.view(self.etp, self.ep, self.local_experts)

    def exchange(self, rows: torch.Tensor, out_splits: list[int], in_splits: list[int]) -> torch.Tensor:
        """The EP all-to-all (autograd; the identity for ep 1)."""
        if self.ep == 1:
            return rows
        return all_to_all_single_autograd(rows, out_splits, in_splits, self.group)


# torch 2.13 renamed all_gather_into_tensor to all_gather_single (the old name warns); the package runs on
# torch >= 2.6, which has only the old one
_all_gather_single = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor

def gather_rows(rows: torch.Tensor, splits: list[int], group: Any) -> torch.Tensor:
    """All-gather over ``group`` of a different number of rows per rank (``splits``, in group rank order),
    with autograd: backward reduce-scatters the gradients. Megatron-Core's
    ``gather_from_sequence_parallel_region(output_split_sizes=...)`` after the EP all-to-all.

    Our own because torch's autograd all-gather (``_functional_collectives.all_gather_tensor_autograd``) and
    reduce-scatter take equal sizes only, gloo's list all_gather refuses unequal ones (torch 2.13:
    "ProcessGroupGloo::allgather: invalid tensor size"), and padding to the largest would move more bytes. An
    autograd all-to-all that sends this rank's rows to every rank of the group moves the same bytes as an
    all-gather and runs on gloo and NCCL; its backward all-to-all returns each rank's gradient of these rows,
    which ``repeat``'s backward sums (the reduce-scatter)."""
    n = len(splits)
    if n == 1:
        return rows
    return all_to_all_single_autograd(rows.repeat(n, 1), splits, [rows.shape[0]] * n, group)


def reduce_scatter_rows(rows: torch.Tensor, splits: list[int], rank: int, group: Any) -> torch.Tensor:
    """The inverse of ``gather_rows``: ``rows`` [sum(splits), H] holds every rank's rows (rank-major), each a
    partial sum; returns this rank's splits[rank] rows summed over the group. Megatron-Core's
    ``reduce_scatter_to_sequence_parallel_region(input_split_sizes=...)``; an autograd all-to-all then a
    local sum in group rank order (the same bytes as a reduce-scatter; ``gather_rows`` says why not torch's)."""
    n = len(splits)
    if n == 1:
        return rows
    parts = all_to_all_single_autograd(rows, [splits[rank]] * n, splits, group)  # [n * own, H]
    return parts.view(n, splits[rank], rows.shape[-1]).sum(0)


EXPERT_MESH_AXES = ("ep", "etp")
SPLIT_DIM = {"gate": 1, "up": 1, "down": 2}
"""The expert-width dim F of each [E, ...] weight, which etp splits: gate / up by columns ([E, F, H], fc1 of
Megatron-Core's experts, column-parallel) and down by rows ([E, H, F], fc2, row-parallel)."""


def as_mesh(mesh: DeviceMesh | Any, device: torch.device) -> DeviceMesh:
    """The experts' DeviceMesh: ``mesh`` itself (1-D, or 2-D with axes ("ep", "etp")), or a 1-D EP mesh
    wrapped around a ProcessGroup."""
    if not isinstance(mesh, DeviceMesh):
        return DeviceMesh.from_group(mesh, device.type)
    if mesh.ndim > 2 or (mesh.ndim == 2 and tuple(mesh.mesh_dim_names or ()) != EXPERT_MESH_AXES):
        raise ValueError(f"the expert mesh must be 1-D or have axes {EXPERT_MESH_AXES}, got "
                         f"{mesh.mesh_dim_names or mesh.ndim}")
    return mesh


def mesh_axes(mesh: DeviceMesh) -> tuple[str, ...]:
    """The expert axes of ``mesh``: its names, or ("ep",) for an unnamed 1-D mesh."""
    names = tuple(mesh.mesh_dim_names or ("ep",))
    if not set(names) <= set(EXPERT_MESH_AXES):
        raise ValueError(f"expert mesh axes must be among {EXPERT_MESH_AXES}, got {names}")
    return names


def apply_expert_parallel(moe: MoE, ep: DeviceMesh | Any, *, grad_mean: bool = True, aux_group: Any = None) -> MoE:
    """Split ``moe``'s experts in place over ``ep``: a 1-D EP DeviceMesh or ProcessGroup; or a mesh with axes
    ("ep", "etp") or ("etp",) (expert tensor parallelism: each expert's gate / up split by columns, down by
    rows, over the etp axis).

    ``grad_mean``: scale the expert gradients by 1/(ep x etp) in backward, the mean convention of the module
    docstring when every rank of the mesh is a data-parallel replica; False leaves the plain sum of every
    rank's contributions.
    ``aux_group``: the group the auxiliary loss counts loads over (None: this rank's tokens only; the
    whole data-parallel group makes it the loss of the global batch)."""
    mesh = as_mesh(ep, moe.router.weight.device)
    axes = mesh_axes(mesh)
    size = dict(zip(axes, mesh.shape))
    ep_size, etp_size, num_experts = size.get("ep", 1), size.get("etp", 1), moe.spec.num_experts
    if num_experts % ep_size:
        raise ValueError(f"{num_experts} experts do not split over {ep_size} EP ranks")
    if moe.spec.expert_ffn_size % etp_size:
        raise ValueError(f"the expert width {moe.spec.expert_ffn_size} does not split over {etp_size} ETP ranks")
    for name in EXPERT_WEIGHTS:
        p = getattr(moe.experts, name)
        if isinstance(p, DTensor):
            raise ValueError("expert parallelism is already applied to this layer")
        placements = [Shard(0) if axis == "ep" else Shard(SPLIT_DIM[name]) for axis in axes]
        shard = distribute_tensor(p.detach(), mesh, placements, src_data_rank=None)  # local slice, no comm
        setattr(moe.experts, name, nn.Parameter(shard, requires_grad=p.requires_grad))
    moe.experts.grad_scale = 1.0 / (ep_size * etp_size) if grad_mean else 1.0
    group = {axis: mesh.get_group(i) for i, axis in enumerate(axes)}
    moe.dispatcher = AllToAllDispatcher(group.get("ep"), ep_size, num_experts, group.get("etp"), etp_size)
    moe.aux_group = aux_group
    return moe


def apply_plan_experts(model: nn.Module, pm: Any) -> None:
    """A plan's expert (tensor) parallelism on every MoE block of one stage model (after TP, before FSDP2):
    the experts split over the plan's ep and etp axes of ``pm.expert_mesh`` (the expert fold of
    runtime/mesh.py), the auxiliary loss's expert loads counted over the stage's ranks (``pm.stage_group``),
    and the expert gradients scaled by ``expert_grad_scale``."""
    dims = pm.dims
    axes = tuple(axis for axis in EXPERT_MESH_AXES if getattr(dims, axis) > 1)
    for moe in moe_layers(model):
        if axes:
            apply_expert_parallel(moe, pm.expert_mesh[axes], grad_mean=False)
        moe.aux_group = pm.stage_group if dims.stage_ranks > 1 else None
        moe.experts.grad_scale = expert_grad_scale(dims)


def expert_grad_scale(dims: Any) -> float:
    """What the runtime multiplies the routed experts' gradients by in backward: edp / (dp x cp).

    Why: each rank's loss is the mean over its replica's tokens (the TP ranks of a replica share one loss and
    hold different sequence slices of its tokens; CP ranks have losses of their own, averaged like
    replicas'). An expert's gradient on its owner, after the backward all-to-all, is the sum of the
    contributions of the tokens the EP group routed to it -- under etp > 1, of the whole ep x etp group's
    tokens (``gather_rows`` brings every ETP rank's rows to each slice of the expert), the same sum per slice;
    the edp group then averages (FSDP2 / replicate over ``edp_mesh``). Summed over every rank of the stage the
    contributions are sum_r dL_r/dW over the dp x cp losses L_r, and the serial gradient is their mean:
    sum / (dp x cp) = (edp-mean) x edp / (dp x cp).
    Without TP and CP, ep x etp x edp = dp and this is 1/(ep x etp), ``apply_expert_parallel``'s
    ``grad_mean``; with tp = ep = 2, or tp = etp = 2, it is 1 (the group is one replica's two sequence halves)."""
    return dims.edp / dims.dp_cp


def aux_loss_share(dims: Any) -> float:
    """The weight of each rank's auxiliary loss in the step's objective, besides the micro-batch and loss
    scaling of the LM loss: 1 / tp. Each TP rank computes the balance loss of its own sequence slice (the
    router sees only it) with P_e its slice's mean probability, and DTensor sums the ranks' gradients
    (the router's Partial gradient; the slices' input gradients); the mean of the tp slices' P_e is the
    replica's, so the 1/tp-weighted sum is the replica's loss. Data parallelism averages replicas as for the
    LM loss, and the expert loads f_e are counted over the whole stage (``MoE.aux_group``), so the objective is
    the serial model's balance loss of each global micro-batch."""
    return 1.0 / dims.tp


EXPERT_BIAS_RATE = 1e-3
"""The sigmoid router's bias update speed (gamma): DeepSeek-V3's 0.001 (DeepSeek-AI 2024, section 2.1.2; its
config's ``topk_method: noaux_tc``). The model description has no field for it yet, so every run uses it."""


def update_plan_expert_biases(models: list[nn.Module], pm: Any) -> None:
    """After an optimizer step: the sigmoid routers' aux-loss-free bias rule (``update_expert_bias``) on each
    stage model, the loads summed over the stage's ranks (every replica and TP slice: the global batch's
    loads, as the serial run counts them). No-op (no collective) for softmax-routed models."""
    for model in models:
        layers = moe_layers(model)
        if any(m.spec.router == "sigmoid" for m in layers):
            update_expert_bias(model, EXPERT_BIAS_RATE, pm.stage_group if pm.dims.stage_ranks > 1 else None)


def expert_parameters(model: nn.Module) -> set[int]:
    """ids of the routed-expert weights of every MoE layer of ``model``."""
    return {id(p) for m in moe_layers(model) for p in m.experts.parameters()}


@torch.no_grad()
def _average(grads: list[torch.Tensor], group: Any) -> None:
    """All-reduce the mean of ``grads`` over ``group`` in one flat buffer (SUM then divide: every backend)."""
    if not grads or dist.get_world_size(group) == 1:
        return
    flat = torch.cat([g.flatten() for g in grads])
    dist.all_reduce(flat, group=group)
    flat /= dist.get_world_size(group)
    for g, part in zip(grads, flat.split([g.numel() for g in grads])):
        g.copy_(part.view_as(g))


@torch.no_grad()
def reduce_gradients(model: nn.Module, dp_group: Any, edp_group: Any = None) -> None:
    """Average the gradients as a data-parallel wrapper would, for a model without one: the dense
    parameters over ``dp_group`` (every data-parallel rank, EP ranks included), the expert weights over
    ``edp_group`` (the ranks holding the same experts; None: there are none, ep == dp)."""
    experts = expert_parameters(model)
    grads = [(id(p) in experts, p.grad) for p in model.parameters() if p.grad is not None]
    _average([g for is_expert, g in grads if not is_expert], dp_group)
    if edp_group is not None:
        _average([g.to_local() if isinstance(g, DTensor) else g for is_expert, g in grads if is_expert], edp_group)


@torch.no_grad()
def update_expert_bias(model: nn.Module, rate: float, group: Any = None) -> None:
    """DeepSeek-V3's auxiliary-loss-free balancing (Wang et al. 2024), after the optimizer step: for each
    sigmoid-routed layer, expert_bias += rate * sign(mean load - load_e), the load being the (token, slot)
    pairs routed to e since the last call, summed over ``group`` (every EP x DP rank: all replicas then
    apply the same change). Resets every layer's load counter. DeepSeek-V3 used rate 0.001."""
    layers = moe_layers(model)
    if not layers:
        return
    loads = torch.stack([m.tokens_per_expert for m in layers])  # [L, E], one all-reduce for all layers
    if group is not None:
        dist.all_reduce(loads, group=group)
    for m, load in zip(layers, loads):
        if m.spec.router == "sigmoid":
            m.router.expert_bias += rate * torch.sign(load.mean() - load)
        m.tokens_per_expert.zero_()
