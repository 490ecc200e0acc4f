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
* Recomputation: ``selective`` for every block (the attention core; a stack with ``selective_recompute:
  modules`` adds its ``--recompute-modules``), or ``full`` with
  ``--recompute-method block --recompute-num-layers k``: the first k blocks of every (virtual) stage, the
  plan's own placement. Stages recomputing different counts, or mixing the two, are refused with the nearest.
* Mixture of Experts (Megatron-Core's MoE layer with grouped GEMMs; the alltoall dispatcher, or the flex one
  on DeepEP for a stack with ``ep_dispatcher: deduplicated``): experts, top-k, group-limited routing,
  expert and shared widths, the leading dense blocks as a ``--moe-layer-freq`` pattern, the router's score
  function (softmax: top-k then softmax over them, ``--moe-router-pre-softmax`` where the spec does not
  renormalise; sigmoid: DeepSeek-V3's aux-loss-free expert bias), its scaling factor and load-balancing
  loss, ep and etp (``expert_model_parallel_size``, ``expert_tensor_parallel_size``); multi-head latent
  attention's ranks and head widths; the multi-token-prediction modules; squared ReLU; Qwen's q/k/v biases,
  per-head q/k norms and decoupled head width (``--add-qkv-bias``, ``--qk-layernorm``, ``--kv-channels``).
  Llama 3.1's RoPE scaling, biases on the router, experts or attention output, attention sinks and sliding
  windows are refused (not written).
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
    if m.q_size != m.hidden_size and m.mla is None:  # Qwen3: heads of their own width
        args.append(_arg("--kv-channels", m.head_dim, f"{TRANSFORMER}.kv_channels"))
    if m.qkv_bias:  # Qwen2: biases on q, k and v only
        args.append(_arg("--add-qkv-bias", None, f"{TRANSFORMER}.add_qkv_bias"))
    if m.qk_norm:  # Qwen3: the block's normalization (RMSNorm) over each head of q and k
        args.append(_arg("--qk-layernorm", None, f"{TRANSFORMER}.qk_layernorm"))
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
        activation = ([_arg("--squared-relu", None, f"{TRANSFORMER}.activation_func")] if m.mlp_activation == "relu2"
                      else [_arg("--swiglu", None, f"{TRANSFORMER}.gated_linear_unit")])
        args += [_arg("--normalization", "RMSNorm", f"{TRANSFORMER}.normalization"), *activation,
                 _arg("--disable-bias-linear", None, f"{TRANSFORMER}.add_bias_linear"),
                 _arg("--position-embedding-type", "rope", None, GPT_MODEL),
                 _arg("--rotary-base", int(m.rope_theta) if m.rope_theta == int(m.rope_theta) else m.rope_theta,
                      None, GPT_MODEL)]
    else:
        args += [_arg("--normalization", "LayerNorm", f"{TRANSFORMER}.normalization"),
                 _arg("--position-embedding-type", "learned_absolute", None, GPT_MODEL)]
    if not m.tie_embeddings:
        args.append(_arg("--untie-embeddings-and-output-weights", None, None, GPT_MODEL))
    return args + _mla_arguments(plan) + _moe_arguments(plan)


def _mla_arguments(plan: Plan) -> list[Argument]:
    """Multi-head latent attention (megatron/core/transformer/multi_latent_attention.py): Megatron's
    ``qk_head_dim`` is the part without RoPE, ``qk_pos_emb_head_dim`` the rotated part; YaRN's numbers."""
    m = plan.model
    if m.mla is None:
        return []
    mla, mcfg = m.mla, "MLATransformerConfig"
    args = [_arg("--multi-latent-attention", None, f"{TRANSFORMER}.multi_latent_attention"),
            _arg("--kv-lora-rank", mla.kv_lora_rank, f"{mcfg}.kv_lora_rank"),
            _arg("--qk-head-dim", mla.qk_nope_head_dim, f"{mcfg}.qk_head_dim"),
            _arg("--qk-pos-emb-head-dim", mla.qk_rope_head_dim, f"{mcfg}.qk_pos_emb_head_dim"),
            _arg("--v-head-dim", mla.v_head_dim, f"{mcfg}.v_head_dim")]
    if mla.q_lora_rank is not None:
        args.append(_arg("--q-lora-rank", mla.q_lora_rank, f"{mcfg}.q_lora_rank"))
    yarn = mla.rope_scaling
    if yarn is not None:
        args += [_arg("--rope-type", "yarn", f"{mcfg}.rope_type"),
                 _arg("--rotary-scaling-factor", yarn.factor, f"{mcfg}.rotary_scaling_factor"),
                 _arg("--original-max-position-embeddings", yarn.original_max_position_embeddings,
                      f"{mcfg}.original_max_position_embeddings"),
                 _arg("--beta-fast", yarn.beta_fast, f"{mcfg}.beta_fast"),
                 _arg("--beta-slow", yarn.beta_slow, f"{mcfg}.beta_slow")]
        args += [_arg(f"--{k.replace('_', '-')}", v, f"{mcfg}.{k}") for k, v in
                 (("mscale", yarn.mscale), ("mscale_all_dim", yarn.mscale_all_dim)) if v is not None]
    return args


def _layer_pattern(plan: Plan) -> str:
    """The MoE blocks as ``--moe-layer-freq``'s Python list expression (1: MoE, 0: dense), runs joined."""
    kinds = [int(plan.model.is_moe_block(i)) for i in range(plan.model.num_layers)]
    runs: list[list[int]] = []
    for k in kinds:
        if runs and runs[-1][0] == k:
            runs[-1][1] += 1
        else:
            runs.append([k, 1])
    return "(" + "+".join(f"[{k}]*{n}" for k, n in runs) + ")"


def _moe_arguments(plan: Plan) -> list[Argument]:
    """The MoE layers, their router and the expert parallel sizes (megatron/core/transformer/moe/)."""
    m = plan.model
    args = []
    if m.mtp_layers:
        args.append(_arg("--mtp-num-layers", m.mtp_layers, f"{TRANSFORMER}.mtp_num_layers"))
    if m.moe is None:
        return args
    moe = m.moe
    args += [_arg("--num-experts", moe.num_experts, f"{TRANSFORMER}.num_moe_experts"),
             _arg("--moe-router-topk", moe.experts_per_token, f"{TRANSFORMER}.moe_router_topk"),
             _arg("--moe-ffn-hidden-size", moe.expert_ffn_size, f"{TRANSFORMER}.moe_ffn_hidden_size"),
             _arg("--moe-layer-freq", f'"{_layer_pattern(plan)}"', f"{TRANSFORMER}.moe_layer_freq"),
             _arg("--moe-router-score-function", moe.router, f"{TRANSFORMER}.moe_router_score_function"),
             *_dispatcher_arguments(plan),
             _arg("--moe-grouped-gemm", None, f"{TRANSFORMER}.moe_grouped_gemm")]
    if moe.shared_width:
        args.append(_arg("--moe-shared-expert-intermediate-size", moe.shared_width,
                         f"{TRANSFORMER}.moe_shared_expert_intermediate_size"))
    if moe.shared_expert_gate:
        args.append(_arg("--moe-shared-expert-gate", None, f"{TRANSFORMER}.moe_shared_expert_gate"))
    if moe.router == "softmax" and not moe.normalize_top_k:  # softmax over every expert, then top-k, kept as is
        args.append(_arg("--moe-router-pre-softmax", None, f"{TRANSFORMER}.moe_router_pre_softmax"))
    if moe.router == "sigmoid":  # DeepSeek-V3: top-k on score + a per-expert bias balanced without a loss
        args.append(_arg("--moe-router-enable-expert-bias", None, f"{TRANSFORMER}.moe_router_enable_expert_bias"))
    if moe.routed_scaling_factor != 1.0:
        args.append(_arg("--moe-router-topk-scaling-factor", moe.routed_scaling_factor,
                         f"{TRANSFORMER}.moe_router_topk_scaling_factor"))
    balance = "aux_loss" if moe.aux_loss_coefficient > 0 else "none"
    args.append(_arg("--moe-router-load-balancing-type", balance, f"{TRANSFORMER}.moe_router_load_balancing_type"))
    if moe.aux_loss_coefficient > 0:
        args.append(_arg("--moe-aux-loss-coeff", moe.aux_loss_coefficient, f"{TRANSFORMER}.moe_aux_loss_coeff"))
    if moe.capacity_factor is not None:
        args.append(_arg("--moe-expert-capacity-factor", moe.capacity_factor,
                         f"{TRANSFORMER}.moe_expert_capacity_factor"))
    if moe.group_limited:  # DeepSeek's node-limited routing: top-k among the experts of the best groups
        args += [_arg("--moe-router-num-groups", moe.router_groups, f"{TRANSFORMER}.moe_router_num_groups"),
                 _arg("--moe-router-group-topk", moe.router_group_topk, f"{TRANSFORMER}.moe_router_group_topk")]
    return args


def _dispatcher_arguments(plan: Plan) -> list[Argument]:
    """The token dispatcher the plan was priced with: the NCCL all-to-all one, or, for a stack with
    ``ep_dispatcher: deduplicated``, the flex dispatcher on DeepEP's node-deduplicating kernels
    (token_dispatcher.py ``MoEFlexTokenDispatcher``; HybridEP, its other backend, deduplicates alike)."""
    if plan.stack is not None and plan.stack.ep_dispatcher == "deduplicated":
        return [_arg("--moe-token-dispatcher-type", "flex", f"{TRANSFORMER}.moe_token_dispatcher_type"),
                _arg("--moe-flex-dispatcher-backend", "deepep", f"{TRANSFORMER}.moe_flex_dispatcher_backend")]
    return [_arg("--moe-token-dispatcher-type", "alltoall", f"{TRANSFORMER}.moe_token_dispatcher_type")]


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
        if plan.stack is None or plan.stack.selective_recompute != "modules":
            return [_arg("--recompute-granularity", "selective", f"{TRANSFORMER}.recompute_granularity")]
        modules = _recompute_modules(plan)
        if not modules:  # the plan priced nothing dropped: Megatron's default module (core_attn) would drop some
            return []
        return [_arg("--recompute-granularity", "selective", f"{TRANSFORMER}.recompute_granularity"),
                _arg("--recompute-modules", " ".join(modules), f"{TRANSFORMER}.recompute_modules")]
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


def _recompute_modules(plan: Plan) -> tuple[str, ...]:
    """The stack's ``recompute_modules`` (``selective_recompute: modules``) the model has: the cost model lets a
    module a block lacks do nothing, while Megatron-Core refuses ``mla_up_proj`` without MLA and ``moe_act``
    without grouped (MoE) GEMMs (TransformerConfig.__post_init__)."""
    m = plan.model
    has = {"mla_up_proj": m.mla is not None, "moe_act": m.moe is not None, "moe": m.moe is not None,
           "shared_experts": m.moe is not None and m.moe.shared_width > 0}
    return tuple(name for name in plan.stack.recompute_modules if has.get(name, True))


def _fp8_arguments(plan: Plan) -> list[Argument]:
    """fp8 as Transformer Engine's hybrid format; per-tensor current scaling where the exported recomputation
    reruns ``moe_act`` or ``layernorm``, which Megatron-Core refuses under its default delayed scaling."""
    args = [_arg("--bf16", None, f"{PARALLEL}.bf16"), _arg("--fp8-format", "hybrid", f"{TRANSFORMER}.fp8")]
    reruns = {a.value for a in _recompute_arguments(plan) if a.flag == "--recompute-modules"}
    if any(name in value.split() for value in reruns for name in ("moe_act", "layernorm")):
        args.append(_arg("--fp8-recipe", "tensorwise", f"{TRANSFORMER}.fp8_recipe"))
    return args


def megatron_arguments(plan: Plan) -> list[Argument]:
    """The plan as Megatron-LM arguments; ``ExportError`` names what Megatron cannot express."""
    t, m = plan.training, plan.model
    unwritten = [f for f, used in (("rope_scaling", m.rope_scaling is not None), ("o_bias", m.o_bias), ("attention_sinks", m.attention_sinks),
                                   ("sliding_window", m.sliding_window is not None),
                                   ("moe.router_bias", m.moe is not None and m.moe.router_bias),
                                   ("moe.expert_bias", m.moe is not None and m.moe.expert_bias),
                                   ("moe.normalize_top_k", m.moe is not None and m.moe.router == "sigmoid"
                                    and not m.moe.normalize_top_k),
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
    if plan.model.moe is not None:  # Megatron folds ep x etp into the same ranks (schema/parallel_dims.py)
        args += [_arg("--expert-model-parallel-size", plan.ep, f"{PARALLEL}.expert_model_parallel_size"),
                 _arg("--expert-tensor-parallel-size", plan.etp, f"{PARALLEL}.expert_tensor_parallel_size")]
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
                 "fp32": []}
    args += _fp8_arguments(plan) if t.precision == "fp8" else precision[t.precision]
    if plan.stack is not None and plan.stack.tp_comm_overlap > 0 and plan.tp > 1 and plan.sequence_parallel:
        args.append(_arg("--tp-comm-overlap", None, f"{PARALLEL}.tp_comm_overlap"))
    full = any(s.full_recompute for s in plan.stages)  # Megatron refuses the EP overlap with full recomputation
    if plan.ep_overlap_possible and not full and plan.stack is not None and plan.stack.ep_comm_overlap > 0:
        args += [_arg("--overlap-moe-expert-parallel-comm", None, f"{PARALLEL}.overlap_moe_expert_parallel_comm"),
                 _arg("--delay-wgrad-compute", None, f"{PARALLEL}.delay_wgrad_compute")]
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
