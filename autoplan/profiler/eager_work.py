"""What a layer's eager ops cost the host and memory traffic, counted on the meta device, forward and backward.

The cost model prices two things a stack that runs a layer op by op pays (cost/layer_ops.py): the host
time of every eager op (``HostOps``: compute ops and views, forward and backward) and, on an eager stack,
the bytes every memory-bound op reads and writes (``LayerOps.eager_bytes``). For a spec the counts come
from the runtime's layers (cost/analytic_ops.py ``HOST_OP_COUNTS``, ``EAGER_ELEMENTS``); here the
profiler counts them for any model, with the same rules:

* ops, as ``TorchDispatchMode`` sees them below autograd (profiler/hardware/op_count.py): GEMM and
  attention calls apart (their curves carry their fixed cost), views (an output aliasing an input) apart
  from compute ops;
* bytes, every byte each compute op reads or writes (empties excepted), counted at the micro-batch b and
  at 2b: the difference is the traffic that grows with the tokens, what the layer moves per b sequences.
  Weights, tables and per-position tensors broadcast over the batch cancel out, as the class counts of
  analytic_ops leave them out.

A block is counted alone (its input made a leaf that needs a gradient, the backward fed ones; at 2b
every argument whose first dimension is the batch is repeated), at each profiled micro-batch and TP
shard. The embedding and the head are counted inside one forward and backward of the whole model, told
apart by hooks at the first block's input and the last block's output (the backward reaches the last
block's output gradient after the head's work, the first block's input gradient before the
embedding's). SDPA is stood in for by one call with no ops of its own, forward and backward, as a fused
kernel runs it; the loss is not part of the model's forward, so not counted here (cost/analytic_ops.py
adds it to every head alike).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils._pytree import tree_flatten
from torch.utils._python_dispatch import TorchDispatchMode

from autoplan.profiler.hardware.op_count import GEMM_OPS
from autoplan.profiler.trace import meta_item

_MOVES_NOTHING = frozenset({"_unsafe_view", "empty", "empty_like", "empty_strided"})


@dataclass
class EagerWork:
    """One layer's eager ops and bytes, forward and backward."""

    fwd_ops: int = 0
    fwd_views: int = 0
    bwd_ops: int = 0
    bwd_views: int = 0
    fwd_bytes: int = 0
    bwd_bytes: int = 0

    @property
    def host_ops(self) -> tuple[int, int, int, int]:
        return self.fwd_ops, self.fwd_views, self.bwd_ops, self.bwd_views

    @property
    def eager_bytes(self) -> tuple[float, float]:
        return float(self.fwd_bytes), float(self.bwd_bytes)


@dataclass
class _Counter(TorchDispatchMode):
    segment: str | None = None
    backward: bool = False
    paused: int = 0
    work: dict[str, EagerWork] = field(default_factory=dict)

    def __post_init__(self) -> None:
        super().__init__()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func is torch.ops.aten._local_scalar_dense.default and args[0].is_meta:
            return meta_item(args[0])  # HF code asks .item() of masks on meta (the tracer answers the same)
        out = func(*args, **(kwargs or {}))
        if self.paused or self.segment is None:
            return out
        name = func.overloadpacket.__name__
        if name in GEMM_OPS or "scaled_dot_product" in name:
            return out
        w = self.work.setdefault(self.segment, EagerWork())
        if func.is_view:
            if self.backward:
                w.bwd_views += 1
            else:
                w.fwd_views += 1
            return out
        moved = 0
        if name not in _MOVES_NOTHING:
            tensors = [t for t in tree_flatten((args, kwargs or {}, out))[0] if isinstance(t, torch.Tensor)]
            moved = sum(t.numel() * t.element_size() for t in tensors)
        if self.backward:
            w.bwd_ops += 1
            w.bwd_bytes += moved
        else:
            w.fwd_ops += 1
            w.fwd_bytes += moved
        return out


class _OneKernel(torch.autograd.Function):
    """SDPA as a fused kernel: an output shaped like q, no ops of its own either way (meta only)."""

    @staticmethod
    def forward(ctx, q, k, v, counter):  # type: ignore[override]
        ctx.counter = counter
        counter.paused += 1
        try:
            out = torch.empty_like(q)
        finally:
            counter.paused -= 1
        ctx.save_for_backward(q, k, v)
        return out

    @staticmethod
    def backward(ctx, grad):  # type: ignore[override]
        q, k, v = ctx.saved_tensors
        ctx.counter.paused += 1
        try:
            return torch.empty_like(q), torch.empty_like(k), torch.empty_like(v), None
        finally:
            ctx.counter.paused -= 1


@contextlib.contextmanager
def _one_kernel_sdpa(counter: _Counter) -> Iterator[None]:
    original = F.scaled_dot_product_attention

    def sdpa(query, key, value, *args: Any, **kwargs: Any):
        return _OneKernel.apply(query, key, value, counter)

    F.scaled_dot_product_attention = sdpa
    try:
        yield
    finally:
        F.scaled_dot_product_attention = original


def _first_tensor(obj: Any) -> torch.Tensor | None:
    obj = getattr(obj, "logits", obj)
    return next((t for t in tree_flatten(obj)[0] if isinstance(t, torch.Tensor)), None)


def _linear_in_batch(at_b: EagerWork, at_2b: EagerWork) -> EagerWork:
    """The ops of one micro-batch of b and the bytes that grow with it (module doc)."""
    return EagerWork(at_b.fwd_ops, at_b.fwd_views, at_b.bwd_ops, at_b.bwd_views,
                     at_2b.fwd_bytes - at_b.fwd_bytes, at_2b.bwd_bytes - at_b.bwd_bytes)


def _doubled(obj: Any, b: int) -> Any:
    if isinstance(obj, torch.Tensor) and obj.ndim and obj.shape[0] == b:
        return torch.cat([obj, obj])
    if isinstance(obj, (tuple, list)):
        return type(obj)(_doubled(x, b) for x in obj)
    if isinstance(obj, dict):
        return {k: _doubled(v, b) for k, v in obj.items()}
    return obj


@contextlib.contextmanager
def _fresh_grads(module: nn.Module) -> Iterator[None]:
    """No gradient before or after a count: a second backward would add into the first one's (add_ ops)."""
    def clear() -> None:
        for p in module.parameters():
            p.grad = None
    clear()
    try:
        yield
    finally:
        clear()


def _count_block(block: nn.Module, args: tuple, kwargs: dict) -> EagerWork:
    with _fresh_grads(block):
        return _count_block_once(block, args, kwargs)


def _count_block_once(block: nn.Module, args: tuple, kwargs: dict) -> EagerWork:
    args = tuple(a.detach().requires_grad_() if isinstance(a, torch.Tensor) and a.is_floating_point() else a
                 for a in args)
    counter = _Counter(segment="block")
    with counter, _one_kernel_sdpa(counter):
        out = _first_tensor(block(*args, **kwargs))
    grad = torch.ones_like(out)
    counter.backward = True
    with counter, _one_kernel_sdpa(counter):
        out.backward(grad)
    return counter.work.get("block", EagerWork())


def block_work(block: nn.Module, args: tuple, kwargs: dict, micro_batch_size: int) -> EagerWork:
    """One block on meta, forward then backward, at ``micro_batch_size`` sequences (``args``/``kwargs`` as
    the block receives them there)."""
    b = micro_batch_size
    return _linear_in_batch(_count_block(block, args, kwargs),
                            _count_block(block, _doubled(args, b), _doubled(kwargs, b)))


def _count_edges(model: nn.Module, run: Callable[[], Any], blocks: list[tuple[str, nn.Module]]) -> dict[str, EagerWork]:
    counter = _Counter(segment="embedding")
    first, last = blocks[0][1], blocks[-1][1]

    def enter(segment: str):
        def hook(*_):
            counter.segment = segment
        return hook

    def pre(module, args, kwargs):
        counter.segment = "blocks"
        hidden = next((t for t in tree_flatten((args, kwargs))[0]
                       if isinstance(t, torch.Tensor) and t.is_floating_point() and t.requires_grad), None)
        if hidden is not None:
            hidden.register_hook(enter("embedding"))

    def post(module, args, kwargs, output):
        counter.segment = "head"
        out = _first_tensor(output)
        if out is not None and out.requires_grad:
            out.register_hook(enter("blocks"))

    handles = [first.register_forward_pre_hook(pre, with_kwargs=True),
               last.register_forward_hook(post, with_kwargs=True)]
    try:
        with _fresh_grads(model):
            with counter, _one_kernel_sdpa(counter):
                logits = _first_tensor(run())
            grad = torch.ones_like(logits)
            counter.backward, counter.segment = True, "head"
            with counter, _one_kernel_sdpa(counter):
                logits.backward(grad)
    finally:
        for h in handles:
            h.remove()
    return {k: counter.work.get(k, EagerWork()) for k in ("embedding", "head")}


def edge_work(model: nn.Module, run_at: Callable[[int], Any], blocks: list[tuple[str, nn.Module]],
              micro_batch_size: int) -> dict[str, EagerWork]:
    """{"embedding": ..., "head": ...}: the whole model's forward (``run_at(b)`` runs it on b sequences) and
    backward on meta; the ops before the first block and after the last one (module doc)."""
    b = micro_batch_size
    at_b = _count_edges(model, lambda: run_at(b), blocks)
    at_2b = _count_edges(model, lambda: run_at(2 * b), blocks)
    return {k: _linear_in_batch(at_b[k], at_2b[k]) for k in at_b}
