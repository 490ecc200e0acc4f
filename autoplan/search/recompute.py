"""Where to recompute: for a fixed stage split, the cheapest per-stage recomputation that fits each rank.

Memory is per rank: rank r's peak depends only on its own stages' layers and recomputation. Time grows
with every recomputed layer (it lengthens that stage's backward, and a longest path can only grow when a
duration grows). So for one stage per rank (gpipe, 1f1b) the rank-by-rank cheapest fitting choice is
the optimum of the whole step; for interleaved ranks, each with several stages, it minimises the rank's
own added backward time, which is the search space's rule (search/space.py).

Two interchangeable solvers of that small integer program: ``enumerate`` tries every choice, CP-SAT
(``cpsat``) handles the combinatorial case of several stages per rank with many layers each. Both return
the same optimum (tests/test_search_agrees.py).
"""

from __future__ import annotations

import itertools
from typing import Literal

from ortools.sat.python import cp_model

from autoplan.cost.evaluate import StageShape, fits_in, rank_memory
from autoplan.cost.simulate import inflight_peaks
from autoplan.cost.stage_table import PERMILLE, RESERVE_PERMILLE, StageTable
from autoplan.cost.stage_terms import rank_fixed_dynamic, rank_states, stage_activations

Pin = Literal["none", "selective", "full"] | None
Method = Literal["enumerate", "cpsat", "auto"]
# Up to this many combinations per rank, trying them all is faster than building a CP-SAT model.
ENUMERATION_LIMIT = 64


def stage_choices(layers: int, pin: Pin) -> list[tuple[int, int]]:
    """(selective, full) counts allowed on a stage of ``layers`` layers."""
    if pin == "none":
        return [(0, 0)]
    if pin == "selective":
        return [(layers, 0)]
    if pin == "full":
        return [(0, layers)]
    return [(sel, full) for full in range(layers + 1) for sel in range(layers + 1 - full)]


def cheapest_recompute(table: StageTable, layers: tuple[int, ...], pin: Pin, method: Method = "auto",
                       peaks: dict | None = None, memo: dict | None = None) -> tuple[StageShape, ...] | None:
    """Per stage (layers, selective, full) with the least added recompute time that fits; None if none fits.

    ``memo`` (one dict per table) keeps each rank's answer: stage splits of one configuration share most of
    their per-rank sub-problems.
    """
    peaks = peaks if peaks is not None else inflight_peaks(table.orders)
    memo = memo if memo is not None else {}
    shapes: list[StageShape | None] = [None] * table.num_stages
    for rank in table.orders:
        stages = table.stages_of(rank)
        key = (rank, pin, method, tuple(layers[s] for s in stages))
        if key not in memo:
            memo[key] = _rank_choice(table, layers, stages, pin, method, peaks, rank)
        chosen = memo[key]
        if chosen is None:
            return None
        for s, (sel, full) in zip(stages, chosen):
            shapes[s] = StageShape(layers[s], sel, full)
    return tuple(shapes)  # type: ignore[arg-type]


def _rank_choice(table: StageTable, layers: tuple[int, ...], stages: list[int], pin: Pin, method: Method,
                 peaks: dict, rank: int) -> tuple[tuple[int, int], ...] | None:
    combos = 1
    for s in stages:
        combos *= len(stage_choices(layers[s], pin))
    use_cpsat = method == "cpsat" or (method == "auto" and combos > ENUMERATION_LIMIT)
    zero = tuple((0, 0) for _ in stages)
    every = tuple((0, layers[s]) for s in stages)
    if method == "auto" and pin in (None, "none") and _fits_with(table, layers, stages, zero, rank, peaks[rank]):
        return zero  # nothing recomputed costs nothing: the cheapest choice when it fits
    if method == "auto" and pin is None and not _fits_with(table, layers, stages, every, rank, peaks[rank]):
        # full recomputation of every layer needs the least memory of all choices (each fully
        # recomputed layer keeps only its input; the rebuilt block is counted once): nothing fits
        return None
    if method == "auto" and len(stages) == 1:
        return _single_stage(table, layers, stages, pin, peaks[rank], rank)
    return (_cpsat if use_cpsat else _enumerate)(table, layers, stages, pin, peaks[rank], rank)


def _fits_with(table: StageTable, layers: tuple[int, ...], stages: list[int], choice, rank: int, peaks) -> bool:
    trial = [StageShape(layers[k]) for k in range(table.num_stages)]
    for s, (sel, full) in zip(stages, choice):
        trial[s] = StageShape(layers[s], sel, full)
    return fits_in(table, rank_memory(table, tuple(trial), rank, peaks))


def _cost(table: StageTable, choice: tuple[tuple[int, int], ...]) -> int:
    return sum(sel * table.selective_extra_ns + full * table.full_extra_ns for sel, full in choice)


def _enumerate(table: StageTable, layers: tuple[int, ...], stages: list[int], pin: Pin, peaks: list,
               rank: int) -> tuple[tuple[int, int], ...] | None:
    """Try the choices from cheapest to dearest; the first that fits wins (ties: the order below)."""
    options = [stage_choices(layers[s], pin) for s in stages]
    for choice in sorted(itertools.product(*options), key=lambda c: (_cost(table, c), c)):
        trial = [StageShape(layers[s], 0, 0) for s in range(table.num_stages)]
        for s, (sel, full) in zip(stages, choice):
            trial[s] = StageShape(layers[s], sel, full)
        if fits_in(table, rank_memory(table, tuple(trial), rank, peaks)):
            return choice
    return None


def _single_stage(table: StageTable, layers: tuple[int, ...], stages: list[int], pin: Pin, peaks: list,
                  rank: int) -> tuple[tuple[int, int], ...] | None:
    """One stage per rank: for each count of fully recomputed layers, the fewest selective ones that fit,
    found by bisection (memory falls as more layers recompute). The cheapest of those is the optimum."""
    (s,) = stages
    n = layers[s]

    def fits(sel: int, full: int) -> bool:
        trial = [StageShape(layers[k]) for k in range(table.num_stages)]
        trial[s] = StageShape(n, sel, full)
        return fits_in(table, rank_memory(table, tuple(trial), rank, peaks))

    allowed = set(stage_choices(n, pin))
    best: tuple[int, tuple[int, int]] | None = None
    for full in sorted({f for _, f in allowed}):
        sels = sorted(sel for sel, f in allowed if f == full)
        if fits(sels[0], full):
            found = sels[0]
        elif len(sels) > 1 and fits(sels[-1], full):
            lo, hi = 1, len(sels) - 1  # sels[hi] fits, sels[lo - 1] does not
            while lo < hi:
                mid = (lo + hi) // 2
                lo, hi = (lo, mid) if fits(sels[mid], full) else (mid + 1, hi)
            found = sels[hi]
        else:
            continue
        cost = _cost(table, ((found, full),))
        if best is None or (cost, (found, full)) < (best[0], best[1]):
            best = (cost, (found, full))
    return (best[1],) if best is not None else None


def _cpsat(table: StageTable, layers: tuple[int, ...], stages: list[int], pin: Pin, peaks: list,
           rank: int) -> tuple[tuple[int, int], ...] | None:
    """The same program as ``_enumerate``: least added time such that every memory peak of the rank fits."""
    m = cp_model.CpModel()
    values: dict = {}
    has_full, has_sel = m.NewBoolVar("has_full"), m.NewBoolVar("has_sel")
    for s in range(table.num_stages):
        values[("n", s)] = layers[s]
        values[("sel", s)] = values[("full", s)] = 0
    sel_vars, full_vars = {}, {}
    for s in stages:
        allowed = stage_choices(layers[s], pin)
        sel_vars[s] = m.NewIntVar(min(a for a, _ in allowed), max(a for a, _ in allowed), f"sel{s}")
        full_vars[s] = m.NewIntVar(min(b for _, b in allowed), max(b for _, b in allowed), f"full{s}")
        m.Add(sel_vars[s] + full_vars[s] <= layers[s])
        m.Add(full_vars[s] <= layers[s] * has_full)
        m.Add(sel_vars[s] <= layers[s] * has_sel)
        values[("sel", s)], values[("full", s)] = sel_vars[s], full_vars[s]
    states = rank_states(table, rank).value({k: v for k, v in values.items() if k[0] == "n"})
    transient = ((table.block_act_bytes - table.block_act_full_bytes) * has_full
                 + (table.block_act_bytes - table.block_act_selective_bytes) * has_sel)
    fixed = rank_fixed_dynamic(table, rank)
    for vector in peaks:
        acts = 0
        for s, count in vector.items():
            linear = stage_activations(table, s)
            acts += count * (linear.const + sum(c * values[v] for v, c in linear.coefs.items()))
        m.Add(PERMILLE * (states + table.baseline_bytes) + (PERMILLE + RESERVE_PERMILLE) * (acts + transient + fixed)
              <= PERMILLE * table.capacity_bytes)
    m.Minimize(sum(sel_vars[s] * table.selective_extra_ns + full_vars[s] * table.full_extra_ns for s in stages))
    solver = cp_model.CpSolver()
    solver.parameters.num_workers = 1
    solver.parameters.max_time_in_seconds = 30.0
    status = solver.Solve(m)
    if status == cp_model.INFEASIBLE:
        return None
    if status != cp_model.OPTIMAL:
        raise RuntimeError("recomputation subproblem not solved to optimality within 30 s")
    return tuple((solver.Value(sel_vars[s]), solver.Value(full_vars[s])) for s in stages)
