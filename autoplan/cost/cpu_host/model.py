"""The CPU test bed's host: ranks that share the node's cores, and gloo collectives that run on them.

What it changes in a configuration's table (the terms themselves are in terms.py and shared_cores.py):

* compute: every layer's kernel and host time stretched by the co-running slow-downs (``core_share``),
  recomputation too;
* data parallelism: FSDP2's gathers and reduce-scatters paid where the runtime issues them, per unit,
  with their host work, instead of hidden behind compute; no gradient reduction overlaps the backward;
  replicate's hooks (ZeRO-0) on every micro-batch;
* the ring of context parallelism is not priced apart (the runtime's CP ring has not run on this host);
* pipelining: the schedule runtime's host work per action, and the least wait of a receive posted after
  its send (``Cluster.late_receive_us``);
* the optimizer: the measured time per parameter of the op-by-op step and per parameter tensor, at the
  end-of-step slow-down.

Everything here is a measured microbenchmark of the host (``autoplan calibrate``); nothing is fitted to
training runs. It is a test bed for the cost model and the runtime, not the product: keep it isolated.
"""

from __future__ import annotations

import dataclasses

from autoplan.cost.comm import p2p_time_s
from autoplan.cost.cpu_host.terms import (
    core_share, fsdp_layer, optimizer_tensor_s, replicate_microbatch_s,
)
from autoplan.cost.host_model import HostModel
from autoplan.cost.model_states import ADAMW_FP32_STEP_BYTES, optimizer_step_bytes
from autoplan.cost.stage_table import (
    LayerTimes, StageTable, head_params, memory_bound_step_s, ns, optimizer_shard, weight_bytes,
)
from autoplan.cost.workload import LayerCost, Workload
from autoplan.schema import Cluster, TrainingSetup


class SharedCoresHost(HostModel):
    """The host of ``cluster`` (``Cluster.shares_cores``): see the module doc."""

    def __init__(self, cluster: Cluster) -> None:
        self.cluster = cluster

    def least_layer_times(self, layer: LayerCost) -> LayerTimes:
        """Kernel and host time at the least co-running slow-down measured (1 where none is below), plus
        the TP collectives; FSDP's collectives only add to it."""
        cluster = self.cluster
        kernel = min((1.0, *cluster.corun_kernel_slowdown))
        host = min((1.0, *cluster.corun_host_slowdown))

        def least(total_s: float, host_s: float, tp_s: float) -> int:
            return ns((total_s - host_s) * kernel + host_s * host + tp_s)

        bwd = least(layer.bwd_s, layer.host_bwd_s, layer.tp_bwd_s)
        return LayerTimes(least(layer.fwd_s, layer.host_fwd_s, layer.tp_fwd_s), bwd,
                          min(bwd, ns(layer.bwd_weight_s * kernel)))

    def apply(self, table: StageTable, workload: Workload, training: TrainingSetup) -> StageTable:
        cluster, c = self.cluster, table.config
        share = core_share(cluster, c)
        wb = weight_bytes(training)

        def fsdp(params: float):
            return fsdp_layer(cluster, c, params, wb, share.host)

        def times(layer: LayerCost) -> LayerTimes:
            unit = fsdp(layer.params)
            bwd = ns(share.scaled_s(layer.bwd_s, layer.host_bwd_s) + layer.tp_bwd_s + unit.bwd_s)
            return LayerTimes(ns(share.scaled_s(layer.fwd_s, layer.host_fwd_s) + layer.tp_fwd_s + unit.fwd_s), bwd,
                              min(bwd, ns(layer.bwd_weight_s * share.pipeline)))

        def optim_ns(params: float, layer: LayerCost, extra_tensors: int = 0) -> int:
            shard = optimizer_shard(params, c, layer.expert_params)
            device = cluster.device
            if device.optimizer_ns_per_param > 0:  # op by op, as measured (scaled by the fused bytes' ratio)
                per_param = device.optimizer_ns_per_param * 1e-9 * optimizer_step_bytes(training) / ADAMW_FP32_STEP_BYTES
            else:
                per_param = memory_bound_step_s(cluster, training, workload.stack)
            tensors = optimizer_tensor_s(cluster, c, layer.param_tensors + extra_tensors,
                                         layer.tp_param_tensors + extra_tensors, 1.0)
            return ns((shard * per_param + tensors) * share.tail)

        block, last = workload.block, head_params(workload, c)
        zero = c.zero_stage > 0
        changes = dict(
            block=times(block), embedding=times(workload.embedding), head=times(workload.head),
            selective_extra_ns=ns(block.selective_extra_s * share.pipeline),
            full_extra_ns=ns(share.scaled_s(block.fwd_s, block.host_fwd_s) + block.tp_fwd_s + block.cp_fwd_s),
            full_extra_weight_ns=(block.weight_groups * ns(share.scaled_s(block.fwd_s, block.host_fwd_s)
                                                           + block.tp_fwd_s + block.cp_fwd_s)
                                  if table.split_backward else 0),
            overlap_grad_reduce=False, share=share,
        )
        if zero:  # one gather and one reduce-scatter per unit where the runtime issues them
            changes.update(
                sync_block_ns=ns(fsdp(block.params).reduce_step_s), sync_embedding_ns=ns(fsdp(workload.embedding.params).reduce_step_s),
                sync_head_ns=ns(fsdp(last).reduce_step_s), sync_latency_ns=0,
                gather_block_ns=ns(fsdp(block.params).gather_step_s),
                gather_embedding_ns=ns(fsdp(workload.embedding.params).gather_step_s),
                gather_head_ns=ns(fsdp(last).gather_step_s), gather_latency_ns=0)
        if not c.offload_optimizer:
            tied_copy = 1 if c.pp > 1 and workload.tied_copy_params > 0 else 0  # the last stage's own head weight
            changes.update(optim_block_ns=optim_ns(block.params, block),
                           optim_embedding_ns=optim_ns(workload.embedding.params, workload.embedding),
                           optim_head_ns=optim_ns(last, workload.head, tied_copy))
        action_fwd, action_bwd = replicate_microbatch_s(cluster, c, share.host)
        if c.num_stages > 1:
            action = cluster.device.pipeline_action_us * 1e-6 * share.host
            action_fwd, action_bwd = action_fwd + action, action_bwd + action
            # the measured wait (on 64 KiB) and this message's bytes
            changes["late_receive_ns"] = ns(cluster.late_receive_s(c.dims.ranks_on_node(cluster.devices_per_node))
                                            + p2p_time_s(cluster, workload.output_bytes, same_node=True)
                                            - p2p_time_s(cluster, 0, same_node=True))
        changes.update(action_fwd_ns=ns(action_fwd), action_bwd_ns=ns(action_bwd))
        return dataclasses.replace(table, **changes)
