"""``autoplan run PLAN --dry-run``: a rank of the real plan built on the meta device over a fake process
group holds exactly the parameters the plan's cost model counted (predicted.local_params_per_rank,
autoplan/cost/local_params.py) -- after the TP split, the pipeline split and FSDP2's padded ZeRO-3
shards -- and the layers the plan gave its stages."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys

import pytest

from autoplan.cli.dry_run import ranks_of
from autoplan.cost.local_params import local_params_per_rank
from autoplan.schema import dump_plan, load_model, load_plan
from rt_cases import GPT_TANH, QWEN3ISH
from rt_helpers import make_plan
from rt_launcher import ROOT
from rt_plans import planner_plan

LAYOUTS = [
    dict(tp=2, pp=2, dp=2, zero=3, schedule="1f1b"),  # gpt: tied head copy on the last stage, sharded
    dict(tp=2, pp=2, dp=2, zero=1, sp=True, schedule="gpipe"),  # ZeRO 1: whole TP-local tensors
    dict(dp=3, zero=3),  # uneven FSDP chunks (256 / 3 rows): padded to ceil on every rank
    dict(tp=4, dp=2, zero=2, offload=True),
    dict(dp=2, zero=0),  # replicate
    dict(model="llama-tiny", tp=2, pp=2, dp=2, zero=3, schedule="interleaved", virtual_stages=2),
    dict(model="llama-tiny", pp=3, dp=2, zero=3, schedule="gpipe", stage_sizes=[2, 3, 3], full=(0, 1)),
    dict(model="llama-tiny", tp=4, pp=2, zero=0, schedule="1f1b", num_microbatches=2),
    # a V: rank 0 holds stages 0 and 3 (embedding and the tied head copy), rank 1 stages 1 and 2
    dict(tp=2, pp=2, dp=2, zero=1, schedule="zbv", virtual_stages=2, num_microbatches=4),
    dict(cp=2, dp=3, zero=3),  # ZeRO-3 over the 6 dp x cp ranks: 256 / 6 rows, padded
    dict(model="llama-tiny", tp=2, pp=2, cp=2, zero=3, schedule="1f1b"),
    # a 300-token vocabulary padded to 512 rows at tp2 (128 x tp), then cut in uneven ZeRO-3 chunks
    dict(model=dataclasses.replace(load_model("gpt-tiny"), name="gpt-tiny-v300", vocab_size=300), tp=2, pp=2,
         dp=3, zero=3, schedule="1f1b"),
    # Hugging Face families: q/k/v biases split with their weights, q/k norms (12 channels) whole per TP rank
    # then cut in uneven ZeRO-3 chunks; gpt's 64-row position table at seq_len 32
    dict(model=QWEN3ISH, tp=2, pp=2, dp=3, zero=3, schedule="1f1b"),
    dict(model=QWEN3ISH, tp=4, sp=True, dp=2, zero=1),
    dict(model=GPT_TANH, tp=2, dp=2, zero=3),
]


def layout_id(kw: dict) -> str:
    return "-".join(f"{k}{getattr(v, 'name', v)}" for k, v in kw.items())


@pytest.mark.parametrize("kw", LAYOUTS, ids=layout_id)
def test_built_rank_holds_the_counted_parameters(kw):
    from runtime.dry_run import dry_run

    plan = make_plan(**kw)
    expected = local_params_per_rank(plan.model, plan.layout(), plan.training)
    for rank in (0, plan.world_size - 1):
        got = dry_run(plan, rank)  # in-process: the fake process group needs no other ranks
        assert got["local_params"] == expected[got["pp_rank"]], (rank, got)
        built = [(s["index"], tuple(s["layers"])) for s in got["stages"]]
        assert built == [(s.index, s.layers) for s in plan.stages if s.rank == got["pp_rank"]]


def test_cli_dry_run_of_a_planner_plan(tmp_path):
    # the plan of issue 7's defect: tied embedding x TP x PP (+SP), as the planner writes it; its last
    # rank holds the head's copy of the embedding (one process per rank: one rank keeps the test short)
    path = tmp_path / "p.yaml"
    plan = planner_plan(path, "gpt-tiny", 4, {"tp": 2, "pp": 2, "dp": 1, "schedule": "1f1b"})
    proc = subprocess.run([sys.executable, "-m", "autoplan.cli.main", "run", str(path), "--dry-run", "--rank", "3",
                           "--json"], capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    [row] = json.loads(proc.stdout)
    assert row["rank"] == 3 and row["stages"][0]["head"] and not row["stages"][0]["embedding"]
    assert row["local_params"] == row["expected_local_params"] == plan.predicted.local_params_per_rank[1]
    assert ranks_of(plan, None) == [0, 3]  # the default: the first and the last rank


def test_cli_dry_run_counts_from_the_model_not_the_predicted_block(tmp_path):
    """The expected count is the cost model's count for the plan's model and layout; a predicted block
    edited by hand is named, not trusted (issue 33)."""
    plan = planner_plan(tmp_path / "planned.yaml", "gpt-tiny", 2, {"tp": 2, "pp": 1, "dp": 1})
    counted = local_params_per_rank(plan.model, plan.layout(), plan.training)
    assert plan.predicted.local_params_per_rank == counted
    path = tmp_path / "p.yaml"
    path.write_text(dump_plan(dataclasses.replace(plan, predicted=dataclasses.replace(
        plan.predicted, local_params_per_rank=(7,)))))
    proc = subprocess.run([sys.executable, "-m", "autoplan.cli.main", "run", str(path), "--dry-run", "--rank", "1"],
                          capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    [row] = [line.split() for line in proc.stdout.splitlines() if line.startswith("1 ")]
    assert row[2:5] == [f"{counted[0]:,}", f"{counted[0]:,}", "yes"]  # built, expected, match
    assert f"predicted.local_params_per_rank [7] differs from its model and layout's [{counted[0]}]" in proc.stdout


def test_cli_dry_run_refuses_a_rank_outside_the_plan(tmp_path):
    path = tmp_path / "p.yaml"
    path.write_text(dump_plan(make_plan(tp=2)))
    proc = subprocess.run([sys.executable, "-m", "autoplan.cli.main", "run", str(path), "--dry-run", "--rank", "2"],
                          capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == ["autoplan run: error: --rank: 2 is outside the plan's world of 2 "
                                                "ranks (0 to 1)"]


@pytest.mark.slow
def test_llama3_70b_on_1024_gpus(tmp_path):
    """The issue's real-size plan: both default ranks build and hold what the plan counted (wall time
    and memory are measured by benchmarks/dry_run_real_size.py, not asserted here)."""
    path = tmp_path / "p70.yaml"
    proc = subprocess.run([sys.executable, "-m", "autoplan.cli.main", "plan", "llama3-70b", "--cluster",
                           "dgx-h100-80gb", "--nodes", "128", "--global-batch-size", "1024", "--seq-len", "8192",
                           "--json", "-o", str(path)], capture_output=True, text=True, cwd=ROOT, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    plan = load_plan(path)
    proc = subprocess.run([sys.executable, "-m", "autoplan.cli.main", "run", str(path), "--dry-run", "--json"],
                          capture_output=True, text=True, cwd=ROOT, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = json.loads(proc.stdout)
    assert [r["rank"] for r in rows] == [0, plan.world_size - 1] and plan.world_size == 1024
    for r in rows:
        assert r["local_params"] == r["expected_local_params"]
