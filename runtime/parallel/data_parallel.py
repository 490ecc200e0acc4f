"""Data parallelism and ZeRO over the ranks that hold the same parameters -- the plan's dp axis, flattened
with its cp axis under context parallelism (runtime/mesh.py, torchtitan's dp_shard_cp: CP ranks hold the
same weights and see other tokens, so their gradients are averaged like replicas') -- all on torch-native
parts (FSDP2), so that every checkpoint goes through DCP's get_state_dict / set_state_dict and reshards
into any layout.

* ZeRO 0: ``replicate`` (torch's FSDP2-based DDP, torch.distributed._composable.replicate_with_fsdp).
  Why not classic ``DistributedDataParallel``: it does not accept DTensor (TP) parameters.
* ZeRO 1 and 2: FSDP2 ``fully_shard`` per block then the stage root, ``reshard_after_forward=False``:
  parameters are all-gathered once per step and kept whole through every micro-batch's forward and
  backward (``set_reshard_after_backward`` only on the last), the optimizer state and step are sharded
  over dp. ZeRO 1 reduce-scatters the gradients once, after the last micro-batch
  (``set_requires_gradient_sync`` only then); ZeRO 2 after every micro-batch, so only gradient shards
  are kept between micro-batches.
* ZeRO 3: the same with ``reshard_after_forward=True``: each block's parameters are gathered for its
  forward and again for its backward.
* ``offload_optimizer``: FSDP2's ``CPUOffloadPolicy``: the sharded parameters, gradients and the
  optimizer state and step live on the host.
* Mixed precision (bf16/fp16 plans on GPUs): a ``MixedPrecisionPolicy`` with the compute dtype for the
  parameters and fp32 for the reduction, torchtitan's choice and what the ``autoplan`` stack prices
  (profiles/stacks/autoplan.yaml ``param_gather: compute``, ``grad_reduce: fp32``): the fp32 shards are
  cast before the all-gather, so the gathers move 2 bytes per parameter and forward and backward run on
  bf16 weights; gradients are reduce-scattered in fp32 into the fp32 shards the optimizer steps. Without
  a data-parallel group the stage runs its fp32 weights under autocast.

Mixture of Experts: the routed experts of each MoE block (``block.mlp.experts``) are a unit of their own over
the expert-data-parallel mesh ``edp_mesh`` (the ranks that hold the same experts: runtime/mesh.py), wrapped
first, with the same ZeRO stage, so that the dense units over dp x cp leave their parameters alone
(``fully_shard(moe.experts, mesh=edp)`` then the block and the root, as tests/runtime/ep_worker.py ``fsdp_case``
checks; torchtitan/distributed/fsdp.py now reaches the same placement with ``shard_placement_fn`` on one unit
per block, and shards experts on dim 1 when edp x ep exceeds the experts, where this pads dim 0). They are wrapped
whenever the stage is (an edp group of one included: the root must not take them into its dp x cp group) and
whenever edp > 1 (with tp > ep the experts have data-parallel copies even without dp).

How this ZeRO 1 differs from the cost model's (Rajbhandari et al. 2020, stage 1: weights and gradients
whole on every rank at all times, 2 + 4 + K/N_d bytes per parameter in mixed precision here, since FSDP2
accumulates the whole gradients in the fp32 reduce dtype: cost/stage_table.py ``rank_state_bytes``): during
forward and backward the memory is the same -- whole weights, whole gradients accumulated over the
micro-batches, K/N_d of optimizer state -- plus FSDP2's own 1/N_d shard of weights (and, after the
reduce-scatter, of gradients) kept beside the whole copies; between steps (the optimizer step included)
only the shards are held, which is less. The communication is the same volume: one gradient reduce-scatter and one
weight all-gather per step, against ZeRO-1's reduce-scatter + all-gather.
Under pipeline parallelism torch's schedule runtime takes over the micro-batch handling for every
stage (stage.py ``backward_maybe_with_nosync``, schedules.py UNSHARD / REDUCE_GRAD): it gathers a
stage's parameters when the stage becomes active, does not reshard them after a micro-batch's backward,
and reduce-scatters the gradients once, after the stage's last backward. So under PP, ZeRO 2 keeps whole
gradients between micro-batches like ZeRO 1, and ZeRO 3 holds whole parameters for longer than the
cost model's per-layer gathering assumes (it still reshards after each forward).
"""

from __future__ import annotations

import torch
from torch import nn
from torch.distributed._composable.replicate_with_fsdp import replicate
from torch.distributed.fsdp import CPUOffloadPolicy, FSDPModule, MixedPrecisionPolicy, OffloadPolicy, fully_shard

from runtime.models.moe import moe_layers


def apply_data_parallel(model: nn.Module, dp_mesh, zero_stage: int, offload: bool,
                        compute_dtype: torch.dtype | None = None, edp_mesh=None) -> nn.Module:
    """Wrap one stage model for its dp (x cp) group in place (no-op for a group of one without offload);
    ``compute_dtype``: the plan's bf16/fp16 on GPUs (None: fp32 throughout); ``edp_mesh``: the routed experts'
    data-parallel mesh (MoE models; see the module docstring)."""
    dense = dp_mesh.size() > 1 or offload
    experts = [m.experts for m in moe_layers(model)]
    if experts and (dense or edp_mesh.size() > 1):
        shard_experts(experts, edp_mesh, zero_stage, offload, compute_dtype)
    if not dense:
        return model
    mp = precision_policy(compute_dtype)
    if zero_stage == 0:
        replicate(model, mesh=dp_mesh, mp_policy=mp)
        return model
    policy = CPUOffloadPolicy(pin_memory=torch.cuda.is_available()) if offload else OffloadPolicy()
    reshard = zero_stage == 3
    for block in model.blocks.values():
        fully_shard(block, mesh=dp_mesh, reshard_after_forward=reshard, offload_policy=policy, mp_policy=mp)
    fully_shard(model, mesh=dp_mesh, reshard_after_forward=reshard, offload_policy=policy, mp_policy=mp)
    return model


def precision_policy(compute_dtype: torch.dtype | None) -> MixedPrecisionPolicy:
    if compute_dtype is None:
        return MixedPrecisionPolicy()
    return MixedPrecisionPolicy(param_dtype=compute_dtype, reduce_dtype=torch.float32)


def shard_experts(experts: list[nn.Module], edp_mesh, zero_stage: int, offload: bool,
                  compute_dtype: torch.dtype | None) -> None:
    """Each MoE block's routed experts as their own unit over ``edp_mesh`` (replicate at ZeRO 0)."""
    mp = precision_policy(compute_dtype)
    policy = CPUOffloadPolicy(pin_memory=torch.cuda.is_available()) if offload else OffloadPolicy()
    for module in experts:
        if zero_stage == 0:
            replicate(module, mesh=edp_mesh, mp_policy=mp)
        else:
            fully_shard(module, mesh=edp_mesh, reshard_after_forward=zero_stage == 3, offload_policy=policy,
                        mp_policy=mp)


def set_microbatch_sync(model: nn.Module, zero_stage: int, last: bool) -> None:
    """Before a micro-batch's backward without pipelining: whether its gradients are reduced and its
    parameters resharded after it. ZeRO 0 and 1 reduce once, on the last micro-batch; 2 and 3 every time
    (their gradients stay sharded between micro-batches). ZeRO 1 and 2 keep the parameters whole until
    the last; ZeRO 3 reshards after every backward. (A stage whose only data-parallel units are its experts'
    -- edp > 1 with dp x cp = 1 -- sets them.)"""
    units = [model] if isinstance(model, FSDPModule) else \
        [m.experts for m in moe_layers(model) if isinstance(m.experts, FSDPModule)]
    for unit in units:
        unit.set_requires_gradient_sync(last or zero_stage >= 2)
        if zero_stage in (1, 2):
            unit.set_reshard_after_backward(last)


def local(t: torch.Tensor) -> torch.Tensor:
    """The local shard of a DTensor (sharing storage), or the tensor itself."""
    return t._local_tensor if hasattr(t, "_local_tensor") else t
