"""``autoplan profile-hardware --nproc 2`` (one spawn of 2 gloo ranks, ~10 s): writes a device profile
and a cluster file that the planner's loaders accept, with fitted fields consistent with the points."""

from __future__ import annotations

import re

import pytest

from autoplan.cli.main import main
from autoplan.schema import load_cluster, load_device


def test_profile_hardware_writes_loadable_device_and_cluster(tmp_path, capsys):
    device_path, cluster_path = tmp_path / "dev.yaml", tmp_path / "cluster.yaml"
    assert main(["profile-hardware", "--nproc", "2", "-o", str(device_path), "--cluster-out", str(cluster_path),
                 "--quiet"]) == 0
    device = load_device(device_path)
    cluster = load_cluster(cluster_path)
    assert cluster.device == device and cluster.devices_per_node == 2 and cluster.backend == "gloo"
    assert {p.dtype for p in device.matmul_points} >= {"fp32", "bf16"}
    best_fp32 = max(p.tflops for p in device.matmul_points if p.dtype == "fp32")
    # no stated CPU peak: the fitted asymptote is the peak, within the spread of the measured points
    assert 0.5 * best_fp32 <= device.peak_fp32_tflops <= 2.0 * best_fp32
    assert 0 < device.memory_efficiency <= 1 and device.kernel_overhead_us > 0
    out = capsys.readouterr().out
    assert cluster.intra_node.bandwidth_gb_per_s > 0
    # the all_reduce n=2 fit is the link (printed to 3 decimals; the file keeps 4, so compare numbers)
    printed = re.search(r"all_reduce\s+n=2\s+alpha\s+\S+\s+busbw\s+(\S+)", out)
    assert printed and float(printed.group(1)) == pytest.approx(cluster.intra_node.bandwidth_gb_per_s, abs=6e-4)
