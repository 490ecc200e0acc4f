"""Kernel times on one device: the three curves of the device profile (schema/hardware.py), per kernel.

* GEMMs (the linear layers, and the score and attention-over-V products of standard attention): a roofline
  with a fixed cost per call. Work at the ceiling, or the bytes the GEMM must move if that takes longer,
  plus ``half_size / (ceiling * peak)``: the ramp-up and tail of one call. For the work alone this is
  eff(w) = ceiling * w / (w + half_size), the curve fitted to measured GEMMs (benchmarks/device_curves.py).
* fused (flash) attention kernels: executed FLOPs at eff(s) = ceiling * s / (s + half_seq_len) of the bf16
  peak, forward and backward each at its own measured ceiling. A device whose profile carries measured
  ``attention_points`` for the dtype (a CPU, where head_dim sets the kernel's vector efficiency as much
  as the sequence does) runs at the throughput interpolated between them instead (``attention_tflops``).
* memory-bound kernels (norms, residual adds, activations, RoPE, dropout, softmax, casts, the optimizer
  step): bytes read + written over the achieved memory bandwidth, plus a launch cost per kernel.
"""

from __future__ import annotations

import math
from typing import Literal

from autoplan.errors import SpecError
from autoplan.schema import DeviceProfile, Precision


def gemm_curve(device: DeviceProfile, precision: Precision) -> tuple[float, float, float]:
    """(peak FLOP/s, ceiling, half size in FLOP) of the GEMM curve for ``precision``."""
    if precision == "fp8":
        if device.peak_fp8_tflops <= 0:
            raise SpecError(f"precision: {device.name} has no fp8 tensor cores (peak_fp8_tflops is 0); "
                            "use --precision bf16")
        return device.peak_fp8_tflops * 1e12, device.fp8_matmul_efficiency, device.fp8_matmul_half_size_gflop * 1e9
    return device.peak_tflops(precision) * 1e12, device.matmul_efficiency, device.matmul_half_size_gflop * 1e9


def matmul_time_s(flops: float, device: DeviceProfile, precision: Precision, calls: int = 1,
                  bytes_moved: float = 0.0) -> float:
    """``calls`` equal GEMMs of ``flops`` in total, each also moving ``bytes_moved / calls`` bytes."""
    if flops <= 0 or calls <= 0:
        return 0.0
    peak, ceiling, half = gemm_curve(device, precision)
    compute = flops / (peak * ceiling)
    memory = bytes_moved / _bandwidth(device)
    # the curve's fixed cost per call (measured with the GEMM, so no separate launch cost)
    return max(compute, memory) + calls * half / (peak * ceiling)


def gemm_efficiency(flops_per_call: float, device: DeviceProfile, precision: Precision) -> float:
    """Share of peak one compute-bound GEMM of this size achieves (the curve itself, for reports/tests)."""
    peak, ceiling, half = gemm_curve(device, precision)
    return ceiling * flops_per_call / (flops_per_call + half)


def flash_attention_time_s(executed_flops: float, seq_len: int, device: DeviceProfile, precision: Precision,
                           direction: Literal["fwd", "bwd"], calls: int = 1, head_dim: int = 0) -> float:
    """One fused attention kernel per call running ``executed_flops`` at its measured curve (``precision``
    is the activation dtype: bf16 or fp16; fp8 training keeps attention in bf16).

    fp32 (torch's memory-efficient kernel on a GPU, the flash CPU kernel on a CPU) and a device without
    flash measurements (``flash_fwd_efficiency`` 0) run the kernel's matmuls on the GEMM curve instead:
    two per forward, five per backward.
    """
    if executed_flops <= 0:
        return 0.0
    measured = attention_tflops(device, precision, direction, seq_len, head_dim)
    if measured is not None:
        return executed_flops / (measured * 1e12)
    ceiling = device.flash_fwd_efficiency if direction == "fwd" else device.flash_bwd_efficiency
    if ceiling <= 0 or precision == "fp32":
        return matmul_time_s(executed_flops, device, precision, calls=calls * (2 if direction == "fwd" else 5))
    peak = device.peak_tflops(precision) * 1e12
    efficiency = ceiling * seq_len / (seq_len + device.flash_half_seq_len)
    return executed_flops / (peak * efficiency) + calls * device.kernel_overhead_us * 1e-6


def attention_tflops(device: DeviceProfile, precision: Precision, direction: Literal["fwd", "bwd"], seq_len: int,
                     head_dim: int) -> float | None:
    """Executed TFLOP/s of the attention kernel at (seq_len, head_dim), bilinear in (log s, log d) between
    the measured points of ``direction`` in ``precision`` (clamped to their range); None without points."""
    points = [p for p in device.attention_points if p.dtype == precision and p.direction == direction]
    if not points or head_dim <= 0:
        return None
    table = {(p.seq_len, p.head_dim): p.tflops for p in points}
    seqs = sorted({p.seq_len for p in points})
    dims = sorted({p.head_dim for p in points})
    (s0, s1, ws), (d0, d1, wd) = _bracket(seqs, seq_len), _bracket(dims, head_dim)
    corners = [(s0, d0, (1 - ws) * (1 - wd)), (s1, d0, ws * (1 - wd)), (s0, d1, (1 - ws) * wd), (s1, d1, ws * wd)]
    if any((s, d) not in table for s, d, w in corners if w > 0):  # not a full grid: the nearest point
        nearest = min(points, key=lambda p: abs(math.log(p.seq_len / seq_len)) + abs(math.log(p.head_dim / head_dim)))
        return nearest.tflops
    return math.exp(sum(w * math.log(table[(s, d)]) for s, d, w in corners if w > 0))


def _bracket(grid: list[int], x: float) -> tuple[int, int, float]:
    """Neighbours of x on a sorted grid and x's weight towards the upper one, in log space, clamped."""
    if x <= grid[0]:
        return grid[0], grid[0], 0.0
    if x >= grid[-1]:
        return grid[-1], grid[-1], 0.0
    hi = next(i for i, g in enumerate(grid) if g >= x)
    lo, up = grid[hi - 1], grid[hi]
    return lo, up, math.log(x / lo) / math.log(up / lo)


def memory_time_s(bytes_moved: float, device: DeviceProfile, kernels: int = 1) -> float:
    """Memory-bound kernels: bytes read + written over achieved bandwidth, plus launch costs."""
    if bytes_moved <= 0:
        return 0.0
    return bytes_moved / _bandwidth(device) + kernels * device.kernel_overhead_us * 1e-6


def _bandwidth(device: DeviceProfile) -> float:
    return device.memory_bandwidth_gb_per_s * 1e9 * device.memory_efficiency
