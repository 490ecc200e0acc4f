"""Device (accelerator) profiles: peak speeds, memory, and the efficiency factors the cost model applies.

Units are in the names: ``_tflops`` = 10^12 FLOP/s, ``_gb_per_s`` = 10^9 bytes/s, ``_gib`` = 2^30 bytes,
``_us`` = microseconds. Every efficiency factor is a named field; ``source`` says where the numbers came
from (a datasheet, a calibration script, or ``autoplan profile-hardware``) and ``matmul_points`` keeps the
measurements a fitted profile was made from.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from autoplan.schema._io import require, require_physical, require_range

Precision = Literal["bf16", "fp16", "fp32"]


@dataclass(frozen=True)
class MatmulPoint:
    """One measured GEMM: C[m,n] = A[m,k] @ B[k,n] in ``dtype`` ran at ``tflops``."""

    m: int
    n: int
    k: int
    dtype: Precision
    tflops: float

    def validate(self) -> None:
        for field in ("m", "n", "k"):
            require_range(self, field, 1, 2**24)
        require_range(self, "tflops", 0.0, 1e6, low_open=True)


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
        require(0 < len(self.name) <= 200, "name", "must be 1 to 200 characters")
        # every field with a unit suffix: peaks and bandwidths > 0, times >= 0, efficiencies in (0, 1]
        require_physical(self)

    def peak_tflops(self, precision: Precision) -> float:
        return {"bf16": self.peak_bf16_tflops, "fp16": self.peak_fp16_tflops, "fp32": self.peak_fp32_tflops}[precision]
