"""What ``autoplan run`` relies on, re-derived from the plan's model and layout instead of read from its
``predicted`` block.

A plan file is text a user may edit: a hidden size or sequence length changed by hand leaves the
``predicted`` block describing the old model (issue 33: hidden size 2^20 edited into a gpt-tiny plan still
showed 0.01 GiB per rank, and the run started, then a rank died allocating 1 TiB). So before any process
starts the plan is evaluated again by this autoplan's cost model, on the ``autoplan`` stack (what
``autoplan run`` executes, whatever stack the plan was priced for): a pipeline rank that needs more memory
than the device has is refused, and a ``predicted`` block that disagrees with the re-evaluation is named
(the run's summary compares against the file's figures).
"""

from __future__ import annotations

from dataclasses import dataclass

from autoplan.errors import SpecError
from autoplan.schema import DEFAULT_STACK, Plan

STALE_TOLERANCE = 0.01
"""Relative difference between the file's and the re-evaluated peak memory or step time above which the
file's ``predicted`` block is called stale (the same autoplan reproduces its own figures exactly)."""


@dataclass(frozen=True)
class Recheck:
    memory_gib_per_rank: tuple[float, ...]
    """Peak memory of each pipeline rank, re-evaluated (autoplan stack)."""
    step_time_s: float
    too_big: str | None
    """One line naming the pipeline rank that needs more memory than the device has, or None."""
    stale: str | None
    """One line saying how the file's ``predicted`` block differs, or None when it agrees (or is absent)."""

    def require_fits(self) -> None:
        if self.too_big:
            raise SpecError(self.too_big)


def recheck(plan: Plan) -> Recheck:
    """Re-evaluate ``plan`` with this autoplan's cost model on the autoplan stack. A plan for a user's own
    module (``ModulePlan``) is not re-evaluated: it names the module's factory, not the profile the cost
    model prices (``autoplan run`` checks the factory's counts on every rank instead)."""
    from autoplan.schema.plan import ModulePlan

    if isinstance(plan, ModulePlan):
        raise SpecError(f"plan: {plan.module.name} is your own module, which the cost model cannot re-evaluate "
                        "without its profile; plan the profile again (autoplan plan PROFILE) to see its figures")
    from autoplan.cost.model_workload import workload_fn
    from autoplan.report.simulated import simulate_plan

    sim = simulate_plan(plan, workload_fn(plan.model, plan.cluster, plan.training))  # the autoplan stack
    per_rank = tuple(m.total_gib for m in sim.memory_per_rank)
    device = plan.cluster.device
    worst = max(range(len(per_rank)), key=per_rank.__getitem__)
    too_big = None
    if per_rank[worst] > device.memory_gib:
        said = f"; its predicted block says {_gib(plan.predicted.peak_memory_gib)}" if plan.predicted else ""
        too_big = (f"plan: pipeline rank {worst} needs {_gib(per_rank[worst])} by this autoplan's cost model (the "
                   f"plan's model and layout re-evaluated{said}), more than the {device.memory_gib:g} GiB of a "
                   f"{device.name}; re-plan it (autoplan plan) or change the layout")
    return Recheck(per_rank, sim.step_s, too_big, _stale(plan, max(per_rank), sim.step_s))


def _gib(x: float) -> str:
    return f"{x:,.0f} GiB" if x >= 100 else f"{x:.3g} GiB"


def _stale(plan: Plan, peak_gib: float, step_s: float) -> str | None:
    p = plan.predicted
    if p is None or plan.stack_name != DEFAULT_STACK:  # another stack's figures differ by design
        return None
    off = [f"{what} {theirs:.4g} (re-evaluated {ours:.4g})" for what, theirs, ours in
           (("peak memory GiB", p.peak_memory_gib, peak_gib), ("step time s", p.step_time_s, step_s))
           if abs(theirs - ours) > STALE_TOLERANCE * max(abs(ours), 1e-12)]
    if not off:
        return None
    return ("the plan's predicted block does not match its model and layout (" + ", ".join(off) + "): edited by "
            "hand or written by another autoplan version; the run's summary compares with the file's figures, so "
            "re-plan to update them")
