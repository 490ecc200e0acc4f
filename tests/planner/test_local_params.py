"""The exact per-rank parameter counts a plan carries (autoplan/cost/local_params.py; the runtime's
built modules are compared with them in tests/runtime/test_dry_run.py) against the count behind the
memory model's weights (cost/workload.py): the same under ZeRO 0-2, where no FSDP padding applies."""

from __future__ import annotations

import dataclasses

import pytest

from autoplan.cost.estimate import estimate_layout, with_local_params
from autoplan.cost.model_workload import workload_fn
from autoplan.schema import Layout, Stage, TrainingSetup, load_cluster, load_model

GIB = 2**30


def layout(tp: int, pp: int, dp: int, zero: int, layers: int) -> Layout:
    per = layers // pp
    stages = tuple(Stage(index=i, rank=i, layers=(i * per, (i + 1) * per)) for i in range(pp))
    return Layout(tp=tp, pp=pp, dp=dp, sequence_parallel=tp > 1, zero_stage=zero, offload_optimizer=False,
                  schedule="1f1b", virtual_stages=1, micro_batch_size=1, num_microbatches=max(pp, 2), stages=stages)


CASES = [
    pytest.param("llama-tiny", "cpu-local", 2, 2, 2, 1, id="llama-tiny-tp2-pp2-dp2-zero1"),
    pytest.param("llama3-70b", "dgx-h100-80gb", 8, 4, 32, 2, id="llama3-70b-tp8-pp4-dp32-zero2"),
    pytest.param("gpt-tiny", "cpu-local", 2, 2, 2, 0, id="gpt-tiny-tp2-pp2-dp2-zero0"),  # learned positions, tied
]


@pytest.mark.parametrize(("name", "cluster_name", "tp", "pp", "dp", "zero"), CASES)
def test_memory_model_counts_the_parameters_the_runtime_holds(name, cluster_name, tp, pp, dp, zero):
    model = load_model(name)
    cluster = dataclasses.replace(load_cluster(cluster_name), num_nodes=1, devices_per_node=tp * pp * dp)
    training = TrainingSetup(global_batch_size=max(pp, 2) * dp, seq_len=model.seq_len, precision="fp32")
    lay = layout(tp, pp, dp, zero, model.num_layers)

    predicted, _, _ = estimate_layout(workload_fn(model, cluster, training), cluster, training, lay)
    predicted = with_local_params(predicted, model, lay, training)
    peak = max(range(pp), key=lambda r: predicted.memory_gib_per_stage[r])
    weights = predicted.memory.weights_gib * GIB / 4  # fp32: 4 bytes per parameter
    assert weights == pytest.approx(predicted.local_params_per_rank[peak], rel=1e-12)
