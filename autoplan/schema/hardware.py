"""Device (accelerator) profiles: peak speeds, memory, and the efficiency curves the cost model applies.

Units are in the names: ``_tflops`` = 10^12 FLOP/s, ``_gb_per_s`` = 10^9 bytes/s, ``_gib`` = 2^30 bytes,
``_us`` = microseconds. Every efficiency factor is a named field, and ``sources`` says for each field where
its number came from (a kernel-level public measurement, a datasheet, or ``autoplan profile-hardware``);
``matmul_points`` keeps the measured GEMMs a curve was fitted to. Efficiencies come from kernel-level
measurements (one GEMM, one attention kernel, one collective), never from fitting whole training runs.

The three curves (cost/compute.py):

* GEMM: eff(w) = ceiling * w / (w + half_size), w in GFLOP per call: a fixed ramp-up/tail time per call
  (half_size / (ceiling * peak)) on top of the work at the ceiling.
* fused (flash) attention: eff(s) = ceiling * s / (s + half_seq_len), s the sequence length, separately for
  the forward and the backward kernel, counting the FLOPs the kernel executes (half the scores under a
  causal mask) the way the FlashAttention benchmarks count them.
* memory-bound kernels: bytes read + written over ``memory_efficiency`` x the HBM bandwidth.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Literal

from autoplan.schema._io import require, require_physical, require_range

Precision = Literal["bf16", "fp16", "fp32", "fp8"]
"""``fp8`` means the linear layers' GEMMs in fp8 with per-tensor scaling and everything else in bf16."""


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
class FieldSource:
    """Where the value of one field of the profile comes from (paper and table, or repository and file)."""

    field: str
    source: str


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
    """Share of peak a large GEMM achieves (the ceiling of the GEMM curve)."""
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
    peak_fp8_tflops: float = 0.0
    """Dense fp8 tensor-core peak; 0 for a device without fp8 tensor cores (fp8 plans are refused there)."""
    fp8_matmul_efficiency: float = 0.0
    """Ceiling of the fp8 GEMM curve (share of the fp8 peak)."""
    fp8_matmul_half_size_gflop: float = 0.0
    """Half-efficiency size of the fp8 GEMM curve, GFLOP per call."""
    flash_fwd_efficiency: float = 0.0
    """Share of the bf16 peak the fused attention kernel reaches in its forward at long sequences (executed
    FLOPs). 0: not measured for this device; the attention core then runs on the GEMM curve."""
    flash_bwd_efficiency: float = 0.0
    """The same for the backward kernel, whose executed FLOPs are 2.5 x the forward's (it recomputes the
    scores: five matmuls against two)."""
    flash_half_seq_len: float = 0.0
    """Sequence length (tokens) at which the attention kernel reaches half its ceiling."""
    source: str = ""
    sources: tuple[FieldSource, ...] = ()
    """Per-field sources of the numbers above."""
    matmul_points: tuple[MatmulPoint, ...] = ()

    def validate(self) -> None:
        require(0 < len(self.name) <= 200, "name", "must be 1 to 200 characters")
        # every field with a unit suffix: peaks and bandwidths > 0, times >= 0, efficiencies in (0, 1];
        # the fp8 and flash-attention fields may be 0 where the device has no such kernel or it was not measured
        require_physical(self, zero_means_absent=("peak_fp8_tflops", "fp8_matmul_efficiency", "flash_fwd_efficiency",
                                                  "flash_bwd_efficiency"))
        require(self.flash_half_seq_len >= 0, "flash_half_seq_len", "must be >= 0")
        require(self.peak_fp8_tflops == 0 or self.fp8_matmul_efficiency > 0, "fp8_matmul_efficiency",
                "a device with an fp8 peak needs its fp8 GEMM ceiling")
        require((self.flash_fwd_efficiency > 0) == (self.flash_bwd_efficiency > 0), "flash_bwd_efficiency",
                "give both flash_fwd_efficiency and flash_bwd_efficiency, or neither")
        names = {f.name for f in dataclasses.fields(self)}
        for i, s in enumerate(self.sources):
            require(s.field in names, f"sources[{i}].field", f"{s.field!r} is not a field of a device profile")

    def peak_tflops(self, precision: Precision) -> float:
        return {"bf16": self.peak_bf16_tflops, "fp16": self.peak_fp16_tflops, "fp32": self.peak_fp32_tflops,
                "fp8": self.peak_fp8_tflops}[precision]

    def source_of(self, field: str) -> str:
        """The recorded source of one field ('' if none was given)."""
        return next((s.source for s in self.sources if s.field == field), "")
