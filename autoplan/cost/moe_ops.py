"""The analytic ``LayerOps`` of Mixture-of-Experts blocks, multi-head latent attention (MLA) and DeepSeek-V3's
multi-token-prediction (MTP) modules, for one micro-batch on one device.

A block is built from parts that ``merge`` adds up: its attention part (the norms, residuals and the
attention: GQA as cost/analytic_ops.py's dense block prices it, or MLA) and its feed-forward part (a dense
SwiGLU, or the MoE layer: router, routed experts, shared experts). The attention part and a dense SwiGLU are
built for the whole sequence and split by ``shard_sequence`` under cp, as the dense block is; the routed part
is built directly for the rank's own tokens, whose count sets the per-expert GEMM rows.

Routed experts (Megatron-Core's ``MoEAlltoAllTokenDispatcher``, megatron/core/transformer/moe/
token_dispatcher.py: permute, all-to-all over EP, all-gather over the expert-TP group, sort by local expert,
grouped GEMMs, and the reverse): a rank holds T = b s / (cp x tp under SP) tokens (Megatron's MoELayer routes
each TP rank's sequence-parallel slice) and sends T k copies (top-k) over its EP group; with every expert
equally loaded each of its E / ep local experts computes m = T ep etp k / E rows (the tokens of the ep x etp
ranks that share these experts), times ``training.moe_imbalance`` on the busiest rank (capped at the capacity
factor when tokens are dropped). The experts run as grouped GEMMs, priced as E / ep calls of m rows each on the
device's measured GEMM curve (cost/compute.py ``matmul_time_s``): its fixed cost per call makes the time per
FLOP rise as tokens per expert fall, which is what the kernel-level measurements of grouped GEMMs show
(Megatron-Core's GroupedMLP over cutlass/cuBLAS grouped GEMM, one problem per local expert). fc1 is [h -> 2
f / etp] (gate and up), fc2 [f / etp -> h]; backward twice the forward as every GEMM.

Token exchange (``LayerOps.ep_*`` and ``etp_*``, priced into ``LayerCost.ep_fwd_s`` / ``ep_bwd_s`` on the
links the groups span): forward, the dispatch all-to-all of the T k hidden rows (e h bytes each) and of their
fp32 routing weights (Megatron sends ``probs`` by a second all-to-all), then the combine all-to-all of the
expert outputs; backward the same three. Under etp > 1 the dispatcher all-gathers the received rows (and
their weights) over the etp group before the experts and reduce-scatters their outputs after (forward), and
the reverse in backward. The busiest rank receives ``moe_imbalance`` x its share, and every rank waits for it:
the messages are scaled by the same load factor.

Router (Megatron router.py ``TopKRouter``): the [T, h] x [h, E] gating GEMM in the activation dtype (Megatron's
``moe_router_dtype`` None; recipes that set fp32 run it in fp32, not modelled), never in fp8; the scores
(softmax or sigmoid) and the top-k over the T x E fp32 logits are memory-bound.

Shared experts (Megatron shared_experts.py ``SharedExpertMLP``): a dense SwiGLU of ``moe.shared_width``,
TP-split like the dense MLP, on the gathered sequence under SP, with its own TP pair of collectives, plus
Qwen2-MoE's sigmoid gate (a [1, h] weight, replicated).

MLA (Megatron multi_latent_attention.py ``MLASelfAttention`` with Transformer Engine): the down-projections
(q [h -> q_lora_rank], kv [h -> kv_lora_rank + qk_rope_head_dim]) are ``parallel_mode="duplicated"``:
replicated on every TP rank and run on the rank's own tokens (its sequence-parallel slice under SP, all of
them without); their RMSNorms likewise. The up-projections (q [q_lora -> heads qk_head_dim], kv [kv_lora ->
heads (qk_nope + v_head_dim)]) and o [heads v_head_dim -> h] are split by heads. Under SP the latents (q, kv
and the shared RoPE key) are all-gathered before the up-projections and o's output reduce-scattered; without
SP o's output is all-reduced and backward all-reduces the latents' gradients. The core uses qk_head_dim for
the scores and v_head_dim for the output: 2 b s^2 heads (d_qk + d_v) FLOPs. Without ``q_lora_rank`` one
column-parallel q projection [h -> heads qk_head_dim].

Memory-bound bytes: fused counts (each kernel reads its inputs and writes its outputs once), per forward,
activations of e bytes, R = T k etp x load rows on this rank's experts:

    router scores and top-k       fp32 logits: scores read/write 8 T E, top-k reads 4 T E and writes 12 T k,
                                  the routing map T E                            13 T E + 12 T k
    permute before dispatch       gather the T k copies, write them               2 e T k h
    sort by local expert (E/ep>1) after dispatch and before combine              2 x 2 e R h
    weighted SwiGLU               reads fc1's 2 f/etp and the fp32 weight, writes f/etp   3 e R f/etp + 4 R
    unpermute and sum the k       reads T k rows, writes T                        e T h (k + 1)
    shared output + routed output reads two, writes one                           3 e T h
    shared SwiGLU                 as the dense MLP's                              3 e T_s f_s / tp

``eager_bytes`` is None for MoE and MLA blocks: the runtime's eager ops of these layers are not counted
(analytic_ops.EAGER_ELEMENTS covers the dense layers), so an eager stack prices their fused bytes (an
underestimate there); their host ops are the dense llama block's counts (the MoE layer's own eager ops and
per-expert work are not counted either).

Saved activations (Korthikanti et al. 2022 for the attention part, with MLA's widths; the MoE part as the
tensors Megatron-Core's MoE layer keeps for backward, with its "memory efficient token permutation" that
applies the routing weights in the experts' activation rather than at unpermutation,
megatron/core/transformer/moe/README.md): fp32 router logits and scores and the routing map 9 T E; the
permuted fc1 input e R h, fc1 output e R 2f/etp, the activation (fc2 input) e R f/etp, the permuted fp32
weights 4 R; shared experts as the dense SwiGLU (4 e T f_s / tp). Linear in k through R. Full recomputation
keeps the block input alone, as for the dense block.

Each part also lists these tensors one by one (``LayerOps.saved_tensors``, cost/layer_ops.py ``SavedTensor``):
what keeps each (a norm's or the SwiGLU's backward, the attention kernel, the bf16 router, or only fp8 GEMMs,
each of which keeps its own quantized copy under Transformer Engine), and which of Megatron-Core's
``recompute_modules`` drops it, with what that module reruns (``ModuleRerun``), as Megatron-Core with Transformer
Engine builds the block (gpt_layer_specs.py): ``layernorm`` the separate norms' outputs (MLA's input norm and
the MoE layer's norm; a GQA block's input norm and a dense MLP's norm are fused into their GEMMs and not
dropped), ``mla_up_proj`` q, k, v and the latent norms' outputs (rerun: the up-projections, RoPE and, under
SP, the latents' all-gather), ``moe_act`` the experts' SwiGLU output, ``core_attn`` the attention kernel's
saved state, ``mlp`` a dense MLP's tensors with its norm's output, ``shared_experts`` the shared SwiGLU's,
``moe`` the whole MoE layer's but its input (rerun: router, experts and the exchange). A stack's
``selective_recompute: modules`` and ``fp8_saved`` price them (cost/layer_ops.py ``layer_cost``); the totals
above stay what every other stack prices.

Model FLOPs (MFU): as Megatron and DeepSeek count them, from the active parameters: 2 x (attention + router +
k experts + shared) per token forward, plus the attention core; the busiest rank's extra ``moe_imbalance``
share is executed (priced) but not counted (``LayerOps.model_flops``).

Node-deduplicating dispatchers (DeepEP's normal kernels, HybridEP: Megatron's ``flex`` dispatcher, which the
published DeepSeek-V3 and Qwen3-30B-A3B H100 recipes use; a stack's ``ep_dispatcher: deduplicated``) send a
token over the network once per remote node that holds any of its experts and forward it over NVLink there
(DeepSeek-V3 report sec. 3.2.2): ``routed_ops`` then has no all-to-all but two ``RoutedExchange`` each way
(``deduplicated_exchanges``: the dispatch with the k fp32 routing weights, the combine; the busiest rank's
load factor on the rows), priced by cost/layer_ops.py ``routed_exchange_s`` from cost/comm.py ``routed_copies``
(the expected copies under balanced routing, on the EP group's nodes; at most ``moe.router_group_topk`` nodes
under group-limited routing when the EP group spans ``moe.router_groups`` nodes) and ``hierarchical_exchange_s``. Under
expert TP the etp all-gather / reduce-scatter stay as above.

MTP (DeepSeek-V3 section 2.2, Megatron multi_token_prediction.py): each module runs on the last stage, so it
is folded into the head: the embedding of the shifted tokens (the shared table: no parameters), RMSNorms on the
hidden state and on that embedding, their concatenation through eh_proj [2h -> h] (column-parallel, output
gathered), one block (MoE or dense as block num_layers + i would be), its final RMSNorm, the shared output
head and a second cross-entropy.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Callable

from autoplan.cost.activations import SavedBytes, elem_bytes
from autoplan.cost.analytic_ops import block_ops, block_tp_messages, embedding_ops, head_ops, host_ops
from autoplan.cost.context_parallel import ring_exchange
from autoplan.cost.flops import attended_keys
from autoplan.cost.comm import routed_copies  # noqa: F401  (the deduplicating dispatcher's copies; re-exported)
from autoplan.cost.layer_ops import (
    AttentionCore, Gemm, HostOps, LayerOps, Message, ModuleRerun, RoutedExchange, SavedTensor, lists_tensors,
    shard_sequence,
)
from autoplan.cost.split import LayerSplit
from autoplan.errors import SpecError
from autoplan.schema import ModelSpec, StackProfile, TrainingSetup


# ---- putting parts together ---------------------------------------------------------------------------------

def executed_flops(ops: LayerOps) -> float:
    """Forward FLOPs the GEMMs and the attention core of ``ops`` execute."""
    return sum(g.flops for g in ops.gemms) + (ops.attention.flops if ops.attention is not None else 0.0)


def merge(*parts: LayerOps) -> LayerOps:
    """One layer made of ``parts`` run one after the other: every count adds up; at most one part has an
    attention core and a ring; eager bytes only when every part counted them."""
    cores = [p.attention for p in parts if p.attention is not None]
    rings = [p.ring for p in parts if p.ring is not None]
    if len(cores) > 1 or len(rings) > 1:
        raise ValueError("merge: more than one attention core in one layer")
    eagers = [p.eager_bytes for p in parts]
    eager = None if None in eagers else (sum(x[0] for x in eagers), sum(x[1] for x in eagers))
    counted = any(p.model_flops is not None for p in parts)
    hosts = [astuple_host(p.host) for p in parts]
    return LayerOps(
        params=sum(p.params for p in parts), gemms=tuple(g for p in parts for g in p.gemms),
        attention=cores[0] if cores else None, elementwise_bytes=sum(p.elementwise_bytes for p in parts),
        elementwise_kernels=sum(p.elementwise_kernels for p in parts),
        saved=SavedBytes(sum(p.saved.none for p in parts), sum(p.saved.selective for p in parts),
                         sum(p.saved.full for p in parts)),
        tp_fwd=tuple(m for p in parts for m in p.tp_fwd), tp_bwd=tuple(m for p in parts for m in p.tp_bwd),
        ring=rings[0] if rings else None, host=HostOps(*map(sum, zip(*hosts))), eager_bytes=eager,
        expert_params=sum(p.expert_params for p in parts),
        ep_fwd=tuple(m for p in parts for m in p.ep_fwd), ep_bwd=tuple(m for p in parts for m in p.ep_bwd),
        etp_fwd=tuple(m for p in parts for m in p.etp_fwd), etp_bwd=tuple(m for p in parts for m in p.etp_bwd),
        saved_tensors=tuple(t for p in parts for t in tensors_of(p)) if any(p.saved_tensors for p in parts) else (),
        reruns=tuple(r for p in parts for r in p.reruns),
        dispatch_fwd=tuple(x for p in parts for x in p.dispatch_fwd),
        dispatch_bwd=tuple(x for p in parts for x in p.dispatch_bwd),
        model_flops=sum(p.model_flops if p.model_flops is not None else executed_flops(p) for p in parts)
        if counted else None)


def tensors_of(part: LayerOps) -> tuple[SavedTensor, ...]:
    """A part's saved tensors; a part that does not list them (the embedding, the head) as one tensor of its
    saved bytes, which neither fp8 storage nor a recompute module changes."""
    if part.saved_tensors or not part.saved.none:
        return part.saved_tensors
    return (SavedTensor(part.saved.none, element_bytes=1.0),)


def astuple_host(host: HostOps) -> tuple[int, ...]:
    """A layer's host counts in ``HostOps`` field order."""
    return (host.fwd_ops, host.fwd_views, host.bwd_ops, host.bwd_views, host.tp_modules, host.param_tensors,
            host.tp_param_tensors)


def tp_pair_messages(hidden_bytes: float, sp: bool) -> tuple[tuple[Message, ...], tuple[Message, ...]]:
    """One column -> row parallel pair's TP collectives."""
    return block_tp_messages(hidden_bytes, sp, splits=1)


def _empty(**fields: object) -> LayerOps:
    base = LayerOps(params=0.0, gemms=(), attention=None, elementwise_bytes=0.0, elementwise_kernels=0,
                    saved=SavedBytes(0.0, 0.0, 0.0), eager_bytes=(0.0, 0.0))
    return replace(base, **fields)


def sequence_split(build: Callable[[LayerSplit], LayerOps], split: LayerSplit) -> LayerOps:
    """``build(split at cp=1)`` for the whole sequence, then split by cp (no ring)."""
    return shard_sequence(build(replace(split, cp=1)), split.cp)


# ---- attention parts (whole sequence, cp = 1; the caller shards) ---------------------------------------------

def block_skeleton(model: ModelSpec, split: LayerSplit, training: TrainingSetup) -> tuple[float, int, SavedBytes]:
    """What every llama block has around its attention and MLP (analytic_ops.block_ops): the norm before
    attention 2 H r, residual + norm before the MLP 4 H r, the residual after the MLP 3 H r (fused bytes, three
    kernels) and its saved norm inputs and outputs 4 e sbh r; full recomputation keeps the input e sbh r."""
    e = elem_bytes(training.activation_precision)
    tokens = split.micro_batch_size * training.seq_len
    r = 1 / split.hidden_shards
    hidden = e * tokens * model.hidden_size
    masks = 2 * tokens * model.hidden_size if model.dropout > 0 else 0
    moved = 9 * hidden * r + (2 * tokens * model.hidden_size * r if model.dropout > 0 else 0)
    none = (4 * hidden + masks) * r
    return moved, 3, SavedBytes(none, none, hidden * r)


def skeleton_tensors(model: ModelSpec, split: LayerSplit, training: TrainingSetup) -> tuple[SavedTensor, ...]:
    """``block_skeleton``'s saved tensors but the two norm outputs (the attention part and the feed-forward part
    say who keeps those): the two norm inputs (their backward reads them) and the dropout masks."""
    tokens = split.micro_batch_size * training.seq_len * model.hidden_size / split.hidden_shards
    masks = (SavedTensor(2 * tokens, element_bytes=1.0),) if model.dropout > 0 else ()
    return (SavedTensor(2 * tokens), *masks)


def norm_rerun(model: ModelSpec, split: LayerSplit, training: TrainingSetup) -> LayerOps:
    """One block norm run again (Megatron's ``layernorm`` module): reads its input, writes its output."""
    hidden = elem_bytes(training.activation_precision) * split.micro_batch_size * training.seq_len * model.hidden_size
    return _empty(elementwise_bytes=2 * hidden / split.hidden_shards, elementwise_kernels=1)


def core_tensors(model: ModelSpec, split: LayerSplit, training: TrainingSetup, heads: float) -> tuple[SavedTensor, ...]:
    """``_core_saved`` tensor by tensor: flash's fp32 log-sum-exp, or the softmax output (and the dropout mask
    and output); all dropped by Megatron's ``core_attn`` module."""
    b, s = split.micro_batch_size, training.seq_len
    if training.attention == "flash":
        return (SavedTensor(heads * s * b, element_bytes=4.0, modules=("core_attn",)),)
    scores = heads * s * s * b
    dropout = model.dropout > 0
    return ((SavedTensor((2 if dropout else 1) * scores, modules=("core_attn",)),)
            + ((SavedTensor(scores, element_bytes=1.0, modules=("core_attn",)),) if dropout else ()))


def _core_saved(model: ModelSpec, split: LayerSplit, training: TrainingSetup, heads: float) -> tuple[float, float]:
    """(saved, dropped by selective recomputation) of the attention core: flash keeps its fp32 log-sum-exp."""
    b, s, e = split.micro_batch_size, training.seq_len, elem_bytes(training.activation_precision)
    if training.attention == "flash":
        return 4.0 * heads * s * b, 0.0
    core = (e + ((1 + e) if model.dropout > 0 else 0)) * heads * s * s * b
    return core, core


def gqa_attention_ops(model: ModelSpec, split: LayerSplit, training: TrainingSetup, stack: StackProfile) -> LayerOps:
    """The dense block's attention part (analytic_ops.block_ops without its MLP): q, k, v, o, RoPE, Qwen3's
    q/k norms, the block's norms and residuals; the host counts of the whole llama block."""
    tp, e = split.tp, elem_bytes(training.activation_precision)
    h, q, kv = model.hidden_size, model.q_size, model.kv_size
    tokens = split.micro_batch_size * training.seq_len
    gemms = (Gemm(tokens, q // tp, h), Gemm(tokens, kv // tp, h, count=2), Gemm(tokens, q // tp, h))
    moved, kernels, skeleton = block_skeleton(model, split, training)
    moved += 2 * e * tokens * (q + kv) / tp  # RoPE
    kernels += 1
    qk_norms = 0.0
    if model.qk_norm:
        moved += 2 * e * tokens * (q + kv) / tp
        kernels += 1
        qk_norms = e * tokens * (q + kv)
    fwd, bwd = tp_pair_messages(e * tokens * h, split.sequence_parallel)
    if stack.tp_input_grad_reduce == "per_module" and not split.sequence_parallel:
        bwd = (Message("all_reduce", e * tokens * h),) * 3
    replicated = 2 * h + (2 * model.head_dim if model.qk_norm else 0)
    heads = model.num_attention_heads / tp
    core, dropped = _core_saved(model, split, training, heads)
    kept = (e * tokens * (q + 2 * kv) + e * tokens * q + qk_norms) / tp + core
    saved = SavedBytes(skeleton.none + kept, skeleton.none + kept - dropped, skeleton.full)
    attn = AttentionCore(split.micro_batch_size, heads, training.seq_len, model.head_dim, model.dropout > 0,
                         keys=attended_keys(model, training.seq_len))
    host = host_ops(model, "block")
    tensors, reruns = (), ()
    if lists_tensors(stack):
        # Megatron with Transformer Engine: the norm before attention is fused into the QKV GEMM
        # (TELayerNormColumnParallelLinear), which keeps its output; q, k, v and the output the attention kernel
        # keeps, the output projection the same output (set_save_original_input under fp8)
        tensors = (*skeleton_tensors(model, split, training),
                   SavedTensor(tokens * h / split.hidden_shards, kept_whole=False, fp8_gemms=1),
                   SavedTensor(tokens * (q + 2 * kv) / tp), SavedTensor(tokens * q / tp, role="attention_output"),
                   *((SavedTensor(tokens * (q + kv) / tp),) if model.qk_norm else ()),
                   *core_tensors(model, split, training, heads))
        reruns = (ModuleRerun("core_attn", _empty(attention=attn)),)
    return _empty(params=(model.attention_params() + 2 * h - replicated) / tp + replicated, gemms=gemms,
                  attention=attn, elementwise_bytes=moved, elementwise_kernels=kernels, saved=saved, tp_fwd=fwd,
                  tp_bwd=bwd, host=host, eager_bytes=None, saved_tensors=tensors, reruns=reruns)


def mla_attention_ops(model: ModelSpec, split: LayerSplit, training: TrainingSetup,
                      stack: StackProfile | None = None) -> LayerOps:
    """Multi-head latent attention's part of a block (module doc), with the block's norms and residuals (its
    saved tensors and module reruns listed where ``stack`` prices them)."""
    mla, tp, e = model.mla, split.tp, elem_bytes(training.activation_precision)
    h, a = model.hidden_size, model.num_attention_heads
    tokens = split.micro_batch_size * training.seq_len
    own = tokens // split.hidden_shards  # the duplicated down-projections run on the rank's own tokens
    d_qk, d_v, rope = mla.qk_head_dim, mla.v_head_dim, mla.qk_rope_head_dim
    ql, kvl = mla.q_lora_rank, mla.kv_lora_rank
    q_width, kv_up_width = a * d_qk // tp, a * (mla.qk_nope_head_dim + d_v) // tp
    if ql is None:
        q_gemms = (Gemm(tokens, q_width, h),)
        latents, replicated = kvl + rope, h * (kvl + rope) + kvl
    else:
        q_gemms = (Gemm(own, ql, h), Gemm(tokens, q_width, ql))
        latents, replicated = ql + kvl + rope, h * ql + ql + h * (kvl + rope) + kvl
    gemms = (*q_gemms, Gemm(own, kvl + rope, h), Gemm(tokens, kv_up_width, kvl), Gemm(tokens, h, a * d_v // tp))
    moved, kernels, skeleton = block_skeleton(model, split, training)
    latent_norms = (ql or 0) + kvl
    moved += 2 * e * own * latent_norms  # the latents' RMSNorms
    moved += 2 * e * tokens * 2 * a * d_qk / tp  # RoPE on q_pe and k_pe, assembling q and k
    kernels += (2 if ql is not None else 1) + 1
    sp = split.sequence_parallel
    hidden, latent = e * tokens * h, e * tokens * latents
    if ql is None:  # the column-parallel q projection takes the hidden state itself
        latent += hidden
    if sp:  # latents gathered before the up-projections (and again for their weight gradients), o scattered
        fwd = (Message("all_gather", latent), Message("reduce_scatter", hidden))
        bwd = (Message("all_gather", hidden), Message("reduce_scatter", latent), Message("all_gather", latent))
    else:
        fwd = (Message("all_reduce", hidden),)
        bwd = (Message("all_reduce", latent),)
    heads = a / tp
    core, dropped = _core_saved(model, split, training, heads)
    # latents (norm inputs and outputs; the RoPE key) on the rank's tokens; q, k, v into the core and o's input
    kept = e * own * (2 * latent_norms + rope) + e * tokens * a * (2 * d_qk + 2 * d_v) / tp + core
    saved = SavedBytes(skeleton.none + kept, skeleton.none + kept - dropped, skeleton.full)
    attn = AttentionCore(split.micro_batch_size, heads, training.seq_len, d_qk, model.dropout > 0, v_head_dim=d_v,
                         keys=attended_keys(model, training.seq_len))
    split_params = model.attention_params() - replicated
    tensors, reruns = (), ()
    if lists_tensors(stack):
        # Megatron-Core's MLA with Transformer Engine (gpt_layer_specs.py): a separate input norm whose output the
        # two duplicated down-projections keep; the latent norms fused into the up-projections
        # (TELayerNormColumnParallelLinear), which keep their outputs; q, k, v kept by the attention kernel and
        # dropped with the up-projections by ``mla_up_proj`` (multi_latent_attention.py qkv_up_checkpoint)
        up = ("mla_up_proj",)
        tensors = (*skeleton_tensors(model, split, training),
                   SavedTensor(own * h, kept_whole=False, fp8_gemms=2, modules=("layernorm",)),
                   SavedTensor(own * (latent_norms + rope)),
                   SavedTensor(own * latent_norms, kept_whole=False, fp8_gemms=1, modules=up),
                   SavedTensor(tokens * a * (2 * d_qk + d_v) / tp, modules=up),
                   SavedTensor(tokens * a * d_v / tp, role="attention_output"),
                   *core_tensors(model, split, training, heads))
        up_gemms = q_gemms[-1:] + gemms[-2:-1]  # q (up) and kv up
        rope_and_norms = 2 * e * own * latent_norms + 2 * e * tokens * 2 * a * d_qk / tp
        rerun_up = _empty(gemms=up_gemms, elementwise_bytes=rope_and_norms,
                          elementwise_kernels=(2 if ql is not None else 1) + 1, tp_fwd=fwd[:1] if sp else ())
        reruns = (ModuleRerun("layernorm", norm_rerun(model, split, training)), ModuleRerun("mla_up_proj", rerun_up),
                  ModuleRerun("core_attn", _empty(attention=attn)))
    return _empty(params=split_params / tp + replicated + 2 * h, gemms=gemms, attention=attn, elementwise_bytes=moved,
                  elementwise_kernels=kernels, saved=saved, tp_fwd=fwd, tp_bwd=bwd, host=host_ops(model, "block"),
                  eager_bytes=None, saved_tensors=tensors, reruns=reruns)


def attention_ops(model: ModelSpec, split: LayerSplit, training: TrainingSetup, stack: StackProfile) -> LayerOps:
    """The attention part of one block for the rank's s / cp tokens; under cp with its ring (flash only)."""
    if split.cp == 1:
        return mla_attention_ops(model, split, training, stack) if model.mla is not None \
            else gqa_attention_ops(model, split, training, stack)
    if training.attention != "flash":
        raise ValueError("context parallelism runs ring attention on flash kernels (plan.py refuses standard)")
    whole = attention_ops(model, replace(split, cp=1), training, stack)
    e, tp = elem_bytes(training.activation_precision), split.tp
    local = split.micro_batch_size * training.seq_len // split.cp
    if model.mla is not None:  # every head has its own key (d_qk) and value (d_v)
        heads = model.num_attention_heads
        q, kv = heads * model.head_dim, heads * (model.head_dim + model.mla.v_head_dim)
    else:
        q, kv = model.q_size, 2 * model.kv_size
    ring = ring_exchange(split.cp, local * q / tp, local * kv / tp, e)
    return shard_sequence(whole, split.cp, ring)


# ---- feed-forward parts ---------------------------------------------------------------------------------------

def swiglu_ops(width: int, model: ModelSpec, split: LayerSplit, training: TrainingSetup,
               stack: StackProfile, module: str = "mlp") -> LayerOps:
    """A dense SwiGLU MLP of ``width`` split by TP (gate and up column-, down row-parallel), whole sequence:
    the dense block's MLP (``module`` "mlp"), or the shared experts ("shared_experts")."""
    tp, e, h = split.tp, elem_bytes(training.activation_precision), model.hidden_size
    tokens = split.micro_batch_size * training.seq_len
    gemms = (Gemm(tokens, width // tp, h, count=2), Gemm(tokens, h, width // tp))
    ffn = e * tokens * width / tp
    fwd, bwd = tp_pair_messages(e * tokens * h, split.sequence_parallel)
    if stack.tp_input_grad_reduce == "per_module" and not split.sequence_parallel:
        bwd = (Message("all_reduce", e * tokens * h),) * 2  # gate and up (analytic_ops.block_ops)
    saved = 4 * ffn  # gate, silu(gate), up, their product (activations.py)
    tensors, reruns = (), ()
    if lists_tensors(stack):
        dropped = (module,) if module == "mlp" else (module, "moe")
        width_elements = tokens * width / tp
        # gate and up (the SwiGLU's input), silu(gate), and the product that the down projection keeps
        tensors = (SavedTensor(2 * width_elements, role="swiglu_inputs", modules=dropped),
                   SavedTensor(width_elements, modules=dropped),
                   SavedTensor(width_elements, kept_whole=False, fp8_gemms=1, modules=dropped))
        rerun = _empty(gemms=gemms, elementwise_bytes=3 * ffn, elementwise_kernels=1, tp_fwd=fwd)
        if module == "mlp":  # Transformer Engine fuses the norm before a dense MLP into its first GEMM, which keeps
            # the norm's output (gpt_layer_specs.py: pre_mlp_layernorm IdentityOp); the MLP's checkpoint drops it
            tensors += (SavedTensor(tokens * h / split.hidden_shards, kept_whole=False, fp8_gemms=1, modules=dropped),)
            norm = norm_rerun(model, split, training)
            rerun = replace(rerun, elementwise_bytes=rerun.elementwise_bytes + norm.elementwise_bytes,
                            elementwise_kernels=rerun.elementwise_kernels + norm.elementwise_kernels)
        reruns = tuple(ModuleRerun(m, rerun) for m in dropped)
    return _empty(params=3 * h * width / tp, gemms=gemms, elementwise_bytes=3 * ffn, elementwise_kernels=1,
                  saved=SavedBytes(saved, saved, 0.0), tp_fwd=fwd, tp_bwd=bwd, eager_bytes=None, saved_tensors=tensors,
                  reruns=reruns)


def local_tokens(split: LayerSplit, training: TrainingSetup) -> int:
    """Tokens entering this rank's MoE layer: its s / cp of each sequence, its SP slice of those under TP."""
    tokens = split.micro_batch_size * training.seq_len
    shards = split.cp * split.hidden_shards
    if tokens % shards:
        raise SpecError(f"seq_len: {training.seq_len} x micro_batch_size {split.micro_batch_size} tokens do not "
                        f"split over cp x tp = {shards} ranks; use a seq_len divisible by {shards}")
    return tokens // shards


def expert_load(model: ModelSpec, training: TrainingSetup) -> float:
    """The busiest expert's tokens over its balanced share: ``moe_imbalance``, capped by the capacity factor
    (Megatron drops the tokens past an expert's capacity)."""
    cf = model.moe.capacity_factor
    return training.moe_imbalance if cf is None else min(training.moe_imbalance, cf)


def routed_ops(model: ModelSpec, split: LayerSplit, training: TrainingSetup,
               stack: StackProfile | None = None) -> LayerOps:
    """Router and routed experts of one MoE layer on this rank's own tokens (module doc), with the token
    exchange over EP (as ``stack.ep_dispatcher`` runs it; None: the all-to-all) and etp."""
    moe, e, h = model.moe, elem_bytes(training.activation_precision), model.hidden_size
    ep, etp, experts, k = split.ep, split.etp, model.moe.num_experts, model.moe.experts_per_token
    if experts % ep or moe.expert_ffn_size % etp:
        raise SpecError(f"ep: ep={ep} must divide the {experts} experts and etp={etp} the expert width "
                        f"{moe.expert_ffn_size}")
    if split.tp > 1 and not split.sequence_parallel:
        raise SpecError("sequence_parallel: an MoE model under tp > 1 needs sequence parallelism; add "
                        "--sequence-parallel")
    local, load = experts // ep, expert_load(model, training)
    t = local_tokens(split, training)
    f = moe.expert_ffn_size // etp
    balanced = t * ep * etp * k / experts  # rows per local expert
    rows = t * k * etp * load  # rows this rank's experts process
    router = Gemm(t, experts, h, fp8=False)
    fc1 = Gemm(balanced * load, 2 * f, h, count=local, grouped=True)
    fc2 = Gemm(balanced * load, h, f, count=local, grouped=True)
    moved = (13 * t * experts + 12 * t * k + 2 * e * t * k * h + (4 * e * rows * h if local > 1 and ep > 1 else 0)
             + 3 * e * rows * f + 4 * rows + e * t * h * (k + 1))
    kernels = 3 + 1 + (2 if local > 1 and ep > 1 else 0) + 1 + 1
    kept = 9 * t * experts + e * rows * (h + 3 * f) + 4 * rows
    expert = local * moe.expert_params(h) / etp
    dispatch, probs = e * t * k * h * load, 4.0 * t * k * load
    ep_fwd = ep_bwd = etp_fwd = etp_bwd = ()
    if ep > 1:
        ep_fwd = (Message("all_to_all", dispatch), Message("all_to_all", probs), Message("all_to_all", dispatch))
        ep_bwd = (Message("all_to_all", dispatch), Message("all_to_all", dispatch), Message("all_to_all", probs))
    if etp > 1:
        gathered, gathered_probs = etp * dispatch, etp * probs
        etp_fwd = (Message("all_gather", gathered), Message("all_gather", gathered_probs),
                   Message("reduce_scatter", gathered))
        etp_bwd = (Message("all_gather", gathered), Message("reduce_scatter", gathered),
                   Message("reduce_scatter", gathered_probs))
    counted = router.flops + (fc1.flops + fc2.flops) / load
    dispatch_fwd = dispatch_bwd = ()
    if ep > 1 and stack is not None and stack.ep_dispatcher == "deduplicated":
        ep_fwd = ep_bwd = ()
        dispatch_fwd, dispatch_bwd = deduplicated_exchanges(model, t * load, training, stack)
    # the norm before the MoE layer (a separate norm: the router and the dispatcher read its output; the router,
    # a bf16 GEMM, keeps it, and so does the shared experts' first GEMM), the router's fp32 logits, scores and
    # map; the experts' input (grouped fc1's), fc1's output (the SwiGLU's input), the SwiGLU's output (fc2's
    # input, dropped by ``moe_act``, Megatron experts.py activation_recompute), the permuted fp32 weights
    tensors, reruns = (), ()
    if lists_tensors(stack):
        layer = ("moe",)
        tensors = (SavedTensor(t * h, fp8_gemms=1 if moe.num_shared_experts else 0, modules=("layernorm",)),
                   SavedTensor(9 * t * experts, element_bytes=1.0, modules=layer),
                   SavedTensor(rows * h, kept_whole=False, fp8_gemms=1, modules=layer),
                   SavedTensor(rows * 2 * f, role="swiglu_inputs", modules=layer),
                   SavedTensor(rows * f, kept_whole=False, fp8_gemms=1, modules=("moe_act", "moe")),
                   SavedTensor(rows, element_bytes=4.0, modules=layer))
        whole = _empty(gemms=(router, fc1, fc2), elementwise_bytes=moved, elementwise_kernels=kernels, ep_fwd=ep_fwd,
                       etp_fwd=etp_fwd, dispatch_fwd=dispatch_fwd)
        reruns = (ModuleRerun("layernorm", _empty(elementwise_bytes=2 * e * t * h, elementwise_kernels=1)),
                  ModuleRerun("moe_act", _empty(elementwise_bytes=3 * e * rows * f + 4 * rows, elementwise_kernels=1)),
                  ModuleRerun("moe", whole))
    return _empty(params=moe.router_params(h) + expert, gemms=(router, fc1, fc2), elementwise_bytes=moved,
                  elementwise_kernels=kernels, saved=SavedBytes(kept, kept, 0.0),
                  eager_bytes=None, expert_params=expert, ep_fwd=ep_fwd, ep_bwd=ep_bwd, etp_fwd=etp_fwd,
                  etp_bwd=etp_bwd, model_flops=counted, saved_tensors=tensors, reruns=reruns,
                  dispatch_fwd=dispatch_fwd, dispatch_bwd=dispatch_bwd)


def deduplicated_exchanges(model: ModelSpec, rows: float, training: TrainingSetup, stack: StackProfile
                           ) -> tuple[tuple[RoutedExchange, ...], tuple[RoutedExchange, ...]]:
    """(forward, backward) exchanges of ``rows`` tokens on a node-deduplicating dispatcher (module doc): forward
    the dispatch (the hidden row with its k fp32 routing weights) and the combine (the expert outputs),
    backward their gradients the other way. Under fp8 training a stack with ``ep_dispatch_dtype`` fp8 sends
    the rows towards the experts (the dispatch, the combine's gradient) in fp8 with a 4-byte scale per 128
    elements (DeepSeek-V3 sec. 3.3.3); the other direction in the activation dtype. A group-limited router
    (``moe.router_groups``) bounds the nodes a token reaches where a group is one node's experts
    (cost/layer_ops.py ``routed_exchange_s``)."""
    moe, h, e = model.moe, model.hidden_size, elem_bytes(training.activation_precision)
    fp8 = stack.ep_dispatch_dtype == "fp8" and training.precision == "fp8"
    towards = (h + 4 * h / 128) if fp8 else e * h
    weights = 4.0 * moe.experts_per_token

    groups = (moe.router_groups, moe.router_group_topk) if moe.group_limited else (0, 0)

    def exchange(row_bytes: float) -> RoutedExchange:
        return RoutedExchange(rows, row_bytes, moe.num_experts, moe.experts_per_token, *groups)

    return (exchange(towards + weights), exchange(e * h)), (exchange(towards), exchange(e * h + weights))


def shared_ops(model: ModelSpec, split: LayerSplit, training: TrainingSetup, stack: StackProfile) -> LayerOps:
    """The shared experts (a TP-split SwiGLU of ``moe.shared_width``) for the whole sequence, with Qwen2-MoE's
    gate and the add of their output to the routed one (on the rank's own tokens)."""
    moe, h, e = model.moe, model.hidden_size, elem_bytes(training.activation_precision)
    own = split.micro_batch_size * training.seq_len / split.hidden_shards
    ops = swiglu_ops(moe.shared_width, model, split, training, stack, module="shared_experts")
    add = 3 * e * own * h
    gate = (e * own * h + 3 * e * own * h) if moe.shared_expert_gate else 0.0  # sigmoid(w . x) * shared
    return replace(ops, params=ops.params + (h if moe.shared_expert_gate else 0),
                   elementwise_bytes=ops.elementwise_bytes + add + gate,
                   elementwise_kernels=ops.elementwise_kernels + 1 + (1 if gate else 0))


def moe_block_ops(model: ModelSpec, split: LayerSplit, training: TrainingSetup, stack: StackProfile) -> LayerOps:
    """One MoE block on one device for one micro-batch: attention part, router and routed experts, shared
    experts."""
    parts = [attention_ops(model, split, training, stack), routed_ops(model, split, training, stack)]
    if model.moe.num_shared_experts:
        parts.append(sequence_split(lambda whole: shared_ops(model, whole, training, stack), split))
    ops = merge(*parts)
    return replace(ops, host=replace(ops.host, **block_tensors(model, moe=True)))


def block_tensors(model: ModelSpec, moe: bool) -> dict[str, int]:
    """Parameter tensors of an MoE or MLA block as the runtime holds them (runtime/models/moe.py: the router's
    [E, h] weight, the experts' three stacked [E, ., .] weights, the shared SwiGLU's three; two block norms),
    the ones TP splits (DTensors) and the TP-parallelised modules: GQA's q, k, v, o (with Qwen2's biases),
    MLA's q (or q up), kv up and o (its down-projections and latent norms are replicated), a dense or shared
    SwiGLU's three; the routed experts are EP's, not TP's."""
    if model.mla is not None:
        lora = model.mla.q_lora_rank is not None
        attention, attention_tp, attention_modules = (7 if lora else 5), 3, 3
    else:
        biases = 3 if model.qkv_bias else 0
        attention, attention_tp, attention_modules = 4 + biases + (2 if model.qk_norm else 0), 4 + biases, 4
    ffn = ffn_tp = 3
    if moe:
        m = model.moe
        shared = 3 if m.num_shared_experts else 0
        ffn = 1 + m.router_bias + 3 * (1 + m.expert_bias) + shared + m.shared_expert_gate
        ffn_tp = shared
    return {"param_tensors": attention + 2 + ffn, "tp_param_tensors": attention_tp + ffn_tp,
            "tp_modules": attention_modules + ffn_tp}


def dense_block_ops(model: ModelSpec, split: LayerSplit, training: TrainingSetup, stack: StackProfile) -> LayerOps:
    """A dense block of an MoE or MLA model (the leading dense layers: a SwiGLU of ``ffn_hidden_size``); with
    GQA exactly the dense model's block (analytic_ops.block_ops)."""
    if model.mla is None:
        return block_ops(replace(model, moe=None, mtp_layers=0), split, training, stack)
    mlp = sequence_split(lambda whole: swiglu_ops(model.ffn_hidden_size, model, whole, training, stack), split)
    ops = merge(attention_ops(model, split, training, stack), mlp)
    return replace(ops, host=replace(ops.host, **block_tensors(model, moe=False)))


def any_block_ops(layer: int, model: ModelSpec, split: LayerSplit, training: TrainingSetup,
                  stack: StackProfile) -> LayerOps:
    """Block ``layer`` (0-based; ``num_layers + i`` is MTP module i's block), MoE or dense."""
    if model.is_moe_block(layer):
        return moe_block_ops(model, split, training, stack)
    return dense_block_ops(model, split, training, stack)


# ---- multi-token prediction ------------------------------------------------------------------------------------

def mtp_glue_ops(model: ModelSpec, split: LayerSplit, training: TrainingSetup) -> LayerOps:
    """An MTP module's own work besides its block, the embedding lookup and the head (whole sequence): hnorm and
    enorm (RMSNorms of h, on the rank's tokens), the concatenation, eh_proj [2h -> h] column-parallel with its
    output gathered (Megatron multi_token_prediction.py), and the final RMSNorm's weight (its work is the
    head's)."""
    tp, e, h = split.tp, elem_bytes(training.activation_precision), model.hidden_size
    tokens = split.micro_batch_size * training.seq_len
    r = 1 / split.hidden_shards
    hidden = e * tokens * h
    moved = 2 * 2 * hidden * r + 4 * hidden * r  # two norms; the concatenation reads 2h, writes 2h
    if split.sequence_parallel:  # backward: the sequence scatter's gather, the input gradient's, the regather
        fwd = (Message("all_gather", 2 * hidden), Message("all_gather", hidden))
        bwd = (Message("all_gather", hidden), Message("reduce_scatter", 2 * hidden),
               Message("all_gather", 2 * hidden))
    else:
        fwd = (Message("all_gather", hidden),)
        bwd = (Message("all_reduce", 2 * hidden),)
    kept = 2 * hidden * r + 2 * hidden * r  # the two norms' inputs; eh_proj's input (2h, sharded under SP)
    return _empty(params=2 * h * h / tp + 3 * h, gemms=(Gemm(tokens, h // tp, 2 * h),), elementwise_bytes=moved,
                  elementwise_kernels=3, saved=SavedBytes(kept, kept, kept), tp_fwd=fwd, tp_bwd=bwd, eager_bytes=None)


def mtp_ops(module: int, model: ModelSpec, split: LayerSplit, training: TrainingSetup, stack: StackProfile,
            block: LayerOps | None = None) -> LayerOps:
    """MTP module ``module`` on the last stage (module doc): the shifted tokens' embedding (no parameters: the
    table is the main one), the glue, block num_layers + module (``block``: already built), the shared output
    head (no parameters but its norm's, counted by the glue) and the second cross-entropy."""
    embed = replace(embedding_ops(model, split, training), params=0.0)
    glue = sequence_split(lambda whole: mtp_glue_ops(model, whole, training), split)
    if block is None:
        block = any_block_ops(model.num_layers + module, model, split, training, stack)
    head = replace(head_ops(model, split, training), params=0.0)
    return merge(embed, glue, block, head)


def refuse_unpriced(model: ModelSpec) -> None:
    """What the MoE cost model does not price: interleaved dense and MoE blocks past the leading dense ones."""
    if model.moe is not None and model.moe.layer_frequency > 1:
        raise SpecError(f"moe.layer_frequency: {model.moe.layer_frequency} (dense and MoE blocks interleaved) is not "
                        "priced: the cost model takes every block past first_dense_layers as an MoE block; use 1")
    if model.architecture != "llama" and (model.moe is not None or model.mla is not None):
        raise SpecError("architecture: MoE and MLA blocks are priced for llama only")
