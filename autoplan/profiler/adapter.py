"""Planning from a profile: a ModelProfile turned into the cost model's ``Workload`` (torch-free).

The planner calls ``check_profile(profile, cluster, training, rescale)`` once, then uses
``profile_workload_fn(profile, cluster, training, rescale)`` wherever it would use ``analytic_workload``:
it returns the same ``(micro_batch_size, tp, sequence_parallel) -> Workload`` callable that
``autoplan.cost.estimate.WorkloadFn`` describes.

Where each field comes from, per block (the planner treats blocks as identical, so each quantity is the
largest over the profile's blocks):

* params, FLOPs, saved bytes at TP size t: the profile's meta-traced TP shard at t. For a t that was not
  profiled, each quantity Q is split as Q(t) = R + P/t, with the split part P = (Q1 - Qu)·u/(u - 1) solved
  from the largest profiled shard u (exact for TP, where every term is either replicated or split).
  Sequence parallelism also splits the replicated part (norm inputs, residuals): saved = Q1 / t
  (Korthikanti Eq. 4).
* micro-batch sizes that were not profiled: scaled linearly from the nearest profiled size (FLOPs and
  bytes are exactly linear in b; times nearly so once b s is large).
* forward/backward time: the measured times when the profile was measured on the plan's device. A meta
  profile, or a real one with ``rescale``, is timed on the target device's model instead: the traced
  FLOPs at the device's matmul efficiency, plus the bytes it writes (every saved tensor and the output)
  at its memory bandwidth; backward = BACKWARD_FACTOR x forward.
* recomputation: the profile's attention is flash (measured flash kernels or flash-emulated), so
  selective recomputation frees nothing and costs nothing (as ``analytic_workload`` does with flash);
  full recomputation keeps the block input (its output bytes).
* TP communication: one all-reduce per TP split (all-gather + reduce-scatter under SP) of the block's
  output, forward and backward, as in ``analytic_workload``.
* embedding and head: vocabulary-parallel under TP (params, FLOPs and the head's saved bytes / t), which
  is what the runtime's TP plan does for an embedding table and an output projection.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass

from autoplan.cost import activations as act
from autoplan.cost.comm import collective_time_s, group_link
from autoplan.cost.compute import matmul_time_s, memory_time_s
from autoplan.cost.workload import BACKWARD_FACTOR, LayerCost, Workload
from autoplan.errors import SpecError
from autoplan.schema import Cluster, TrainingSetup
from autoplan.schema.profile import LayerMeasurement, LayerProfile, ModelProfile


@dataclass(frozen=True)
class _Shape:
    """One layer's quantities at one (micro-batch, tp) after interpolation."""

    params: float
    fwd_flops: float
    saved_bytes: float
    output_bytes: float
    fwd_s: float | None
    bwd_s: float | None


def check_profile(profile: ModelProfile, cluster: Cluster, training: TrainingSetup, rescale: bool = False) -> bool:
    """Refuse a profile that does not fit the plan; return whether its measured times are used.

    SpecError when the dtype or the sequence length differ from the training setup (bytes and FLOPs would
    be wrong, and no rescaling fixes that), and when the profile was measured on another kind or model of
    device than ``cluster.device`` unless ``rescale`` (``--rescale-profile``) is given, in which case the
    times are re-derived for the target device from the traced FLOPs and bytes.
    """
    if profile.dtype != training.precision:
        raise SpecError(f"{profile.name}: profile dtype {profile.dtype} differs from training precision "
                        f"{training.precision}; re-run autoplan profile --dtype {training.precision}")
    if profile.seq_len is not None and profile.seq_len != training.seq_len:
        raise SpecError(f"{profile.name}: profiled at seq_len {profile.seq_len}, training uses {training.seq_len}; "
                        f"re-run autoplan profile --seq-len {training.seq_len}")
    if profile.device == "meta":
        return False  # nothing was timed: times always come from the target device's model
    if device_matches(profile, cluster):
        return not rescale
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


def profile_workload_fn(profile: ModelProfile, cluster: Cluster, training: TrainingSetup,
                        rescale: bool = False) -> Callable[[int, int, bool], Workload]:
    """The planner's WorkloadFn for a profiled model (checks the profile first)."""
    measured = check_profile(profile, cluster, training, rescale)
    return lambda b, tp, sp: profile_workload(profile, cluster, training, b, tp, sp, measured)


def profile_workload(profile: ModelProfile, cluster: Cluster, training: TrainingSetup, micro_batch_size: int,
                     tp: int, sp: bool, use_measured_times: bool) -> Workload:
    b = micro_batch_size
    blocks = profile.blocks
    if not blocks:
        raise SpecError(f"{profile.name}: the profile has no blocks to place in pipeline stages")
    if tp > 1 and any(not layer.tp_splits for layer in blocks):
        raise SpecError(f"tp: {profile.name} has blocks without TP splits; plan with tp=1")
    block = _largest([_block_shape(layer, b, tp) for layer in blocks])
    e = act.elem_bytes(training.mixed_precision)
    hidden_bytes = block.output_bytes
    link = group_link(cluster, tp, 1)

    def comm(kind: str) -> float:
        return collective_time_s(kind, hidden_bytes, link) if tp > 1 else 0.0

    per_split = comm("all_gather") + comm("reduce_scatter") if sp else comm("all_reduce")
    splits = max(len(layer.tp_splits) for layer in blocks)
    block_saved = max(_at(layer, b).saved_activation_bytes for layer in blocks) / tp if sp else block.saved_bytes
    embedding = _edge_cost(profile.layer("embedding"), b, tp, cluster, training, use_measured_times,
                           comm("reduce_scatter" if sp else "all_reduce"), 0.0, divide_saved=False)
    head = _edge_cost(profile.layer("head"), b, tp, cluster, training, use_measured_times,
                      comm("all_gather") if sp else 0.0, comm("reduce_scatter" if sp else "all_reduce"),
                      divide_saved=True)
    head_out = _at(profile.layer("head"), b).output_bytes if profile.layer("head") else 0
    return Workload(
        micro_batch_size=b, seq_len=training.seq_len, tp=tp, sequence_parallel=sp, num_layers=len(blocks),
        embedding=embedding,
        block=_cost(block, block_saved, hidden_bytes / (tp if sp else 1), cluster, training, use_measured_times,
                    splits * per_split, splits * per_split),
        head=head,
        tied_copy_params=profile.tied_params / tp,
        output_bytes=hidden_bytes / (tp if sp else 1),
        # logits and their gradient: fp32 log-softmax plus the logits in the compute dtype, vocab-split
        logits_transient_bytes=(4.0 + e) * (head_out / _elem(profile.dtype)) / tp,
    )


def _elem(dtype: str) -> int:
    return 4 if dtype == "fp32" else 2


def _largest(shapes: list[_Shape]) -> _Shape:
    """Each quantity's largest value over the blocks (a time is None if any block lacks it)."""
    def top(values: list) -> float | None:
        return None if any(v is None for v in values) else max(values)
    return _Shape(*(top([getattr(s, f) for s in shapes]) for f in ("params", "fwd_flops", "saved_bytes",
                                                                   "output_bytes", "fwd_s", "bwd_s")))


def _at(layer: LayerProfile | None, b: int) -> LayerMeasurement:
    """The measurement at micro-batch ``b``, scaled linearly from the nearest profiled size if needed."""
    assert layer is not None
    nearest = min(layer.measurements, key=lambda m: (abs(m.micro_batch_size - b), -m.micro_batch_size))
    if nearest.micro_batch_size == b:
        return nearest
    k = b / nearest.micro_batch_size

    def scale(v):
        return None if v is None else v * k
    return LayerMeasurement(
        micro_batch_size=b, fwd_flops=round(nearest.fwd_flops * k),
        saved_activation_bytes=round(nearest.saved_activation_bytes * k), output_bytes=round(nearest.output_bytes * k),
        fwd_time_s=scale(nearest.fwd_time_s), bwd_time_s=scale(nearest.bwd_time_s),
        tp_shards=tuple(type(s)(tp=s.tp, params=s.params, fwd_flops=round(s.fwd_flops * k),
                                saved_activation_bytes=round(s.saved_activation_bytes * k),
                                fwd_time_s=scale(s.fwd_time_s), bwd_time_s=scale(s.bwd_time_s))
                        for s in nearest.tp_shards))


def _block_shape(layer: LayerProfile, b: int, tp: int) -> _Shape:
    m = _at(layer, b)
    full = _Shape(layer.params, m.fwd_flops, m.saved_activation_bytes, m.output_bytes, m.fwd_time_s, m.bwd_time_s)
    if tp == 1:
        return full
    shard = m.shard(tp)
    if shard is not None:
        return _Shape(shard.params, shard.fwd_flops, shard.saved_activation_bytes, m.output_bytes,
                      shard.fwd_time_s, shard.bwd_time_s)
    if not m.tp_shards:
        raise SpecError(f"tp: the profile of {layer.name} has no TP shards; re-run autoplan profile --tp-sizes 1,{tp}")
    u = max(m.tp_shards, key=lambda s: s.tp)

    def split(q1: float, qu: float | None) -> float | None:
        if qu is None:
            return None
        part = (q1 - qu) * u.tp / (u.tp - 1)
        return q1 - part + part / tp
    return _Shape(split(layer.params, u.params), split(m.fwd_flops, u.fwd_flops),
                  split(m.saved_activation_bytes, u.saved_activation_bytes), m.output_bytes,
                  split(m.fwd_time_s, u.fwd_time_s) if m.fwd_time_s is not None else None,
                  split(m.bwd_time_s, u.bwd_time_s) if m.bwd_time_s is not None else None)


def _times(shape: _Shape, saved_bytes: float, cluster: Cluster, training: TrainingSetup,
           use_measured: bool) -> tuple[float, float]:
    if use_measured and shape.fwd_s is not None and shape.bwd_s is not None:
        return shape.fwd_s, shape.bwd_s
    # the forward writes each tensor it keeps for backward and its output at least once: its memory-bound part
    fwd = (matmul_time_s(shape.fwd_flops, cluster.device, training.precision)
           + memory_time_s(saved_bytes + shape.output_bytes, cluster.device))
    return fwd, BACKWARD_FACTOR * fwd


def _cost(shape: _Shape, saved_bytes: float, input_bytes: float, cluster: Cluster, training: TrainingSetup,
          use_measured: bool, tp_fwd_s: float, tp_bwd_s: float) -> LayerCost:
    fwd_s, bwd_s = _times(shape, saved_bytes, cluster, training, use_measured)
    return LayerCost(params=shape.params, fwd_s=fwd_s, bwd_s=bwd_s, fwd_flops=shape.fwd_flops,
                     saved_bytes=saved_bytes, selective_saved_bytes=saved_bytes, full_saved_bytes=input_bytes,
                     selective_extra_s=0.0, selective_extra_flops=0.0, tp_fwd_s=tp_fwd_s, tp_bwd_s=tp_bwd_s)


def _edge_cost(layer: LayerProfile | None, b: int, tp: int, cluster: Cluster, training: TrainingSetup,
               use_measured: bool, tp_fwd_s: float, tp_bwd_s: float, divide_saved: bool) -> LayerCost:
    if layer is None:
        return LayerCost(0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0)
    m = _at(layer, b)
    saved = m.saved_activation_bytes / (tp if divide_saved else 1)
    shape = _Shape(layer.params / tp, m.fwd_flops / tp, saved, m.output_bytes, m.fwd_time_s, m.bwd_time_s)
    return _cost(shape, saved, saved, cluster, training, use_measured, tp_fwd_s, tp_bwd_s)


def allowed_tp_sizes(profile: ModelProfile) -> tuple[int, ...]:
    """TP sizes the profile shows every block can be sharded at (1 always): what the planner may try in
    place of ``check_fits``'s head/ffn/vocab divisibility rules, which need a ModelSpec."""
    sizes = {1}
    blocks = profile.blocks
    if blocks and all(layer.tp_splits for layer in blocks):
        common = set.intersection(*({s.tp for m in layer.measurements for s in m.tp_shards} for layer in blocks))
        sizes |= common
    return tuple(sorted(sizes))
