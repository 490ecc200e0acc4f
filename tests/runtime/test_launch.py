"""The command-line paths: `runtime.launch` refuses bad input with one line on every rank (exit 2, no
traceback, no hang), and `autoplan run` trains a hand-made plan on the shipped text and writes metrics."""

from __future__ import annotations

import json
import re
import subprocess
import sys

import pytest

from autoplan.schema import dump_plan
from rt_helpers import make_plan
from rt_launcher import ROOT, torchrun


def write_plan(tmp_path, name="plan.yaml", **kw):
    path = tmp_path / name
    path.write_text(dump_plan(make_plan(**kw)))
    return path


def launch_single(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "runtime.launch", *args], capture_output=True, text=True,
                          cwd=ROOT, timeout=120)


def assert_one_line_error(proc: subprocess.CompletedProcess, *needles: str, ranks: int = 1) -> None:
    assert proc.returncode != 0
    # one error per rank; ranks write at once, so two may share a line of the captured stderr
    lines = [m.group(0) for m in re.finditer(r"runtime\.launch \(rank \d+\): error: .*?(?=runtime\.launch \(rank|$)",
                                             proc.stderr, flags=re.M)]
    assert len(lines) == ranks, proc.stderr[-3000:]
    # no traceback from our code (torchrun itself prints its ChildFailedError traceback after a rank fails)
    assert not any('File "' in l and ("/runtime/" in l or "/autoplan/" in l) for l in proc.stderr.splitlines())
    for needle in needles:
        assert all(needle in l for l in lines), lines


def test_missing_plan_file(tmp_path):
    proc = launch_single(str(tmp_path / "nope.yaml"))
    assert proc.returncode == 2
    assert_one_line_error(proc, "nope.yaml")


def test_missing_data_file(tmp_path):
    plan = write_plan(tmp_path)
    proc = launch_single(str(plan), "--data", str(tmp_path / "tokens.bin"))
    assert proc.returncode == 2
    assert_one_line_error(proc, "--data", "no such file")


def test_tp_must_divide_heads(tmp_path):
    plan = write_plan(tmp_path, tp=2)
    text = plan.read_text().replace("tp: 2", "tp: 16", 1).replace("devices_per_node: 2", "devices_per_node: 16")
    plan.write_text(text)
    proc = launch_single(str(plan))
    assert proc.returncode == 2
    assert_one_line_error(proc, "tp")


@pytest.mark.slow
def test_world_size_mismatch_fails_on_every_rank(tmp_path):
    plan = write_plan(tmp_path, tp=2, dp=2)  # needs 4 processes
    proc = torchrun(2, ["-m", "runtime.launch", str(plan)], timeout_s=120)
    assert_one_line_error(proc, "--nproc_per_node 4", ranks=2)


@pytest.mark.slow
def test_autoplan_run_trains_on_shipped_text(tmp_path):
    plan = write_plan(tmp_path, dp=2, micro_batch_size=4, num_microbatches=2, seq_len=64, learning_rate=3e-3,
                      warmup_steps=5)
    metrics = tmp_path / "metrics.jsonl"
    proc = subprocess.run([sys.executable, "-m", "autoplan.cli.main", "run", str(plan), "--steps", "20",
                           "--metrics", str(metrics)], capture_output=True, text=True, cwd=ROOT, timeout=300,
                          env={**__import__("os").environ, "OMP_NUM_THREADS": "1"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "shakespeare_bytes.bin" in proc.stderr  # the command line it started
    rows = [json.loads(l) for l in metrics.read_text().splitlines()]
    assert [r["step"] for r in rows] == list(range(1, 21))
    for key in ("loss", "step_time_s", "tokens_per_s", "peak_memory_gib", "predicted_step_time_s",
                "predicted_peak_memory_gib"):
        assert key in rows[0]
    first, last = rows[0]["loss"], sum(r["loss"] for r in rows[-5:]) / 5
    # byte-level text: from ~ln(256) = 5.5 a tiny GPT learns byte frequencies within 20 steps (to ~3);
    # random tokens could not fall below ln(256), so > 1.0 nat drop means it learnt from the text
    assert first > 5.0 and last < first - 1.0, [r["loss"] for r in rows]
    assert rows[0]["peak_memory_gib"] > 0
    assert all(r["speed_probe"]["gemm_us"] > 0 and r["speed_probe"]["op_us"] > 0 for r in rows)  # after every step
    assert "loss" in proc.stdout.splitlines()[-1]  # the one-line summary
