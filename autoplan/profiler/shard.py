"""A block at TP-sharded shapes: what one rank of a ``tp``-way tensor-parallel group holds and runs.

For each split found by ``tpsplit`` the column linears keep ``out_features / tp`` outputs and the row
linear ``in_features / tp`` inputs; everything else is unchanged, exactly as Megatron's and torch's
ColwiseParallel/RowwiseParallel leave a rank. Attention code that reshapes with ``view(b, t, -1, d)``
(our reference models, HF) then runs ``heads / tp`` heads by itself. A block whose code hard-codes the
head count fails at that shape; the caller records the size as not shardable.
"""

from __future__ import annotations

import copy

import torch
from torch import nn

from autoplan.schema.profile import TpSplit


def sharded_copy(block: nn.Module, splits: tuple[TpSplit, ...], tp: int) -> nn.Module | None:
    """A deep copy of ``block`` with its splits sharded ``tp`` ways, or None if a size does not divide."""
    shard = copy.deepcopy(block)
    for split in splits:
        for name in split.columns:
            if not _shrink(shard.get_submodule(name), tp, dim=0):
                return None
        if not _shrink(shard.get_submodule(split.row), tp, dim=1):
            return None
    return shard


def _shrink(linear: nn.Module, tp: int, dim: int) -> bool:
    """Keep 1/tp of a Linear's weight along ``dim`` (0: outputs, with the bias; 1: inputs)."""
    if not isinstance(linear, nn.Linear) or linear.weight.shape[dim] % tp:
        return False
    w = linear.weight
    shape = list(w.shape)
    shape[dim] //= tp
    linear.weight = nn.Parameter(torch.empty(shape, dtype=w.dtype, device=w.device))
    if dim == 0:
        linear.out_features = shape[0]
        if linear.bias is not None:
            linear.bias = nn.Parameter(torch.empty(shape[0], dtype=w.dtype, device=w.device))
    else:
        linear.in_features = shape[1]
    return True
