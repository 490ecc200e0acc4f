"""Pipeline parallelism: the plan's stage split and torch.distributed.pipelining's schedules.

Stages are cut by hand (runtime-notes §3): each stage is a deep copy of the full model keeping only the
blocks in ``stage.layers``; ``embed`` is dropped from all but stage 0 and ``norm``/``head`` from all but
the last. Block keys stay global ("5"), so a stage's parameter names are the full model's.
Stage ``i`` runs on pipeline rank ``i % pp`` (looped placement, what ScheduleInterleaved1F1B expects).
"""

from __future__ import annotations

import copy
from typing import Callable

import torch
from torch import nn
from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe, ScheduleInterleaved1F1B

from autoplan.schema import Stage

SCHEDULES = {"gpipe": ScheduleGPipe, "1f1b": Schedule1F1B, "interleaved": ScheduleInterleaved1F1B}


def split_stage(full: nn.Module, stage: Stage, num_stages: int) -> nn.Module:
    """The sub-model of one pipeline stage (a deep copy: ``full`` is left whole)."""
    model = copy.deepcopy(full)
    first, stop = stage.layers
    for key in [k for k in model.blocks if not first <= int(k) < stop]:
        del model.blocks[key]
    if stage.index != 0:
        model.embed = None
    if stage.index != num_stages - 1:
        model.norm = None
        model.head = None
    return model


def build_pipeline(models: list[nn.Module], stage_ids: list[int], num_stages: int, schedule: str,
                   num_microbatches: int, loss_fn: Callable, device: torch.device, pp_group):
    """PipelineStage for each local stage model and the plan's schedule over them."""
    stages = [PipelineStage(m, i, num_stages, device, group=pp_group) for m, i in zip(models, stage_ids)]
    cls = SCHEDULES[schedule]
    # scale_grads=True (default): each micro-batch loss is a mean, grads are divided by the micro-batch
    # count, so the step's gradient is the mean over the replica's batch, as in the serial run.
    if schedule == "interleaved":
        return cls(stages, n_microbatches=num_microbatches, loss_fn=loss_fn)
    return cls(stages[0], n_microbatches=num_microbatches, loss_fn=loss_fn)
