"""A user's own nn.Module from profile to plan to run (issue 29, part 3; runtime/models/adapter.py): the
MLP-Mixer of examples/custom_model trains under the planner's 4-rank plan and under tp2 / pp2 / dp2 ZeRO-3
/ tp2 with recomputation, each equal to its serial run; what a module plan cannot do is refused in one line.

Tolerance 1e-5 on the loss: fp32 throughout, and the layouts differ from the serial run only in the order
of floating-point sums (TP partial sums all-reduced, replica losses and gradients averaged, micro-batch
gradients accumulated); measured differences are below 5e-7 over 5 steps.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from autoplan.errors import SpecError
from autoplan.schema.fingerprint import plan_fingerprint
from autoplan.schema.io import dump_module_plan, load_any_plan, load_plan
from autoplan.schema.plan import ModulePlan
from module_helpers import MIXER, MIXER_PARAMS, make_module_plan, serial_module_run
from rt_launcher import HERE, ROOT, torchrun

TOLERANCE = 1e-5
STEPS = 5


def write(plan: ModulePlan, path) -> str:
    path.write_text(dump_module_plan(plan))
    return str(path)


def test_module_plan_round_trip_and_fingerprint(tmp_path):
    plan = make_module_plan(tp=2, pp=2, full=(1,))
    again = load_any_plan(write(plan, tmp_path / "p.yaml"))
    assert again == plan
    assert plan_fingerprint(again) == plan_fingerprint(plan) != plan_fingerprint(make_module_plan(tp=2, pp=2))


def test_plan_readers_refuse_a_module_plan_in_one_line(tmp_path):
    path = write(make_module_plan(), tmp_path / "p.yaml")
    with pytest.raises(SpecError, match="your own nn.Module.*autoplan run .* runs it") as err:
        load_plan(path, "autoplan show")
    assert "\n" not in str(err.value)


@pytest.mark.parametrize("change, field", [
    ({"cp": 2, "dp": 1}, "cp"), ({"sequence_parallel": True}, "sequence_parallel"),
])
def test_module_plan_refuses_what_needs_the_sequence_axis(change, field):
    import dataclasses
    plan = dataclasses.replace(make_module_plan(tp=2), **change)
    with pytest.raises(SpecError, match=f"^{field}: .*sequence axis"):
        plan.validate()


def test_module_plan_refuses_selective_recompute():
    import dataclasses
    plan = make_module_plan()
    stage = dataclasses.replace(plan.stages[0], selective_recompute=(1,))
    with pytest.raises(SpecError, match=r"stages\[0\].selective_recompute: .*full_recompute"):
        dataclasses.replace(plan, stages=(stage,)).validate()


def test_runtime_checks_the_factory_against_the_plan():
    from runtime.module_build import check_module
    from module_factories import TINY_PARAMS

    with pytest.raises(SpecError, match="module.total_params: .* 203,594 parameters, the plan says 5"):
        check_module(make_module_plan(total_params=5))
    with pytest.raises(SpecError, match="module.num_blocks"):
        check_module(make_module_plan(num_blocks=2, total_params=MIXER_PARAMS))
    with pytest.raises(SpecError, match="tp: 2 needs the adapter's tp_plan"):
        check_module(make_module_plan("module_factories:build", tp=2, num_blocks=2, total_params=TINY_PARAMS))
    with pytest.raises(SpecError, match="module_noadapter defines no autoplan_adapter"):
        check_module(make_module_plan("module_noadapter:build", num_blocks=2, total_params=TINY_PARAMS))


def test_the_mixer_adapter_rows_do_not_depend_on_the_split():
    import torch
    from examples.custom_model.mixer import autoplan_adapter as a

    x, y = a.batch(3, 0, 6, 1)
    x2, y2 = a.batch(3, 4, 2, 1)
    assert torch.equal(x[4:], x2) and torch.equal(y[4:], y2)


def autoplan(*args: str, cwd) -> subprocess.CompletedProcess:
    env_path = {"PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    import os
    return subprocess.run([sys.executable, "-m", "autoplan.cli.main", *args], capture_output=True, text=True, cwd=cwd,
                          env={**os.environ, **env_path}, timeout=600)


def test_plan_o_writes_a_module_plan_and_refuses_cp(tmp_path):
    profile = tmp_path / "mixer.yaml"
    done = autoplan("profile", MIXER, "--device", "meta", "--micro-batch-sizes", "1,2", "--tp-sizes", "1,2",
                    "-o", str(profile), cwd=ROOT)
    assert done.returncode == 0, done.stderr
    common = [str(profile), "--cluster", "cpu-local", "--devices-per-node", "4", "--global-batch-size", "8",
              "--rescale-profile"]
    refused = autoplan("plan", *common, "--cp", "2", "-o", str(tmp_path / "p.yaml"), cwd=ROOT)
    assert refused.returncode == 2 and "--cp: context parallelism" in refused.stderr
    done = autoplan("plan", *common, "-o", str(tmp_path / "p.yaml"), cwd=ROOT)
    assert done.returncode == 0, done.stderr
    plan = load_any_plan(tmp_path / "p.yaml")
    assert isinstance(plan, ModulePlan) and plan.module.factory == MIXER and plan.world_size == 4


@pytest.mark.slow
def test_mixer_profile_plan_run_four_ranks_equals_serial(tmp_path):
    """autoplan profile -> plan -o (4 gloo ranks) -> autoplan run 5 steps: the losses are the serial run's."""
    profile, plan_path, metrics = tmp_path / "mixer.yaml", tmp_path / "plan.yaml", tmp_path / "m.jsonl"
    done = autoplan("profile", MIXER, "--device", "cpu", "--micro-batch-sizes", "1,2", "--tp-sizes", "1,2",
                    "-o", str(profile), cwd=ROOT)
    assert done.returncode == 0, done.stderr
    from autoplan.schema.profile import load_profile
    from examples.custom_model.mixer import build
    assert load_profile(profile).total_params == sum(p.numel() for p in build()[0].parameters()) == MIXER_PARAMS
    done = autoplan("plan", str(profile), "--cluster", "cpu-local", "--devices-per-node", "4", "--global-batch-size",
                    "8", "--rescale-profile", "-o", str(plan_path), cwd=ROOT)
    assert done.returncode == 0, done.stderr
    done = autoplan("run", str(plan_path), "--steps", str(STEPS), "--metrics", str(metrics), cwd=ROOT)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-4000:]
    losses = [json.loads(line)["loss"] for line in metrics.read_text().splitlines()]
    serial = serial_module_run(load_any_plan(plan_path), STEPS)
    assert len(losses) == STEPS
    assert max(abs(a - b) for a, b in zip(losses, serial)) < TOLERANCE, (losses, serial)


def run_layouts(world: int, layouts: dict[str, dict], folder) -> None:
    """Every layout of ``layouts`` (make_module_plan keywords) in one torchrun launch of ``world`` ranks, each
    compared with its own serial run."""
    plans = {name: make_module_plan(**kw) for name, kw in layouts.items()}
    jobs = [{"name": name, "plan": write(plan, folder / f"{name}.yaml"), "steps": STEPS}
            for name, plan in plans.items()]
    (folder / "jobs.json").write_text(json.dumps(jobs))
    out = folder / "out.json"
    proc = torchrun(world, [str(HERE / "module_worker.py"), str(out), str(folder / "jobs.json")])
    assert proc.returncode == 0 and out.exists(), proc.stdout[-3000:] + proc.stderr[-6000:]
    results = json.loads(out.read_text())
    for name, plan in plans.items():
        serial = serial_module_run(plan, STEPS)
        diff = max(abs(a - b) for a, b in zip(results[name]["losses"], serial))
        assert diff < TOLERANCE, (name, results[name]["losses"], serial)


TWO_RANKS = {"tp2": dict(tp=2), "pp2": dict(pp=2), "dp2_zero3": dict(dp=2, zero=3),
             "tp2_full_recompute": dict(tp=2, full=(1, 2)), "dp2_zero0": dict(dp=2, zero=0)}


@pytest.mark.slow
def test_two_rank_layouts_equal_serial(tmp_path):
    """tp2 (the adapter's ParallelStyles), pp2 (embed on stage 0, head on stage 1), dp2 ZeRO-3 (FSDP2) and
    ZeRO-0 (replicate), tp2 with full recomputation: one torchrun launch, each equal to its serial run."""
    run_layouts(2, TWO_RANKS, tmp_path)


FOUR_RANKS = {"tp2_pp2_interleaved_full": dict(tp=2, pp=2, schedule="interleaved", virtual_stages=2,
                                               full=(0, 1, 2, 3), micro_batch_size=1, num_microbatches=4),
              "tp2_dp2_zero3": dict(tp=2, dp=2, zero=3), "pp2_dp2_zero1": dict(pp=2, dp=2, zero=1)}


@pytest.mark.slow
def test_four_rank_layouts_equal_serial(tmp_path):
    """The axes together: tp x pp (interleaved, every block recomputed), tp x dp (ZeRO-3 over a 2-D mesh),
    pp x dp (ZeRO-1 under the pipeline's once-per-step reduction)."""
    run_layouts(4, FOUR_RANKS, tmp_path)
