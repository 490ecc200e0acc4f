"""``--trace DIR``: a torch profiler trace of a few steps after warm-up on every rank, split into the terms
of the cost model (runtime/train/trace_phases.py) and written in the shape of ``autoplan show --trace``.

Files in DIR: ``rank{R}.torch.json`` (torch's own Chrome trace of rank R: every op, and CUDA kernels on
GPUs), ``rank{R}.json`` (rank R in autoplan's step-trace shape) and, from rank 0, ``merged.json`` (every
rank, one process each, aligned on its first traced step's start) which ``autoplan compare --trace``
reads. Traced steps are slower than the others (the profiler records every op): their metrics rows carry
``"profiled": true``.

Labels: ``record_function`` around each step, each stage's forward / backward of each micro-batch (torch
2.13's Schedule1F1B labels nothing, ScheduleGPipe's ``Forward i`` and _PipelineScheduleRuntime's ``PP:0F0``
include the wait for the peer, so the stage's ``forward_one_chunk`` / ``backward_one_chunk`` are wrapped
on the instance), the pipeline loss, and the forward of each block (or attention core) that recomputes in
backward, which tells recomputation from the first forward. All of it only when tracing.
"""

from __future__ import annotations

import functools
import json
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Callable, Iterator

import torch
import torch.distributed as dist
from torch.profiler import ProfilerActivity, record_function

from autoplan.schema._io import write_atomic
from runtime.train.trace_phases import (
    BACKWARD, BACKWARD_WEIGHT, FORWARD, LOSS, RECOMPUTABLE, STEP, merged_trace, rank_phases,
)

WARMUP_STEPS = 2
"""Untraced steps wanted before the traced ones: the first pays one-off costs (allocation, shape
inference, connections)."""
TRACED_STEPS = 3


def region(kind: str, stage: int, microbatch: int):
    """The label of one stage's forward (``FORWARD``) or backward (``BACKWARD``) of one micro-batch, for
    code that runs them itself (the trainer's single-stage loop); about a microsecond when not tracing."""
    return record_function(f"{kind} {stage} {microbatch}")


def traced_window(first_step: int, last_step: int) -> tuple[int, int]:
    """(steps before, steps traced) for a run of steps [first_step, last_step): the last TRACED_STEPS
    steps, fewer when that would leave under WARMUP_STEPS before them, and always at least one. The last,
    because traced steps are slower and, on CPU, the profiler's buffers sit in the heap that peak memory
    measures: the steps before them are measured clean."""
    n = last_step - first_step
    traced = max(1, min(TRACED_STEPS, n - WARMUP_STEPS))
    return n - traced, traced


class StepTracer:
    """One rank's profiler; ``step(i)`` wraps step i, ``finish()`` writes the files (a collective)."""

    def __init__(self, trace_dir: str, first_step: int, last_step: int, device: torch.device, zero_stage: int) -> None:
        self.dir = Path(trace_dir)
        self.dir.mkdir(parents=True, exist_ok=True)
        self.rank = dist.get_rank()
        self.zero_stage = zero_stage
        self.raw_path = self.dir / f"rank{self.rank}.torch.json"
        self.raw_path.unlink(missing_ok=True)  # a stale trace must not pass for this run's
        skip, traced = traced_window(first_step, last_step)
        self.traced = range(first_step + skip, first_step + skip + traced)
        activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
        # one profiler warm-up step when there is room (its first recorded step is slow otherwise)
        warmup = min(1, skip)
        self.profiler = torch.profiler.profile(
            activities=activities, on_trace_ready=self._export,
            schedule=torch.profiler.schedule(wait=skip - warmup, warmup=warmup, active=traced, repeat=1))
        self.profiler.start()

    def _export(self, prof) -> None:
        prof.export_chrome_trace(str(self.raw_path))

    @contextmanager
    def step(self, step: int) -> Iterator[None]:
        """Wrap 0-based step ``step``; labelled ``step + 1``, the number of its metrics row."""
        with record_function(f"{STEP} {step + 1}"):
            yield
        self.profiler.step()

    def finish(self, pm, meta: dict[str, Any]) -> None:
        """Stop, split this rank's steps into terms, write rank{R}.json; rank 0 gathers every rank's and
        writes merged.json. Every rank must call it (gather_object)."""
        self.profiler.stop()
        events = json.loads(self.raw_path.read_text())["traceEvents"] if self.raw_path.exists() else []
        phases = rank_phases(events, self.zero_stage)
        phases.update(rank=self.rank, pp_rank=pm.pp_rank, dp_rank=pm.dp_rank, cp_rank=pm.cp_rank,
                      tp_rank=pm.tp_rank)
        write_atomic(self.dir / f"rank{self.rank}.json", json.dumps(merged_trace([phases], meta)))
        everyone = [None] * dist.get_world_size() if self.rank == 0 else None
        dist.gather_object(phases, everyone, dst=0)
        if self.rank == 0:
            write_atomic(self.dir / "merged.json", json.dumps(merged_trace(everyone, meta)))


def instrument(parts) -> None:
    """Label this rank's pipeline stages, pipeline loss and recomputing blocks (see the module docstring)."""
    schedule = parts.schedule
    if schedule is not None:
        # private attributes of torch's schedules: _stages (multi-stage) / _stage (single), _loss_fn
        for stage in getattr(schedule, "_stages", None) or [schedule._stage]:
            for method, kind in (("forward_one_chunk", FORWARD), ("backward_one_chunk", BACKWARD),
                                 ("backward_weight_one_chunk", BACKWARD_WEIGHT)):
                if hasattr(stage, method):
                    setattr(stage, method, _chunk_labelled(getattr(stage, method), kind, stage.stage_index))
        if getattr(schedule, "_loss_fn", None) is not None:
            schedule._loss_fn = _labelled(schedule._loss_fn, LOSS)
    for model in parts.models:
        for block in model.blocks.values():
            inner = getattr(block, "_checkpoint_wrapped_module", None)
            if inner is not None:  # full recomputation: the block's forward reruns in backward
                inner.forward = _labelled(inner.forward, RECOMPUTABLE)
            core = getattr(getattr(inner or block, "attn", None), "core", None)
            if getattr(core, "recompute", False) and hasattr(core, "_attend"):  # selective: the attention core
                core._attend = _labelled(core._attend, RECOMPUTABLE)


def _labelled(fn: Callable, name: str) -> Callable:
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        with record_function(name):
            return fn(*args, **kwargs)
    return wrapper


def _chunk_labelled(fn: Callable, kind: str, stage_index: int) -> Callable:
    """A stage method whose first argument is the micro-batch index (fwd_chunk_id / bwd_chunk_id)."""
    @functools.wraps(fn)
    def wrapper(chunk_id, *args, **kwargs):
        with record_function(f"{kind} {stage_index} {chunk_id}"):
            return fn(chunk_id, *args, **kwargs)
    return wrapper
