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
from autoplan.cost.activations import elem_bytes
from autoplan.cost.analytic_ops import block_ops, embedding_ops, head_ops
from autoplan.cost.layer_ops import layer_cost
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
    block = moe.any_block_ops(model.num_layers - 1, model, split, training, stack) if layered \
        else block_ops(model, split, training, stack)
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
                                                          vocab) / cp,
    )
    dense = model.moe.first_dense_layers if model.moe is not None else 0
    if not dense:
        return workload
    dense_block = layer_cost(moe.dense_block_ops(model, split, training, stack), cluster, training, stack, split.dims)
    return replace(workload, dense_layers=dense, dense_block=dense_block)
