"""Training a user's own module (a ``ModulePlan``): the Trainer's step and loop (runtime/trainer.py) with
the adapter's data and loss in place of the token source and cross-entropy (runtime/models/adapter.py)."""

from __future__ import annotations

import torch
from torch.distributed.tensor import DTensor

from autoplan.schema.plan import ModulePlan
from runtime.device import MemoryMeter, autocast_dtype
from runtime.mesh import ParallelMesh
from runtime.module_build import build_module_parts
from runtime.parallel.data_parallel import set_microbatch_sync
from runtime.train.profiling import region
from runtime.train.trace_phases import BACKWARD, FORWARD
from runtime.trainer import Trainer

class ModuleTrainer(Trainer):
    """``Trainer`` for a ``ModulePlan``: the parts from runtime/module_build.py; ``_batch`` asks the adapter for
    this replica's rows, ``_single_stage`` takes the adapter's loss."""

    def __init__(self, plan: ModulePlan, pm: ParallelMesh) -> None:
        # not super().__init__: it builds a Plan's parts from a ModelSpec; the fields it sets are set here
        self.plan, self.pm, self.data = plan, pm, None
        self.meter = MemoryMeter(pm.device)
        self.parts, self.adapter = build_module_parts(plan, pm, self.meter)
        self.amp = autocast_dtype(pm.device, plan.training.precision)
        self.clock = None

    def _batch(self, step: int) -> tuple[torch.Tensor, torch.Tensor]:
        plan, pm = self.plan, self.pm
        rows = plan.training.global_batch_size // plan.dp
        x, y = self.adapter.batch(step, pm.dp_rank * rows, rows, plan.training.seed)
        return x.to(pm.device), y.to(pm.device)

    def _single_stage(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        plan, model, n = self.plan, self.parts.models[0], self.plan.num_microbatches
        total = torch.zeros((), device=self.pm.device)
        for i, (xm, ym) in enumerate(zip(x.chunk(n), y.chunk(n))):
            set_microbatch_sync(model, plan.zero_stage, i == n - 1)
            with region(FORWARD, 0, i):
                loss = self.adapter.loss(model(xm), ym) / n
            with region(BACKWARD, 0, i):
                self.parts.loss_scale.scale(loss).backward()
            loss = loss.detach()
            total += loss.full_tensor() if isinstance(loss, DTensor) else loss
        return total
