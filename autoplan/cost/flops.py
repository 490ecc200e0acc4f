"""FLOPs of a transformer, counted the way Megatron-LM counts them.

A multiply-add is 2 FLOPs. Attention scores and attention-over-V are counted in full (not halved for the
causal mask), as in Narayanan et al. 2021 Eq. 3 and Korthikanti et al. 2022 Eq. 7, so that the MFU printed
here is comparable with theirs. Backward = 2 x forward. Model FLOPs exclude recomputation; hardware FLOPs
include it (Korthikanti Eq. 8: selective adds the attention core again, full adds the whole forward;
cost/estimate.py counts those from the per-layer costs, so that profiled models get them too).

Mixture-of-Experts blocks count their active parameters, as Megatron-LM's ``num_floating_point_operations``
(megatron/training/training.py: router, top-k experts, shared experts) and DeepSeek-V3's MFU do: a token
passes the router and k experts, not all E. Multi-head latent attention counts its low-rank projections and a
core of 2 b s^2 heads (d_qk + d_v). Under a sliding window w < s (Mistral, GPT-OSS) a query attends to at
most w keys: the square s^2 becomes s x ``attended_keys``, the same count of the causal band (twice its
pairs, as s^2 is twice the causal triangle's). The multi-token-prediction modules (DeepSeek-V3) add their block, eh_proj
[2h -> h] and a second output projection each.
"""

from __future__ import annotations

from dataclasses import dataclass

from autoplan.schema import ModelSpec


def attended_keys(model: ModelSpec, s: int, layer: int | None = None) -> float | None:
    """Keys per query in Megatron's count for block ``layer`` (None: averaged over the blocks, as the planner
    prices one block for all): 2 x (s w - w (w - 1) / 2) / s for a windowed block (each query sees itself
    and the w - 1 before it), s for a full one. None when no block's window is shorter than the sequence."""
    w = model.sliding_window
    if w is None or w >= s:
        return None
    windowed = 2.0 * (s * w - w * (w - 1) / 2) / s
    if layer is not None:
        return windowed if model.is_windowed(layer) else float(s)
    share = model.windowed_layers() / model.num_layers
    return share * windowed + (1 - share) * s


@dataclass(frozen=True)
class BlockFlops:
    """Forward FLOPs of one transformer block for b sequences of s tokens (whole block, before TP)."""

    qkv: float
    out_proj: float
    mlp: float
    attn_core: float
    """QK^T scores and attention-over-V: 4 b s^2 q (q = heads x head_dim, h unless head_dim is decoupled)."""

    @property
    def matmuls(self) -> float:
        return self.qkv + self.out_proj + self.mlp

    @property
    def total(self) -> float:
        return self.matmuls + self.attn_core


def block_fwd_flops(model: ModelSpec, b: int, s: int, layer: int | None = None) -> BlockFlops:
    """GPT with ffn = 4h gives 24 b s h^2 + 4 b s^2 h (Narayanan 2021, section 5.1). q = q_size, the width of
    the queries and of o's input (h unless head_dim is decoupled, Qwen3); biases and norms are not counted.
    ``layer`` (0-based; None: a dense block): an MoE block's MLP counts the router, k experts and the shared
    ones; MLA's attention its own projections and core."""
    h, f, q, kv = model.hidden_size, model.ffn_hidden_size, model.q_size, model.kv_size
    tokens = b * s
    keys = attended_keys(model, s, layer)
    square = s * s if keys is None else s * keys
    mlp = 2 * tokens * h * f * model.mlp_matrices
    if layer is not None and model.is_moe_block(layer):
        moe = model.moe
        mlp = 2 * tokens * h * (moe.num_experts + 3 * moe.experts_per_token * moe.expert_ffn_size
                                + 3 * moe.shared_width)
    if model.mla is not None:
        return _mla_block_flops(model, b, s, mlp, square)
    return BlockFlops(
        qkv=2 * tokens * h * (q + 2 * kv),
        out_proj=2 * tokens * q * h,
        mlp=mlp,
        attn_core=4 * b * square * q,
    )


def _mla_block_flops(model: ModelSpec, b: int, s: int, mlp: float, square: float) -> BlockFlops:
    """MLA: q down and up (or one q projection), kv down (with the RoPE key) and up, o; core 2 b s^2 a (d_qk + d_v)."""
    mla, h, a, tokens = model.mla, model.hidden_size, model.num_attention_heads, b * s
    q_width = a * mla.qk_head_dim
    q = h * q_width if mla.q_lora_rank is None else mla.q_lora_rank * (h + q_width)
    kv = h * (mla.kv_lora_rank + mla.qk_rope_head_dim) + mla.kv_lora_rank * a * (mla.qk_nope_head_dim + mla.v_head_dim)
    return BlockFlops(qkv=2 * tokens * (q + kv), out_proj=2 * tokens * a * mla.v_head_dim * h, mlp=mlp,
                      attn_core=2 * b * square * a * (mla.qk_head_dim + mla.v_head_dim))


def logits_fwd_flops(model: ModelSpec, b: int, s: int, vocab: int | None = None) -> float:
    """The output projection over ``vocab`` rows (default: the unpadded vocabulary)."""
    return 2.0 * b * s * model.hidden_size * (vocab or model.vocab_size)


def model_flops_per_step(model: ModelSpec, global_batch: int, s: int, vocab: int | None = None) -> float:
    """3 x forward (forward + 2 x backward) over the global batch: Korthikanti Eq. 7; MoE blocks by their active
    parameters, and the multi-token-prediction modules (block, eh_proj, a second output projection)."""
    logits = logits_fwd_flops(model, global_batch, s, vocab)
    if model.moe is None and model.mla is None and not model.mtp_layers:
        block = block_fwd_flops(model, global_batch, s).total
        return 3.0 * (model.num_layers * block + logits)
    blocks = sum(block_fwd_flops(model, global_batch, s, layer).total for layer in range(model.num_layers))
    h = model.hidden_size
    mtp = sum(block_fwd_flops(model, global_batch, s, model.num_layers + i).total + 2 * global_batch * s * 2 * h * h
              + logits for i in range(model.mtp_layers))
    return 3.0 * (blocks + logits + mtp)


def narayanan_flops_per_step(model: ModelSpec, global_batch: int, s: int) -> float:
    """Narayanan et al. 2021 Eq. 3 (full recomputation counted), for comparing with their Table 1."""
    l, h, v = model.num_layers, model.hidden_size, model.vocab_size
    return 96.0 * global_batch * s * l * h * h * (1 + s / (6 * h) + v / (16 * l * h))
