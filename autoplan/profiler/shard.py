"""A block at TP-sharded shapes: what one rank of a ``tp``-way tensor-parallel group holds and runs.

For each split found by ``tpsplit`` the column linears keep ``out_features / tp`` outputs and the row
linear ``in_features / tp`` inputs; everything else is unchanged, exactly as Megatron's and torch's
ColwiseParallel/RowwiseParallel leave a rank. Attention code that reshapes with ``view(b, t, -1, d)``
(our reference models, HF) then runs ``heads / tp`` heads by itself; a fused projection split by a width
its module keeps (GPT-2's ``c_attn(x).split(self.split_size)``) gets that width cut to 1/tp too, so each
rank splits its q, k, v shares. A block whose code hard-codes the head count fails at that shape; the
caller records the size as not shardable.
"""

from __future__ import annotations

import copy

import torch
from torch import nn

from autoplan.profiler.trace import linear_features
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
        for name in split.columns:  # a fused projection cut by a width the module keeps: GPT-2's c_attn
            parent = shard.get_submodule(name.rpartition(".")[0]) if "." in name else shard
            if isinstance(getattr(parent, "split_size", None), int) and parent.split_size % tp == 0:
                parent.split_size //= tp
    return shard


def _shrink(linear: nn.Module, tp: int, dim: int) -> bool:
    """Keep 1/tp of a Linear's weight along ``dim`` (0: outputs, with the bias; 1: inputs); a Hugging Face
    ``Conv1D`` (weight [in, out]) along the other axis."""
    if linear_features(linear) is not None and not isinstance(linear, nn.Linear):
        return _shrink_conv1d(linear, tp, dim)
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


def _shrink_conv1d(conv: nn.Module, tp: int, dim: int) -> bool:
    """``_shrink`` for ``Conv1D``: outputs are its weight's dim 1 (and ``nf``, and the bias), inputs dim 0."""
    w = conv.weight
    axis = 1 - dim
    if w.shape[axis] % tp:
        return False
    shape = list(w.shape)
    shape[axis] //= tp
    conv.weight = nn.Parameter(torch.empty(shape, dtype=w.dtype, device=w.device))
    if dim == 0:
        conv.nf = shape[1]
        conv.bias = nn.Parameter(torch.empty(shape[1], dtype=w.dtype, device=w.device))
    return True
