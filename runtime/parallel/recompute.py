"""Activation recomputation exactly where the plan says, per block.

``full_recompute`` blocks are wrapped in non-reentrant ``checkpoint_wrapper``: only the block input is
kept and the whole block reruns in backward. ``selective_recompute`` blocks checkpoint only the attention
core (scores, softmax, dropout, attention over V; Korthikanti et al. 2022) via ``AttentionCore.recompute``.
Apply after TP and before FSDP / PipelineStage (runtime-notes §6).
"""

from __future__ import annotations

from torch import nn
from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import CheckpointImpl, checkpoint_wrapper

from autoplan.schema import Stage


def apply_recompute(model: nn.Module, stage: Stage) -> nn.Module:
    for layer in range(*stage.layers):
        key = str(layer)
        mode = stage.recompute_of(layer)
        if mode == "full":
            model.blocks[key] = checkpoint_wrapper(model.blocks[key], checkpoint_impl=CheckpointImpl.NO_REENTRANT)
        elif mode == "selective":
            model.blocks[key].attn.core.recompute = True
    return model
