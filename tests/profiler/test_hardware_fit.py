"""The hardware fits recover known parameters from synthetic points (torch-free)."""

from __future__ import annotations

import pytest

from autoplan.profiler.hardware.fit import fit_alpha_beta, fit_matmul, ring_factor, ring_hops

SIZES = [2.0**k for k in range(10, 26, 2)]


@pytest.mark.parametrize("kind,n", [("all_reduce", 2), ("all_reduce", 8), ("all_gather", 4),
                                    ("reduce_scatter", 3), ("send_recv", 2)])
def test_alpha_beta_recovers_bus_bandwidth_and_per_hop_latency(kind, n):
    hop_us, busbw = 20.0, 150.0  # per-hop latency, GB/s
    times = [ring_hops(kind, n) * hop_us * 1e-6 + ring_factor(kind, n) * s / (busbw * 1e9) for s in SIZES]
    fit = fit_alpha_beta(kind, n, SIZES, times)
    assert fit.busbw_gb_per_s == pytest.approx(busbw, rel=1e-6)
    assert fit.latency_us == pytest.approx(hop_us, rel=1e-6)


def test_ring_factors():
    assert ring_factor("all_reduce", 4) == 1.5 and ring_factor("all_gather", 4) == 0.75
    assert ring_hops("all_reduce", 4) == 6 and ring_hops("reduce_scatter", 4) == 3


def test_matmul_curve_against_stated_peak_and_without():
    peak, ceiling, half = 312.0, 0.7, 0.5
    w = [0.01, 0.1, 1.0, 10.0, 100.0]
    achieved = [peak * ceiling * x / (x + half) for x in w]
    stated = fit_matmul(w, achieved, peak)
    assert stated.ceiling == pytest.approx(ceiling, rel=1e-4)
    assert stated.half_size_gflop == pytest.approx(half, rel=1e-3)
    free = fit_matmul(w, achieved, None)
    assert free.ceiling == 1.0 and free.peak_tflops == pytest.approx(peak * ceiling, rel=1e-4)
