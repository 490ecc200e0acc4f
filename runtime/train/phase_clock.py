"""``--timeline FILE``: when each rank's phases of every step began and ended, by the wall clock and by
the rank's own CPU time, written as one Chrome/Perfetto trace (one process per rank).

Why beside ``--trace``: the profiler records every op, which on a small CPU model can double the step, so
it cannot show where an untraced step's time goes. A
phase here costs two clock reads on entry and two on exit (a few microseconds), on every step. And the
training thread's CPU time beside its wall time tells the two ways a phase is slow apart: CPU well below
wall is a rank that waited (for a peer, a collective's slowest member) or was preempted by ranks that
share its cores; CPU near wall is work the rank did itself. That split is what the shared-cores terms of
the cost model (autoplan/cost/cpu_host/) predict, and it was first measured this way.

Phases: ``step N`` around each optimizer step; inside it ``forward S M`` / ``backward S M`` (one stage's
compute of one micro-batch, wrapped on torch's PipelineStage as ``--trace`` labels it, or the single-stage
loop's own), ``pipeline`` (torch's schedule.step: actions, transfers, its gradient reduction),
``tied grads``, ``clip`` (the gradient norm and its all-reduce), ``optimizer`` and ``loss`` (the global
loss's all-reduces). Wall times are CLOCK_MONOTONIC, shared by the processes of one host; ranks of
different hosts are not aligned.
"""

from __future__ import annotations

import functools
import json
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Callable, Iterator

import torch.distributed as dist

from autoplan.schema._io import write_atomic

Phase = tuple[str, float, float, float]
"""(name, wall start s, wall end s, training-thread CPU s)."""


class PhaseClock:
    """One rank's phases; ``phase(name)`` times a block, ``wrap(fn, name)`` a callable, ``finish`` writes."""

    def __init__(self) -> None:
        self.phases: list[Phase] = []

    @contextmanager
    def phase(self, name: str) -> Iterator[None]:
        wall, cpu = time.monotonic(), time.thread_time()
        try:
            yield
        finally:
            self.phases.append((name, wall, time.monotonic(), time.thread_time() - cpu))

    def wrap(self, fn: Callable, name: Callable[..., str] | str) -> Callable:
        """``fn`` timed as a phase; ``name`` may be a function of fn's arguments."""
        @functools.wraps(fn)
        def timed(*args, **kwargs):
            with self.phase(name(*args, **kwargs) if callable(name) else name):
                return fn(*args, **kwargs)
        return timed

    def attach(self, parts) -> None:
        """Time this rank's pipeline stages' forward / backward of each micro-batch, the schedule's step and
        the optimizer step (the single-stage loop times its own forward and backward)."""
        schedule = parts.schedule
        if schedule is not None:
            # private attributes of torch's schedules, as profiling.instrument uses them
            for stage in getattr(schedule, "_stages", None) or [schedule._stage]:
                for method, kind in (("forward_one_chunk", "forward"), ("backward_one_chunk", "backward"),
                                     ("backward_weight_one_chunk", "backward_weight")):
                    if hasattr(stage, method):
                        setattr(stage, method, self.wrap(getattr(stage, method),
                                                         functools.partial(_chunk_name, kind, stage.stage_index)))
            schedule.step = self.wrap(schedule.step, "pipeline")
        parts.optimizer.step = self.wrap(parts.optimizer.step, "optimizer")

    def finish(self, path: str, rank: int, meta: dict[str, Any]) -> None:
        """Gather every rank's phases on rank 0, which writes ``path`` (atomically). Every rank must call it."""
        everyone = [None] * dist.get_world_size() if rank == 0 else None
        dist.gather_object(self.phases, everyone, dst=0)
        if rank == 0:
            write_atomic(Path(path), json.dumps(timeline_trace(everyone, meta)))


def _chunk_name(kind: str, stage: int, chunk_id: int, *args, **kwargs) -> str:
    return f"{kind} {stage} {chunk_id}"


def timeline_trace(ranks: list[list[Phase]], meta: dict[str, Any]) -> dict[str, Any]:
    """Chrome trace events, one process per rank, in microseconds from the earliest phase of any rank;
    each event's args hold its CPU time and CPU / wall."""
    start = min((p[1] for phases in ranks for p in phases), default=0.0)
    events: list[dict[str, Any]] = []
    for rank, phases in enumerate(ranks):
        events.append({"ph": "M", "name": "process_name", "pid": rank, "tid": 0, "args": {"name": f"rank {rank}"}})
        for name, t0, t1, cpu in phases:
            wall = t1 - t0
            events.append({"ph": "X", "name": name, "pid": rank, "tid": 0, "ts": (t0 - start) * 1e6,
                           "dur": wall * 1e6, "args": {"cpu_ms": cpu * 1e3,
                                                       "cpu_share": cpu / wall if wall > 0 else 1.0}})
    return {"traceEvents": events, "displayTimeUnit": "ms", "otherData": {"autoplan_timeline": meta}}
