"""``autoplan export``: a plan in torchtitan's and Megatron-LM's own configuration.

The torchtitan job file goes through torchtitan's own config loader (torchtitan.config.ConfigManager, the
package's config module only) and must come back with the plan's degrees, stage split, batch and
recomputation. Every Megatron argument names the Megatron-Core config field it sets; those names are
checked against the dataclasses of the installed megatron-core (read with ast, nothing imported). What a
target cannot express is one line naming the nearest it can.
"""

from __future__ import annotations

import ast
import dataclasses
import importlib.metadata
import importlib.util
import sys
import types
from pathlib import Path

import pytest

from autoplan.cli.main import main
from autoplan.export import ExportError, megatron_arguments, torchtitan_toml
from autoplan.export.megatron import GPT_MODEL, TRAINING_LOOP
from autoplan.schema import Stage, load_plan

ESTIMATE = ["estimate", "llama3-8b", "--cluster", "dgx-h100-80gb", "--global-batch-size", "64", "--micro-batch-size",
            "1", "--stack", "torchtitan"]


def _plan(tmp_path, *flags):
    path = tmp_path / f"plan{len(list(tmp_path.iterdir()))}.yaml"
    assert main([*ESTIMATE, *flags, "-o", str(path)]) in (0, 3)  # 3: does not fit; still a plan to export
    return path, load_plan(path)


def _torchtitan_config_manager():
    """torchtitan's ConfigManager without running torchtitan/__init__.py (which loads its model zoo)."""
    if "torchtitan" not in sys.modules:
        spec = importlib.util.find_spec("torchtitan")
        if spec is None:
            pytest.skip("torchtitan is not installed (.ci/run installs it: pip install --no-deps torchtitan==0.2.2)")
        pkg = types.ModuleType("torchtitan")
        pkg.__path__ = list(spec.submodule_search_locations)
        sys.modules["torchtitan"] = pkg
    from torchtitan.config import ConfigManager

    return ConfigManager


def _load_toml(tmp_path, text: str):
    path = tmp_path / "job.toml"
    path.write_text(text)
    return _torchtitan_config_manager()().parse_args(["--job.config_file", str(path)])


LAYOUTS = {
    "pp4 interleaved, ZeRO 3, full": ["--nodes", "2", "--tp", "2", "--pp", "4", "--sequence-parallel", "--zero-stage",
                                      "3", "--schedule", "interleaved", "--virtual-stages", "2", "--recompute", "full"],
    "pp2 1f1b, ZeRO 2, selective": ["--nodes", "1", "--tp", "4", "--pp", "2", "--sequence-parallel", "--zero-stage",
                                    "2", "--schedule", "1f1b", "--recompute", "selective"],
    "fsdp only, cp 2, no recompute": ["--nodes", "1", "--tp", "1", "--pp", "1", "--cp", "2", "--zero-stage", "3",
                                      "--schedule", "1f1b", "--recompute", "none"],
    "ddp tp 8, full": ["--nodes", "2", "--tp", "8", "--pp", "1", "--sequence-parallel", "--zero-stage", "0",
                  "--schedule", "1f1b", "--recompute", "full"],
    "pp4 zbv, ZeRO 2, no recompute": ["--nodes", "2", "--tp", "2", "--pp", "4", "--sequence-parallel", "--zero-stage",
                                      "2", "--schedule", "zbv", "--virtual-stages", "2", "--recompute", "none"],
}


@pytest.mark.parametrize("name", LAYOUTS)
def test_torchtitan_loads_the_job_file_with_the_plans_layout(tmp_path, name):
    _, plan = _plan(tmp_path, *LAYOUTS[name])
    job = _load_toml(tmp_path, torchtitan_toml(plan))
    p = job.parallelism
    assert (p.tensor_parallel_degree, p.pipeline_parallel_degree, p.context_parallel_degree) == (plan.tp, plan.pp, plan.cp)
    assert p.data_parallel_replicate_degree * p.data_parallel_shard_degree == plan.dp
    assert (p.data_parallel_shard_degree > 1) == (plan.zero_stage >= 2 and plan.dp > 1)
    assert job.training.global_batch_size == plan.training.global_batch_size
    assert job.training.seq_len == plan.training.seq_len
    if plan.pp > 1:
        # the plan's exact stage split, and its micro-batches
        assert [[f for f in part if f.startswith("layers.")] for part in p.module_fqns_per_model_part] == \
            [[f"layers.{i}" for i in range(*s.layers)] for s in plan.stages]
        assert job.training.local_batch_size // p.pipeline_parallel_microbatch_size == plan.num_microbatches
        assert p.pipeline_parallel_schedule == {"1f1b": "1F1B", "interleaved": "Interleaved1F1B",
                                                "zbv": "ZBVZeroBubble"}[plan.schedule]
    else:  # gradient accumulation over the plan's micro-batches
        assert job.training.global_batch_size // (job.training.local_batch_size * plan.dp) == plan.num_microbatches
    mode = name.rsplit(", ", 1)[1].replace("no recompute", "none")
    assert job.activation_checkpoint.mode == mode
    if mode == "selective":
        assert job.activation_checkpoint.selective_ac_option == "op"
    assert job.model.flavor == "8B"


def _with_recompute(plan, full_per_stage: list[int]):
    stages = tuple(dataclasses.replace(s, full_recompute=tuple(range(s.layers[0], s.layers[0] + k)),
                                       selective_recompute=()) for s, k in zip(plan.stages, full_per_stage))
    return dataclasses.replace(plan, stages=stages)


def test_every_nth_block_recompute_maps_and_uneven_recompute_is_refused_naming_the_nearest(tmp_path):
    _, plan = _plan(tmp_path, *LAYOUTS["pp2 1f1b, ZeRO 2, selective"])
    every4 = _with_recompute(plan, [4, 4])  # 16 blocks per stage
    job = _load_toml(tmp_path, torchtitan_toml(every4))
    assert (job.activation_checkpoint.mode, job.activation_checkpoint.selective_ac_option) == ("selective", "4")
    uneven = _with_recompute(plan, [5, 2])
    with pytest.raises(ExportError) as err:
        torchtitan_toml(uneven)
    assert "\n" not in str(err.value) and "nearest" in str(err.value) and "full 5/16" in str(err.value)
    with pytest.raises(ExportError) as err:
        megatron_arguments(uneven)
    assert "--recompute-num-layers 5" in str(err.value)


def test_refusals_are_one_line_with_exit_status_2(tmp_path, capsys):
    path, _ = _plan(tmp_path, "--nodes", "1", "--tp", "2", "--pp", "1", "--zero-stage", "1", "--schedule", "1f1b")
    assert main(["export", str(path), "--to", "torchtitan"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("autoplan export: error: zero_stage:") and "nearest: --zero-stage 2" in err[-1]
    path, _ = _plan(tmp_path, "--nodes", "1", "--tp", "2", "--pp", "2", "--zero-stage", "1", "--schedule", "dualpipev",
                    "--virtual-stages", "2")
    assert main(["export", str(path), "--to", "megatron"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("autoplan export: error: schedule: Megatron-LM runs 1F1B and interleaved 1F1B, not "
                              "dualpipev")
    path, _ = _plan(tmp_path, "--nodes", "1", "--tp", "2", "--pp", "2", "--sequence-parallel", "--zero-stage", "2",
                    "--schedule", "zbv", "--virtual-stages", "2", "--stack", "torchtitan-compile")
    assert main(["export", str(path), "--to", "torchtitan"]) == 2  # torch's split-backward schedules refuse compile
    assert "without torch.compile only" in capsys.readouterr().err.strip().splitlines()[-1]


def _core_fields() -> dict[str, set[str]]:
    """Annotated fields of Megatron-Core's config dataclasses in the installed package (read, not imported)."""
    try:
        files = importlib.metadata.files("megatron-core")
    except importlib.metadata.PackageNotFoundError:
        pytest.skip("megatron-core is not installed (.ci/run installs it: pip install --no-deps megatron-core)")
    wanted = {"TransformerConfig": "megatron/core/transformer/transformer_config.py",
              "ModelParallelConfig": "megatron/core/model_parallel_config.py",
              "DistributedDataParallelConfig": "megatron/core/distributed/distributed_data_parallel_config.py",
              "OptimizerConfig": "megatron/core/optimizer/optimizer_config.py",
              "MLATransformerConfig": "megatron/core/transformer/transformer_config.py"}
    by_path = {str(f): f for f in files}
    fields: dict[str, set[str]] = {}
    for cls, rel in wanted.items():
        tree = ast.parse(Path(by_path[rel].locate()).read_text())
        node = next(n for n in ast.walk(tree) if isinstance(n, ast.ClassDef) and n.name == cls)
        fields[cls] = {s.target.id for s in node.body if isinstance(s, ast.AnnAssign) and isinstance(s.target, ast.Name)}
    fields["TransformerConfig"] |= fields["ModelParallelConfig"]  # TransformerConfig(ModelParallelConfig)
    fields["MLATransformerConfig"] |= fields["TransformerConfig"]
    return fields


@pytest.mark.parametrize("name", LAYOUTS)
def test_megatron_arguments_name_real_core_config_fields(tmp_path, name):
    fields = _core_fields()
    _, plan = _plan(tmp_path, *LAYOUTS[name], "--precision", "fp8")
    if plan.schedule == "zbv":
        pytest.skip("Megatron-LM runs no zero-bubble schedule: refused (test_refusals_are_one_line_with_exit_status_2)")
    args = megatron_arguments(plan)
    for a in args:
        if a.field is None:
            assert a.why_no_field in (TRAINING_LOOP, GPT_MODEL, "switches num_query_groups on"), a
            continue
        cls, field = a.field.split(".")
        assert field in fields[cls], a
        # the flag is the field's name with dashes, or one of Megatron-LM's documented renames
        renames = {"--norm-epsilon": "layernorm_epsilon", "--swiglu": "gated_linear_unit",
                   "--num-experts": "num_moe_experts", "--squared-relu": "activation_func",
                   "--disable-bias-linear": "add_bias_linear", "--fp8-format": "fp8",
                   "--num-virtual-stages-per-pipeline-rank": "virtual_pipeline_model_parallel_size",
                   "--decoder-first-pipeline-num-layers": "num_layers_in_first_pipeline_stage",
                   "--decoder-last-pipeline-num-layers": "num_layers_in_last_pipeline_stage"}
        assert renames.get(a.flag, a.flag[2:].replace("-", "_")) == field, a
    values = {a.flag: a.value for a in args}
    assert values["--tensor-model-parallel-size"] == str(plan.tp)
    assert values["--pipeline-model-parallel-size"] == str(plan.pp)
    assert values["--micro-batch-size"] == str(plan.micro_batch_size)
    if plan.schedule == "interleaved":
        assert values["--num-virtual-stages-per-pipeline-rank"] == str(plan.virtual_stages)
    full = {len(s.full_recompute) for s in plan.stages}
    if full != {0}:
        assert values["--recompute-num-layers"] == str(full.pop())


def test_megatron_uneven_first_and_last_stages(tmp_path):
    _, plan = _plan(tmp_path, *LAYOUTS["pp4 interleaved, ZeRO 3, full"])
    plan = dataclasses.replace(plan, schedule="1f1b", virtual_stages=1, stages=(
        Stage(0, 0, (0, 7)), Stage(1, 1, (7, 16)), Stage(2, 2, (16, 25)), Stage(3, 3, (25, 32))))
    values = {a.flag: a.value for a in megatron_arguments(plan)}
    assert values["--decoder-first-pipeline-num-layers"] == "7"
    assert values["--decoder-last-pipeline-num-layers"] == "7"
    plan = dataclasses.replace(plan, stages=(Stage(0, 0, (0, 8)), Stage(1, 1, (8, 15)), Stage(2, 2, (15, 24)),
                                             Stage(3, 3, (24, 32))))
    with pytest.raises(ExportError, match="nearest: an even split"):
        megatron_arguments(plan)


QWEN_AND_LLAMA31 = [(dict(qk_norm=True), "model.qk_norm", "--qk-layernorm"),
                    (dict(qkv_bias=True), "model.qkv_bias", "--add-qkv-bias"),
                    (dict(head_dim=64), "model.head_dim", "--kv-channels"),
                    (dict(rope_scaling={"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                        "original_max_position_embeddings": 8192}), "model.rope_scaling", None)]


@pytest.mark.parametrize("change, field, megatron_flag", QWEN_AND_LLAMA31)
def test_hugging_face_features_the_exports_do_not_write_are_refused(tmp_path, change, field, megatron_flag):
    """torchtitan's llama3 has none of Qwen's or Llama 3.1's extras: refused in one line rather than dropped.
    Megatron writes Qwen's (--qk-layernorm, --add-qkv-bias, --kv-channels) and refuses Llama 3.1's RoPE."""
    from autoplan.schema._io import from_dict, to_dict
    from autoplan.schema.plan import Plan

    _, plan = _plan(tmp_path, "--tp", "1", "--pp", "1", "--zero-stage", "2", "--schedule", "1f1b")
    data = to_dict(plan)
    data["model"] |= change
    changed = from_dict(Plan, data)
    exports = (torchtitan_toml,) if megatron_flag else (megatron_arguments, torchtitan_toml)
    for export in exports:
        with pytest.raises(ExportError, match=f"^{field}: ") as err:
            export(changed)
        assert "\n" not in str(err.value)
    if megatron_flag:
        values = {a.flag: a.value for a in megatron_arguments(changed)}
        assert megatron_flag in values and values.get("--kv-channels") in (None, "64")


def _moe_plan(model: str, **layout):
    """A plan for a shipped MoE model built by hand (the layout's fields; even stages, no recomputation)."""
    from autoplan.schema import Plan, TrainingSetup, load_cluster, load_model

    spec, fields = load_model(model), dict(tp=1, pp=1, dp=8, cp=1, ep=8, etp=1, sequence_parallel=False,
                                           zero_stage=1, offload_optimizer=False, schedule="1f1b", virtual_stages=1,
                                           micro_batch_size=1, num_microbatches=1) | layout
    per = spec.num_layers // fields["pp"]
    bounds = [i * per for i in range(fields["pp"])] + [spec.num_layers]
    stages = tuple(Stage(i, i, (bounds[i], bounds[i + 1])) for i in range(fields["pp"]))
    world = fields["tp"] * fields["pp"] * fields["dp"]
    cluster = dataclasses.replace(load_cluster("dgx-h100-80gb"), num_nodes=world // 8)
    return Plan(**fields, stages=stages, model=spec, cluster=cluster,
                training=TrainingSetup(global_batch_size=fields["dp"] * fields["num_microbatches"], seq_len=4096))


def test_megatron_arguments_of_moe_plans_name_real_core_config_fields():
    """DeepSeek-V3 (MLA, 3 dense blocks, sigmoid routing with expert bias, shared expert, MTP) and Qwen3-30B-A3B
    (softmax routing, aux loss) as Megatron arguments: every field exists in the installed megatron-core, and
    the values are the spec's."""
    fields = _core_fields()
    deepseek = megatron_arguments(_moe_plan("deepseek-v3", tp=2, sequence_parallel=True, dp=32, ep=64,
                                            num_microbatches=1))
    qwen = megatron_arguments(_moe_plan("qwen3-30b-a3b", ep=8, etp=1))
    for args in (deepseek, qwen):
        for a in args:
            if a.field is not None:
                cls, field = a.field.split(".")
                assert field in fields[cls], a
    d, q = {a.flag: a.value for a in deepseek}, {a.flag: a.value for a in qwen}
    assert (d["--num-experts"], d["--moe-router-topk"], d["--moe-ffn-hidden-size"]) == ("256", "8", "2048")
    assert d["--moe-layer-freq"] == '"([0]*3+[1]*58)"' and d["--mtp-num-layers"] == "1"
    assert d["--moe-router-score-function"] == "sigmoid" and "--moe-router-enable-expert-bias" in d
    assert d["--moe-router-topk-scaling-factor"] == "2.5" and d["--moe-shared-expert-intermediate-size"] == "2048"
    assert (d["--expert-model-parallel-size"], d["--expert-tensor-parallel-size"]) == ("64", "1")
    assert (d["--kv-lora-rank"], d["--q-lora-rank"], d["--qk-head-dim"], d["--qk-pos-emb-head-dim"]) == \
        ("512", "1536", "128", "64")
    assert q["--moe-router-score-function"] == "softmax" and q["--moe-router-load-balancing-type"] == "aux_loss"
    assert "--moe-router-pre-softmax" not in q and q["--moe-layer-freq"] == '"([1]*48)"'


def test_what_megatron_or_torchtitan_cannot_take_of_an_moe_plan_is_refused():
    plan = _moe_plan("qwen3-30b-a3b", ep=8)
    with pytest.raises(ExportError, match="model.moe: .*export the MoE plan with --to megatron"):
        torchtitan_toml(plan)
    moe = dataclasses.replace(plan.model.moe, router_bias=True)
    with pytest.raises(ExportError, match="model.moe.router_bias"):
        megatron_arguments(dataclasses.replace(plan, model=dataclasses.replace(plan.model, moe=moe)))


def test_megatron_export_turns_on_the_expert_overlap_its_stack_priced():
    """A plan priced for the megatron stack (ep_comm_overlap) with interleaved stages gets Megatron-Core's
    --overlap-moe-expert-parallel-comm; not under plain 1F1B with pp > 1, nor with full recomputation
    (Megatron refuses both), nor for a stack that priced no overlap."""
    from autoplan.schema import load_stack

    megatron = load_stack("megatron")
    interleaved = dataclasses.replace(_moe_plan("qwen3-30b-a3b", pp=2, dp=4, ep=4), stack=megatron)
    interleaved = dataclasses.replace(interleaved, schedule="interleaved", virtual_stages=2, num_microbatches=2,
                                      stages=tuple(Stage(i, i % 2, (12 * i, 12 * i + 12)) for i in range(4)))
    flags = {a.flag for a in megatron_arguments(interleaved)}
    assert {"--overlap-moe-expert-parallel-comm", "--delay-wgrad-compute"} <= flags
    plain = dataclasses.replace(_moe_plan("qwen3-30b-a3b", pp=2, dp=4, ep=4, num_microbatches=2), stack=megatron)
    full = dataclasses.replace(interleaved, stages=tuple(dataclasses.replace(s, full_recompute=(s.layers[0],))
                                                         for s in interleaved.stages))
    for plan in (plain, full, dataclasses.replace(interleaved, stack=load_stack("autoplan"))):
        assert "--overlap-moe-expert-parallel-comm" not in {a.flag for a in megatron_arguments(plan)}


NEW_MOE_FLAGS = ("--moe-token-dispatcher-type", "--moe-flex-dispatcher-backend", "--recompute-modules",
                 "--fp8-recipe", "--moe-router-num-groups", "--moe-router-group-topk")


def _selective(plan):
    """``plan`` with every block of every stage recomputed selectively."""
    return dataclasses.replace(plan, stages=tuple(dataclasses.replace(s, selective_recompute=tuple(range(*s.layers)))
                                                  for s in plan.stages))


def test_megatron_export_writes_the_dispatcher_recompute_modules_and_router_groups_its_stack_priced():
    """A plan priced on megatron-deepep (ep_dispatcher deduplicated, selective_recompute modules) exports the flex
    dispatcher on DeepEP and the stack's --recompute-modules, less the modules the model lacks (Megatron-Core
    refuses mla_up_proj without MLA and moe_act without grouped GEMMs); under fp8 with moe_act or layernorm
    rerun, per-tensor current scaling (Megatron refuses those under its default delayed scaling). DeepSeek-V3's
    group-limited routing is written as --moe-router-num-groups / --moe-router-group-topk. A plan on the default
    stack keeps the all-to-all dispatcher and plain selective recomputation. Each new flag is its field's name."""
    from autoplan.schema import load_stack

    fields, deepep = _core_fields(), load_stack("megatron-deepep")
    deepseek = _selective(_moe_plan("deepseek-v3", tp=2, sequence_parallel=True, dp=32, ep=64))
    deepseek = dataclasses.replace(deepseek, stack=deepep,
                                   training=dataclasses.replace(deepseek.training, precision="fp8"))
    qwen = dataclasses.replace(_selective(_moe_plan("qwen3-30b-a3b", ep=8)), stack=deepep)
    d, q = megatron_arguments(deepseek), megatron_arguments(qwen)
    for a in (*d, *q):
        if a.field is not None:
            cls, field = a.field.split(".")
            assert field in fields[cls], a
            if a.flag in NEW_MOE_FLAGS:  # Megatron-LM 0.16's arguments are the config fields with dashes
                assert a.flag[2:].replace("-", "_") == field, a
    d, q = {a.flag: a.value for a in d}, {a.flag: a.value for a in q}
    for args in (d, q):
        assert (args["--moe-token-dispatcher-type"], args["--moe-flex-dispatcher-backend"]) == ("flex", "deepep")
        assert args["--recompute-granularity"] == "selective"
    assert d["--recompute-modules"] == " ".join(deepep.recompute_modules) == "mla_up_proj layernorm moe_act"
    assert q["--recompute-modules"] == "layernorm moe_act" and "--fp8-recipe" not in q  # bf16
    assert d["--fp8-recipe"] == "tensorwise"
    assert (d["--moe-router-num-groups"], d["--moe-router-group-topk"]) == ("8", "4")
    assert "--moe-router-num-groups" not in q and "--moe-router-group-topk" not in q
    plain = {a.flag: a.value for a in megatron_arguments(dataclasses.replace(qwen, stack=load_stack("autoplan")))}
    assert plain["--moe-token-dispatcher-type"] == "alltoall" and "--moe-flex-dispatcher-backend" not in plain
    assert plain["--recompute-granularity"] == "selective" and "--recompute-modules" not in plain
    mla_only = dataclasses.replace(deepep, recompute_modules=("mla_up_proj",))
    assert not any(a.flag.startswith("--recompute") for a in megatron_arguments(
        dataclasses.replace(qwen, stack=mla_only)))  # nothing the model has: nothing dropped, as priced


def test_megatron_export_refuses_dualpipev_whose_exchange_overlap_it_cannot_write():
    """DualPipe hides the exchange in the planner's pricing (ParallelConfig.ep_overlap_possible); Megatron has no
    such schedule, so the export refuses the plan rather than write an overlap it would not run."""
    from autoplan.schema import load_stack

    plan = dataclasses.replace(_moe_plan("qwen3-30b-a3b", pp=2, dp=4, ep=4), stack=load_stack("megatron"),
                               schedule="dualpipev", virtual_stages=2, num_microbatches=4,
                               stages=tuple(Stage(i, min(i, 3 - i), (12 * i, 12 * i + 12)) for i in range(4)))
    assert plan.ep_overlap_possible
    with pytest.raises(ExportError, match="^schedule: Megatron-LM runs 1F1B and interleaved 1F1B, not dualpipev"):
        megatron_arguments(plan)
