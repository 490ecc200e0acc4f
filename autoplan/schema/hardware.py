"""Device (accelerator) profiles: peak speeds, memory, and the efficiency factors the cost model applies.

Units are in the names: ``_tflops`` = 10^12 FLOP/s, ``_gb_per_s`` = 10^9 bytes/s, ``_gib`` = 2^30 bytes,
``_us`` = microseconds. Every efficiency factor is a named field; ``source`` says where the numbers came
from (a datasheet, a calibration script, or ``autoplan profile-hardware``) and ``matmul_points`` keeps the
measurements a fitted profile was made from.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from autoplan.schema._io import require

Precision = Literal["bf16", "fp16", "fp32"]


@dataclass(frozen=True)
class MatmulPoint:
    """One measured GEMM: C[m,n] = A[m,k] @ B[k,n] in ``dtype`` ran at ``tflops``."""

    m: int
    n: int
    k: int
    dtype: Precision
    tflops: float


@dataclass(frozen=True)
class DeviceProfile:
    name: str
    kind: Literal["gpu", "cpu"]
    memory_gib: float
    """Memory one device has for training (HBM for a GPU; the share of host RAM one rank may use on CPU)."""
    memory_bandwidth_gb_per_s: float
    peak_bf16_tflops: float
    peak_fp16_tflops: float
    peak_fp32_tflops: float
    matmul_efficiency: float
    """Share of peak a large GEMM achieves (the ceiling of the efficiency curve)."""
    matmul_half_size_gflop: float
    """GEMM size (GFLOP per call) at which efficiency is half the ceiling: eff(w) = ceiling * w / (w + this)."""
    memory_efficiency: float
    """Share of memory bandwidth that element-wise kernels (norms, activations, softmax, dropout) achieve."""
    kernel_overhead_us: float = 0.0
    """Fixed launch cost per kernel; matters for small layers and tiny micro-batches."""
    host_link_gb_per_s: float = 25.0
    """Device-to-host bandwidth (PCIe), used when the optimizer state is offloaded."""
    host_adam_gparams_per_s: float = 1.0
    """Host CPU Adam throughput in 10^9 parameters per second (offloaded optimizer step)."""
    source: str = ""
    matmul_points: tuple[MatmulPoint, ...] = ()

    def validate(self) -> None:
        for field in ("memory_gib", "memory_bandwidth_gb_per_s", "peak_bf16_tflops", "peak_fp16_tflops",
                      "peak_fp32_tflops", "host_link_gb_per_s", "host_adam_gparams_per_s"):
            require(getattr(self, field) > 0, field, "must be positive")
        for field in ("matmul_efficiency", "memory_efficiency"):
            require(0 < getattr(self, field) <= 1, field, "must be in (0, 1]")
        require(self.matmul_half_size_gflop >= 0, "matmul_half_size_gflop", "must be >= 0")
        require(self.kernel_overhead_us >= 0, "kernel_overhead_us", "must be >= 0")

    def peak_tflops(self, precision: Precision) -> float:
        return {"bf16": self.peak_bf16_tflops, "fp16": self.peak_fp16_tflops, "fp32": self.peak_fp32_tflops}[precision]
