"""``--stack``: a plan is priced for the stack that will run it and records it; the stacks price the same
layout differently where their kernels differ; ``autoplan run`` says when a plan was made for another stack;
a bad name is one line."""

import json

import pytest

from autoplan.cli.main import main
from autoplan.schema import DEFAULT_STACK, load_plan, load_stack
from autoplan.schema.io import shipped_names

ESTIMATE = ["estimate", "llama3-8b", "--cluster", "dgx-h100-80gb", "--nodes", "1", "--global-batch-size", "16",
            "--tp", "2", "--pp", "1", "--zero-stage", "1", "--schedule", "1f1b", "--micro-batch-size", "1",
            "--json"]


def _estimate(capsys, *extra):
    code = main([*ESTIMATE, *extra])
    out, _ = capsys.readouterr()
    assert code == 0
    return json.loads(out)


def test_every_shipped_stack_loads_and_names_its_sources():
    names = shipped_names("stacks")
    assert {"autoplan", "torchtitan", "torchtitan-compile", "megatron", "megatron-lm"} <= set(names)
    for name in names:
        stack = load_stack(name)
        assert stack.name == name
        sourced = {s.field for s in stack.sources} | {f.field for f in stack.fitted}
        # every choice a stack makes about kernels and overlap says where it comes from
        for field in ("elementwise", "tp_input_grad_reduce", "selective_recompute", "param_gather", "grad_reduce",
                      "optimizer_bytes_per_param", "tp_comm_overlap"):
            assert field in sourced, (name, field)


def test_the_default_is_this_runtime_and_eager_kernels_cost_more_than_fused(capsys):
    default = _estimate(capsys)
    assert default["stack"] == DEFAULT_STACK == "autoplan"
    megatron = _estimate(capsys, "--stack", "megatron")
    torchtitan = _estimate(capsys, "--stack", "torchtitan")
    # eager PyTorch runs every memory-bound op as its own kernel, DTensor TP reduces per module: slower
    # than Megatron's fused kernels on the same layout
    assert default["predicted"]["step_time_s"] > 1.1 * megatron["predicted"]["step_time_s"]
    assert torchtitan["predicted"]["step_time_s"] > 1.1 * megatron["predicted"]["step_time_s"]


def test_a_plan_records_its_stack_and_run_warns_about_another(tmp_path, capsys):
    path = tmp_path / "plan.yaml"
    code = main(["estimate", "gpt-tiny", "--cluster", "cpu-local", "--global-batch-size", "4", "--tp", "1",
                 "--pp", "1", "--zero-stage", "0", "--schedule", "1f1b", "--micro-batch-size", "1", "--stack",
                 "torchtitan", "-o", str(path)])
    assert code == 0
    assert load_plan(path).stack == load_stack("torchtitan")
    capsys.readouterr()
    code = main(["run", str(path), "--print-command"])
    _, err = capsys.readouterr()
    assert code == 0
    warnings = [line for line in err.splitlines() if "warning" in line]
    assert len(warnings) == 1 and "'torchtitan'" in warnings[0] and "--stack autoplan" in warnings[0]


def test_an_unknown_stack_is_one_line(capsys):
    assert main([*ESTIMATE, "--stack", "deepspeed"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("autoplan estimate: error: --stack: deepspeed:")


def test_a_stack_is_searched_only_over_the_schedules_it_runs(tmp_path, capsys):
    """Megatron-Core runs 1F1B and interleaved only: a megatron plan never names a schedule Megatron cannot
    run (the default stack, this runtime, picks a zero-bubble one for the same job), and a pinned one it
    cannot run is one line."""
    job = ["plan", "llama3-8b", "--cluster", "dgx-h100-80gb", "--nodes", "1", "--global-batch-size", "32",
           "--pp", "8", "--tp", "1"]
    chosen = {}
    for stack in ("autoplan", "megatron"):
        out = tmp_path / f"{stack}.yaml"
        assert main([*job, "--stack", stack, "-o", str(out)]) == 0
        chosen[stack] = load_plan(out).schedule
    assert chosen["megatron"] in load_stack("megatron").schedules == ("1f1b", "interleaved")
    assert chosen["autoplan"] not in ("1f1b", "interleaved")  # so the restriction is what changed the choice
    capsys.readouterr()
    assert main([*job, "--stack", "megatron", "--schedule", "zbv"]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "--schedule: zbv is not a schedule the megatron stack runs" in err


def test_the_search_itself_keeps_to_the_stacks_schedules():
    """Not only ``autoplan plan``: whoever calls ``search`` with a stack's workload function (a benchmark, the
    infeasibility hint's retries, a library user) gets only the schedules that stack runs, and a pinned one it
    cannot run is refused."""
    import dataclasses

    from autoplan.cost.model_workload import workload_fn
    from autoplan.errors import SpecError
    from autoplan.schema import TrainingSetup, load_cluster, load_model
    from autoplan.search.planner import search
    from autoplan.search.space import Pins

    model = load_model("llama3-8b")
    cluster = dataclasses.replace(load_cluster("dgx-h100-80gb"), num_nodes=1)
    training = TrainingSetup(global_batch_size=32, seq_len=model.seq_len)
    ranked = {}
    for name in ("autoplan", "megatron"):
        fn = workload_fn(model, cluster, training, load_stack(name))
        result = search(model, fn, cluster, training, Pins(pp=8, tp=1), top_k=5)
        ranked[name] = [c.config.schedule for c in result.ranked]
    assert ranked["megatron"] and set(ranked["megatron"]) <= {"1f1b", "interleaved"}
    assert ranked["autoplan"][0] not in ("1f1b", "interleaved")  # the restriction is what keeps megatron's out
    fn = workload_fn(model, cluster, training, load_stack("megatron"))
    with pytest.raises(SpecError, match="zbv is not a schedule the megatron stack runs"):
        search(model, fn, cluster, training, Pins(pp=8, tp=1, schedule="zbv"), top_k=1)
