"""A plan as a torchtitan job file (TOML, the ``--job.config_file`` of torchtitan 0.2, its
``JobConfig`` sections: job, model, training, parallelism, activation_checkpoint, compile, quantize).

What maps how (torchtitan/config/job_config.py, torchtitan/distributed/parallel_dims.py):
* dp: ZeRO 3 is ``data_parallel_shard_degree = dp`` (FSDP2, resharded after forward unless pipelined,
  torchtitan's "default"); ZeRO 2 the same with ``fsdp_reshard_after_forward = "never"`` (parameters kept
  gathered through the step, gradients reduce-scattered every micro-batch); ZeRO 0 is
  ``data_parallel_replicate_degree = dp`` (DDP). torchtitan has no ZeRO 1: refused, nearest ZeRO 2.
* tp with sequence parallelism always (torchtitan's TP plan shards the norms): a plan without it is
  refused, nearest ``--sequence-parallel``. cp: ``context_parallel_degree``.
* pp: the schedule (1F1B, GPipe, Interleaved1F1B, InterleavedZeroBubble, ZBVZeroBubble, DualPipeV) and the
  plan's exact stage split as
  ``module_fqns_per_model_part`` (tok_embeddings with the first stage, norm and output with the last).
  The batch: with pp, ``local_batch_size`` is the replica's batch cut into micro-batches of
  ``pipeline_parallel_microbatch_size``; without, ``local_batch_size`` is the micro-batch and
  ``global_batch_size`` makes torchtitan accumulate gradients over the plan's micro-batches.
* recomputation: one mode for every block (``none``, ``full``, or ``selective`` with
  ``selective_ac_option = "op"``, torchtitan's op-level checkpointing that the torchtitan stacks price),
  or full recomputation of every N-th block (``selective_ac_option = "N"``) when each stage recomputes
  exactly 1/N of its blocks. Anything else is refused with the nearest.
* The stack: ``torchtitan-compile`` turns on ``compile``, ``-async-tp`` async TP; fp8 plans add the float8
  converter with float8 FSDP all-gathers (what the torchtitan stacks price as ``param_gather: fp8``).
"""

from __future__ import annotations

import json

from autoplan.export.common import ExportError, describe_recompute, stage_recompute, uniform_mode
from autoplan.schema import Plan
from autoplan.schema.schedule import ZERO_BUBBLE

SCHEDULES = {"1f1b": "1F1B", "gpipe": "GPipe", "interleaved": "Interleaved1F1B", "zb1p": "InterleavedZeroBubble",
             "zbv": "ZBVZeroBubble", "dualpipev": "DualPipeV"}
"""torch's schedule classes by the names torchtitan's ``pipeline_parallel_schedule`` takes; torchtitan places
the stages of ZBVZeroBubble and DualPipeV in a V itself (distributed/pipeline_parallel.py, ``style="v"``)."""

# torchtitan/models/llama3/__init__.py llama3_args: (dim, layers, heads, kv heads, ffn) of each flavor
LLAMA3_FLAVORS = {(4096, 32, 32, 8, 14336): "8B", (8192, 80, 64, 8, 28672): "70B",
                  (16384, 126, 128, 8, 53248): "405B"}


def _toml_value(v) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (int, float)):
        return repr(v)
    if isinstance(v, str):
        return json.dumps(v)
    return "[" + ", ".join(_toml_value(x) for x in v) + "]"


def _flavor(plan: Plan) -> tuple[str, list[str]]:
    """torchtitan's llama3 flavor of the plan's model, or the model's name and the TransformerModelArgs to
    register under it."""
    m = plan.model
    key = (m.hidden_size, m.num_layers, m.num_attention_heads, m.num_kv_heads, m.ffn_hidden_size)
    if key in LLAMA3_FLAVORS:
        return LLAMA3_FLAVORS[key], []
    base = int(2 * 4 * m.hidden_size / 3)  # torchtitan FeedForward: hidden = multiple_of-rounded multiplier x base
    args = (f'"{m.name}": TransformerModelArgs(dim={m.hidden_size}, n_layers={m.num_layers}, '
            f"n_heads={m.num_attention_heads}, n_kv_heads={m.num_kv_heads}, ffn_dim_multiplier={m.ffn_hidden_size / base!r}, "
            f"multiple_of={m.ffn_hidden_size}, rope_theta={m.rope_theta!r}, norm_eps={m.norm_eps!r}, "
            f"vocab_size={m.vocab_size}, max_seq_len={plan.training.seq_len})")
    return m.name, [f"# {plan.model.name} is not one of torchtitan's llama3 flavors: add it to llama3_args in",
                    "# torchtitan/models/llama3/__init__.py as", f"#   {args}"]


def _activation_checkpoint(plan: Plan) -> dict:
    mode = uniform_mode(plan)
    if mode == "none":
        return {"mode": "none"}
    if mode == "full":
        return {"mode": "full"}
    if mode == "selective":
        return {"mode": "selective", "selective_ac_option": "op"}
    stages = stage_recompute(plan)
    if all(s.selective == 0 and s.full > 0 and s.layers % s.full == 0 for s in stages):
        every = {s.layers // s.full for s in stages}
        if len(every) == 1:
            return {"mode": "selective", "selective_ac_option": str(every.pop())}
    full = sum(s.full for s in stages)
    total = sum(s.layers for s in stages)
    nearest = max(1, round(total / full)) if full else None
    hint = (f'activation_checkpoint.mode = "selective" with selective_ac_option = "{nearest}" (full recomputation '
            f"of every {nearest}-th block), re-plan with --recompute full, or with --stack autoplan and autoplan run"
            if nearest and nearest > 1 else "--recompute full or --recompute selective for every block")
    raise ExportError(f"recompute: torchtitan checkpoints every block alike or every N-th block, and this plan "
                      f"recomputes per stage {describe_recompute(plan)}; nearest torchtitan can run: {hint}")


def torchtitan_toml(plan: Plan) -> str:
    """The plan as a torchtitan 0.2 job file; ``ExportError`` names what it cannot express."""
    m, t = plan.model, plan.training
    if m.architecture != "llama":
        raise ExportError(f"model.architecture: torchtitan trains Llama-architecture models (llama3), not "
                          f"{m.architecture!r}; plan a llama model, or run this plan with autoplan run")
    unwritten = [f for f in ("moe", "mla", "mtp_layers", "qkv_bias", "qk_norm", "rope_scaling", "o_bias",
                             "attention_sinks", "sliding_window") if getattr(m, f)] + (
        ["head_dim"] if m.q_size != m.hidden_size else []) + (["activation"] if m.mlp_activation != "silu" else [])
    if unwritten and unwritten[0] in ("moe", "mla", "mtp_layers"):  # torchtitan's MoE models take other flavors
        raise ExportError(f"model.{unwritten[0]}: this export writes torchtitan's dense llama3 model; export the "
                          "MoE plan with --to megatron (experts, routing, MLA and ep/etp written)")
    if unwritten:  # the llama3 model args written below have no field for them: they would be dropped
        raise ExportError(f"model.{unwritten[0]}: this export writes torchtitan's llama3 model, which has no "
                          f"{unwritten[0]} (a Qwen, Llama 3.1, GPT-OSS or Nemotron feature); run this plan with "
                          "autoplan run where its runtime has it")
    if plan.zero_stage == 1:
        raise ExportError("zero_stage: torchtitan has no ZeRO-1 (FSDP2 shards gradients too); nearest: "
                          "--zero-stage 2 (data_parallel_shard_degree with fsdp_reshard_after_forward = \"never\")")
    if plan.tp > 1 and not plan.sequence_parallel:
        raise ExportError("sequence_parallel: torchtitan's tensor parallelism always splits the norms along the "
                          "sequence; nearest: re-plan with --sequence-parallel")
    if t.precision == "fp16":
        raise ExportError("training.precision: torchtitan trains in bf16 or fp32 (no fp16 loss scaling); "
                          "nearest: --precision bf16")
    if t.optimizer != "adamw":
        raise ExportError(f"training.optimizer: torchtitan's default optimizer is AdamW, not {t.optimizer}; "
                          "nearest: --optimizer adamw")
    stack = plan.stack_name
    if stack.startswith("torchtitan-compile") and plan.schedule in ZERO_BUBBLE:
        # torch's split-backward schedules refuse compiled stages (_check_torch_compile_compatibility)
        raise ExportError(f"schedule: torch runs {SCHEDULES[plan.schedule]} without torch.compile only, and this plan "
                          f"is for {stack}; re-plan with --stack torchtitan, or a 1f1b or interleaved schedule")
    flavor, flavor_notes = _flavor(plan)
    per_replica = t.global_batch_size // plan.dp
    sections: dict[str, dict] = {
        "job": {"description": f"autoplan plan for {m.name} on {plan.cluster.num_devices} x {plan.cluster.device.name} "
                               f"(stack {stack})"},
        "model": {"name": "llama3", "flavor": flavor},
        "training": {"local_batch_size": per_replica if plan.pp > 1 else plan.micro_batch_size,
                     "global_batch_size": t.global_batch_size, "seq_len": t.seq_len, "max_norm": t.grad_clip,
                     "mixed_precision_param": "float32" if t.precision == "fp32" else "bfloat16",
                     "mixed_precision_reduce": "float32", "enable_cpu_offload": plan.offload_optimizer},
        "parallelism": {
            "data_parallel_replicate_degree": plan.dp if plan.zero_stage == 0 else 1,
            "data_parallel_shard_degree": plan.dp if plan.zero_stage >= 2 else 1,
            "fsdp_reshard_after_forward": "never" if plan.zero_stage == 2 else "default",
            "tensor_parallel_degree": plan.tp,
            "enable_async_tensor_parallel": stack.endswith("async-tp"),
            "context_parallel_degree": plan.cp,
            "pipeline_parallel_degree": plan.pp,
        },
        "activation_checkpoint": _activation_checkpoint(plan),
        "compile": {"enable": stack.startswith("torchtitan-compile"), "components": ["model", "loss"]},
        "optimizer": {"name": "AdamW", "lr": t.learning_rate, "beta1": t.adam_betas[0], "beta2": t.adam_betas[1],
                      "eps": t.adam_eps, "weight_decay": t.weight_decay},
        "lr_scheduler": {"warmup_steps": t.warmup_steps},
    }
    if plan.pp > 1:
        sections["parallelism"].update({
            "pipeline_parallel_schedule": SCHEDULES[plan.schedule],
            "pipeline_parallel_microbatch_size": plan.micro_batch_size,
            "module_fqns_per_model_part": [
                (["tok_embeddings"] if s.index == 0 else [])
                + [f"layers.{i}" for i in range(*s.layers)]
                + (["norm", "output"] if s.index == plan.num_stages - 1 else []) for s in plan.stages],
        })
    if t.precision == "fp8":
        sections["model"]["converters"] = ["quantize.linear.float8"]
        sections["quantize.linear.float8"] = {"enable_fsdp_float8_all_gather": plan.zero_stage >= 2,
                                              "precompute_float8_dynamic_scale_for_fsdp": plan.zero_stage >= 2}
    lines = [f"# torchtitan job for {m.name}, written by autoplan export from a plan priced for stack {stack}",
             f"# predicted: {plan.predicted.step_time_s:.3f} s per step, {100 * plan.predicted.mfu:.1f}% MFU, "
             f"{plan.predicted.peak_memory_gib:.1f} GiB peak per GPU" if plan.predicted else "# (no prediction)",
             f"# run: torchrun --nproc_per_node {plan.cluster.devices_per_node} --nnodes {plan.cluster.num_nodes} "
             "-m torchtitan.train --job.config_file THIS_FILE", *flavor_notes, ""]
    for name, values in sections.items():
        lines.append(f"[{name}]")
        lines += [f"{k} = {_toml_value(v)}" for k, v in values.items()]
        lines.append("")
    return "\n".join(lines)
