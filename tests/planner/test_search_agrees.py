"""The branch-and-bound search and plain brute force return the same optima on random small problems,
and the recomputation sub-problem's three solvers (closed form, enumeration, CP-SAT) agree."""

import dataclasses
import itertools
import random

import pytest

from autoplan.cost.evaluate import evaluate
from autoplan.cost.layout_terms import LayoutTerms
from autoplan.cost.model_workload import workload_fn
from autoplan.cost.tables import build_table
from autoplan.cost.workload import LayerSplit
from autoplan.schema import Cluster, Link, ModelSpec, TrainingSetup
from autoplan.search import planner
from autoplan.search.planner import search
from autoplan.search.recompute import cheapest_recompute, choice_cost_ns
from autoplan.search.space import Pins

from .random_problems import DEVICE, config, random_problem, rank_choices_agree, workload_of

SEED = 2026


def agree_on(problems: int) -> tuple[int, int]:
    """(problems with a plan, problems where nothing fits); asserts the K best step times are equal."""
    rng = random.Random(SEED)
    agreed = infeasible = 0
    for i in range(problems):
        model, cluster, training, pins = random_problem(rng)
        workload = workload_of(model, cluster, training)
        fast = search(model, workload, cluster, training, pins, solver="bnb", top_k=3)
        slow = search(model, workload, cluster, training, pins, solver="bruteforce", top_k=3)
        assert (fast.best is None) == (slow.best is None), i
        if fast.best is None:
            assert fast.status == slow.status == "INFEASIBLE"
            infeasible += 1
            continue
        assert fast.status == "OPTIMAL" and fast.bound_ns == fast.best.step_ns
        assert [c.step_ns for c in fast.ranked] == [c.step_ns for c in slow.ranked], (i, model, cluster, pins)
        agreed += 1
    return agreed, infeasible


def test_bnb_and_bruteforce_agree_on_20_random_problems():
    """The fast lane's share: the first 20 problems of the 200 below (a few seconds)."""
    agreed, infeasible = agree_on(20)
    assert agreed >= 10 and infeasible >= 1  # a pinned zero-bubble schedule needs pp >= 2: some have no plan


def test_bnb_and_bruteforce_agree_with_context_parallelism():
    """cp in the space: flash-attention problems on even device counts, cp pinned to 2 (the random sizes are
    too small for the ring to win unpinned) and left free; both solvers return the same K best."""
    rng = random.Random(SEED + 1)
    pinned = 0
    for i in range(8):
        model, cluster, training, pins = random_problem(rng)
        training = dataclasses.replace(training, attention="flash")
        if cluster.num_devices % 2:
            continue
        for cp in (2, None):
            p = dataclasses.replace(pins, cp=cp)
            workload = workload_of(model, cluster, training)
            fast = search(model, workload, cluster, training, p, solver="bnb", top_k=3)
            slow = search(model, workload, cluster, training, p, solver="bruteforce", top_k=3)
            assert [c.step_ns for c in fast.ranked] == [c.step_ns for c in slow.ranked], (i, cp)
            if cp == 2 and fast.best is not None:
                assert {c.config.cp for c in fast.ranked} == {2}
                pinned += 1
    assert pinned >= 3


@pytest.mark.slow
def test_bnb_and_bruteforce_agree_on_200_random_problems():
    agreed, infeasible = agree_on(200)
    assert agreed >= 120  # most problems have a plan, so the comparison is not vacuous
    assert infeasible >= 5  # and memory limits bite in some


def test_a_time_limit_returns_a_feasible_plan_and_a_true_bound(monkeypatch):
    """With the clock advancing 1 ms per look, a 0.5 s limit stops the search part way: the plans it returns
    are no better than the optimum and its bound is no higher."""
    model = ModelSpec(name="m", architecture="llama", num_layers=16, hidden_size=256, ffn_hidden_size=1024,
                      num_attention_heads=4, num_kv_heads=4, vocab_size=1024, seq_len=256)
    cluster = Cluster(name="c", device=dataclasses.replace(DEVICE, memory_gib=0.1), devices_per_node=4,
                      num_nodes=4, intra_node=Link(100.0, 5.0), inter_node=Link(10.0, 20.0))
    training = TrainingSetup(global_batch_size=64, seq_len=256)
    workload = workload_of(model, cluster, training)
    optimum = search(model, workload, cluster, training, Pins(), top_k=5)
    clock = itertools.count()
    monkeypatch.setattr(planner.time, "perf_counter", lambda: next(clock) * 1e-3)
    limited = search(model, workload, cluster, training, Pins(), top_k=5, time_limit_s=0.5)
    assert optimum.status == "OPTIMAL" and limited.status == "FEASIBLE"
    assert limited.bound_ns <= optimum.best.step_ns <= limited.best.step_ns
    assert limited.simulated < optimum.simulated


def test_bruteforce_honours_the_time_limit_and_reports_progress(monkeypatch):
    """Brute force checks the clock after every layout, not after every configuration: one configuration
    of a 70B model on 512 GPUs has more layouts than any limit allows (issue 33: --time-limit 5 ran past
    60 s, silent). With the clock advancing 1 ms per look, a 0.5 s limit stops it within a few hundred
    layouts, FEASIBLE, and no better than the optimum; progress lines came before the final one."""
    model = ModelSpec(name="m", architecture="llama", num_layers=16, hidden_size=256, ffn_hidden_size=1024,
                      num_attention_heads=4, num_kv_heads=4, vocab_size=1024, seq_len=256)
    cluster = Cluster(name="c", device=DEVICE, devices_per_node=4, num_nodes=2, intra_node=Link(100.0, 5.0),
                      inter_node=Link(10.0, 20.0))
    training = TrainingSetup(global_batch_size=16, seq_len=256)
    workload = workload_of(model, cluster, training)
    optimum = search(model, workload, cluster, training, Pins(), solver="bnb", top_k=1)
    clock = itertools.count()
    monkeypatch.setattr(planner.time, "perf_counter", lambda: next(clock) * 1e-3)
    monkeypatch.setattr(planner, "PROGRESS_INTERVAL_S", 0.05)
    lines: list[tuple[str, bool]] = []
    limited = search(model, workload, cluster, training, Pins(), solver="bruteforce", top_k=1, time_limit_s=0.5,
                     progress=lambda message, final: lines.append((message, final)))
    assert limited.status == "FEASIBLE" and limited.simulated <= 500
    assert limited.best.step_ns >= optimum.best.step_ns
    assert [final for _, final in lines][-1] is True and not any(final for _, final in lines[:-1])
    assert any(message.startswith("brute force:") for message, _ in lines[:-1])


def test_recompute_solvers_agree():
    """Several stages per rank (interleaved) under tight memory: CP-SAT and enumeration find the same least
    cost, and the layout they give fits; one stage per rank: the closed form equals enumeration."""
    rng = random.Random(7)
    model = ModelSpec(name="m", architecture="gpt", num_layers=12, hidden_size=256, ffn_hidden_size=1024,
                      num_attention_heads=4, num_kv_heads=4, vocab_size=1024, seq_len=512)
    training = TrainingSetup(global_batch_size=8, seq_len=512, attention="standard")
    checked = closed = 0
    for _ in range(30):
        memory = rng.uniform(0.09, 0.19)  # between what full recomputation everywhere and none need
        device = dataclasses.replace(DEVICE, memory_gib=memory)
        cluster = Cluster(name="c", device=device, devices_per_node=2, num_nodes=1, intra_node=Link(100.0, 5.0),
                          inter_node=Link(10.0, 20.0))
        workload = workload_fn(model, cluster, training)(LayerSplit(micro_batch_size=1))
        table = build_table(workload, cluster, training, config(schedule="interleaved", virtual_stages=3))
        split = (2, 2, 2, 2, 2, 2)
        a = cheapest_recompute(table, split, None, "enumerate")
        b = cheapest_recompute(table, split, None, "cpsat")
        assert (a is None) == (b is None)
        if a is not None:
            assert choice_cost_ns(LayoutTerms(table), [(s.selective, s.full) for s in a]) == choice_cost_ns(
                LayoutTerms(table), [(s.selective, s.full) for s in b])
            assert evaluate(table, b).fits
            checked += 1
        one = build_table(workload, cluster, training, config(schedule="1f1b", virtual_stages=1))
        closed += rank_choices_agree(LayoutTerms(one), lambda: (rng.randint(3, 9),), "auto", "enumerate")
    assert checked >= 10 and closed >= 5
