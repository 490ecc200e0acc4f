"""FLOPs of a transformer, counted the way Megatron-LM counts them.

A multiply-add is 2 FLOPs. Attention scores and attention-over-V are counted in full (not halved for the
causal mask), as in Narayanan et al. 2021 Eq. 3 and Korthikanti et al. 2022 Eq. 7, so that the MFU printed
here is comparable with theirs. Backward = 2 x forward. Model FLOPs exclude recomputation; hardware FLOPs
include it (Korthikanti Eq. 8: selective adds the attention core again, full adds the whole forward;
cost/estimate.py counts those from the per-layer costs, so that profiled models get them too).
"""

from __future__ import annotations

from dataclasses import dataclass

from autoplan.schema import ModelSpec


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


def block_fwd_flops(model: ModelSpec, b: int, s: int) -> BlockFlops:
    """GPT with ffn = 4h gives 24 b s h^2 + 4 b s^2 h (Narayanan 2021, section 5.1). q = q_size, the width of
    the queries and of o's input (h unless head_dim is decoupled, Qwen3); biases and norms are not counted."""
    h, f, q, kv = model.hidden_size, model.ffn_hidden_size, model.q_size, model.kv_size
    tokens = b * s
    return BlockFlops(
        qkv=2 * tokens * h * (q + 2 * kv),
        out_proj=2 * tokens * q * h,
        mlp=2 * tokens * h * f * model.mlp_matrices,
        attn_core=4 * b * s * s * q,
    )


def logits_fwd_flops(model: ModelSpec, b: int, s: int, vocab: int | None = None) -> float:
    """The output projection over ``vocab`` rows (default: the unpadded vocabulary)."""
    return 2.0 * b * s * model.hidden_size * (vocab or model.vocab_size)


def model_flops_per_step(model: ModelSpec, global_batch: int, s: int, vocab: int | None = None) -> float:
    """3 x forward (forward + 2 x backward) over the global batch: Korthikanti Eq. 7."""
    block = block_fwd_flops(model, global_batch, s).total
    return 3.0 * (model.num_layers * block + logits_fwd_flops(model, global_batch, s, vocab))


def narayanan_flops_per_step(model: ModelSpec, global_batch: int, s: int) -> float:
    """Narayanan et al. 2021 Eq. 3 (full recomputation counted), for comparing with their Table 1."""
    l, h, v = model.num_layers, model.hidden_size, model.vocab_size
    return 96.0 * global_batch * s * l * h * h * (1 + s / (6 * h) + v / (16 * l * h))
