"""Test helpers: hand-made plans from a few numbers, and the serial single-process reference run."""

from __future__ import annotations

import dataclasses

from autoplan.schema import ModelSpec, Plan, Stage, TrainingSetup, check_fits, load_cluster, load_model
from autoplan.schema.schedule import stage_rank


def finish_worker(out_path: str, results: dict) -> None:
    """The end of every torchrun test worker: rank 0 writes ``results`` as JSON to ``out_path``, then every
    rank leaves the process group, after a barrier (exits are flaky without one: runtime-notes §7)."""
    import json

    import torch.distributed as dist

    if dist.get_rank() == 0:
        with open(out_path, "w") as f:
            json.dump(results, f, indent=1)
    dist.barrier()
    dist.destroy_process_group()


def even_sizes(num_layers: int, num_stages: int) -> list[int]:
    base, extra = divmod(num_layers, num_stages)
    return [base + (i < extra) for i in range(num_stages)]


def as_recorded(actions: list[str]) -> list[str]:
    """What rt_worker.py's hooks record of an action list: forwards, and a backward ("B") when the stage's
    output gradient arrives, which is when a full or an input backward runs; a weight backward leaves no trace."""
    return [a.replace("I", "B") for a in actions if "W" not in a]


def make_plan(model: "str | ModelSpec" = "gpt-tiny", tp: int = 1, pp: int = 1, dp: int = 1, *, cp: int = 1,
              schedule: str = "1f1b",
              virtual_stages: int = 1, stage_sizes: list[int] | None = None, full: tuple[int, ...] = (),
              selective: tuple[int, ...] = (), zero: int = 0, sp: bool = False, offload: bool = False,
              micro_batch_size: int = 2, num_microbatches: int | None = None, seq_len: int = 32,
              seed: int = 0, dropout: float | None = None, **training) -> Plan:
    """A validated Plan for cpu-local with tp*cp*pp*dp devices, fp32 (exact comparisons need fp32)."""
    spec = model if isinstance(model, ModelSpec) else load_model(model)
    if dropout is not None:
        spec = dataclasses.replace(spec, dropout=dropout)
    if pp == 1 and schedule == "1f1b":
        schedule = "gpipe"  # one stage: the schedule is irrelevant; gpipe has no micro-batch floor
    n_mb = num_microbatches if num_microbatches is not None else max(2, pp)
    num_stages = pp * virtual_stages
    sizes = stage_sizes or even_sizes(spec.num_layers, num_stages)
    stages, start = [], 0
    for i, n in enumerate(sizes):
        layers = range(start, start + n)
        stages.append(Stage(index=i, rank=stage_rank(schedule, i, pp), layers=(start, start + n),
                            full_recompute=tuple(k for k in full if k in layers),
                            selective_recompute=tuple(k for k in selective if k in layers)))
        start += n
    cluster = dataclasses.replace(load_cluster("cpu-local"), devices_per_node=tp * cp * pp * dp)
    train = TrainingSetup(global_batch_size=micro_batch_size * n_mb * dp, seq_len=seq_len, precision="fp32",
                          seed=seed, **({"warmup_steps": 2, "learning_rate": 1e-2} | training))
    plan = Plan(tp=tp, pp=pp, dp=dp, cp=cp, sequence_parallel=sp, zero_stage=zero, offload_optimizer=offload,
                schedule=schedule, virtual_stages=virtual_stages, micro_batch_size=micro_batch_size,
                num_microbatches=n_mb, stages=tuple(stages), model=spec, cluster=cluster, training=train)
    check_fits(plan.layout(), spec, train, cluster.num_devices)
    return plan


def reference_optimizer(params: list, t: TrainingSetup):
    """The plan's optimizer written with plain torch (default foreach kernels): weight decay on matrices only."""
    import torch

    groups = [{"params": [p for p in params if p.dim() >= 2], "weight_decay": t.weight_decay},
              {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0}]
    if t.optimizer == "sgd":
        return torch.optim.SGD(groups, lr=t.learning_rate, momentum=t.sgd_momentum)
    return torch.optim.AdamW(groups, lr=t.learning_rate, betas=t.adam_betas, eps=t.adam_eps)


def reference_steps(params: list, t: TrainingSetup, steps: int, loss_at) -> tuple[list[float], list[float]]:
    """``steps`` optimizer steps of a serial reference, ``loss_at(step)`` giving the step's loss (its forward):
    the runtime's LR formula, then the global gradient norm in fp64 and torch's clipping formula (torch's fp32
    norm of one large tensor is off by ~4e-5 relative -- gpt-tiny's 50,432 x 64 head: 0.70387 vs 0.70390 --
    more than the sharded runtime's sum of per-shard squares, and would fail the 1e-5 comparison on the
    reference's side). Returns the losses and the norms."""
    import torch

    from runtime.train.optim import lr_at

    opt = reference_optimizer(params, t)
    losses, norms = [], []
    for step in range(steps):
        for g in opt.param_groups:
            g["lr"] = lr_at(step, t)
        opt.zero_grad()
        loss = loss_at(step)
        loss.backward()
        grads = [p.grad for p in params if p.grad is not None]
        norm = torch.stack([g.double().square().sum() for g in grads]).sum().sqrt().float()
        if t.grad_clip > 0:
            torch.nn.utils.clip_grads_with_norm_(params, t.grad_clip, norm)
        opt.step()
        losses.append(loss.item())
        norms.append(norm.item())
    return losses, norms


def serial_run(plan: Plan, steps: int, data_path: str | None = None) -> tuple[list[float], list[float]]:
    """The same model and global batches trained in one process with plain PyTorch: the reference.

    Shares only the model code (with its initial values and dropout masks), the data source and the LR
    formula with the runtime; the optimizer, clipping (an fp64 norm, torch.nn.utils.clip_grads_with_norm_)
    and the loss are written out here independently, with torch's default (foreach) kernels.
    """
    import torch.nn.functional as F

    from runtime.models import build_model
    from runtime.models.dropout import DropoutState, attach
    from runtime.train.data import TokenSource

    t = plan.training
    model = build_model(plan.model, seq_len=t.seq_len, seed=t.seed)
    dropout = DropoutState(t.seed)  # the whole global batch at once: its first row is row 0
    attach(model, dropout)
    data = TokenSource(plan.model.vocab_size, t.seq_len, t.seed, data_path)

    def loss_at(step: int):
        dropout.step = step
        x, y = data.global_batch(step, t.global_batch_size)
        return F.cross_entropy(model(x).flatten(0, 1), y.flatten())

    return reference_steps(list(model.parameters()), t, steps, loss_at)
