"""The cost table of one parallel configuration: integer per-layer times (ns) and bytes.

Once tp, pp, dp, cp, sequence parallel, ZeRO stage, offload, schedule, virtual stages and the micro-batch
size are fixed (a ``Config``), every remaining choice (how many layers each stage holds and how many of
them recompute, selectively or fully) changes step time and memory *linearly* through this table.
The evaluator (evaluate.py), the branch-and-bound search (through layout_terms.py) and the brute-force
search all read the same integers, so their objectives agree exactly; 1 ns and 1 byte of rounding is far
below the model's accuracy.

Memory is compared as ``PERMILLE * states + (PERMILLE + reserve_permille) * dynamic <= PERMILLE * capacity``
so that the fragmentation reserve (the stack's ``allocator_reserve``) stays in integer arithmetic too.

What the stack decides here (schema/stack.py): the dtypes ZeRO gathers parameters and reduces gradients
in; under pipelining, whether a stage's gradients accumulate whole with one reduce-scatter after its last
backward (torch's schedule runtime), which nothing overlaps, and whether its ZeRO-3 parameters stay
gathered for the step; the optimizer's extra passes; the allocator's reserve.

``device_table`` fills the table for devices that compute on their own (GPUs): collectives on the links
of their groups (``ParallelDims.span``, cost/comm.py), the gradient reduction overlapping the backward,
ZeRO-3's gathers prefetched behind compute. What a host adds or changes (a CPU host whose ranks share
cores and whose collectives do not overlap compute) is the host model's (cost/host_model.py), applied by
``cost/tables.build_table``, the one way the planner gets a table.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import cached_property

from autoplan.cost.comm import collective_bandwidth_s, collective_latency_s, collective_time_s, group_link, p2p_time_s
from autoplan.cost.model_states import StateBytes, optimizer_step_bytes, state_bytes_per_param
from autoplan.cost.workload import LayerCost, Workload
from autoplan.errors import SpecError
from autoplan.schema import Cluster, StackProfile, TrainingSetup
from autoplan.schema.plan import ParallelConfig as Config  # the search's name for it
from autoplan.schema.schedule import ZERO_BUBBLE, RankOrders, build_schedule, stage_rank, stages_of_rank

PERMILLE = 1000


def reserve_permille(stack: StackProfile) -> int:
    """The allocator's reserve on activations and buffers, in permille (the stack's ``allocator_reserve``)."""
    return int(round(stack.allocator_reserve * PERMILLE))


@dataclass(frozen=True)
class LayerTimes:
    fwd_ns: int
    bwd_ns: int
    wgt_ns: int = 0
    """Of ``bwd_ns``, the weight backward (zero-bubble schedules' ``W``; LayerCost.bwd_weight_s)."""


@dataclass(frozen=True)
class CoreShare:
    """Slow-down factors a host puts on compute (1.0: devices that compute on their own): ``pipeline`` for
    forward/backward kernel time, ``host`` for host (framework) time during the pipeline phase, ``tail``
    for the end of the step (cost/cpu_host/terms.py computes them for a CPU host)."""

    pipeline: float = 1.0
    host: float = 1.0
    tail: float = 1.0

    def scaled_s(self, total_s: float, host_s: float) -> float:
        """A layer time of which ``host_s`` is host time, stretched by the pipeline-phase factors."""
        return (total_s - host_s) * self.pipeline + host_s * self.host


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
    reserve_permille: int = 50
    """The allocator's reserve on activations and buffers (``reserve_permille(stack)``)."""
    baseline_bytes: int = 0
    """Memory of the training process besides tensors (device memory_baseline_gib)."""
    share: CoreShare = CoreShare()
    full_extra_weight_ns: int = 0
    """Under a schedule that splits backwards, what a fully recomputed block adds to its weight backward:
    its forward once per weight group (LayerCost.weight_groups; torch 2.13 reruns it in each)."""

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
        c = self.config
        return [list(stages_of_rank(c.schedule, r, c.pp, c.virtual_stages)) for r in range(c.pp)]

    def last_backward_stage(self, rank: int) -> int:
        """The stage whose final backward ends the rank's list: the window DP reduction overlaps."""
        return self.orders[rank][-1].stage

    def last_is_weight(self, rank: int) -> bool:
        """The rank's list ends with a weight backward (zero-bubble): the window is that ``W``, not a backward."""
        return self.orders[rank][-1].kind == "W"

    @property
    def split_backward(self) -> bool:
        """The schedule splits backwards into ``I`` and ``W`` (autoplan.schema.schedule.ZERO_BUBBLE)."""
        return self.config.schedule in ZERO_BUBBLE


MAX_TABLE_S = 1e9
"""No single entry of a table is longer than this (about 30 years): the search's integers stay exact."""


def ns(seconds: float) -> int:
    """Seconds as whole nanoseconds. An entry beyond ``MAX_TABLE_S`` (or not finite) can only come from a
    device or cluster profile slower than any real machine: refused in one line, not carried into the search."""
    if not seconds <= MAX_TABLE_S:
        raise SpecError(f"cluster: one layer's work would take {seconds:.3g} s on this cluster; its device profile's "
                        "peaks, efficiencies and bandwidths are not those of a real machine (autoplan profile-hardware "
                        "measures one)")
    return int(round(seconds * 1e9))


def layer_times(layer: LayerCost, zero3_gather_s: float = 0.0) -> LayerTimes:
    """Forward and backward of one layer with its TP collectives and the unhidden part of its CP ring;
    ZeRO-3 prefetches the next layer's weights during this layer's compute, so only the excess of the
    gather shows. Without a gather these are the least times any configuration with this layer cost can
    have on devices of their own (the search's group bound)."""
    fwd = layer.fwd_s + layer.tp_fwd_s + layer.cp_fwd_s + max(0.0, zero3_gather_s - layer.fwd_s)
    bwd = layer.bwd_s + layer.tp_bwd_s + layer.cp_bwd_s + max(0.0, zero3_gather_s - layer.bwd_s)
    return LayerTimes(ns(fwd), ns(bwd), min(ns(bwd), ns(layer.bwd_weight_s)))


def weight_bytes(training: TrainingSetup) -> int:
    """Bytes of one weight element in the compute dtype."""
    return 2 if training.mixed_precision else 4


def gather_bytes(training: TrainingSetup, stack: StackProfile) -> int:
    """Bytes per parameter ZeRO gathers (the stack's ``param_gather``)."""
    if stack.param_gather == "fp32":
        return 4
    if stack.param_gather == "fp8" and training.precision == "fp8":
        return 1
    return weight_bytes(training)


def reduce_bytes(training: TrainingSetup, stack: StackProfile) -> int:
    """Bytes per gradient element reduced (and accumulated whole) (the stack's ``grad_reduce``)."""
    return 4 if stack.grad_reduce == "fp32" else weight_bytes(training)


def whole_grads(config: Config, stack: StackProfile) -> bool:
    """ZeRO 2/3 under pipelining on a stack that accumulates a stage's gradients whole until one reduction."""
    return stack.pipeline_reduces_once and config.zero_stage >= 2 and config.num_stages > 1


def gathered_stage(config: Config, stack: StackProfile) -> bool:
    """ZeRO-3 under pipelining on a stack that gathers a stage's parameters once for the step."""
    return stack.pipeline_keeps_params_gathered and config.zero_stage == 3 and config.num_stages > 1


def head_params(workload: Workload, config: Config) -> float:
    """The last stage's parameters: the head, and under pp > 1 its own copy of a tied embedding."""
    return workload.head.params + (workload.tied_copy_params if config.pp > 1 else 0.0)


def optimizer_shard(params: float, config: Config) -> float:
    """Parameters one rank steps: a ZeRO shard over dp x cp from stage 1 up."""
    return params / config.dp_cp if config.zero_stage >= 1 else params


def offloaded_step_s(shard: float, cluster: Cluster, training: TrainingSetup) -> float:
    """Host Adam on an offloaded shard, gradients down and weights up over PCIe."""
    device = cluster.device
    return (shard / (device.host_adam_gparams_per_s * 1e9)
            + shard * 2 * weight_bytes(training) / (device.host_link_gb_per_s * 1e9))


def memory_bound_step_s(cluster: Cluster, training: TrainingSetup, stack: StackProfile) -> float:
    """Seconds per parameter of the end-of-step kernels, all memory-bound (model_states.py), with the
    stack's extra optimizer passes."""
    device = cluster.device
    step_bytes = optimizer_step_bytes(training) + stack.optimizer_bytes_per_param
    return step_bytes / (device.memory_bandwidth_gb_per_s * 1e9 * device.memory_efficiency)


def rank_state_bytes(training: TrainingSetup, config: Config, stack: StackProfile) -> StateBytes:
    """Bytes per parameter a rank holds for its stages: ZeRO's shares (model_states.py), and under
    pipelining on a stack that keeps them whole, the gathered parameters and the whole gradients."""
    states = state_bytes_per_param(training, config.zero_stage, config.dp_cp, config.offload_optimizer)
    weights = states.weights + (gather_bytes(training, stack) if gathered_stage(config, stack) else 0)
    grads = states.gradients + (reduce_bytes(training, stack) if whole_grads(config, stack) else 0)
    return StateBytes(weights=weights, gradients=grads, optimizer=states.optimizer)


def device_table(workload: Workload, cluster: Cluster, training: TrainingSetup, config: Config) -> StageTable:
    """The table on devices that compute on their own (module doc)."""
    c, stack = config, workload.stack
    dims = c.dims
    # data parallelism and ZeRO run over the dp x cp ranks holding the same parameters (ParallelDims)
    per_param = rank_state_bytes(training, c, stack).total
    dp_link = group_link(cluster, dims.span("dp_cp"))
    gb, rb = gather_bytes(training, stack), reduce_bytes(training, stack)
    whole_stage = gathered_stage(c, stack)
    per_layer_gathers = c.zero_stage == 3 and not whole_stage

    def times(layer: LayerCost) -> LayerTimes:  # ZeRO-3: all-gather one layer's weights over dp x cp
        gather = collective_time_s("all_gather", layer.params * gb, dp_link) if per_layer_gathers else 0.0
        return layer_times(layer, gather)

    sync_kind = "all_reduce" if c.zero_stage == 0 else "reduce_scatter"

    def sync_ns(params: float) -> int:  # bandwidth part only; latency is counted once per rank
        return ns(collective_bandwidth_s(sync_kind, params * rb, dp_link))

    def gather_ns(params: float) -> int:  # ZeRO-1/2 after the step, a whole stage at the start of it
        if c.zero_stage in (1, 2) or whole_stage:
            return ns(collective_bandwidth_s("all_gather", params * gb, dp_link))
        return 0

    step_bytes = memory_bound_step_s(cluster, training, stack)

    def optim_ns(params: float) -> int:
        shard = optimizer_shard(params, c)
        if c.offload_optimizer:
            return ns(offloaded_step_s(shard, cluster, training))
        return ns(shard * step_bytes)

    def state(params: float) -> int:
        return int(math.ceil(params * per_param))

    last_params = head_params(workload, c)
    every_sync, tied_sync = step_sync_s(cluster, c, workload.tied_copy_params * weight_bytes(training))
    # stage s sends to stage s + 1 on the rank the schedule places it on (schema/schedule.py stage_rank),
    # inside a node or across; in a V the middle two stages share the last rank (no transfer)
    per_node = cluster.devices_per_node
    intra = ns(p2p_time_s(cluster, workload.output_bytes, same_node=True))
    inter = ns(p2p_time_s(cluster, workload.output_bytes, same_node=False))
    nodes = dims.pipeline_nodes(per_node)

    def hop(s: int) -> int:
        a, b = stage_rank(c.schedule, s, c.pp), stage_rank(c.schedule, s + 1, c.pp)
        return 0 if a == b else intra if nodes[a] == nodes[b] else inter

    p2p = tuple(hop(s) for s in range(c.num_stages - 1))
    block = workload.block
    z3_buffer = 0
    if per_layer_gathers:  # the layer being computed and the one prefetched, unsharded
        z3_buffer = int(math.ceil(2 * max(block.params, workload.embedding.params, last_params) * gb))
    capacity = cluster.device.memory_gib * (1 - training.memory_margin) * 2**30
    return StageTable(
        config=c, num_layers=workload.num_layers,
        block=times(block), selective_extra_ns=ns(block.selective_extra_s),
        full_extra_ns=ns(block.fwd_s + block.tp_fwd_s + block.cp_fwd_s),  # the recomputed forward runs its ring too
        full_extra_weight_ns=(block.weight_groups * ns(block.fwd_s + block.tp_fwd_s + block.cp_fwd_s)
                              if c.schedule in ZERO_BUBBLE else 0),
        embedding=times(workload.embedding), head=times(workload.head), p2p_ns=p2p, late_receive_ns=0,
        block_state_bytes=state(block.params), embedding_state_bytes=state(workload.embedding.params),
        head_state_bytes=state(last_params),
        block_act_bytes=int(math.ceil(block.saved_bytes)),
        block_act_selective_bytes=int(math.ceil(block.selective_saved_bytes)),
        block_act_full_bytes=int(math.ceil(block.full_saved_bytes)),
        embedding_act_bytes=int(math.ceil(workload.embedding.saved_bytes)),
        head_act_bytes=int(math.ceil(workload.head.saved_bytes)),
        logits_transient_bytes=int(math.ceil(workload.logits_transient_bytes)),
        zero3_buffer_bytes=z3_buffer, capacity_bytes=int(capacity),
        ring_transient_bytes=int(math.ceil(workload.ring_transient_bytes)),
        sync_block_ns=sync_ns(block.params), sync_embedding_ns=sync_ns(workload.embedding.params),
        sync_head_ns=sync_ns(last_params), sync_latency_ns=ns(collective_latency_s(sync_kind, dp_link)),
        gather_block_ns=gather_ns(block.params), gather_embedding_ns=gather_ns(workload.embedding.params),
        gather_head_ns=gather_ns(last_params),
        gather_latency_ns=ns(collective_latency_s("all_gather", dp_link)) if c.zero_stage in (1, 2) or whole_stage else 0,
        optim_block_ns=optim_ns(block.params), optim_embedding_ns=optim_ns(workload.embedding.params),
        optim_head_ns=optim_ns(last_params),
        # torch's schedule runtime reduces a stage's gradients after its last backward, nothing to hide behind
        overlap_grad_reduce=training.overlap_grad_reduce and not (stack.pipeline_reduces_once and c.num_stages > 1),
        reserve_permille=reserve_permille(stack),
        step_sync_ns=ns(every_sync), tied_sync_ns=ns(tied_sync),
        baseline_bytes=int(cluster.device.memory_baseline_gib * 2**30),
    )


def step_sync_s(cluster: Cluster, config: Config, tied_grad_bytes: float) -> tuple[float, float]:
    """(every rank, first and last pipeline rank only): the runtime's per-step small all-reduces -- the
    gradient norm's over all ranks, the loss's over pp and over dp x cp -- and the tied embedding's gradient
    between the first and the last pipeline rank. Counted where the cluster has measured collective fits:
    at scale NCCL switches small messages to tree and LL protocols, which the ring formula overstates."""
    if not cluster.collectives:
        return 0.0, 0.0
    dims = config.dims
    scalar = 4.0  # one fp32 value
    every = collective_time_s("all_reduce", scalar, group_link(cluster, dims.span("world")))
    if dims.pp > 1:
        every += collective_time_s("all_reduce", scalar, group_link(cluster, dims.span("pp")))
    if dims.dp_cp > 1:
        every += collective_time_s("all_reduce", scalar, group_link(cluster, dims.span("dp_cp")))
    ends = collective_time_s("all_reduce", tied_grad_bytes, group_link(cluster, dims.embedding_span())) \
        if dims.pp > 1 and tied_grad_bytes > 0 else 0.0
    return every, ends
