"""Stop on numbers that cannot be trained on: a non-finite loss or gradient norm ends the run with one
line naming the step, and weights that went non-finite are never written into a checkpoint, so the last
checkpoint on disk is always a good one to resume from.

The loss and the gradient norm are already reduced over every rank (the same value everywhere), so
every rank stops at the same step without an extra collective. The weight check (one all-reduce) runs
only before a save.
"""

from __future__ import annotations

import math
from pathlib import Path

import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor


class NonFiniteStop(Exception):
    """Raised on every rank at the same step; ``runtime.launch`` prints it once (rank 0) and exits 3."""

    def __init__(self, step: int, what: str, last_checkpoint: Path | None) -> None:
        where = (f"the last good checkpoint is {last_checkpoint} (resume from it with a lower learning_rate)"
                 if last_checkpoint is not None else "no checkpoint was written")
        super().__init__(f"stopped at step {step}: {what}; {where}")
        self.step = step


def check_step(step: int, loss: float, grad_norm: float | None, last_checkpoint: Path | None) -> None:
    """``step`` is 1-based, as in the metrics; ``grad_norm`` None: not checked (an fp16 step skipped for
    overflow, whose norm is infinite by design)."""
    if not (math.isfinite(loss) and (grad_norm is None or math.isfinite(grad_norm))):
        raise NonFiniteStop(step, f"the loss is {loss} and the gradient norm {grad_norm}", last_checkpoint)


def check_weights(params: list[torch.nn.Parameter], step: int, last_checkpoint: Path | None,
                  device: torch.device) -> None:
    """Collective: NonFiniteStop on every rank if any rank holds a non-finite weight."""
    bad = torch.zeros((), device=device)
    for p in params:
        local = p.to_local() if isinstance(p, DTensor) else p
        if not torch.isfinite(local).all():
            bad.fill_(1.0)
            break
    if dist.is_initialized() and dist.get_world_size() > 1:
        dist.all_reduce(bad, op=dist.ReduceOp.MAX)
    if bad.item() > 0:
        raise NonFiniteStop(step, "the weights are no longer finite after the update (not saved)", last_checkpoint)
