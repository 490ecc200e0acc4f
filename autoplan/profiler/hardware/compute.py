"""Single-process measurements: GEMM throughput over shapes and dtypes, memory bandwidth, the fixed cost
of one small kernel, host Adam throughput, and (CUDA) host-to-device bandwidth.

Each measurement runs the operation until ``budget_s`` has passed (at least ``min_reps`` times, after one
warm-up) and keeps the median, so the whole set fits in a few seconds on a small CPU. On CUDA every
timing is bracketed by synchronize.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable

import torch

from autoplan.schema.hardware import MatmulPoint

DTYPE_NAMES = {torch.float32: "fp32", torch.bfloat16: "bf16", torch.float16: "fp16"}


def median_time_s(fn: Callable[[], object], device: torch.device, budget_s: float = 0.15,
                  min_reps: int = 3) -> float:
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    fn()
    sync()
    times: list[float] = []
    start = time.perf_counter()
    while len(times) < min_reps or time.perf_counter() - start < budget_s:
        t0 = time.perf_counter()
        fn()
        sync()
        times.append(time.perf_counter() - t0)
        if len(times) >= 1000:
            break
    return statistics.median(times)


def matmul_points(device: torch.device, dtypes: list[torch.dtype], sizes: list[int],
                  progress: Callable[[str], None] = lambda _: None) -> list[MatmulPoint]:
    """Square GEMMs m = n = k = size, plus a thin one per size (k = size / 4, as a TP shard would be)."""
    points = []
    for dtype in dtypes:
        for size in sizes:
            for m, n, k in ((size, size, size), (size, size, max(16, size // 4))):
                a = torch.randn(m, k, dtype=dtype, device=device)
                b = torch.randn(k, n, dtype=dtype, device=device)
                seconds = median_time_s(lambda: a @ b, device)
                points.append(MatmulPoint(m=m, n=n, k=k, dtype=DTYPE_NAMES[dtype],
                                          tflops=round(2 * m * n * k / seconds / 1e12, 6)))
            progress(f"matmul {DTYPE_NAMES[dtype]} {size}: {points[-2].tflops:.4f} TFLOP/s")
    return points


def copy_bandwidth_gb_per_s(device: torch.device, nbytes: int) -> float:
    """STREAM-copy style: read + write of a buffer larger than the caches."""
    src = torch.empty(nbytes // 4, dtype=torch.float32, device=device).normal_()
    dst = torch.empty_like(src)
    return 2 * nbytes / median_time_s(lambda: dst.copy_(src), device) / 1e9


def elementwise_bandwidth_gb_per_s(device: torch.device, nbytes: int) -> float:
    """What an element-wise kernel (GELU: one read, one write) achieves, the cost model's memory kernels."""
    x = torch.empty(nbytes // 4, dtype=torch.float32, device=device).normal_()
    out = torch.empty_like(x)
    return 2 * nbytes / median_time_s(lambda: torch.ops.aten.gelu.out(x, out=out), device) / 1e9


def kernel_overhead_us(device: torch.device) -> float:
    """Time of an add on 1-element tensors: launch and dispatch cost, no work."""
    a = torch.ones(1, device=device)
    b = torch.ones(1, device=device)
    return median_time_s(lambda: torch.add(a, b), device, budget_s=0.05, min_reps=50) * 1e6


def host_adam_gparams_per_s(numel: int = 4_000_000) -> float:
    """Host fp32 AdamW step throughput (the offloaded optimizer step), 10^9 parameters per second."""
    p = torch.nn.Parameter(torch.zeros(numel))
    p.grad = torch.randn(numel)
    opt = torch.optim.AdamW([p], lr=1e-3, foreach=True)
    return numel / median_time_s(opt.step, torch.device("cpu"), budget_s=0.2) / 1e9


def host_link_gb_per_s(device: torch.device, nbytes: int = 256 * 2**20) -> float:
    """Pinned host-to-device copy bandwidth on CUDA; on CPU the "device" is host memory (copy bandwidth)."""
    if device.type != "cuda":
        return copy_bandwidth_gb_per_s(device, nbytes) / 2
    host = torch.empty(nbytes, dtype=torch.uint8).pin_memory()
    dev = torch.empty(nbytes, dtype=torch.uint8, device=device)
    return nbytes / median_time_s(lambda: dev.copy_(host, non_blocking=True), device) / 1e9
