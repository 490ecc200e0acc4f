"""Running one block for real: forward and backward time, and the bytes the real kernels save.

Only one block of each distinct kind is built on the device (from the meta block: ``to_empty`` plus a
small random init), fed inputs shaped like the ones the traced forward gave it, and timed: ``warmup``
untimed runs, then the median of ``repeats``. Backward is timed from the block output with a random
output gradient, so it includes the input gradient a pipeline stage sends back. On CUDA every timing
is bracketed by ``torch.cuda.synchronize``.
"""

from __future__ import annotations

import copy
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn
from torch.utils._pytree import tree_flatten, tree_map


@dataclass(frozen=True)
class BlockTiming:
    fwd_time_s: float
    bwd_time_s: float
    saved_activation_bytes: int
    """What autograd kept in the timed forward (deduplicated by storage, parameters excluded)."""


def materialize(block: nn.Module, device: torch.device) -> nn.Module:
    """A real copy of a meta block: N(0, 0.02) matrices, ones for vectors, random float buffers."""
    real = copy.deepcopy(block).to_empty(device=device)
    with torch.no_grad():
        for p in real.parameters():
            p.normal_(0.0, 0.02) if p.dim() > 1 else p.fill_(1.0)
        for b in real.buffers():
            b.normal_() if b.is_floating_point() else b.zero_()
    return real


def real_inputs(args: tuple, kwargs: dict, device: torch.device) -> tuple[tuple, dict]:
    """Inputs shaped like the traced (meta) ones; the hidden state (first float tensor) requires grad."""
    first = [True]

    def make(t: Any) -> Any:
        if not isinstance(t, torch.Tensor):
            return t
        if t.is_floating_point():
            x = torch.randn(t.shape, dtype=t.dtype, device=device)
            if first[0]:
                first[0] = False
                x.requires_grad_(True)
            return x
        return (torch.ones if t.dtype == torch.bool else torch.zeros)(t.shape, dtype=t.dtype, device=device)
    return tree_map(make, args), tree_map(make, kwargs)


def _first_tensor(out: Any) -> torch.Tensor:
    return next(t for t in tree_flatten(out)[0] if isinstance(t, torch.Tensor))


def _sync(device: torch.device) -> Callable[[], None]:
    return torch.cuda.synchronize if device.type == "cuda" else (lambda: None)


def saved_bytes(block: nn.Module, args: tuple, kwargs: dict) -> int:
    """Bytes autograd saves in one forward of ``block``, each storage counted once, parameters excluded."""
    params = {p.untyped_storage()._cdata for p in block.parameters()}
    seen: set[int] = set()
    total = [0]

    def pack(t: torch.Tensor) -> torch.Tensor:
        key = t.untyped_storage()._cdata
        if key not in params and key not in seen:
            seen.add(key)
            total[0] += t.untyped_storage().nbytes()
        return t
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        block(*args, **kwargs)
    return total[0]


def time_block(block: nn.Module, args: tuple, kwargs: dict, device: torch.device, warmup: int = 2,
               repeats: int = 5) -> BlockTiming:
    """Median forward and backward seconds of ``block`` on ``device`` (a real block and real inputs)."""
    sync = _sync(device)
    grad = torch.randn_like(_first_tensor(block(*args, **kwargs)))
    fwd, bwd = [], []
    for i in range(warmup + repeats):
        sync()
        t0 = time.perf_counter()
        out = _first_tensor(block(*args, **kwargs))
        sync()
        t1 = time.perf_counter()
        out.backward(grad)
        sync()
        t2 = time.perf_counter()
        if i >= warmup:
            fwd.append(t1 - t0)
            bwd.append(t2 - t1)
    block.zero_grad(set_to_none=True)
    return BlockTiming(statistics.median(fwd), statistics.median(bwd), saved_bytes(block, args, kwargs))
