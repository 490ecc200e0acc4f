"""Per-layer costs for one micro-batch on one device: the single input the pipeline cost model reads.

A ``Workload`` is built in one place, ``build_workload``, from the ``LayerOps`` of the embedding, one block
and the head (cost/layer_ops.py prices them on a cluster, as a stack runs them). Two sources describe those
layers: a ModelSpec (cost/analytic_ops.py and moe_ops.py, through spec_workload.py ``analytic_workload``) and a traced model profile
(cost/profile_ops.py, ``profile_workload``); cost/model_workload.py picks one for whatever the user named.
Everything downstream (memory, pipeline simulation, search) sees only ``Workload``, so a profiled model is
planned exactly like a built-in one.

The planner treats the transformer blocks as identical (one ``block`` cost): stage boundaries and
recomputation counts are then all that distinguishes stages.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Callable

from autoplan.cost.layer_ops import BACKWARD_FACTOR, LayerCost, LayerOps, layer_cost
from autoplan.cost.split import LayerSplit
from autoplan.schema import Cluster, StackProfile, TrainingSetup
from autoplan.schema.plan import ParallelConfig

__all__ = ["BACKWARD_FACTOR", "LayerCost", "LayerSplit", "Workload", "WorkloadFn", "build_workload",
           "least_exchange", "with_exposed_exchange"]


@dataclass(frozen=True)
class Workload:
    split: LayerSplit
    stack: StackProfile
    """The stack the layers were priced for; the configuration's table reads it too (ZeRO's dtypes, ...)."""
    num_layers: int
    embedding: LayerCost
    block: LayerCost
    head: LayerCost
    tied_copy_params: float
    """Parameters the last stage holds in addition when a tied embedding is split from its head (pp > 1)."""
    output_bytes: float
    """Activation bytes a stage sends to the next, per micro-batch."""
    logits_transient_bytes: float
    """Peak working memory of the loss on the last stage beyond the log-softmax the head keeps: the fp32 logit
    copies the stack's loss holds at once (activations.py ``logits_transient_bytes``)."""
    kept_output_bytes: float = 0.0
    """Bytes of one micro-batch's last-stage output that the stack keeps from its forward to the end of the
    step under pipelining (activations.py ``kept_output_bytes_per_logit``; 0 where it keeps none). The stage
    table counts it only when pp > 1: without a pipeline schedule nothing keeps it."""
    ring_transient_bytes: float = 0.0
    """Working memory of one block's ring attention (cost/context_parallel.py), on every rank; 0 without cp."""
    dense_layers: int = 0
    """MoE models: the leading blocks that keep a dense MLP (DeepSeek-V3: 3; ``MoESpec.first_dense_layers``);
    ``block`` is then an MoE block and ``num_layers`` still counts every block."""
    dense_block: LayerCost | None = None
    """One of those leading dense blocks (None when ``dense_layers`` is 0)."""


WorkloadFn = Callable[[LayerSplit], Workload]
"""A model's per-layer costs for each split; analytic (from a spec) or from a profile."""


def build_workload(embedding: LayerOps, block: LayerOps, head: LayerOps, *, num_layers: int, split: LayerSplit,
                   cluster: Cluster, training: TrainingSetup, stack: StackProfile, tied_copy_params: float,
                   output_bytes: float, logits_transient_bytes: float, kept_output_bytes: float) -> Workload:
    """The one way to a Workload: each layer's ops priced by ``layer_cost`` on ``cluster`` under ``stack``."""
    def cost(ops: LayerOps) -> LayerCost:
        return layer_cost(ops, cluster, training, stack, split.dims)

    return Workload(split=split, stack=stack, num_layers=num_layers, embedding=cost(embedding), block=cost(block),
                    head=cost(head),
                    tied_copy_params=tied_copy_params, output_bytes=output_bytes,
                    logits_transient_bytes=logits_transient_bytes, kept_output_bytes=kept_output_bytes,
                    ring_transient_bytes=block.ring.transient_bytes if block.ring is not None else 0.0)


def with_exposed_exchange(w: Workload, config: ParallelConfig) -> Workload:
    """The workload as ``config`` runs it: where the stack overlaps the experts' all-to-alls with the paired
    micro-batch's kernels (``StackProfile.ep_comm_overlap``) and the configuration allows it
    (``ParallelConfig.ep_overlap_possible``: Megatron-Core's condition, or DualPipe), each layer's ``ep_*_s`` less its
    hideable share (``LayerCost.ep_hideable_*_s``). The cost table (cost/tables.py) and the breakdown
    (cost/estimate.py) both read the workload through this, so they agree."""
    if w.stack.ep_comm_overlap == 0 or not config.ep_overlap_possible:
        return w
    return least_exchange(w)


def least_exchange(w: Workload) -> Workload:
    """The workload with every hideable share of the experts' exchange hidden: the least layer times any
    configuration of a split can have (the search's group bound, search/bounds.py)."""
    def exposed(layer: LayerCost | None) -> LayerCost | None:
        if layer is None or not (layer.ep_hideable_fwd_s or layer.ep_hideable_bwd_s):
            return layer
        return replace(layer, ep_fwd_s=layer.ep_fwd_s - layer.ep_hideable_fwd_s,
                       ep_bwd_s=layer.ep_bwd_s - layer.ep_hideable_bwd_s, ep_hideable_fwd_s=0.0, ep_hideable_bwd_s=0.0)

    return replace(w, embedding=exposed(w.embedding), block=exposed(w.block), head=exposed(w.head),
                   dense_block=exposed(w.dense_block))
