"""The simulated step as a Chrome / Perfetto trace (``autoplan show --trace``); the format, its vocabulary
and ``check_trace`` are autoplan/schema/trace.py's.

Per pipeline rank (one process), track ``schedule``: each forward and backward where the simulator placed
it (args: stage, micro-batch, action as torch prints it), a nested ``recompute`` slice at the start of a
backward that recomputes (its length is the recomputation the cost model charges; in a real run it is
spread over the stage's blocks), then the exposed data-parallel reduction and the optimizer step after the
rank's last backward, and ``bubble`` wherever the rank is idle. Tracks ``p2p``: every activation or
gradient transfer into the rank, from the sender's end to the time the receiver may start (lanes so that
overlapping transfers do not share a track).
"""

from __future__ import annotations

import json
import os
from typing import Any

from autoplan.cost.simulate import data_dependencies
from autoplan.schema.schedule import Action
from autoplan.report.simulated import SimulatedStep, terms_of
from autoplan.report.tables import layout_label
from autoplan.schema._io import write_atomic
from autoplan.schema.trace import (
    BACKWARD, FORWARD, P2P_THREAD, SCHEDULE_THREAD, SLICE_NAMES, TRACE_FORMAT, process_metadata, slice_event,
)

_NS_PER_US = 1e3
_MIN_US = 1e-6  # gaps shorter than this are float rounding, not idle time


def lane_of(intervals: list[tuple[float, float]]) -> list[int]:
    """Greedy lanes for (start, end) intervals so that no two in one lane overlap (input in any order)."""
    lanes_end: list[float] = []
    lanes = [0] * len(intervals)
    for i in sorted(range(len(intervals)), key=lambda k: intervals[k]):
        start, end = intervals[i]
        free = next((k for k, e in enumerate(lanes_end) if e <= start + _MIN_US), None)
        if free is None:
            free = len(lanes_end)
            lanes_end.append(end)
        lanes_end[free] = end
        lanes[i] = free
    return lanes


def simulated_trace(sim: SimulatedStep) -> dict[str, Any]:
    plan, ev, tl = sim.plan, sim.evaluation, sim.evaluation.timeline
    pp, step_us = plan.pp, ev.step_ns / _NS_PER_US
    events: list[dict] = []
    busy: dict[int, list[tuple[float, float]]] = {r: [] for r in range(pp)}
    transfers: dict[int, list[tuple[float, float, dict]]] = {r: [] for r in range(pp)}
    index = {a: i for i, a in enumerate(tl.actions)}
    for i, a in enumerate(tl.actions):
        rank, start, end = tl.ranks[i], tl.start[i] / _NS_PER_US, tl.end[i] / _NS_PER_US
        args = {"stage": a.stage, "microbatch": a.microbatch, "action": str(a),
                **({"part": "input" if a.kind == "I" else "weights"} if a.kind in "IW" else {})}
        events.append(slice_event(FORWARD if a.kind == "F" else BACKWARD, rank, SCHEDULE_THREAD, start, end,
                                  "compute", args))
        busy[rank].append((start, end))
        recompute_us = sim.recompute_ns(a.stage) / _NS_PER_US if a.kind in "BI" else 0.0
        if recompute_us > 0:
            events.append(slice_event(SLICE_NAMES["recompute"], rank, SCHEDULE_THREAD, start, start + recompute_us,
                                      "recompute", args))
        for dep in data_dependencies(a, sim.table.num_stages):
            if dep.stage == a.stage:
                continue
            # a backward waits for the next stage's backward: full ("B") or, split, its input part ("I")
            found = index.get(dep, index.get(Action(dep.stage, "I", dep.microbatch)))
            sent = tl.end[found] / _NS_PER_US
            transfers[rank].append((sent, sent + sim.table.p2p_ns[min(dep.stage, a.stage)] / _NS_PER_US,
                                    {"from_stage": dep.stage, "to_stage": a.stage, "microbatch": a.microbatch,
                                     "carries": "activation" if a.kind == "F" else "gradient"}))
    for rank in range(pp):
        for term, start_ns, end_ns in sim.tail_slices_ns(rank):
            start, end = start_ns / _NS_PER_US, end_ns / _NS_PER_US
            events.append(slice_event(SLICE_NAMES[term], rank, SCHEDULE_THREAD, start, end, term))
            busy[rank].append((start, end))
        events += _bubbles(rank, sorted(busy[rank]), step_us)
        lanes = lane_of([(s, e) for s, e, _ in transfers[rank]])
        for (start, stop, args), lane in zip(transfers[rank], lanes):
            events.append(slice_event(SLICE_NAMES["pp_comm"], rank, P2P_THREAD + lane, start, stop, "pp_comm", args))
        threads = {SCHEDULE_THREAD: "schedule", **{P2P_THREAD + k: f"p2p in ({k})" for k in range(max(lanes, default=-1) + 1)}}
        stages = ", ".join(str(s) for s in sim.table.stages_of(rank))
        events[:0] = process_metadata(rank, f"pipeline rank {rank} (stages {stages}), simulated", threads)
    return {"traceEvents": events, "displayTimeUnit": "ms", "otherData": {"autoplan": _summary(sim)}}


def _bubbles(rank: int, busy: list[tuple[float, float]], step_us: float) -> list[dict]:
    out, cursor = [], 0.0
    for start, end in busy + [(step_us, step_us)]:
        if start - cursor > _MIN_US:
            out.append(slice_event(SLICE_NAMES["bubble"], rank, SCHEDULE_THREAD, cursor, start, "bubble"))
        cursor = max(cursor, end)
    return out


def _summary(sim: SimulatedStep) -> dict[str, Any]:
    ev = sim.evaluation
    return {
        "format": TRACE_FORMAT, "source": "simulated", "model": sim.plan.model.name, "layout": layout_label(sim.plan),
        "step_time_s": sim.step_s, "critical_rank": ev.critical_rank,
        "ranks": {str(r): {"pp_rank": r, "terms_s": terms_of(sim.time_per_rank[r]),
                           "memory_gib": sim.memory_per_rank[r].total_gib} for r in range(sim.plan.pp)},
    }


def write_trace(path: str | os.PathLike, trace: dict[str, Any]) -> None:
    write_atomic(path, json.dumps(trace, separators=(",", ":")))
