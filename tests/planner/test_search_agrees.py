"""CP-SAT search (bounds, per-rank recomputation, CP-SAT choice) and plain brute force return the same
optimum on many small random problems, and the recomputation sub-problem solved by CP-SAT equals
exhaustive enumeration."""

import dataclasses
import random

from autoplan.cost.evaluate import evaluate
from autoplan.cost.stage_table import Config, build_table
from autoplan.cost.workload import analytic_workload
from autoplan.schema import Cluster, Link, ModelSpec, TrainingSetup, load_device
from autoplan.search.planner import search
from autoplan.search.recompute import cheapest_recompute
from autoplan.search.space import Pins

DEVICE = load_device("a100-sxm-80gb")


def random_problem(rng: random.Random):
    heads = rng.choice([2, 4])
    h = 64 * heads
    model = ModelSpec(name="random", architecture=rng.choice(["gpt", "llama"]), num_layers=rng.randint(2, 6),
                      hidden_size=h, ffn_hidden_size=4 * h, num_attention_heads=heads, num_kv_heads=heads,
                      vocab_size=1024, seq_len=256)
    per_node = rng.choice([1, 2, 4])
    cluster = Cluster(name="random", device=DEVICE, devices_per_node=per_node, num_nodes=rng.choice([1, 2]),
                      intra_node=Link(100.0, 5.0), inter_node=Link(10.0, 20.0))
    training = TrainingSetup(global_batch_size=rng.choice([2, 4, 8]), seq_len=256,
                             attention="flash" if rng.random() < 0.5 else "standard", overlap_grad_reduce=rng.random() < 0.5)
    # a device just big enough to make memory bind for some configurations
    memory = rng.choice([0.02, 0.05, 0.2, 80.0])
    cluster = dataclasses.replace(cluster, device=dataclasses.replace(DEVICE, memory_gib=memory))
    pins = Pins(recompute=rng.choice([None, None, "full", "none"]), schedule=rng.choice([None, None, "1f1b"]))
    return model, cluster, training, pins


def test_cpsat_and_bruteforce_agree_on_200_random_problems():
    rng = random.Random(2026)
    agreed = infeasible = 0
    for _ in range(200):  # about a minute on two cores
        model, cluster, training, pins = random_problem(rng)

        def workload(b, t, sp):
            return analytic_workload(model, cluster, training, b, t, sp)

        fast = search(model, workload, cluster, training, pins, solver="cpsat", top_k=1)
        slow = search(model, workload, cluster, training, pins, solver="bruteforce", top_k=1)
        assert (fast.best is None) == (slow.best is None)
        if fast.best is None:
            assert fast.status == "INFEASIBLE"
            infeasible += 1
            continue
        assert fast.status == "OPTIMAL"
        assert fast.best.step_ns == slow.best.step_ns, (model, cluster.num_devices, pins)
        agreed += 1
    assert agreed >= 150  # most problems have a plan, so the comparison is not vacuous
    assert infeasible >= 1  # and memory limits bite in some


def test_recompute_cpsat_equals_enumeration():
    """Several stages per rank (interleaved) under tight memory: both solvers find the same least cost."""
    rng = random.Random(7)
    model = ModelSpec(name="m", architecture="gpt", num_layers=12, hidden_size=256, ffn_hidden_size=1024,
                      num_attention_heads=4, num_kv_heads=4, vocab_size=1024, seq_len=512)
    training = TrainingSetup(global_batch_size=8, seq_len=512, attention="standard")
    checked = 0
    for _ in range(30):
        memory = rng.uniform(0.09, 0.19)  # between what full recomputation everywhere and none need
        device = dataclasses.replace(DEVICE, memory_gib=memory)
        cluster = Cluster(name="c", device=device, devices_per_node=2, num_nodes=1, intra_node=Link(100.0, 5.0),
                          inter_node=Link(10.0, 20.0))
        table = build_table(analytic_workload(model, cluster, training, 1, 1, False), cluster, training,
                            Config(1, 2, 1, False, 0, False, "interleaved", 3, 1, 8))
        split = (2, 2, 2, 2, 2, 2)
        a = cheapest_recompute(table, split, None, "enumerate")
        b = cheapest_recompute(table, split, None, "cpsat")
        assert (a is None) == (b is None)
        if a is not None:
            cost = lambda shapes: sum(s.selective * table.selective_extra_ns + s.full * table.full_extra_ns for s in shapes)
            assert cost(a) == cost(b)
            assert evaluate(table, b).fits
            checked += 1
    assert checked >= 10
