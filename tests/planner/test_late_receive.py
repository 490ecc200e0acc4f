"""A pipeline receive posted after its send completes no sooner than the cluster's late-receive wait after
it is posted (cost/simulate.py; measured by profiler/hardware/distributed_overhead.py on a CPU host, 0 on
GPUs). Worked by hand on GPipe over 2 stages and 2 micro-batches."""

from __future__ import annotations

import dataclasses

import pytest

from autoplan.cost.simulate import compiled, rank_ends, simulate
from autoplan.cost.estimate import split_of
from autoplan.cost.model_workload import workload_fn
from autoplan.cost.tables import build_table
from autoplan.schema import TrainingSetup
from autoplan.schema.io import load_cluster, load_model
from autoplan.schema.plan import ParallelConfig
from autoplan.schema.schedule import build_schedule


def test_a_late_receive_waits_and_a_waiting_one_does_not():
    """F = 1, B = 2, transfer 0.1, late wait 0.5. Rank 1's first forward waits for its input (posted at 0,
    arrives at 1.1: no extra wait); its second is asked for at 2.1, after the input was sent at 2.0, so it
    starts at 2.6. Its backwards need nothing from rank 0: 3.6-5.6, 5.6-7.6. Rank 0's first backward was
    posted at 2.0, long before its input arrived at 5.7; its second is asked for at 7.7 and its input
    arrives at 7.7, so it waits the 0.5: 8.2-10.2. Without the wait the step is 9.2."""
    orders = build_schedule("gpipe", 2, 1, 2)
    plain = simulate(orders, [1.0, 1.0], [2.0, 2.0], [0.1])
    late = simulate(orders, [1.0, 1.0], [2.0, 2.0], [0.1], late_receive_s=0.5)
    assert max(plain.rank_end.values()) == pytest.approx(9.2)
    assert late.rank_end[1] == pytest.approx(7.6) and late.rank_end[0] == pytest.approx(10.2)
    starts = {(a.stage, a.kind, a.microbatch): s for a, s in zip(late.actions, late.start)}
    assert starts[(1, "F", 0)] == pytest.approx(1.1) and starts[(1, "F", 1)] == pytest.approx(2.6)
    assert starts[(0, "B", 0)] == pytest.approx(5.7) and starts[(0, "B", 1)] == pytest.approx(8.2)
    # the search's integer recurrence is the same one
    ints = rank_ends(compiled(orders, 2), [1000, 1000], [2000, 2000], [100], late_receive=500)
    assert ints == {0: 10200, 1: 7600}


def _table(cluster, pp: int):
    model = load_model("gpt-tiny")
    training = TrainingSetup(global_batch_size=16, seq_len=model.seq_len)
    config = ParallelConfig(tp=1, pp=pp, dp=4 // pp, cp=1, sequence_parallel=False, zero_stage=0,
                            offload_optimizer=False, schedule="gpipe", virtual_stages=1, micro_batch_size=2,
                            num_microbatches=16 // (2 * (4 // pp)))
    workload = workload_fn(model, cluster, training)(split_of(config))
    return build_table(workload, cluster, training, config)


def test_the_table_carries_the_measured_wait_on_a_cpu_host_pipeline_only():
    """The 4-rank entry, plus the message's bytes, on the calibrated CPU host's pp4 plan; nothing without
    a pipeline; nothing on GPUs, whose ranks do not share cores, whatever the field says."""
    cpu = load_cluster("cpu-local-calibrated")
    assert len(cpu.late_receive_us) == 4 and cpu.late_receive_us[3] > 0
    assert _table(cpu, 4).late_receive_ns >= round(cpu.late_receive_us[3] * 1e3)
    assert _table(cpu, 1).late_receive_ns == 0
    gpu = dataclasses.replace(load_cluster("dgx-h100-80gb"), late_receive_us=(0.0, 500.0, 500.0, 500.0))
    assert _table(gpu, 4).late_receive_ns == 0
