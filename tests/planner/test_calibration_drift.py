"""A calibration whose stages ran at different host speeds is put at one speed (profiler/hardware/drift.py)."""

import dataclasses

import pytest

from autoplan.profiler.hardware.drift import at_mean_speed, stage_speeds
from autoplan.schema.cluster import CollectiveFit
from autoplan.schema.io import load_device


def probes(gemm, op):
    return [{"gemm_us": g, "op_us": o} for g, o in zip(gemm, op)]


def test_each_stage_is_put_at_the_mean_speed_of_the_probes():
    """GEMM probes 1000, 1000, 4000, 4000, 1000 us (mean 1741): the kernels stage (probes 0, 1) ran at
    1.741x the mean, so its GEMM peak is divided by 1.741; the collectives stage (probes 2, 3) ran GEMMs at
    1741 / 4000 = 0.435x and ops (8 us against a mean of 4) at 0.5x, so its alphas are multiplied by 0.5 and
    its bandwidths divided by 0.435. The host stage (probes 1, 2: ops 2 and 8 us) ran at the mean, 1.0x."""
    p = probes([1000, 1000, 4000, 4000, 1000], [2, 2, 8, 8, 4])
    speeds = stage_speeds(p)
    ref_gemm = (1000 * 1000 * 4000 * 4000 * 1000) ** 0.2
    ref_op = (2 * 2 * 8 * 8 * 4) ** 0.2
    assert speeds["kernels"].kernel == pytest.approx(ref_gemm / 1000)
    assert speeds["distributed"].kernel == pytest.approx(ref_gemm / 4000)
    assert speeds["distributed"].host == pytest.approx(ref_op / 8)
    assert speeds["host"].host == pytest.approx(ref_op / 4)
    device = dataclasses.replace(load_device("cpu-calibrated"), pipeline_action_us=500.0, host_op_us=5.0,
                                 optimizer_ns_per_param=4.0)
    fit = CollectiveFit("all_reduce", 2, 2, alpha_us=1000.0, busbw_gb_per_s=1.0)
    out, (out_fit,) = at_mean_speed(device, [fit], p)
    assert out.peak_fp32_tflops == pytest.approx(device.peak_fp32_tflops / (ref_gemm / 1000), rel=1e-4)
    assert out.matmul_points[0].tflops == pytest.approx(device.matmul_points[0].tflops / (ref_gemm / 1000), rel=1e-4)
    assert out.host_op_us == pytest.approx(5.0 * ref_op / 4, rel=1e-5)
    # AdamW's per-parameter time is kernel work timed in the host stage (GEMM probes 1000, 4000)
    assert out.optimizer_ns_per_param == pytest.approx(4.0 * ref_gemm / 2000, rel=1e-5)
    assert out.pipeline_action_us == pytest.approx(500.0 * ref_op / 8, rel=1e-5)
    assert out_fit.alpha_us == pytest.approx(1000.0 * ref_op / 8, rel=1e-5)
    assert out_fit.busbw_gb_per_s == pytest.approx(1.0 / (ref_gemm / 4000), rel=1e-4)
    assert out.matmul_efficiency == device.matmul_efficiency  # curve shapes are ratios: untouched


def test_a_steady_host_or_raw_points_without_probes_change_nothing():
    device = load_device("cpu-calibrated")
    fit = CollectiveFit("all_reduce", 2, 2, alpha_us=1000.0, busbw_gb_per_s=1.0)
    assert at_mean_speed(device, [fit], []) == (device, [fit])
    steady, fits = at_mean_speed(device, [fit], probes([1000] * 5, [4] * 5))
    assert steady.peak_fp32_tflops == pytest.approx(device.peak_fp32_tflops) and fits[0].alpha_us == pytest.approx(1000.0)
