"""Helpers for the tests of a user's own module (runtime/models/adapter.py): hand-made module plans and the
serial single-process reference run of the module."""

from __future__ import annotations

import dataclasses

from autoplan.schema import Stage, TrainingSetup, load_cluster
from autoplan.schema.plan import ModulePlan, ModuleRef
from autoplan.schema.schedule import stage_rank
from rt_helpers import even_sizes, reference_steps

MIXER = "examples.custom_model.mixer:build"
MIXER_PARAMS = 203_594
"""Parameters of examples/custom_model's Mixer (the profile counts the same)."""


def make_module_plan(factory: str = MIXER, tp: int = 1, pp: int = 1, dp: int = 1, *, zero: int = 0,
                     schedule: str = "1f1b", virtual_stages: int = 1, full: tuple[int, ...] = (), micro_batch_size: int = 2,
                     num_microbatches: int | None = None, num_blocks: int = 4, total_params: int = MIXER_PARAMS,
                     seed: int = 0) -> ModulePlan:
    """A validated ModulePlan for cpu-local with tp*pp*dp devices, fp32."""
    if pp == 1 and schedule == "1f1b":
        schedule = "gpipe"
    n_mb = num_microbatches if num_microbatches is not None else max(2, pp)
    stages, start = [], 0
    for i, n in enumerate(even_sizes(num_blocks, pp * virtual_stages)):
        stages.append(Stage(index=i, rank=stage_rank(schedule, i, pp), layers=(start, start + n),
                            full_recompute=tuple(k for k in full if start <= k < start + n)))
        start += n
    cluster = dataclasses.replace(load_cluster("cpu-local"), devices_per_node=tp * pp * dp)
    train = TrainingSetup(global_batch_size=micro_batch_size * n_mb * dp, seq_len=1, precision="fp32", seed=seed,
                          warmup_steps=2, learning_rate=1e-2)
    plan = ModulePlan(tp=tp, pp=pp, dp=dp, cp=1, sequence_parallel=False, zero_stage=zero, offload_optimizer=False,
                      schedule=schedule, virtual_stages=virtual_stages, micro_batch_size=micro_batch_size, num_microbatches=n_mb,
                      stages=tuple(stages), module=ModuleRef(factory=factory, name="mixer", total_params=total_params,
                                                             num_blocks=num_blocks),
                      cluster=cluster, training=train)
    plan.validate()
    return plan


def serial_module_run(plan: ModulePlan, steps: int) -> list[float]:
    """The module trained in one process with plain PyTorch: the factory's model built under the plan's seed,
    the adapter's global batches and loss, AdamW with decay on matrices only, the runtime's LR formula, and
    clipping by an fp64 global norm (as tests/runtime/rt_helpers.serial_run)."""
    import torch

    from runtime.models.adapter import build_whole, load_factory

    t = plan.training
    build, adapter = load_factory(plan.module.factory)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(t.seed)
        model = build_whole(build, plan.module.factory)

    def loss_at(step: int):
        x, y = adapter.batch(step, 0, t.global_batch_size, t.seed)
        return adapter.loss(model(x), y)

    return reference_steps(list(model.parameters()), t, steps, loss_at)[0]
