"""One training step and the loop around it, for every layout the plan can describe."""

from __future__ import annotations

import contextlib
import statistics
import time
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor
from torch.distributed.tensor.parallel import loss_parallel

from autoplan.schema import Plan
from autoplan.schema.fingerprint import plan_fingerprint
from runtime.build import Parts, build_parts, cross_entropy
from runtime.device import GIB, MemoryMeter, autocast_dtype
from runtime.evaluate import EvalWindows, Evaluator
from runtime.mesh import ParallelMesh
from runtime.models.moe import set_aux_loss_grad_scale
from runtime.parallel.context_parallel import shard_sequence
from runtime.parallel.data_parallel import local, set_microbatch_sync
from runtime.parallel.expert_parallel import aux_loss_share, update_plan_expert_biases
from runtime.train import checkpoint, guard
from runtime.train.data import TokenSource
from runtime.train.integrity import resume_point
from runtime.train.metrics_resume import trim_after
from runtime.train.metrics import MetricsLog
from runtime.train.optim import clip_grad_norm, lr_at, set_lr
from runtime.train.phase_clock import PhaseClock
from runtime.train.progress import StepLine
from runtime.train.profiling import StepTracer, instrument, region
from runtime.train.speed_probe import probe_between_steps
from runtime.train.trace_phases import BACKWARD, FORWARD


@dataclass
class StepResult:
    loss: float
    grad_norm: float
    step_time_s: float
    peak_bytes: int
    peak_bytes_per_rank: list[int]
    skipped: bool = False
    """fp16: the gradients overflowed at the loss scale, so no optimizer step was taken (runtime/train/loss_scale.py)."""


class Trainer:
    """Builds this rank's parts from the plan and runs optimizer steps; ``step(i)`` is step i (0-based)."""

    def __init__(self, plan: Plan, pm: ParallelMesh, data: TokenSource, init_from: Path | None = None) -> None:
        """``init_from``: a Hugging Face model folder the weights are read from (runtime/hf/load.py) instead
        of the plan's seeded initial values."""
        self.plan, self.pm, self.data = plan, pm, data
        self.meter = MemoryMeter(pm.device)
        self.parts: Parts = build_parts(plan, pm, self.meter, init_from=init_from)
        self.amp = autocast_dtype(pm.device, plan.training.precision)
        self.clock: PhaseClock | None = None
        """Set by ``run`` for ``--timeline``: times the phases of every step (runtime/train/phase_clock.py)."""

    def _phase(self, name: str):
        return self.clock.phase(name) if self.clock is not None else contextlib.nullcontext()

    def _autocast(self):
        if self.amp is None:
            return contextlib.nullcontext()
        return torch.autocast(self.pm.device.type, dtype=self.amp)

    def step(self, step: int) -> StepResult:
        plan, pm, parts = self.plan, self.pm, self.parts
        self.meter.reset()
        t0 = time.perf_counter()
        set_lr(parts.optimizer, lr_at(step, plan.training))
        parts.dropout.step = step
        self._scale_aux_loss()
        x, y = self._batch(step)
        parts.optimizer.zero_grad(set_to_none=True)
        with self._autocast():
            loss = self._pipelined(x, y) if parts.schedule is not None else self._single_stage(x, y)
        with self._phase("tied grads"):
            self._sum_tied_grads()
        with self._phase("clip"):
            parts.loss_scale.unscale_(parts.parameters())
            norm = clip_grad_norm(parts.parameters(), plan.training.grad_clip, pm.dims.stage_ranks,
                                  parts.clip_excluded)
        took = parts.loss_scale.update(float(norm))  # fp16: an overflow skips the step on every rank
        if took:
            parts.optimizer.step()
            update_plan_expert_biases(parts.models, pm)  # sigmoid routers (DeepSeek-V3): after the step
        with self._phase("loss"):
            loss = self._global_loss(loss)
        if pm.device.type == "cuda":
            torch.cuda.synchronize(pm.device)
        elapsed = time.perf_counter() - t0
        mine = torch.tensor([self.meter.peak()], dtype=torch.float64, device=pm.device)
        peaks = [torch.zeros_like(mine) for _ in range(dist.get_world_size())]
        dist.all_gather(peaks, mine)  # every rank's peak, for metrics per rank
        per_rank = [int(b) for b in torch.cat(peaks).tolist()]  # one device-to-host copy
        return StepResult(loss, float(norm), elapsed, max(per_rank), per_rank, skipped=not took)

    def _scale_aux_loss(self) -> None:
        """MoE models: the auxiliary loss joins the objective through each layer's output
        (runtime/models/moe.py ``AuxLossAutoScaler``, Megatron-Core's trick: under pipeline parallelism torch
        backpropagates only the last stage's loss), with the LM loss's backward scale -- the fp16 loss scale,
        and 1 / micro-batches where this trainer divides each micro-batch's loss (one stage; the pipeline
        schedule instead divides the gradients) -- times each rank's share (expert_parallel.py
        ``aux_loss_share``: 1 / tp). The loss reported is the LM loss alone."""
        parts = self.parts
        per_microbatch = 1.0 if parts.schedule is not None else 1.0 / self.plan.num_microbatches
        set_aux_loss_grad_scale(parts.models, float(parts.loss_scale.value) * per_microbatch
                                * aux_loss_share(self.pm.dims))

    def _batch(self, step: int) -> tuple[torch.Tensor, torch.Tensor]:
        """This replica's rows of step ``step``'s global batch, on the device (under CP: this rank's tokens)."""
        plan, pm, parts = self.plan, self.pm, self.parts
        x, y = self.data.replica_batch(step, plan.training.global_batch_size, plan.dp, pm.dp_rank)
        x, y = x.to(pm.device), y.to(pm.device)
        if parts.positions is not None:  # context parallelism: this rank's tokens of every sequence
            x, y = shard_sequence(x, parts.positions), shard_sequence(y, parts.positions)
        return x, y

    def _single_stage(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """Gradient accumulation over the plan's micro-batches; when grads are reduced over dp is the ZeRO
        stage's choice (runtime/parallel/data_parallel.py)."""
        plan, model, n = self.plan, self.parts.models[0], self.plan.num_microbatches
        first_row = self.pm.dp_rank * (plan.training.global_batch_size // plan.dp)
        total = torch.zeros((), device=self.pm.device)
        for i, (xm, ym) in enumerate(zip(x.chunk(n), y.chunk(n))):
            set_microbatch_sync(model, plan.zero_stage, i == n - 1)
            self.parts.dropout.first_row = first_row + i * plan.micro_batch_size
            ctx = loss_parallel() if self.parts.loss_parallel else contextlib.nullcontext()
            with ctx:
                with region(FORWARD, 0, i), self._phase(f"forward 0 {i}"):
                    loss = cross_entropy(model(xm), ym) / n
                with region(BACKWARD, 0, i), self._phase(f"backward 0 {i}"):
                    self.parts.loss_scale.scale(loss).backward()
            loss = loss.detach()
            total += loss.full_tensor() if isinstance(loss, DTensor) else loss
        return total

    def _pipelined(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        parts = self.parts
        args = (x,) if parts.has_first else ()
        losses: list[torch.Tensor] = []
        kwargs = {"target": y, "losses": losses} if parts.has_last else {}
        with loss_parallel() if parts.loss_parallel else contextlib.nullcontext():
            parts.schedule.step(*args, return_outputs=False, **kwargs)  # the losses are all we read: keep no logits
        if not parts.has_last:
            return torch.zeros((), device=self.pm.device)
        whole = [l.full_tensor() if isinstance(l, DTensor) else l for l in losses]
        return torch.stack([l.detach().float() for l in whole]).mean() / parts.loss_scale.value

    def _sum_tied_grads(self) -> None:
        """Tied embedding over pp > 1: sum the grads of the stage-0 embedding and the last-stage head copy
        (Megatron's embedding-group all-reduce), so both copies take the same optimizer step.

        The two copies have the same placements (vocabulary Shard(0) over tp, FSDP's Shard(0) over dp), but
        their grads need not: the vocabulary-parallel embedding's backward leaves a Replicate grad
        (the whole [V, H] on every TP rank) where the head's is Shard(0). Each grad is first put in its
        parameter's placements, so the two ranks of a pair all-reduce tensors of the same shape. In a
        V-shaped schedule both copies are on this rank (stages 0 and 2 pp - 1): they are summed here."""
        tied, group = self.parts.tied_params, self.pm.embedding_group
        if not tied or (group is None and len(tied) < 2):
            return
        for p in tied:
            if p.grad is None:
                p.grad = torch.zeros_like(p)
            elif isinstance(p.grad, DTensor) and p.grad.placements != p.placements:
                p.grad = p.grad.redistribute(p.device_mesh, p.placements)
        if len(tied) == 2:
            total = local(tied[0].grad) + local(tied[1].grad)
            for p in tied:
                local(p.grad).copy_(total)
            return
        dist.all_reduce(local(tied[0].grad), group=group)

    def _global_loss(self, loss: torch.Tensor) -> float:
        """Mean loss over the global batch, known on every rank: from the last pp rank, averaged over dp and
        cp (every CP rank's loss is the mean over the same number of tokens)."""
        loss = loss.float().reshape(1).clone()
        if self.plan.pp > 1:
            dist.all_reduce(loss, group=self.pm.group("pp"))  # only the last stage's rank is non-zero
        if self.plan.dp_cp > 1:
            dist.all_reduce(loss, op=dist.ReduceOp.AVG, group=self.pm.group("dp_cp"))
        return float(loss.item())


@dataclass
class RunOptions:
    steps: int
    metrics: str | None = None
    checkpoint_dir: str | None = None
    checkpoint_every: int = 0
    resume: bool = False
    log_every: int = 1
    trace: str | None = None
    """Folder for a profiler trace of a few steps after warm-up (runtime/train/profiling.py)."""
    timeline: str | None = None
    """File for every step's phases per rank, wall and CPU time (runtime/train/phase_clock.py)."""
    tensorboard: str | None = None
    """Folder for TensorBoard scalars of every step, written by rank 0 (runtime/train/tensorboard_log.py)."""
    eval_data: str | None = None
    """Token file for validation: its first ``eval_sequences`` windows, in order (runtime/evaluate.py)."""
    eval_every: int = 0
    """With ``eval_data``: evaluate after every K-th step, and after the last (0: after the last only)."""
    eval_sequences: int | None = None
    """Windows evaluated each time (None: one global batch)."""

    def eval_due(self, step: int) -> bool:
        """Whether validation runs after (1-based) step ``step``."""
        if self.eval_data is None:
            return False
        return step == self.steps or (self.eval_every > 0 and step % self.eval_every == 0)


def _eta(rows: list[dict], remaining: int) -> str:
    """Time left at the median of the recent steps (the first step, which pays one-off costs, left out)."""
    recent = [r["step_time_s"] for r in rows[1:][-20:]] or [r["step_time_s"] for r in rows]
    seconds = int(round(statistics.median(recent) * remaining))
    return f"{seconds // 3600}:{seconds // 60 % 60:02d}:{seconds % 60:02d}"


def run(trainer: Trainer, opts: RunOptions) -> list[float]:
    """Train from step 0 (or the newest complete checkpoint) to ``opts.steps``; returns the losses run."""
    parts, plan = trainer.parts, trainer.plan
    start, saved = 0, None
    if opts.checkpoint_dir:
        saved = resume_point(opts.checkpoint_dir, opts.resume, plan)  # the newest intact one, verified
        if saved is not None:
            start = checkpoint.load(saved, parts.models, parts.optimizer, plan.model)
    rank0 = dist.get_rank() == 0
    if rank0 and opts.metrics and start > 0:
        trim_after(opts.metrics, start)  # rows past the checkpoint are about to be run again
    pred = plan.predicted
    log = MetricsLog(opts.metrics if rank0 else None, pred.step_time_s if pred else None,
                     pred.peak_memory_gib if pred else None, append=start > 0,
                     calibrated_probes_us=(plan.cluster.device.probe_gemm_us, plan.cluster.device.probe_op_us),
                     plan_fingerprint=plan_fingerprint(plan), knobs=plan.training.knobs())
    board = None
    if opts.tensorboard and rank0:
        from runtime.train.tensorboard_log import TensorBoardLog
        board = TensorBoardLog(opts.tensorboard)
    tokens = plan.training.global_batch_size * plan.training.seq_len
    tracer = StepTracer(opts.trace, start, opts.steps, trainer.pm.device, plan.zero_stage) if opts.trace else None
    if tracer:
        instrument(parts)
    if opts.timeline:
        trainer.clock = PhaseClock()
        trainer.clock.attach(parts)
    validation = None
    if opts.eval_data is not None:  # the windows are checked on every rank before the first step
        windows = EvalWindows.open(opts.eval_data, plan, opts.eval_sequences or plan.training.global_batch_size,
                                   flag="--eval-data", option="--eval-sequences")
        validation = (Evaluator(plan, trainer.pm, parts), windows)
    losses = []
    line = StepLine()  # in place on a terminal, plain lines when piped (train/progress.py)
    for step in range(start, opts.steps):
        with tracer.step(step) if tracer else contextlib.nullcontext(), trainer._phase(f"step {step + 1}"):
            r = trainer.step(step)
        # a loss-scaled step skipped for overflow has an infinite norm by design; its loss must still be finite
        guard.check_step(step + 1, r.loss, None if r.skipped else r.grad_norm, saved)
        losses.append(r.loss)
        probe = probe_between_steps(trainer.pm.device)  # the host's speed now, outside the timed step
        eval_loss = None
        if validation is not None and opts.eval_due(step + 1):
            with trainer._phase(f"eval {step + 1}"):  # outside the step: its time is not the step's
                eval_loss = validation[0].mean_loss(validation[1])
        row = log.record(step + 1, r.loss, r.step_time_s, tokens, r.peak_bytes / GIB,
                         lr_at(step, plan.training), r.grad_norm, [b / GIB for b in r.peak_bytes_per_rank],
                         profiled=bool(tracer) and step in tracer.traced, speed_probe=probe,
                         reserved_gib=trainer.meter.peak_reserved() / GIB if trainer.meter.on_cuda else None,
                         eval_loss=eval_loss)
        if board is not None:
            board.record(row)
        if rank0 and opts.log_every and (step + 1) % opts.log_every == 0:
            line.step(f"step {row['step']:>5}/{opts.steps}  loss {r.loss:.4f}  {r.step_time_s * 1e3:8.1f} ms  "
                      f"{row['tokens_per_s']:>10} tok/s  peak {row['peak_memory_gib']:.3f} GiB  "
                      f"ETA {_eta(log.rows, opts.steps - step - 1)}")
        if rank0 and eval_loss is not None:
            line.keep(f"eval step {step + 1}  loss {eval_loss:.4f}")
        if opts.checkpoint_dir and opts.checkpoint_every and (step + 1) % opts.checkpoint_every == 0:
            guard.check_weights(parts.parameters(), step + 1, saved, trainer.pm.device)
            saved = checkpoint.save(opts.checkpoint_dir, step + 1, parts.models, parts.optimizer, plan.model, plan)
    if tracer:
        tracer.finish(trainer.pm, {"model": plan.model.name, "device": trainer.pm.device.type,
                                   **plan.dims.as_dict(), "zero_stage": plan.zero_stage, "schedule": plan.schedule})
    if trainer.clock is not None:
        trainer.clock.finish(opts.timeline, dist.get_rank(), {"model": plan.model.name, **plan.dims.as_dict(),
                                                              "schedule": plan.schedule,
                                                              "num_microbatches": plan.num_microbatches})
    if board is not None:
        board.close()
    if rank0:
        line.keep(log.summary())
    return losses
