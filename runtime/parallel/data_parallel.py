"""Data parallelism and ZeRO over the plan's dp axis.

* ZeRO 0: ``replicate`` (torch's FSDP2-based DDP, torch.distributed._composable.replicate_with_fsdp).
  Why not classic ``DistributedDataParallel``: it does not accept DTensor (TP) parameters, and the plans
  compose DP with TP; ``replicate`` does, and it works with the pipelining schedules and DCP.
* ZeRO 1: ``replicate`` + ``Zero1AdamW`` below (ZeroRedundancyOptimizer's algorithm: each dp rank keeps
  AdamW state for, and steps, only its share of the parameters, then the owners broadcast them).
  Why our own: ZeroRedundancyOptimizer broadcasts whole parameters with c10d, which fails on DTensor
  parameters, and its state does not go through DCP's get_state_dict.
* ZeRO 2 / 3: FSDP2 ``fully_shard`` per block then the root, ``reshard_after_forward`` False / True.
* ``offload_optimizer``: FSDP2 with ``CPUOffloadPolicy`` (for ZeRO 1 too: FSDP2 is the torch-native
  path that keeps optimizer state and step on the host; ZeRO 1 then also shards gradients, which only
  saves memory and is numerically the same).
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed._composable.replicate_with_fsdp import replicate
from torch.distributed.fsdp import CPUOffloadPolicy, OffloadPolicy, fully_shard


def apply_data_parallel(model: nn.Module, dp_mesh, zero_stage: int, offload: bool) -> nn.Module:
    """Wrap one stage model for its dp group in place (no-op for dp = 1 without offload)."""
    if dp_mesh.size() == 1 and not offload:
        return model
    if zero_stage <= 1 and not offload:
        replicate(model, mesh=dp_mesh)
        return model
    policy = CPUOffloadPolicy(pin_memory=torch.cuda.is_available()) if offload else OffloadPolicy()
    reshard = zero_stage == 3
    for block in model.blocks.values():
        fully_shard(block, mesh=dp_mesh, reshard_after_forward=reshard, offload_policy=policy)
    fully_shard(model, mesh=dp_mesh, reshard_after_forward=reshard, offload_policy=policy)
    return model


def local(t: torch.Tensor) -> torch.Tensor:
    """The local shard of a DTensor (sharing storage), or the tensor itself."""
    return t._local_tensor if hasattr(t, "_local_tensor") else t


class Zero1AdamW(torch.optim.AdamW):
    """AdamW with state sharded over the dp group (ZeRO stage 1).

    Parameters are assigned to dp ranks greedily by size (largest first, to the least loaded rank), the
    same on every rank. Each rank builds AdamW over its own parameters only; after ``step`` every
    parameter is broadcast from its owner, so all replicas hold the same weights. Gradients must
    already be averaged over dp (``replicate`` does that in backward).
    """

    def __init__(self, param_groups: list[dict], dp_group, **kwargs) -> None:
        self.dp_group = dp_group
        size, me = dist.get_world_size(dp_group), dist.get_rank(dp_group)
        everything = [p for g in param_groups for p in g["params"]]
        load = [0] * size
        self.owner: dict[int, int] = {}
        for p in sorted(everything, key=lambda q: -q.numel()):  # stable sort: ties keep model order
            r = load.index(min(load))
            self.owner[id(p)] = r
            load[r] += p.numel()
        self.all_params = everything
        mine = [{**g, "params": [p for p in g["params"] if self.owner[id(p)] == me]} for g in param_groups]
        super().__init__([g for g in mine if g["params"]] or [{"params": []}], **kwargs)

    def zero_grad(self, set_to_none: bool = True) -> None:
        # every parameter has a grad (the dp reduction fills them all), not only the ones this rank steps
        for p in self.all_params:
            if set_to_none:
                p.grad = None
            elif p.grad is not None:
                p.grad.zero_()

    @torch.no_grad()
    def sharded_state(self) -> dict[str, torch.Tensor]:
        """This rank's AdamW state as plain tensors under rank-unique names, for DCP to save or fill in place.

        Why not get_state_dict: DCP keeps one copy of non-tensor entries (param_groups) from one rank, but
        here every rank's optimizer holds different parameters, so the groups would come back wrong.
        Missing state (before the first step) is created as zeros so that a load has somewhere to write.
        """
        me = dist.get_rank()
        out = {}
        for i, p in enumerate(self.all_params):
            if self.owner[id(p)] != dist.get_rank(self.dp_group):
                continue
            st = self.state[p]
            if not st:
                st.update(step=torch.tensor(0.0), exp_avg=torch.zeros_like(p), exp_avg_sq=torch.zeros_like(p))
            for name, t in st.items():
                out[f"rank{me}.param{i}.{name}"] = local(t)
        return out

    @torch.no_grad()
    def step(self, closure=None):
        loss = super().step(closure)
        for p in self.all_params:
            src = dist.get_global_rank(self.dp_group, self.owner[id(p)])
            dist.broadcast(local(p), src=src, group=self.dp_group)
        return loss
