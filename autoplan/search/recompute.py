"""Where to recompute: for a fixed stage split, the cheapest per-stage recomputation that fits each rank.

Memory is per rank: rank r's peak depends only on its own stages' layers and recomputation. Time grows
with every recomputed layer (it lengthens that stage's backward, and a longest path can only grow when a
duration grows). So for one stage per rank (gpipe, 1f1b) the rank-by-rank cheapest fitting choice is
the optimum of the whole step; for interleaved ranks, each with several stages, it minimises the rank's
own added backward time, which is the search space's rule (search/space.py).

Per rank this is a small integer program: choose (selective, full) counts per stage, minimise
sum(selective) x selective_extra + sum(full) x full_extra, subject to one linear memory constraint per
peak of the rank (simulate.memory_peaks: its activations, and the whole gradients and kept last-stage
outputs live there, which recomputation does not change). Solved exactly by

* a closed form for one stage per rank: for each count of fully recomputed layers, the fewest selective
  ones that fit follow from the (integer) constraint by one ceiling division;
* trying every choice when there are at most ``ENUMERATION_LIMIT`` of them;
* CP-SAT otherwise (several stages per rank with many layers each).

The three agree with exhaustive enumeration (tests/planner/test_search_agrees.py). ``lower_bound_ns`` is
the linear-programming relaxation of the same program, which the search's bounds use without solving it.
"""

from __future__ import annotations

import itertools
import math
from typing import Literal

from autoplan.cost.evaluate import StageShape
from autoplan.cost.layout_terms import LayoutTerms, RankTerms
from autoplan.cost.stage_table import PERMILLE, StageTable

Pin = Literal["none", "selective", "full"] | None
Method = Literal["enumerate", "cpsat", "auto"]
Choice = tuple[tuple[int, int], ...]
"""(selective, full) per stage of one rank, in the order of ``RankTerms.stages``."""
# Up to this many combinations per rank, trying them all is faster than building a CP-SAT model.
ENUMERATION_LIMIT = 64
CPSAT_TIME_LIMIT_S = 30.0


def stage_choices(layers: int, pin: Pin) -> list[tuple[int, int]]:
    """(selective, full) counts allowed on a stage of ``layers`` layers (for the brute-force search)."""
    if pin == "none":
        return [(0, 0)]
    if pin == "selective":
        return [(layers, 0)]
    if pin == "full":
        return [(0, layers)]
    return [(sel, full) for full in range(layers + 1) for sel in range(layers + 1 - full)]


def cheapest_recompute(table: StageTable, layers: tuple[int, ...], pin: Pin, method: Method = "auto",
                       terms: LayoutTerms | None = None, memo: dict | None = None) -> tuple[StageShape, ...] | None:
    """Per stage (layers, selective, full) with the least added recompute time that fits; None if none fits.

    ``memo`` (one dict per table) keeps each rank's answer: stage splits of one configuration share most of
    their per-rank sub-problems.
    """
    terms = terms if terms is not None else LayoutTerms(table)
    memo = memo if memo is not None else {}
    shapes: list[StageShape | None] = [None] * table.num_stages
    for rank in terms.ranks:
        n = tuple(layers[s] for s in rank.stages)
        key = (rank.rank, pin, method, n)
        if key not in memo:
            memo[key] = rank_choice(terms, rank, n, pin, method)
        chosen = memo[key]
        if chosen is None:
            return None
        for s, (sel, full) in zip(rank.stages, chosen):
            shapes[s] = StageShape(layers[s], sel, full)
    return tuple(shapes)  # type: ignore[arg-type]


def forced_recompute(terms: LayoutTerms, layers: tuple[int, ...], pin: Pin) -> tuple[StageShape, ...] | None:
    """The split's recomputation when it needs no solving: the pinned mode, or nothing recomputed when that
    fits every rank (the cheapest choice then). None otherwise. The caller knows the split can fit."""
    if pin is None:
        if not all(terms.fits(rank, [layers[s] for s in rank.stages], [0] * len(rank.stages), [0] * len(rank.stages))
                   for rank in terms.ranks):
            return None
        pin = "none"
    return tuple(StageShape(n, n if pin == "selective" else 0, n if pin == "full" else 0) for n in layers)


def choice_cost_ns(terms: LayoutTerms, choice: Choice) -> int:
    return sum(sel * terms.sel_ns + full * terms.full_ns for sel, full in choice)


def rank_choice(terms: LayoutTerms, rank: RankTerms, n: tuple[int, ...], pin: Pin,
                method: Method = "auto") -> Choice | None:
    """The cheapest fitting (selective, full) per stage of ``rank``; ties: the smallest choice tuple."""
    zero = tuple((0, 0) for _ in n)
    if pin in ("none", "selective", "full"):
        choice = {"none": zero, "selective": tuple((k, 0) for k in n), "full": tuple((0, k) for k in n)}[pin]
        return choice if _fits(terms, rank, n, choice) else None
    if method == "auto":
        if _fits(terms, rank, n, zero):
            return zero  # nothing recomputed costs nothing: the cheapest choice when it fits
        if 0 <= terms.d_sel <= terms.d_full and not _fits(terms, rank, n, tuple((0, k) for k in n)):
            # with full recomputation saving at least what selective saves, recomputing every layer fully
            # needs the least memory of all choices (the rebuilt block is counted once): nothing fits
            return None
        if len(n) == 1:
            return _single_stage(terms, rank, n[0])
    combos = math.prod((k + 1) * (k + 2) // 2 for k in n)
    if method == "enumerate" or (method == "auto" and combos <= ENUMERATION_LIMIT):
        return _enumerate(terms, rank, n)
    return _cpsat(terms, rank, n)


def _fits(terms: LayoutTerms, rank: RankTerms, n: tuple[int, ...], choice: Choice) -> bool:
    return terms.fits(rank, n, [c[0] for c in choice], [c[1] for c in choice])


def _enumerate(terms: LayoutTerms, rank: RankTerms, n: tuple[int, ...]) -> Choice | None:
    """Try the choices from cheapest to dearest; the first that fits wins (ties: the order below)."""
    options = [stage_choices(k, None) for k in n]
    for choice in sorted(itertools.product(*options), key=lambda c: (choice_cost_ns(terms, c), c)):
        if _fits(terms, rank, n, choice):
            return choice
    return None


def _single_stage(terms: LayoutTerms, rank: RankTerms, n: int) -> Choice | None:
    """One stage: for each count of fully recomputed layers, the fewest selective ones that fit.

    At a peak with c micro-batches in flight, the constraint reads
    base(full) + (P + R) x (d_sel - c x sel x d_sel) <= 0 for sel >= 1 (base: everything but selective
    recomputation at that peak, its whole gradients included, P + R the scaled reserve), so
    sel >= ceil((base + (P + R) d_sel) / ((P + R) c d_sel)); the fewest is the largest over the peaks.
    Every candidate is checked with the exact memory model before it counts.
    """
    scale = PERMILLE + terms.table.reserve_permille
    best: tuple[int, tuple[int, int]] | None = None
    for full in range(n + 1):
        candidates = [0]
        if terms.d_sel > 0 and any(vec[0] for vec in rank.peaks):
            fewest = _fewest_selective(terms, rank, n, full, scale)
            if fewest is not None:
                candidates.append(fewest)
        for sel in candidates:
            if sel > n - full or not terms.fits(rank, (n,), (sel,), (full,)):
                continue
            cost = sel * terms.sel_ns + full * terms.full_ns
            if best is None or (cost, (sel, full)) < best:
                best = (cost, (sel, full))
            break
    return (best[1],) if best is not None else None


def _fewest_selective(terms: LayoutTerms, rank: RankTerms, n: int, full: int, scale: int) -> int | None:
    """``_single_stage``'s least selective count (at least 1) that every peak allows with ``full`` fully
    recomputed layers of the rank's one stage; None when a peak without micro-batches in flight overflows
    (no selective recomputation helps it)."""
    per_stage = [n * terms.act - full * terms.d_full + rank.act_const[0]]
    rest = (PERMILLE * (rank.state_const + terms.table.block_state_bytes * n) - terms.capacity_scaled
            + scale * (terms.transient(True, full > 0) + rank.fixed))  # the selective transient counted
    fewest = 1
    for (c,), value in zip(rank.peaks, terms.peak_values(rank, (n,), per_stage, scale)):
        base = rest + value
        if base <= 0:
            continue
        if c == 0:
            return None
        fewest = max(fewest, -(-base // (scale * c * terms.d_sel)))
    return fewest


def _cpsat(terms: LayoutTerms, rank: RankTerms, n: tuple[int, ...]) -> Choice | None:
    """The same program as ``_enumerate``: least added time such that every memory peak of the rank fits."""
    from ortools.sat.python import cp_model  # imported when first needed: `autoplan --help` stays fast

    m = cp_model.CpModel()
    has_full, has_sel = m.new_bool_var("has_full"), m.new_bool_var("has_sel")
    sel = [m.new_int_var(0, k, f"sel{i}") for i, k in enumerate(n)]
    full = [m.new_int_var(0, k, f"full{i}") for i, k in enumerate(n)]
    for i, k in enumerate(n):
        m.add(sel[i] + full[i] <= k)
        m.add(full[i] <= k * has_full)
        m.add(sel[i] <= k * has_sel)
    t = terms.table
    states = rank.state_const + t.block_state_bytes * sum(n)
    transient = terms.d_full * has_full + terms.d_sel * has_sel
    scale = PERMILLE + t.reserve_permille
    grads = terms.stage_grads(rank, n)
    for vec, live, kept in zip(rank.peaks, rank.peak_grads, rank.peak_kept):
        acts = sum(count * (k * terms.act - sel[i] * terms.d_sel - full[i] * terms.d_full + rank.act_const[i])
                   for i, (count, k) in enumerate(zip(vec, n))) + kept  # kept last-stage outputs: no recompute frees them
        whole = sum(g for g, on in zip(grads, live) if on)
        m.add(PERMILLE * (states + whole) + scale * (acts + transient + rank.fixed) <= terms.capacity_scaled)
    m.minimize(sum(sel[i] * terms.sel_ns + full[i] * terms.full_ns for i in range(len(n))))
    solver = cp_model.CpSolver()
    solver.parameters.num_workers = 1
    solver.parameters.max_time_in_seconds = CPSAT_TIME_LIMIT_S
    status = solver.solve(m)
    if status == cp_model.INFEASIBLE:
        return None
    if status != cp_model.OPTIMAL:
        raise RuntimeError(f"recomputation subproblem not solved to optimality within {CPSAT_TIME_LIMIT_S:.0f} s")
    return tuple((solver.value(sel[i]), solver.value(full[i])) for i in range(len(n)))


def lower_bound_ns(terms: LayoutTerms, rank: RankTerms, n: tuple[int, ...], pin: Pin) -> int | None:
    """A lower bound on ``rank_choice``'s added backward time per micro-batch; None when no choice fits.

    Pinned modes have one choice: its exact cost. Otherwise each memory peak k alone asks for savings
    need_k = excess_k / (P + R) + the smallest rebuild transient, and the cheapest fractional way to save
    that much (each layer's options convexified, best cost per byte first) is the linear-programming
    optimum of that one constraint; the largest over the peaks bounds the integer optimum from below.
    """
    if pin in ("none", "selective", "full"):
        choice = rank_choice(terms, rank, n, pin)
        return None if choice is None else choice_cost_ns(terms, choice)
    scale = PERMILLE + terms.table.reserve_permille
    t = terms.table
    states = rank.state_const + t.block_state_bytes * sum(n)
    per_stage = [k * terms.act + c for k, c in zip(n, rank.act_const)]
    fixed_part = PERMILLE * states + scale * rank.fixed - terms.capacity_scaled
    excess = [fixed_part + v for v in terms.peak_values(rank, n, per_stage, scale)]  # whole gradients included
    if max(excess, default=fixed_part) <= 0:
        return 0
    if fixed_part > 0:
        return None  # the states alone overflow; recomputation only shrinks activations
    modes = [(d, cost) for d, cost in ((terms.d_sel, terms.sel_ns), (terms.d_full, terms.full_ns)) if d > 0]
    if not modes:
        return None
    transient = min(d for d, _ in modes)
    segments = per_layer_hull(modes)
    bound = 0.0
    for vec, e in zip(rank.peaks, excess):
        need = e / scale + transient
        if need <= 0:
            continue
        items = sorted((slope / c, saved * c * k) for c, k in zip(vec, n) if c > 0 and k > 0
                       for slope, saved in segments)
        cost = 0.0
        for per_byte, capacity in items:
            take = min(capacity, need)
            cost += take * per_byte
            need -= take
            if need <= 0:
                break
        if need > 0:
            return None
        bound = max(bound, cost)
    return int(bound * (1 - 1e-9))


def per_layer_hull(modes: list[tuple[int, int]]) -> list[tuple[float, int]]:
    """(cost per byte, bytes) segments of the lower convex hull of one layer's options (0, 0) and
    (saved bytes, cost) per mode: the cheapest fractional mix for every amount a layer can save."""
    points = sorted(modes)
    points = [p for p in points if not any(q[0] >= p[0] and q[1] <= p[1] and q != p for q in points)]
    hull = [(0, 0)]
    for p in points:
        while len(hull) >= 2:
            (x1, y1), (x2, y2) = hull[-2], hull[-1]
            if (y2 - y1) * (p[0] - x1) >= (p[1] - y1) * (x2 - x1):  # hull[-1] lies on or above the chord
                hull.pop()
            else:
                break
        hull.append(p)
    return [((y2 - y1) / (x2 - x1), x2 - x1) for (x1, y1), (x2, y2) in zip(hull, hull[1:])]
