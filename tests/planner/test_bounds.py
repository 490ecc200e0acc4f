"""Every bound the search prunes with is at most the truth, and the search's integer fast path computes what
evaluate.py computes. Checked against every layout (split x recomputation per stage) of random small
problems, each evaluated by evaluate.py."""

import dataclasses
import itertools
import random

from autoplan.cost.evaluate import StageShape, evaluate
from autoplan.cost.layout_terms import LayoutTerms
from autoplan.cost.estimate import split_of
from autoplan.cost.tables import build_table, host_model
from autoplan.search.bounds import (
    config_lower_bound_ns, family_lower_bound_ns, family_range, group_can_fit, group_lower_bound_ns,
    layout_lower_bound_ns, simulated_lower_bound_ns, split_lower_bound_ns, states_fit,
)
from autoplan.search.recompute import cheapest_recompute, choice_cost_ns, lower_bound_ns, rank_choice, stage_choices
from autoplan.search.space import SearchLimits, configs, group_choices, group_configs, groups, stage_splits

from autoplan.schema.schedule import ZERO_BUBBLE

from .random_problems import random_problem, workload_of

INF = float("inf")


def check_problem(model, cluster, training, pins) -> int:
    """Asserts the bounds on one problem; returns how many fitting layouts were compared."""
    limits = SearchLimits()
    workload_fn = workload_of(model, cluster, training)
    compared = 0
    for group in groups(model, cluster, training, pins, limits):
        workload = workload_fn(group.split)
        states, schedules = group_choices(group, cluster, pins, model.num_layers, limits)
        if not states or not schedules:
            continue
        shapes = sorted({(v, min(min(s) for s in stage_splits(model.num_layers, group.pp * v, 2)), kind in ZERO_BUBBLE)
                         for kind, v in schedules})
        group_best = INF
        for config in group_configs(group, cluster, pins, model.num_layers, limits):
            table = build_table(workload, cluster, training, config)
            terms = LayoutTerms(table)
            splits = stage_splits(table.num_layers, table.num_stages, limits.max_edge_trim)
            config_best = INF
            for split in splits:
                split_best = INF
                per_stage = [[StageShape(n, a, b) for a, b in stage_choices(n, pins.recompute)] for n in split]
                for layout in itertools.product(*per_stage):
                    truth = evaluate(table, layout)
                    n, sel, full = ([getattr(s, f) for s in layout] for f in ("layers", "selective", "full"))
                    assert terms.step_ns(n, sel, full)[0] == truth.step_ns
                    assert all(terms.fits(rank, [n[s] for s in rank.stages], [sel[s] for s in rank.stages],
                                          [full[s] for s in rank.stages]) for rank in terms.ranks) == truth.fits
                    if truth.fits:
                        split_best = min(split_best, truth.step_ns)
                        compared += 1
                bound = split_lower_bound_ns(terms, split, pins.recompute)
                assert (bound is None) <= (split_best == INF)  # "nothing fits" only when nothing does
                if bound is not None:
                    assert bound <= split_best
                    assert simulated_lower_bound_ns(terms, split, split) <= split_best
                chosen = cheapest_recompute(table, split, pins.recompute, "auto", terms)
                assert (chosen is None) == (split_best == INF)
                if chosen is not None:
                    exact = terms.step_ns(*([getattr(s, f) for s in chosen] for f in ("layers", "selective", "full")))
                    assert layout_lower_bound_ns(terms, chosen) <= exact[0]
                for rank in terms.ranks:
                    counts = tuple(split[s] for s in rank.stages)
                    relaxed, choice = lower_bound_ns(terms, rank, counts, pins.recompute), rank_choice(
                        terms, rank, counts, pins.recompute)
                    assert (relaxed is None) <= (choice is None)
                    if choice is not None:
                        assert relaxed <= choice_cost_ns(terms, choice)
                config_best = min(config_best, split_best)
            assert states_fit(table) or config_best == INF
            if config_best < INF:
                assert config_lower_bound_ns(table, min(min(s) for s in splits)) <= config_best
                assert family_lower_bound_ns(terms, splits, pins.recompute) <= config_best
                assert simulated_lower_bound_ns(terms, *family_range(splits)) <= config_best
            group_best = min(group_best, config_best)
        assert group_can_fit(workload, cluster, training, group.pp, group.dp, states,
                             min(least for _, least, _ in shapes)) or group_best == INF
        if group_best < INF:
            assert group_lower_bound_ns(workload, host_model(cluster), group.pp, group.num_microbatches,
                                        shapes) <= group_best
    return compared


def test_bounds_never_exceed_the_simulated_truth():
    rng = random.Random(11)
    compared = 0
    for _ in range(12):
        compared += check_problem(*random_problem(rng))
    assert compared >= 1000


def test_recompute_bound_is_below_the_exact_choice_and_often_tight():
    """The linear-programming bound on each rank's recomputation against the exact integer optimum, on
    every rank of every split of 150 random problems with recomputation unpinned, where a rank must recompute."""
    rng = random.Random(5)
    tight = checked = 0
    for _ in range(150):
        model, cluster, training, pins = random_problem(rng)
        pins = dataclasses.replace(pins, recompute=None)
        workload_fn = workload_of(model, cluster, training)
        for config in configs(model, cluster, training, pins):
            table = build_table(workload_fn(split_of(config)), cluster, training, config)
            terms = LayoutTerms(table)
            for split in stage_splits(table.num_layers, table.num_stages, 2):
                for rank in terms.ranks:
                    counts = tuple(split[s] for s in rank.stages)
                    relaxed, choice = lower_bound_ns(terms, rank, counts, None), rank_choice(terms, rank, counts, None)
                    assert (relaxed is None) <= (choice is None)
                    if choice is None or choice_cost_ns(terms, choice) == 0:
                        continue
                    exact = choice_cost_ns(terms, choice)
                    assert relaxed <= exact
                    checked += 1
                    tight += relaxed >= 0.95 * exact
    assert checked >= 100 and tight >= 10


def test_bounds_hold_where_ranks_share_cores_and_late_receives_wait():
    """The same checks on CPU hosts: the ranks share 2 cores and a pipeline receive posted after its send
    waits 0.3-0.9 ms (simulate.py), a floor the fast path and the simulated bounds must carry too."""
    rng = random.Random(11)
    compared = 0
    for _ in range(12):
        model, cluster, training, pins = random_problem(rng)
        host = dataclasses.replace(cluster, cores_per_node=2, late_receive_us=(0.0, 300.0, 600.0, 900.0))
        compared += check_problem(model, host, training, pins)
    assert compared >= 1000
