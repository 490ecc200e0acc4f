"""What attention keeps for backward when traced on ``meta``.

On the meta device ``F.scaled_dot_product_attention`` has no fused kernel and decomposes to the math
path (``bmm``, ``_safe_softmax``, ``bmm``), which saves the b x a x s x s probability matrix; the real
CPU and GPU flash kernels keep only q, k, v, the output and an fp32 log-sum-exp of b x a x s. So on meta
we *patch* SDPA (the brief allowed patching or an analytic term; patching keeps the rest of the trace
honest, e.g. HF's repeat_kv copies): ``FlashEmulatedSDPA`` runs the math SDPA without grad (so the traced
FLOPs, 4 b s^2 h, stay those of the full score matrix) and saves exactly what the flash kernel saves.
The profile records this as ``attention_memory: flash-emulated``.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator

import torch
import torch.nn.functional as F

_ORIGINAL_SDPA = F.scaled_dot_product_attention


SdpaListener = Callable[[bool, torch.Tensor, torch.Tensor], None]
"""(entering, q, k): called around the math of each emulated SDPA call, so a tracer can tell its ops apart."""


class FlashEmulatedSDPA(torch.autograd.Function):
    """Forward = math SDPA; saved = (q, k, v, out, logsumexp[b, a, s] fp32), as the flash kernels keep.

    The output takes the memory layout of q, as torch's CPU flash kernel gives it: when q is a transposed
    [b, s, a, d] view (GPT) the block's later ``transpose(1, 2).reshape`` is a view of the saved output; when
    q is contiguous [b, a, s, d] (after RoPE, Llama) that reshape copies, and the output projection keeps a
    second e*s*b*h tensor. Measured on CPU in ``benchmarks/profile_saved_bytes.py``.
    """

    @staticmethod
    def forward(ctx, q, k, v, kwargs, listener):  # type: ignore[override]
        if listener is not None:
            listener(True, q, k)
        with torch.no_grad():
            out = torch.empty_like(q).copy_(_ORIGINAL_SDPA(q, k, v, **kwargs))
        if listener is not None:
            listener(False, q, k)
        lse = torch.empty(q.shape[:-1], dtype=torch.float32, device=q.device)
        ctx.save_for_backward(q, k, v, out, lse)
        return out

    @staticmethod
    def backward(ctx, grad_out):  # type: ignore[override]
        q, k, v, _, _ = ctx.saved_tensors  # meta only: shapes are all backward needs to produce
        return torch.zeros_like(q), torch.zeros_like(k), torch.zeros_like(v), None, None


def _emulated(listener: SdpaListener | None):
    def sdpa(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False):
        kwargs = dict(attn_mask=attn_mask, dropout_p=dropout_p, is_causal=is_causal, scale=scale,
                      enable_gqa=enable_gqa)
        if not torch.is_grad_enabled() or not (query.requires_grad or key.requires_grad or value.requires_grad):
            return _ORIGINAL_SDPA(query, key, value, **kwargs)
        return FlashEmulatedSDPA.apply(query, key, value, kwargs, listener)
    return sdpa


@contextlib.contextmanager
def flash_emulated_sdpa(listener: SdpaListener | None = None) -> Iterator[None]:
    """Replace ``F.scaled_dot_product_attention`` (and ``torch.nn.functional``'s alias) while tracing;
    ``listener`` hears each call (trace.py uses it to price the call as one attention kernel)."""
    F.scaled_dot_product_attention = _emulated(listener)
    try:
        yield
    finally:
        F.scaled_dot_product_attention = _ORIGINAL_SDPA
