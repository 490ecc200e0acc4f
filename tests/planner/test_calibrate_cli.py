"""``autoplan calibrate --from-raw``: the shipped calibration is exactly the fit of the shipped raw points
(so nobody edits a fitted number by hand), and what it writes loads and plans."""

from __future__ import annotations

import pytest

from autoplan.cli.main import main
from autoplan.schema._io import to_dict
from autoplan.schema.io import PROFILES_DIR, load_cluster, load_device

RAW = PROFILES_DIR / "calibration" / "cpu-local-calibrated.raw.json"


def test_shipped_calibration_is_the_fit_of_its_raw_points(tmp_path, capsys):
    device, cluster = tmp_path / "device.yaml", tmp_path / "cluster.yaml"
    assert main(["calibrate", "--from-raw", str(RAW), "-o", str(device), "--cluster-out", str(cluster)]) == 0
    out = capsys.readouterr().out
    assert "residuals" in out and "host_op_us" in out
    fitted, shipped = to_dict(load_device(device)), to_dict(load_device("cpu-calibrated"))
    assert {k: v for k, v in fitted.items() if k != "name"} == {k: v for k, v in shipped.items() if k != "name"}
    fitted_cluster, shipped_cluster = to_dict(load_cluster(cluster)), to_dict(load_cluster("cpu-local-calibrated"))
    for key in ("collectives", "residuals", "cores_per_node", "corun_kernel_slowdown", "corun_host_slowdown",
                "late_receive_us", "intra_node"):
        assert fitted_cluster[key] == shipped_cluster[key]
    assert main(["plan", "gpt-tiny", "--cluster", str(cluster), "--global-batch-size", "16", "--json"]) == 0


def test_raw_points_that_are_not_json_are_one_line(tmp_path, capsys):
    bad = tmp_path / "raw.json"
    bad.write_text("{not json")
    assert main(["calibrate", "--from-raw", str(bad), "-o", str(tmp_path / "d.yaml"),
                 "--cluster-out", str(tmp_path / "c.yaml")]) == 2
    err = capsys.readouterr().err
    assert "--from-raw" in err and len(err.strip().splitlines()) == 1


def test_run_refinement_recovers_the_wait_factor_that_generated_the_runs(tmp_path):
    """Runs whose 'measured' step is the model's prediction at collective_wait_factor 3: the refinement,
    fitted on half of them, finds 3 and predicts the other half."""
    import dataclasses
    import json

    from autoplan.report.refine import refine
    from autoplan.report.simulated import simulate_plan
    from autoplan.schema import load_plan

    cluster = load_cluster("cpu-local-calibrated")
    pairs = []
    for i, flags in enumerate((["--dp", "4"], ["--tp", "2", "--dp", "2"], ["--pp", "2", "--dp", "2"], ["--tp", "4"])):
        plan_path, metrics = tmp_path / f"plan{i}.yaml", tmp_path / f"m{i}.jsonl"
        assert main(["plan", "gpt-tiny", "--cluster", "cpu-local-calibrated", "--global-batch-size", "16", *flags,
                     "-o", str(plan_path)]) == 0
        plan = load_plan(plan_path)
        truth = dataclasses.replace(plan, cluster=dataclasses.replace(plan.cluster, collective_wait_factor=3.0))
        step = simulate_plan(truth).step_s
        metrics.write_text("".join(json.dumps({"step": k, "step_time_s": step, "peak_memory_gib": 0.1}) + "\n"
                                   for k in range(1, 6)))
        pairs.append((str(plan_path), str(metrics)))
    r = refine(cluster, pairs)
    assert r.factor == pytest.approx(3.0, rel=0.02)
    assert r.test_error_after < 0.01 < r.test_error_before
