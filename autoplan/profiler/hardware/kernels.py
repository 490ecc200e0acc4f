"""Kernel microbenchmarks for ``autoplan calibrate`` on one thread of this machine (what a CPU rank of
``autoplan run`` gets when ranks fill the cores): GEMMs at the shapes transformer layers run, the fused
attention kernel (torch SDPA, causal) over sequence length and head size, forward and backward, and
element-wise kernels at activation sizes. Raw points only; calibration_fit.py fits the fields.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from autoplan.profiler.hardware.compute import median_time_s
from autoplan.schema.hardware import MatmulPoint

CPU = torch.device("cpu")
# m = tokens of a micro-batch, (n, k) = a layer's output and input features: tiny models to ~100M ones
GEMM_TOKENS = (64, 256, 1024)
GEMM_FEATURES = ((64, 64), (256, 64), (64, 256), (768, 768), (3072, 768), (768, 3072))
ATTENTION_SEQ = (32, 64, 128, 256, 512)
ATTENTION_HEAD_DIM = (8, 16, 32, 64, 128)
ATTENTION_BATCH_HEADS = 32
ELEMENTWISE_NUMEL = (1 << 16, 1 << 18, 1 << 20)


def gemm_points(dtype: torch.dtype = torch.float32, name: str = "fp32") -> list[MatmulPoint]:
    points = []
    for m in GEMM_TOKENS:
        for n, k in GEMM_FEATURES:
            a, b = torch.randn(m, k, dtype=dtype), torch.randn(k, n, dtype=dtype)
            seconds = median_time_s(lambda: a @ b, CPU, budget_s=0.1)
            points.append(MatmulPoint(m=m, n=n, k=k, dtype=name, tflops=round(2 * m * n * k / seconds / 1e12, 7)))
    return points


def attention_points() -> list[dict]:
    """SDPA (flash CPU kernel, causal) fp32 at each (seq_len, head_dim): executed FLOPs per second of the
    forward and of the backward (FLOP counts as cost/layer_ops.py: half the scores, backward 2.5 x)."""
    points = []
    bh = ATTENTION_BATCH_HEADS
    for s in ATTENTION_SEQ:
        for d in ATTENTION_HEAD_DIM:
            q, k, v = (torch.randn(1, bh, s, d, requires_grad=True) for _ in range(3))

            def fwd():
                return F.scaled_dot_product_attention(q, k, v, is_causal=True)
            grad = torch.randn_like(fwd())

            def both() -> None:
                fwd().backward(grad)
            fwd_s = median_time_s(fwd, CPU, budget_s=0.1)
            bwd_s = max(1e-9, median_time_s(both, CPU, budget_s=0.1) - fwd_s)
            executed = 0.5 * 4 * bh * s * s * d
            points.append({"seq_len": s, "head_dim": d, "batch_heads": bh, "fwd_s": fwd_s, "bwd_s": bwd_s,
                           "fwd_flops": executed, "bwd_flops": 2.5 * executed})
    return points


def elementwise_points() -> list[dict]:
    """GELU forward (one read, one write of fp32) at activation sizes: achieved bytes per second."""
    points = []
    for numel in ELEMENTWISE_NUMEL:
        x = torch.randn(numel)
        out = torch.empty_like(x)
        seconds = median_time_s(lambda: torch.ops.aten.gelu.out(x, out=out), CPU, budget_s=0.1)
        points.append({"numel": numel, "bytes": 8 * numel, "seconds": seconds})
    return points
