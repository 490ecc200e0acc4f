"""Counting the eager ops a piece of PyTorch code runs, the way the cost model's host-time terms count
them (cost/layer_ops.py ``HostOps``): every op that reaches the dispatcher below autograd, as a
``TorchDispatchMode`` sees it, sorted into GEMMs, attention kernels, views (ops whose output aliases an
input: view, transpose, detach, slice, ...) and compute ops (everything else: norms, activations, adds,
reductions, copies). GEMM and attention calls are kept apart because their fixed cost per call is part
of their own measured curves.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass

from torch.utils._python_dispatch import TorchDispatchMode

GEMM_OPS = frozenset({"mm", "addmm", "bmm", "baddbmm", "matmul", "linear"})


@dataclass(frozen=True)
class OpCount:
    compute: int
    views: int
    gemms: int
    attention: int

    def __add__(self, other: "OpCount") -> "OpCount":
        return OpCount(self.compute + other.compute, self.views + other.views, self.gemms + other.gemms,
                       self.attention + other.attention)


class _Counter(TorchDispatchMode):
    def __init__(self) -> None:
        super().__init__()
        self.kinds: Counter = Counter()
        self.names: Counter = Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = func.overloadpacket.__name__
        self.names[name] += 1
        if name in GEMM_OPS:
            self.kinds["gemms"] += 1
        elif "scaled_dot_product" in name:
            self.kinds["attention"] += 1
        elif func.is_view:
            self.kinds["views"] += 1
        else:
            self.kinds["compute"] += 1
        return func(*args, **(kwargs or {}))


def count_ops(fn: Callable[[], object]) -> tuple[OpCount, object, Counter]:
    """Run ``fn`` once under the counter: (the count, fn's result, ops by name)."""
    with _Counter() as counter:
        result = fn()
    k = counter.kinds
    return OpCount(k["compute"], k["views"], k["gemms"], k["attention"]), result, counter.names
