"""The cost model's verdict on one fully specified layout: simulate the schedule, add the end of step,
and sum memory per rank. Every search result is re-evaluated here, so what the planner reports is what
this module computes.

The end of the step has a sync point: the gradient norm's all-reduce over every rank (runtime/train/
optim.py's clip_grad_norm, as Megatron's clip_grad_norm) waits for the slowest rank's gradient reduction,
and the optimizer step and the loss's all-reduces come after it on every rank. So the step is
max over ranks (pipeline end + exposed reduction + tied exchange) + max over ranks (after-sync work),
not the largest single rank's sum: a last stage that finishes its pipeline early still starts its
optimizer step only when the first stage has reduced its gradients. The two forms differ only where the
ranks' after-sync work differs (stages of unequal size). ``autoplan run --timeline`` shows the waits (the
end-of-step all-reduces of the ranks that finished early)."""

from __future__ import annotations

from dataclasses import dataclass

from autoplan.cost.simulate import MemoryPeak, Timeline, critical_path, memory_peaks, simulate
from autoplan.cost.stage_table import PERMILLE, StageTable
from autoplan.cost.stage_terms import (
    Var, rank_after_sync, rank_before_sync, rank_fixed_dynamic, rank_states, rank_sync, stage_activations, stage_bwd,
    stage_fwd, stage_wgt, stage_whole_grads,
)


@dataclass(frozen=True)
class StageShape:
    """Layers in a stage and how many of them recompute (the first ``full``, then ``selective``)."""

    layers: int
    selective: int = 0
    full: int = 0


@dataclass(frozen=True)
class RankMemory:
    states_bytes: int
    activations_bytes: int
    """At the rank's peak: saved activations of the micro-batches in flight, plus recompute working memory,
    plus the last stage's outputs the stack keeps by then (``kept_outputs_bytes``, included here)."""
    fixed_bytes: int
    reserve_bytes: float
    baseline_bytes: int = 0
    """The training process's own memory besides tensors (a CPU rank's heap baseline)."""
    whole_grads_bytes: int = 0
    """At the rank's peak: the whole gradients of the stages that hold them then (stage_table.whole_grads;
    ``whole_grad_stages``). Like the model states, no allocator reserve on them."""
    whole_grad_stages: tuple[int, ...] = ()
    kept_outputs_bytes: int = 0
    """Of ``activations_bytes``: the last-stage outputs kept at the peak (stage_table ``kept_output_bytes``
    times the last-stage forwards completed by then), with the activations' reserve like them."""

    @property
    def total_bytes(self) -> float:
        return (self.states_bytes + self.whole_grads_bytes + self.activations_bytes + self.fixed_bytes
                + self.reserve_bytes + self.baseline_bytes)


@dataclass(frozen=True)
class Evaluation:
    step_ns: int
    critical_rank: int
    timeline: Timeline
    rank_end_ns: dict[int, int]
    rank_sync_exposed_ns: dict[int, int]
    rank_tail_ns: dict[int, int]
    """Each rank's own work after its last backward (exposed reduction, tied exchange, after-sync work)."""
    sync_ns: int
    """When the step's first all-rank collective completes: the after-sync work starts here on every rank."""
    memory: dict[int, RankMemory]
    fits: bool


def table_shapes(t: StageTable, shapes: tuple[StageShape, ...]) -> tuple[StageShape, ...]:
    """A plan's per-stage counts (every block) as the table's layout variables: stage 0 less a MoE model's
    leading dense blocks, which it must hold and which the table recomputes fully or not at all
    (``dense_full``, stage_table.py). ValueError when stage 0 holds fewer blocks than that, or its counts
    do not match the table's choice for them."""
    k = t.dense_layers
    if not k or not shapes:
        return shapes
    first = shapes[0]
    full = first.full - (k if t.dense_full else 0)
    if first.layers < k or full < 0 or first.selective + full > first.layers - k:
        raise ValueError(f"stage 0 holds {first.layers} blocks ({first.full} recomputed fully, {first.selective} "
                         f"selectively): it must hold the model's {k} leading dense blocks, "
                         f"{'all' if t.dense_full else 'none'} of them recomputed")
    return (StageShape(first.layers - k, first.selective, full), *shapes[1:])


def plan_shapes(t: StageTable, shapes: tuple[StageShape, ...]) -> tuple[StageShape, ...]:
    """The inverse of ``table_shapes``: stage 0 with its leading dense blocks counted (in its fully
    recomputed count too under ``dense_full``)."""
    k = t.dense_layers
    if not k or not shapes:
        return shapes
    first = shapes[0]
    return (StageShape(first.layers + k, first.selective, first.full + (k if t.dense_full else 0)), *shapes[1:])


def shape_values(shapes: tuple[StageShape, ...]) -> dict[Var, int]:
    values: dict[Var, int] = {}
    for s, shape in enumerate(shapes):
        values[("n", s)], values[("sel", s)], values[("full", s)] = shape.layers, shape.selective, shape.full
    return values


def recompute_transient(t: StageTable, shapes: tuple[StageShape, ...], rank: int) -> int:
    """Backward of a recomputed block rebuilds its activations: one block's worth at a time."""
    stages = t.stages_of(rank)
    full = any(shapes[s].full for s in stages)
    selective = any(shapes[s].selective for s in stages)
    return (t.block_act_bytes - t.block_act_full_bytes if full else 0) + \
        (t.block_act_bytes - t.block_act_selective_bytes if selective else 0)


def rank_memory(t: StageTable, shapes: tuple[StageShape, ...], rank: int, peaks: list[MemoryPeak]) -> RankMemory:
    """The rank's memory at the largest of its candidate peaks (simulate.memory_peaks): at each, the
    activations of the micro-batches in flight and the last stage's outputs kept by then (with the
    allocator's reserve) and the whole gradients live then (without); the one with the largest total is the
    peak."""
    values = shape_values(shapes)
    stages = t.stages_of(rank)
    per_stage = {s: stage_activations(t, s).value(values) for s in stages}
    grads = {s: stage_whole_grads(t, s).value(values) for s in stages}
    per_output = t.kept_output_bytes if t.num_stages - 1 in stages else 0
    scale = PERMILLE + t.reserve_permille
    best, acts, whole, live, outputs = None, 0, 0, (), 0
    for peak in peaks:
        o = peak.kept_outputs * per_output
        a = sum(c * per_stage[s] for s, c in peak.counts.items()) + o
        g = sum(grads[s] for s in peak.whole_grads)
        if best is None or PERMILLE * g + scale * a > best:
            best, acts, whole, outputs = PERMILLE * g + scale * a, a, g, o
            live = tuple(sorted(s for s in peak.whole_grads if grads[s]))
    acts += recompute_transient(t, shapes, rank)
    fixed = rank_fixed_dynamic(t, rank)
    return RankMemory(rank_states(t, rank).value(values), acts, fixed, (acts + fixed) * t.reserve_permille / PERMILLE,
                      t.baseline_bytes, whole, live, outputs)


def fits_in(t: StageTable, memory: RankMemory) -> bool:
    dynamic = memory.activations_bytes + memory.fixed_bytes
    fixed = memory.states_bytes + memory.whole_grads_bytes + memory.baseline_bytes
    return PERMILLE * fixed + (PERMILLE + t.reserve_permille) * dynamic <= PERMILLE * t.capacity_bytes


def evaluate(t: StageTable, shapes: tuple[StageShape, ...]) -> Evaluation:
    if len(shapes) != t.num_stages or sum(s.layers for s in shapes) != t.num_layers:
        raise ValueError("stage shapes do not match the table")
    values = shape_values(shapes)
    fwd = [stage_fwd(t, s).value(values) for s in range(t.num_stages)]
    bwd = [stage_bwd(t, s).value(values) for s in range(t.num_stages)]
    wgt = [stage_wgt(t, s).value(values) for s in range(t.num_stages)] if t.split_backward else [0] * t.num_stages
    timeline = simulate(t.orders, [float(x) for x in fwd], [float(x) for x in bwd], [float(x) for x in t.p2p_ns],
                        float(t.late_receive_ns), [float(x) for x in wgt])
    peaks = memory_peaks(t.orders, t.kept_output_bytes > 0)
    ends, exposed, tails, before, after, memory = {}, {}, {}, {}, {}, {}
    for rank in t.orders:
        ends[rank] = int(timeline.rank_end[rank])
        last = t.last_backward_stage(rank)
        window = (wgt[last] if t.last_is_weight(rank) else bwd[last]) if t.overlap_grad_reduce else 0
        exposed[rank] = max(0, rank_sync(t, rank).value(values) - window)
        before[rank] = exposed[rank] + rank_before_sync(t, rank).value(values)
        after[rank] = rank_after_sync(t, rank).value(values)
        tails[rank] = before[rank] + after[rank]
        memory[rank] = rank_memory(t, shapes, rank, peaks[rank])
    sync = max(ends[r] + before[r] for r in t.orders)
    critical = max(t.orders, key=lambda r: ends[r] + tails[r])
    return Evaluation(
        step_ns=sync + max(after.values()), critical_rank=critical, timeline=timeline, rank_end_ns=ends,
        rank_sync_exposed_ns=exposed, rank_tail_ns=tails, sync_ns=sync, memory=memory,
        fits=all(fits_in(t, m) for m in memory.values()),
    )


def path_of(t: StageTable, evaluation: Evaluation):
    """The critical path to the rank that ends the step (the breakdown's pipeline transfers)."""
    return critical_path(evaluation.timeline, evaluation.critical_rank)
