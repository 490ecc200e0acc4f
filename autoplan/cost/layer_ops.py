"""What one layer runs, and the one builder that turns it into a ``LayerCost``.

Both ways of describing a model end here: the analytic path (cost/analytic_ops.py, from a ModelSpec and
the published formulas) and the profile path (profiler/adapter.py, from what ``autoplan profile`` traced)
each produce ``LayerOps`` (the GEMMs with their shapes, the attention core, the memory-bound bytes, the
saved bytes and the TP collectives of one layer for one micro-batch on one device), and ``layer_cost``
alone prices them. So a profiled model and a spec of the same model get the same times by construction,
and a profile plans for any precision: shapes and FLOPs do not depend on it, bytes scale with the
element size.

Kernel by kernel (times from cost/compute.py, collectives from cost/comm.py):

* GEMMs of the linear layers: forward on the GEMM curve of the training precision (fp8 included), backward
  two GEMMs of the same size (input gradient and weight gradient). Under fp8 each GEMM also pays its
  per-tensor scaling casts (``fp8_cast_bytes``), memory-bound.
* attention core, ``flash``: one fused kernel each way at its measured curve; under a causal mask it
  executes half the score FLOPs (FLASH_CAUSAL_FACTOR); its backward executes 2.5 x the forward's FLOPs
  (FLASH_BACKWARD_FLOPS). Nothing to drop for selective recomputation.
* attention core, ``standard``: the QK^T and attention-over-V batched GEMMs (a roofline: they must write
  and read the a x s x s scores) and the softmax and dropout kernels over the scores; backward twice the
  forward; selective recomputation reruns this forward.
* attention core under context parallelism (cp > 1): torch's ring attention, cost/context_parallel.py: each
  rank runs 1/cp of the causal work as cp fused kernels on its s/cp queries, and the ring's K/V exchange
  shows where the kernels cannot hide it.
* memory-bound (element-wise) work between the GEMMs, as the stack runs it (schema/stack.py
  ``elementwise``): fused kernels move the fused bytes given, backward BACKWARD_MEMORY_FACTOR x; an eager
  stack moves the bytes its eager ops move, counted forward and backward (``LayerOps.eager_bytes``, where
  the layer's source counted them); without gradient-accumulation fusion the backward also adds each
  weight gradient into the fp32 buffer (read the gradient, read and write the buffer: e + 8 bytes per
  parameter, every micro-batch).
* host time (``HostOps`` priced by the device's host fields, schema/hardware.py; 0 on GPUs): the layer's
  eager ops and views forward and backward, and under TP the extra DTensor work of each parallelised
  module. Recomputation reruns it with the forward it reruns.
* collectives on the layer's own groups: TP on the ``tp`` group, the CP ring on the ``cp`` group, each on
  the link its span crosses (``ParallelDims.span``, cost/comm.py); an MoE layer's token dispatch and
  combine (all-to-alls on the EP group, the all-gather / reduce-scatter on the expert-TP group) on the links
  of ``ParallelDims.expert_span``, kept apart as ``LayerCost.ep_fwd_s`` / ``ep_bwd_s`` (cost/moe_ops.py); on a
  deduplicating dispatcher (``StackProfile.ep_dispatcher``) its ``RoutedExchange`` instead
  (``routed_exchange_s``).
* saved activations: the layer's totals (``LayerOps.saved``), or, where the stack keeps some of them in fp8
  under fp8 training (``StackProfile.fp8_saved``) or recomputes Megatron's modules (``selective_recompute:
  modules``), the sum over the layer's ``SavedTensor`` list with each tensor's dtype and the chosen modules'
  tensors left out; a module's rerun (``ModuleRerun``) is priced as its own forward (``rerun_s``) and is the
  layer's ``selective_extra_s``.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from autoplan.cost.activations import SavedBytes
from autoplan.cost.comm import Collective, collective_time_s, group_link, hierarchical_exchange_s, routed_copies
from autoplan.cost.context_parallel import RingExchange, ring_exposed_s
from autoplan.cost.compute import flash_attention_time_s, matmul_time_s, memory_time_s
from autoplan.schema import Cluster, DeviceProfile, ParallelDims, StackProfile, TrainingSetup

# Backward runs two GEMMs (input and weight gradient) per forward GEMM: "backward = 2 x forward".
BACKWARD_FACTOR = 2.0
# FlashAttention skips the score blocks above the causal diagonal, so it executes about half the score
# FLOPs that Megatron's count (and MFU) includes (Dao 2023, FlashAttention-2, section 4.1); standard
# attention computes all of them.
FLASH_CAUSAL_FACTOR = 0.5
# The flash backward recomputes the scores and runs five matmuls against the forward's two: 2.5 x the
# forward's FLOPs, the count the FlashAttention benchmarks use (flash-attention benchmarks/, "bwd": 2.5 f).
FLASH_BACKWARD_FLOPS = 2.5
# The backward of an element-wise kernel reads the gradient of its output (and its saved input) and writes
# the gradient of its input: per op, bwd/fwd bytes are 1.5 for a norm (3 against 2), GELU (3/2) and the
# SwiGLU product (5/3 = 1.7), 1.0 for a residual add, RoPE and dropout; 1.5 for a block's mix.
BACKWARD_MEMORY_FACTOR = 1.5


@dataclass(frozen=True)
class Gemm:
    """``count`` GEMMs C[m, n] = A[m, k] B[k, n] (m = tokens, k = input features, n = output features)."""

    m: int
    n: int
    k: int
    count: int = 1
    fp8: bool = True
    """Whether it runs in fp8 under fp8 training (the linear layers of the blocks; not the output head)."""
    grouped: bool = False
    """The ``count`` GEMMs are one grouped GEMM over one stacked weight (an MoE layer's local experts): priced
    per expert (each its own call on the curve), one operation on parameters (``LayerCost.weight_groups``)."""

    @property
    def flops(self) -> float:
        return 2.0 * self.m * self.n * self.k * self.count


@dataclass(frozen=True)
class AttentionCore:
    """The attention core of one block on one device: ``batch`` sequences of ``seq_len`` tokens, ``heads``
    query heads (this device's share) of ``head_dim``; causal as in a decoder-only LM. Under context
    parallelism (``cp`` > 1) the device holds seq_len / cp of the queries and does 1/cp of the work
    (cost/context_parallel.py: torch's load-balanced split leaves no imbalance)."""

    batch: int
    heads: float
    seq_len: int
    head_dim: int
    dropout: bool
    cp: int = 1
    v_head_dim: int = 0
    """Width of a value head when it differs from the query/key head (DeepSeek's MLA: 192 for q and k, 128
    for v); 0: ``head_dim``."""
    keys: float | None = None
    """Keys per query in Megatron's count, under a sliding window (``flops.attended_keys``: the causal band's
    2 x pairs / s, averaged over windowed and full blocks); None: ``seq_len`` (full attention)."""

    @property
    def square(self) -> float:
        """s x keys: s^2 for full attention, the scores Megatron's count covers."""
        return self.seq_len * (self.keys if self.keys is not None else self.seq_len)

    @property
    def flops(self) -> float:
        """QK^T and attention-over-V counted in full, 4 b s^2 h (Megatron's count, not halved for the mask;
        s x keys under a window); this device's 1/cp share. With a value head of its own: 2 b s^2 heads
        (d_qk + d_v)."""
        if self.v_head_dim:
            return 2.0 * self.batch * self.heads * self.square * (self.head_dim + self.v_head_dim) / self.cp
        return 4.0 * self.batch * self.heads * self.square * self.head_dim / self.cp

    @property
    def kernel_seq_len(self) -> int:
        """Queries one kernel call sees: the whole sequence, or under cp the rank's s / cp (one ring step)."""
        return self.seq_len // self.cp

    @property
    def score_elements(self) -> float:
        return self.batch * self.heads * self.square / self.cp


@dataclass(frozen=True)
class Message:
    """One collective on the critical path: ``kind`` over ``size_bytes`` (the full, unsharded size; for an
    all-to-all, one rank's whole send buffer)."""

    kind: Collective
    size_bytes: float


@dataclass(frozen=True)
class HostOps:
    """What one layer costs the host, counted as ``TorchDispatchMode`` sees the runtime's layer run
    (cost/analytic_ops.py): compute ops and view ops per forward and per backward, GEMM and attention calls
    excluded (their curves carry their fixed cost); the modules tensor parallelism wraps in DTensor; the
    parameter tensors the optimizer steps one by one, and how many of them TP makes DTensors."""

    fwd_ops: int = 0
    fwd_views: int = 0
    bwd_ops: int = 0
    bwd_views: int = 0
    tp_modules: int = 0
    param_tensors: int = 0
    tp_param_tensors: int = 0


@dataclass(frozen=True)
class SavedTensor:
    """One activation a layer keeps for its backward (per micro-batch on this device), as what keeps it: what a
    stack's fp8 storage (``StackProfile.fp8_saved``) and module-level recomputation (``recompute_modules``) act
    on. ``LayerOps.saved.none`` is the sum of these in the activation dtype (tests/planner/test_moe_dispatcher.py
    checks it layer by layer)."""

    elements: float
    kept_whole: bool = True
    """Kept in the activation dtype by an op that is not an fp8 GEMM (a norm's or the SwiGLU's backward, the
    attention kernel, a bf16 GEMM such as the router's)."""
    fp8_gemms: int = 0
    """fp8 GEMMs that keep it as their input for the weight gradient: each its own quantized copy where the
    stack keeps fp8 ``gemm_inputs``, else the one copy in the activation dtype they share."""
    role: str = ""
    """"attention_output" or "swiglu_inputs": the tensors a stack may keep in one fp8 copy (``fp8_saved``)."""
    element_bytes: float = 0.0
    """Bytes of an element whatever the training dtype (fp32 router logits 4, masks 1); 0: the activation dtype."""
    modules: tuple[str, ...] = ()
    """Megatron recompute modules that drop it (and rebuild it in backward; its fp8 copies with it, as
    Megatron-Core's ``set_save_original_input`` makes the consumers keep the discarded original)."""

    def bytes(self, e: int, fp8: frozenset[str]) -> float:
        """Bytes kept with activations of ``e`` bytes and the saved-fp8 choices ``fp8`` in force."""
        if self.element_bytes:
            return self.elements * self.element_bytes
        if self.role and self.role in fp8:
            return self.elements * 1.0
        quantized = "gemm_inputs" in fp8
        whole = self.kept_whole or (self.fp8_gemms > 0 and not quantized)
        return self.elements * ((e if whole else 0) + (self.fp8_gemms if quantized else 0))


@dataclass(frozen=True)
class RoutedExchange:
    """One dispatch (or combine) of a node-deduplicating dispatcher (``StackProfile.ep_dispatcher``
    ``deduplicated``): ``rows`` tokens of ``row_bytes`` each, every token routed to ``k`` of ``experts``
    experts laid evenly over the EP group; priced on the group's nodes by ``expert_comm_s`` (cost/comm.py
    ``routed_copies``, ``hierarchical_exchange_s``)."""

    rows: float
    row_bytes: float
    experts: int
    k: int
    groups: int = 0
    """Group-limited routing (DeepSeek-V3: the experts in 8 groups, a token's k among the experts of its
    ``group_topk`` best groups; Megatron's moe_router_num_groups / moe_router_group_topk): where a group is the
    experts of one node, a token reaches at most ``group_topk`` nodes. 0: unlimited (filled from the spec's
    ``moe.router_groups`` by moe_ops.deduplicated_exchanges)."""
    group_topk: int = 0


@dataclass(frozen=True)
class ModuleRerun:
    """What a Megatron recompute module (``StackProfile.recompute_modules``) reruns in a block's backward: the
    forward work of ``ops`` (GEMMs, attention, memory-bound bytes, its TP and EP messages)."""

    module: str
    ops: "LayerOps"


@dataclass(frozen=True)
class LayerOps:
    """One layer (the embedding, one block or the head) for one micro-batch on one device, after TP."""

    params: float
    """Parameters this device holds for the layer (TP shard, before any ZeRO sharding)."""
    gemms: tuple[Gemm, ...]
    attention: AttentionCore | None
    elementwise_bytes: float
    """Bytes the memory-bound kernels of the forward read and write (GEMM and attention excluded)."""
    elementwise_kernels: int
    saved: SavedBytes
    tp_fwd: tuple[Message, ...] = ()
    tp_bwd: tuple[Message, ...] = ()
    ring: RingExchange | None = None
    """Context parallelism: the K/V the block's ring attention exchanges (None without cp)."""
    host: HostOps = HostOps()
    eager_bytes: tuple[float, float] | None = None
    """(forward, backward) bytes the same memory-bound work moves when every op is its own kernel, as the
    runtime's eager layers run it (cost/analytic_ops.py ``EAGER_ELEMENTS``); priced instead of the fused
    bytes on a device that runs the runtime eagerly (one with host fields: a calibrated CPU). None: not
    counted (a traced profile), the fused bytes are priced."""
    expert_params: float = 0.0
    """Of ``params``, the routed experts' this device holds (cost/moe_ops.py); 0 for a dense layer."""
    ep_fwd: tuple[Message, ...] = ()
    """MoE: the token dispatch and combine all-to-alls on the EP group (``ParallelDims.expert_span("ep")``),
    forward."""
    ep_bwd: tuple[Message, ...] = ()
    etp_fwd: tuple[Message, ...] = ()
    """MoE under expert TP: the dispatcher's all-gather / reduce-scatter of the routed tokens on the etp
    group, forward."""
    etp_bwd: tuple[Message, ...] = ()
    model_flops: float | None = None
    """Forward model FLOPs when they differ from what the GEMMs and the core execute (MoE: the busiest rank
    computes ``moe_imbalance`` x its balanced share of routed tokens, MFU counts the balanced share);
    None: the executed ones."""
    saved_tensors: tuple[SavedTensor, ...] = ()
    """``saved.none`` tensor by tensor (analytic blocks; empty for a traced profile, the embedding, the head)."""
    reruns: tuple[ModuleRerun, ...] = ()
    """The Megatron recompute modules the layer has, with what each reruns."""
    dispatch_fwd: tuple[RoutedExchange, ...] = ()
    """MoE on a deduplicating dispatcher: the dispatch and combine, forward (``ep_fwd`` is then empty)."""
    dispatch_bwd: tuple[RoutedExchange, ...] = ()


def lists_tensors(stack: StackProfile | None) -> bool:
    """Whether a layer's builder lists its ``SavedTensor`` and ``ModuleRerun`` for ``stack``: only a stack that
    keeps activations in fp8 or recomputes Megatron's modules reads them (every other prices the totals), and
    building them for every split would cost the search time for nothing."""
    return stack is not None and (stack.selective_recompute == "modules" or bool(stack.fp8_saved))


def shard_sequence(ops: LayerOps, cp: int, ring: RingExchange | None = None) -> LayerOps:
    """What context parallelism does to one layer: each rank holds s / cp of every sequence's tokens, so
    every token-linear quantity (GEMM rows, memory-bound bytes, saved activations, TP messages) is divided
    by cp; the attention core keeps its length and does 1/cp of the work (``AttentionCore.cp``); the
    parameters stay whole on every rank. Exact for flash attention (its saved bytes are linear in s);
    the caller adds the block's ``ring``."""
    if cp == 1:
        return ops
    if any(g.m % cp for g in ops.gemms):
        raise ValueError(f"cp={cp} does not divide the GEMM rows {[g.m for g in ops.gemms]}")

    def split(messages: tuple[Message, ...]) -> tuple[Message, ...]:
        return tuple(Message(m.kind, m.size_bytes / cp) for m in messages)

    saved = SavedBytes(ops.saved.none / cp, ops.saved.selective / cp, ops.saved.full / cp)
    if ops.ep_fwd or ops.ep_bwd or ops.etp_fwd or ops.etp_bwd or ops.model_flops is not None or ops.dispatch_fwd:
        raise ValueError("shard_sequence: an MoE part is built for the rank's own tokens (cost/moe_ops.py), "
                         "not split afterwards")
    return replace(ops, gemms=tuple(replace(g, m=g.m // cp) for g in ops.gemms),
                   attention=replace(ops.attention, cp=cp) if ops.attention is not None else None,
                   elementwise_bytes=ops.elementwise_bytes / cp, saved=saved, tp_fwd=split(ops.tp_fwd),
                   tp_bwd=split(ops.tp_bwd), ring=ring,
                   eager_bytes=None if ops.eager_bytes is None else (ops.eager_bytes[0] / cp, ops.eager_bytes[1] / cp),
                   saved_tensors=tuple(replace(t, elements=t.elements / cp) for t in ops.saved_tensors),
                   reruns=tuple(replace(r, ops=shard_sequence(r.ops, cp)) for r in ops.reruns))


def fp8_cast_bytes(g: Gemm, e: int) -> tuple[float, float]:
    """Bytes the per-tensor fp8 casts of one GEMM move, (forward, backward), activations of ``e`` bytes.

    Forward: the input cast to fp8 (read e, write 1) and its transposed fp8 copy the weight gradient needs
    (write 1), the weight cast (read 2, write 1); the amax reduction is fused into the cast (Transformer
    Engine's cast-transpose). Backward: the output gradient cast with its transpose (read e, write 2) and the
    transposed weight (read 1, write 1). Weights are re-cast every micro-batch (torchao's dynamic scaling).
    """
    inp, weight, out = g.m * g.k, g.k * g.n, g.m * g.n
    return g.count * ((e + 2) * inp + 3 * weight), g.count * ((e + 2) * out + 2 * weight)


@dataclass(frozen=True)
class LayerCost:
    """One layer (the embedding, one block, or the head) for one micro-batch on one device, after TP."""

    params: float
    """Parameters this device holds for the layer (TP shard, before any ZeRO sharding)."""
    fwd_s: float
    """Forward compute time, TP communication excluded."""
    bwd_s: float
    fwd_flops: float
    """Model FLOPs of the forward on this device (Megatron's count)."""
    saved_bytes: float
    """Activations kept for backward without recomputation."""
    selective_saved_bytes: float
    full_saved_bytes: float
    selective_extra_s: float
    """Backward time added by selective recomputation (rerunning the attention core)."""
    selective_extra_flops: float
    tp_fwd_s: float
    """TP collectives on the critical path of the forward (not overlapped, as in Megatron)."""
    tp_bwd_s: float
    cp_fwd_s: float = 0.0
    """Context parallelism: the ring's exchange not hidden behind the attention kernels, forward."""
    cp_bwd_s: float = 0.0
    host_fwd_s: float = 0.0
    """Of ``fwd_s``, host (framework) time: eager ops, views, DTensor modules (CPU devices)."""
    host_bwd_s: float = 0.0
    param_tensors: int = 0
    """Parameter tensors of the layer (the optimizer's per-tensor host cost)."""
    bwd_weight_s: float = 0.0
    """Of ``bwd_s``, the weight-gradient GEMMs (one per forward GEMM, as long): what a zero-bubble schedule's
    weight backward ``W`` runs; the rest (input gradients, attention, memory-bound ops) is its ``I``."""
    weight_groups: int = 0
    """Operations that consume parameters (each GEMM call, and a block's two norms): torch 2.13's weight
    backward (pipelining/_backward.py ``stage_backward_weight``) runs one autograd pass per such group, and a
    fully recomputed (checkpointed) block reruns its forward in each (measured: 8 reruns of a gpt-tiny block,
    9 of a llama-tiny block, after the one in the input backward). 0 on a stack that does not rerun
    (``StackProfile.weight_backward_reruns``)."""
    tp_param_tensors: int = 0
    """Of those, the ones TP turns into DTensors (all of them are DTensors under FSDP2 / replicate)."""
    expert_params: float = 0.0
    """Of ``params``, the routed experts' this device holds (num_experts / ep experts, each split by etp): their
    gradients are reduced, and ZeRO shards their states, over the experts' own data-parallel group ``edp``
    (ParallelDims.expert_span), not over dp x cp. 0 for a dense layer."""
    ep_fwd_s: float = 0.0
    """MoE: the token dispatch and combine all-to-alls over the EP group (and expert TP's gathers), forward."""
    ep_bwd_s: float = 0.0
    ep_hideable_fwd_s: float = 0.0
    """Of ``ep_fwd_s``, what a stack that overlaps the exchange with the paired micro-batch's kernels
    (``StackProfile.ep_comm_overlap``) hides: that share, up to the backward's kernel time it runs beside.
    Whether the layout allows the overlap is the stage table's to say (cost/stage_table.py)."""
    ep_hideable_bwd_s: float = 0.0
    """Of ``ep_bwd_s``, the same, up to the forward's kernel time."""


@dataclass(frozen=True)
class KernelTimes:
    """A layer's kernel times, the pieces ``layer_cost`` sums (kept apart for reports and tests)."""

    gemm_fwd_s: float
    gemm_bwd_s: float
    attention_fwd_s: float
    attention_bwd_s: float
    elementwise_fwd_s: float
    elementwise_bwd_s: float
    host_fwd_s: float = 0.0
    host_bwd_s: float = 0.0
    gemm_call_fwd_s: tuple[float, ...] = ()
    """Forward time of each GEMM call, in call order (``Gemm.count`` equal calls each)."""


def step_efficiencies(stack: StackProfile, device: DeviceProfile) -> tuple[float, float]:
    """The shares of the kernel-level GEMM and attention speed the stack reaches inside a step: the stack's
    (fitted to published GPU runs) on GPUs; 1 on a CPU, whose calibration (``autoplan calibrate``, the
    host model of cost/cpu_host/) measures whole steps on the host itself."""
    if device.kind != "gpu":
        return 1.0, 1.0
    return stack.gemm_efficiency, stack.attention_efficiency


def kernel_times(ops: LayerOps, cluster: Cluster, training: TrainingSetup, stack: StackProfile) -> KernelTimes:
    device, act = cluster.device, training.activation_precision
    e = 4 if act == "fp32" else 2
    gemm_efficiency, attention_efficiency = step_efficiencies(stack, device)
    gemm_fwd = gemm_bwd = cast_fwd = cast_bwd = 0.0
    calls: list[float] = []
    for g in ops.gemms:
        precision = training.precision if g.fp8 else act
        moved = g.count * (1 if precision == "fp8" else e) * (g.m * g.k + g.k * g.n) + g.count * e * g.m * g.n
        t = matmul_time_s(g.flops, device, precision, calls=g.count, bytes_moved=moved) / gemm_efficiency
        calls += [t / g.count] * g.count
        gemm_fwd += t
        gemm_bwd += BACKWARD_FACTOR * t
        if precision == "fp8":
            fwd, bwd = fp8_cast_bytes(g, e)
            cast_fwd += fwd
            cast_bwd += bwd
    attn_fwd = attn_bwd = 0.0
    if ops.attention is not None:
        attn_fwd, attn_bwd = (x / attention_efficiency for x in _attention_times(ops.attention, cluster, training))
    casts = sum(g.count for g in ops.gemms if g.fp8) if training.precision == "fp8" else 0
    fwd_bytes, bwd_bytes = ops.elementwise_bytes, BACKWARD_MEMORY_FACTOR * ops.elementwise_bytes
    if ops.eager_bytes is not None and stack.elementwise == "eager":
        fwd_bytes, bwd_bytes = ops.eager_bytes
    elem_fwd = memory_time_s(fwd_bytes + cast_fwd, device, ops.elementwise_kernels + 2 * casts)
    accumulate = 0.0 if training.grad_accumulation_fusion else ops.params * (e + 8)
    elem_bwd = memory_time_s(bwd_bytes + cast_bwd + accumulate, device, ops.elementwise_kernels + 2 * casts)
    if ops.ring is not None:  # ring attention's log-sum-exp merges and fp32 gradient accumulation
        elem_fwd += memory_time_s(ops.ring.merge_fwd_bytes, device, ops.ring.merge_fwd_kernels)
        elem_bwd += memory_time_s(ops.ring.merge_bwd_bytes, device, ops.ring.merge_bwd_kernels)
    host = ops.host
    host_fwd = (host.fwd_ops * device.host_op_us + host.fwd_views * device.host_view_op_us) * 1e-6
    host_bwd = (host.bwd_ops * device.host_backward_op_us + host.bwd_views * device.host_backward_view_op_us) * 1e-6
    return KernelTimes(gemm_fwd, gemm_bwd, attn_fwd, attn_bwd, elem_fwd, elem_bwd, host_fwd, host_bwd, tuple(calls))


def _attention_times(core: AttentionCore, cluster: Cluster, training: TrainingSetup) -> tuple[float, float]:
    device, act = cluster.device, training.activation_precision
    if training.attention == "flash":
        # under cp the load-balanced ring runs cp kernels per direction, each on the rank's s/cp queries and
        # executing 1/cp of its causal work: the same causal fraction in total (context_parallel.py)
        executed = FLASH_CAUSAL_FACTOR * core.flops
        return (flash_attention_time_s(executed, core.kernel_seq_len, device, act, "fwd", calls=core.cp,
                                       head_dim=core.head_dim),
                flash_attention_time_s(FLASH_BACKWARD_FLOPS * executed, core.kernel_seq_len, device, act, "bwd",
                                       calls=core.cp, head_dim=core.head_dim))
    e = 4 if act == "fp32" else 2
    scores = core.score_elements
    qkv = e * core.batch * core.heads * core.seq_len * core.head_dim  # q (or k, v, the output) bytes
    # QK^T reads q, k and writes the scores; attention-over-V reads the probabilities and v, writes the output
    gemms = (matmul_time_s(core.flops / 2, device, act, bytes_moved=2 * qkv + e * scores)
             + matmul_time_s(core.flops / 2, device, act, bytes_moved=2 * qkv + e * scores))
    # softmax reads and writes the scores; dropout reads them, writes them and a 1-byte mask
    moved = 2 * e * scores + ((2 * e + 1) * scores if core.dropout else 0)
    fwd = gemms + memory_time_s(moved, device, kernels=2 if core.dropout else 1)
    return fwd, BACKWARD_FACTOR * fwd


def layer_cost(ops: LayerOps, cluster: Cluster, training: TrainingSetup, stack: StackProfile,
               dims: ParallelDims) -> LayerCost:
    """The one builder: ``LayerOps`` -> ``LayerCost`` on ``cluster`` as ``stack`` runs it (TP collectives on
    the link of ``dims``' TP group, the ring of context parallelism on its CP group's)."""
    t = kernel_times(ops, cluster, training, stack)
    tp = dims.tp
    cp_fwd = cp_bwd = 0.0
    if ops.ring is not None and ops.ring.cp > 1:
        link = group_link(cluster, dims.span("cp"))
        cp_fwd, cp_bwd = ring_exposed_s(ops.ring, t.attention_fwd_s, t.attention_bwd_s, link)
    link = group_link(cluster, dims.span("tp"), tensor_parallel=True)

    # fp8 training on a stack that gathers in fp8: the all-gathers before the fp8 linears move 1-byte elements
    fp8_gathers = stack.tp_gather == "fp8" and training.precision == "fp8" and any(g.fp8 for g in ops.gemms)

    def bytes_of(m: Message) -> float:
        return m.size_bytes / 2 if fp8_gathers and m.kind == "all_gather" else m.size_bytes

    def messages_s(messages: tuple[Message, ...]) -> float:
        return sum(collective_time_s(m.kind, bytes_of(m), link) for m in messages) if tp > 1 else 0.0

    # async TP runs that share of the collectives beside the GEMMs, hidden up to the GEMMs' own time
    tp_fwd = messages_s(ops.tp_fwd)
    tp_fwd -= min(stack.tp_comm_overlap * tp_fwd, t.gemm_fwd_s)
    tp_bwd = messages_s(ops.tp_bwd)
    tp_bwd -= min(stack.tp_comm_overlap * tp_bwd, t.gemm_bwd_s)
    device = cluster.device
    ep_fwd, ep_bwd = expert_comm_s(ops, cluster, dims)
    tp_host_fwd = ops.host.tp_modules * device.tp_module_fwd_us * 1e-6 if tp > 1 else 0.0
    tp_host_bwd = ops.host.tp_modules * device.tp_module_bwd_us * 1e-6 if tp > 1 else 0.0
    gemm_flops = [g.flops / g.count for g in ops.gemms for _ in range(g.count)]
    e = 4 if training.activation_precision == "fp32" else 2
    fp8_kept = frozenset(stack.fp8_saved) if training.precision == "fp8" else frozenset()
    by_tensor = bool(ops.saved_tensors) and (bool(fp8_kept) or stack.selective_recompute == "modules")
    saved_none = saved_bytes_of(ops.saved_tensors, e, fp8_kept) if by_tensor else ops.saved.none
    if stack.selective_recompute == "modules":
        # Megatron's recompute_modules: each drops its tensors and reruns its forward in the block's backward
        reruns = [r.ops for r in ops.reruns if r.module in stack.recompute_modules]
        selective_extra = sum(rerun_s(r, cluster, training, stack, dims) for r in reruns)
        selective_flops = sum(sum(g.flops for g in r.gemms) + (r.attention.flops if r.attention else 0.0)
                              for r in reruns)
        selective_saved = (saved_bytes_of(ops.saved_tensors, e, fp8_kept, stack.recompute_modules)
                           if ops.saved_tensors else saved_none)
    elif stack.selective_recompute == "every_other_matmul" and ops.attention is not None:
        # torchtitan's op-level selective checkpointing: the odd matmuls' outputs and the attention kernel's
        # are kept, everything else reruns (the even matmuls, every memory-bound op, the host work, the TP
        # collectives but the reduce-scatters, which it keeps too)
        even = range(1, len(gemm_flops), 2)
        selective_extra = (sum(t.gemm_call_fwd_s[i] for i in even) + t.elementwise_fwd_s + t.host_fwd_s + tp_host_fwd
                           + messages_s(tuple(m for m in ops.tp_fwd if m.kind != "reduce_scatter")))
        selective_flops = sum(gemm_flops[i] for i in even)
        selective_saved = _every_other_matmul_saved(ops, training)
    else:  # the attention core reruns; under flash attention there is nothing to drop
        standard = ops.attention is not None and training.attention == "standard"
        selective_extra = t.attention_fwd_s if standard else 0.0
        selective_flops = ops.attention.flops if standard else 0.0
        selective_saved = saved_none - (ops.saved.none - ops.saved.selective)
    return LayerCost(
        params=ops.params,
        fwd_s=t.gemm_fwd_s + t.attention_fwd_s + t.elementwise_fwd_s + t.host_fwd_s + tp_host_fwd,
        bwd_s=t.gemm_bwd_s + t.attention_bwd_s + t.elementwise_bwd_s + t.host_bwd_s + tp_host_bwd,
        fwd_flops=(ops.model_flops if ops.model_flops is not None
                   else sum(g.flops for g in ops.gemms) + (ops.attention.flops if ops.attention else 0.0)),
        saved_bytes=saved_none, selective_saved_bytes=selective_saved, full_saved_bytes=ops.saved.full,
        selective_extra_s=selective_extra, selective_extra_flops=selective_flops,
        tp_fwd_s=tp_fwd, tp_bwd_s=tp_bwd, cp_fwd_s=cp_fwd, cp_bwd_s=cp_bwd,
        host_fwd_s=t.host_fwd_s + tp_host_fwd, host_bwd_s=t.host_bwd_s + tp_host_bwd,
        param_tensors=ops.host.param_tensors, tp_param_tensors=ops.host.tp_param_tensors if tp > 1 else 0,
        bwd_weight_s=t.gemm_bwd_s / BACKWARD_FACTOR,
        weight_groups=(sum(1 if g.grouped else g.count for g in ops.gemms) + (2 if ops.attention is not None else 0)
                       if stack.weight_backward_reruns else 0),
        expert_params=ops.expert_params, ep_fwd_s=ep_fwd, ep_bwd_s=ep_bwd,
        # the paired micro-batch's kernels (host work excluded) are what the exchange runs beside
        ep_hideable_fwd_s=min(stack.ep_comm_overlap * ep_fwd, t.gemm_bwd_s + t.attention_bwd_s + t.elementwise_bwd_s),
        ep_hideable_bwd_s=min(stack.ep_comm_overlap * ep_bwd, t.gemm_fwd_s + t.attention_fwd_s + t.elementwise_fwd_s),
    )


def expert_comm_s(ops: LayerOps, cluster: Cluster, dims: ParallelDims) -> tuple[float, float]:
    """(forward, backward) seconds of an MoE layer's token exchange: the all-to-alls on the EP group's link
    (or a deduplicating dispatcher's exchanges on the group's nodes, ``routed_exchange_s``) and, under expert
    TP, the dispatcher's all-gather / reduce-scatter on the etp group's (each on the link its span crosses:
    ``ParallelDims.expert_span``). What a stack hides of them beside the paired micro-batch's kernels
    (Megatron-Core's ``--overlap-moe-expert-parallel-comm``) is ``layer_cost``'s ``ep_hideable_*_s``."""
    def on(group: str, size: int, messages: tuple[Message, ...]) -> float:
        if size <= 1 or not messages:
            return 0.0
        link = group_link(cluster, dims.expert_span(group))
        return sum(collective_time_s(m.kind, m.size_bytes, link) for m in messages)

    def routed(exchanges: tuple[RoutedExchange, ...]) -> float:
        return sum(routed_exchange_s(x, cluster, dims) for x in exchanges) if dims.ep > 1 else 0.0

    return (on("ep", dims.ep, ops.ep_fwd) + routed(ops.dispatch_fwd) + on("etp", dims.etp, ops.etp_fwd),
            on("ep", dims.ep, ops.ep_bwd) + routed(ops.dispatch_bwd) + on("etp", dims.etp, ops.etp_bwd))


def routed_exchange_s(x: RoutedExchange, cluster: Cluster, dims: ParallelDims) -> float:
    """One dispatch or combine of a node-deduplicating dispatcher over the EP group as it lies on the nodes
    (``ParallelDims.expert_span``): each token crosses the network once per remote node holding one of its
    experts and NVLink once per other rank holding one (``routed_copies``, expected under balanced routing);
    both paths at once, the slower sets the time (``hierarchical_exchange_s``)."""
    span = dims.expert_span("ep")
    per_node = span.size if span.fits_in_node(cluster.devices_per_node) \
        else span.members_per_node(cluster.devices_per_node)
    node_limit = x.group_topk if x.groups and span.size == x.groups * per_node else None  # a group per node
    remote_nodes, remote_ranks = routed_copies(x.experts, x.k, span.size, per_node, node_limit)
    return hierarchical_exchange_s(cluster, x.rows * x.row_bytes * remote_nodes, x.rows * x.row_bytes * remote_ranks,
                                   span.size)


def rerun_s(ops: LayerOps, cluster: Cluster, training: TrainingSetup, stack: StackProfile,
            dims: ParallelDims) -> float:
    """Seconds a recompute module's forward (``ModuleRerun.ops``) takes again in backward: its kernels, its TP
    collectives (less what the stack's TP overlap hides behind its GEMMs) and its expert exchange."""
    t = kernel_times(ops, cluster, training, stack)
    tp = 0.0
    if dims.tp > 1 and ops.tp_fwd:
        link = group_link(cluster, dims.span("tp"), tensor_parallel=True)
        tp = sum(collective_time_s(m.kind, m.size_bytes, link) for m in ops.tp_fwd)
        tp -= min(stack.tp_comm_overlap * tp, t.gemm_fwd_s)
    return t.gemm_fwd_s + t.attention_fwd_s + t.elementwise_fwd_s + t.host_fwd_s + tp + expert_comm_s(ops, cluster,
                                                                                                      dims)[0]


def saved_bytes_of(tensors: tuple[SavedTensor, ...], e: int, fp8: frozenset[str],
                   dropped: tuple[str, ...] = ()) -> float:
    """Bytes ``tensors`` keep with activations of ``e`` bytes, the saved-fp8 choices ``fp8`` in force, those a
    module in ``dropped`` discards left out."""
    return sum(t.bytes(e, fp8) for t in tensors if not set(t.modules) & set(dropped))


def _every_other_matmul_saved(ops: LayerOps, training: TrainingSetup) -> float:
    """Bytes a block keeps under op-level selective checkpointing: its input (what full recomputation keeps),
    the outputs of its odd matmuls (1st, 3rd, ... in call order), the attention kernel's output and its
    fp32 log-sum-exp."""
    e = 4 if training.activation_precision == "fp32" else 2
    outputs = [e * g.m * g.n for g in ops.gemms for _ in range(g.count)]
    core = ops.attention
    rows = core.batch * core.heads * core.kernel_seq_len  # this rank's query rows, all local heads
    return ops.saved.full + sum(outputs[0::2]) + e * rows * (core.v_head_dim or core.head_dim) + 4.0 * rows
