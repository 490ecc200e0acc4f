"""Per-layer costs for one micro-batch on one device: the single input the pipeline cost model reads.

Two sources produce a ``Workload``: ``analytic_workload`` below, from a ModelSpec and the formulas in
flops.py / activations.py / compute.py / comm.py; and the profiler's adapter, from a measured model
profile (``autoplan profile``), which fills the same fields from traced FLOPs, measured saved bytes and
measured forward/backward times. Everything downstream (memory, pipeline simulation, search) sees only
``Workload``, so a profiled model is planned exactly like a built-in one.

The planner treats the transformer blocks as identical (one ``block`` cost): stage boundaries and
recomputation counts are then all that distinguishes stages.
"""

from __future__ import annotations

from dataclasses import dataclass

from autoplan.cost import activations as act
from autoplan.cost.comm import collective_time_s, group_link
from autoplan.cost.compute import matmul_time_s, memory_time_s
from autoplan.cost.flops import block_fwd_flops, logits_fwd_flops
from autoplan.schema import Cluster, DeviceProfile, ModelSpec, TrainingSetup

# Backward runs two GEMMs (input and weight gradient) per forward GEMM: "backward = 2 x forward".
BACKWARD_FACTOR = 2.0
# FlashAttention skips the blocks above the causal diagonal, so it executes about half the score FLOPs
# that Megatron's count (and MFU) includes; standard attention computes all of them.
FLASH_CAUSAL_FACTOR = 0.5


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

    @property
    def full_extra_s(self) -> float:
        """Full recomputation reruns the whole forward, its TP collectives included."""
        return self.fwd_s + self.tp_fwd_s


@dataclass(frozen=True)
class Workload:
    micro_batch_size: int
    seq_len: int
    tp: int
    sequence_parallel: bool
    num_layers: int
    embedding: LayerCost
    block: LayerCost
    head: LayerCost
    tied_copy_params: float
    """Parameters the last stage holds in addition when a tied embedding is split from its head (pp > 1)."""
    output_bytes: float
    """Activation bytes a stage sends to the next, per micro-batch."""
    logits_transient_bytes: float
    """Peak working memory of the loss on the last stage (logits and their gradient)."""


def analytic_workload(model: ModelSpec, cluster: Cluster, training: TrainingSetup, micro_batch_size: int,
                      tp: int, sp: bool) -> Workload:
    b, s = micro_batch_size, training.seq_len
    mixed = training.mixed_precision
    e = act.elem_bytes(mixed)
    tp_link = group_link(cluster, tp, 1)
    hidden_bytes = e * b * s * model.hidden_size

    def one(kind: str) -> float:
        return collective_time_s(kind, hidden_bytes, tp_link) if tp > 1 else 0.0

    # two per block (after attention, after the MLP): an all-reduce, or under SP an all-gather before and a
    # reduce-scatter after each
    block_comm_s = 2 * (one("all_gather") + one("reduce_scatter") if sp else one("all_reduce"))
    block = _block_cost(model, cluster, training, b, s, tp, sp, block_comm_s)
    # vocab-parallel embedding: partial sums combined by an all-reduce (a reduce-scatter under SP)
    embedding = _embedding_cost(model, cluster, training, b, s, tp, sp, one("reduce_scatter" if sp else "all_reduce"))
    # column-parallel head: under SP its input is all-gathered in forward and reduce-scattered in backward;
    # without SP the forward needs nothing and the backward all-reduces the input gradient
    head = _head_cost(model, cluster, training, b, s, tp, sp, one("all_gather") if sp else 0.0,
                      one("reduce_scatter" if sp else "all_reduce"))
    return Workload(
        micro_batch_size=b, seq_len=s, tp=tp, sequence_parallel=sp, num_layers=model.num_layers,
        embedding=embedding, block=block, head=head,
        tied_copy_params=model.vocab_size * model.hidden_size / tp if model.tie_embeddings else 0.0,
        output_bytes=act.stage_output_bytes(model, b, s, tp, sp, mixed),
        logits_transient_bytes=act.logits_transient_bytes(model, b, s, tp, mixed),
    )


def _block_cost(model: ModelSpec, cluster: Cluster, training: TrainingSetup, b: int, s: int, tp: int, sp: bool,
                tp_comm_s: float) -> LayerCost:
    device, precision = cluster.device, training.precision
    flops = block_fwd_flops(model, b, s)
    gemms = [flops.qkv / tp, flops.out_proj / tp] + [flops.mlp / model.mlp_matrices / tp] * model.mlp_matrices
    gemm_s = sum(matmul_time_s(g, device, precision) for g in gemms)
    core_fwd_s = _attention_core_s(model, training, device, b, s, tp)
    elementwise_s = memory_time_s(_block_elementwise_bytes(model, training, b, s, tp, sp), device, kernels=10)
    saved = act.block_saved_bytes(model, b, s, tp, sp, training.mixed_precision, training.flash_attention)
    fwd_s = gemm_s + core_fwd_s + elementwise_s
    # norm weights (and, for gpt, the biases of the row-parallel o and fc2, added after their all-reduce)
    # stay whole on every TP rank; everything else is split
    replicated = 2 * model.hidden_size if model.architecture == "llama" else 6 * model.hidden_size
    return LayerCost(
        params=(model.layer_params() - replicated) / tp + replicated,
        fwd_s=fwd_s,
        bwd_s=BACKWARD_FACTOR * fwd_s,
        fwd_flops=flops.total / tp,
        saved_bytes=saved.none, selective_saved_bytes=saved.selective, full_saved_bytes=saved.full,
        selective_extra_s=core_fwd_s,
        selective_extra_flops=flops.attn_core / tp,
        tp_fwd_s=tp_comm_s, tp_bwd_s=tp_comm_s,
    )


def _attention_core_s(model: ModelSpec, training: TrainingSetup, device: DeviceProfile, b: int, s: int, tp: int) -> float:
    """Scores, softmax, dropout and attention-over-V: one fused kernel with flash attention, else two
    batched matmuls around memory-bound softmax (and dropout) kernels over the a x s x s score tensor."""
    core_flops = block_fwd_flops(model, b, s).attn_core / tp
    if training.flash_attention:
        return matmul_time_s(core_flops * FLASH_CAUSAL_FACTOR, device, training.precision)
    e = act.elem_bytes(training.mixed_precision)
    scores = model.num_attention_heads * s * s * b / tp
    moved = 2 * e * scores + ((2 * e + 1) * scores if model.dropout > 0 else 0)  # softmax r/w; dropout r/w/mask
    return (2 * matmul_time_s(core_flops / 2, device, training.precision)
            + memory_time_s(moved, device, kernels=2 if model.dropout > 0 else 1))


def _block_elementwise_bytes(model: ModelSpec, training: TrainingSetup, b: int, s: int, tp: int, sp: bool) -> float:
    """Bytes read + written by a block's memory-bound kernels in the forward (matmul epilogues excluded).

    Norms and residual adds run on the full hidden states on every TP rank unless sequence parallel
    splits them; the MLP activation and RoPE run on the TP shard.
    """
    e = act.elem_bytes(training.mixed_precision)
    sbh, sbf = b * s * model.hidden_size, b * s * model.ffn_hidden_size
    replicated = 2 * (2 * e * sbh) + 2 * (3 * e * sbh)  # two norms (read, write); two residual adds (2 reads, write)
    if model.dropout > 0:
        replicated += 2 * (2 * e + 1) * sbh  # two residual dropouts: read, write, 1-byte mask
    if model.architecture == "llama":
        split = 5 * e * sbf + 2 * e * b * s * (model.hidden_size + model.kv_size)  # SwiGLU; RoPE on q and k
    else:
        split = 2 * e * sbf  # GELU
    return replicated / (tp if sp else 1) + split / tp


def _embedding_cost(model: ModelSpec, cluster: Cluster, training: TrainingSetup, b: int, s: int, tp: int,
                    sp: bool, tp_comm_s: float) -> LayerCost:
    e = act.elem_bytes(training.mixed_precision)
    sbh = b * s * model.hidden_size
    # lookup writes the hidden states; learned positions add a read-read-write pass
    moved = e * sbh * (3 if model.architecture == "gpt" else 1)
    fwd_s = memory_time_s(moved, cluster.device, kernels=2)
    saved = act.embedding_saved_bytes(model, b, s, tp, sp)
    return LayerCost(params=model.embedding_params() / tp, fwd_s=fwd_s, bwd_s=BACKWARD_FACTOR * fwd_s,
                     fwd_flops=0.0, saved_bytes=saved, selective_saved_bytes=saved, full_saved_bytes=saved,
                     selective_extra_s=0.0, selective_extra_flops=0.0, tp_fwd_s=tp_comm_s, tp_bwd_s=0.0)


def _head_cost(model: ModelSpec, cluster: Cluster, training: TrainingSetup, b: int, s: int, tp: int, sp: bool,
               tp_fwd_s: float, tp_bwd_s: float) -> LayerCost:
    device, e = cluster.device, act.elem_bytes(training.mixed_precision)
    logits = logits_fwd_flops(model, b, s) / tp
    sbv = b * s * model.vocab_size / tp
    norm_bytes = 2 * e * b * s * model.hidden_size / (tp if sp else 1)
    # cross-entropy: read the logits, write the fp32 log-softmax, read it back for the loss
    fwd_s = matmul_time_s(logits, device, training.precision) + memory_time_s(norm_bytes + (e + 8) * sbv, device, 3)
    saved = act.head_saved_bytes(model, b, s, tp, sp, training.mixed_precision)
    norm_params = 2 * model.hidden_size if model.architecture == "gpt" else model.hidden_size
    projection = 0.0 if model.tie_embeddings else model.vocab_size * model.hidden_size / tp
    return LayerCost(params=norm_params + projection, fwd_s=fwd_s, bwd_s=BACKWARD_FACTOR * fwd_s,
                     fwd_flops=logits, saved_bytes=saved, selective_saved_bytes=saved, full_saved_bytes=saved,
                     selective_extra_s=0.0, selective_extra_flops=0.0, tp_fwd_s=tp_fwd_s, tp_bwd_s=tp_bwd_s)
