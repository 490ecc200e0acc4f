"""benchmarks/gpu_check.py end to end on CPU (--smoke): the one-GPU check's path (plan with the autoplan
stack, run with the profiler, compare term by term) works before a GPU is lent to run it."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def test_help_prints_the_steps_without_running_anything():
    done = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "gpu_check.py"), "--help"],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and "--smoke" in done.stdout


@pytest.mark.slow
def test_smoke_run_compares_prediction_and_measurement_term_by_term(tmp_path):
    done = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "gpu_check.py"), "--smoke", "--out",
                           str(tmp_path)], capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert done.returncode == 0, done.stdout + done.stderr
    data = json.loads((tmp_path / "gpu_check.json").read_text())
    assert data["measured_step_time_s"] > 0 and data["predicted_step_time_s"] > 0
    # the measured step split into the cost model's terms (from the profiler trace), beside the prediction
    assert data["measured_breakdown"]["compute"] > 0 and data["predicted_breakdown"]["compute"] > 0
    assert data["measured_peak_memory_gib"] > 0
    assert "step time" in done.stdout and "compute" in done.stdout
