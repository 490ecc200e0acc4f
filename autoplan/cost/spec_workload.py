"""A ModelSpec's per-layer costs for one split: the ``WorkloadFn`` of a spec (cost/model_workload.py picks it).

The layers come from cost/analytic_ops.py (a dense block, the embedding and the head, from the published
formulas) and cost/moe_ops.py (MoE and MLA blocks built from parts, and the multi-token-prediction modules
folded into the head), priced by ``build_workload``. Kept apart from both so that neither imports the other's
user: moe_ops builds on analytic_ops's layers.
"""

from __future__ import annotations

from dataclasses import replace

from autoplan.cost import activations as act
from autoplan.cost import moe_ops as moe
from autoplan.cost.activations import SavedBytes, elem_bytes
from autoplan.cost.analytic_ops import block_ops, embedding_ops, head_ops
from autoplan.cost.context_parallel import with_repeated_kv
from autoplan.cost.layer_ops import LayerOps, layer_cost
from autoplan.cost.workload import LayerSplit, Workload, build_workload
from autoplan.schema import Cluster, ModelSpec, StackProfile, TrainingSetup


def analytic_workload(model: ModelSpec, cluster: Cluster, training: TrainingSetup, split: LayerSplit,
                      stack: StackProfile) -> Workload:
    """A spec's per-layer costs for one split on ``cluster`` as ``stack`` runs them. An MoE model's ``block``
    is one MoE block and its leading dense blocks are ``dense_block`` (``dense_layers`` of them); MLA blocks
    and the multi-token-prediction modules (folded into the head, which the last stage runs) are
    cost/moe_ops.py's."""
    tp, cp = split.tp, split.cp
    vocab = model.padded_vocab_size(tp)
    tokens = split.micro_batch_size * training.seq_len
    moe.refuse_unpriced(model)
    layered = model.moe is not None or model.mla is not None
    block = stack_attention(moe.any_block_ops(model.num_layers - 1, model, split, training, stack) if layered
                            else block_ops(model, split, training, stack), model, split, training, stack)
    head = head_ops(model, split, training)
    if model.mtp_layers:
        last = model.is_moe_block(model.num_layers - 1)
        head = moe.merge(head, *(moe.mtp_ops(i, model, split, training, stack,
                                             block if model.is_moe_block(model.num_layers + i) == last else None)
                                 for i in range(model.mtp_layers)))
    workload = build_workload(
        embedding_ops(model, split, training), block, head,
        num_layers=model.num_layers, split=split, cluster=cluster, training=training, stack=stack,
        # the MTP modules embed the shifted tokens on the last stage: Megatron's GPTModel builds the embedding
        # there too (``mtp_process``) and reduces its gradient with the first stage's, as for a tied one
        tied_copy_params=vocab * model.hidden_size / tp if model.tie_embeddings or model.mtp_layers else 0.0,
        output_bytes=act.stage_output_bytes(model, split, training) / cp,
        logits_transient_bytes=act.logits_transient_bytes(tokens, tp, elem_bytes(training.activation_precision),
                                                          vocab, act.loss_fp32_copies(stack, tp)) / cp,
        kept_output_bytes=act.kept_output_bytes_per_logit(elem_bytes(training.activation_precision), stack)
        * tokens * vocab / tp / cp,
    )
    dense = model.moe.first_dense_layers if model.moe is not None else 0
    if not dense:
        return workload
    dense_ops = stack_attention(moe.dense_block_ops(model, split, training, stack), model, split, training, stack)
    dense_block = layer_cost(dense_ops, cluster, training, stack, split.dims)
    return replace(workload, dense_layers=dense, dense_block=dense_block)


def stack_attention(block: LayerOps, model: ModelSpec, split: LayerSplit, training: TrainingSetup,
                    stack: StackProfile) -> LayerOps:
    """A block's attention as ``stack`` calls it. Under grouped-query attention a stack that repeats K and V
    to every query head before the kernel (``StackProfile.attention_repeats_kv``, torchtitan) makes the
    kernel keep the repeated K and V (activations.py ``repeated_kv_saved_bytes``, on this rank's s / cp
    tokens) and its ring carry them (context_parallel.py ``with_repeated_kv``). The layers are described
    once, grouped (analytic_ops.py, moe_ops.py); this is the one place the stack's call widens them. MLA
    keys and values are per head already."""
    repeats = model.num_attention_heads // model.num_kv_heads
    if not stack.attention_repeats_kv or repeats == 1 or model.mla is not None or block.attention is None:
        return block
    extra = act.repeated_kv_saved_bytes(model, split, training) / split.cp
    # what a flash kernel keeps is also kept under selective recomputation of the attention core (nothing
    # else reruns); torchtitan's every-other-matmul count reads the kernel's output only (layer_ops.py)
    saved = SavedBytes(block.saved.none + extra, block.saved.selective + extra, block.saved.full)
    ring = with_repeated_kv(block.ring, repeats) if block.ring is not None else None
    return replace(block, saved=saved, ring=ring)
