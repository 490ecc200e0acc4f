"""The cost table of one parallel configuration: integer per-layer times (ns) and bytes.

Once tp, pp, dp, cp, sequence parallel, ZeRO stage, offload, schedule, virtual stages and the micro-batch
size are fixed (a ``Config``), every remaining choice (how many layers each stage holds and how many of
them recompute, selectively or fully) changes step time and memory *linearly* through this table.
The evaluator (evaluate.py), the branch-and-bound search (through layout_terms.py) and the brute-force
search all read the same integers, so their objectives agree exactly; 1 ns and 1 byte of rounding is far
below the model's accuracy.

Memory is compared as ``PERMILLE * states + (PERMILLE + RESERVE_PERMILLE) * dynamic <= PERMILLE * capacity``
so that the fragmentation reserve stays in integer arithmetic too.

On a CPU host the table also carries what cost/host_terms.py adds: every compute and host time scaled by
the shared-cores factor, FSDP2's collectives where the runtime issues them, the pipeline runtime's host
work per action (``action_ns``), the optimizer's per-tensor work, the runtime's per-step small
collectives (``step_sync_ns``) and the process's memory baseline (``baseline_bytes``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import cached_property

from autoplan.cost.comm import collective_bandwidth_s, collective_latency_s, collective_time_s, group_link, p2p_time_s
from autoplan.cost.host_terms import (
    CoreShare, core_share, fsdp_layer, optimizer_tensor_s, ranks_on_node, replicate_microbatch_s, step_sync_s,
)
from autoplan.cost.model_states import ADAMW_FP32_STEP_BYTES, optimizer_step_bytes, state_bytes_per_param
from autoplan.schema.schedule import RankOrders, build_schedule
from autoplan.cost.workload import LayerCost, Workload
from autoplan.schema import Cluster, TrainingSetup
from autoplan.schema.plan import ParallelConfig as Config  # the search's name for it

PERMILLE = 1000
# Allocator fragmentation reserve on activations and buffers: the caching allocator's measured gap between
# reserved and allocated memory is 5-15% in torchtitan and MosaicML runs (formulas.md section 4); 5% here,
# the rest is the user's --memory-margin.
RESERVE_PERMILLE = 50


@dataclass(frozen=True)
class LayerTimes:
    fwd_ns: int
    bwd_ns: int


@dataclass(frozen=True)
class StageTable:
    config: Config
    num_layers: int
    # per-block times; recomputation adds to the backward
    block: LayerTimes
    selective_extra_ns: int
    full_extra_ns: int
    embedding: LayerTimes
    head: LayerTimes
    p2p_ns: tuple[int, ...]
    """Transfer time between stage s and s+1, per micro-batch and direction."""
    late_receive_ns: int
    """The least time from posting a pipeline receive to its completion (simulate.py; 0 on GPUs)."""
    # device bytes of weights + gradients + optimizer state
    block_state_bytes: int
    embedding_state_bytes: int
    head_state_bytes: int
    # activation bytes kept per micro-batch
    block_act_bytes: int
    block_act_selective_bytes: int
    block_act_full_bytes: int
    embedding_act_bytes: int
    head_act_bytes: int
    logits_transient_bytes: int
    zero3_buffer_bytes: int
    capacity_bytes: int
    # end of step, per rank: gradient reduction, parameter all-gather (ZeRO-1/2), optimizer step
    sync_block_ns: int
    sync_embedding_ns: int
    sync_head_ns: int
    sync_latency_ns: int
    gather_block_ns: int
    gather_embedding_ns: int
    gather_head_ns: int
    gather_latency_ns: int
    optim_block_ns: int
    optim_embedding_ns: int
    optim_head_ns: int
    overlap_grad_reduce: bool
    ring_transient_bytes: int = 0
    """Context parallelism: one block's ring attention buffers (gathered K/V, dK/dV in flight)."""
    action_fwd_ns: int = 0
    """Per stage and micro-batch, added to each forward action: the pipeline runtime's host work (pp > 1) and
    a replicate root's hooks (ZeRO-0 under dp > 1) on a CPU host."""
    action_bwd_ns: int = 0
    step_sync_ns: int = 0
    """The runtime's per-step small collectives, on every rank (host_terms.step_sync_s)."""
    tied_sync_ns: int = 0
    """The tied embedding's gradient all-reduce, on the first and the last pipeline rank."""
    baseline_bytes: int = 0
    """Memory of the training process besides tensors (device memory_baseline_gib)."""
    share: CoreShare = CoreShare()

    @property
    def num_stages(self) -> int:
        return self.config.num_stages

    @cached_property
    def orders(self) -> RankOrders:
        """The schedule's action lists, built on first use (bounds need the table without them)."""
        c = self.config
        return build_schedule(c.schedule, c.pp, c.virtual_stages, c.num_microbatches)

    @cached_property
    def expressions(self) -> dict:
        """stage_terms.py's expressions of this table, built on first use."""
        return {}

    def stages_of(self, rank: int) -> list[int]:
        return self._stages_by_rank[rank]

    @cached_property
    def _stages_by_rank(self) -> list[list[int]]:
        return [list(range(r, self.num_stages, self.config.pp)) for r in range(self.config.pp)]

    def last_backward_stage(self, rank: int) -> int:
        """The stage whose final backward ends the rank's list: the window DP reduction overlaps."""
        return self.orders[rank][-1].stage


def _ns(seconds: float) -> int:
    return int(round(seconds * 1e9))


def layer_times(layer: LayerCost, zero3_gather_s: float = 0.0) -> LayerTimes:
    """Forward and backward of one layer with its TP collectives and the unhidden part of its CP ring;
    ZeRO-3 prefetches the next layer's weights during this layer's compute, so only the excess of the
    gather shows. Without a gather these are the least times any configuration with this layer cost can
    have (the search's group bound)."""
    fwd = layer.fwd_s + layer.tp_fwd_s + layer.cp_fwd_s + max(0.0, zero3_gather_s - layer.fwd_s)
    bwd = layer.bwd_s + layer.tp_bwd_s + layer.cp_bwd_s + max(0.0, zero3_gather_s - layer.bwd_s)
    return LayerTimes(_ns(fwd), _ns(bwd))


def build_table(workload: Workload, cluster: Cluster, training: TrainingSetup, config: Config) -> StageTable:
    c = config
    # data parallelism and ZeRO run over the dp x cp ranks holding the same parameters, at stride tp (plan.py)
    states = state_bytes_per_param(training, c.zero_stage, c.dp_cp, c.offload_optimizer)
    dp_link = group_link(cluster, c.dp_cp, c.tp)
    weight_bytes = 2 if training.mixed_precision else 4

    share = core_share(cluster, c)
    serial = cluster.shares_cores  # gloo on a CPU host: collectives do not overlap compute (host_terms.py)

    def gather_s(layer: LayerCost) -> float:  # ZeRO-3: all-gather one layer's weights over dp x cp
        return collective_time_s("all_gather", layer.params * weight_bytes, dp_link) if c.zero_stage == 3 else 0.0

    def times(layer: LayerCost) -> LayerTimes:
        if serial:
            fsdp = fsdp_layer(cluster, c, layer.params, weight_bytes, share.host)
            return LayerTimes(_ns(share.scaled_s(layer.fwd_s, layer.host_fwd_s) + layer.tp_fwd_s + fsdp.fwd_s),
                              _ns(share.scaled_s(layer.bwd_s, layer.host_bwd_s) + layer.tp_bwd_s + fsdp.bwd_s))
        return layer_times(layer, gather_s(layer))

    sync_kind = "all_reduce" if c.zero_stage == 0 else "reduce_scatter"

    def sync_ns(params: float) -> int:  # bandwidth part only; latency is counted once per rank
        if serial and c.zero_stage > 0:  # one reduce-scatter per unit where the runtime issues it
            return _ns(fsdp_layer(cluster, c, params, weight_bytes, share.host).reduce_step_s) if c.dp_cp > 1 else 0
        return _ns(collective_bandwidth_s(sync_kind, params * weight_bytes, dp_link))

    def gather_ns(params: float) -> int:
        if serial and c.zero_stage > 0:
            return _ns(fsdp_layer(cluster, c, params, weight_bytes, share.host).gather_step_s) if c.dp_cp > 1 else 0
        if c.zero_stage not in (1, 2):
            return 0
        return _ns(collective_bandwidth_s("all_gather", params * weight_bytes, dp_link))

    def optim_ns(params: float, layer: LayerCost, extra_tensors: int = 0) -> int:
        shard = params / c.dp_cp if c.zero_stage >= 1 else params
        if c.offload_optimizer:  # host Adam, gradients down and weights up over PCIe
            return _ns(shard / (cluster.device.host_adam_gparams_per_s * 1e9)
                       + shard * 2 * weight_bytes / (cluster.device.host_link_gb_per_s * 1e9))
        step_bytes = optimizer_step_bytes(training)  # memory-bound (model_states.py)
        device = cluster.device
        if device.optimizer_ns_per_param > 0:  # op by op, as measured (scaled by the fused bytes' ratio)
            per_param = device.optimizer_ns_per_param * 1e-9 * step_bytes / ADAMW_FP32_STEP_BYTES
        else:
            per_param = step_bytes / (device.memory_bandwidth_gb_per_s * 1e9 * device.memory_efficiency)
        tensors = optimizer_tensor_s(cluster, c, layer.param_tensors + extra_tensors,
                                     layer.tp_param_tensors + extra_tensors, 1.0)
        return _ns((shard * per_param + tensors) * share.tail)

    def state(params: float) -> int:
        return int(math.ceil(params * states.total))

    head_params = workload.head.params + (workload.tied_copy_params if c.pp > 1 else 0.0)
    tied_copy = 1 if c.pp > 1 and workload.tied_copy_params > 0 else 0  # the last stage's own head weight
    action_fwd, action_bwd = replicate_microbatch_s(cluster, c, share.host)
    if c.num_stages > 1:
        action = cluster.device.pipeline_action_us * 1e-6 * share.host
        action_fwd, action_bwd = action_fwd + action, action_bwd + action
    every_sync, tied_sync = step_sync_s(cluster, c, workload.tied_copy_params * weight_bytes)
    # stage s runs on pipeline rank s % pp and sends to rank (s + 1) % pp, inside a node or across
    per_node = cluster.devices_per_node
    intra = _ns(p2p_time_s(cluster, workload.output_bytes, 0, 0))
    inter = _ns(p2p_time_s(cluster, workload.output_bytes, 0, per_node))
    hops = [intra if _global_rank(c, r) // per_node == _global_rank(c, (r + 1) % c.pp) // per_node else inter
            for r in range(c.pp if c.num_stages > 1 else 0)]
    p2p = tuple(hops[s % c.pp] for s in range(c.num_stages - 1))
    late_receive = 0
    if cluster.shares_cores and c.num_stages > 1:  # the measured wait (on 64 KiB) and this message's bytes
        late_receive = _ns(cluster.late_receive_s(ranks_on_node(cluster, c))
                           + p2p_time_s(cluster, workload.output_bytes, 0, 0) - p2p_time_s(cluster, 0, 0, 0))
    block = workload.block
    z3_buffer = 0
    if c.zero_stage == 3:  # the layer being computed and the one prefetched, unsharded
        z3_buffer = int(math.ceil(2 * max(block.params, workload.embedding.params, head_params) * weight_bytes))
    capacity = cluster.device.memory_gib * (1 - training.memory_margin) * 2**30
    return StageTable(
        config=c, num_layers=workload.num_layers,
        block=times(block), selective_extra_ns=_ns(block.selective_extra_s * share.pipeline),
        full_extra_ns=_ns(share.scaled_s(block.fwd_s, block.host_fwd_s) + block.tp_fwd_s),
        embedding=times(workload.embedding), head=times(workload.head), p2p_ns=p2p, late_receive_ns=late_receive,
        block_state_bytes=state(block.params), embedding_state_bytes=state(workload.embedding.params),
        head_state_bytes=state(head_params),
        block_act_bytes=int(math.ceil(block.saved_bytes)),
        block_act_selective_bytes=int(math.ceil(block.selective_saved_bytes)),
        block_act_full_bytes=int(math.ceil(block.full_saved_bytes)),
        embedding_act_bytes=int(math.ceil(workload.embedding.saved_bytes)),
        head_act_bytes=int(math.ceil(workload.head.saved_bytes)),
        logits_transient_bytes=int(math.ceil(workload.logits_transient_bytes)),
        zero3_buffer_bytes=z3_buffer, capacity_bytes=int(capacity),
        ring_transient_bytes=int(math.ceil(workload.ring_transient_bytes)),
        sync_block_ns=sync_ns(block.params), sync_embedding_ns=sync_ns(workload.embedding.params),
        sync_head_ns=sync_ns(head_params),
        sync_latency_ns=0 if serial and c.zero_stage > 0 else _ns(collective_latency_s(sync_kind, dp_link)),
        gather_block_ns=gather_ns(block.params), gather_embedding_ns=gather_ns(workload.embedding.params),
        gather_head_ns=gather_ns(head_params),
        gather_latency_ns=_ns(collective_latency_s("all_gather", dp_link)) if c.zero_stage in (1, 2) and not serial else 0,
        optim_block_ns=optim_ns(block.params, block), optim_embedding_ns=optim_ns(workload.embedding.params,
                                                                                   workload.embedding),
        optim_head_ns=optim_ns(head_params, workload.head, tied_copy),
        overlap_grad_reduce=training.overlap_grad_reduce and not serial,
        action_fwd_ns=_ns(action_fwd), action_bwd_ns=_ns(action_bwd), step_sync_ns=_ns(every_sync),
        tied_sync_ns=_ns(tied_sync), baseline_bytes=int(cluster.device.memory_baseline_gib * 2**30), share=share,
    )


def _global_rank(config: Config, pp_rank: int) -> int:
    """Global rank of (tp_rank 0, cp_rank 0, dp_rank 0, pp_rank): tp + tp * (cp + cp * (dp + dp * pp)), plan.py."""
    return config.tp * config.cp * config.dp * pp_rank
