"""Kernel times on one device: matmuls at a size-dependent share of peak, element-wise ops at a share of
memory bandwidth, plus a fixed launch cost per kernel.

Matmul efficiency follows a saturating curve, eff(w) = ceiling * w / (w + w_half), w in GFLOP per call:
small GEMMs (thin TP shards, tiny micro-batches) cannot fill the device, large ones approach the ceiling.
Both parameters are named fields of the device profile, calibrated on published runs
(benchmarks/calibrate.py) or fitted by ``autoplan profile-hardware``.
"""

from __future__ import annotations

from autoplan.schema import DeviceProfile, Precision


def matmul_time_s(flops: float, device: DeviceProfile, precision: Precision) -> float:
    if flops <= 0:
        return 0.0
    gflop = flops / 1e9
    efficiency = device.matmul_efficiency * gflop / (gflop + device.matmul_half_size_gflop)
    return flops / (device.peak_tflops(precision) * 1e12 * efficiency) + device.kernel_overhead_us * 1e-6


def memory_time_s(bytes_moved: float, device: DeviceProfile, kernels: int = 1) -> float:
    """Memory-bound kernels: bytes read + written over achieved bandwidth, plus launch costs."""
    if bytes_moved <= 0:
        return 0.0
    bandwidth = device.memory_bandwidth_gb_per_s * 1e9 * device.memory_efficiency
    return bytes_moved / bandwidth + kernels * device.kernel_overhead_us * 1e-6
