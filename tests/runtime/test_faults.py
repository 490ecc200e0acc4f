"""Faults on 4 gloo ranks (pp 2 x dp 2, 1F1B), through `autoplan run` as a user starts it.

* SIGTERM to the launcher: it exits 143 and no process of the run is left within 10 s.
* kill -9 of a rank mid-step, mid-save and just after a save, with --max-restarts 1: the launcher starts
  a new torchrun that resumes from the newest complete checkpoint; the metrics hold steps 1-20 once each,
  and every loss and gradient norm equals the uninterrupted run's bit for bit (CPU fp32: the same
  kernels on the same inputs in the same order; the checkpoint carries weights, Adam state and RNG).
* a corrupted newest checkpoint is reported in one line and the previous one is used, again bit for bit.
* a NaN learning rate (injected: the plan's validation refuses one as input) stops the run with one
  line naming the step; the last good checkpoint stays, no later one is written, nothing restarts.
* a rank that hangs ends the job after --timeout with one line naming a rank and the action it waited in.

Faults are injected by ``faults/sitecustomize.py`` (on PYTHONPATH only here). Each test is one
`autoplan run` (two torchruns where it restarts); the uninterrupted reference run is shared.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from autoplan.schema import dump_plan
from rt_helpers import make_plan
from rt_launcher import HERE, ROOT

pytestmark = pytest.mark.slow

STEPS, EVERY = 20, 5
FAULTS = HERE / "faults"


def plan_file(folder: Path) -> Path:
    path = folder / "plan.yaml"
    path.write_text(dump_plan(make_plan(pp=2, dp=2, schedule="1f1b", num_microbatches=2, seq_len=32)))
    return path


def autoplan_run(folder: Path, *extra: str, fault: str = "", steps: int = STEPS, name: str = "run",
                 popen: bool = False):
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": os.pathsep.join([str(FAULTS), str(ROOT)])}
    if fault:
        env["AUTOPLAN_TEST_FAULT"] = fault
    cmd = [sys.executable, "-m", "autoplan.cli.main", "run", str(folder / "plan.yaml"), "--steps", str(steps),
           "--data", "synthetic", "--metrics", str(folder / f"{name}.jsonl"), *extra]
    if popen:
        return subprocess.Popen(cmd, cwd=folder, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    return subprocess.run(cmd, cwd=folder, env=env, capture_output=True, text=True, timeout=600)


def rows(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def left_running(marker: str) -> list[str]:
    """Command lines of live processes that mention ``marker`` (the run's folder)."""
    found = []
    for entry in Path("/proc").glob("[0-9]*"):
        try:
            cmd = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except (OSError, IndexError):
            continue
        if marker in cmd and state != "Z" and int(entry.name) != os.getpid():
            found.append(cmd)
    return found


def error_lines(stderr: str) -> list[str]:
    """What the user reads besides the step lines and the launcher's echo of the torchrun command."""
    return [line for line in stderr.splitlines() if line.strip() and not line.startswith("autoplan run: torchrun ")]


@pytest.fixture(scope="module")
def ref(tmp_path_factory) -> tuple[Path, list[dict]]:
    """The uninterrupted run (with its checkpoints at 5, 10, 15, 20), once for the module."""
    folder = tmp_path_factory.mktemp("reference")
    plan_file(folder)
    proc = autoplan_run(folder, "--checkpoint-dir", str(folder / "ckpt"), "--checkpoint-every", str(EVERY))
    assert proc.returncode == 0, proc.stderr[-3000:]
    got = rows(folder / "run.jsonl")
    assert [r["step"] for r in got] == list(range(1, STEPS + 1))
    return folder, got


def assert_same_run(got: list[dict], want: list[dict]) -> None:
    assert [r["step"] for r in got] == list(range(1, STEPS + 1)), "a step is missing or repeated"
    assert [r["loss"] for r in got] == [r["loss"] for r in want]  # bit for bit
    assert [r["grad_norm"] for r in got] == [r["grad_norm"] for r in want]


@pytest.mark.parametrize("point, rank, step, resumes_from", [
    ("mid-step", 2, 7, "step_5"),      # killed after the backward of step 7, before its update
    ("mid-save", 0, 10, "step_5"),     # killed with its step_10 shard written, COMPLETE not: step_10.tmp
    ("after-save", 3, 15, "step_15"),  # killed just after step_15 was renamed into place
])
def test_killed_rank_restarts_and_matches_the_uninterrupted_run(tmp_path, ref, point, rank, step, resumes_from):
    plan_file(tmp_path)
    fault = f"{point}:{rank}:{step}:{tmp_path / 'fired'}"
    proc = autoplan_run(tmp_path, "--checkpoint-dir", str(tmp_path / "ckpt"), "--checkpoint-every", str(EVERY),
                        "--max-restarts", "1", fault=fault)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert (tmp_path / "fired").exists()
    lines = error_lines(proc.stderr)
    assert f"runtime.torchrun: rank {rank}" in proc.stderr and "killed by SIGKILL" in proc.stderr, lines
    assert any("restarting from" in line and line.rstrip().endswith("(restart 1 of 1)")
               and f"{resumes_from}" in line for line in lines), lines
    assert "Traceback" not in proc.stderr
    assert_same_run(rows(tmp_path / "run.jsonl"), ref[1])
    assert not left_running(str(tmp_path))


def test_damaged_newest_checkpoint_falls_back_to_the_previous(tmp_path, ref):
    folder, want = ref
    plan_file(tmp_path)
    ckpt = tmp_path / "ckpt"
    shutil.copytree(folder / "ckpt", ckpt, ignore=shutil.ignore_patterns(".lock"))
    shutil.rmtree(ckpt / "step_20")
    shard = ckpt / "step_15" / "__1_0.distcp"
    with shard.open("r+b") as f:  # 2,048 float32 values in the middle of a shard
        f.seek(shard.stat().st_size // 2)
        f.write(b"\x00\x00\x80\x3f" * 2048)
    shutil.copy(folder / "run.jsonl", tmp_path / "run.jsonl")  # rows 11-20 must be replaced, not repeated
    proc = autoplan_run(tmp_path, "--checkpoint-dir", str(ckpt), "--checkpoint-every", str(EVERY), "--resume")
    assert proc.returncode == 0, proc.stderr[-3000:]
    damaged = [line for line in error_lines(proc.stderr) if "is damaged" in line]
    assert len(damaged) == 1 and "step_15" in damaged[0] and "__1_0.distcp" in damaged[0], proc.stderr[-2000:]
    assert "steps 11-20" in proc.stdout  # resumed from step_10
    assert_same_run(rows(tmp_path / "run.jsonl"), want)


def test_nan_learning_rate_stops_with_one_line_and_keeps_the_last_good_checkpoint(tmp_path):
    plan_file(tmp_path)
    proc = autoplan_run(tmp_path, "--checkpoint-dir", str(tmp_path / "ckpt"), "--checkpoint-every", str(EVERY),
                        "--max-restarts", "1", fault=f"nan-lr:*:8:{tmp_path / 'fired'}*")
    assert proc.returncode == 3, proc.stderr[-3000:]
    lines = error_lines(proc.stderr)
    assert len(lines) == 1, lines
    assert "stopped at step 9" in lines[0] and "loss is nan" in lines[0] and "step_5" in lines[0], lines
    assert sorted(p.name for p in (tmp_path / "ckpt").iterdir() if p.name.startswith("step_")) == ["step_5"]
    assert [r["step"] for r in rows(tmp_path / "run.jsonl")] == list(range(1, 9))


def test_hung_rank_ends_the_job_after_timeout_with_one_line(tmp_path):
    plan_file(tmp_path)
    t0 = time.monotonic()
    proc = autoplan_run(tmp_path, "--timeout", "5", fault=f"hang:1:4:{tmp_path / 'fired'}")
    wall = time.monotonic() - t0
    assert proc.returncode == 4, proc.stderr[-3000:]
    lines = error_lines(proc.stderr)
    assert len(lines) == 1, lines
    assert "runtime.launch (rank " in lines[0] and "waited longer than --timeout 5 s" in lines[0], lines
    assert "all_reduce" in lines[0] or "pipeline action" in lines[0], lines
    assert "Traceback" not in proc.stderr
    assert wall < 120  # start-up (~15 s) + 3 steps + the 5 s timeout, not torchrun's 30 min default
    assert not left_running(str(tmp_path))


def test_sigterm_to_autoplan_run_leaves_no_process(tmp_path):
    plan_file(tmp_path)
    proc = autoplan_run(tmp_path, steps=400, popen=True)
    metrics = tmp_path / "run.jsonl"
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline and not (metrics.exists() and len(metrics.read_text().splitlines()) >= 2):
        time.sleep(0.2)
    assert metrics.exists(), "the run never reached step 2"
    proc.send_signal(signal.SIGTERM)
    t0 = time.monotonic()
    _, err = proc.communicate(timeout=10)
    while left_running(str(tmp_path)) and time.monotonic() - t0 < 10:
        time.sleep(0.2)
    assert not left_running(str(tmp_path)), left_running(str(tmp_path))
    assert proc.returncode == 128 + signal.SIGTERM
    assert "Traceback" not in err and "stopped on SIGTERM" in err
