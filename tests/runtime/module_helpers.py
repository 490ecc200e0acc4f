"""Helpers for the tests of a user's own module (runtime/models/adapter.py): hand-made module plans and the
serial single-process reference run of the module."""

from __future__ import annotations

import dataclasses

from autoplan.schema import Stage, TrainingSetup, load_cluster
from autoplan.schema.plan import ModulePlan, ModuleRef
from autoplan.schema.schedule import stage_rank
from rt_helpers import even_sizes

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
    from runtime.train.optim import lr_at

    t = plan.training
    build, adapter = load_factory(plan.module.factory)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(t.seed)
        model = build_whole(build, plan.module.factory)
    params = list(model.parameters())
    groups = [{"params": [p for p in params if p.dim() >= 2], "weight_decay": t.weight_decay},
              {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0}]
    opt = torch.optim.AdamW(groups, lr=t.learning_rate, betas=t.adam_betas, eps=t.adam_eps)
    losses = []
    for step in range(steps):
        for g in opt.param_groups:
            g["lr"] = lr_at(step, t)
        x, y = adapter.batch(step, 0, t.global_batch_size, t.seed)
        opt.zero_grad()
        loss = adapter.loss(model(x), y)
        loss.backward()
        grads = [p.grad for p in params if p.grad is not None]
        norm = torch.stack([g.double().square().sum() for g in grads]).sum().sqrt().float()
        if t.grad_clip > 0:
            torch.nn.utils.clip_grads_with_norm_(params, t.grad_clip, norm)
        opt.step()
        losses.append(loss.item())
    return losses
