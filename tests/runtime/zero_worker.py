"""torchrun worker for tests/runtime/test_zero_reductions.py: how many gradient collectives the runtime's data
parallelism issues in one step of M micro-batches without pipelining, per ZeRO stage, on 2 gloo ranks.
Rank 0 writes {zero stage: {"units": FSDP units, "reduce_scatter": n, "all_reduce": n}}, and under "bf16"
what ZeRO-1 holds of its gradients between two micro-batches with bf16 compute and fp32 reduction (the
runtime's mixed precision on GPUs, runtime/parallel/data_parallel.py ``precision_policy``).

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
    results["bf16"] = accumulated_gradients(mesh)
    finish_worker(out, results)


def accumulated_gradients(mesh) -> dict:
    """ZeRO-1 with bf16 compute, after the first of two micro-batches (gradient sync off): the dtypes and the
    element count of the gradients FSDP2 accumulates (its private ``unsharded_accumulated_grad``, the one place
    they are visible), against the model's parameters."""
    from torch.distributed.fsdp import FSDPModule

    torch.manual_seed(0)
    model = apply_data_parallel(Model(), mesh, 1, offload=False, compute_dtype=torch.bfloat16)
    x = torch.randn(2, 4, WIDTH)
    set_microbatch_sync(model, 1, False)
    model(x[0]).sum().backward()
    grads = []
    for module in model.modules():
        if isinstance(module, FSDPModule):
            group = module._get_fsdp_state()._fsdp_param_group
            grads += [p.unsharded_accumulated_grad for p in (group.fsdp_params if group is not None else [])]
    set_microbatch_sync(model, 1, True)
    model(x[1]).sum().backward()
    return {"dtypes": sorted({str(g.dtype) for g in grads if g is not None}),
            "elements": sum(g.numel() for g in grads if g is not None),
            "parameters": sum(p.numel() for p in model.parameters()),  # DTensors: the global (whole) count
            "shard_grad_dtypes": sorted({str(p.grad.dtype) for p in model.parameters()})}


if __name__ == "__main__":
    main(sys.argv[1])
