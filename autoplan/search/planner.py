"""Find the fastest plans that fit: a best-first branch-and-bound over the search space.

Two solvers over the same space (search/space.py) and the same cost model:

* ``bnb``: a best-first branch-and-bound. The nodes are, from the top, groups of configurations (tp, cp, pp,
  dp, sequence parallel, micro-batch size), configurations (+ ZeRO stage, offload, schedule), stage splits
  and stage layouts (+ per-rank recomputation); each carries a lower bound on the step time of everything
  below it (search/bounds.py). The node with the least bound is expanded first; a layout is simulated
  only when its bound is below the K-th best configuration found so far, and the search stops when the
  least bound left exceeds it. Per-rank recomputation is an integer program solved exactly (closed form,
  enumeration, or CP-SAT: search/recompute.py). The result is OPTIMAL under the cost model over this
  space: every sub-problem is solved to optimality and pruning only removes what provably cannot be
  among the K best. With a time limit the search stops early and says FEASIBLE, with the proven bound.
* ``bruteforce``: every configuration, every split, every per-stage recomputation choice, evaluated with
  evaluate.py alone. Slow, and meant for checking the first on small problems (tests/planner).

Both rank the best layout of each configuration by step time, then less peak memory, then simpler
parallelism; within one configuration the earlier split (search/space.py's order) wins a tie.

Mixture of Experts: ep and etp are part of the group (they change the MoE layers' costs and the expert
states, search/space.py); a model's leading dense blocks sit on stage 0 as a constant of the table
(cost/stage_table.py), kept or all fully recomputed, which both solvers try as two tables per
configuration. tests/planner/test_moe_search.py checks bnb against brute force on random MoE problems.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import gc
import heapq
import itertools
import time
from dataclasses import dataclass
from typing import Callable, Literal

from autoplan.cost.evaluate import Evaluation, StageShape, evaluate, plan_shapes
from autoplan.cost.layout_terms import LayoutTerms
from autoplan.cost.host_model import DevicesOnTheirOwn
from autoplan.cost.stage_table import Config, StageTable, with_schedule
from autoplan.cost.tables import build_table, host_model
from autoplan.cost.workload import Workload, WorkloadFn
from autoplan.schema import Cluster, ModelSpec, TrainingSetup
from autoplan.schema.schedule import ZERO_BUBBLE
from autoplan.search.bounds import (
    busiest_rank_ns, config_lower_bound_ns, family_lower_bound_ns, family_range, group_can_fit, group_lower_bound_ns,
    layout_lower_bound_ns, rank_floors, simulated_lower_bound_ns, split_lower_bound_ns, states_fit,
)
from autoplan.search.recompute import cheapest_recompute, forced_recompute, stage_choices
from autoplan.search.space import (
    Group, Pins, SearchLimits, check_size, dense_layers_of, group_choices, group_configs, groups, num_layers_of,
    stack_limits, table_splits,
)

Solver = Literal["bnb", "bruteforce"]
Progress = Callable[[str, bool], None]
"""Called with a status line every ``PROGRESS_INTERVAL_S`` and, if it was called at all, once at the end
(second argument True) with the totals."""
PROGRESS_INTERVAL_S = 2.0


@dataclass(frozen=True)
class Candidate:
    config: Config
    shapes: tuple[StageShape, ...]
    """Per stage, as a plan counts them (every block; cost/evaluate.py ``plan_shapes``)."""
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
    """OPTIMAL; FEASIBLE when the time limit stopped the search after it found a plan; INFEASIBLE when
    nothing fits; UNKNOWN when the time limit came before any plan. A CP-SAT sub-problem that is not
    solved to optimality raises instead of weakening the claim."""
    wall_s: float
    considered: int
    """Configurations in the search space."""
    evaluated: int
    """Configurations with at least one layout simulated (the rest were pruned by bounds)."""
    bounded: int = 0
    """Configurations whose own bound was computed (the rest were pruned with their whole group)."""
    simulated: int = 0
    """Stage layouts simulated."""
    bound_ns: int = 0
    """Proven lower bound on the best step time (equal to it when OPTIMAL)."""

    @property
    def best(self) -> Candidate | None:
        return self.ranked[0] if self.ranked else None


@dataclass
class _ConfigState:
    """One configuration being searched: its tables, its splits and its best layout so far."""

    table: StageTable
    workload: Workload
    splits: tuple[tuple[int, ...], ...]
    terms: LayoutTerms | None = None
    memo: dict | None = None
    best: tuple[int, int, tuple[StageShape, ...]] | None = None
    """(step ns, split index, shapes) of the best layout so far."""


_GROUP, _GROUP_BOUNDED, _CONFIG, _CONFIG_SIMULATED, _SPLITS, _SPLIT, _SPLIT_SIMULATED, _LAYOUT = range(8)

RELAXED_MEMORY = ("block_state_bytes", "embedding_state_bytes", "head_state_bytes", "dense_state_bytes",
                  "block_grad_bytes", "embedding_grad_bytes", "head_grad_bytes", "dense_grad_bytes",
                  "zero3_buffer_bytes", "dense_act_bytes", "dense_transient_bytes")
"""What a group's relaxed table takes as the least over its ZeRO stages and offload (``_Run.group_floor_ns``)."""
RELAXED_TAILS = ("gather_block_ns", "gather_embedding_ns", "gather_head_ns", "dense_gather_ns", "optim_block_ns",
                 "optim_embedding_ns", "optim_head_ns", "dense_optim_ns")


def search(model: ModelSpec, workload_fn: WorkloadFn, cluster: Cluster, training: TrainingSetup, pins: Pins,
           solver: Solver = "bnb", top_k: int = 5, limits: SearchLimits = SearchLimits(),
           progress: Progress | None = None, time_limit_s: float | None = None,
           first_fit: bool = False) -> SearchResult:
    """``time_limit_s``: stop then with the best plans so far (FEASIBLE); ``first_fit``: stop at the first
    layout that fits (FEASIBLE), to learn whether anything fits. A workload function from
    ``cost.model_workload.workload_fn`` names its stack: only the pipeline schedules that stack runs are
    searched (``StackProfile.schedules``), whoever calls."""
    check_size(model, cluster, training)
    stack = getattr(workload_fn, "stack", None)
    if stack is not None:
        limits = stack_limits(stack, pins.schedule, limits)
    with _collector_paused():
        run = _Run(model, workload_fn, cluster, training, pins, limits, top_k, progress, time_limit_s, first_fit)
        return run.bruteforce() if solver == "bruteforce" else run.branch_and_bound()


@contextlib.contextmanager
def _collector_paused():
    """Python's cycle collector off for the search: the search allocates millions of short-lived tuples
    (schedule rows, bounds) that reference counting frees, and each collection they trigger walks every
    long-lived object, the cached schedules' 10^5-10^6 actions included (a tenth of a large search's time).
    The search makes no reference cycles worth collecting; the collector's previous state comes back."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


class _Run:
    def __init__(self, model, workload_fn: WorkloadFn, cluster: Cluster, training: TrainingSetup, pins: Pins,
                 limits: SearchLimits, top_k: int, progress: Progress | None, time_limit_s: float | None,
                 first_fit: bool):
        self.model, self.workload_fn, self.cluster, self.training = model, workload_fn, cluster, training
        self.pins, self.limits, self.top_k = pins, limits, max(1, top_k)
        self.progress, self.time_limit_s, self.first_fit = progress, time_limit_s, first_fit
        self.num_layers = num_layers_of(model)
        self.dense_layers = dense_layers_of(model)
        self.dense_choices = _dense_choices(self.dense_layers, pins.recompute)
        """A MoE model's leading dense blocks: kept, or all fully recomputed (a table each, cost/stage_table.py)."""
        self.t0 = time.perf_counter()
        self.next_report = self.t0 + PROGRESS_INTERVAL_S
        self.reported = False
        self.host = host_model(cluster)
        self.device_tables = isinstance(self.host, DevicesOnTheirOwn)
        """The host changes nothing: a group's tables differ by schedule only where ``with_schedule`` says."""
        self.workloads: dict = {}
        self.states: list[_ConfigState] = []
        self.considered = self.bounded = self.simulated = 0

    def workload(self, group: Group) -> Workload:
        split = group.split
        if split not in self.workloads:
            workload = self.workload_fn(split)
            if workload.dense_layers != self.dense_layers:
                raise ValueError(f"the workload prices {workload.dense_layers} leading dense blocks, the model has "
                                 f"{self.dense_layers}")
            self.workloads[split] = workload
        return self.workloads[split]

    def splits(self, config: Config) -> tuple[tuple[int, ...], ...]:
        """The configuration's stage splits in the table's layout variables (search/space.py ``table_splits``)."""
        return self.stage_splits(config.num_stages)

    def stage_splits(self, num_stages: int) -> tuple[tuple[int, ...], ...]:
        return _splits(self.num_layers, num_stages, self.limits.max_edge_trim, self.dense_layers)

    def stage_family(self, num_stages: int) -> tuple[int, int, int] | None:
        return _family(self.num_layers, num_stages, self.limits.max_edge_trim, self.dense_layers)

    def elapsed(self) -> float:
        return time.perf_counter() - self.t0

    def report(self, message: Callable[[], str], final: bool = False) -> None:
        if self.progress is None:
            return
        now = time.perf_counter()
        if final:
            if self.reported:
                self.progress(message(), True)
        elif now >= self.next_report:
            self.progress(message(), False)
            self.reported = True
            self.next_report = now + PROGRESS_INTERVAL_S

    # ---------------------------------------------------------------------------------------------------

    def branch_and_bound(self) -> SearchResult:
        """Best first: the node with the least bound next. Under a time limit, once a quarter of it has gone
        with no plan found, the search dives (deepest node first) until it has one, then goes back to
        best first: the plan a time limit returns is then rarely missing, and the bound stays proven."""
        heap: list = []
        order = itertools.count()
        diving = False

        def priority(key: int, kind: int):
            return (-kind, key) if diving else key

        def push(key: int, kind: int, item) -> None:
            heapq.heappush(heap, (priority(key, kind), next(order), key, kind, item))

        def reorder() -> None:
            heap[:] = [(priority(e[2], e[3]), *e[1:]) for e in heap]
            heapq.heapify(heap)
        for group in groups(self.model, self.cluster, self.training, self.pins, self.limits):
            states, schedules = group_choices(group, self.cluster, self.pins, self.num_layers, self.limits)
            if not states or not schedules:
                continue
            self.considered += len(states) * len(schedules) * len(self.dense_choices)
            families = {v: self.stage_family(group.pp * v) for _, v in schedules}
            shapes = {(v, *families[v], kind in ZERO_BUBBLE) for kind, v in schedules if families[v] is not None}
            shapes = {(v, least, zb, first, last) for v, least, first, last, zb in shapes}
            if not shapes:
                continue
            workload = self.workload(group)
            if not group_can_fit(workload, self.cluster, self.training, group.pp, group.dp_cp, states,
                                 min(shape[1] for shape in shapes), group.edp):
                continue
            key = group_lower_bound_ns(workload, self.host, group.pp, group.num_microbatches, sorted(shapes))
            push(key, _GROUP, group)
        kth = float("inf")  # the K-th best configuration's step time so far
        stopped_at: int | None = None
        key = 0

        def line() -> str:
            return (f"searching: {self.bounded}/{self.considered} configurations bounded, {self.simulated} layouts "
                    f"simulated, {self.best_so_far()}, bound {key * 1e-9:.3f} s, {self.elapsed():.1f} s")

        while heap:
            _, _, key, kind, item = heapq.heappop(heap)
            if key > kth:
                if diving:
                    continue
                break
            if self.time_limit_s is not None:
                elapsed = self.elapsed()
                if elapsed > self.time_limit_s:
                    stopped_at = min([key] + [e[2] for e in heap])
                    break
                should_dive = not self.states and elapsed > self.time_limit_s / 4
                if should_dive != diving:
                    diving = should_dive
                    reorder()
            self.report(line)
            if kind == _GROUP:  # devices on their own: first one relaxed bound for all the group's configurations
                built: dict[tuple[int, bool, bool], StageTable] = {}
                bound = self.group_floor_ns(item, built) if self.device_tables else key
                if bound is not None:
                    push(max(key, bound), _GROUP_BOUNDED, (item, built))
            elif kind == _GROUP_BOUNDED:
                item, built = item
                workload = self.workload(item)
                # a table's model states depend on the group, its ZeRO stage and offload, not on the schedule
                # (every schedule of a group has one stage, or several: pp > 1): one misfit skips the others
                unfit: set[tuple[int, bool]] = set()
                for config, dense_full in itertools.product(
                        group_configs(item, self.cluster, self.pins, self.num_layers, self.limits), self.dense_choices):
                    states_key = (config.zero_stage, config.offload_optimizer)
                    if states_key in unfit:
                        continue
                    key_built = (*states_key, dense_full, _hides_exchange(workload, config))
                    if key_built in built and self.device_tables:  # the same table but for the schedule
                        table = with_schedule(built[key_built], workload, self.cluster, config)
                    else:
                        table = built[key_built] = build_table(workload, self.cluster, self.training, config,
                                                               dense_full)
                    self.bounded += 1
                    if not states_fit(table):
                        unfit.add(states_key)
                        continue
                    splits = self.splits(config)
                    if not splits:
                        continue
                    least, first, last = self.stage_family(config.num_stages)
                    low = family_range(splits)[0]
                    floors = rank_floors(table, low, self.pins.recompute)
                    if floors is None:
                        continue
                    bound = max(config_lower_bound_ns(table, least, (first, last)), busiest_rank_ns(table, low, floors))
                    state = _ConfigState(table, workload, splits)
                    push(max(key, bound), _CONFIG, state)
            elif kind == _CONFIG:  # the schedule's lists, and one bound for all the splits
                item.terms, item.memo = LayoutTerms(item.table), {}
                bound = family_lower_bound_ns(item.terms, item.splits, self.pins.recompute)
                if bound is not None and bound <= kth:
                    push(max(key, bound), _CONFIG_SIMULATED, item)
            elif kind == _CONFIG_SIMULATED:  # dearer: the schedule simulated with the family's fewest layers
                bound = simulated_lower_bound_ns(item.terms, *family_range(item.splits))
                if bound <= kth:
                    push(max(key, bound), _SPLITS, item)
            elif kind == _SPLITS:
                for index, split in enumerate(item.splits):
                    bound = split_lower_bound_ns(item.terms, split, self.pins.recompute)
                    if bound is not None and bound <= kth:
                        push(max(key, bound), _SPLIT, (item, index, split))
            elif kind == _SPLIT:  # a choice that needs no solving is simulated at once; else bound by simulation
                state, index, split = item
                if _cannot_improve(state, key, index):
                    continue
                shapes = forced_recompute(state.terms, split, self.pins.recompute)
                if shapes is None:
                    bound = simulated_lower_bound_ns(state.terms, split, split)
                    push(max(key, bound), _SPLIT_SIMULATED, item)
                    continue
                kth = self.record(state, index, shapes, kth)
                if self.first_fit:
                    stopped_at = min([key] + [e[2] for e in heap])
                    break
            elif kind == _SPLIT_SIMULATED:
                state, index, split = item
                if _cannot_improve(state, key, index):
                    continue
                shapes = cheapest_recompute(state.table, split, self.pins.recompute, "auto", state.terms, state.memo)
                if shapes is not None:
                    bound = max(key, layout_lower_bound_ns(state.terms, shapes))
                    push(bound, _LAYOUT, (state, index, shapes))
            else:
                state, index, shapes = item
                if _cannot_improve(state, key, index):
                    continue
                kth = self.record(state, index, shapes, kth)
                if self.first_fit:
                    stopped_at = min([key] + [e[2] for e in heap])
                    break
        ranked = self.rank()
        if stopped_at is not None:
            status = "FEASIBLE" if ranked else "UNKNOWN"
            bound_ns = min(stopped_at, ranked[0].step_ns) if ranked else stopped_at
        else:
            status = "OPTIMAL" if ranked else "INFEASIBLE"
            bound_ns = ranked[0].step_ns if ranked else 0
        self.report(lambda: self.summary(status), final=True)
        return SearchResult(tuple(ranked), status, self.elapsed(), self.considered, len(self.states),
                            self.bounded, self.simulated, bound_ns)

    def group_floor_ns(self, group: Group, built: dict) -> int | None:
        """A lower bound on every configuration of the group, None when none can fit: the configuration bounds
        (``config_lower_bound_ns``, ``busiest_rank_ns`` with ``rank_floors``) of a relaxed table per schedule,
        whose model states and ZeRO-3 buffers are the least over the group's ZeRO stages and offload, whose
        layer times are those without ZeRO-3 gathers where any stage but 3 fits, and whose end-of-step
        gathers and optimizer steps are 0. Every bound grows with those quantities, so each configuration's
        own bound is at least this one. Fills ``built`` with one table per (ZeRO stage, offload), which the
        group's expansion reuses."""
        workload = self.workload(group)
        configs = list(group_configs(group, self.cluster, self.pins, self.num_layers, self.limits))
        for config in configs:
            for dense_full in self.dense_choices:
                key = (config.zero_stage, config.offload_optimizer, dense_full, _hides_exchange(workload, config))
                if key not in built:
                    built[key] = build_table(workload, self.cluster, self.training, config, dense_full)
        fitting = [t for t in built.values() if states_fit(t)]
        if not fitting:
            return None
        # the least layer times: the experts' exchange hidden where a schedule of the group lets the stack hide
        # it, no ZeRO-3 gathers where another stage fits, the dense blocks not recomputed
        ref = min(fitting, key=lambda t: (not _hides_exchange(workload, t.config), t.config.zero_stage == 3,
                                          t.dense_full))
        relaxed = dataclasses.replace(ref, **{f: min(getattr(t, f) for t in fitting) for f in RELAXED_MEMORY},
                                      **{f: 0 for f in RELAXED_TAILS})
        fit_keys = {(t.config.zero_stage, t.config.offload_optimizer) for t in fitting}
        schedules = {(c.schedule, c.virtual_stages) for c in configs if (c.zero_stage, c.offload_optimizer) in fit_keys}
        best = None
        for schedule, v in schedules:
            config = dataclasses.replace(relaxed.config, schedule=schedule, virtual_stages=v)
            splits = self.splits(config)
            if not splits:
                continue
            table = with_schedule(relaxed, workload, self.cluster, config)
            low = family_range(splits)[0]
            floors = rank_floors(table, low, self.pins.recompute)
            if floors is None:
                continue
            least, first, last = _family_least(splits)
            bound = max(config_lower_bound_ns(table, least, (first, last)), busiest_rank_ns(table, low, floors))
            best = bound if best is None else min(best, bound)
        return best

    def record(self, state: _ConfigState, index: int, shapes: tuple[StageShape, ...], kth: float) -> float:
        """Simulate one layout, keep it if it is its configuration's best; the new K-th best step time."""
        step, _ = state.terms.step_ns([s.layers for s in shapes], [s.selective for s in shapes],
                                      [s.full for s in shapes])
        self.simulated += 1
        if state.best is None:
            self.states.append(state)
        elif (step, index) >= state.best[:2]:
            return kth
        state.best = (step, index, shapes)
        steps = sorted(s.best[0] for s in self.states)
        return steps[self.top_k - 1] if len(steps) >= self.top_k else float("inf")

    def summary(self, status: str) -> str:
        return (f"searched: {status}, {self.considered} configurations, {self.bounded} bounded, "
                f"{len(self.states)} with layouts simulated ({self.simulated} layouts), {self.elapsed():.1f} s")

    # ---------------------------------------------------------------------------------------------------

    def bruteforce(self) -> SearchResult:
        """Every layout of every configuration. Progress and the time limit are checked after each layout
        (one configuration of a large model has more layouts than any time limit allows); stopped early it
        says FEASIBLE (UNKNOWN with nothing found) and, having no bound, reports 0 as its bound."""
        stopped = False

        def line() -> str:
            return (f"brute force: {self.considered} configurations, {self.simulated} layouts simulated, "
                    f"{self.best_so_far()}, {self.elapsed():.1f} s")

        for state, index, shapes in self.every_layout():
            evaluation = evaluate(state.table, shapes)
            self.simulated += 1
            if evaluation.fits and (state.best is None or evaluation.step_ns < state.best[0]):
                state.best = (evaluation.step_ns, index, shapes)
            self.report(line)
            if self.time_limit_s is not None and self.elapsed() > self.time_limit_s:
                stopped = True
                break
        self.states = [s for s in self.states if s.best is not None]
        ranked = self.rank()
        status = ("FEASIBLE" if ranked else "UNKNOWN") if stopped else ("OPTIMAL" if ranked else "INFEASIBLE")
        self.report(lambda: self.summary(status), final=True)
        return SearchResult(tuple(ranked), status, self.elapsed(), self.considered, len(self.states),
                            self.bounded, self.simulated, 0 if stopped or not ranked else ranked[0].step_ns)

    def every_layout(self):
        """(configuration state, split index, stage shapes) of every layout in the space, configuration by
        configuration; each configuration's state is in ``self.states`` from its first layout on."""
        for group in groups(self.model, self.cluster, self.training, self.pins, self.limits):
            workload = self.workload(group)
            for config, dense_full in itertools.product(
                    group_configs(group, self.cluster, self.pins, self.num_layers, self.limits), self.dense_choices):
                self.considered += 1
                self.bounded += 1
                state = _ConfigState(build_table(workload, self.cluster, self.training, config, dense_full), workload,
                                     self.splits(config))
                self.states.append(state)
                for index, split in enumerate(state.splits):
                    per_stage = [[StageShape(n, sel, full) for sel, full in stage_choices(n, self.pins.recompute)]
                                 for n in split]
                    for shapes in itertools.product(*per_stage):
                        yield state, index, shapes

    def best_so_far(self) -> str:
        """The progress line's "best ... s" (or "nothing fits yet")."""
        found = [s.best[0] for s in self.states if s.best]
        return f"best {min(found) * 1e-9:.3f} s" if found else "nothing fits yet"

    def rank(self) -> list[Candidate]:
        """The K best configurations (all those tied with the K-th), each evaluated in full by evaluate.py,
        ordered by step time and then ``_tiebreak``."""
        found = sorted((s for s in self.states if s.best), key=lambda s: s.best[0])
        if not found:
            return []
        kth = found[min(self.top_k, len(found)) - 1].best[0]
        candidates = []
        for state in found:
            if state.best[0] > kth:
                break
            step, _, shapes = state.best
            evaluation = evaluate(state.table, shapes)
            # equal to the nanosecond; beyond 2^53 ns (a device described far slower than any real one) the
            # simulation's float sums round where the search's integers do not
            tolerance = step * 1e-12 if step > 2**53 else 0
            if abs(evaluation.step_ns - step) > tolerance or not evaluation.fits:
                raise RuntimeError(f"search and evaluate disagree on {state.table.config}: {step} vs "
                                   f"{evaluation.step_ns} ns, fits={evaluation.fits}")
            candidates.append(Candidate(state.table.config, plan_shapes(state.table, shapes), state.workload,
                                        state.table, evaluation))
        candidates.sort(key=lambda c: (c.step_ns, _tiebreak(c)))
        return candidates[:self.top_k]


def _hides_exchange(workload: Workload, config: Config) -> bool:
    """The table of ``config`` hides part of the experts' all-to-all (cost/workload.py
    ``with_exposed_exchange``): tables are reused across schedules (``with_schedule``) only when this agrees."""
    return workload.stack.ep_comm_overlap > 0 and config.ep_overlap_possible


@functools.lru_cache(maxsize=4096)
def _splits(num_layers: int, num_stages: int, max_edge_trim: int, dense_layers: int = 0) -> tuple[tuple[int, ...], ...]:
    """Cached: the search asks for the same few stage counts hundreds of thousands of times."""
    return tuple(table_splits(num_layers, num_stages, max_edge_trim, dense_layers))


@functools.lru_cache(maxsize=4096)
def _family(num_layers: int, num_stages: int, max_edge_trim: int, dense_layers: int = 0) -> tuple[int, int, int] | None:
    """``_family_least`` of the stage splits (None: there are none), cached like them."""
    splits = _splits(num_layers, num_stages, max_edge_trim, dense_layers)
    return _family_least(splits) if splits else None


def _dense_choices(dense_layers: int, pin) -> tuple[bool, ...]:
    """Whether a MoE model's leading dense blocks are fully recomputed, as the search tries it: both without
    a pin; with --recompute full yes, with none or selective no (they have no selective mode here)."""
    if not dense_layers:
        return (False,)
    return {None: (False, True), "full": (True,)}.get(pin, (False,))


def _family_least(splits: list[tuple[int, ...]]) -> tuple[int, int, int]:
    """The fewest layers of any stage, of the first stage and of the last over a family of splits."""
    return min(min(split) for split in splits), min(split[0] for split in splits), min(split[-1] for split in splits)


def _cannot_improve(state: _ConfigState, bound: int, index: int) -> bool:
    """The configuration already has a layout at least as good as anything this node can give."""
    return state.best is not None and (bound, index) > state.best[:2]


def _tiebreak(c: Candidate) -> tuple:
    """Among equally fast plans prefer less memory, then simpler parallelism, then the order of the fields."""
    peak = max(m.total_bytes for m in c.evaluation.memory.values())
    k = c.config
    return (peak, k.pp, k.tp, k.zero_stage, k.offload_optimizer, k.virtual_stages, dataclasses.astuple(k))
