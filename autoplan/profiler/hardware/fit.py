"""Fitting the measured points (pure functions, no torch): the alpha-beta model of each collective and
the matmul efficiency curve.

Collectives: t(S) = alpha + factor * S / busbw, with factor = 2(n-1)/n for all-reduce, (n-1)/n for
all-gather and reduce-scatter (S = the full, unsharded size) and 1 for send/recv, so that ``busbw`` is
the bus bandwidth the cluster schema stores (what nccl-tests reports) and ``alpha`` the fixed cost. We fit
by non-negative least squares on t against (1, factor*S), weighting each point by 1/t so that the small
messages (which set alpha) count as much as the large ones (which set busbw). The per-hop latency of the
cost model (``autoplan/cost/comm.py``) is alpha / hops, hops = 2(n-1) or n-1 (1 for send/recv).

Matmul: achieved(w) = peak * ceiling * w / (w + half), w = GFLOP per call (``autoplan/cost/compute.py``),
fitted by least squares in (ceiling, half) for a given peak. Without a stated peak the fitted asymptote
is the peak and the ceiling is 1.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from scipy.optimize import curve_fit, nnls


@dataclass(frozen=True)
class AlphaBeta:
    collective: str
    group_size: int
    alpha_us: float
    busbw_gb_per_s: float
    hops: int

    @property
    def latency_us(self) -> float:
        """Per-hop latency, the unit ``Link.latency_us`` is in."""
        return self.alpha_us / max(1, self.hops)


def ring_factor(collective: str, n: int) -> float:
    collective = collective.removeprefix("tp_")  # the same collective as tensor parallelism issues it
    if collective == "all_reduce":
        return 2 * (n - 1) / n
    if collective in ("all_gather", "reduce_scatter"):
        return (n - 1) / n
    return 1.0  # send_recv


def ring_hops(collective: str, n: int) -> int:
    collective = collective.removeprefix("tp_")
    if collective == "all_reduce":
        return 2 * (n - 1)
    if collective in ("all_gather", "reduce_scatter"):
        return n - 1
    return 1


def fit_alpha_beta(collective: str, n: int, sizes_bytes: list[float], times_s: list[float]) -> AlphaBeta:
    """alpha (us) and bus bandwidth (GB/s) from (full size, seconds) points of one collective at size n."""
    s = np.asarray(sizes_bytes, dtype=float)
    t = np.asarray(times_s, dtype=float)
    weight = 1.0 / t
    design = np.stack([np.ones_like(s), ring_factor(collective, n) * s], axis=1) * weight[:, None]
    (alpha_s, inv_bw), _ = nnls(design, t * weight)
    if inv_bw <= 0:  # every point latency-bound: take the largest message's rate as a lower bound
        inv_bw = t[-1] / (ring_factor(collective, n) * s[-1])
    return AlphaBeta(collective, n, float(alpha_s * 1e6), float(1.0 / inv_bw / 1e9), ring_hops(collective, n))


@dataclass(frozen=True)
class MatmulFit:
    peak_tflops: float
    ceiling: float
    half_size_gflop: float


def fit_matmul(gflop_per_call: list[float], tflops: list[float], peak_tflops: float | None) -> MatmulFit:
    """Fit achieved = peak * ceiling * w / (w + half); ``peak_tflops`` None: peak = fitted asymptote."""
    w = np.asarray(gflop_per_call, dtype=float)
    y = np.asarray(tflops, dtype=float)

    def curve(x, top, half):
        return top * x / (x + half)
    (top, half), _ = curve_fit(curve, w, y, p0=(y.max(), float(np.median(w)) * 0.1 + 1e-6),
                               bounds=([1e-9, 0.0], [np.inf, np.inf]), maxfev=20000)
    if peak_tflops is None:
        return MatmulFit(float(top), 1.0, float(half))
    return MatmulFit(peak_tflops, min(1.0, float(top) / peak_tflops), float(half))
