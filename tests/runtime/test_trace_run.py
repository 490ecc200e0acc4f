"""A real 2-rank pipeline run under ``autoplan run --trace --timeline``, then ``autoplan compare --trace``: the
measured trace holds every rank's forwards and backwards in the schedule's order, each traced step splits
into terms that add up to it, and compare reads it all back without torch; the phase timeline has every
step's actions in the schedule's order, inside their step, with CPU time never above wall time."""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys

import pytest

from autoplan.schema.schedule import build_schedule
from autoplan.schema.trace import check_trace
from autoplan.schema import load_plan
from rt_launcher import ROOT

STEPS = 5


def autoplan(*argv: str, timeout_s: float = 300) -> subprocess.CompletedProcess:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    return subprocess.run([sys.executable, "-m", "autoplan.cli.main", *argv], capture_output=True, text=True,
                          cwd=ROOT, timeout=timeout_s, env=env)


@pytest.mark.slow
def test_traced_pipeline_run_and_compare(tmp_path):
    plan_path, metrics, trace_dir = tmp_path / "plan.yaml", tmp_path / "m.jsonl", tmp_path / "trace"
    made = autoplan("estimate", "gpt-tiny", "--cluster", "cpu-local", "--devices-per-node", "2", "--global-batch-size",
                    "8", "--seq-len", "32", "--tp", "1", "--pp", "2", "--zero-stage", "0", "--schedule", "1f1b",
                    "--micro-batch-size", "2", "-o", str(plan_path))
    assert made.returncode == 0, made.stderr
    timeline = tmp_path / "timeline.json"
    run = autoplan("run", str(plan_path), "--steps", str(STEPS), "--metrics", str(metrics), "--trace", str(trace_dir),
                   "--timeline", str(timeline))
    assert run.returncode == 0, run.stderr[-3000:]
    summary = run.stdout.strip().splitlines()[-1]
    assert "predicted" in summary and "error" in summary, summary

    plan = load_plan(plan_path)
    rows = [json.loads(line) for line in metrics.read_text().splitlines()]
    assert [bool(r.get("profiled")) for r in rows] == [False, False, True, True, True]  # the last 3, after warm-up
    assert all(len(r["peak_memory_gib_per_rank"]) == 2 for r in rows)
    assert all(r["peak_memory_gib"] == max(r["peak_memory_gib_per_rank"]) for r in rows)

    for name in ("rank0.torch.json", "rank1.torch.json", "rank0.json", "rank1.json"):
        assert (trace_dir / name).stat().st_size > 0
    merged = json.loads((trace_dir / "merged.json").read_text())
    check_trace(merged)
    orders = build_schedule(plan.schedule, plan.pp, plan.virtual_stages, plan.num_microbatches)
    info = merged["otherData"]["autoplan"]
    assert set(info["ranks"]) == {"0", "1"}
    for rank in (0, 1):
        steps = info["ranks"][str(rank)]["steps"]
        assert [s["step"] for s in steps] == [3, 4, 5]
        for s in steps:
            assert sum(s["terms_s"].values()) == pytest.approx(s["duration_s"], rel=1e-9)
            assert s["terms_s"]["compute"] > 0
        events = sorted((e for e in merged["traceEvents"] if e["ph"] == "X" and e["pid"] == rank and e["tid"] == 0),
                        key=lambda e: e["ts"])
        executed = [(e["args"]["stage"], e["name"][0].upper(), e["args"]["microbatch"]) for e in events
                    if e["name"] in ("forward", "backward")]
        expected = [(a.stage, a.kind, a.microbatch) for a in orders[rank]] * len(steps)
        assert executed == expected

    check_timeline(json.loads(timeline.read_text()), orders, [r["step_time_s"] for r in rows])

    cmp = autoplan("compare", str(plan_path), str(metrics), "--trace", str(trace_dir), "--json", timeout_s=60)
    assert cmp.returncode == 0, cmp.stderr
    data = json.loads(cmp.stdout)
    median = statistics.median(r["step_time_s"] for r in rows[1:2])  # warm-up step 1 and profiled 3-5 left out
    assert data["measured_step_time_s"] == pytest.approx(median)
    assert data["step_time_rel_error"] == pytest.approx((plan.predicted.step_time_s - median) / median)
    assert data["measured_breakdown"]["compute"] > 0
    assert data["breakdown_rank"] == data["critical_pp_rank"] * plan.tp * plan.dp  # its dp 0, tp 0 replica
    text = autoplan("compare", str(plan_path), str(metrics), "--trace", str(trace_dir), timeout_s=60)
    assert text.returncode == 0 and "verdict:" in text.stdout and "time split" in text.stdout


def check_timeline(trace: dict, orders, step_times: list[float]) -> None:
    events = [e for e in trace["traceEvents"] if e["ph"] == "X"]
    assert {e["pid"] for e in events} == set(orders)
    for rank in orders:
        mine = sorted((e for e in events if e["pid"] == rank), key=lambda e: e["ts"])
        steps = [e for e in mine if e["name"].startswith("step ")]
        assert [e["name"] for e in steps] == [f"step {i}" for i in range(1, STEPS + 1)]
        for step in steps:
            inside = [e for e in mine if e is not step and step["ts"] <= e["ts"] < step["ts"] + step["dur"]]
            assert all(e["ts"] + e["dur"] <= step["ts"] + step["dur"] + 1 for e in inside)  # 1 us of rounding
            actions = [e["name"].split()[:1] + [int(w) for w in e["name"].split()[1:]] for e in inside
                       if e["name"].split()[0] in ("forward", "backward")]
            expected = [["forward" if a.kind == "F" else "backward", a.stage, a.microbatch] for a in orders[rank]]
            assert actions == expected
            assert {"pipeline", "clip", "optimizer", "loss"} <= {e["name"] for e in inside}
        for e in mine:  # the training thread cannot use more CPU than the time that passed
            assert e["args"]["cpu_ms"] <= e["dur"] / 1e3 * 1.01 + 0.05
    # rank 0's timed step (metrics) lies inside its "step N" phase, which also holds the peak-memory gather
    rank0 = sorted((e for e in events if e["pid"] == 0 and e["name"].startswith("step ")), key=lambda e: e["ts"])
    for e, measured in zip(rank0, step_times):
        assert measured * 1e6 <= e["dur"] + 1
