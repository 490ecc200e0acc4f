"""One plan's simulated step, with everything the pictures and ``compare`` draw from it: the per-rank action
timeline, the end of step per rank, recomputation per stage, and time and memory broken down per
pipeline rank (the cost model reports them for the critical / peak rank only).

The plan is re-evaluated with the current cost model (what ``show --timeline`` draws), so a plan written
by an older autoplan shows today's prediction; ``plan_predicted`` keeps the file's own.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from autoplan.cost.estimate import (
    config_of, dense_full_of, memory_breakdown, predict, shapes_of, split_of, time_breakdown,
)
from autoplan.cost.evaluate import Evaluation, StageShape, evaluate, table_shapes
from autoplan.cost.model_workload import workload_fn as model_workload_fn
from autoplan.cost.stage_table import StageTable
from autoplan.cost.tables import build_table
from autoplan.cost.workload import WorkloadFn
from autoplan.schema import MemoryBreakdown, Plan, Predicted, TimeBreakdown


@dataclass(frozen=True)
class SimulatedStep:
    plan: Plan
    predicted: Predicted
    evaluation: Evaluation
    table: StageTable
    shapes: tuple[StageShape, ...]
    time_per_rank: tuple[TimeBreakdown, ...]
    """Each pipeline rank's step split as the cost model splits the critical rank's (bubble = its idle time)."""
    memory_per_rank: tuple[MemoryBreakdown, ...]

    @property
    def step_s(self) -> float:
        return self.evaluation.step_ns * 1e-9

    @property
    def plan_predicted(self) -> Predicted | None:
        return self.plan.predicted

    def recompute_ns(self, stage: int) -> int:
        """Extra backward time of one micro-batch on ``stage`` spent recomputing activations."""
        shape, t = self.shapes[stage], self.table
        return shape.selective * t.selective_extra_ns + shape.full * (t.full_extra_ns + t.full_extra_weight_ns)

    def tail_ns(self, rank: int) -> tuple[float, float]:
        """(data-parallel part, optimizer step) of the work after ``rank``'s last backward, in ns."""
        optimizer = self.time_per_rank[rank].optimizer_s * 1e9
        return self.evaluation.rank_tail_ns[rank] - optimizer, optimizer

    def tail_slices_ns(self, rank: int) -> list[tuple[str, float, float]]:
        """("dp_comm" | "optimizer", start, end) after ``rank``'s last backward, for the pictures: the
        optimizer starts no earlier than the step's sync point (the gradient norm's all-rank all-reduce),
        so a rank that finished early waits there."""
        dp_ns, optimizer_ns = self.tail_ns(rank)
        t = float(self.evaluation.rank_end_ns[rank])
        slices = []
        if dp_ns > 0:
            slices.append(("dp_comm", t, t + dp_ns))
            t += dp_ns
        t = max(t, float(self.evaluation.sync_ns))
        if optimizer_ns > 0:
            slices.append(("optimizer", t, t + optimizer_ns))
        return slices


def simulate_plan(plan: Plan, workload_fn: WorkloadFn | None = None) -> SimulatedStep:
    """The cost model's verdict on the plan's layout (estimate_layout's steps, keeping the pieces);
    ``workload_fn`` defaults to the plan's own model on its cluster and stack."""
    layout = plan.layout()
    fn = workload_fn or model_workload_fn(plan.model, plan.cluster, plan.training, plan.stack)
    config = config_of(layout)
    workload = fn(split_of(config))
    table = build_table(workload, plan.cluster, plan.training, config, dense_full_of(layout, workload.dense_layers))
    shapes = shapes_of(layout)  # as the plan counts them; the table's variables leave out stage 0's dense blocks
    ev = evaluate(table, table_shapes(table, shapes))
    predicted = predict(workload, plan.cluster, plan.training, table, shapes, ev)
    ranks = range(plan.pp)
    times = tuple(time_breakdown(workload, table, shapes, dataclasses.replace(ev, critical_rank=r)) for r in ranks)
    memory = tuple(memory_breakdown(workload, plan.training, table, shapes, ev, r, plan.cluster) for r in ranks)
    return SimulatedStep(plan, predicted, ev, table, shapes, times, memory)


def terms_of(t: TimeBreakdown) -> dict[str, float]:
    """{term: seconds} with the schema's term names (trace.TIME_TERMS)."""
    return {f.name.removesuffix("_s"): getattr(t, f.name) for f in dataclasses.fields(t)}
