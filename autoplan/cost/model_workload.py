"""The model a user names, as the planner's input: a ``WorkloadFn`` (cost/workload.py) on a cluster and stack.

A model arrives as a ModelSpec (a shipped name, a spec file, a Hugging Face config.json mapped onto one) or
as a ModelProfile (``autoplan profile``); ``workload_fn`` sends the first to the analytic description
(cost/analytic_ops.py) and the second to the profile's (cost/profile_ops.py). Every command that prices a
model (plan, estimate, show, compare, the benchmarks) gets its costs here.

The stack is the one the plan will run on: ``autoplan`` (this project's runtime) unless the user names
another (``--stack``; a plan records it).
"""

from __future__ import annotations

import functools

from autoplan.cost.spec_workload import analytic_workload
from autoplan.cost.profile_ops import profile_workload_fn
from autoplan.cost.workload import LayerSplit, Workload, WorkloadFn
from autoplan.schema import DEFAULT_STACK, Cluster, ModelSpec, StackProfile, TrainingSetup, load_stack
from autoplan.schema.profile import ModelProfile


@functools.lru_cache(maxsize=16)
def shipped_stack(name: str) -> StackProfile:
    return load_stack(name)


def stack_or_default(stack: StackProfile | None = None) -> StackProfile:
    """``stack``, or the shipped default (``autoplan``)."""
    return stack if stack is not None else shipped_stack(DEFAULT_STACK)


def workload_fn(model: ModelSpec | ModelProfile, cluster: Cluster, training: TrainingSetup,
                stack: StackProfile | None = None, rescale: bool = False) -> WorkloadFn:
    """The per-layer costs of ``model`` for each split; ``rescale``: a profile measured on another device
    re-derives its times for this one (``--rescale-profile``)."""
    stack = stack_or_default(stack)
    if isinstance(model, ModelProfile):
        fn = profile_workload_fn(model, cluster, training, stack, rescale=rescale)
    else:
        def fn(split: LayerSplit) -> Workload:
            return analytic_workload(model, cluster, training, split, stack)

    fn.stack = stack  # the search keeps to the schedules this stack runs (search/planner.py ``search``)
    return fn
