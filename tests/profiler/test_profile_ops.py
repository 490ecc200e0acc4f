"""The profile -> Workload adapter agrees with the analytic workload where both describe the same model,
and the device check refuses mismatched profiles unless told to rescale."""

from __future__ import annotations

import dataclasses
import subprocess
import sys

import pytest

from autoplan.cost.model_workload import workload_fn
from autoplan.cost.profile_ops import allowed_tp_sizes, check_profile
from autoplan.cost.workload import LayerSplit
from autoplan.errors import SpecError
from autoplan.schema import TrainingSetup, load_cluster, load_model

TRAINING = TrainingSetup(global_batch_size=8, seq_len=64, precision="fp32")


def norm_stats_bytes(b: int, s: int) -> int:
    """LayerNorm's mean and rstd, fp32, two norms: what PyTorch keeps beyond the Korthikanti count."""
    return 2 * 2 * 4 * b * s


@pytest.mark.parametrize("tp,sp", [(1, False), (2, False), (4, False), (2, True)])
def test_gpt_workload_matches_analytic(gpt_profile, tp, sp):
    cluster = load_cluster("cpu-local")
    spec = load_model("gpt-tiny")
    for b in (1, 2, 3):  # 3 was not profiled: scaled linearly from 2
        ours = workload_fn(gpt_profile, cluster, TRAINING)(LayerSplit(b, tp, sp))
        ref = workload_fn(spec, cluster, TRAINING)(LayerSplit(b, tp, sp))
        assert ours.num_layers == ref.num_layers
        # a rank really holds the norms (4h) and the row linears' biases (2h) whole; analytic divides all by tp
        replicated = 6 * spec.hidden_size
        assert ours.block.params == (spec.layer_params() - replicated) / tp + replicated
        assert ours.block.fwd_flops == pytest.approx(ref.block.fwd_flops, rel=1e-9)
        extra = norm_stats_bytes(b, 64) / (tp if sp else 1)
        assert ours.block.saved_bytes == pytest.approx(ref.block.saved_bytes + extra, rel=1e-9)
        assert ours.output_bytes == ref.output_bytes
        assert ours.block.full_saved_bytes == ref.block.full_saved_bytes
        assert ours.block.tp_fwd_s == pytest.approx(ref.block.tp_fwd_s)
        assert ours.head.fwd_flops == pytest.approx(ref.head.fwd_flops)
        assert ours.logits_transient_bytes == pytest.approx(ref.logits_transient_bytes)
        assert ours.tied_copy_params == ref.tied_copy_params


def test_tp_size_not_profiled_is_interpolated(llama_profile):
    """Profiled at tp 2 and 4; tp 8 from the replicated + split/tp decomposition equals the analytic split."""
    cluster = load_cluster("cpu-local")
    spec = load_model("llama-tiny")
    profile = dataclasses.replace(llama_profile, layers=tuple(
        dataclasses.replace(layer, measurements=tuple(dataclasses.replace(
            m, tp_shards=tuple(s for s in m.tp_shards if s.tp != 4)) for m in layer.measurements))
        for layer in llama_profile.layers))
    w = workload_fn(profile, cluster, TRAINING)(LayerSplit(1, 4, False))
    assert w.block.params == (spec.layer_params() - 2 * spec.hidden_size) / 4 + 2 * spec.hidden_size
    assert w.block.fwd_flops == pytest.approx(workload_fn(spec, cluster, TRAINING)(LayerSplit(1, 4, False)).block.fwd_flops)


def test_device_check(gpt_profile):
    cpu_cluster = load_cluster("cpu-local")
    gpu_cluster = load_cluster("dgx-h100-80gb")
    measured = dataclasses.replace(gpt_profile, device="cpu", device_name="AMD EPYC")
    assert check_profile(gpt_profile, gpu_cluster, TRAINING) is False  # meta: never measured, never refused
    with pytest.raises(SpecError, match="--rescale-profile"):
        check_profile(measured, gpu_cluster, TRAINING)
    assert check_profile(measured, gpu_cluster, TRAINING, rescale=True) is False
    with pytest.raises(SpecError, match="--rescale-profile"):  # the shipped cpu profile is not this CPU
        check_profile(measured, cpu_cluster, TRAINING)
    mine = dataclasses.replace(cpu_cluster, device=dataclasses.replace(
        cpu_cluster.device, source="autoplan profile-hardware --nproc 4 on AMD EPYC (2 cores)"))
    assert check_profile(measured, mine, TRAINING) is True
    h100 = dataclasses.replace(gpt_profile, device="cuda", device_name="NVIDIA H100 80GB HBM3")
    assert check_profile(h100, gpu_cluster, TRAINING) is True
    # another precision plans from the same profile (bytes rescaled), but the fp32 times are not reused
    assert check_profile(measured, mine, dataclasses.replace(TRAINING, precision="bf16")) is False
    with pytest.raises(SpecError, match="--seq-len 128"):
        check_profile(gpt_profile, cpu_cluster, dataclasses.replace(TRAINING, seq_len=128))


def test_adapter_imports_without_torch():
    code = "import sys; sys.modules['torch'] = None\nimport autoplan.cost.profile_ops"
    subprocess.run([sys.executable, "-c", code], check=True)


def test_allowed_tp_sizes(llama_profile, mixer_profile):
    assert allowed_tp_sizes(llama_profile) == (1, 2, 4)  # 4 KV heads: profiled 1, 2, 4 and all shard
    assert allowed_tp_sizes(mixer_profile) == (1, 2)


def test_planner_search_accepts_a_profile(gpt_profile):
    """End to end through the planner's own search: a meta profile of gpt-tiny plans like the spec does."""
    from autoplan.search.planner import search
    from autoplan.search.space import Pins

    spec, cluster = load_model("gpt-tiny"), load_cluster("cpu-local")
    training = TrainingSetup(global_batch_size=8, seq_len=64, precision="fp32")
    # cp 1: a profile plans no context parallelism (it does not record the ring's K/V width)
    ours = search(spec, workload_fn(gpt_profile, cluster, training), cluster, training,
                  Pins(micro_batch_size=2, cp=1))
    ref = search(spec, workload_fn(spec, cluster, training), cluster, training, Pins(micro_batch_size=2, cp=1))
    assert ours.status == ref.status == "OPTIMAL"
    # times differ (traced bytes vs the analytic kernel model), the winning layout on this toy should not
    assert (ours.best.config.tp, ours.best.config.pp, ours.best.config.dp) == (ref.best.config.tp, ref.best.config.pp,
                                                                               ref.best.config.dp)
