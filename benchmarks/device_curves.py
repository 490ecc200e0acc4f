"""The shipped GPU profiles' efficiency curves, where each number comes from, and the refit of each GEMM
curve on the measured GEMMs kept in its profile (``matmul_points``).

For every GPU profile: the GEMM curve at a few transformer-sized GEMMs, the flash-attention share of peak
at a few sequence lengths, the per-field sources; for a profile with measured points, the half size
refitted by least squares with the profile's ceiling (and both parameters free), with the residuals.

    python benchmarks/device_curves.py
"""

from __future__ import annotations

import sys

import numpy as np
from scipy.optimize import curve_fit

from autoplan.cost.compute import gemm_efficiency
from autoplan.schema import load_device
from autoplan.schema.io import shipped_names

SHAPES = [(4096, 4096, 4096), (8192, 4096, 14336), (8192, 8192, 1024), (2048, 1024, 1024)]
SEQS = [1024, 4096, 8192]


def refit(device, dtype: str) -> str:
    points = [p for p in device.matmul_points if p.dtype == dtype]
    if not points:
        return ""
    w = np.array([2.0 * p.m * p.n * p.k / 1e9 for p in points])
    y = np.array([p.tflops for p in points]) / device.peak_tflops(dtype)
    ceiling = device.matmul_efficiency if dtype != "fp8" else device.fp8_matmul_efficiency
    (half,), _ = curve_fit(lambda x, h: ceiling * x / (x + h), w, y, p0=(2.0,), sigma=y)
    (c, h), _ = curve_fit(lambda x, c, h: c * x / (x + h), w, y, p0=(0.8, 2.0), sigma=y)
    residual = np.abs(ceiling * w / (w + half) / y - 1)
    return (f"    refit {dtype} on {len(points)} points: half {half:.2f} GFLOP at ceiling {ceiling:.3f} "
            f"(median residual {100 * np.median(residual):.1f}%, largest {100 * residual.max():.1f}%); "
            f"both free: ceiling {c:.3f}, half {h:.2f}")


def main() -> int:
    for name in shipped_names("hardware"):
        d = load_device(name)
        if d.kind != "gpu":
            continue
        gemms = "  ".join(f"{m}x{n}x{k}: {100 * gemm_efficiency(2.0 * m * n * k, d, 'bf16'):.0f}%" for m, n, k in SHAPES)
        flash = "  ".join(f"s={s}: {100 * d.flash_fwd_efficiency * s / (s + d.flash_half_seq_len):.0f}%/"
                          f"{100 * d.flash_bwd_efficiency * s / (s + d.flash_half_seq_len):.0f}%" for s in SEQS)
        print(f"{name}: bf16 {d.peak_bf16_tflops:g} TF, fp8 {d.peak_fp8_tflops:g} TF, HBM {d.memory_bandwidth_gb_per_s:g}"
              f" GB/s x {d.memory_efficiency}")
        print(f"  GEMM (bf16, share of peak): {gemms}")
        print(f"  flash attention fwd/bwd (share of peak, executed FLOPs): {flash}")
        for dtype in ("bf16", "fp8"):
            line = refit(d, dtype)
            if line:
                print(line)
        for s in d.sources:
            print(f"    {s.field:28s} {getattr(d, s.field)!s:>8s}  {s.source}")
        print()
    return 0


if __name__ == "__main__":
    sys.exit(main())
