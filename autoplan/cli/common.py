"""Command-line pieces shared by ``plan`` and ``estimate``: the inputs (model, cluster, training) and pins."""

from __future__ import annotations

import argparse
import dataclasses
from pathlib import Path
from typing import Literal, get_args, get_origin, get_type_hints

from autoplan.errors import SpecError
from autoplan.schema import DEFAULT_STACK, Cluster, ModelSpec, StackProfile, TrainingSetup, load_cluster, load_model, load_stack
from autoplan.schema.io import shipped_names
from autoplan.schema.hf_config import is_hf_config, spec_from_hf_config
from autoplan.schema._io import validated
from autoplan.schema.plan import ParallelConfig, RecomputeMode, parallel_dimensions
from autoplan.schema.profile import ModelProfile, is_profile_file, load_profile


def add_input_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("model", help="shipped model name (e.g. llama3-8b), a model spec YAML, a Hugging Face "
                   "config.json of a llama, mistral or gpt2 model, or a profile YAML written by autoplan profile")
    p.add_argument("--cluster", required=True, help="shipped cluster name (e.g. dgx-h100-80gb) or path")
    p.add_argument("--nodes", type=int, help="override the cluster's num_nodes")
    p.add_argument("--devices-per-node", type=int, help="override the cluster's devices_per_node")
    p.add_argument("--global-batch-size", type=int, required=True, help="sequences per optimizer step")
    p.add_argument("--seq-len", type=int, help="tokens per sequence (default: the model's seq_len)")
    p.add_argument("--precision", choices=["bf16", "fp16", "fp32", "fp8"],
                   help="default: bf16 mixed precision on GPUs, fp32 on CPU; fp8: linear layers in fp8 with "
                   "per-tensor scaling, the rest in bf16 (GPUs with fp8 tensor cores)")
    p.add_argument("--attention", choices=["flash", "standard"], default="flash",
                   help="flash (default): a fused kernel that keeps no s x s scores; standard: separate score, "
                   "softmax and dropout kernels that keep them (Megatron-LM 2021/2022)")
    p.add_argument("--make-vocab-size-divisible-by", type=int,
                   help="pad the vocabulary to a multiple of this x tp, as Megatron-LM does (default: the "
                   "model's, 128)")
    p.add_argument("--no-grad-accumulation-fusion", dest="grad_accumulation_fusion", action="store_false",
                   help="each micro-batch's weight gradients are added into the fp32 buffer by a separate "
                   "kernel (Megatron-LM 2021-22, torch AccumulateGrad) instead of inside the GEMM")
    p.add_argument("--optimizer", choices=["adamw", "sgd"], default="adamw")
    p.add_argument("--memory-margin", type=float, default=0.1, help="share of device memory kept free (0.1)")
    p.add_argument("--no-overlap-grad-reduce", dest="overlap_grad_reduce", action="store_false",
                   help="data-parallel gradient reduction after the backward instead of overlapped with it")
    p.add_argument("--moe-imbalance", type=float, default=1.0,
                   help="Mixture of Experts: tokens the busiest expert receives over its balanced share, in [1, 64] "
                        "(1.0: balanced, as published benchmarks force it)")
    p.add_argument("--stack", default=DEFAULT_STACK,
                   help=f"the training stack that will run the plan: {', '.join(shipped_names('stacks'))}, or a stack "
                        f"profile YAML (default {DEFAULT_STACK}, this project's runtime)")
    p.add_argument("--rescale-profile", action="store_true",
                   help="use a profile measured on another device: times re-derived from its FLOPs and bytes")
    p.add_argument("--json", action="store_true", help="print one JSON object instead of tables")


def add_layout_arguments(p: argparse.ArgumentParser, required: bool) -> None:
    """The parallel dimensions of ``ParallelConfig`` (schema/plan.py), one flag each: pins for ``plan``,
    the configuration itself for ``estimate`` (``required``: the dimensions estimate cannot default)."""
    hints = get_type_hints(ParallelConfig)
    for field in parallel_dimensions():
        meta = field.metadata
        if not meta["pinnable"]:
            continue
        flag = "--" + (meta["flag"] or field.name).replace("_", "-")
        hint = hints[field.name]
        if hint is bool:
            p.add_argument(flag, dest=field.name, action=argparse.BooleanOptionalAction, default=None,
                           help=meta["help"])
            continue
        choices = meta["choices"] or (get_args(hint) if get_origin(hint) is Literal else None)
        p.add_argument(flag, dest=field.name, type=int if hint is int else str, choices=choices,
                       required=required and meta["estimate_needs"], help=meta["help"])
    p.add_argument("--recompute", choices=list(get_args(RecomputeMode)),
                   help="recomputation of every layer" + ("" if required else " (default: searched per stage)"))


def counted_dimensions() -> list[str]:
    """Parallel dimensions that count something (sizes, not a choice among values): at least 1 each."""
    hints = get_type_hints(ParallelConfig)
    return [f.name for f in parallel_dimensions()
            if f.metadata["pinnable"] and hints[f.name] is int and not f.metadata["choices"]]


def positive(name: str, value: int | None) -> None:
    if value is not None and value < 1:
        raise SpecError(f"--{name}: must be at least 1, got {value}")


def load_inputs(args: argparse.Namespace) -> tuple[ModelSpec | ModelProfile, Cluster, TrainingSetup]:
    """The model is a ModelSpec, or a ModelProfile when MODEL is a profile file."""
    for name in ("nodes", "devices_per_node", "global_batch_size", "seq_len", *counted_dimensions()):
        positive(name.replace("_", "-"), getattr(args, name, None))
    model = load_any_model(args.model)
    if args.make_vocab_size_divisible_by is not None:
        positive("make-vocab-size-divisible-by", args.make_vocab_size_divisible_by)
        if not isinstance(model, ModelSpec):
            raise SpecError("--make-vocab-size-divisible-by: a profile pads as Megatron-LM does by default (128); "
                            "give the option with a model spec or config")
        model = dataclasses.replace(model, make_vocab_size_divisible_by=args.make_vocab_size_divisible_by)
    default_seq = model.seq_len if isinstance(model, ModelSpec) else (model.seq_len or 1)
    cluster = load_cluster(args.cluster)
    overrides = {k: v for k, v in (("num_nodes", args.nodes), ("devices_per_node", args.devices_per_node)) if v}
    # options change loaded objects: check the result exactly as a file would be checked (bounds, finiteness)
    cluster = validated(dataclasses.replace(cluster, **overrides),
                        {"num_nodes": "--nodes", "devices_per_node": "--devices-per-node"})
    precision = args.precision or ("fp32" if cluster.device.kind == "cpu" else "bf16")
    if precision == "fp8" and cluster.device.peak_fp8_tflops <= 0:
        raise SpecError(f"--precision fp8: {cluster.device.name} has no fp8 tensor cores (its profile's "
                        "peak_fp8_tflops is 0); use bf16, or an H100/H200/H800/B200 cluster")
    if not 0 <= args.memory_margin < 1:
        raise SpecError(f"--memory-margin: must be in [0, 1), got {args.memory_margin}")
    training = validated(
        TrainingSetup(global_batch_size=args.global_batch_size, seq_len=args.seq_len or default_seq,
                      precision=precision, optimizer=args.optimizer, memory_margin=args.memory_margin,
                      attention=args.attention, grad_accumulation_fusion=args.grad_accumulation_fusion,
                      overlap_grad_reduce=args.overlap_grad_reduce, moe_imbalance=getattr(args, "moe_imbalance", 1.0)),
        {"global_batch_size": "--global-batch-size", "seq_len": "--seq-len", "memory_margin": "--memory-margin",
         "moe_imbalance": "--moe-imbalance"})
    if isinstance(model, ModelSpec):  # before the search: a plan the runtime would refuse is never written
        from autoplan.schema.plan import sequence_refusal
        reason = sequence_refusal(model, training)
        if reason:
            raise SpecError(f"--seq-len: {reason}")
    return model, cluster, training


def load_stack_arg(args: argparse.Namespace) -> StackProfile:
    """``--stack``: a shipped stack's name or a stack profile file."""
    try:
        return load_stack(args.stack)
    except SpecError as err:
        raise SpecError(f"--stack: {err}") from None


def load_any_model(arg: str) -> ModelSpec | ModelProfile:
    """A profile file, a Hugging Face config.json (mapped onto a ModelSpec), or a spec / shipped name."""
    if is_hf_config(arg):  # first: JSON is not always YAML (escapes beyond the BMP, tabs, duplicate keys)
        return spec_from_hf_config(arg)
    if Path(arg).is_file() and is_profile_file(arg):
        return load_profile(arg)
    return load_model(arg)


def runnable_spec(model: ModelSpec | ModelProfile) -> ModelSpec | None:
    """The ModelSpec a plan file embeds: the model itself, or the shipped model / spec / Hugging Face config
    a profile was made from (a llama, mistral or gpt2 config maps onto a spec); None for a profile of a
    model the runtime cannot build (a user module, another architecture)."""
    if isinstance(model, ModelSpec):
        return model
    try:
        return spec_from_hf_config(model.source) if is_hf_config(model.source) else load_model(model.source)
    except SpecError:
        return None
