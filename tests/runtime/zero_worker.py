"""torchrun worker for tests/runtime/test_zero_reductions.py: how many gradient collectives the runtime's data
parallelism issues in one step of M micro-batches without pipelining, per ZeRO stage, on 2 gloo ranks.
Rank 0 writes {zero stage: {"units": FSDP units, "reduce_scatter": n, "all_reduce": n}}.

The model has the runtime's shape for ``apply_data_parallel`` (blocks in ``model.blocks``, each its own unit,
then the root), and the step is the runtime's (runtime/trainer.py without pipelining): ``set_microbatch_sync``
before each micro-batch's backward. The collectives are counted from torch's profiler (the c10d ops)."""

from __future__ import annotations

import sys

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import init_device_mesh
from torch.profiler import ProfilerActivity, profile

from rt_helpers import finish_worker
from runtime.parallel.data_parallel import apply_data_parallel, set_microbatch_sync

MICROBATCHES, BLOCKS, WIDTH = 3, 2, 8


class Model(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Linear(WIDTH, WIDTH)
        self.blocks = nn.ModuleDict({str(i): nn.Linear(WIDTH, WIDTH) for i in range(BLOCKS)})

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.embed(x)
        for block in self.blocks.values():
            x = torch.relu(block(x))
        return x


def count(events, *needles: str) -> int:
    return sum(1 for e in events if any(n in e.name for n in needles))


def main(out: str) -> None:
    dist.init_process_group("gloo")
    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    results = {}
    for zero in (0, 1, 2, 3):
        torch.manual_seed(0)
        model = apply_data_parallel(Model(), mesh, zero, offload=False)
        x = torch.randn(MICROBATCHES, 4, WIDTH) + dist.get_rank()
        model(x[0]).sum().backward()  # a first step outside the count: lazy initialisation's collectives
        model.zero_grad()
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            for i in range(MICROBATCHES):
                set_microbatch_sync(model, zero, i == MICROBATCHES - 1)
                model(x[i]).sum().backward()
        events = prof.events()
        results[zero] = {"units": BLOCKS + 1,
                         "reduce_scatter": count(events, "c10d::_reduce_scatter_base_", "c10d::reduce_scatter_"),
                         "all_reduce": count(events, "c10d::allreduce_")}
    finish_worker(out, results)


if __name__ == "__main__":
    main(sys.argv[1])
