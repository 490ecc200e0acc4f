"""A profile of a model and the model's spec are priced alike, for every shipped model, on CPU and GPU
clusters and on both shipped stacks.

Both end in the same builders: the embedding's and the head's vocabulary (table, lookup and loss
collectives, projection GEMM, logits, the loss's eager ops) is built once (cost/analytic_ops.py
``embedding_of_vocabulary``, ``head_of_vocabulary``), every layer is priced by ``layer_cost``, and a
profile counts its layers' eager ops and bytes (profiler/eager_work.py) where a spec reads the counted
tables. What differs is what each source knows of a layer's own work, and the tolerances below name it:

* fused memory-bound bytes: the profile's region rule (profiler/op_classes.py: connected element-wise
  ops as one kernel) against the spec's per-block formula; a few per cent of a block;
* eager bytes and host ops: both counted by TorchDispatchMode, the spec's on the runtime's CPU kernels,
  the profile's on meta with SDPA as one call (a view or two apart, per-token statistics counted by the
  profile, not by the spec's classes);
* dropout > 0: the spec's tables are counted at dropout 0, the profile counts the mask ops it traced, so a
  model with dropout costs the profile more host work, never less.
"""

from __future__ import annotations

import dataclasses
import math

import pytest

from autoplan.cost.estimate import estimate_layout, layout_of
from autoplan.cost.evaluate import StageShape
from autoplan.cost.model_workload import workload_fn
from autoplan.cost.split import LayerSplit
from autoplan.cost.stage_table import Config
from autoplan.profiler.model_profile import ProfileOptions, profile_model
from autoplan.schema import TrainingSetup, load_cluster, load_model, load_stack
from autoplan.schema.io import shipped_names

CLUSTERS = ("cpu-local-calibrated", "cpu-local", "dgx-h100-80gb", "dgx-a100-80gb")
SPLITS = (LayerSplit(1), LayerSplit(1, 2, False), LayerSplit(1, 2, True), LayerSplit(2, 2, True))
STACKS = ("autoplan", "megatron")


DENSE = [name for name in shipped_names("models") if load_model(name).moe is None and load_model(name).mla is None]
"""The shipped models the cost model prices: the MoE ones (issue 31) are refused by plan and estimate, and
the profiler does not build them."""


@pytest.fixture(scope="module")
def profiles():
    return {name: profile_model(name, ProfileOptions(micro_batch_sizes=(1,), tp_sizes=(1, 2), progress=False))
            for name in DENSE}


def _training(cluster, spec) -> TrainingSetup:
    return TrainingSetup(8, spec.seq_len, precision="fp32" if cluster.device.kind == "cpu" else "bf16")


def _rel(a: float, b: float) -> float:
    return abs(b - a) / abs(a) if a else abs(b)


@pytest.mark.parametrize("name", DENSE)
def test_layers_cost_alike(profiles, name):
    spec, profile = load_model(name), profiles[name]
    for cluster_name, stack_name, split in ((c, s, p) for c in CLUSTERS for s in STACKS for p in SPLITS):
        cluster, stack = load_cluster(cluster_name), load_stack(stack_name)
        training = _training(cluster, spec)
        a = workload_fn(spec, cluster, training, stack)(split)
        b = workload_fn(profile, cluster, training, stack)(split)
        where = (name, cluster_name, stack_name, split)
        # what both take from the same builders and the same shapes: equal
        for layer in ("embedding", "block", "head"):
            x, y = getattr(a, layer), getattr(b, layer)
            assert y.fwd_flops == pytest.approx(x.fwd_flops, rel=1e-9), (where, layer)
            assert y.tp_fwd_s == pytest.approx(x.tp_fwd_s, rel=1e-9), (where, layer)
            assert y.tp_bwd_s == pytest.approx(x.tp_bwd_s, rel=1e-9), (where, layer)
            assert y.param_tensors == x.param_tensors and y.tp_param_tensors == x.tp_param_tensors, (where, layer)
        for layer in ("block", "head"):
            assert getattr(b, layer).params == pytest.approx(getattr(a, layer).params, rel=1e-9), (where, layer)
        assert b.tied_copy_params == a.tied_copy_params and b.output_bytes == a.output_bytes, where
        assert b.logits_transient_bytes == pytest.approx(a.logits_transient_bytes, rel=1e-9), where
        # a block's time: the fused-bytes rule, the counted eager bytes and host ops (module doc)
        host = a.block.host_fwd_s + a.block.host_bwd_s
        traced = b.block.host_fwd_s + b.block.host_bwd_s
        if spec.dropout == 0 or stack.elementwise == "fused":
            for f in ("fwd_s", "bwd_s"):
                assert _rel(getattr(a.block, f), getattr(b.block, f)) < 0.10, (where, f, getattr(a.block, f),
                                                                               getattr(b.block, f))
        else:  # the mask ops: the profile counts them, the spec's tables do not
            assert b.block.fwd_s + b.block.bwd_s >= a.block.fwd_s + a.block.bwd_s, where
        if spec.dropout == 0:
            assert _rel(host, traced) < 0.05, (where, host, traced)
        else:
            assert traced >= host, (where, host, traced)
        # the head: the loss and projection from one builder, its own norm counted both ways
        for f in ("fwd_s", "bwd_s"):
            assert _rel(getattr(a.head, f), getattr(b.head, f)) < 0.15, (where, f)


@pytest.mark.parametrize("name", DENSE)
def test_a_step_costs_alike(profiles, name):
    """What a user reads: the step time and the peak memory of one layout, profile against spec, within
    10% and 12%. Time: the embedding's fused bytes are where the two sources differ most (one fused gather
    and add in the profile's region rule, a gather then an add in the spec's count; a layer of L), and a
    model with dropout costs the profile its mask ops on an eager stack (above). Memory: the profile keeps
    what PyTorch's kernels keep (norm statistics, RoPE's rotated q and k; tests/profiler/test_saved_bytes.py
    names each term), the spec Korthikanti's count."""
    spec, profile = load_model(name), profiles[name]
    for cluster_name in CLUSTERS:
        cluster = load_cluster(cluster_name)
        training = _training(cluster, spec)
        tp = 2 if spec.num_attention_heads % 2 == 0 else 1
        config = Config(tp=tp, pp=2, dp=1, sequence_parallel=tp > 1, zero_stage=0, offload_optimizer=False,
                        schedule="1f1b", virtual_stages=1, micro_batch_size=1, num_microbatches=8)
        half = spec.num_layers // 2
        layout = layout_of(config, (StageShape(half), StageShape(spec.num_layers - half)))
        cluster = dataclasses.replace(cluster, devices_per_node=max(cluster.devices_per_node, 4))
        ours, _, _ = estimate_layout(workload_fn(profile, cluster, training), cluster, training, layout)
        ref, _, _ = estimate_layout(workload_fn(spec, cluster, training), cluster, training, layout)
        where = (name, cluster_name)
        if spec.dropout == 0 or cluster.device.kind == "gpu":
            assert math.isclose(ours.step_time_s, ref.step_time_s, rel_tol=0.10), (where, ours.step_time_s,
                                                                                   ref.step_time_s)
        else:
            assert ours.step_time_s >= ref.step_time_s, where
        assert 0.98 * ref.peak_memory_gib <= ours.peak_memory_gib <= 1.12 * ref.peak_memory_gib, (where, ours.peak_memory_gib,
                                                                                            ref.peak_memory_gib)
