"""Turning search results into plans, and explaining a search that found nothing that fits."""

from __future__ import annotations

import dataclasses

from autoplan.cost.estimate import layout_dense_layers, layout_of, predict, with_local_params
from autoplan.errors import SpecError
from autoplan.schema import Cluster, Layout, ModelSpec, Plan, Predicted, SolverInfo, TrainingSetup
from autoplan.search.planner import Candidate, SearchResult, search
from autoplan.search.space import MAX_DEVICES, Pins

FACTORS = (2, 4, 8, 16)
"""How much more nodes, or how much smaller a batch, an infeasible plan's explanation tries."""


def predicted_of(candidate: Candidate, cluster: Cluster, training: TrainingSetup) -> tuple[Layout, Predicted]:
    layout = layout_of(candidate.config, candidate.shapes, layout_dense_layers(candidate.table))
    return layout, predict(candidate.workload, cluster, training, candidate.table, candidate.shapes,
                           candidate.evaluation)


def plan_of(model: ModelSpec, cluster: Cluster, training: TrainingSetup, candidate: Candidate,
            solver: SolverInfo | None) -> Plan:
    """The candidate as a plan, recording the stack its costs were priced for."""
    layout, predicted = predicted_of(candidate, cluster, training)
    predicted = with_local_params(predicted, model, layout, training)
    fields = {f.name: getattr(layout, f.name) for f in dataclasses.fields(layout)}
    return Plan(**fields, model=model, cluster=cluster, training=training, predicted=predicted, solver=solver,
                stack=candidate.workload.stack)


def solver_info(result: SearchResult, solver: str) -> SolverInfo:
    best = result.best
    return SolverInfo(name=solver, status=result.status, objective=best.step_ns * 1e-9 if best else 0.0,
                      wall_s=round(result.wall_s, 3), candidates=result.considered)


def explain_infeasible(model: ModelSpec, make_workload, cluster: Cluster, training: TrainingSetup,
                       pins: Pins) -> str:
    """The smallest change that would fit: unpin offload, more nodes, a smaller global batch (each tried
    until a first plan fits, not to optimality)."""
    tries: list[tuple[str, Cluster, TrainingSetup, Pins]] = []
    if pins.offload_optimizer is False:
        tries.append(("--offload", cluster, training, dataclasses.replace(pins, offload_optimizer=None)))
    for factor in FACTORS:
        bigger = dataclasses.replace(cluster, num_nodes=cluster.num_nodes * factor)
        if bigger.num_devices <= MAX_DEVICES:
            tries.append((f"--nodes {bigger.num_nodes}", bigger, training, pins))
    for factor in FACTORS:
        if training.global_batch_size >= factor:
            gbs = training.global_batch_size // factor
            tries.append((f"--global-batch-size {gbs}", cluster, dataclasses.replace(training, global_batch_size=gbs),
                          pins))
    capacity = cluster.device.memory_gib * (1 - training.memory_margin)
    for label, c, t, p in tries:
        result = search(model, make_workload(model, c, t), c, t, p, top_k=1, first_fit=True)
        if result.best is not None:
            peak = max(m.total_bytes for m in result.best.evaluation.memory.values()) / 2**30
            return (f"no plan fits in {capacity:.1f} GiB per device; the smallest change that fits: {label} "
                    f"(peak {peak:.1f} GiB)")
    return (f"no plan fits in {capacity:.1f} GiB per device, even with {FACTORS[-1]}x the nodes or a "
            f"{FACTORS[-1]}x smaller global batch")


def require_plan(result: SearchResult, message) -> Candidate:
    if result.best is None:
        raise SpecError(message())
    return result.best
