"""Per-layer costs for one micro-batch on one device: the single input the pipeline cost model reads.

A ``Workload`` is built in one place, ``build_workload``, from the ``LayerOps`` of the embedding, one block
and the head (cost/layer_ops.py prices them). Two sources describe those layers: ``analytic_workload``
below, from a ModelSpec (cost/analytic_ops.py), and the profiler's adapter, from a traced model profile
(``autoplan profile``). Everything downstream (memory, pipeline simulation, search) sees only
``Workload``, so a profiled model is planned exactly like a built-in one.

The planner treats the transformer blocks as identical (one ``block`` cost): stage boundaries and
recomputation counts are then all that distinguishes stages.
"""

from __future__ import annotations

from dataclasses import dataclass

from autoplan.cost import activations as act
from autoplan.cost.analytic_ops import block_ops, embedding_ops, head_ops
from autoplan.cost.layer_ops import BACKWARD_FACTOR, LayerCost, LayerOps, layer_cost
from autoplan.schema import Cluster, ModelSpec, TrainingSetup

__all__ = ["BACKWARD_FACTOR", "LayerCost", "Workload", "analytic_workload", "build_workload"]


@dataclass(frozen=True)
class Workload:
    micro_batch_size: int
    seq_len: int
    tp: int
    sequence_parallel: bool
    num_layers: int
    embedding: LayerCost
    block: LayerCost
    head: LayerCost
    tied_copy_params: float
    """Parameters the last stage holds in addition when a tied embedding is split from its head (pp > 1)."""
    output_bytes: float
    """Activation bytes a stage sends to the next, per micro-batch."""
    logits_transient_bytes: float
    """Peak working memory of the loss on the last stage (logits and their gradient)."""
    cp: int = 1
    """Context-parallel ranks: each layer's costs are those of one rank holding s / cp of every sequence."""
    ring_transient_bytes: float = 0.0
    """Working memory of one block's ring attention (cost/context_parallel.py), on every rank; 0 without cp."""


def build_workload(embedding: LayerOps, block: LayerOps, head: LayerOps, *, num_layers: int, micro_batch_size: int,
                   tp: int, sp: bool, cluster: Cluster, training: TrainingSetup, tied_copy_params: float,
                   output_bytes: float, logits_transient_bytes: float, cp: int = 1) -> Workload:
    """The one way to a Workload: each layer's ops priced by ``layer_cost`` on ``cluster``."""
    def cost(ops: LayerOps) -> LayerCost:
        return layer_cost(ops, cluster, training, tp)

    return Workload(micro_batch_size=micro_batch_size, seq_len=training.seq_len, tp=tp, sequence_parallel=sp,
                    num_layers=num_layers, embedding=cost(embedding), block=cost(block), head=cost(head),
                    tied_copy_params=tied_copy_params, output_bytes=output_bytes,
                    logits_transient_bytes=logits_transient_bytes, cp=cp,
                    ring_transient_bytes=block.ring.transient_bytes if block.ring is not None else 0.0)


def analytic_workload(model: ModelSpec, cluster: Cluster, training: TrainingSetup, micro_batch_size: int,
                      tp: int, sp: bool, cp: int = 1) -> Workload:
    b, s = micro_batch_size, training.seq_len
    e = act.elem_bytes(training.activation_precision)
    vocab = model.padded_vocab_size(tp)
    return build_workload(
        embedding_ops(model, b, s, tp, sp, e, cp),
        block_ops(model, b, s, tp, sp, e, training.attention, cp, per_module_input_grads=cluster.shares_cores),
        head_ops(model, b, s, tp, sp, e, cp), num_layers=model.num_layers, micro_batch_size=b, tp=tp, sp=sp,
        cluster=cluster, training=training,
        tied_copy_params=vocab * model.hidden_size / tp if model.tie_embeddings else 0.0,
        output_bytes=act.stage_output_bytes(model, b, s, tp, sp, e) / cp,
        logits_transient_bytes=act.logits_transient_bytes(b, s, tp, e, vocab) / cp, cp=cp,
    )
