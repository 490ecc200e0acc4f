"""Context parallelism: the ranks of a CP group split every sequence and run attention as a ring.

Sharding (torch's ``_HeadTailLoadBalancer``, the default of ``context_parallel`` whenever seq_len is
divisible by 2 cp): the sequence is cut into 2 cp chunks of c = s / (2 cp) tokens and CP rank r keeps
chunks r and 2cp-1-r, in that order, so every rank does the same share of the causal work. Tokens,
targets, learned positions (GPT) and rotary angles (Llama) use those global positions
(``shard_positions``); every other op is per token and runs unchanged on the rank's s / cp tokens. The
loss of a rank is the mean over its tokens; all ranks hold the same number, so averaging gradients over
the dp x cp ranks (runtime/parallel/data_parallel.py on the flattened mesh, as torchtitan's
dp_shard_cp) gives the gradient of the whole sequence's mean, and the logged loss is that average too.

Ring attention: why not torch's ``context_parallel`` itself. In torch 2.13 it routes SDPA through DTensor
only for the CUDA kernels (flash, memory-efficient, cuDNN); on a CPU it fails ("Operator
aten._scaled_dot_product_flash_attention_for_cpu.default does not have a sharding strategy
registered"), so it cannot run on gloo. ``RingAttention`` below therefore runs torch's own ring loop --
``_templated_ring_attention`` and ``_templated_ring_attention_backward``, the functions
``context_parallel`` dispatches to (private, torch/distributed/tensor/experimental/_context_parallel/
_attention.py) -- in our autograd Function, with the device's fused SDPA kernel that returns its
log-sum-exp: the flash kernel for CPU on a CPU, flash (bf16/fp16) or memory-efficient (fp32) on CUDA,
as torch's dispatcher picks. The ring, its load balancing, its K/V all-gather and dK/dV ring, and the
log-sum-exp merge are torch's on every device (what autoplan/cost/context_parallel.py models); only the
kernel choice and the autograd wrapper are ours. Written for CUDA too, run only on CPU here.

Dropout: the ring's kernels would draw attention-dropout masks per ring step, which cannot equal the
serial run's, so plans with cp > 1 need dropout 0 (autoplan/schema/plan.py refuses otherwise).
"""

from __future__ import annotations

import functools

import torch
from torch import nn
from torch.profiler import record_function
from torch.distributed.tensor.experimental._context_parallel._attention import (
    _cp_options, _templated_ring_attention, _templated_ring_attention_backward,
)

from runtime.models.common import AttentionCore

SEQ_DIM = 2  # q, k, v are [B, heads, T, head_dim]
RING_LABEL = "autoplan:ring_attention"  # runtime/train/trace_phases.py's RING
aten = torch.ops.aten


def shard_positions(seq_len: int, cp: int, cp_rank: int) -> list[int]:
    """Global positions of CP rank ``cp_rank``'s tokens, in the order it holds them: chunk r then chunk
    2cp-1-r of 2 cp equal chunks (torch's head-tail load balancer, sharded as ``Shard(seq)``)."""
    if seq_len % (2 * cp):
        raise ValueError(f"seq_len {seq_len} is not divisible by 2 * cp = {2 * cp}")
    c = seq_len // (2 * cp)
    head, tail = cp_rank * c, (2 * cp - 1 - cp_rank) * c
    return list(range(head, head + c)) + list(range(tail, tail + c))


class _CpuKernel:
    """``aten._scaled_dot_product_flash_attention_for_cpu``: returns (out, lse); takes grouped K/V."""

    grad_out_name = "grad_out"

    @staticmethod
    def forward(query, key, value, is_causal, **_):
        return aten._scaled_dot_product_flash_attention_for_cpu(query, key, value, 0.0, is_causal)

    @staticmethod
    def backward(grad_out, query, key, value, out, logsumexp, is_causal, **_):
        return aten._scaled_dot_product_flash_attention_for_cpu_backward(
            grad_out, query, key, value, out, logsumexp, 0.0, is_causal)

    @staticmethod
    def backward_kwargs(rest) -> dict:
        return {}


def _expand(x: torch.Tensor, heads: int) -> torch.Tensor:
    """K/V [B, kv, T, d] -> [B, heads, T, d] (what SDPA's enable_gqa does for kernels without GQA)."""
    return x if x.shape[1] == heads else x.repeat_interleave(heads // x.shape[1], dim=1)


def _fold(grad: torch.Tensor, kv_heads: int) -> torch.Tensor:
    """The gradient of an expanded K/V summed back over each group of query heads."""
    return grad if grad.shape[1] == kv_heads else grad.unflatten(1, (kv_heads, -1)).sum(2)


class _CudaFlashKernel:
    """``aten._scaled_dot_product_flash_attention`` (bf16/fp16), called as torch's ring flash path calls it."""

    grad_out_name = "grad_out"

    @staticmethod
    def forward(query, key, value, is_causal, **_):
        heads = query.shape[1]
        return aten._scaled_dot_product_flash_attention(query, _expand(key, heads), _expand(value, heads), 0.0,
                                                        is_causal, False)

    @staticmethod
    def backward(grad_out, query, key, value, out, logsumexp, is_causal, **kw):
        heads, kv = query.shape[1], key.shape[1]
        dq, dk, dv = aten._scaled_dot_product_flash_attention_backward(
            grad_out, query, _expand(key, heads), _expand(value, heads), out, logsumexp, kw["cum_seq_q"],
            kw["cum_seq_k"], query.shape[SEQ_DIM], key.shape[SEQ_DIM], 0.0, is_causal, kw["philox_seed"],
            kw["philox_offset"])
        return dq, _fold(dk, kv), _fold(dv, kv)

    @staticmethod
    def backward_kwargs(rest) -> dict:
        # forward outputs after (out, lse): cum_seq_q, cum_seq_k, max_q, max_k, rng_state, unused, debug mask
        return {"cum_seq_q": rest[0], "cum_seq_k": rest[1], "philox_seed": rest[4], "philox_offset": rest[5]}


class _CudaEfficientKernel:
    """``aten._scaled_dot_product_efficient_attention`` (fp32 on CUDA), as torch's ring efficient path."""

    grad_out_name = "grad_out_"

    @staticmethod
    def forward(query, key, value, is_causal, **_):
        heads = query.shape[1]
        return aten._scaled_dot_product_efficient_attention(query, _expand(key, heads), _expand(value, heads), None,
                                                            True, 0.0, is_causal)

    @staticmethod
    def backward(grad_out_, query, key, value, out, logsumexp, is_causal, **kw):
        heads, kv = query.shape[1], key.shape[1]
        dq, dk, dv, _ = aten._scaled_dot_product_efficient_attention_backward(
            grad_out_, query, _expand(key, heads), _expand(value, heads), None, out, logsumexp, kw["philox_seed"],
            kw["philox_offset"], 0.0, (True, True, True, False), is_causal)
        return dq, _fold(dk, kv), _fold(dv, kv)

    @staticmethod
    def backward_kwargs(rest) -> dict:
        return {"philox_seed": rest[0], "philox_offset": rest[1]}  # forward outputs after (out, lse)


def _kernel_for(q: torch.Tensor):
    if q.device.type == "cuda":
        return _CudaEfficientKernel if q.dtype == torch.float32 else _CudaFlashKernel
    return _CpuKernel


class RingAttention(torch.autograd.Function):
    """Causal attention of this rank's queries against every rank's keys: q [B, h, T/cp, d], k and v
    [B, kv, T/cp, d] (h % kv == 0), each rank holding its ``shard_positions`` tokens; returns the output
    for its queries. ``group``: the CP group's ProcessGroup."""

    @staticmethod
    def forward(ctx, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, group) -> torch.Tensor:
        if not _cp_options.enable_load_balance:
            raise RuntimeError("torch's context-parallel load balancing is off (_cp_options.enable_load_balance); "
                               "the runtime shards sequences head-tail and needs it on")
        kernel = _kernel_for(q)
        with record_function(RING_LABEL):  # --trace: its collectives are cp_comm (runtime/train/trace_phases.py)
            out, lse, *rest = _templated_ring_attention(group, SEQ_DIM, kernel.forward, q, k, v, is_causal=True)
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.group, ctx.kernel, ctx.rest = group, kernel, rest
        return out

    @staticmethod
    def backward(ctx, grad_out: torch.Tensor):
        q, k, v, out, lse = ctx.saved_tensors
        kernel = ctx.kernel
        with record_function(RING_LABEL):
            dq, dk, dv, *_ = _templated_ring_attention_backward(
                ctx.group, SEQ_DIM, kernel.backward, grad_out.contiguous(), kernel.grad_out_name, q, k, v, out, lse,
                is_causal=True, **kernel.backward_kwargs(ctx.rest))
        return dq, dk, dv, None


def ring_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, group) -> torch.Tensor:
    return RingAttention.apply(q, k, v, group)


def apply_context_parallel(model: nn.Module, cp_group, positions: torch.Tensor) -> None:
    """Make ``model`` (a full model or a stage) compute on one CP rank's tokens: its attention cores run
    the ring over ``cp_group`` and every module that reads token positions (``positions`` attribute:
    GPT's embedding, Llama's rotary attention) reads the rank's global ``positions``."""
    for module in model.modules():
        if isinstance(module, AttentionCore):
            module.ring = functools.partial(ring_attention, group=cp_group)
        elif hasattr(module, "positions"):
            module.positions = positions


def shard_sequence(batch: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    """Token ids or targets [B, T] -> this CP rank's [B, T / cp] (its positions, in its order)."""
    return batch.index_select(1, positions).contiguous()
