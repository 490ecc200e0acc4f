"""``autoplan profile``: trace a model on meta, time one block of each kind for real, write a ModelProfile.

Steps, and why in this order:

1. Build the whole model on ``meta`` (no memory, seconds even for 405B) and trace one forward per
   micro-batch size with SDPA flash-emulated (``attention``): per layer params, FLOPs, saved bytes,
   output bytes, and, from the first trace, the TP splits of one block of each kind.
2. For each TP size > 1, shard that block (``shard``) and trace it alone on meta: one rank's params,
   FLOPs and saved bytes at that size, exactly, instead of dividing by ``tp`` and hoping.
3. On meta too, count each layer's eager ops and the bytes they move, forward and backward
   (``eager_work``): what a stack that runs the layers op by op pays beyond the kernels' FLOPs.
4. Only on a real device: build one block of each kind (and each TP shard) for real, time forward and
   backward, and take its saved bytes from the real kernels (``attention_memory: measured``).
"""

from __future__ import annotations

import platform
import sys
import time
from dataclasses import dataclass, replace
from typing import Any

import torch
from torch import nn

from autoplan.errors import SpecError
from autoplan.profiler.attention import flash_emulated_sdpa
from autoplan.profiler.blocks import block_signature, find_blocks
from autoplan.profiler.eager_work import EagerWork, block_work, edge_work
from autoplan.profiler.load import LoadedModel, load_model
from autoplan.profiler.op_classes import SegmentOps, index_trace, segment_ops
from autoplan.profiler.shard import sharded_copy
from autoplan.profiler.timing import BlockTiming, materialize, real_inputs, time_block
from autoplan.profiler.tpsplit import find_tp_splits
from autoplan.profiler.trace import EMBEDDING, HEAD, Trace, call_with, trace_forward
from autoplan.schema.profile import (
    AttentionShape, GemmShape, LayerMeasurement, LayerProfile, ModelProfile, TpShard, TpSplit,
)

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
META = torch.device("meta")


@dataclass(frozen=True)
class ProfileOptions:
    device: str = "meta"
    dtype: str = "fp32"
    micro_batch_sizes: tuple[int, ...] = (1,)
    seq_len: int | None = None
    tp_sizes: tuple[int, ...] = (1, 2, 4, 8)
    warmup: int = 2
    repeats: int = 5
    progress: bool = True


@dataclass
class _Kind:
    """One distinct block type: its representative block, TP splits and (meta) inputs per micro-batch."""

    name: str
    block: nn.Module
    splits: tuple[TpSplit, ...]
    inputs: dict[int, tuple[tuple, dict]]


def profile_model(model_arg: str, options: ProfileOptions) -> ModelProfile:
    device = _check_device(options.device)
    loaded = load_model(model_arg, options.seq_len, DTYPES[options.dtype])
    blocks = find_blocks(loaded.model)
    _say(options, f"tracing {loaded.name} on meta ({len(blocks)} blocks) at micro-batch sizes "
         f"{list(options.micro_batch_sizes)}")
    traces = {}
    for b in options.micro_batch_sizes:
        start = time.perf_counter()
        traces[b] = _trace_model(loaded, blocks, b)
        _say(options, f"  micro-batch {b}: {len(traces[b].ops):,} ops traced in {time.perf_counter() - start:.1f} s")
    first = traces[options.micro_batch_sizes[0]]
    signatures = {name: block_signature(block) for name, block in blocks}
    kinds = _kinds(blocks, signatures, first, traces)
    shards = {(sig, b): _meta_shards(kind, b, options.tp_sizes) for sig, kind in kinds.items()
              for b in options.micro_batch_sizes}
    start = time.perf_counter()
    work = _eager_work(loaded, blocks, kinds, options.micro_batch_sizes)
    _say(options, f"  eager ops and bytes counted forward and backward in {time.perf_counter() - start:.1f} s")
    if any(t > 1 for t in options.tp_sizes):
        _say(options, f"  {len(kinds)} block kind(s); TP shards traced at {sorted(set(options.tp_sizes) - {1})}")
    timings: dict[tuple[str, int, int], BlockTiming] = {}
    if device.type != "meta":
        timings = _time_kinds(kinds, shards, device, options)
    layers = _layers(blocks, signatures, kinds, traces, shards, timings, work, options.micro_batch_sizes)
    total = sum(layer.params for layer in layers)
    unique = sum(p.numel() for p in loaded.model.parameters())  # parameters() deduplicates tied weights
    assert total == unique, f"traced params {total} != model params {unique}"  # a tracer bug, not user input
    return ModelProfile(
        name=loaded.name, source=model_arg, device=device.type, device_name=_device_name(device),
        dtype=options.dtype, seq_len=loaded.seq_len, micro_batch_sizes=tuple(options.micro_batch_sizes),
        tp_sizes=tuple(options.tp_sizes), torch_version=str(torch.__version__),
        attention_memory="flash-emulated" if device.type == "meta" else "measured",
        total_params=total, layers=tuple(layers), tied_params=first.shared_params,
        hidden_size=first.hidden_width)


def _check_device(name: str) -> torch.device:
    if name not in ("meta", "cpu", "cuda"):
        raise SpecError(f"--device: {name!r} is not one of meta, cpu, cuda")
    if name == "cuda" and not torch.cuda.is_available():
        raise SpecError("--device cuda: no CUDA device is available here; use --device cpu or meta")
    return torch.device(name)


def _trace_model(loaded: LoadedModel, blocks: list[tuple[str, nn.Module]], b: int) -> Trace:
    batch = loaded.make_batch(b, META)
    trace, _ = trace_forward(loaded.model, blocks, lambda: call_with(loaded.model, batch), sdpa=flash_emulated_sdpa)
    return trace


def _kinds(blocks: list[tuple[str, nn.Module]], signatures: dict[str, str], first: Trace,
           traces: dict[int, Trace]) -> dict[str, _Kind]:
    kinds: dict[str, _Kind] = {}
    for name, block in blocks:
        sig = signatures[name]
        if sig not in kinds:
            inputs = {b: t.block_inputs[name] for b, t in traces.items()}
            kinds[sig] = _Kind(name, block, find_tp_splits(first, name, name), inputs)
    return kinds


def _trace_block(block: nn.Module, args: tuple, kwargs: dict) -> Trace:
    trace, _ = trace_forward(block, [("block", block)], lambda: block(*args, **kwargs), sdpa=flash_emulated_sdpa)
    return trace


def _meta_shards(kind: _Kind, b: int, tp_sizes: tuple[int, ...]) -> list[TpShard]:
    """One rank's params, FLOPs and saved bytes of the block at each TP size its splits allow."""
    result = []
    for tp in sorted(t for t in tp_sizes if t > 1):
        shard = sharded_copy(kind.block, kind.splits, tp) if kind.splits else None
        if shard is None:
            continue
        args, kwargs = real_inputs(*kind.inputs[b], META)
        try:
            trace = _trace_block(shard, args, kwargs)
            eager = block_work(shard, args, kwargs, b)
        except (RuntimeError, ValueError, IndexError):
            continue  # the block's code does not run at this shard shape (a hard-coded head count or split size)
        result.append(TpShard(tp=tp, params=trace.params["block"] + trace.params[HEAD],
                              fwd_flops=trace.flops("block"), saved_activation_bytes=trace.saved_bytes("block"),
                              eager_bytes=eager.eager_bytes, **op_fields(segment_ops(trace, "block"))))
    return result


def _eager_work(loaded: LoadedModel, blocks: list[tuple[str, nn.Module]], kinds: dict[str, _Kind],
                sizes: tuple[int, ...]) -> dict[tuple[str, int], EagerWork]:
    """(layer kind: "embedding", "head" or a block signature, micro-batch) -> its eager ops and bytes."""
    work: dict[tuple[str, int], EagerWork] = {}
    for b in sizes:
        edges = edge_work(loaded.model, lambda n: call_with(loaded.model, loaded.make_batch(n, META)), blocks, b)
        work.update({(k, b): w for k, w in edges.items()})
        for sig, kind in kinds.items():
            work[(sig, b)] = block_work(kind.block, *real_inputs(*kind.inputs[b], META), b)
    return work


def _tp_param_tensors(block: nn.Module, splits: tuple[TpSplit, ...]) -> int:
    """Parameter tensors of the linears tensor parallelism splits (their weights and biases)."""
    names = {n for split in splits for n in (*split.columns, split.row)}
    return sum(len(list(block.get_submodule(n).parameters(recurse=False))) for n in names)


def op_fields(ops: SegmentOps) -> dict[str, Any]:
    """The profile fields of one traced layer's GEMMs, attention core and memory-bound bytes."""
    return dict(gemms=tuple(GemmShape(m, n, k, c) for m, n, k, c in ops.gemms),
                attention=AttentionShape(*ops.attention) if ops.attention else None,
                attention_flops=ops.attention_flops, elementwise_bytes=ops.elementwise_bytes,
                elementwise_kernels=ops.elementwise_kernels)


def _time_kinds(kinds: dict[str, _Kind], shards: dict[tuple[str, int], list[TpShard]], device: torch.device,
                options: ProfileOptions) -> dict[tuple[str, int, int], BlockTiming]:
    """(signature, micro-batch, tp) -> timing, for one real block of each kind at each shape."""
    jobs = [(sig, b, tp) for (sig, b), found in shards.items() for tp in [1] + [s.tp for s in found]]
    from tqdm import tqdm

    timings = {}
    for sig, b, tp in tqdm(jobs, desc=f"timing blocks on {device.type}", unit="shape", file=sys.stderr,
                           disable=not options.progress):
        kind = kinds[sig]
        block = kind.block if tp == 1 else sharded_copy(kind.block, kind.splits, tp)
        real = materialize(block, device)
        args, kwargs = real_inputs(*kind.inputs[b], device)
        timings[(sig, b, tp)] = time_block(real, args, kwargs, device, options.warmup, options.repeats)
        del real, args, kwargs
    return timings


def _layers(blocks, signatures, kinds, traces, shards, timings, work, sizes) -> list[LayerProfile]:
    first = traces[sizes[0]]
    indexes = {b: index_trace(t) for b, t in traces.items()}
    layers = [_edge_layer(EMBEDDING, traces, indexes, work, sizes)]
    for name, _ in blocks:
        sig = signatures[name]
        measurements = []
        for b in sizes:
            trace, timing = traces[b], timings.get((sig, b, 1))
            found = [_timed_shard(s, timings.get((sig, b, s.tp))) for s in shards[(sig, b)]]
            measurements.append(LayerMeasurement(
                micro_batch_size=b, fwd_flops=trace.flops(name),
                saved_activation_bytes=timing.saved_activation_bytes if timing else trace.saved_bytes(name),
                output_bytes=trace.output_bytes[name],
                fwd_time_s=timing.fwd_time_s if timing else None, bwd_time_s=timing.bwd_time_s if timing else None,
                tp_shards=tuple(found), host_ops=work[(sig, b)].host_ops, eager_bytes=work[(sig, b)].eager_bytes,
                **op_fields(segment_ops(trace, name, indexes[b]))))
        kind = kinds[sig]
        layers.append(LayerProfile(name=name, kind="block", block_type=sig, params=first.params[name],
                                   param_bytes=first.param_bytes[name], tp_splits=kind.splits,
                                   measurements=tuple(measurements), param_tensors=first.param_tensors[name],
                                   tp_param_tensors=_tp_param_tensors(kind.block, kind.splits)))
    layers.append(_edge_layer(HEAD, traces, indexes, work, sizes))
    return layers


def _timed_shard(shard: TpShard, timing: BlockTiming | None) -> TpShard:
    if timing is None:
        return shard
    return replace(shard, saved_activation_bytes=timing.saved_activation_bytes, fwd_time_s=timing.fwd_time_s,
                   bwd_time_s=timing.bwd_time_s)


def _edge_layer(segment: str, traces: dict[int, Trace], indexes: dict, work: dict, sizes: tuple[int, ...]) -> LayerProfile:
    """The embedding or the head: traced on meta only (never timed)."""
    first = traces[sizes[0]]
    measurements = tuple(LayerMeasurement(micro_batch_size=b, fwd_flops=traces[b].flops(segment),
                                          saved_activation_bytes=traces[b].saved_bytes(segment),
                                          output_bytes=traces[b].output_bytes.get(segment, 0),
                                          host_ops=work[(segment, b)].host_ops,
                                          eager_bytes=work[(segment, b)].eager_bytes,
                                          **op_fields(segment_ops(traces[b], segment, indexes[b])))
                         for b in sizes)
    return LayerProfile(name=segment, kind=segment, block_type=segment, params=first.params[segment],
                        param_bytes=first.param_bytes[segment], tp_splits=(), measurements=measurements,
                        param_tensors=first.param_tensors[segment])


def _device_name(device: torch.device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    if device.type == "cpu":
        return cpu_model_name()
    return "meta"


def cpu_model_name() -> str:
    """The CPU model from /proc/cpuinfo (Linux), else platform.processor()."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _say(options: ProfileOptions, message: str) -> None:
    if options.progress:
        print(message, file=sys.stderr)


def summary_rows(profile: ModelProfile) -> list[dict[str, Any]]:
    """One printable row per layer at the first micro-batch size (for the CLI's table)."""
    rows = []
    for layer in profile.layers:
        m = layer.measurements[0]
        rows.append({"name": layer.name, "kind": layer.kind, "params": layer.params, "fwd_gflop": m.fwd_flops / 1e9,
                     "saved_mib": m.saved_activation_bytes / 2**20, "out_mib": m.output_bytes / 2**20,
                     "fwd_ms": None if m.fwd_time_s is None else m.fwd_time_s * 1e3,
                     "bwd_ms": None if m.bwd_time_s is None else m.bwd_time_s * 1e3,
                     "tp_splits": len(layer.tp_splits)})
    return rows
