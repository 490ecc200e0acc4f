"""How one micro-batch of every layer is split over devices: what fixes a layer's cost on its device."""

from __future__ import annotations

from dataclasses import dataclass

from autoplan.schema import ParallelDims


@dataclass(frozen=True)
class LayerSplit:
    """The split of one micro-batch's layers: sequences per micro-batch, tensor parallelism (with or without
    sequence parallelism) and context parallelism. Pipeline and data parallelism do not change a layer's
    cost on its device, so they are not part of it: every configuration with the same split shares one
    ``Workload`` (cost/workload.py)."""

    micro_batch_size: int
    """Sequences per micro-batch."""
    tp: int = 1
    sequence_parallel: bool = False
    """Norms, dropouts and residuals split along the sequence within the TP group (needs tp > 1)."""
    cp: int = 1
    """Context-parallel ranks: each holds seq_len / cp tokens of every sequence."""
    ep: int = 1
    """Expert-parallel ranks (MoE): each holds num_experts / ep experts and exchanges routed tokens with the
    others by all-to-all."""
    etp: int = 1
    """Expert tensor-parallel ranks (MoE): each expert's matrices are split over etp ranks."""

    @property
    def dims(self) -> ParallelDims:
        """The TP and CP axes (the groups a layer's own collectives run on), and for MoE the expert axes."""
        return ParallelDims(tp=self.tp, cp=self.cp, ep=self.ep, etp=self.etp)

    @property
    def hidden_shards(self) -> int:
        """Ways the residual stream [tokens, h] is split: tp under sequence parallelism, else 1."""
        return self.tp if self.sequence_parallel else 1
