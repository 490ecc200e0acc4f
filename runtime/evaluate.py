"""Evaluation: the mean next-token loss of a plan's model over the first N windows of a token file, in
order, computed under the plan's own layout (its ranks, TP/SP, PP with its schedule, CP, DP and ZeRO),
forward only: no gradients, no optimizer state. Used by ``autoplan eval`` (runtime/eval_launch.py) and by
``autoplan run --eval-every`` (runtime/trainer.py), so both report the same number for the same weights.

Windows: window i = ids [i*s, (i+1)*s + 1) of the file (s the plan's training seq_len; inputs window[:-1],
targets window[1:]), as training cuts them, but visited 0, 1, 2 ... rather than shuffled, so a figure means
the same windows whatever the plan. They are read one global batch G at a time (the plan's batch: stage
shapes are fixed per PipelineStage, and every rank's share and micro-batches are the training step's);
the last batch is padded to G with rows whose targets are ``IGNORE`` (-100, cross_entropy's ignore_index),
which add nothing to the summed loss and nothing to the token count. The mean is sum / count over all N*s
targets, not a mean of batch means.

Reduction: each rank that computes a loss (the single stage, or the last pipeline stage) sums its
per-token losses in float64 (fp32 per token, as training's loss, then summed without fp32 rounding) and
counts its targets; the pair is summed over the pipeline group (only the last stage's rank is non-zero)
and over the dp x cp ranks (different rows, or different tokens of the same rows). TP ranks hold the same
pair (replicated logits, or vocab-sharded ones reduced by ``loss_parallel``), so they are not summed.

Pipelines: an own forward-only runtime. torch's ``schedule.eval()`` on the training runtime runs the
training lists with each backward action a no-op; in torch 2.13 that works for the looped schedules but
fails for the V-shaped ones (zbv, dualpipev: the rank whose two stages are adjacent stops on "can't
steal_bwd_input if this stage doesn't have backward", stage.py ``set_local_bwd_input``, and its peer waits
for a transfer that never comes), and every switch between evaluation and training makes the runtime
redo its shape inference (a forward of the first micro-batch, and a backward on the way back to
training). So evaluation has its own ``_ForwardOnlyRuntime`` over new PipelineStage objects on the same
stage modules, loaded with ``forward_only_schedule``'s lists (autoplan/schema/schedule.py: each rank's
forwards in the order its training list runs them), which torch's own lowering passes turn into sends,
receives and FSDP unshard/reshard actions and torch's interpreter runs. One check of torch's stands in
the way and is replaced (see the class).

Model state: every stage model is put in eval mode for the pass (dropout off) and back in its previous
mode after it. FSDP modules are resharded afterwards: under ZeRO 1 and 2 (``reshard_after_forward=False``)
FSDP2 keeps every block's parameters gathered after a forward, for the backward that evaluation never
runs (measured: without the reshard they are still whole after the pass; ZeRO 3 reshards by itself), so
the memory evaluation used is given back before training goes on. Autocast as in training.
"""

from __future__ import annotations

import contextlib
import math
from dataclasses import dataclass

import numpy as np
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.distributed.fsdp import FSDPModule
from torch.distributed.pipelining import PipelineStage
from torch.distributed.pipelining.schedules import (
    _Action, _add_send_recv, _add_unshard_reshard, _ComputationType, _PipelineScheduleRuntime,
)
from torch.distributed.tensor import DTensor
from torch.distributed.tensor.parallel import loss_parallel

from autoplan.schema import Plan
from autoplan.schema.schedule import check_forward_only, forward_only_schedule
from autoplan.schema.token_file import describe_eval
from runtime.build import Parts
from runtime.device import autocast_dtype
from runtime.mesh import ParallelMesh
from runtime.parallel.context_parallel import shard_sequence
from runtime.train.data import TokenSource

IGNORE = -100
"""Target of a padding row: ``F.cross_entropy``'s default ignore_index (also under ``loss_parallel``)."""


@dataclass(frozen=True)
class EvalWindows:
    """The first ``sequences`` windows of a token file, in order (module docstring)."""

    source: TokenSource
    sequences: int

    @classmethod
    def open(cls, path: str, plan: Plan, sequences: int, flag: str = "--data", option: str = "--sequences"
             ) -> EvalWindows:
        """Checks the file against the plan's vocabulary and that it holds ``sequences`` windows (one
        SpecError line naming ``flag`` / ``option``; schema/token_file.py ``describe_eval``)."""
        t = plan.training
        describe_eval(path, plan.model.vocab_size, t.seq_len, sequences, flag, option)
        return cls(TokenSource(plan.model.vocab_size, t.seq_len, t.seed, path), sequences)

    def num_batches(self, global_batch: int) -> int:
        return math.ceil(self.sequences / global_batch)

    def replica_rows(self, batch: int, global_batch: int, dp: int, dp_rank: int) -> tuple[torch.Tensor, torch.Tensor]:
        """This dp rank's rows of eval batch ``batch`` (windows batch*G ...), padding rows past the last
        window: inputs 0, targets ``IGNORE``. Shapes [G / dp, T] whatever the padding."""
        per = global_batch // dp
        first = batch * global_batch + dp_rank * per
        wins = np.arange(first, min(first + per, self.sequences), dtype=np.int64)
        x = torch.zeros((per, self.source.seq_len), dtype=torch.int64)
        y = torch.full((per, self.source.seq_len), IGNORE, dtype=torch.int64)
        if len(wins):
            x[:len(wins)], y[:len(wins)] = self.source.rows(wins)
        return x, y


def summed_loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """[sum of the per-token losses, number of targets] in float64 for logits [B, T, V] (fp32 for the
    softmax, as training's ``cross_entropy``; vocab-sharded under ``loss_parallel``) and targets [B, T],
    where padding targets (``IGNORE``) count for nothing."""
    per_token = F.cross_entropy(logits.flatten(0, 1).float(), targets.flatten(0, 1), ignore_index=IGNORE,
                                reduction="none")
    if isinstance(per_token, DTensor):  # loss_parallel: every TP rank holds the same per-token losses
        per_token = per_token.full_tensor()
    count = (targets != IGNORE).sum()
    return torch.stack([per_token.double().sum(), count.double()])


class _EvalStage(PipelineStage):
    """A PipelineStage for a pass without backward: the last stage's output (the logits, the largest
    activation) is dropped from torch's forward cache as soon as the loss has read it, instead of being
    kept for a backward until the end of the batch."""

    def forward_one_chunk(self, fwd_chunk_id: int, *args, **kwargs):
        out = super().forward_one_chunk(fwd_chunk_id, *args, **kwargs)
        if self.is_last:
            self.fwd_cache.pop(fwd_chunk_id, None)
        return out


class _ForwardOnlyRuntime(_PipelineScheduleRuntime):
    """torch's schedule interpreter, loaded with forward-only lists.

    Why not ``_prepare_schedule_with_comms``: it first runs torch's ``_validate_schedule``, which demands a
    backward (B, or I and W) for every forward, so it refuses a forward-only list -- although its lowering
    passes and the interpreter handle one. ``load`` runs the same passes (``_add_unshard_reshard``, then
    ``_add_send_recv``; ``_add_reduce_grad`` would add nothing without backwards) after our own check
    (``check_forward_only``), with the stage-to-rank map read from the lists, as torch's check derives it.
    ``_has_backward`` is False although a loss function is given: the last stage computes its loss for
    every micro-batch (``_maybe_compute_loss``) and nothing builds a graph (no backward infrastructure,
    inputs received without ``requires_grad``), so ``step`` runs under ``torch.no_grad()``."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._has_backward = False

    def load(self, actions: dict[int, list[_Action]]) -> None:
        mapping = {a.stage_index: rank for rank, acts in actions.items() for a in acts}
        self.stage_index_to_group_rank = mapping
        for stage in self._stages:
            stage.stage_index_to_group_rank = mapping
        self.pipeline_order = {rank: list(acts) for rank, acts in actions.items()}
        self.pipeline_order_with_comms = _add_send_recv({r: _add_unshard_reshard(acts) for r, acts in actions.items()},
                                                        stage_to_rank=lambda s: mapping[s], num_stages=self._num_stages)


def forward_only_pipeline(plan: Plan, parts: Parts, pm: ParallelMesh) -> _ForwardOnlyRuntime:
    """Evaluation stages over this rank's stage models and the plan's forward-only lists, lowered by torch."""
    orders = forward_only_schedule(plan.schedule, plan.pp, plan.virtual_stages, plan.num_microbatches)
    check_forward_only(orders, plan.schedule, plan.pp, plan.num_stages, plan.num_microbatches)
    stages = [_EvalStage(m, sid, plan.num_stages, pm.device, group=pm.group("pp"))
              for sid, m in zip(parts.stage_ids, parts.models)]
    runtime = _ForwardOnlyRuntime(stages, n_microbatches=plan.num_microbatches, loss_fn=summed_loss)
    runtime.load({r: [_Action(a.stage, _ComputationType.FORWARD, a.microbatch) for a in acts]
                  for r, acts in orders.items()})
    return runtime


class Evaluator:
    """Forward-only loss of one rank's parts over eval windows; every rank of the plan calls ``loss``."""

    def __init__(self, plan: Plan, pm: ParallelMesh, parts: Parts) -> None:
        self.plan, self.pm, self.parts = plan, pm, parts
        self.amp = autocast_dtype(pm.device, plan.training.precision)
        self.pipeline = forward_only_pipeline(plan, parts, pm) if parts.schedule is not None else None

    def loss(self, windows: EvalWindows) -> tuple[float, int]:
        """(sum of the per-token losses, number of target tokens) over ``windows``, the same on every rank."""
        plan, pm, models = self.plan, self.pm, self.parts.models
        g = plan.training.global_batch_size
        total = torch.zeros(2, dtype=torch.float64, device=pm.device)
        modes = [m.training for m in models]
        for m in models:
            m.eval()
        try:
            with torch.no_grad(), self._autocast():
                for batch in range(windows.num_batches(g)):
                    x, y = windows.replica_rows(batch, g, plan.dp, pm.dp_rank)
                    x, y = x.to(pm.device), y.to(pm.device)
                    if self.parts.positions is not None:  # context parallelism: this rank's tokens
                        x, y = shard_sequence(x, self.parts.positions), shard_sequence(y, self.parts.positions)
                    total += self._pipelined(x, y) if self.pipeline is not None else self._single_stage(x, y)
        finally:
            for m, mode in zip(models, modes):
                m.train(mode)
            self._release()
        if plan.pp > 1:
            dist.all_reduce(total, group=pm.group("pp"))  # only the last stage's rank is non-zero
        if plan.dp_cp > 1:
            dist.all_reduce(total, group=pm.group("dp_cp"))
        return float(total[0]), int(round(float(total[1])))

    def mean_loss(self, windows: EvalWindows) -> float:
        summed, tokens = self.loss(windows)
        return summed / tokens

    def _autocast(self):
        if self.amp is None:
            return contextlib.nullcontext()
        return torch.autocast(self.pm.device.type, dtype=self.amp)

    def _single_stage(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """The plan's micro-batches one after another (the peak activation memory of one micro-batch)."""
        model, n = self.parts.models[0], self.plan.num_microbatches
        ctx = loss_parallel() if self.parts.loss_parallel else contextlib.nullcontext()
        out = torch.zeros(2, dtype=torch.float64, device=self.pm.device)
        with ctx:
            for xm, ym in zip(x.chunk(n), y.chunk(n)):
                out += summed_loss(model(xm), ym)
        return out

    def _pipelined(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        parts = self.parts
        losses: list[torch.Tensor] = []
        args = (x,) if parts.has_first else ()
        kwargs = {"target": y, "losses": losses} if parts.has_last else {}
        with loss_parallel() if parts.loss_parallel else contextlib.nullcontext():
            self.pipeline.step(*args, return_outputs=False, **kwargs)
        if not losses:
            return torch.zeros(2, dtype=torch.float64, device=self.pm.device)
        return torch.stack(losses).sum(0)

    def _release(self) -> None:
        """Free what the pass holds past its end: the pipeline stages' cached outputs and the parameters
        FSDP gathered (module docstring)."""
        if self.pipeline is not None:
            for stage in self.pipeline._stages:
                stage.clear_runtime_states()
        for model in self.parts.models:
            for module in model.modules():
                if isinstance(module, FSDPModule):
                    module.reshard()
