"""A plan as Megatron-LM's command-line arguments (``pretrain_gpt.py``; Megatron-Bridge takes the same
values under the same Megatron-Core config names).

Each argument names the Megatron-Core config field it sets (``TransformerConfig``,
``ModelParallelConfig``, ``DistributedDataParallelConfig``, ``OptimizerConfig``; Megatron-LM's
``core_transformer_config_from_args`` copies the arguments into them), or says why it has none (the
training loop's batch and sequence arguments, GPTModel's embedding arguments); tests check those names
against the installed megatron-core.

What maps how:
* tp, pp, cp, sequence parallelism, virtual stages (``--num-virtual-stages-per-pipeline-rank``); a stage
  split with a different first or last stage as ``--decoder-first/last-pipeline-num-layers`` (Megatron
  gives the middle stages equal shares: any other split is refused with the nearest).
* ZeRO 1 is the distributed optimizer; ZeRO 2 and 3 Megatron FSDP with ``optim_grads`` /
  ``optim_grads_params`` sharding; ZeRO 0 plain DDP. Gradient reduction overlaps backward when the plan's
  training does.
* Recomputation: ``selective`` for every block (the attention core), or ``full`` with
  ``--recompute-method block --recompute-num-layers k``: the first k blocks of every (virtual) stage, the
  plan's own placement. Stages recomputing different counts, or mixing the two, are refused with the nearest.
* The stack: a plan priced with tensor-parallel overlap (the ``megatron`` stack's fitted
  ``tp_comm_overlap``, NeMo's Transformer Engine user buffers) adds ``--tp-comm-overlap``.
"""

from __future__ import annotations

from dataclasses import dataclass

from autoplan.export.common import ExportError, describe_recompute, stage_recompute, uniform_mode
from autoplan.schema import Plan
from autoplan.schema.schedule import ZERO_BUBBLE

TRANSFORMER = "TransformerConfig"
PARALLEL = "ModelParallelConfig"
DDP = "DistributedDataParallelConfig"
OPTIMIZER = "OptimizerConfig"


@dataclass(frozen=True)
class Argument:
    flag: str
    value: str | None
    """None: a switch."""
    field: str | None
    """``Class.field`` of Megatron-Core the argument sets, or None."""
    why_no_field: str = ""

    def render(self) -> str:
        return self.flag if self.value is None else f"{self.flag} {self.value}"


def _arg(flag: str, value, field: str | None, why: str = "") -> Argument:
    return Argument(flag, None if value is None else str(value), field, why)


TRAINING_LOOP = "a training-loop argument of megatron/training/arguments.py (no core config field)"
GPT_MODEL = "an argument of GPTModel (megatron/core/models/gpt/gpt_model.py), not of its config"


def _model_arguments(plan: Plan) -> list[Argument]:
    m = plan.model
    args = [_arg("--num-layers", m.num_layers, f"{TRANSFORMER}.num_layers"),
            _arg("--hidden-size", m.hidden_size, f"{TRANSFORMER}.hidden_size"),
            _arg("--ffn-hidden-size", m.ffn_hidden_size, f"{TRANSFORMER}.ffn_hidden_size"),
            _arg("--num-attention-heads", m.num_attention_heads, f"{TRANSFORMER}.num_attention_heads")]
    if m.num_kv_heads != m.num_attention_heads:
        args += [_arg("--group-query-attention", None, None, "switches num_query_groups on"),
                 _arg("--num-query-groups", m.num_kv_heads, f"{TRANSFORMER}.num_query_groups")]
    args += [_arg("--seq-length", plan.training.seq_len, None, TRAINING_LOOP),
             _arg("--max-position-embeddings", plan.training.seq_len, None, GPT_MODEL),
             _arg("--make-vocab-size-divisible-by", m.make_vocab_size_divisible_by, None, TRAINING_LOOP),
             _arg("--hidden-dropout", m.dropout, f"{TRANSFORMER}.hidden_dropout"),
             _arg("--attention-dropout", m.dropout, f"{TRANSFORMER}.attention_dropout"),
             _arg("--norm-epsilon", m.norm_eps, f"{TRANSFORMER}.layernorm_epsilon")]
    if m.architecture == "llama":
        args += [_arg("--normalization", "RMSNorm", f"{TRANSFORMER}.normalization"),
                 _arg("--swiglu", None, f"{TRANSFORMER}.gated_linear_unit"),
                 _arg("--disable-bias-linear", None, f"{TRANSFORMER}.add_bias_linear"),
                 _arg("--position-embedding-type", "rope", None, GPT_MODEL),
                 _arg("--rotary-base", int(m.rope_theta) if m.rope_theta == int(m.rope_theta) else m.rope_theta,
                      None, GPT_MODEL)]
    else:
        args += [_arg("--normalization", "LayerNorm", f"{TRANSFORMER}.normalization"),
                 _arg("--position-embedding-type", "learned_absolute", None, GPT_MODEL)]
    if not m.tie_embeddings:
        args.append(_arg("--untie-embeddings-and-output-weights", None, None, GPT_MODEL))
    return args


def _split_arguments(plan: Plan) -> list[Argument]:
    layers = [s.num_layers for s in plan.stages]
    if len(set(layers)) == 1:
        return []
    middle = layers[1:-1]
    if len(set(middle)) > 1 or plan.virtual_stages > 1:
        equal = plan.model.num_layers // plan.num_stages
        raise ExportError(f"stages: Megatron gives every stage but the first and last the same layers"
                          f"{' and splits interleaved chunks evenly' if plan.virtual_stages > 1 else ''}, and this "
                          f"plan's stages hold {layers}; nearest: an even split ({equal} per stage) or "
                          f"--pipeline-model-parallel-layout written by hand")
    args = []
    if layers[0] != (middle[0] if middle else layers[-1]):
        args.append(_arg("--decoder-first-pipeline-num-layers", layers[0],
                         f"{TRANSFORMER}.num_layers_in_first_pipeline_stage"))
    if not middle or layers[-1] != middle[0]:
        args.append(_arg("--decoder-last-pipeline-num-layers", layers[-1],
                         f"{TRANSFORMER}.num_layers_in_last_pipeline_stage"))
    return args


def _recompute_arguments(plan: Plan) -> list[Argument]:
    mode = uniform_mode(plan)
    if mode == "none":
        return []
    if mode == "selective":
        return [_arg("--recompute-granularity", "selective", f"{TRANSFORMER}.recompute_granularity")]
    stages = stage_recompute(plan)
    counts = {s.full for s in stages}
    if all(s.selective == 0 for s in stages) and len(counts) == 1:
        # the block method recomputes the first k blocks of each stage: where the plan puts them too
        return [_arg("--recompute-granularity", "full", f"{TRANSFORMER}.recompute_granularity"),
                _arg("--recompute-method", "block", f"{TRANSFORMER}.recompute_method"),
                _arg("--recompute-num-layers", counts.pop(), f"{TRANSFORMER}.recompute_num_layers")]
    most = max(s.full for s in stages)
    raise ExportError(f"recompute: Megatron recomputes the same number of blocks in every stage, fully or "
                      f"selectively, and this plan recomputes per stage {describe_recompute(plan)}; nearest: "
                      f"--recompute-granularity full --recompute-method block --recompute-num-layers {max(most, 1)}"
                      f" (re-plan with --recompute full to price it), or --recompute-granularity selective")


def megatron_arguments(plan: Plan) -> list[Argument]:
    """The plan as Megatron-LM arguments; ``ExportError`` names what Megatron cannot express."""
    t, m = plan.training, plan.model
    unwritten = [f for f, used in (("qkv_bias", m.qkv_bias), ("qk_norm", m.qk_norm),
                                   ("rope_scaling", m.rope_scaling is not None),
                                   ("head_dim", m.q_size != m.hidden_size),
                                   ("activation", m.mlp_activation == "gelu_tanh"),
                                   ("max_positions", m.position_rows(t.seq_len) != t.seq_len)) if used]
    if unwritten:  # _model_arguments writes none of them: Megatron would build another model
        raise ExportError(f"model.{unwritten[0]}: this export does not write it to Megatron's arguments, so "
                          f"Megatron would train another model; run this plan with autoplan run")
    if t.optimizer != "adamw":
        raise ExportError(f"training.optimizer: the plan was priced for {t.optimizer}; Megatron's default is Adam "
                          "(AdamW with --weight-decay); nearest: --optimizer adamw")
    if plan.offload_optimizer:
        raise ExportError("offload_optimizer: Megatron offloads a fraction of the distributed optimizer "
                          "(--optimizer-cpu-offload), not FSDP shards; nearest: re-plan without --offload")
    args = _model_arguments(plan)
    args += [_arg("--tensor-model-parallel-size", plan.tp, f"{PARALLEL}.tensor_model_parallel_size"),
             _arg("--pipeline-model-parallel-size", plan.pp, f"{PARALLEL}.pipeline_model_parallel_size"),
             _arg("--context-parallel-size", plan.cp, f"{PARALLEL}.context_parallel_size")]
    if plan.sequence_parallel:
        args.append(_arg("--sequence-parallel", None, f"{PARALLEL}.sequence_parallel"))
    if plan.schedule == "interleaved":
        args.append(_arg("--num-virtual-stages-per-pipeline-rank", plan.virtual_stages,
                         f"{PARALLEL}.virtual_pipeline_model_parallel_size"))
    elif plan.schedule == "gpipe" and plan.pp > 1:
        raise ExportError("schedule: Megatron runs 1F1B and interleaved 1F1B, not GPipe; nearest: --schedule 1f1b")
    elif plan.schedule in ZERO_BUBBLE:
        raise ExportError(f"schedule: Megatron-LM runs 1F1B and interleaved 1F1B, not {plan.schedule} (zero bubble "
                          "is in Sea AI Lab's fork); re-plan with --schedule 1f1b or interleaved, or export to torchtitan")
    args += _split_arguments(plan)
    args += [_arg("--micro-batch-size", plan.micro_batch_size, None, TRAINING_LOOP),
             _arg("--global-batch-size", t.global_batch_size, None, TRAINING_LOOP)]
    args += _recompute_arguments(plan)
    if plan.zero_stage == 1:
        args.append(_arg("--use-distributed-optimizer", None, f"{DDP}.use_distributed_optimizer"))
    elif plan.zero_stage >= 2:
        args += [_arg("--use-megatron-fsdp", None, f"{DDP}.use_megatron_fsdp"),
                 _arg("--data-parallel-sharding-strategy", "optim_grads" if plan.zero_stage == 2 else
                      "optim_grads_params", f"{DDP}.data_parallel_sharding_strategy")]
    if t.overlap_grad_reduce and plan.dp * plan.cp > 1:
        args.append(_arg("--overlap-grad-reduce", None, f"{DDP}.overlap_grad_reduce"))
        if plan.zero_stage >= 1:
            args.append(_arg("--overlap-param-gather", None, f"{DDP}.overlap_param_gather"))
    precision = {"bf16": [_arg("--bf16", None, f"{PARALLEL}.bf16")],
                 "fp16": [_arg("--fp16", None, f"{PARALLEL}.fp16")],
                 "fp8": [_arg("--bf16", None, f"{PARALLEL}.bf16"), _arg("--fp8-format", "hybrid", f"{TRANSFORMER}.fp8")],
                 "fp32": []}
    args += precision[t.precision]
    if plan.stack is not None and plan.stack.tp_comm_overlap > 0 and plan.tp > 1 and plan.sequence_parallel:
        args.append(_arg("--tp-comm-overlap", None, f"{PARALLEL}.tp_comm_overlap"))
    args += [_arg("--lr", t.learning_rate, f"{OPTIMIZER}.lr"), _arg("--min-lr", t.min_learning_rate, f"{OPTIMIZER}.min_lr"),
             _arg("--lr-warmup-iters", t.warmup_steps, None, TRAINING_LOOP),
             _arg("--lr-decay-iters", t.decay_steps, None, TRAINING_LOOP),
             _arg("--lr-decay-style", "cosine", None, TRAINING_LOOP),
             _arg("--weight-decay", t.weight_decay, f"{OPTIMIZER}.weight_decay"),
             _arg("--adam-beta1", t.adam_betas[0], f"{OPTIMIZER}.adam_beta1"),
             _arg("--adam-beta2", t.adam_betas[1], f"{OPTIMIZER}.adam_beta2"),
             _arg("--adam-eps", t.adam_eps, f"{OPTIMIZER}.adam_eps"),
             _arg("--clip-grad", t.grad_clip, f"{OPTIMIZER}.clip_grad"),
             _arg("--seed", t.seed, None, TRAINING_LOOP)]
    return args


def render_megatron(plan: Plan, args: list[Argument]) -> str:
    """A shell fragment: the arguments one per line, each with the core config field it sets."""
    head = [f"# Megatron-LM arguments for {plan.model.name}, written by autoplan export from a plan priced for "
            f"stack {plan.stack_name}"]
    if plan.predicted is not None:
        p = plan.predicted
        head.append(f"# predicted: {p.step_time_s:.3f} s per step, {100 * p.mfu:.1f}% MFU, "
                    f"{p.peak_memory_gib:.1f} GiB peak per GPU")
    head.append(f"# run: torchrun --nproc_per_node {plan.cluster.devices_per_node} --nnodes {plan.cluster.num_nodes} "
                "pretrain_gpt.py $AUTOPLAN_ARGS (plus your data and tokenizer arguments)")
    width = max(len(a.render()) for a in args)
    lines = [f"  {a.render():{width}s}  # {a.field or a.why_no_field}" for a in args]
    return "\n".join(head) + "\nAUTOPLAN_ARGS=(\n" + "\n".join(lines) + "\n)\n"
