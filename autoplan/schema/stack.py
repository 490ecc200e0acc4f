"""A training stack: how the software that runs a plan turns a layer into kernels and collectives.

The same layout costs different time on different stacks: Megatron-LM with Transformer Engine runs a
block's memory-bound work as a few fused kernels, eager PyTorch (this project's runtime, torchtitan
without compile) as one kernel per op; Megatron fuses q, k and v into one column-parallel GEMM and
all-reduces the input gradient once per column -> row pair, DTensor tensor parallelism over separate
q, k, v modules once per module. A stack profile names those choices, each field with its source (a
path in that project's code, or a kernel measurement), and the cost model reads them instead of
guessing from the device.

Shipped stacks (``profiles/stacks/``): ``megatron`` (Megatron-LM / Megatron-Core with fused kernels)
and ``autoplan`` (this runtime: eager PyTorch, DTensor TP, FSDP2, torch pipelining). ``default_stack``
picks the one a cluster profile was measured with (cost/workload.py documents the choice).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from autoplan.schema._io import require
from autoplan.schema.cluster import Cluster
from autoplan.schema.hardware import HOST_FIELDS, FieldSource


@dataclass(frozen=True)
class StackProfile:
    name: str
    source: str = ""
    elementwise: Literal["fused", "eager"] = "fused"
    """How the memory-bound work between the GEMMs runs. ``fused``: the bytes of the fused kernels
    (cost/analytic_ops.py's block count: a norm reads and writes the hidden state once, and so on), the
    backward ``BACKWARD_MEMORY_FACTOR`` times that. ``eager``: every torch op its own kernel, each reading
    its inputs and writing its output (``EAGER_ELEMENTS``, counted on the runtime's layers); 2-5 x more
    bytes (RMSNorm alone is six kernels forward)."""
    tp_input_grad_reduce: Literal["per_pair", "per_module"] = "per_pair"
    """Backward all-reduces of tensor parallelism without sequence parallelism. ``per_pair``: one per
    column -> row parallel pair (Megatron's fused QKV and fc1 / gate-up GEMMs): 2 per block.
    ``per_module``: one per column-parallel module, as DTensor's ``ColwiseParallel`` reduces its input
    gradient at each module boundary: q, k, v and the MLP's input matrices, 4 (gpt) or 5 (llama) per block."""
    sources: tuple[FieldSource, ...] = ()
    """Where each field's value comes from."""

    def validate(self) -> None:
        require(0 < len(self.name) <= 200, "name", "must be 1 to 200 characters")
        names = {"name", "source", "elementwise", "tp_input_grad_reduce", "sources"}
        for i, s in enumerate(self.sources):
            require(s.field in names, f"sources[{i}].field", f"{s.field!r} is not a field of a stack profile")


def default_stack(cluster: Cluster) -> str:
    """The stack a cluster profile describes, until a plan names its own: ``autoplan`` where the device was
    calibrated by running this runtime (``autoplan calibrate`` measured its host fields: a CPU host),
    ``megatron`` for the other profiles, whose efficiencies and reference runs are Megatron-LM's."""
    return "autoplan" if any(getattr(cluster.device, f) > 0 for f in HOST_FIELDS) else "megatron"
