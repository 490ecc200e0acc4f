"""The analytic description of a ModelSpec's layers: ``LayerOps`` from the published formulas.

GEMM shapes follow the Megatron layout (column-parallel q/k/v and fc1 (gate/up), row-parallel o and fc2
(down), vocabulary-parallel embedding and head); FLOPs are flops.py's, saved bytes activations.py's
(Korthikanti et al. 2022). The memory-bound bytes assume the element-wise ops between two GEMMs run as one
fused kernel that reads its inputs once and writes its outputs once (what Megatron-LM's fused kernels and
torch.compile do), per block with activations of e bytes, H = e s b h, F = e s b ffn / t and, for the
tensors every TP rank holds in full, r = 1/t under sequence parallelism and 1 otherwise:

    norm before attention        reads x, writes its output                     2 H r
    RoPE on q and k (llama)      reads and writes q and k                       2 e s b (h + kv) / t
    residual + norm before MLP   reads the attention output and x, writes both  4 H r
    MLP activation               GELU: reads and writes F; SwiGLU: reads 2 F    2 F / 3 F
    residual after the MLP       reads the MLP output and the residual, writes  3 H r
    residual dropouts            a 1-byte mask each, written                    s b h r each

Mixture-of-Experts blocks, multi-head latent attention and the multi-token-prediction modules are built by
cost/moe_ops.py from parts (attention, dense SwiGLU, router and routed experts, shared experts) that add up;
a dense block of such a model with GQA is this module's ``block_ops`` itself. cost/spec_workload.py
``analytic_workload`` gives an MoE model's MoE block as ``block``, its leading dense block as ``dense_block``
and folds the MTP modules into the head; interleaved dense and MoE blocks (``moe.layer_frequency`` > 1) are
refused.

Context parallelism (cp > 1, flash attention only): every layer is built for the whole sequence and then
split by ``layer_ops.shard_sequence`` (token-linear quantities / cp, the attention core's 1/cp share); a
block adds its ring attention's K/V exchange and merges (cost/context_parallel.py).

The embedding gathers its rows (and adds the learned positions for gpt); the head normalises, projects
and runs the cross-entropy over the padded vocabulary (read the logits, write the fp32 log-softmax, read it
back for the loss). Vocabulary-parallel cross-entropy all-reduces three per-token values (max, sum of
exponentials, target logit; Megatron's ``_VocabParallelCrossEntropy``). What the vocabulary adds to a
layer (its table, the lookup's and the loss's collectives, the projection GEMM, the logits) is built once,
by ``embedding_of_vocabulary`` and ``head_of_vocabulary``, for a spec here and for a traced profile
(cost/profile_ops.py), so both are priced the same; each source gives only the layer's own work (the
``EdgeWork``: positions, norms, dropout).

Backward TP all-reduces without SP follow the stack (schema/stack.py ``tp_input_grad_reduce``): Megatron
all-reduces the input gradient once per column -> row pair (fused QKV); this project's runtime
parallelises q, k, v (and the MLP's input matrices) as separate ``ColwiseParallel`` modules
(runtime/parallel/tensor_parallel.py), and DTensor all-reduces the input gradient of each at its module
boundary: 3 + 1 (gpt) or 3 + 2 (llama) per block. A torch profiler trace of a tp4 gpt-tiny step on gloo
shows 53 DTensor all-reduces, as this count gives.

Host work (``HostOps``, priced only where the device has host fields, i.e. on a CPU): the eager ops of
the runtime's reference layers (runtime/models/gpt.py, llama.py) as ``TorchDispatchMode`` counts them,
per forward and backward of one micro-batch, in ``HOST_OP_COUNTS``; they do not depend on the shapes.
tests/profiler/test_eager_bytes.py recounts them on the runtime's layers. Dropout > 0 adds mask ops and runs
the attention core once per (row, head) (runtime/models/dropout.py): not counted here, so the host time
of a model with dropout is underestimated; so are Qwen3's per-head q/k norms (six eager ops each forward,
counted in neither table; their bytes are in the fused count) and Qwen2's bias adds (fused into the GEMMs).
TP-parallelised modules per layer: q, k, v, o and the MLP's matrices of a block, the vocabulary-parallel
embedding, the head.

Eager bytes (``EAGER_ELEMENTS``, priced instead of the fused bytes on an eager stack, schema/stack.py
``elementwise``): what every eager op of the runtime's layer reads and writes, forward and
backward, in elements per token of the residual stream (per h, split by SP), the attention heads (per h
and per kv width, split by TP), the MLP's activations (per ffn width, split by TP) and the logits (per
padded vocabulary, split by TP); counted by autoplan.profiler.hardware.eager_bytes at dropout 0 and
recounted at other shapes by tests/profiler/test_eager_bytes.py. Eager traffic is 2-5x the fused count:
RMSNorm alone is six kernels forward (pow, mean, add, rsqrt, two muls), RoPE eight.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from autoplan.cost import activations as act
from autoplan.cost.activations import SavedBytes, elem_bytes
from autoplan.cost.context_parallel import ring_exchange
from autoplan.cost.flops import attended_keys
from autoplan.cost.layer_ops import (
    AttentionCore, Gemm, HostOps, LayerOps, Message, ModuleRerun, SavedTensor, lists_tensors, shard_sequence,
)
from autoplan.cost.workload import LayerSplit
from autoplan.schema import ModelSpec, StackProfile, TrainingSetup

# (forward compute ops, forward views, backward compute ops, backward views) per layer and architecture,
# dropout 0, counted by autoplan.profiler.hardware.op_count on the runtime's layers (the head includes the
# loss: log-softmax and NLL, and its backward the loss's unit gradient; a tied head adds its gradient into
# the embedding's; the other layers' backward starts from the gradient the next layer hands them)
HOST_OP_COUNTS: dict[tuple[str, str], tuple[int, int, int, int]] = {
    ("gpt", "embedding"): (4, 0, 3, 3),
    ("gpt", "block"): (5, 27, 13, 68),
    ("gpt", "head"): (4, 5, 6, 10),
    ("llama", "embedding"): (1, 0, 1, 1),
    ("llama", "block"): (39, 34, 60, 71),
    ("llama", "head"): (9, 6, 18, 13),
}


# (forward, backward) elements per token moved by the eager ops of a layer, by what they scale with:
# (hidden, q, kv, ffn, vocab); printed by `python -m autoplan.profiler.hardware.eager_bytes`
EAGER_ELEMENTS: dict[tuple[str, str], tuple[tuple[float, ...], tuple[float, ...]]] = {
    ("gpt", "embedding"): ((3.0, 0.0, 0.0, 0.0, 0.0), (2.0, 0.0, 0.0, 0.0, 0.0)),
    ("gpt", "block"): ((10.0, 0.0, 0.0, 2.0, 0.0), (23.0, 0.0, 0.0, 4.0, 0.0)),
    ("gpt", "head"): ((2.0, 0.0, 0.0, 0.0, 3.0), (3.0, 0.0, 0.0, 0.0, 5.0)),
    ("llama", "embedding"): ((1.0, 0.0, 0.0, 0.0, 0.0), (1.0, 0.0, 0.0, 0.0, 0.0)),
    ("llama", "block"): ((20.0, 11.0, 9.0, 5.0, 0.0), (63.0, 16.0, 16.0, 9.0, 0.0)),
    ("llama", "head"): ((7.0, 0.0, 0.0, 0.0, 3.0), (24.0, 0.0, 0.0, 0.0, 5.0)),
}


# The loss the runtime computes on the head's logits (runtime/build.py ``cross_entropy``: log-softmax and NLL
# in fp32), counted alone the same two ways: (forward ops, forward views, backward ops, backward views), and
# the elements per token and padded vocabulary row its ops move (forward, backward). Part of every head's
# count above; ``head_of_vocabulary`` adds it to a head whatever describes the rest (tests recount it).
LOSS_HOST_OPS = (2, 3, 3, 3)
LOSS_EAGER_ELEMENTS = (3.0, 5.0)


def eager_bytes(model: ModelSpec, layer: str, split: LayerSplit, training: TrainingSetup) -> tuple[float, float]:
    """(forward, backward) bytes the runtime's eager ops of ``layer`` move for one micro-batch of the whole
    sequence on one device (module doc): the residual stream is split by SP, the heads, MLP and logits by TP."""
    tp, e = split.tp, elem_bytes(training.activation_precision)
    tokens = split.micro_batch_size * training.seq_len
    widths = (model.hidden_size / split.hidden_shards, model.q_size / tp, model.kv_size / tp,
              model.ffn_hidden_size / tp, model.padded_vocab_size(tp) / tp)
    return tuple(e * tokens * sum(c * w for c, w in zip(counts, widths))
                 for counts in EAGER_ELEMENTS[(model.architecture, layer)])


def host_ops(model: ModelSpec, layer: str) -> HostOps:
    """The host-op counts, parallelised modules and parameter tensors of one layer of ``model``."""
    fwd_ops, fwd_views, bwd_ops, bwd_views = HOST_OP_COUNTS[(model.architecture, layer)]
    gpt = model.architecture == "gpt"
    if layer == "block":
        linears = 4 + model.mlp_matrices
        biases = 3 if model.qkv_bias else 0  # Qwen2's q/k/v biases, split with their weights
        norms = 2 if model.qk_norm else 0  # Qwen3's q/k norm weights, whole on every TP rank
        # gpt: weights and biases, two LayerNorms (w, b); llama: weights, two RMSNorms
        tensors = 2 * linears + 4 if gpt else linears + 2 + biases + norms
        tp_tensors = 2 * linears if gpt else linears + biases
        return HostOps(fwd_ops, fwd_views, bwd_ops, bwd_views, linears, tensors, tp_tensors)
    if layer == "embedding":
        return HostOps(fwd_ops, fwd_views, bwd_ops, bwd_views, 1, 2 if gpt else 1, 1)
    norm = 2 if gpt else 1
    projection = 0 if model.tie_embeddings else 1
    return HostOps(fwd_ops, fwd_views, bwd_ops, bwd_views, 1, norm + projection, projection)


def block_ops(model: ModelSpec, split: LayerSplit, training: TrainingSetup, stack: StackProfile) -> LayerOps:
    """One block on one device; under ``split.cp`` the device holds seq_len / cp of every sequence."""
    if split.cp > 1:
        if training.attention != "flash":
            raise ValueError("context parallelism runs ring attention on flash kernels (plan.py refuses standard)")
        ops = block_ops(model, replace(split, cp=1), training, stack)
        e = elem_bytes(training.activation_precision)
        local = split.micro_batch_size * training.seq_len // split.cp  # this rank's tokens
        ring = ring_exchange(split.cp, local * model.q_size / split.tp, 2 * local * model.kv_size / split.tp, e)
        return shard_sequence(ops, split.cp, ring)
    tp, e = split.tp, elem_bytes(training.activation_precision)
    h, f, q, kv = model.hidden_size, model.ffn_hidden_size, model.q_size, model.kv_size
    tokens = split.micro_batch_size * training.seq_len
    mlp_in = [Gemm(tokens, f // tp, h, count=model.mlp_matrices - 1)]  # fc1, or gate and up
    # q, then k and v, then o (q/tp input features onto h; written with n and k swapped, same FLOPs, as the
    # pinned predictions were computed)
    gemms = (Gemm(tokens, q // tp, h), Gemm(tokens, kv // tp, h, count=2), Gemm(tokens, q // tp, h),
             *mlp_in, Gemm(tokens, h, f // tp))
    r = 1 / split.hidden_shards
    hidden, ffn = e * tokens * h, e * tokens * f / tp
    elementwise = (2 + 4 + 3) * hidden * r + (3 if model.mlp_matrices == 3 else 2) * ffn
    kernels = 4
    if model.architecture == "llama":
        elementwise += 2 * e * tokens * (q + kv) / tp
        kernels += 1
    if model.qk_norm:  # Qwen3's per-head norms: read and write q and k once more
        elementwise += 2 * e * tokens * (q + kv) / tp
        kernels += 1
    if model.dropout > 0:
        elementwise += 2 * tokens * h * r
    fwd, bwd = block_tp_messages(hidden, split.sequence_parallel, splits=2)
    if stack.tp_input_grad_reduce == "per_module" and not split.sequence_parallel:
        bwd = (Message("all_reduce", hidden),) * (3 + model.mlp_matrices - 1)  # q, k, v; fc1, or gate and up
    # norm weights (Qwen3's per-head q/k norms too; for gpt, the biases of the row-parallel o and fc2,
    # added after their all-reduce) stay whole on every TP rank; everything else is split
    replicated = 2 * h + (2 * model.head_dim if model.qk_norm else 0) if model.architecture == "llama" else 6 * h
    core = AttentionCore(split.micro_batch_size, model.num_attention_heads / tp, training.seq_len, model.head_dim,
                         model.dropout > 0, keys=attended_keys(model, training.seq_len))
    tensors, reruns = (), ()
    if lists_tensors(stack):
        mlp_elementwise = (3 if model.mlp_matrices == 3 else 2) * ffn + 2 * hidden * r  # with its fused norm
        mlp = LayerOps(params=0.0, gemms=gemms[-2:], attention=None, elementwise_bytes=mlp_elementwise,
                       elementwise_kernels=2, saved=act.SavedBytes(0.0, 0.0, 0.0),
                       tp_fwd=block_tp_messages(hidden, split.sequence_parallel, splits=1)[0])
        attention_only = LayerOps(params=0.0, gemms=(), attention=core, elementwise_bytes=0.0, elementwise_kernels=0,
                                  saved=act.SavedBytes(0.0, 0.0, 0.0))
        tensors = block_tensors(model, split, training)
        reruns = (ModuleRerun("core_attn", attention_only), ModuleRerun("mlp", mlp))
    return LayerOps(params=(model.layer_params() - replicated) / tp + replicated, gemms=gemms, attention=core,
                    elementwise_bytes=elementwise, elementwise_kernels=kernels,
                    saved=act.block_saved_bytes(model, split, training), tp_fwd=fwd, tp_bwd=bwd,
                    host=host_ops(model, "block"), eager_bytes=eager_bytes(model, "block", split, training),
                    saved_tensors=tensors, reruns=reruns)


def block_tensors(model: ModelSpec, split: LayerSplit, training: TrainingSetup) -> tuple[SavedTensor, ...]:
    """activations.py's ``block_saved_bytes`` tensor by tensor, with what keeps each as Megatron-Core with
    Transformer Engine runs a dense block (gpt_layer_specs.py): the norms fused into the QKV and first MLP GEMMs
    (TELayerNormColumnParallelLinear), which keep their outputs; q, k, v and the attention output kept by the
    attention kernel (the output projection keeps the same output: set_save_original_input); the MLP's tensors
    and its norm's output dropped by Megatron's ``mlp`` module, the attention kernel's by ``core_attn``."""
    b, s, tp = split.micro_batch_size, training.seq_len, split.tp
    h, f, q, kv, a = model.hidden_size, model.ffn_hidden_size, model.q_size, model.kv_size, model.num_attention_heads
    sbh = s * b * h / split.hidden_shards
    mlp, ffn = ("mlp",), s * b * f / tp
    if model.architecture == "llama":  # gate and up (the SwiGLU's input), silu(gate), their product (fc2's input)
        activation = (SavedTensor(2 * ffn, role="swiglu_inputs", modules=mlp), SavedTensor(ffn, modules=mlp),
                      SavedTensor(ffn, kept_whole=False, fp8_gemms=1, modules=mlp))
    else:  # fc1's output (GELU's input) and GELU's output (fc2's input)
        activation = (SavedTensor(ffn, modules=mlp), SavedTensor(ffn, kept_whole=False, fp8_gemms=1, modules=mlp))
    masks = (SavedTensor(2 * sbh, element_bytes=1.0),) if model.dropout > 0 else ()
    qk_norms = (SavedTensor(s * b * (q + kv) / tp),) if model.qk_norm else ()
    if training.attention == "flash":
        core = (SavedTensor(a * s * b / tp, element_bytes=4.0, modules=("core_attn",)),)
    else:
        scores = a * s * s * b / tp
        dropout = model.dropout > 0
        core = ((SavedTensor((2 if dropout else 1) * scores, modules=("core_attn",)),)
                + ((SavedTensor(scores, element_bytes=1.0, modules=("core_attn",)),) if dropout else ()))
    return (SavedTensor(2 * sbh), SavedTensor(sbh, kept_whole=False, fp8_gemms=1),
            SavedTensor(sbh, kept_whole=False, fp8_gemms=1, modules=mlp), *masks,
            SavedTensor(s * b * (q + 2 * kv) / tp), SavedTensor(s * b * q / tp, role="attention_output"),
            *activation, *qk_norms, *core)


def block_tp_messages(hidden_bytes: float, sp: bool, splits: int) -> tuple[tuple[Message, ...], tuple[Message, ...]]:
    """TP collectives of a block with ``splits`` column -> row parallel pairs (2: attention and MLP).

    Without SP: one all-reduce after each pair, forward and backward. Under SP: an all-gather before and a
    reduce-scatter after each pair, and in backward the reverse, plus the all-gather repeated for the weight
    gradient of the column-parallel linear: SP keeps that linear's input sharded along the sequence (which
    is what Korthikanti et al. 2022 Eq. 4 and 6 count as saved) and gathers it again in backward (their
    section 4.2.2).
    """
    if not sp:
        return (Message("all_reduce", hidden_bytes),) * splits, (Message("all_reduce", hidden_bytes),) * splits
    forward = (Message("all_gather", hidden_bytes), Message("reduce_scatter", hidden_bytes)) * splits
    backward = (Message("all_gather", hidden_bytes), Message("reduce_scatter", hidden_bytes),
                Message("all_gather", hidden_bytes)) * splits
    return forward, backward


@dataclass(frozen=True)
class EdgeWork:
    """What a source knows of the embedding's or the head's own work besides the vocabulary (positions,
    norms, dropout), for one micro-batch of the whole sequence on one device."""

    params: float
    """Parameters besides the vocabulary table and the output projection (learned positions, norms)."""
    elementwise_bytes: float
    """Forward bytes of the layer's own memory-bound ops (the lookup's gather included, the loss excluded)."""
    kernels: int
    saved_bytes: float
    """Bytes the layer keeps for backward besides the loss's log-softmax."""
    gemms: tuple[Gemm, ...] = ()
    """GEMMs besides the output projection."""
    host: HostOps = HostOps()
    eager_bytes: tuple[float, float] | None = None


# the loss's own kernels on the head: the log-softmax and the NLL
LOSS_KERNELS = 2


def embedding_of_vocabulary(rows: int, hidden_size: int, own: EdgeWork, split: LayerSplit,
                            training: TrainingSetup) -> LayerOps:
    """The embedding: its own work and a vocabulary-parallel table of ``rows`` (padded) x ``hidden_size``,
    whose partial rows an all-reduce combines (a reduce-scatter under SP, whose backward all-gathers the
    gradient). For the whole sequence; under cp split by ``shard_sequence``."""
    if split.cp > 1:
        return shard_sequence(embedding_of_vocabulary(rows, hidden_size, own, replace(split, cp=1), training), split.cp)
    hidden = elem_bytes(training.activation_precision) * split.micro_batch_size * training.seq_len * hidden_size
    sp = split.sequence_parallel
    fwd = (Message("reduce_scatter" if sp else "all_reduce", hidden),)
    bwd = (Message("all_gather", hidden),) if sp else ()
    saved = own.saved_bytes
    return LayerOps(params=rows * hidden_size / split.tp + own.params, gemms=own.gemms, attention=None,
                    elementwise_bytes=own.elementwise_bytes, elementwise_kernels=own.kernels,
                    saved=SavedBytes(saved, saved, saved), tp_fwd=fwd, tp_bwd=bwd, host=own.host,
                    eager_bytes=own.eager_bytes)


def head_of_vocabulary(rows: int, hidden_size: int, own: EdgeWork, projection: bool, split: LayerSplit,
                       training: TrainingSetup) -> LayerOps:
    """The head: its own work (the final norm), a column-parallel projection onto ``rows`` (padded) output
    features (its weight counted here unless ``projection`` is False: tied to the embedding), and the
    vocabulary-parallel cross-entropy: read the logits, write the fp32 log-softmax (kept for backward),
    read it back; three per-token all-reduces (max, sum of exponentials, target logit). Under SP the
    projection's input is all-gathered in forward and reduce-scattered in backward; without SP the
    backward all-reduces the input gradient."""
    if split.cp > 1:  # each rank's loss is the mean over its tokens; averaging gradients over dp x cp does the rest
        return shard_sequence(head_of_vocabulary(rows, hidden_size, own, projection, replace(split, cp=1), training),
                              split.cp)
    e, tp, sp = elem_bytes(training.activation_precision), split.tp, split.sequence_parallel
    tokens = split.micro_batch_size * training.seq_len
    hidden, logits = e * tokens * hidden_size, tokens * rows / tp
    saved = own.saved_bytes + 4.0 * logits
    losses = (Message("all_reduce", 4.0 * tokens),) * 3  # fp32
    fwd = ((Message("all_gather", hidden),) if sp else ()) + losses
    bwd = (Message("reduce_scatter" if sp else "all_reduce", hidden),)
    weight = rows * hidden_size / tp if projection else 0.0
    loss_fwd, loss_bwd = loss_eager_bytes(rows, split, training)
    eager = None if own.eager_bytes is None else (own.eager_bytes[0] + loss_fwd, own.eager_bytes[1] + loss_bwd)
    return LayerOps(params=own.params + weight,
                    gemms=(*own.gemms, Gemm(tokens, rows // tp, hidden_size, fp8=False)), attention=None,
                    elementwise_bytes=own.elementwise_bytes + (e + 8) * logits,
                    elementwise_kernels=own.kernels + LOSS_KERNELS, saved=SavedBytes(saved, saved, saved),
                    tp_fwd=fwd, tp_bwd=bwd, host=with_loss_ops(own.host, +1), eager_bytes=eager)


def loss_eager_bytes(rows: int, split: LayerSplit, training: TrainingSetup) -> tuple[float, float]:
    """(forward, backward) bytes the loss's eager ops move over ``rows`` (padded) logits split over TP."""
    per_row = elem_bytes(training.activation_precision) * split.micro_batch_size * training.seq_len * rows / split.tp
    return LOSS_EAGER_ELEMENTS[0] * per_row, LOSS_EAGER_ELEMENTS[1] * per_row


def with_loss_ops(host: HostOps, sign: int) -> HostOps:
    """``host`` with the loss's op counts added (+1) or taken out (-1)."""
    counts = tuple(n + sign * k for n, k in zip((host.fwd_ops, host.fwd_views, host.bwd_ops, host.bwd_views),
                                                LOSS_HOST_OPS))
    return replace(host, fwd_ops=counts[0], fwd_views=counts[1], bwd_ops=counts[2], bwd_views=counts[3])


def embedding_ops(model: ModelSpec, split: LayerSplit, training: TrainingSetup) -> LayerOps:
    """The embedding of a spec: gather the rows (read, write); gpt adds the learned positions (read two,
    write one; a table of ``position_rows`` on every rank) and drops out."""
    e = elem_bytes(training.activation_precision)
    tokens = split.micro_batch_size * training.seq_len
    hidden = e * tokens * model.hidden_size
    gpt = model.architecture == "gpt"
    moved = 2 * hidden + ((3 * hidden + (2 * hidden + tokens * model.hidden_size if model.dropout > 0 else 0))
                          if gpt else 0)
    own = EdgeWork(params=model.position_rows(training.seq_len) * model.hidden_size if gpt else 0,
                   elementwise_bytes=moved, kernels=2,
                   saved_bytes=act.embedding_saved_bytes(model, split, training), host=host_ops(model, "embedding"),
                   eager_bytes=eager_bytes(model, "embedding", split, training))
    return embedding_of_vocabulary(model.padded_vocab_size(split.tp), model.hidden_size, own, split, training)


def head_ops(model: ModelSpec, split: LayerSplit, training: TrainingSetup) -> LayerOps:
    """The head of a spec: the final norm (read, write; split under SP), then the vocabulary's projection
    and loss."""
    hidden = elem_bytes(training.activation_precision) * split.micro_batch_size * training.seq_len * model.hidden_size
    rows = model.padded_vocab_size(split.tp)
    fwd, bwd = eager_bytes(model, "head", split, training)  # the runtime's head, its loss included: take it out
    loss_fwd, loss_bwd = loss_eager_bytes(rows, split, training)
    own = EdgeWork(params=2 * model.hidden_size if model.architecture == "gpt" else model.hidden_size,
                   elementwise_bytes=2 * hidden / split.hidden_shards, kernels=1,
                   saved_bytes=act.head_input_saved_bytes(model, split, training),
                   host=with_loss_ops(host_ops(model, "head"), -1), eager_bytes=(fwd - loss_fwd, bwd - loss_bwd))
    return head_of_vocabulary(rows, model.hidden_size, own, not model.tie_embeddings, split, training)
