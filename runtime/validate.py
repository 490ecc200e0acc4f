"""Checks of a plan against the world it is launched in, run on every rank *before* any collective, so a
mismatch gives the same one-line SpecError everywhere and never a hang."""

from __future__ import annotations

from autoplan.errors import SpecError
from autoplan.schema import Plan, check_fits
from autoplan.schema.plan import ModulePlan, require_runnable


def check_runtime_support(plan: Plan | ModulePlan) -> None:
    """What a valid plan may describe and the runtime does not run, refused in one line: the schema's
    ``require_runnable`` (precision, the model's features, a sequence past its window) and what the
    reference models cannot build (runtime/models ``check_buildable``)."""
    require_runnable(plan)
    if isinstance(plan, ModulePlan):
        return
    from runtime.models import check_buildable  # torch: only where a plan is about to be run

    check_buildable(plan.model)


def check_plan(plan: Plan | ModulePlan, world_size: int, device_type: str, local_world_size: int) -> None:
    if plan.world_size != world_size:
        raise SpecError(f"tp * cp * pp * dp = {plan.tp} * {plan.cp} * {plan.pp} * {plan.dp} = {plan.world_size} but "
                        f"torchrun started "
                        f"{world_size} processes; launch with --nproc_per_node {plan.world_size} (or re-plan)")
    if isinstance(plan, ModulePlan):
        plan.validate()  # a user's module: the layout against the module reference (schema/plan.py)
    else:
        check_fits(plan.layout(), plan.model, plan.training, None)
    check_runtime_support(plan)
    if plan.training.seq_len < 1 or plan.micro_batch_size < 1:
        raise SpecError("training.seq_len / micro_batch_size: must be at least 1")
    if device_type == "cuda":
        import torch
        if local_world_size > torch.cuda.device_count():
            raise SpecError(f"--nproc_per_node {local_world_size} exceeds the {torch.cuda.device_count()} visible "
                            "GPUs; start one process per GPU")
    elif plan.cluster.backend == "nccl" and device_type == "cpu":
        raise SpecError(f"cluster: the plan was made for {plan.cluster.name} (nccl) but no CUDA device is "
                        "visible; plan for cpu-local, or pass --backend gloo to run it on CPU anyway")
