"""FSDP2's host work on a CPU host (cost/cpu_host/terms.py ``fsdp_layer``): the hooks run every forward and
backward, the work of gathering and of reducing only where a unit gathers or reduce-scatters, so ZeRO-1/2
micro-batches that neither gather nor reduce pay the hooks alone; and the calibration fit that splits them.
"""

from __future__ import annotations

import dataclasses

import pytest

from autoplan.cost.comm import collective_time_s, group_link
from autoplan.cost.cpu_host.terms import fsdp_layer
from autoplan.profiler.hardware.calibration_fit import fit_fsdp
from autoplan.schema.io import load_cluster
from autoplan.schema.plan import ParallelConfig

PARAMS, WEIGHT_BYTES, SHARE = 50_000, 4, 2.0
UNIT_FWD, UNIT_BWD, HOOKS_FWD, HOOKS_BWD = 400.0, 1200.0, 70.0, 40.0  # microseconds


def _cluster():
    cluster = load_cluster("cpu-local-calibrated")
    device = dataclasses.replace(cluster.device, fsdp_unit_fwd_us=UNIT_FWD, fsdp_unit_bwd_us=UNIT_BWD,
                                 fsdp_hooks_fwd_us=HOOKS_FWD, fsdp_hooks_bwd_us=HOOKS_BWD)
    return dataclasses.replace(cluster, device=device)


def _config(zero_stage: int, pp: int = 1) -> ParallelConfig:
    return ParallelConfig(tp=1, pp=pp, dp=4 // pp, cp=1, sequence_parallel=False, zero_stage=zero_stage,
                          offload_optimizer=False, schedule="1f1b", virtual_stages=1, micro_batch_size=2,
                          num_microbatches=4)


def _collectives(cluster, config):
    link = group_link(cluster, config.dims.span("dp_cp"))
    d = cluster.device
    copy = 2 * PARAMS * WEIGHT_BYTES / (d.memory_bandwidth_gb_per_s * 1e9 * d.memory_efficiency) * SHARE
    return (collective_time_s("all_gather", PARAMS * WEIGHT_BYTES, link) + copy,
            collective_time_s("reduce_scatter", PARAMS * WEIGHT_BYTES, link) + copy)


def test_zero3_pays_the_whole_measured_unit_cost_every_micro_batch():
    """A ZeRO-3 unit gathers for its forward, regathers and reduces in its backward: exactly what the
    calibration's ZeRO-3 units did, so the whole measured host cost plus the collectives."""
    cluster, config = _cluster(), _config(3)
    gather, scatter = _collectives(cluster, config)
    unit = fsdp_layer(cluster, config, PARAMS, WEIGHT_BYTES, SHARE)
    assert unit.fwd_s == pytest.approx(UNIT_FWD * 1e-6 * SHARE + gather)
    assert unit.bwd_s == pytest.approx(UNIT_BWD * 1e-6 * SHARE + gather + scatter)
    assert unit.gather_step_s == unit.reduce_step_s == 0.0


def test_zero1_micro_batches_pay_the_hooks_and_the_step_pays_one_gather_and_one_reduction():
    cluster, config = _cluster(), _config(1)
    gather, scatter = _collectives(cluster, config)
    unit = fsdp_layer(cluster, config, PARAMS, WEIGHT_BYTES, SHARE)
    assert unit.fwd_s == pytest.approx(HOOKS_FWD * 1e-6 * SHARE)
    assert unit.bwd_s == pytest.approx(HOOKS_BWD * 1e-6 * SHARE)
    # one micro-batch of ZeRO-1 is ZeRO-3's work less ZeRO-3's second gather (the backward's regather)
    zero3 = fsdp_layer(cluster, _config(3), PARAMS, WEIGHT_BYTES, SHARE)
    regather = (UNIT_FWD - HOOKS_FWD) * 1e-6 * SHARE + gather
    assert unit.fwd_s + unit.bwd_s + unit.gather_step_s + unit.reduce_step_s == pytest.approx(
        zero3.fwd_s + zero3.bwd_s - regather)
    assert unit.reduce_step_s == pytest.approx(scatter + (UNIT_BWD - HOOKS_BWD - (UNIT_FWD - HOOKS_FWD)) * 1e-6 * SHARE)


def test_zero2_reduces_every_micro_batch_unless_pipelined():
    cluster = _cluster()
    flat = fsdp_layer(cluster, _config(2), PARAMS, WEIGHT_BYTES, SHARE)
    zero1 = fsdp_layer(cluster, _config(1), PARAMS, WEIGHT_BYTES, SHARE)
    assert flat.bwd_s == pytest.approx(zero1.bwd_s + zero1.reduce_step_s) and flat.reduce_step_s == 0.0
    assert flat.gather_step_s == pytest.approx(zero1.gather_step_s)
    piped = fsdp_layer(cluster, _config(2, pp=2), PARAMS, WEIGHT_BYTES, SHARE)
    assert piped.bwd_s == pytest.approx(HOOKS_BWD * 1e-6 * SHARE) and piped.reduce_step_s > 0


def test_the_fit_splits_hooks_from_the_unit_cost():
    """Raw points made from known per-unit costs (8 units, plain layers 0.1/0.2 ms) give those costs back."""
    units, gather_s, scatter_s = 8, 0.4e-3, 1.6e-3
    raw = {"units": units, "plain_fwd_s": 1e-4, "plain_bwd_s": 2e-4,
           "fsdp_fwd_s": 1e-4 + units * (UNIT_FWD * 1e-6 + gather_s),
           "fsdp_bwd_s": 2e-4 + units * (UNIT_BWD * 1e-6 + gather_s + scatter_s),
           "all_gather_s": gather_s, "reduce_scatter_s": scatter_s,
           "hooks_fwd_s": 1e-4 + units * HOOKS_FWD * 1e-6, "hooks_bwd_s": 2e-4 + units * HOOKS_BWD * 1e-6}
    fields = fit_fsdp(raw)
    assert fields == pytest.approx({"fsdp_unit_fwd_us": UNIT_FWD, "fsdp_unit_bwd_us": UNIT_BWD,
                                    "fsdp_hooks_fwd_us": HOOKS_FWD, "fsdp_hooks_bwd_us": HOOKS_BWD})
    old = {k: v for k, v in raw.items() if not k.startswith("hooks")}  # raw points from before the split
    assert set(fit_fsdp(old)) == {"fsdp_unit_fwd_us", "fsdp_unit_bwd_us"}
