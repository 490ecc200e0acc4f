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
gathered for the step; the optimizer's extra passes; the allocator's reserve. Whole gradients live only
from the stage's first gradient-creating backward to its last, so they are per-stage terms
(``*_grad_bytes``) counted at the memory peaks where they are live (simulate.memory_peaks), not model
states.

``device_table`` fills the table for devices that compute on their own (GPUs): collectives on the links
of their groups (``ParallelDims.span``, cost/comm.py), the gradient reduction overlapping the backward,
ZeRO-3's gathers prefetched behind compute. ZeRO 2/3 reduce-scatter every micro-batch's gradients in its
backward (``reduces_each_microbatch``), on the links ZeRO-3's backward gathers use, so a layer's two are
hidden together up to its backward (``layer_times``); ZeRO 0/1, and pipelined stages that accumulate whole
gradients, reduce once after the last backward (the ``sync_*`` terms). What a host adds or changes (a CPU
host whose ranks share cores and whose collectives do not overlap compute) is the host model's
(cost/host_model.py), applied by ``cost/tables.build_table``, the one way the planner gets a table.

Mixture of Experts (issue 31). A layer's routed-expert parameters (``LayerCost.expert_params``: of any layer,
the MoE blocks', and the head's when it carries a multi-token-prediction module's experts) belong to the
experts' own data-parallel group, ``edp = tp x cp x dp / (ep x etp)`` ranks (ParallelDims.edp, its links
``expert_span("edp")``): their gradients are reduced, ZeRO shards their states, ZeRO-1/2 all-gathers and
ZeRO-3 gathers them, and the optimizer steps their shard, over edp; every other parameter keeps dp x cp.
This is what Megatron-Core does: its expert data-parallel group (megatron/core/parallel_state.py
``_EXPERT_DATA_PARALLEL_GROUP``, ranks from the expert RankGenerator), over which DistributedDataParallel
reduces the expert gradients (megatron/core/distributed/distributed_data_parallel.py: buffers of expert
parameters go to ``expert_parallel_buffers`` with ``data_parallel_group = self.intra_expt_dp_group``) and
the distributed optimizer shards their states (megatron/core/optimizer/__init__.py: the expert parameter
groups' optimizer gets ``data_parallel_group=intra_expt_dp_group``). The
all-to-all of the token dispatch and combine not hidden behind compute (``ep_fwd_s``, ``ep_bwd_s``) is on
the critical path of the layer, like its TP collectives.

Leading dense blocks (DeepSeek-V3's first 3): the table's layout variables count the *MoE* blocks only
(``num_layers`` = blocks - ``dense_layers``); stage 0 holds the ``dense_layers`` dense blocks as a constant
(``dense``, ``dense_*`` fields, added to stage 0 wherever the embedding's terms are), so every term stays
linear and the blocks the search places stay identical. Those dense blocks either all keep their
activations, or are all fully recomputed (``dense_full``, a table of its own: per-block choices between two
block kinds would need a second kind in the recomputation program). ``evaluate.table_shapes`` /
``plan_shapes`` convert a plan's per-stage counts (every block) to the table's and back.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from dataclasses import dataclass
from functools import cached_property

from autoplan.cost.comm import collective_bandwidth_s, collective_latency_s, collective_time_s, group_link, p2p_time_s
from autoplan.cost.model_states import StateBytes, optimizer_step_bytes, state_bytes_per_param
from autoplan.cost.workload import LayerCost, Workload
from autoplan.errors import SpecError
from autoplan.schema import Cluster, ParallelDims, StackProfile, TrainingSetup
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
    reduce_ns: int = 0
    """Of ``bwd_ns``, the layer's gradient reduce-scatter not hidden behind its backward, where ZeRO 2/3
    reduces every micro-batch (``reduces_each_microbatch``); what the step's breakdown calls data-parallel
    communication."""


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
    # device bytes of weights + gradients + optimizer state, always held (whole gradients apart: below)
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
    dense_layers: int = 0
    """MoE models: the leading dense blocks stage 0 holds besides its ``n`` MoE blocks (module doc); the
    ``dense*`` fields below are their totals, added to stage 0's constants."""
    dense_full: bool = False
    """Those dense blocks are all fully recomputed (their backward reruns their forward, they keep only their
    input); otherwise none of them is. The search tries both (search/planner.py)."""
    dense_transient_bytes: int = 0
    """With ``dense_full``: one dense block's activations rebuilt in its backward, on the rank holding stage 0."""
    dense: LayerTimes = LayerTimes(0, 0, 0)
    dense_state_bytes: int = 0
    dense_act_bytes: int = 0
    """Their activations per micro-batch (their inputs only under ``dense_full``)."""
    dense_sync_ns: int = 0
    dense_gather_ns: int = 0
    dense_optim_ns: int = 0
    expert_edp: int = 1
    """The experts' data-parallel size when the model has expert parameters (ParallelDims.edp), else 1."""
    block_grad_bytes: int = 0
    """Where ``whole_grads`` holds, a block's gradients accumulated whole (unsharded, in the reduction's dtype),
    live on a rank only from its stage's first gradient-creating backward to its last (simulate.memory_peaks);
    0 elsewhere. The embedding's (with stage 0's leading dense blocks' in ``dense_grad_bytes``) and the head's
    likewise."""
    embedding_grad_bytes: int = 0
    head_grad_bytes: int = 0
    dense_grad_bytes: int = 0
    kept_output_bytes: int = 0
    """Under pipelining on a stack that keeps them (``StackProfile.pipeline_keeps_outputs``), one micro-batch's
    last-stage output, alive on the rank holding the last stage from that micro-batch's forward to the end of
    the step: counted at each memory peak times the last-stage forwards completed by then
    (simulate.memory_peaks ``kept_outputs``), with the activations' reserve. 0 at pp = 1 (no schedule keeps
    them) and where the stack keeps none."""

    @property
    def num_stages(self) -> int:
        return self.config.num_stages

    @property
    def reduces(self) -> bool:
        """Some gradient is reduced across ranks: over dp x cp, or the experts' over edp (which can exceed 1
        with dp x cp = 1, e.g. experts replicated over the TP ranks: ep x etp < tp)."""
        return self.config.dp_cp > 1 or self.expert_edp > 1

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
        return _stages_by_rank(c.schedule, c.pp, c.virtual_stages)

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


@functools.lru_cache(maxsize=4096)
def _stages_by_rank(schedule: str, pp: int, virtual_stages: int) -> list[list[int]]:
    """Each rank's stages (schema/schedule.py), shared by the tables of one schedule (read only)."""
    return [list(stages_of_rank(schedule, r, pp, virtual_stages)) for r in range(pp)]


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


def layer_times(layer: LayerCost, zero3_gather_s: float = 0.0, grad_reduce_s: float = 0.0,
                reduce_overlaps: bool = True) -> LayerTimes:
    """Forward and backward of one layer with its TP collectives and the unhidden part of its CP ring;
    ZeRO-3 prefetches the next layer's weights during this layer's compute, so only the excess of the
    gather shows. ``grad_reduce_s``: the layer's gradient reduce-scatter in every micro-batch's backward
    (``reduces_each_microbatch``), issued after the layer's backward and run beside the next one's, on the
    same links as the backward's gathers: the two together are hidden up to the backward's compute
    (``reduce_overlaps``; else the reduction waits in full). Without a gather or a reduction these are the
    least times any configuration with this layer cost can have on devices of their own (the search's group
    bound). The MoE all-to-all not hidden (``ep_*_s``) is on
the critical path, as the TP collectives are (megatron/core/transformer/moe/token_dispatcher.py runs dispatch
and combine between the router and the experts, and between the experts and the residual add)."""
    fwd = layer.fwd_s + layer.tp_fwd_s + layer.cp_fwd_s + layer.ep_fwd_s + max(0.0, zero3_gather_s - layer.fwd_s)
    gather_excess = max(0.0, zero3_gather_s - layer.bwd_s)
    reduce_excess = (max(0.0, zero3_gather_s + grad_reduce_s - layer.bwd_s) - gather_excess if reduce_overlaps
                     else grad_reduce_s)
    bwd = layer.bwd_s + layer.tp_bwd_s + layer.cp_bwd_s + layer.ep_bwd_s + gather_excess + reduce_excess
    return LayerTimes(ns(fwd), ns(bwd), min(ns(bwd), ns(layer.bwd_weight_s)), ns(reduce_excess))


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


def reduces_each_microbatch(config: Config, stack: StackProfile) -> bool:
    """ZeRO 2/3 keeps only gradient shards between micro-batches, so every micro-batch's backward
    reduce-scatters its layers' gradients as it goes (FSDP2's post-backward hook per unit, with gradient
    sync on: runtime/parallel/data_parallel.py ``set_microbatch_sync``, torchtitan's gradient accumulation;
    DeepSpeed ZeRO-2's reduction buckets), unless the stack's pipeline runtime accumulates a stage's
    gradients whole for one reduction (``whole_grads``). ZeRO 0/1 reduce once, after the last micro-batch."""
    return config.zero_stage >= 2 and not whole_grads(config, stack)


def gathered_stage(config: Config, stack: StackProfile) -> bool:
    """ZeRO-3 under pipelining on a stack that gathers a stage's parameters once for the step."""
    return stack.pipeline_keeps_params_gathered and config.zero_stage == 3 and config.num_stages > 1


def head_params(workload: Workload, config: Config) -> float:
    """The last stage's parameters: the head, and under pp > 1 its own copy of a tied embedding."""
    return workload.head.params + (workload.tied_copy_params if config.pp > 1 else 0.0)


def optimizer_shard(params: float, config: Config, expert_params: float = 0.0) -> float:
    """Parameters one rank steps: a ZeRO shard from stage 1 up, over dp x cp, and of ``expert_params`` (of
    ``params``) over the experts' edp (module doc)."""
    if config.zero_stage < 1:
        return params
    shard = (params - expert_params) / config.dp_cp
    return shard + expert_params / config.dims.edp if expert_params else shard


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


def rank_state_bytes(training: TrainingSetup, config: Config, stack: StackProfile,
                     expert: bool = False) -> StateBytes:
    """Bytes per parameter a rank holds for its stages for the whole step: ZeRO's shares (model_states.py)
    over dp x cp, or for routed-expert parameters (``expert``) over the experts' edp (module doc), and under
    pipelining on a stack that keeps them gathered, the gathered parameters. Gradients are held in the dtype the
    stack reduces and accumulates them in (``grad_reduce``), not the compute dtype ZeRO's paper counts: FSDP2
    with an fp32 ``reduce_dtype`` keeps fp32 gradient shards, and at ZeRO 0/1 accumulates whole gradients over
    the micro-batches in fp32 (torch/distributed/fsdp/_fully_shard/_fsdp_param.py
    ``to_accumulated_grad_if_needed``); Megatron's gradient buffer is in the compute dtype unless
    ``grad_reduce_in_fp32``. Whole gradients that live for part of the step only are ``whole_grad_bytes``."""
    shards = config.dims.edp if expert else config.dp_cp
    states = state_bytes_per_param(training, config.zero_stage, shards, config.offload_optimizer)
    weights = states.weights + (gather_bytes(training, stack) if gathered_stage(config, stack) else 0)
    gradients = states.gradients * reduce_bytes(training, stack) / weight_bytes(training)
    return StateBytes(weights=weights, gradients=gradients, optimizer=states.optimizer)


def whole_grad_bytes(training: TrainingSetup, config: Config, stack: StackProfile) -> int:
    """Bytes per parameter (expert or not: FSDP2 accumulates every unsharded gradient whole) of a stage's whole
    gradients where ``whole_grads`` holds (torch's FSDP2: with gradient sync off, _fsdp_param.py
    to_accumulated_grad_if_needed / accumulate_unsharded_grad_if_needed keep the unsharded gradient, in
    the reduce dtype, until post_backward reduce-scatters and frees it), else 0."""
    return reduce_bytes(training, stack) if whole_grads(config, stack) else 0


def device_table(workload: Workload, cluster: Cluster, training: TrainingSetup, config: Config,
                 dense_full: bool = False) -> StageTable:
    """The table on devices that compute on their own (module doc); ``dense_full``: a MoE model's leading
    dense blocks are fully recomputed."""
    c, stack = config, workload.stack
    dims = c.dims
    # data parallelism and ZeRO run over the dp x cp ranks holding the same parameters (ParallelDims), the
    # routed experts' over their own edp ranks (module doc)
    per_param = rank_state_bytes(training, c, stack).total
    per_expert_param = rank_state_bytes(training, c, stack, expert=True).total
    per_whole_grad = whole_grad_bytes(training, c, stack)
    dp_link = group_link(cluster, dims.span("dp_cp"))
    edp_link = group_link(cluster, dims.expert_span("edp"))
    gb, rb = gather_bytes(training, stack), reduce_bytes(training, stack)
    whole_stage = gathered_stage(c, stack)
    per_layer_gathers = c.zero_stage == 3 and not whole_stage

    def over_groups(fn, params: float, experts: float) -> float:
        """``fn(parameters, link)`` for the dp x cp part and, where there are any, the experts' edp part."""
        return fn(params - experts, dp_link) + (fn(experts, edp_link) if experts else 0.0)

    each_microbatch = reduces_each_microbatch(c, stack)

    def times(layer: LayerCost) -> LayerTimes:  # ZeRO-3: all-gather one layer's weights over its groups
        gather = over_groups(lambda p, link: collective_time_s("all_gather", p * gb, link), layer.params,
                             layer.expert_params) if per_layer_gathers else 0.0
        reduce = over_groups(lambda p, link: collective_time_s("reduce_scatter", p * rb, link), layer.params,
                             layer.expert_params) if each_microbatch else 0.0
        return layer_times(layer, gather, reduce, training.overlap_grad_reduce)

    sync_kind = "all_reduce" if c.zero_stage == 0 else "reduce_scatter"

    def sync_ns(params: float, experts: float = 0.0) -> int:  # bandwidth part only; latency once per rank
        if each_microbatch:  # in every backward, the last one's included (times)
            return 0
        return ns(over_groups(lambda p, link: collective_bandwidth_s(sync_kind, p * rb, link), params, experts))

    gathers_after = c.zero_stage in (1, 2) or whole_stage

    def gather_ns(params: float, experts: float = 0.0) -> int:  # ZeRO-1/2 after the step, a whole stage before it
        if gathers_after:
            return ns(over_groups(lambda p, link: collective_bandwidth_s("all_gather", p * gb, link), params, experts))
        return 0

    step_bytes = memory_bound_step_s(cluster, training, stack)

    def optim_ns(params: float, experts: float = 0.0) -> int:
        shard = optimizer_shard(params, c, experts)
        if c.offload_optimizer:
            return ns(offloaded_step_s(shard, cluster, training))
        return ns(shard * step_bytes)

    def state(params: float, experts: float = 0.0) -> int:
        dense = params - experts
        return int(math.ceil(dense * per_param + experts * per_expert_param if experts else dense * per_param))

    def whole(params: float) -> int:
        return int(math.ceil(params * per_whole_grad))

    last_params = head_params(workload, c)
    head_experts = workload.head.expert_params
    emb_params, emb_experts = workload.embedding.params, workload.embedding.expert_params
    every_sync, tied_sync = step_sync_s(cluster, c, workload.tied_copy_params * weight_bytes(training))
    p2p = p2p_ns(workload, cluster, c)
    block, be = workload.block, workload.block.expert_params
    k, dense_block = workload.dense_layers, workload.dense_block
    if k and dense_block is None:
        raise ValueError("a workload with leading dense layers needs their cost (Workload.dense_block)")
    has_experts = any(layer.expert_params for layer in (block, workload.embedding, workload.head))
    z3_buffer = 0
    if per_layer_gathers:  # the layer being computed and the one prefetched, unsharded
        largest = max(block.params, workload.embedding.params, last_params, dense_block.params if k else 0.0)
        z3_buffer = int(math.ceil(2 * largest * gb))
    capacity = cluster.device.memory_gib * (1 - training.memory_margin) * 2**30
    # the recomputed forward runs its ring and its all-to-all again
    rerun = block.fwd_s + block.tp_fwd_s + block.cp_fwd_s + block.ep_fwd_s
    sync_latency = 0.0 if each_microbatch else collective_latency_s(sync_kind, dp_link)
    gather_latency = collective_latency_s("all_gather", dp_link) if gathers_after else 0.0
    if has_experts:  # the experts' own collectives start once more
        sync_latency += 0.0 if each_microbatch else collective_latency_s(sync_kind, edp_link)
        gather_latency += collective_latency_s("all_gather", edp_link) if gathers_after else 0.0
    dense = {}
    if k:
        d, de = dense_block, dense_block.expert_params
        one = times(d)
        saved, transient, extra, extra_weight = int(math.ceil(d.saved_bytes)), 0, 0, 0
        if dense_full:  # each reruns its forward in its backward, keeps its input, rebuilds one at a time
            dense_rerun = ns(d.fwd_s + d.tp_fwd_s + d.cp_fwd_s + d.ep_fwd_s)
            extra_weight = d.weight_groups * dense_rerun if c.schedule in ZERO_BUBBLE else 0
            extra = dense_rerun + extra_weight
            saved, transient = int(math.ceil(d.full_saved_bytes)), int(math.ceil(d.saved_bytes - d.full_saved_bytes))
        dense = dict(dense_layers=k, dense_full=dense_full,
                     dense=LayerTimes(k * one.fwd_ns, k * (one.bwd_ns + extra), k * (one.wgt_ns + extra_weight),
                                      k * one.reduce_ns),
                     dense_transient_bytes=transient,
                     dense_state_bytes=k * state(d.params, de), dense_grad_bytes=k * whole(d.params),
                     dense_act_bytes=k * saved,
                     dense_sync_ns=k * sync_ns(d.params, de), dense_gather_ns=k * gather_ns(d.params, de),
                     dense_optim_ns=k * optim_ns(d.params, de))
    return StageTable(
        config=c, num_layers=workload.num_layers - k,
        block=times(block), selective_extra_ns=ns(block.selective_extra_s),
        full_extra_ns=ns(rerun),
        full_extra_weight_ns=block.weight_groups * ns(rerun) if c.schedule in ZERO_BUBBLE else 0,
        embedding=times(workload.embedding), head=times(workload.head), p2p_ns=p2p, late_receive_ns=0,
        block_state_bytes=state(block.params, be), embedding_state_bytes=state(emb_params, emb_experts),
        head_state_bytes=state(last_params, head_experts),
        block_grad_bytes=whole(block.params), embedding_grad_bytes=whole(emb_params),
        head_grad_bytes=whole(last_params),
        block_act_bytes=int(math.ceil(block.saved_bytes)),
        block_act_selective_bytes=int(math.ceil(block.selective_saved_bytes)),
        block_act_full_bytes=int(math.ceil(block.full_saved_bytes)),
        embedding_act_bytes=int(math.ceil(workload.embedding.saved_bytes)),
        head_act_bytes=int(math.ceil(workload.head.saved_bytes)),
        logits_transient_bytes=int(math.ceil(workload.logits_transient_bytes)),
        kept_output_bytes=int(math.ceil(workload.kept_output_bytes)) if c.pp > 1 else 0,
        zero3_buffer_bytes=z3_buffer, capacity_bytes=int(capacity),
        ring_transient_bytes=int(math.ceil(workload.ring_transient_bytes)),
        sync_block_ns=sync_ns(block.params, be), sync_embedding_ns=sync_ns(emb_params, emb_experts),
        sync_head_ns=sync_ns(last_params, head_experts), sync_latency_ns=ns(sync_latency),
        gather_block_ns=gather_ns(block.params, be), gather_embedding_ns=gather_ns(emb_params, emb_experts),
        gather_head_ns=gather_ns(last_params, head_experts), gather_latency_ns=ns(gather_latency),
        optim_block_ns=optim_ns(block.params, be), optim_embedding_ns=optim_ns(emb_params, emb_experts),
        optim_head_ns=optim_ns(last_params, head_experts),
        # torch's schedule runtime reduces a stage's gradients after its last backward, nothing to hide behind
        overlap_grad_reduce=training.overlap_grad_reduce and not (stack.pipeline_reduces_once and c.num_stages > 1),
        reserve_permille=reserve_permille(stack),
        step_sync_ns=ns(every_sync), tied_sync_ns=ns(tied_sync),
        baseline_bytes=int(cluster.device.memory_baseline_gib * 2**30),
        expert_edp=dims.edp if has_experts else 1, **dense,
    )


def p2p_ns(workload: Workload, cluster: Cluster, c: Config) -> tuple[int, ...]:
    """Transfer time from each stage to the next: stage s sends to stage s + 1 on the rank the schedule
    places it on (schema/schedule.py stage_rank), inside a node or across; in a V the middle two stages
    share the last rank (no transfer)."""
    intra = ns(p2p_time_s(cluster, workload.output_bytes, same_node=True))
    inter = ns(p2p_time_s(cluster, workload.output_bytes, same_node=False))
    nodes = _pipeline_nodes(c.dims, cluster.devices_per_node)

    def hop(s: int) -> int:
        a, b = stage_rank(c.schedule, s, c.pp), stage_rank(c.schedule, s + 1, c.pp)
        return 0 if a == b else intra if nodes[a] == nodes[b] else inter

    return tuple(hop(s) for s in range(c.num_stages - 1))


def with_schedule(t: StageTable, workload: Workload, cluster: Cluster, config: Config) -> StageTable:
    """``device_table(workload, cluster, training, config)`` from the device table ``t`` of a configuration
    that differs from ``config`` only in its schedule and stages per rank, with the same pp (so the same
    "one stage or several"): only the transfers and a split backward's reruns change. The search builds
    one table per (group, ZeRO stage, offload, whether the stack hides the experts' exchange) and derives the
    schedules' from it (tests check equality)."""
    old = t.config
    same = dataclasses.replace(config, schedule=old.schedule, virtual_stages=old.virtual_stages)
    if same != old or (old.num_stages > 1) != (config.num_stages > 1):
        raise ValueError(f"{config} is not {old} with another schedule")
    weight_reruns = workload.block.weight_groups * t.full_extra_ns if config.schedule in ZERO_BUBBLE else 0
    dense = t.dense
    if t.dense_full:  # the recomputed dense blocks' weight-backward reruns come and go with a split backward
        d = workload.dense_block
        per_block = d.weight_groups * ns(d.fwd_s + d.tp_fwd_s + d.cp_fwd_s + d.ep_fwd_s)
        change = t.dense_layers * per_block * ((config.schedule in ZERO_BUBBLE) - (old.schedule in ZERO_BUBBLE))
        dense = LayerTimes(dense.fwd_ns, dense.bwd_ns + change, dense.wgt_ns + change)
    return dataclasses.replace(t, config=config, p2p_ns=p2p_ns(workload, cluster, config),
                               full_extra_weight_ns=weight_reruns, dense=dense)


@functools.lru_cache(maxsize=4096)
def _pipeline_nodes(dims: ParallelDims, devices_per_node: int) -> tuple[int, ...]:
    """ParallelDims.pipeline_nodes, kept: the search builds thousands of tables of a few hundred layouts."""
    return dims.pipeline_nodes(devices_per_node)


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
