"""Planning from a profile: a ModelProfile turned into the cost model's ``Workload`` (torch-free).

The planner calls ``check_profile(profile, cluster, training, rescale)`` once, then uses
``profile_workload_fn(profile, cluster, training, stack, rescale)`` wherever it would use
``analytic_workload``: it returns the same ``LayerSplit -> Workload`` callable (``WorkloadFn``,
cost/workload.py). Like the analytic path it describes each layer as ``LayerOps`` (GEMM shapes, attention
core, memory-bound bytes, saved bytes, TP collectives) and leaves the pricing to the one builder,
``cost.workload.build_workload``: so a profile of a model and a spec of it get the same kernel model.
The embedding and the head are built by the same vocabulary builders as a spec's
(``analytic_ops.embedding_of_vocabulary`` / ``head_of_vocabulary``); the profile gives only their own
traced work. The profiler counts each layer's eager ops and the bytes they move (profiler/eager_work.py):
they price host time and an eager stack's memory-bound traffic as a spec's counted tables do
(cost/analytic_ops.py), so a profile and a spec of the same model cost the same on every device and stack
(tests/profiler/test_profile_prices_like_spec.py); a profile written before those counts prices its
memory-bound work at the traced fused bytes and no host ops.

Where each field comes from, per block (the planner treats blocks as identical; it takes the block with
the most FLOPs, and each byte count's largest value over the blocks):

* precision: shapes and FLOPs do not depend on it; every activation byte count (saved, output,
  memory-bound) scales from the profile's dtype to the plan's activation dtype (2 bytes for bf16/fp16/fp8,
  4 for fp32), so one profile plans for any precision.
* TP size t: the profile's meta-traced shard at t. For a t that was not profiled, each byte count Q is split
  as Q(t) = R + P/t with the split part P = (Q1 - Qu)·u/(u - 1) solved from the largest profiled shard u
  (exact for TP, where every term is either replicated or split), and each GEMM dimension and the heads
  that shrink from tp 1 to u are divided by t. Sequence parallelism also splits the replicated part
  (norm inputs, residuals): Q1 / t (Korthikanti Eq. 4).
* micro-batch sizes that were not profiled: scaled linearly from the nearest profiled size (FLOPs, bytes,
  GEMM rows and attention batch are exactly linear in b).
* forward/backward time: the measured times when the profile was measured on the plan's device in the
  plan's activation dtype; otherwise the builder's kernel model.
* eager bytes: split like the other byte counts (replicated + split / t; all / t under SP); host ops:
  as counted (they do not change with TP; DTensor's work per parallelised module is priced apart, one
  module per linear of the TP splits).
* recomputation: the profile's attention is flash (measured flash kernels or flash-emulated), so
  selective recomputation frees nothing and costs nothing; full recomputation keeps the block input.
* TP communication: per TP split of the block what ``analytic_ops.block_tp_messages`` gives a spec's block;
  on a stack that reduces input gradients per module, one backward all-reduce per column linear.
* embedding and head: vocabulary-parallel under TP, the head's output projection padded as Megatron pads
  (``MEGATRON_VOCAB_DIVISOR`` x tp rows), with the vocabulary-parallel cross-entropy the trace of a bare
  forward does not contain: the spec's own vocabulary builders.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace

from autoplan.cost.activations import (
    SavedBytes, elem_bytes, kept_output_bytes_per_logit, loss_fp32_copies, loss_transient_bytes_per_logit,
)
from autoplan.cost.analytic_ops import EdgeWork, block_tp_messages, embedding_of_vocabulary, head_of_vocabulary
from autoplan.cost.layer_ops import AttentionCore, Gemm, HostOps, LayerOps, Message
from autoplan.cost.workload import LayerSplit, Workload, WorkloadFn, build_workload
from autoplan.errors import SpecError
from autoplan.schema import Cluster, StackProfile, TrainingSetup
from autoplan.schema.model import MEGATRON_VOCAB_DIVISOR
from autoplan.schema.profile import AttentionShape, GemmShape, LayerMeasurement, LayerProfile, ModelProfile


@dataclass(frozen=True)
class _Shape:
    """One layer's quantities at one (micro-batch, tp) after interpolation, at the profile's dtype."""

    params: float
    fwd_flops: float
    saved_bytes: float
    output_bytes: float
    elementwise_bytes: float
    kernels: int
    gemms: tuple[GemmShape, ...]
    attention: AttentionShape | None
    fwd_s: float | None
    bwd_s: float | None
    eager_fwd: float | None = None
    eager_bwd: float | None = None


def check_profile(profile: ModelProfile, cluster: Cluster, training: TrainingSetup, rescale: bool = False) -> bool:
    """Refuse a profile that does not fit the plan; return whether its measured times are used.

    SpecError when the sequence length differs from the training setup (attention FLOPs and bytes would be
    wrong, and no rescaling fixes that), and when the profile was measured on another kind or model of
    device than ``cluster.device`` unless ``rescale`` (``--rescale-profile``) is given, in which case the
    times are re-derived for the target device from the traced shapes and bytes. A profile made in another
    dtype plans fine (bytes are rescaled), but its measured times are then not used.
    """
    if profile.seq_len is not None and profile.seq_len != training.seq_len:
        raise SpecError(f"{profile.name}: profiled at seq_len {profile.seq_len}, training uses {training.seq_len}; "
                        f"re-run autoplan profile --seq-len {training.seq_len}")
    if profile.device == "meta":
        return False  # nothing was timed: times always come from the target device's model
    if device_matches(profile, cluster):
        return not rescale and profile.dtype == training.activation_precision
    if rescale:
        return False
    raise SpecError(f"{profile.name}: profile was measured on {profile.device} ({profile.device_name}) but the plan "
                    f"is for {cluster.device.name} ({cluster.device.kind}); profile on that device or pass "
                    "--rescale-profile to re-derive the times for it")


def device_matches(profile: ModelProfile, cluster: Cluster) -> bool:
    """Same kind (cuda ~ gpu, cpu ~ cpu) and the same model: the device profile's model token (``h100`` of
    ``h100-sxm-80gb``) occurs in the profiled device name, or the profiled device name occurs in the device
    profile's ``source`` (what ``autoplan profile-hardware`` writes there)."""
    device = cluster.device
    if {"cuda": "gpu", "cpu": "cpu"}.get(profile.device) != device.kind:
        return False
    flat = re.sub(r"[^a-z0-9]", "", profile.device_name.lower())
    token = re.sub(r"[^a-z0-9]", "", device.name.lower().split("-")[0])
    return bool(profile.device_name) and ((device.kind == "gpu" and len(token) >= 3 and token in flat)
                                          or profile.device_name in device.source)


def profile_workload_fn(profile: ModelProfile, cluster: Cluster, training: TrainingSetup, stack: StackProfile,
                        rescale: bool = False) -> WorkloadFn:
    """The planner's WorkloadFn for a profiled model (checks the profile first). Context parallelism is
    planned from model specs only: its ring exchanges K and V, whose width a profile does not record
    (the planner searches cp = 1 for a profile)."""
    measured = check_profile(profile, cluster, training, rescale)

    def fn(split: LayerSplit) -> Workload:
        if split.cp > 1:
            raise SpecError(f"cp: {profile.name} is a profile, which does not record the K/V width ring attention "
                            "exchanges; plan context parallelism from the model spec or config.json")
        return profile_workload(profile, cluster, training, stack, split, measured)

    return fn


def profile_workload(profile: ModelProfile, cluster: Cluster, training: TrainingSetup, stack: StackProfile,
                     split: LayerSplit, use_measured_times: bool) -> Workload:
    b, tp, sp = split.micro_batch_size, split.tp, split.sequence_parallel
    blocks = profile.blocks
    if not blocks:
        raise SpecError(f"{profile.name}: the profile has no blocks to place in pipeline stages")
    if tp > 1 and any(not layer.tp_splits for layer in blocks):
        raise SpecError(f"tp: {profile.name} has blocks without TP splits; plan with tp=1")
    e = elem_bytes(training.activation_precision)
    r = e / elem_bytes(profile.dtype)  # activation bytes: profile dtype -> plan dtype
    shapes = [_block_shape(layer, b, tp) for layer in blocks]
    block = max(shapes, key=lambda x: x.fwd_flops)
    saved = max(x.saved_bytes for x in shapes) * r
    elementwise = max(x.elementwise_bytes for x in shapes) * r
    eager = _eager(block, r)
    if sp:  # SP splits the replicated part too: the unsplit quantity / tp
        full = [_block_shape(layer, b, 1) for layer in blocks]
        saved = max(x.saved_bytes for x in full) * r / tp
        elementwise = max(x.elementwise_bytes for x in full) * r / tp
        whole = _eager(max(full, key=lambda x: x.fwd_flops), r)
        eager = None if whole is None else (whole[0] / tp, whole[1] / tp)
    hidden = block.output_bytes * r
    input_bytes = hidden / (tp if sp else 1)
    representative = max(blocks, key=lambda layer: _at(layer, b).fwd_flops)
    fwd, bwd = block_tp_messages(hidden, sp, splits=len(representative.tp_splits))
    if stack.tp_input_grad_reduce == "per_module" and not sp:  # one per column-parallel module (schema/stack.py)
        bwd = (Message("all_reduce", hidden),) * sum(len(s.columns) for s in representative.tp_splits)
    block_ops = LayerOps(
        params=block.params, gemms=_gemms(block.gemms), attention=_core(block.attention),
        elementwise_bytes=elementwise, elementwise_kernels=block.kernels,
        saved=SavedBytes(saved, saved, input_bytes), tp_fwd=fwd, tp_bwd=bwd,
        host=_host(representative, _at(representative, b), sum(len(s.columns) + 1 for s in representative.tp_splits),
                   representative.tp_param_tensors),
        eager_bytes=eager)
    embedding, head, logits = _edge_ops(profile, split, training, r)
    workload = build_workload(
        embedding, block_ops, head, num_layers=len(blocks), split=split, cluster=cluster, training=training,
        stack=stack, tied_copy_params=_tied(profile, tp), output_bytes=input_bytes,
        logits_transient_bytes=loss_transient_bytes_per_logit(e, loss_fp32_copies(stack, tp)) * logits,
        kept_output_bytes=kept_output_bytes_per_logit(e, stack) * logits)
    if use_measured_times and block.fwd_s is not None and block.bwd_s is not None:
        workload = replace(workload, block=replace(workload.block, fwd_s=block.fwd_s, bwd_s=block.bwd_s))
    return workload


def _eager(shape: _Shape, r: float) -> tuple[float, float] | None:
    if shape.eager_fwd is None or shape.eager_bwd is None:
        return None
    return shape.eager_fwd * r, shape.eager_bwd * r


def _host(layer: LayerProfile, m: LayerMeasurement, tp_modules: int, tp_tensors: int) -> HostOps:
    """The counted host ops of one layer, its parallelised modules and parameter tensors (zero counts for a
    profile written before they were counted)."""
    counts = m.host_ops or (0, 0, 0, 0)
    return HostOps(*counts, tp_modules=tp_modules, param_tensors=layer.param_tensors, tp_param_tensors=tp_tensors)


def _tied(profile: ModelProfile, tp: int) -> float:
    """The tied output projection a last stage keeps a copy of: vocab-parallel, padded like the table."""
    if not profile.tied_params or not profile.hidden_size:
        return profile.tied_params / tp
    vocab = profile.tied_params // profile.hidden_size
    multiple = MEGATRON_VOCAB_DIVISOR * tp
    return -(-vocab // multiple) * multiple * profile.hidden_size / tp


def _gemms(shapes: tuple[GemmShape, ...], fp8: bool = True) -> tuple[Gemm, ...]:
    return tuple(Gemm(g.m, g.n, g.k, g.count, fp8=fp8) for g in shapes)


def _core(a: AttentionShape | None) -> AttentionCore | None:
    return None if a is None else AttentionCore(1, a.batch_heads, a.seq_len, a.head_dim, dropout=False)


def _edge_ops(profile: ModelProfile, split: LayerSplit, training: TrainingSetup,
              r: float) -> tuple[LayerOps, LayerOps, float]:
    """The embedding and the head as LayerOps (the traced layers' own work on the spec's vocabulary builders),
    and the head's logits per device (padded vocabulary / tp). ``r``: activation bytes, profile -> plan dtype."""
    empty = LayerOps(0.0, (), None, 0.0, 0, SavedBytes(0.0, 0.0, 0.0))
    emb_layer, head_layer = profile.layer("embedding"), profile.layer("head")
    b, tp = split.micro_batch_size, split.tp
    hidden_size = profile.hidden_size or 0
    tokens = b * (profile.seq_len or 1)
    vocab = round(_at(head_layer, b).output_bytes / elem_bytes(profile.dtype) / tokens) if head_layer else 0
    multiple = MEGATRON_VOCAB_DIVISOR * tp
    padded = -(-vocab // multiple) * multiple
    table = vocab * hidden_size

    embedding = empty
    if emb_layer is not None:
        m = _at(emb_layer, b)
        has_table = 0 < table <= emb_layer.params
        own = EdgeWork(params=emb_layer.params - table, elementwise_bytes=m.elementwise_bytes * r,
                       kernels=max(1, m.elementwise_kernels), saved_bytes=float(m.saved_activation_bytes),
                       host=_host(emb_layer, m, 1 if has_table else 0, 1 if has_table else 0),
                       eager_bytes=_edge_eager(m, r, split))
        rows = padded
        if not has_table:  # no vocabulary table in it: its parameters split over TP
            own, rows = replace(own, params=emb_layer.params / tp), 0
        embedding = embedding_of_vocabulary(rows, hidden_size, own, split, training)
    if head_layer is None:
        return embedding, empty, 0.0
    m = _at(head_layer, b)
    projection = head_layer.params >= table
    own = EdgeWork(params=head_layer.params - (table if projection else 0),
                   elementwise_bytes=m.elementwise_bytes * r / split.hidden_shards,
                   kernels=max(1, m.elementwise_kernels), saved_bytes=m.saved_activation_bytes * r,
                   gemms=tuple(Gemm(g.m, g.n, g.k, g.count, fp8=False) for g in m.gemms if g.n != vocab),
                   host=_host(head_layer, m, 1, 1 if projection else 0), eager_bytes=_edge_eager(m, r, split))
    head = head_of_vocabulary(padded, hidden_size, own, projection, split, training)
    return embedding, head, tokens * padded / tp


def _edge_eager(m: LayerMeasurement, r: float, split: LayerSplit) -> tuple[float, float] | None:
    """An edge layer's own eager bytes: the hidden state's (the lookup's output, the final norm), split
    along the sequence under SP, not by TP."""
    if m.eager_bytes is None:
        return None
    return m.eager_bytes[0] * r / split.hidden_shards, m.eager_bytes[1] * r / split.hidden_shards


def _at(layer: LayerProfile, b: int) -> LayerMeasurement:
    """The measurement at micro-batch ``b``, scaled linearly from the nearest profiled size if needed."""
    nearest = min(layer.measurements, key=lambda m: (abs(m.micro_batch_size - b), -m.micro_batch_size))
    if nearest.micro_batch_size == b:
        return nearest
    k = b / nearest.micro_batch_size

    def scale(v):
        return None if v is None else v * k

    def ops(x) -> dict:
        return dict(gemms=tuple(replace(g, m=round(g.m * k)) for g in x.gemms),
                    attention=replace(x.attention, batch_heads=round(x.attention.batch_heads * k))
                    if x.attention else None,
                    attention_flops=round(x.attention_flops * k), elementwise_bytes=round(x.elementwise_bytes * k),
                    elementwise_kernels=x.elementwise_kernels,
                    eager_bytes=None if x.eager_bytes is None else (x.eager_bytes[0] * k, x.eager_bytes[1] * k))
    return LayerMeasurement(
        micro_batch_size=b, fwd_flops=round(nearest.fwd_flops * k),
        saved_activation_bytes=round(nearest.saved_activation_bytes * k), output_bytes=round(nearest.output_bytes * k),
        fwd_time_s=scale(nearest.fwd_time_s), bwd_time_s=scale(nearest.bwd_time_s), host_ops=nearest.host_ops,
        tp_shards=tuple(replace(s, fwd_flops=round(s.fwd_flops * k),
                                saved_activation_bytes=round(s.saved_activation_bytes * k),
                                fwd_time_s=scale(s.fwd_time_s), bwd_time_s=scale(s.bwd_time_s), **ops(s))
                        for s in nearest.tp_shards), **ops(nearest))


def _block_shape(layer: LayerProfile, b: int, tp: int) -> _Shape:
    m = _at(layer, b)
    fwd_eager, bwd_eager = m.eager_bytes or (None, None)
    if tp == 1:
        return _Shape(layer.params, m.fwd_flops, m.saved_activation_bytes, m.output_bytes, m.elementwise_bytes,
                      m.elementwise_kernels, m.gemms, m.attention, m.fwd_time_s, m.bwd_time_s, fwd_eager, bwd_eager)
    shard = m.shard(tp)
    if shard is not None:
        sf, sb = shard.eager_bytes or (None, None)
        return _Shape(shard.params, shard.fwd_flops, shard.saved_activation_bytes, m.output_bytes,
                      shard.elementwise_bytes, shard.elementwise_kernels, shard.gemms, shard.attention,
                      shard.fwd_time_s, shard.bwd_time_s, sf, sb)
    if not m.tp_shards:
        raise SpecError(f"tp: the profile of {layer.name} has no TP shards; re-run autoplan profile --tp-sizes 1,{tp}")
    u = max(m.tp_shards, key=lambda s: s.tp)

    def split(q1: float | None, qu: float | None) -> float | None:
        if q1 is None or qu is None:
            return None
        part = (q1 - qu) * u.tp / (u.tp - 1)
        return q1 - part + part / tp
    uf, ub = u.eager_bytes or (None, None)
    return _Shape(split(layer.params, u.params), split(m.fwd_flops, u.fwd_flops),
                  split(m.saved_activation_bytes, u.saved_activation_bytes), m.output_bytes,
                  split(m.elementwise_bytes, u.elementwise_bytes), m.elementwise_kernels,
                  _split_gemms(m.gemms, u.gemms, u.tp, tp, layer.name), _split_attention(m.attention, u.attention, u.tp, tp),
                  split(m.fwd_time_s, u.fwd_time_s), split(m.bwd_time_s, u.bwd_time_s),
                  split(fwd_eager, uf), split(bwd_eager, ub))


def _split_gemms(full: tuple[GemmShape, ...], shard: tuple[GemmShape, ...], u: int, tp: int,
                 name: str) -> tuple[GemmShape, ...]:
    """The GEMMs at an unprofiled tp: call by call, each dimension that shrank u-fold at tp u is divided by
    tp (the column linears' n, the row linears' k)."""
    flat_full = [(g.m, g.n, g.k) for g in full for _ in range(g.count)]
    flat_shard = [(g.m, g.n, g.k) for g in shard for _ in range(g.count)]
    if len(flat_full) != len(flat_shard):
        raise SpecError(f"tp: the GEMMs of {name} at tp {u} do not pair with those at tp 1; "
                        f"re-run autoplan profile --tp-sizes 1,{tp}")
    return tuple(GemmShape(*(a // tp if a != b else a for a, b in zip(f, sh))) for f, sh in zip(flat_full, flat_shard))


def _split_attention(full: AttentionShape | None, shard: AttentionShape | None, u: int,
                     tp: int) -> AttentionShape | None:
    if full is None or shard is None or shard.batch_heads == full.batch_heads:
        return full
    return replace(full, batch_heads=max(1, full.batch_heads // tp))


def allowed_tp_sizes(profile: ModelProfile) -> tuple[int, ...]:
    """TP sizes the profile shows every block can be sharded at (1 always): what the planner may try in
    place of ``check_fits``'s head/ffn divisibility rules, which need a ModelSpec."""
    sizes = {1}
    blocks = profile.blocks
    if blocks and all(layer.tp_splits for layer in blocks):
        common = set.intersection(*({s.tp for m in layer.measurements for s in m.tp_shards} for layer in blocks))
        sizes |= common
    return tuple(sorted(sizes))
