"""Megatron-style tensor parallelism with DTensor (``parallelize_module``), for GPT and Llama.

Per block: q/k/v and the MLP's first matrices (fc1, or gate and up) are split by columns (output
features, i.e. heads: each rank holds heads/tp query heads and kv_heads/tp kv heads, which keeps GQA
groups whole), o and the last MLP matrix (fc2/down) by rows, so each block needs one all-reduce forward
and one backward. The token embedding is vocabulary-parallel (RowwiseParallel on nn.Embedding) and the
head column-parallel over the vocabulary; with ``loss_parallel`` the logits stay sharded and the
cross-entropy runs on the shards (no [B, T, V] all-gather).

Biases (GPT's; Qwen2's q/k/v) are split with their column-parallel weight and kept whole after a
row-parallel one (added once, after the reduction). Qwen3's per-head RMSNorms (``attn.q_norm``,
``attn.k_norm``, over head_dim of the [B, T, heads, d] projections) act on the rank's own heads: their
weight is the same on every rank, but each rank's gradient covers only its heads, so they are
``SequenceParallel`` over the heads dimension (torchtitan's qwen3 plan): a Replicate DTensor weight and
Shard(2) activations, so DTensor sums the weight's gradient over the TP group (a plain replicated weight
would keep each rank's partial gradient).

Sequence parallel (Korthikanti 2022): norms run on sequence shards (``SequenceParallel``); the block
inputs are all-gathered (``PrepareModuleInput`` Shard(1) -> Replicate) and o/fc2/down reduce-scatter to
Shard(1). Activations between blocks, and between pipeline stages, are then [B, T/tp, H] local tensors.
Dropout: masks are seeded per element position (runtime/models/dropout.py); ``apply_tp`` tells each
block's dropout sites which heads (attention core) and, under SP, which sequence shard (residual
dropouts) this rank holds. GPT's embedding dropout runs before the sequence split, on the whole sequence.
"""

from __future__ import annotations

from torch import nn
from torch.distributed.tensor import Replicate, Shard, distribute_tensor
from torch.distributed.tensor.parallel import (
    ColwiseParallel, PrepareModuleInput, PrepareModuleOutput, RowwiseParallel, SequenceParallel,
    parallelize_module,
)

from runtime.models.common import AttentionCore
from runtime.models.dropout import LayoutFreeDropout
from runtime.models.moe import MoE


def block_plan(block: nn.Module, sp: bool) -> dict:
    """The TP plan of one block (GPT: fc1/fc2; Llama: gate/up/down; Qwen3's q_norm/k_norm)."""
    out = Shard(1) if sp else Replicate()
    plan = {"attn.q": ColwiseParallel(), "attn.k": ColwiseParallel(), "attn.v": ColwiseParallel(),
            "attn.o": RowwiseParallel(output_layouts=out)}
    if hasattr(block.attn, "q_norm"):  # heads are dim 2 of their [B, T, heads, d] input; output stays local
        plan |= {"attn.q_norm": SequenceParallel(sequence_dim=2, use_local_output=True),
                 "attn.k_norm": SequenceParallel(sequence_dim=2, use_local_output=True)}
    if isinstance(block.mlp, MoE):
        return plan | moe_plan(block.mlp, sp)
    if hasattr(block.mlp, "fc1"):
        plan |= {"mlp.fc1": ColwiseParallel(), "mlp.fc2": RowwiseParallel(output_layouts=out)}
    else:
        plan |= {"mlp.gate": ColwiseParallel(), "mlp.up": ColwiseParallel(),
                 "mlp.down": RowwiseParallel(output_layouts=out)}
    if sp:
        gather = PrepareModuleInput(input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),))
        plan |= {"attn_norm": SequenceParallel(), "mlp_norm": SequenceParallel(), "attn": gather, "mlp": gather}
    return plan


def moe_plan(moe: MoE, sp: bool) -> dict:
    """The TP plan of an MoE block's feed-forward part (see the module docstring); its norms' SP entries and
    the attention's are ``block_plan``'s."""
    if not sp:
        raise ValueError("an MoE block under tensor parallelism needs sequence_parallel (each TP rank routes its "
                         "own slice of the tokens)")
    plan = {"attn_norm": SequenceParallel(), "mlp_norm": SequenceParallel(),
            "attn": PrepareModuleInput(input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),)),
            "mlp": PrepareModuleInput(input_layouts=(Shard(1),), desired_input_layouts=(Shard(1),),
                                      use_local_output=True)}
    if moe.shared is not None:
        plan |= {"mlp.shared": PrepareModuleInput(input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),)),
                 "mlp.shared.gate": ColwiseParallel(), "mlp.shared.up": ColwiseParallel(),
                 "mlp.shared.down": RowwiseParallel(output_layouts=Shard(1))}
    return plan


def replicate_routers(block: nn.Module, tp_mesh) -> None:
    """An MoE block's router matrix as a Replicate DTensor on the TP mesh (a local slice: no communication)."""
    if isinstance(block.mlp, MoE):
        router = block.mlp.router
        router.weight = nn.Parameter(distribute_tensor(router.weight.detach(), tp_mesh, [Replicate()],
                                                       src_data_rank=None))


def apply_tp(model: nn.Module, tp_mesh, sp: bool, loss_parallel: bool) -> nn.Module:
    """Shard ``model`` (a full model or a pipeline stage) over ``tp_mesh`` in place."""
    tied = model.embed is not None and model.head is not None and model.head.weight is model.embed.tok.weight
    if model.embed is not None:
        parallelize_module(model.embed, tp_mesh, {"tok": RowwiseParallel(input_layouts=Replicate(),
                                                                         output_layouts=Replicate())})
        if sp:  # after the position add (GPT), split the sequence for the first block
            parallelize_module(model, tp_mesh, {"embed": PrepareModuleOutput(
                output_layouts=Replicate(), desired_output_layouts=Shard(1))})
    for block in model.blocks.values():
        parallelize_module(block, tp_mesh, block_plan(block, sp))
        replicate_routers(block, tp_mesh)
    if model.head is not None:
        head = ColwiseParallel(input_layouts=Shard(1) if sp else Replicate(),
                               output_layouts=Shard(-1) if loss_parallel else Replicate(),
                               use_local_output=not loss_parallel)
        plan = {"head": head} | ({"norm": SequenceParallel()} if sp else {})
        parallelize_module(model, tp_mesh, plan)
    if tied:  # both are Shard(0) over the vocabulary: re-share the one DTensor parameter
        model.head.weight = model.embed.tok.weight
    shard_dropout_sites(model, tp_mesh.get_local_rank(), tp_mesh.size(), sp)
    return model


def shard_dropout_sites(model: nn.Module, tp_rank: int, tp: int, sp: bool) -> None:
    """Which part of the global activations this rank's dropout sites see: heads [tp_rank * h/tp, ...)
    in the attention core; under SP, the residual dropouts' sequence shard tp_rank of tp."""
    for block in model.blocks.values():
        for module in block.modules():
            if isinstance(module, AttentionCore):
                module.head_shard = (tp_rank, tp)
            elif isinstance(module, LayoutFreeDropout) and sp:
                module.seq_shard = (tp_rank, tp)
