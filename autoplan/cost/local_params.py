"""How many parameters one device of each pipeline rank holds: tensor by tensor, exactly as the runtime's
DTensor TP and FSDP2 shard them, so that ``autoplan run --dry-run`` can compare a built rank with the plan.

Per tensor: the TP split divides one dimension by tp (column-parallel matrices, their biases and the
vocabulary-parallel embedding/head on dim 0; row-parallel matrices on dim 1; norms and row-parallel
biases stay whole, runtime/parallel/tensor_parallel.py). Under ZeRO-3 FSDP2 then cuts the TP-local
tensor's dim 0 into dp x cp chunks of ceil(rows / (dp x cp)) (FSDP2 runs over the flattened dp x cp
mesh: context-parallel ranks hold the same parameters) and allocates that padded chunk on every rank
(``FSDPParam.padded_sharded_param_size``), so every device of a pipeline rank holds the same count.
Under ZeRO 0-2 a device holds its TP-local tensors whole for forward and backward (FSDP2 without
resharding after forward), which is the count the ZeRO-1/2 memory model assumes.

Mixture-of-Experts blocks (``model.is_moe_block(layer)``; runtime/models/moe.py): attention and norms as a dense
block; the router [E, h] whole on every TP rank (each TP rank routes its own sequence slice); the routed experts
as three [E, ., .] tensors split on dim 0 over the ep ranks (E/ep experts each) and on their width F over the
etp ranks (gate and up [E, F, H] by columns, down [E, H, F] by rows: runtime/parallel/expert_parallel.py) and,
under ZeRO-3, cut by FSDP2 over the expert-data-parallel group (edp = tp x cp x dp / (ep x etp) ranks,
runtime/parallel/data_parallel.py) into ceil(E/ep / edp) padded rows; the shared experts a
SwiGLU MLP of width ``moe.shared_width``, split over TP like the dense MLP.

The shapes restate runtime/models (gpt.py, llama.py, moe.py); tests/runtime compare this count with the
built modules. Qwen2's q/k/v biases split with their weights; Qwen3's per-head q/k norm weights stay whole
(each TP rank normalises its own heads with the same weights). GPT's learned position table has
``model.position_rows(training.seq_len)`` rows (``max_positions``, else the training length), as built;
the embedding and head have ``model.padded_vocab_size(tp)`` rows (Megatron's padding, the plan's
``padded_vocab_size``), which the runtime builds too (runtime/models/common.py: padded logits masked).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from autoplan.schema import Layout, ModelSpec, TrainingSetup


@dataclass(frozen=True)
class ParamTensor:
    shape: tuple[int, ...]
    tp_dim: int | None
    """The dimension TP splits (a routed-expert weight: the width dimension etp splits), or None for a tensor
    every TP rank holds whole."""
    expert: bool = False
    """A routed-expert weight [E, ., .]: dim 0 split over ep, ``tp_dim`` over etp, ZeRO over edp instead of dp x cp."""


def block_tensors(model: ModelSpec, layer: int = 0) -> list[ParamTensor]:
    """The parameters of block ``layer`` (an MoE block's: ``moe_block_tensors``)."""
    if model.is_moe_block(layer):
        return moe_block_tensors(model)
    h, f = model.hidden_size, model.ffn_hidden_size
    col, row, whole = 0, 1, None
    if model.architecture == "gpt":  # q, k, v, o are all [h, h] with biases (runtime/models/gpt.py)
        norms = [ParamTensor((h,), whole)] * 4  # two LayerNorms, weight and bias
        attn = [ParamTensor((h, h), col), ParamTensor((h,), col)] * 3 + [ParamTensor((h, h), row),
                                                                          ParamTensor((h,), whole)]
        mlp = [ParamTensor((f, h), col), ParamTensor((f,), col), ParamTensor((h, f), row), ParamTensor((h,), whole)]
        return norms + attn + mlp
    mlp = [ParamTensor((f, h), col), ParamTensor((f, h), col), ParamTensor((h, f), row)]
    return llama_attention_tensors(model) + mlp


def llama_attention_tensors(model: ModelSpec) -> list[ParamTensor]:
    """A Llama block's two RMSNorm weights and attention (q, k, v column-parallel, o row-parallel)."""
    h, q, kv = model.hidden_size, model.q_size, model.kv_size
    col, row, whole = 0, 1, None
    norms = [ParamTensor((h,), whole)] * 2  # two RMSNorms
    attn = [ParamTensor((q, h), col), ParamTensor((kv, h), col), ParamTensor((kv, h), col), ParamTensor((h, q), row)]
    if model.qkv_bias:
        attn += [ParamTensor((q,), col), ParamTensor((kv,), col), ParamTensor((kv,), col)]
    if model.qk_norm:
        attn += [ParamTensor((model.head_dim,), whole)] * 2
    return norms + attn


def moe_block_tensors(model: ModelSpec) -> list[ParamTensor]:
    """A Llama MoE block: norms and attention, then the router (whole), the routed experts (``expert``) and
    the shared experts (TP-split like the dense MLP)."""
    moe, h = model.moe, model.hidden_size
    e, f, s = moe.num_experts, moe.expert_ffn_size, moe.shared_width
    routed = [ParamTensor((e, f, h), 1, True), ParamTensor((e, f, h), 1, True), ParamTensor((e, h, f), 2, True)]
    shared = [ParamTensor((s, h), 0), ParamTensor((s, h), 0), ParamTensor((h, s), 1)] if s else []
    return llama_attention_tensors(model) + [ParamTensor((e, h), None)] + routed + shared


def embedding_tensors(model: ModelSpec, seq_len: int, tp: int = 1) -> list[ParamTensor]:
    tok = [ParamTensor((model.padded_vocab_size(tp), model.hidden_size), 0)]
    positions = ParamTensor((model.position_rows(seq_len), model.hidden_size), None)
    return tok + ([positions] if model.architecture == "gpt" else [])


def head_tensors(model: ModelSpec, separate_copy: bool, tp: int = 1) -> list[ParamTensor]:
    """Final norm and output projection; a tied projection is the embedding's unless the last stage is
    on another pipeline rank, which then keeps its own copy."""
    h = model.hidden_size
    norm = [ParamTensor((h,), None)] * (2 if model.architecture == "gpt" else 1)
    projection = [ParamTensor((model.padded_vocab_size(tp), h), 0)]
    return norm + (projection if separate_copy or not model.tie_embeddings else [])


def local_numel(t: ParamTensor, tp: int, dp: int, zero_stage: int, ep: int = 1, edp: int = 1, etp: int = 1) -> int:
    """Elements of ``t`` on one device: its TP (or, for an expert weight, EP x ETP) slice, then its ZeRO-3 chunk
    over dp x cp (an expert weight: over edp)."""
    shape = list(t.shape)
    if t.expert:
        shape[0] //= ep
        tp, dp = etp, edp
    if t.tp_dim is not None:
        shape[t.tp_dim] //= tp
    if zero_stage == 3:
        shape[0] = math.ceil(shape[0] / dp)
    return math.prod(shape)


def local_params_per_rank(model: ModelSpec, layout: Layout, training: TrainingSetup) -> tuple[int, ...]:
    """Parameters one device of each pipeline rank holds (see Predicted.local_params_per_rank)."""
    last = layout.num_stages - 1
    counts = []
    for rank in range(layout.pp):
        tensors: list[ParamTensor] = []
        for stage in (s for s in layout.stages if s.rank == rank):  # the schedule places them (loop or V)
            for layer in range(*stage.layers):
                tensors += block_tensors(model, layer)
            if stage.index == 0:
                tensors += embedding_tensors(model, training.seq_len, layout.tp)
            if stage.index == last:
                tensors += head_tensors(model, separate_copy=layout.pp > 1, tp=layout.tp)
        dims = layout.dims
        counts.append(sum(local_numel(t, layout.tp, layout.dp_cp, layout.zero_stage, dims.ep, dims.edp, dims.etp)
                          for t in tensors))
    return tuple(counts)
