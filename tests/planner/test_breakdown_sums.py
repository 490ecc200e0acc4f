"""The breakdown ``estimate`` prints is the step the search priced, term by term.

The search prices a layout from the stage table (cost/stage_table.py); ``estimate`` explains it with a
breakdown (cost/estimate.py ``time_breakdown``) derived from the per-layer costs. If the two count a cost
differently they drift apart silently: full recomputation under context parallelism once reran the ring
exchange in the breakdown but not in the table (10-16% on llama3-8b at cp 4-16). So, for random layouts on
CPU and GPU clusters: the terms sum to the simulated step, and the critical rank's compute, recomputation
and TP/CP collectives fit inside the busy time the simulation gave that rank (the rest is ZeRO-3's
gathers, never negative), to the table's whole nanoseconds.
"""

import dataclasses
import random

import pytest

from autoplan.cost.estimate import estimate_layout, layout_of
from autoplan.cost.evaluate import StageShape
from autoplan.cost.model_workload import workload_fn
from autoplan.cost.stage_table import Config
from autoplan.schema import ModelSpec, TrainingSetup, load_cluster


def random_case(rng: random.Random):
    tp, cp, pp = rng.choice([1, 2]), rng.choice([1, 2, 4]), rng.choice([1, 2])
    schedule = "1f1b" if pp > 1 and rng.random() < 0.5 else ("interleaved" if pp > 1 else "1f1b")
    v = 2 if schedule == "interleaved" else 1
    per_stage = rng.choice([1, 2, 3])
    heads = rng.choice([4, 8])
    model = ModelSpec(name="random", architecture=rng.choice(["gpt", "llama"]), num_layers=per_stage * pp * v,
                      hidden_size=64 * heads, ffn_hidden_size=256 * heads, num_attention_heads=heads,
                      num_kv_heads=heads, vocab_size=1024, seq_len=512)
    cluster = load_cluster(rng.choice(["dgx-h100-80gb", "dgx-a100-80gb", "cpu-local"]))
    per_node = cluster.devices_per_node
    nodes = max(1, -(-tp * cp * pp // per_node))
    cluster = dataclasses.replace(cluster, num_nodes=nodes)
    dp = cluster.num_devices // (tp * cp * pp)
    m = rng.choice([pp, 2 * pp, 4])
    training = TrainingSetup(global_batch_size=dp * m, seq_len=512, memory_margin=0.0)
    config = Config(tp=tp, pp=pp, dp=dp, cp=cp, sequence_parallel=tp > 1 and rng.random() < 0.5,
                    zero_stage=rng.choice([0, 1, 2, 3]), offload_optimizer=False, schedule=schedule,
                    virtual_stages=v, micro_batch_size=1, num_microbatches=m)
    shapes = []
    for _ in range(pp * v):
        full = rng.randint(0, per_stage)
        shapes.append(StageShape(per_stage, rng.randint(0, per_stage - full), full))
    return model, cluster, training, layout_of(config, tuple(shapes))


@pytest.mark.parametrize("seed", range(40))
def test_breakdown_terms_sum_to_the_simulated_step(seed):
    model, cluster, training, layout = random_case(random.Random(seed))
    predicted, ev, table = estimate_layout(workload_fn(model, cluster, training), cluster, training, layout)
    t = predicted.time
    terms = [getattr(t, f.name) for f in dataclasses.fields(t)]
    rounding = 1e-9 * 3 * (model.num_layers + 2) * layout.num_microbatches  # the table's whole nanoseconds
    assert min(terms) >= 0.0
    assert sum(terms) == pytest.approx(predicted.step_time_s, abs=rounding)
    busy = ev.timeline.busy(ev.critical_rank) * 1e-9
    counted = t.compute_s + t.recompute_s + t.tp_comm_s + t.cp_comm_s
    assert counted <= busy + rounding, (layout.cp, counted, busy)
