"""The calibration's fits recover the parameters that generated their points, and the fidelity
benchmark's rank correlation is Spearman's (scipy's value)."""

from __future__ import annotations

import pytest
from scipy.stats import spearmanr

from autoplan.profiler.hardware.calibration_fit import (
    fit_collectives, fit_host_ops, fit_optimizer, fit_pipeline, spearman,
)
from autoplan.profiler.hardware.fit import ring_factor

SIZES = [4] + [2**k for k in range(10, 23, 2)]


@pytest.mark.parametrize(("kind", "n", "alpha_us", "busbw"), [("all_reduce", 4, 900.0, 0.6), ("all_gather", 2, 350.0, 1.3),
                                                              ("send_recv", 2, 150.0, 2.0),
                                                              ("tp_all_reduce", 2, 3100.0, 0.5), ("tp_all_gather", 4, 2900.0, 0.4)])
def test_alpha_beta_fit_recovers_the_generating_alpha_and_bus_bandwidth(kind, n, alpha_us, busbw):
    points = [{"collective": kind, "group_size": n, "ranks": 4, "bytes": s,
               "seconds": alpha_us * 1e-6 + ring_factor(kind, n) * s / (busbw * 1e9)} for s in SIZES]
    (fit,), residuals = fit_collectives(points)
    assert (fit.collective, fit.group_size, fit.ranks) == (kind, n, 4)
    assert fit.alpha_us == pytest.approx(alpha_us, rel=1e-3)
    assert fit.busbw_gb_per_s == pytest.approx(busbw, rel=1e-3)
    assert len(residuals) == len(SIZES) and max(abs(r.relative) for r in residuals) < 1e-3


def test_host_op_fit_recovers_per_op_and_per_view_costs():
    op_us, view_us, bwd_op_us, bwd_view_us = 7.0, 1.5, 9.0, 2.5
    chains = [{"chain": name, "fwd_compute": c, "fwd_views": v, "bwd_compute": bc, "bwd_views": bv,
               "fwd_s": (c * op_us + v * view_us) * 1e-6, "bwd_s": (bc * bwd_op_us + bv * bwd_view_us) * 1e-6}
              for name, c, v, bc, bv in (("compute", 60, 0, 90, 10), ("views", 0, 96, 0, 96), ("mixed", 24, 36, 30, 40))]
    fields, residuals = fit_host_ops(chains)
    assert fields["host_op_us"] == pytest.approx(op_us) and fields["host_view_op_us"] == pytest.approx(view_us)
    assert fields["host_backward_op_us"] == pytest.approx(bwd_op_us)
    assert fields["host_backward_view_op_us"] == pytest.approx(bwd_view_us)
    assert all(abs(r.relative) < 1e-9 for r in residuals)


def test_optimizer_fit_separates_per_tensor_and_per_parameter_costs():
    tensor_s, dtensor_s, param_s = 40e-6, 180e-6, 6e-9
    points = [{"case": "tiny", "tensors": 64, "numel": 8, "dtensor": False, "seconds": 64 * tensor_s},
              {"case": "tiny-dtensor", "tensors": 64, "numel": 8, "dtensor": True, "seconds": 64 * dtensor_s},
              {"case": "large", "tensors": 4, "numel": 1 << 20, "dtensor": False,
               "seconds": 4 * (tensor_s + (1 << 20) * param_s)}]
    fields, _ = fit_optimizer(points)
    assert fields["optimizer_tensor_us"] == pytest.approx(40.0)
    assert fields["optimizer_dtensor_us"] == pytest.approx(180.0)
    assert fields["optimizer_ns_per_param"] == pytest.approx(6.0, rel=1e-6)


def test_pipeline_action_is_the_slope_per_microbatch_less_the_layer():
    action_s, layer_fwd, layer_bwd, fixed = 300e-6, 20e-6, 40e-6, 5e-3
    step = {str(m): fixed + m * (layer_fwd + layer_bwd + 2 * action_s) for m in (4, 16)}
    fields = fit_pipeline({"microbatches": [4, 16], "step_s": step, "layer_fwd_s": layer_fwd, "layer_bwd_s": layer_bwd})
    assert fields["pipeline_action_us"] == pytest.approx(300.0)


@pytest.mark.parametrize(("xs", "ys"), [([0.1, 0.4, 0.2, 0.9, 0.5], [1.0, 3.0, 2.5, 4.0, 3.5]),
                                        ([1, 2, 2, 3, 5, 4], [6, 5, 4, 4, 1, 2]),
                                        ([3, 1, 2], [1, 2, 3])])
def test_spearman_is_the_rank_correlation_with_ties(xs, ys):
    assert spearman(xs, ys) == pytest.approx(spearmanr(xs, ys).statistic)
