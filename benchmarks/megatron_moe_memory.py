"""Megatron-LM's theoretical memory formula for MoE training, re-implemented without torch or Megatron.

A reference to compare autoplan's memory breakdown with (issue 31, must-show 3), not product code.

Source: NVIDIA/Megatron-LM ``megatron/training/theoretical_memory_usage.py`` as of commit
a7c9e8c44ae89bea013a085ef33ab52a9b7a19b4, "Make weight and optimizer memory estimation take into account
expert parallelism correctly" (PR #4687, merged 2026-05-13, fixes issue #4050; the question was asked in
#1784 and #2439), with its unit test ``tests/unit_tests/training/test_weight_and_optimizer_memory.py``.
Later commits on that file (1bcb3b9e0b, #5145, LatentMoE's ``moe_latent_size``) change nothing for the
models here (no latent MoE) and are not reproduced.

``compute_weight_and_optimizer_memory`` (what PR #4687 changed) splits the parameters by how a rank holds
them:

* TP-sharded (``tp_sharded_params``): attention and the dense MLP of dense layers, attention and the shared
  experts of MoE layers, the MTP block's attention/shared experts, and the input embedding; divided by TP.
* replicated (``replicated_params``): both norms of every layer, the router (and its bias, the shared-expert
  gate) of MoE layers, the final norm; not divided by TP.
* expert-sharded (``expert_params``): every routed expert of every MoE layer (and of the MTP block when the
  last layer is an MoE layer); divided by ETP x EP.

The "most loaded" pipeline rank holds 1/PP of the decoder's layers of each kind, *and* the whole MTP
block, *and* the input embedding; the output layer is added only when PP = 1 and the embeddings are untied.
Bytes per parameter (bf16 training: bf16 weight 2, fp32 main gradient 4, fp32 main weight 4, Adam's two
fp32 moments 8): 18 without the distributed optimizer; 6 + 12 / DP with it, where the DP of the dense part
is ``data_parallel_size`` = world / (TP x PP x CP) and that of the experts is the expert data-parallel
size EDP = world / (ETP x EP x PP).

Quirks kept on purpose (a faithful copy, to compare against): the MTP block and the embedding are put on
the same "most loaded" rank (in Megatron-Core the MTP block lives on the last stage, the embedding on the
first); uneven pipeline layouts (``--pipeline-model-parallel-layout``) are ignored (layers / PP); MLA's
down-projections are counted as TP-sharded; Qwen3's q/k norms are not counted; the dense DP does not
include CP although Megatron's distributed optimizer shards over DP x CP.

The activation term ``report_theoretical_memory`` adds (unchanged by PR #4687) is included too:
``compute_activation_memory`` (Korthikanti et al. 2022, arXiv 2205.05198, Table 2) with ``--sequence-parallel``
and ``--recompute-granularity selective``, ``compute_activation_memory_without_sp`` otherwise. Both are dense
formulas: they use ``ffn_hidden_size`` for every layer and know nothing of experts, MLA or the MTP block;
the MTP block is also counted as "active" parameters in full (Megatron's print of active parameters).

Beyond Megatron (named as such where defined): ``weight_and_optimizer_memory_by_rank`` applies the same
per-part terms to an explicit ``--pipeline-model-parallel-layout`` (every rank, not the formula's one), and
``gradient_bytes=2`` prices bf16 gradients (the ZeRO paper's 16 bytes) instead of Megatron's fp32 ones, so
that a model keeping bf16 gradients can be compared term for term.
"""

from __future__ import annotations

import dataclasses
import math
import re
from dataclasses import dataclass

MIB = 1024 * 1024


@dataclass(frozen=True)
class MegatronArgs:
    """The arguments the formula reads, named exactly as Megatron-LM's command-line parser names them."""

    num_layers: int
    hidden_size: int
    ffn_hidden_size: int
    num_attention_heads: int
    kv_channels: int
    padded_vocab_size: int
    tensor_model_parallel_size: int
    pipeline_model_parallel_size: int
    world_size: int
    num_query_groups: int | None = None
    """None: multi-head attention (Megatron's ``group_query_attention`` off)."""
    swiglu: bool = True
    normalization: str = "RMSNorm"
    untie_embeddings_and_output_weights: bool = True
    add_bias_linear: bool = False
    num_experts: int | None = None
    moe_ffn_hidden_size: int = 0
    moe_router_topk: int = 1
    moe_layer_freq: int | tuple[int, ...] = 1
    """An int k: every k-th layer (layer 0 first) is MoE; a tuple: 1 per MoE layer, one entry per layer."""
    moe_shared_expert_intermediate_size: int | None = None
    moe_shared_expert_gate: bool = False
    mtp_num_layers: int | None = None
    multi_latent_attention: bool = False
    q_lora_rank: int | None = None
    kv_lora_rank: int = 0
    qk_head_dim: int = 0
    qk_pos_emb_head_dim: int = 0
    v_head_dim: int = 0
    expert_model_parallel_size: int = 1
    expert_tensor_parallel_size: int = 1
    context_parallel_size: int = 1
    use_distributed_optimizer: bool = True
    seq_length: int = 4096
    micro_batch_size: int = 1
    virtual_pipeline_model_parallel_size: int | None = None
    sequence_parallel: bool = False
    recompute_granularity: str | None = None
    """None, "selective" or "full": with sequence_parallel and "selective", Megatron reports the SP formula."""

    @property
    def data_parallel_size(self) -> int:
        """Megatron's ``args.data_parallel_size``: world / (TP x PP x CP)."""
        model_parallel = self.tensor_model_parallel_size * self.pipeline_model_parallel_size
        return self.world_size // (model_parallel * self.context_parallel_size)

    @property
    def expert_data_parallel_size(self) -> int:
        """PR #4687's ``expert_data_parallel_size``: world // (ETP x EP x PP)."""
        expert_model = self.expert_tensor_parallel_size * self.expert_model_parallel_size
        return self.world_size // (expert_model * self.pipeline_model_parallel_size)


@dataclass(frozen=True)
class LayerTerms:
    """Parameters of one layer's parts (Megatron's local names), and the model-level ones."""

    attention: float
    dense_mlp: float
    shared_expert: float
    routed_expert: float
    """All routed experts of one MoE layer."""
    active_routed_expert: float
    layernorm: float
    router: float
    shared_expert_gate: float
    embedding: float
    """One vocab x hidden table (the input embedding; the untied output layer is another)."""
    final_layernorm: float
    num_dense_layers: int
    num_moe_layers: int
    mtp_num_dense_layers: int
    mtp_num_moe_layers: int


@dataclass(frozen=True)
class WeightOptimizerMemory:
    """Per-rank result of ``compute_weight_and_optimizer_memory`` with its named parts."""

    tp_sharded_params: float
    """On the most loaded rank: attention, dense MLP, shared experts, MTP block, embedding, all / TP."""
    replicated_params: float
    """On the most loaded rank: norms, routers, shared-expert gates (not divided by TP)."""
    expert_params: float
    """On the most loaded rank: routed experts / (ETP x EP)."""
    other_shard_params: float | None
    """Parameters on a rank other than the most loaded one (PP > 1), else None."""
    dense_bytes_per_param: float
    expert_bytes_per_param: float
    total_params: float
    active_params: float

    @property
    def params_on_rank(self) -> float:
        return self.tp_sharded_params + self.replicated_params + self.expert_params

    @property
    def dense_bytes(self) -> float:
        return (self.tp_sharded_params + self.replicated_params) * self.dense_bytes_per_param

    @property
    def expert_bytes(self) -> float:
        return self.expert_params * self.expert_bytes_per_param

    @property
    def total_bytes(self) -> float:
        """Megatron's ``weight_and_optimizer_memory`` (bytes)."""
        return self.dense_bytes + self.expert_bytes


def moe_layer_pattern(a: MegatronArgs) -> list[int]:
    """1 for an MoE layer, 0 for a dense one (Megatron's ``moe_layer_pattern``)."""
    if a.num_experts is None:
        return [0] * a.num_layers
    if isinstance(a.moe_layer_freq, int):
        return [1 if i % a.moe_layer_freq == 0 else 0 for i in range(a.num_layers)]
    if len(a.moe_layer_freq) != a.num_layers:
        raise ValueError(f"moe_layer_freq: {len(a.moe_layer_freq)} entries for {a.num_layers} layers")
    return list(a.moe_layer_freq)


def attention_params(a: MegatronArgs) -> float:
    """``self_attn_term``: MLA's low-rank projections (with their norms and the shared RoPE key), or
    q, k, v, o of GQA/MHA (no biases: the formula ignores them)."""
    norm_size = 1 if a.normalization == "RMSNorm" else 2
    if a.multi_latent_attention:
        qk = a.qk_head_dim + a.qk_pos_emb_head_dim
        if a.q_lora_rank is None:
            q_term = a.hidden_size * a.num_attention_heads * qk
        else:  # q down-projection, q norm, q up-projection
            q_term = a.q_lora_rank * (a.hidden_size + a.num_attention_heads * qk + norm_size)
        kv_term = a.kv_lora_rank * (a.hidden_size + a.num_attention_heads * (a.qk_head_dim + a.v_head_dim)
                                    + norm_size)
        rope_key = a.hidden_size * a.qk_pos_emb_head_dim
        out_proj = a.num_attention_heads * a.v_head_dim * a.hidden_size
        return q_term + kv_term + rope_key + out_proj
    groups = a.num_query_groups or a.num_attention_heads
    query_ratio = a.kv_channels * a.num_attention_heads / a.hidden_size
    return 2 * a.hidden_size * a.hidden_size * (1 + groups / a.num_attention_heads) * query_ratio


def layer_terms(a: MegatronArgs) -> LayerTerms:
    """The per-part parameter counts of PR #4687 (lines 'attention_params = ...' to 'router_params')."""
    pattern = moe_layer_pattern(a)
    num_moe = sum(pattern)
    mtp_layers = a.mtp_num_layers or 0
    mtp_moe = pattern[-1] * mtp_layers  # the MTP block is MoE when the decoder's last layer is
    norm_size = 1 if a.normalization == "RMSNorm" else 2
    gated = 3 / 2 if a.swiglu else 1
    moe_ffn = a.moe_ffn_hidden_size if a.num_experts is not None else 0
    experts = a.num_experts or 1
    shared_ffn = a.moe_shared_expert_intermediate_size or 0
    h = a.hidden_size
    is_moe = a.num_experts is not None
    return LayerTerms(
        attention=attention_params(a),
        dense_mlp=2 * h * a.ffn_hidden_size * gated,
        shared_expert=2 * h * shared_ffn * gated,
        routed_expert=2 * h * moe_ffn * experts * gated,
        active_routed_expert=2 * h * moe_ffn * a.moe_router_topk * gated if is_moe else 0,
        layernorm=2 * h * norm_size,
        router=(h * experts + (experts if a.add_bias_linear else 0)) if is_moe else 0,
        shared_expert_gate=h if shared_ffn > 0 and a.moe_shared_expert_gate else 0,
        embedding=h * a.padded_vocab_size,
        final_layernorm=norm_size * h,
        num_dense_layers=a.num_layers - num_moe, num_moe_layers=num_moe,
        mtp_num_dense_layers=mtp_layers - mtp_moe, mtp_num_moe_layers=mtp_moe,
    )


def bytes_per_param(a: MegatronArgs, data_parallel_size: int, gradient_bytes: int = 4) -> float:
    """bf16 weight 2 + fp32 gradient 4 + fp32 main weight 4 + Adam 8 = 18; the distributed optimizer
    shards the 12 bytes of main weight and moments over the data-parallel group. ``gradient_bytes`` 2 is
    not Megatron's (it accumulates bf16 training's gradients in fp32, arguments.py): it prices the
    ZeRO paper's bf16 gradients, for comparing with a model that keeps those."""
    weight_and_gradient = 2 + gradient_bytes
    return weight_and_gradient + (12 / data_parallel_size if a.use_distributed_optimizer else 12)


def model_params(a: MegatronArgs, t: LayerTerms) -> tuple[float, float]:
    """(total, active) parameters as Megatron prints them: decoder + MTP block + embedding (and output)."""
    moe_layer = t.attention + t.shared_expert + t.layernorm + t.router + t.shared_expert_gate
    dense_layer = t.attention + t.dense_mlp + t.layernorm
    embeddings = (2 if a.untie_embeddings_and_output_weights else 1) * t.embedding
    mtp = dense_layer * t.mtp_num_dense_layers + (moe_layer + t.routed_expert) * t.mtp_num_moe_layers
    decoder = dense_layer * t.num_dense_layers + t.final_layernorm
    total = decoder + (moe_layer + t.routed_expert) * t.num_moe_layers + mtp + embeddings
    active = decoder + (moe_layer + t.active_routed_expert) * t.num_moe_layers + mtp + embeddings
    return total, active


def weight_and_optimizer_memory(a: MegatronArgs) -> WeightOptimizerMemory:
    """PR #4687's ``compute_weight_and_optimizer_memory``, term by term, on the most loaded rank."""
    t = layer_terms(a)
    pp, tp = a.pipeline_model_parallel_size, a.tensor_model_parallel_size
    expert_split = a.expert_tensor_parallel_size * a.expert_model_parallel_size
    moe_replicated = t.layernorm + t.router + t.shared_expert_gate
    tp_block = ((t.attention + t.dense_mlp) * t.num_dense_layers
                + (t.attention + t.shared_expert) * t.num_moe_layers)
    replicated_block = t.layernorm * t.num_dense_layers + moe_replicated * t.num_moe_layers + t.final_layernorm
    expert_block = t.routed_expert * t.num_moe_layers
    tp_mtp = ((t.attention + t.dense_mlp) * t.mtp_num_dense_layers
              + (t.attention + t.shared_expert) * t.mtp_num_moe_layers)
    replicated_mtp = t.layernorm * t.mtp_num_dense_layers + moe_replicated * t.mtp_num_moe_layers
    expert_mtp = t.routed_expert * t.mtp_num_moe_layers

    tp_sharded = (tp_block / pp + tp_mtp + t.embedding) / tp
    if a.untie_embeddings_and_output_weights and pp == 1:
        tp_sharded += t.embedding / tp  # the output layer shares the only stage
    other = None
    if pp > 1:
        other = tp_block / (pp * tp) + replicated_block / pp + expert_block / (pp * expert_split)
    total, active = model_params(a, t)
    return WeightOptimizerMemory(
        tp_sharded_params=tp_sharded,
        replicated_params=replicated_block / pp + replicated_mtp,
        expert_params=(expert_block / pp + expert_mtp) / expert_split,
        other_shard_params=other,
        dense_bytes_per_param=bytes_per_param(a, a.data_parallel_size),
        expert_bytes_per_param=bytes_per_param(a, a.expert_data_parallel_size),
        total_params=total, active_params=active,
    )


def parse_layout(layout: str) -> list[list[str]]:
    """Megatron's ``--pipeline-model-parallel-layout`` string ('|' between virtual stages, E embedding,
    t decoder layer, m MTP layer, L loss (output layer), ``(x|)*n`` repeats) as a list of chunks."""
    expanded = re.sub(r"\(([^()]*)\)\*(\d+)", lambda g: g.group(1) * int(g.group(2)), layout)
    names = {"E": "embedding", "t": "decoder", "m": "mtp", "L": "loss"}
    unknown = set(expanded) - set(names) - {"|"}
    if unknown:
        raise ValueError(f"pipeline layout {layout!r}: unknown symbols {sorted(unknown)} (E, t, m, L, '|', (..|)*n)")
    return [[names[c] for c in chunk] for chunk in expanded.split("|")]


def weight_and_optimizer_memory_by_rank(a: MegatronArgs, chunks: list[list[str]],
                                        gradient_bytes: int = 4) -> list[float]:
    """Not Megatron's function: PR #4687's per-part terms and bytes per parameter applied to an explicit
    pipeline layout (virtual stage i on pipeline rank i mod PP), giving every rank's bytes instead of the
    formula's "1/PP of the layers + MTP + embedding" rank. The final norm goes with the loss chunk."""
    t = layer_terms(a)
    pattern = moe_layer_pattern(a)
    tp, pp = a.tensor_model_parallel_size, a.pipeline_model_parallel_size
    expert_split = a.expert_tensor_parallel_size * a.expert_model_parallel_size
    dense_b = bytes_per_param(a, a.data_parallel_size, gradient_bytes)
    expert_b = bytes_per_param(a, a.expert_data_parallel_size, gradient_bytes)

    def layer_bytes(is_moe: bool) -> float:
        if is_moe:
            return ((t.attention + t.shared_expert) / tp + t.layernorm + t.router + t.shared_expert_gate) * dense_b \
                + t.routed_expert / expert_split * expert_b
        return ((t.attention + t.dense_mlp) / tp + t.layernorm) * dense_b

    per_rank = [0.0] * pp
    layer = 0
    for i, chunk in enumerate(chunks):
        for item in chunk:
            if item == "decoder":
                per_rank[i % pp] += layer_bytes(bool(pattern[layer]))
                layer += 1
            elif item == "mtp":
                per_rank[i % pp] += layer_bytes(bool(pattern[-1]))
            elif item == "embedding":
                per_rank[i % pp] += t.embedding / tp * dense_b
            elif item == "loss":
                output = t.embedding / tp if a.untie_embeddings_and_output_weights else 0
                per_rank[i % pp] += (output + t.final_layernorm) * dense_b
    if layer != a.num_layers:
        raise ValueError(f"pipeline layout: {layer} decoder layers for num_layers={a.num_layers}")
    return per_rank


def _pipeline_factor(a: MegatronArgs, num_microbatches: int | None) -> float:
    """The interleaved schedule's penalty 1 + (pp - 1) / (pp vpp), or, without interleaving, the share
    min(1, m / pp) of the pp micro-batches a short step has in flight (both activation functions)."""
    pp, vpp = a.pipeline_model_parallel_size, a.virtual_pipeline_model_parallel_size
    if vpp is not None:
        return 1 + (pp - 1) / (pp * vpp)
    if pp > 1 and num_microbatches is not None:
        return min(1, num_microbatches / pp)
    return 1.0


def activation_memory_with_sp(a: MegatronArgs, num_microbatches: int | None) -> float:
    """Megatron's ``compute_activation_memory`` (bytes on the first stage; SP + selective recomputation):
    s b h (18 + 4 ffn / h) per layer (Korthikanti Table 2) x all layers (PP ranks' worth of micro-batches
    in flight), embedding input and dropout, the schedule's factor, / TP."""
    s, b, h, pp = a.seq_length, a.micro_batch_size, a.hidden_size, a.pipeline_model_parallel_size
    memory = s * b * h * (18 + 4 * a.ffn_hidden_size / h) * a.num_layers
    memory += 8 * s * b * pp  # input to the embedding, pp micro-batches in flight
    memory += s * b * h * pp  # embedding dropout mask
    memory *= _pipeline_factor(a, num_microbatches)
    if pp == 1:  # inputs to the output layer and the cross-entropy
        memory += s * b * h * 4 * (1 + a.padded_vocab_size / h)
    return memory / a.tensor_model_parallel_size


def activation_memory_without_sp(a: MegatronArgs, num_microbatches: int | None) -> float:
    """Megatron's ``compute_activation_memory_without_sp`` (bytes on the first stage): s b h (10 + 24 / t)
    per layer x all layers, embedding input and dropout, the schedule's factor, the logits when PP = 1,
    and 5% for temporaries. Not divided by TP again (the 24 / t term is the sharded part)."""
    s, b, h, pp = a.seq_length, a.micro_batch_size, a.hidden_size, a.pipeline_model_parallel_size
    tp = a.tensor_model_parallel_size
    memory = s * b * h * (10 + 24 / tp) * a.num_layers
    memory += 8 * s * b * pp
    memory += s * b * h * pp
    memory *= _pipeline_factor(a, num_microbatches)
    if pp == 1:  # logits (sharded over TP) and the final norm's output, 2 bytes each
        memory += (s * b * a.padded_vocab_size / tp + s * b * h) * 2
    return memory * 1.05


def reported_activation_memory(a: MegatronArgs, num_microbatches: int | None) -> float:
    """The activation term ``report_theoretical_memory`` adds: the SP formula with sequence parallelism and
    selective recomputation, the without-SP formula otherwise."""
    if a.sequence_parallel and a.recompute_granularity == "selective":
        return activation_memory_with_sp(a, num_microbatches)
    return activation_memory_without_sp(a, num_microbatches)


def megatron_args_for(model, *, tp: int, pp: int, world_size: int, ep: int = 1, etp: int = 1, cp: int = 1,
                      vpp: int | None = None, seq_length: int | None = None, micro_batch_size: int = 1,
                      distributed_optimizer: bool = True, sequence_parallel: bool = False,
                      recompute_granularity: str | None = None) -> MegatronArgs:
    """The Megatron arguments of an autoplan ``ModelSpec`` (autoplan/schema/model.py) under a layout, as
    Megatron-Bridge's DeepSeek/Qwen/Mixtral providers set them (vocab padded to 128 x TP)."""
    moe, mla = model.moe, model.mla
    llama = model.architecture == "llama"
    fields = dict(
        num_layers=model.num_layers, hidden_size=model.hidden_size, ffn_hidden_size=model.ffn_hidden_size,
        num_attention_heads=model.num_attention_heads, kv_channels=model.head_dim,
        num_query_groups=None if model.num_kv_heads == model.num_attention_heads else model.num_kv_heads,
        padded_vocab_size=model.padded_vocab_size(tp), swiglu=llama,
        normalization="RMSNorm" if llama else "LayerNorm",
        untie_embeddings_and_output_weights=not model.tie_embeddings, add_bias_linear=not llama,
        mtp_num_layers=model.mtp_layers or None,
        tensor_model_parallel_size=tp, pipeline_model_parallel_size=pp, world_size=world_size,
        expert_model_parallel_size=ep, expert_tensor_parallel_size=etp, context_parallel_size=cp,
        use_distributed_optimizer=distributed_optimizer, seq_length=seq_length or model.seq_len,
        micro_batch_size=micro_batch_size, virtual_pipeline_model_parallel_size=vpp,
        sequence_parallel=sequence_parallel, recompute_granularity=recompute_granularity,
    )
    if moe is not None:
        fields.update(
            num_experts=moe.num_experts, moe_ffn_hidden_size=moe.expert_ffn_size,
            moe_router_topk=moe.experts_per_token,
            moe_layer_freq=tuple(int(moe.is_moe_layer(i)) for i in range(model.num_layers)),
            moe_shared_expert_intermediate_size=moe.shared_width or None,
            moe_shared_expert_gate=moe.shared_expert_gate)
    if mla is not None:
        fields.update(multi_latent_attention=True, q_lora_rank=mla.q_lora_rank, kv_lora_rank=mla.kv_lora_rank,
                      qk_head_dim=mla.qk_nope_head_dim, qk_pos_emb_head_dim=mla.qk_rope_head_dim,
                      v_head_dim=mla.v_head_dim, num_query_groups=None)
    return MegatronArgs(**fields)


def with_changes(a: MegatronArgs, **changes) -> MegatronArgs:
    return dataclasses.replace(a, **changes)


def in_flight_microbatches(a: MegatronArgs) -> int:
    """Micro-batches whose activations the first stage holds (Megatron's verbose print)."""
    pp, vpp = a.pipeline_model_parallel_size, a.virtual_pipeline_model_parallel_size
    if vpp is None:
        return pp
    return math.ceil((1 + (pp - 1) / (pp * vpp)) * pp)
