"""Pipeline action lists on shared cores (cost/cpu_host/shared_cores.py) and the pipeline factor built on it.

The hand-worked case: GPipe, 4 stages, 4 micro-batches, forward 1 and backward 2, on 2 cores that
time-slice fairly (n busy ranks each run at min(1, 2 / n)). Forwards: F0 on stage 0 alone (t = 1); stages
0-1 (t = 2); three ranks at 2/3 speed for one forward each (t = 3.5); all four at 1/2 (t = 5.5); then three
(t = 7), two (t = 8), one (t = 9). Backwards mirror it with twice the work: 2 + 2 + 3 + 4 + 3 + 2 + 2 = 18.
Step 27 against 21 on four cores (7 slots of 3).
"""

from __future__ import annotations

import dataclasses
import random

import pytest

from autoplan.cost.cpu_host.shared_cores import shared_span
from autoplan.cost.cpu_host.terms import core_share
from autoplan.cost.simulate import simulate
from autoplan.schema.io import load_cluster
from autoplan.schema.plan import ParallelConfig
from autoplan.schema.schedule import build_schedule

SCHEDULES = [("gpipe", 4, 1, 4), ("1f1b", 4, 1, 6), ("interleaved", 2, 2, 4), ("interleaved", 4, 2, 8),
             ("1f1b", 2, 1, 2)]


def fair(cores: int):
    return lambda busy: max(1.0, busy / cores)


def test_gpipe_on_two_cores_matches_the_hand_worked_timeline():
    orders = build_schedule("gpipe", 4, 1, 4)
    assert shared_span(orders, [1.0] * 4, [2.0] * 4, [0.0] * 3, fair(2)) == pytest.approx(27.0)
    assert max(simulate(orders, [1.0] * 4, [2.0] * 4, [0.0] * 3).rank_end.values()) == pytest.approx(21.0)


@pytest.mark.parametrize("schedule,pp,v,m", SCHEDULES)
def test_without_sharing_it_is_the_plain_simulation(schedule, pp, v, m):
    """Enough cores (or ranks on nodes of their own): every action takes its own duration, transfers too."""
    rng = random.Random(pp * 100 + m)
    stages = pp * v
    fwd = [rng.uniform(0.5, 2.0) for _ in range(stages)]
    bwd = [rng.uniform(1.0, 4.0) for _ in range(stages)]
    p2p = [rng.uniform(0.0, 0.5) for _ in range(stages - 1)]
    orders = build_schedule(schedule, pp, v, m)
    plain = max(simulate(orders, fwd, bwd, p2p).rank_end.values())
    assert shared_span(orders, fwd, bwd, p2p, fair(pp)) == pytest.approx(plain)
    assert shared_span(orders, fwd, bwd, p2p, fair(1), node_of=list(range(pp))) == pytest.approx(plain)


@pytest.mark.parametrize("schedule,pp,v,m", SCHEDULES)
def test_one_core_runs_the_total_work(schedule, pp, v, m):
    """One core and no transfers: some rank can always compute, so the core never idles."""
    stages = pp * v
    fwd, bwd = [1.0 + 0.1 * s for s in range(stages)], [2.0 + 0.3 * s for s in range(stages)]
    orders = build_schedule(schedule, pp, v, m)
    assert shared_span(orders, fwd, bwd, [0.0] * (stages - 1), fair(1)) == pytest.approx(m * (sum(fwd) + sum(bwd)))


def test_replicas_share_the_node():
    """pp 2 with 2 replicas per pipeline rank on 2 cores: 1F1B's steady state has 4 processes computing."""
    orders = build_schedule("1f1b", 2, 1, 4)
    alone = shared_span(orders, [1.0] * 2, [2.0] * 2, [0.0], fair(2))
    paired = shared_span(orders, [1.0] * 2, [2.0] * 2, [0.0], fair(2), replicas=2)
    assert alone == pytest.approx(15.0)  # 2 ranks on 2 cores: the plain 1F1B step (m + pp - 1) x 3
    # worked by hand: one pipeline rank computes (2 processes, full speed) in [0, 1], [3, 5] and [21, 24]; in
    # between both do (4 processes, half speed): 6 units of time alone, 18 together
    assert paired == pytest.approx(24.0)


def test_pipeline_factor_on_a_cpu_host():
    cpu = dataclasses.replace(load_cluster("cpu-local"), cores_per_node=2, devices_per_node=4,
                              corun_kernel_slowdown=(), corun_host_slowdown=())
    config = ParallelConfig(tp=1, pp=4, dp=1, cp=1, sequence_parallel=False, zero_stage=0, offload_optimizer=False,
                            schedule="gpipe", virtual_stages=1, micro_batch_size=4, num_microbatches=4)
    share = core_share(cpu, config)
    assert share.pipeline == pytest.approx(27.0 / 21.0)
    assert share.host == pytest.approx(27.0 / 21.0)
    assert share.tail == pytest.approx(2.0)  # the optimizer: all 4 ranks at once on 2 cores
    flat = dataclasses.replace(config, pp=1, dp=4)
    assert core_share(cpu, flat).pipeline == pytest.approx(2.0)
    roomy = dataclasses.replace(cpu, cores_per_node=4)
    assert core_share(roomy, config).pipeline == pytest.approx(1.0)
