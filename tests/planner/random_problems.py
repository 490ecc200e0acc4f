"""Small random planning problems for the tests that compare the search with brute force."""

import dataclasses
import random

from autoplan.cost.model_workload import workload_fn
from autoplan.cost.stage_table import Config
from autoplan.schema import Cluster, Link, ModelSpec, TrainingSetup, load_device
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
    pins = Pins(recompute=rng.choice([None, None, "full", "none", "selective"]),
                schedule=rng.choice([None, None, "1f1b", "interleaved", "zb1p", "zbv", "dualpipev"]))
    return model, cluster, training, pins


def config(**changes) -> Config:
    """tp 1, pp 2, dp 1, no ZeRO, 8 micro-batches of 1, with ``changes``."""
    base = dict(tp=1, pp=2, dp=1, sequence_parallel=False, zero_stage=0, offload_optimizer=False, schedule="1f1b",
                virtual_stages=1, micro_batch_size=1, num_microbatches=8)
    return Config(**{**base, **changes})


def workload_of(model, cluster, training, stack=None):
    return workload_fn(model, cluster, training, stack)


def rank_choices_agree(terms, counts, method: str, reference: str) -> int:
    """For each rank of ``terms`` (a LayoutTerms), with the stage sizes ``counts()`` gives it: the per-rank
    recomputation ``method`` picks (search/recompute.py ``rank_choice``) fits exactly when ``reference``'s does
    and costs the same. Returns how many ranks recompute something under ``method``, so that a caller can
    assert the comparison was not vacuous."""
    from autoplan.search.recompute import choice_cost_ns, rank_choice

    recomputing = 0
    for rank in terms.ranks:
        n = counts()
        got, want = rank_choice(terms, rank, n, None, method), rank_choice(terms, rank, n, None, reference)
        assert (got is None) == (want is None)
        if got is not None:
            assert choice_cost_ns(terms, got) == choice_cost_ns(terms, want)
            recomputing += got != tuple((0, 0) for _ in n)
    return recomputing
