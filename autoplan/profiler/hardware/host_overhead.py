"""Microbenchmarks of the host (framework) time of eager PyTorch on one rank, the fields a CPU profile
needs besides its kernels (schema/hardware.py): per eager op and view forward and backward, per
DTensor-parallelised module, per optimizer tensor and parameter, and the process's memory baseline.

Each benchmark times work that is negligible next to its framework cost (tensors of a few elements), so
what it measures is the host time itself; ``autoplan/profiler/hardware/calibration_fit.py`` (torch-free)
turns the raw points into fields. Everything runs in one spawned process with a process group of one
(DTensor needs a mesh; the memory baseline needs a fresh process), one intra-op thread, as each rank of
``autoplan run`` on a CPU has.

Op counts are what ``op_count.count_ops`` sees, the same counter the cost model's per-layer counts come
from, so an op priced here is an op counted there.
"""

from __future__ import annotations

import json
import os
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import torch
import torch.multiprocessing as mp
import torch.nn.functional as F
from torch import nn

from autoplan.profiler.hardware.op_count import OpCount, count_ops

CHAIN_REPEATS = 12


def median_s(fn: Callable[[], object], budget_s: float = 0.3, min_reps: int = 15) -> float:
    """Median wall time of ``fn`` after three warm-up calls (CPU: no synchronisation needed)."""
    for _ in range(3):
        fn()
    times: list[float] = []
    start = time.perf_counter()
    while len(times) < min_reps or time.perf_counter() - start < budget_s:
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
        if len(times) >= 2000:
            break
    return statistics.median(times)


def _compute_chain(x: torch.Tensor) -> torch.Tensor:
    """Ops of the kinds a layer runs between its GEMMs: elementwise, norm, activation, reduction."""
    for _ in range(CHAIN_REPEATS):
        x = x * 1.001
        x = x + 0.5
        x = F.gelu(x)
        x = F.layer_norm(x, x.shape[-1:])
        x = x - x.mean(dim=-1, keepdim=True)
    return x


def _view_chain(x: torch.Tensor) -> torch.Tensor:
    """View ops only (metadata: no kernel, no allocation of data)."""
    for _ in range(CHAIN_REPEATS):
        x = x.view(2, 4, 8).transpose(1, 2).transpose(1, 2).view(2, 32).t().unsqueeze(0).squeeze(0).t()
    return x


def _mixed_chain(x: torch.Tensor) -> torch.Tensor:
    for _ in range(CHAIN_REPEATS):
        x = F.gelu(x.view(2, 4, 8).transpose(1, 2).reshape(2, 32)) + 0.5
    return x


CHAINS = {"compute": _compute_chain, "views": _view_chain, "mixed": _mixed_chain}


def op_chain_points(rounds: int = 9) -> list[dict]:
    """Per chain: the forward and backward op counts (compute, views) and times of a [2, 32] fp32 input.

    The chains are timed in turn, ``rounds`` times, and each time is the median over the rounds: the
    fit separates per-op from per-view cost by the chains' differences, and a shared host that drifts
    by 30% within a second (one chain timed in a slow moment, the next in a fast one) made one calibration's
    view cost twice the last's when each chain was timed once, in a block."""
    chains = []
    for name, chain in CHAINS.items():
        x = torch.randn(2, 32, requires_grad=True)
        fwd_count, out, _ = count_ops(lambda c=chain, x=x: c(x))
        grad = torch.ones_like(out)
        bwd_count, _, _ = count_ops(lambda o=out, g=grad: o.backward(g))
        chains.append((name, chain, x, grad, fwd_count, bwd_count))
    fwd: dict[str, list[float]] = {c[0]: [] for c in chains}
    bwd: dict[str, list[float]] = {c[0]: [] for c in chains}
    for _ in range(rounds):
        for name, chain, x, grad, _, _ in chains:
            fwd_s = median_s(lambda c=chain, x=x: c(x), budget_s=0.03, min_reps=7)
            both_s = median_s(lambda c=chain, x=x, g=grad: c(x).backward(g), budget_s=0.03, min_reps=7)
            fwd[name].append(fwd_s)
            bwd[name].append(max(0.0, both_s - fwd_s))
    return [{"chain": name, "fwd_compute": _host(fc)[0], "fwd_views": _host(fc)[1],
             "bwd_compute": _host(bc)[0], "bwd_views": _host(bc)[1],
             "fwd_s": statistics.median(fwd[name]), "bwd_s": statistics.median(bwd[name])}
            for name, _, _, _, fc, bc in chains]


def _host(count: OpCount) -> tuple[int, int]:
    return count.compute, count.views


def tp_module_points(mesh) -> dict:
    """Extra forward / backward time per DTensor-parallelised linear: eight tiny linears, Colwise then
    Rowwise in turn (Megatron's pairs), against the same eight plain linears, on a one-rank mesh."""
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

    def make() -> nn.Sequential:
        torch.manual_seed(0)
        return nn.Sequential(*[nn.Linear(16, 16) for _ in range(8)])

    x = torch.randn(2, 4, 16)
    plain, tp = make(), make()
    parallelize_module(tp, mesh, {str(i): ColwiseParallel() if i % 2 == 0 else RowwiseParallel() for i in range(8)})
    out = {}
    for label, model in (("plain", plain), ("tp", tp)):
        fwd = median_s(lambda: model(x))

        def both(m=model) -> None:
            m(x).sum().backward()
        out[f"{label}_fwd_s"], out[f"{label}_bwd_s"] = fwd, max(0.0, median_s(both) - fwd)
    out["modules"] = 8
    return out


def optimizer_points(mesh) -> list[dict]:
    """The runtime's optimizer step as the trainer runs it (clip_grad_norm over all grads, then AdamW
    tensor by tensor): many tiny tensors (per-tensor cost), plain and DTensor, and a few large ones (the
    per-parameter cost)."""
    from torch.distributed.tensor import Shard, distribute_tensor

    from autoplan.schema import TrainingSetup
    from runtime.train.optim import build_optimizer, clip_grad_norm

    training = TrainingSetup(global_batch_size=1, seq_len=1, precision="fp32")
    points = []
    for label, tensors, numel, dtensor in (("tiny", 64, 8, False), ("tiny-dtensor", 64, 8, True),
                                           ("large", 4, 1 << 20, False)):
        model = nn.Module()
        for i in range(tensors):
            value = torch.randn(numel // 2, 2) * 0.01
            if dtensor:
                value = distribute_tensor(value, mesh, [Shard(0)])
            model.register_parameter(f"p{i}", nn.Parameter(value))
        for p in model.parameters():
            p.grad = torch.randn_like(p) * 0.01
        optimizer = build_optimizer(model, training)
        params = list(model.parameters())

        def step() -> None:
            clip_grad_norm(params, 1.0, 1, set())
            optimizer.step()
        points.append({"case": label, "tensors": tensors, "numel": numel, "dtensor": dtensor,
                       "seconds": median_s(step, budget_s=0.5, min_reps=5)})
    return points


def _worker(rank: int, tmp: str, out: str) -> None:
    torch.set_num_threads(1)
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    import runtime.trainer  # noqa: F401  (what a training process imports, for the baseline)
    from runtime.device import heap_in_use_bytes

    dist.init_process_group("gloo", init_method=f"file://{tmp}/rendezvous", rank=rank, world_size=1)
    mesh = init_device_mesh("cpu", (1,))
    baseline = heap_in_use_bytes()  # torch, its distributed packages, the runtime, one process group
    result = {"heap_baseline_bytes": baseline, "chains": op_chain_points(), "tp_modules": tp_module_points(mesh),
              "optimizer": optimizer_points(mesh)}
    Path(out).write_text(json.dumps(result))
    dist.destroy_process_group()


def measure_host_overhead() -> dict:
    """All host-overhead points, measured in one spawned process (see the module doc)."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "host.json"
        os.environ.setdefault("OMP_NUM_THREADS", "1")
        mp.spawn(_worker, args=(tmp, str(out)), nprocs=1, join=True)
        return json.loads(out.read_text())
