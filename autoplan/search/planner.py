"""Find the fastest plan that fits: enumerate configurations, bound, solve the stage problems, choose.

Two solvers over the same space (search/space.py) and the same cost model:

* ``cpsat``: configurations are visited in order of their lower bound (search/bounds.py) and skipped
  once the bound reaches the K-th best step time found; each visited configuration gets its cheapest
  fitting recomputation per rank (search/recompute.py, CP-SAT where the choice is combinatorial) for every
  stage split, simulated; CP-SAT then chooses among the evaluated candidates. The result is OPTIMAL under
  the cost model over this space: every sub-problem is solved to optimality, and pruning only removes what
  provably cannot win.
* ``bruteforce``: every configuration, every split, every per-stage recomputation choice, simulated.
  Slow, and meant for checking the first on small problems (tests/test_search_agrees.py).
"""

from __future__ import annotations

import itertools
import sys
import time
from dataclasses import dataclass
from typing import Callable, Literal

from ortools.sat.python import cp_model

from autoplan.cost.estimate import WorkloadFn
from autoplan.cost.evaluate import Evaluation, StageShape, evaluate
from autoplan.cost.simulate import inflight_peaks
from autoplan.cost.stage_table import Config, StageTable, build_table
from autoplan.cost.workload import Workload
from autoplan.schema import Cluster, ModelSpec, TrainingSetup
from autoplan.search.bounds import states_fit, step_lower_bound_ns
from autoplan.search.recompute import cheapest_recompute, stage_choices
from autoplan.search.space import Pins, SearchLimits, configs, stage_splits

Solver = Literal["cpsat", "bruteforce"]


@dataclass(frozen=True)
class Candidate:
    config: Config
    shapes: tuple[StageShape, ...]
    workload: Workload
    table: StageTable
    evaluation: Evaluation

    @property
    def step_ns(self) -> int:
        return self.evaluation.step_ns


@dataclass(frozen=True)
class SearchResult:
    ranked: tuple[Candidate, ...]
    """The best plan of each of the best configurations, fastest first (at most top_k)."""
    status: str
    """OPTIMAL, or INFEASIBLE when nothing fits; a CP-SAT sub-problem that is not solved to optimality raises
    instead of weakening the claim."""
    wall_s: float
    considered: int
    """Configurations enumerated."""
    evaluated: int
    """Configurations whose stage problems were solved (the rest were pruned by bounds)."""

    @property
    def best(self) -> Candidate | None:
        return self.ranked[0] if self.ranked else None


def search(model: ModelSpec, workload_fn: WorkloadFn, cluster: Cluster, training: TrainingSetup, pins: Pins,
           solver: Solver = "cpsat", top_k: int = 5, limits: SearchLimits = SearchLimits(),
           progress: Callable[[str], None] | None = None) -> SearchResult:
    t0 = time.perf_counter()
    workloads: dict[tuple[int, int, bool], Workload] = {}
    tables = []
    for config in configs(model, cluster, training, pins, limits):
        key = (config.micro_batch_size, config.tp, config.sequence_parallel)
        if key not in workloads:
            workloads[key] = workload_fn(*key)
        table = build_table(workloads[key], cluster, training, config)
        if states_fit(table):
            splits = stage_splits(table.num_layers, table.num_stages, limits.max_edge_trim)
            bound = step_lower_bound_ns(table, min(min(split) for split in splits))
            tables.append((bound, len(tables), table, workloads[key]))
    considered = len(tables)
    tables.sort(key=lambda item: item[:2])
    best_per_config: list[Candidate] = []
    evaluated = 0
    for i, (bound, _, table, workload) in enumerate(tables):
        if solver == "cpsat" and len(best_per_config) >= top_k:
            kth = sorted(c.step_ns for c in best_per_config)[top_k - 1]
            if bound >= kth:
                break
        evaluated += 1
        if progress and i % 50 == 0:
            progress(f"searching: {i}/{considered} configurations, {time.perf_counter() - t0:.1f} s")
        found = _best_layout(table, pins, solver, limits)
        if found is not None:
            shapes, evaluation = found
            best_per_config.append(Candidate(table.config, shapes, workload, table, evaluation))
    ranked = _choose(best_per_config, top_k, solver)
    status = "OPTIMAL" if ranked else "INFEASIBLE"
    return SearchResult(tuple(ranked), status, time.perf_counter() - t0, considered, evaluated)


def _best_layout(table: StageTable, pins: Pins, solver: Solver,
                 limits: SearchLimits) -> tuple[tuple[StageShape, ...], Evaluation] | None:
    best: tuple[tuple[StageShape, ...], Evaluation] | None = None
    peaks = inflight_peaks(table.orders)
    memo: dict = {}
    for split in stage_splits(table.num_layers, table.num_stages, limits.max_edge_trim):
        if solver == "cpsat":
            shapes = cheapest_recompute(table, split, pins.recompute, "auto", peaks, memo)
            options = [shapes] if shapes is not None else []
        else:
            options = _every_recompute_choice(split, pins)
        for shapes in options:
            evaluation = evaluate(table, shapes)
            if evaluation.fits and (best is None or evaluation.step_ns < best[1].step_ns):
                best = (shapes, evaluation)
    return best


def _every_recompute_choice(split: tuple[int, ...], pins: Pins):
    per_stage = [[StageShape(n, sel, full) for sel, full in stage_choices(n, pins.recompute)] for n in split]
    return itertools.product(*per_stage)


def _choose(candidates: list[Candidate], top_k: int, solver: Solver) -> list[Candidate]:
    """Rank the evaluated candidates. With cpsat the winner is chosen by CP-SAT (one Boolean per candidate,
    exactly one chosen, minimum step time); the rest of the table is sorted."""
    ordered = sorted(candidates, key=lambda c: (c.step_ns, _tiebreak(c)))
    if solver != "cpsat" or not ordered:
        return ordered[:top_k]
    model = cp_model.CpModel()
    pick = [model.NewBoolVar(f"c{i}") for i in range(len(ordered))]
    model.AddExactlyOne(pick)
    model.Minimize(sum(c.step_ns * x for c, x in zip(ordered, pick)))
    cp = cp_model.CpSolver()
    cp.parameters.num_workers = 1
    if cp.Solve(model) != cp_model.OPTIMAL:
        raise RuntimeError("CP-SAT failed on the final choice")
    chosen = next(i for i, x in enumerate(pick) if cp.Value(x))
    winner = ordered[chosen]
    rest = [c for i, c in enumerate(ordered) if i != chosen]
    return [winner, *rest][:top_k]


def _tiebreak(c: Candidate) -> tuple:
    """Among equally fast plans prefer less memory, then simpler parallelism."""
    peak = max(m.total_bytes for m in c.evaluation.memory.values())
    k = c.config
    return (peak, k.pp, k.tp, k.zero_stage, k.offload_optimizer, k.virtual_stages)


def stderr_progress(message: str) -> None:
    if sys.stderr.isatty():
        print(f"\r{message}", end="", file=sys.stderr, flush=True)
