"""From a torch profiler trace of one rank to the terms of its steps, in autoplan's step-trace shape
(autoplan/schema/trace.py), so that a measured step reads like the simulated one. Plain Python over the
Chrome trace events (no torch): unit-tested on hand-made traces.

Labels (``runtime/train/profiling.py`` sets them with ``torch.profiler.record_function``):
``autoplan:step N`` around each optimizer step, ``autoplan:forward S M`` / ``autoplan:backward S M`` /
``autoplan:backward_weight S M`` around one stage's compute of one micro-batch, ``autoplan:loss``, and
``autoplan:recomputable`` around the forward of a block (or attention core) that recomputes in backward,
``autoplan:ring_attention`` around context parallelism's ring (runtime/parallel/context_parallel.py).
torch's own labels used as context: ``FSDP::...`` (FSDP2 / replicate: unshard and all-gather, gradient
reduction) and ``Optimizer.step#...`` / ``Optimizer.zero_grad#...``. torch 2.13's ``ScheduleGPipe``
(``Forward i``) and ``_PipelineScheduleRuntime`` (``PP:0F0``) labels enclose the wait for the peer's
activation as well as the compute, so they are not used.

How a moment of a step is classified, from the stack of events open on the training thread (innermost
context wins):
* inside a communication op (``c10d::*``, ``_c10d_functional::*``, NCCL kernels): ``pp_comm`` for
  send/recv, otherwise by context: FSDP gather -> ``zero3_gather`` (ZeRO-3) or ``dp_comm``; FSDP
  reduction or optimizer (ZeRO-1 broadcasts) -> ``dp_comm``; inside the ring attention -> ``cp_comm``;
  an all-to-all in forward/backward (MoE dispatch and combine, runtime/parallel/expert_parallel.py) ->
  ``ep_comm``; other forward/backward collectives -> ``tp_comm``; none -> ``other``;
* else by context: a recomputable forward inside a backward -> ``recompute``; forward, backward, loss ->
  ``compute``; FSDP -> as above; optimizer -> ``optimizer``;
* else ``other`` inside any op (data, loss and norm reductions, ...), ``bubble`` when no op runs: the rank
  waits (for a peer's activation, for a collective's slowest member) or runs plain Python between ops;
  a pause under ``SHORT_PAUSE_US`` between two pieces of the same term counts in that term.
A blocking collective's wait after its op returns counts as ``bubble``: it is waiting for the slowest rank.

On GPUs (the trace has kernels) the split is of device time instead: each kernel takes the term of the op
that launched it (its own thread's stack, or the training thread's at launch when the op ran on autograd's
device thread), overlapping kernels count once (compute before communication: overlapped communication
is hidden, as the cost model assumes), and time with no kernel running is ``bubble``.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass
from typing import Any

from autoplan.schema.trace import MEASURED_TERMS as TERMS
from autoplan.schema.trace import (
    SCHEDULE_THREAD, SLICE_NAMES, SPLIT_THREAD, TRACE_FORMAT, process_metadata, slice_event,
)

STEP, FORWARD, BACKWARD, BACKWARD_WEIGHT, LOSS, RECOMPUTABLE = (
    "autoplan:step", "autoplan:forward", "autoplan:backward", "autoplan:backward_weight", "autoplan:loss",
    "autoplan:recomputable")
RING = "autoplan:ring_attention"
DEVICE_CATS = ("kernel", "gpu_memcpy", "gpu_memset")
SHORT_PAUSE_US = 20.0
"""Longer than the interpreter takes between two ops of one loop (a few us on a loaded 2-core machine),
shorter than any wait for a peer (a gloo round trip is ~100 us)."""
_DEVICE_PRIORITY = ("recompute", "compute", "optimizer", "other", "tp_comm", "cp_comm", "ep_comm", "zero3_gather",
                    "dp_comm", "pp_comm")
_COMM_PREFIXES = ("c10d::", "_c10d_functional::", "c10d_functional::")
_GATHER_WORDS = ("all_gather", "pre_forward", "pre_backward", "post_forward", "unshard", "prefetch")


@dataclass
class Span:
    name: str
    start: float
    end: float
    tid: Any
    cat: str
    ext: Any = None
    """The profiler's External id: links a GPU kernel to the op that launched it."""
    ctx: str | None = None
    comm: str | None = None
    ring: bool = False

    def __post_init__(self) -> None:  # classified once: a trace has tens of thousands of events
        self.ctx, self.comm, self.ring = _context(self.name), _comm(self), self.name.startswith(RING)


def spans_of(events: list[dict]) -> list[Span]:
    out = []
    for e in events:
        if e.get("ph") == "X" and isinstance(e.get("ts"), (int, float)) and isinstance(e.get("dur"), (int, float)):
            args = e.get("args") or {}
            out.append(Span(e["name"], float(e["ts"]), float(e["ts"]) + float(e["dur"]), (e.get("pid"), e.get("tid")),
                            e.get("cat", ""), args.get("External id")))
    return out


def _context(name: str) -> str | None:
    if name.startswith((FORWARD, LOSS)):
        return "F"
    if name.startswith(BACKWARD):  # also backward_weight
        return "B"
    if name.startswith(RECOMPUTABLE):
        return "R"
    if name.startswith("FSDP::"):
        return "gather" if any(w in name for w in _GATHER_WORDS) else "reduce"
    if name.startswith(("Optimizer.step", "Optimizer.zero_grad")):
        return "opt"
    return None


def slice_name(term: str) -> str:
    """A term's slice name (``SLICE_NAMES``; a term it does not name yet, as ``ep_comm``: its words)."""
    return SLICE_NAMES.get(term, term.replace("_", " "))


def _comm(span: Span) -> str | None:
    n = span.name.lower()
    if span.cat in DEVICE_CATS:
        found = "nccl" in n
    else:
        found = span.cat == "cpu_op" and n.startswith(_COMM_PREFIXES) and "wrap_tensor" not in n
    if not found:
        return None
    if "send" in n or "recv" in n:
        return "p2p"
    return "all_to_all" if "all_to_all" in n or "alltoall" in n else "collective"


def term_of(stack: list[Span] | tuple[Span, ...], zero_stage: int) -> str:
    """The term of a moment whose open events are ``stack`` (outermost first); see the module docstring."""
    comm, ctx, depth = None, None, -1
    for d in range(len(stack) - 1, -1, -1):
        comm = comm or stack[d].comm
        ctx = stack[d].ctx
        if ctx:
            depth = d
            break
    if ctx == "R":
        ctx = "recompute" if any(s.ctx == "B" for s in stack[:depth]) else "F"
    gather = "zero3_gather" if zero_stage == 3 else "dp_comm"
    if comm == "p2p":
        return "pp_comm"
    if comm and any(s.ring for s in stack):
        return "cp_comm"
    if comm == "all_to_all" and ctx in ("F", "B", "recompute"):
        return "ep_comm"
    if comm:
        return {"gather": gather, "reduce": "dp_comm", "opt": "dp_comm", None: "other"}.get(ctx, "tp_comm")
    by_context = {"F": "compute", "B": "compute", "recompute": "recompute", "gather": gather, "reduce": "dp_comm",
                  "opt": "optimizer"}
    if ctx in by_context:
        return by_context[ctx]
    return "other" if any(s.cat == "cpu_op" for s in stack) else "bubble"


@dataclass
class Segment:
    start: float
    end: float
    stack: tuple[Span, ...]
    term: str = ""


def sweep(spans: list[Span]) -> list[Segment]:
    """The thread's time cut where any event starts or ends, with the events open in each piece (a thread's
    events nest; an end past its parent's, from rounding, is clipped to the parent's)."""
    out: list[Segment] = []
    stack: list[Span] = []
    cursor = min((s.start for s in spans), default=0.0)

    def emit(t: float) -> None:
        nonlocal cursor
        if t > cursor:
            out.append(Segment(cursor, t, tuple(stack)))
            cursor = t

    for s in sorted(spans, key=lambda s: (s.start, -s.end)):
        while stack and stack[-1].end <= s.start:
            emit(stack[-1].end)
            stack.pop()
        emit(s.start)
        if stack and s.end > stack[-1].end:
            s = Span(s.name, s.start, stack[-1].end, s.tid, s.cat, s.ext)  # re-classified: cheap, rare
        stack.append(s)
    while stack:
        emit(stack[-1].end)
        stack.pop()
    return out


def _label(stack: tuple[Span, ...]) -> Span | None:
    return next((s for s in reversed(stack) if s.name.startswith((FORWARD, BACKWARD, LOSS))), None)


def rank_phases(events: list[dict], zero_stage: int) -> dict[str, Any]:
    """One rank's traced steps: per step its terms (seconds, summing to the step), and the slices of the
    ``schedule`` and ``split`` tracks, times in us from the first traced step's start."""
    spans = spans_of(events)
    steps = sorted((s for s in spans if s.name.startswith(STEP + " ")), key=lambda s: s.start)
    if not steps:
        return {"mode": "host", "steps": [], "schedule": [], "split": []}
    main = steps[0].tid
    t0 = steps[0].start
    host = [seg for seg in sweep([s for s in spans if s.tid == main]) if _in_steps(seg, steps)]
    for seg in host:
        seg.term = term_of(seg.stack, zero_stage)
    _fill_short_pauses(host)
    device = [s for s in spans if s.cat in DEVICE_CATS]
    split = _device_split(device, spans, host, steps, zero_stage) if device else \
        _merge([(g.start, g.end, g.term) for g in host])
    out_steps = []
    for step in steps:
        terms = dict.fromkeys(TERMS, 0.0)
        for start, end, term in split:
            terms[term] += max(0.0, min(end, step.end) - max(start, step.start)) * 1e-6
        out_steps.append({"step": int(step.name.split()[1]), "start_us": step.start - t0,
                          "duration_s": (step.end - step.start) * 1e-6, "terms_s": terms})
    return {"mode": "device" if device else "host", "steps": out_steps,
            "schedule": _schedule(host, steps, t0),
            "split": [[s - t0, e - t0, term] for s, e, term in split]}


def _fill_short_pauses(host: list[Segment]) -> None:
    """A pause shorter than SHORT_PAUSE_US between two pieces of the same term takes that term: it is the
    Python between two ops of one piece of work (a loop over parameters), not a wait."""
    for i in range(1, len(host) - 1):
        seg, before, after = host[i], host[i - 1], host[i + 1]
        if (seg.term == "bubble" and seg.end - seg.start < SHORT_PAUSE_US and before.term == after.term
                and before.end == seg.start and seg.end == after.start):
            seg.term = before.term


def _in_steps(seg: Segment, steps: list[Span]) -> bool:
    return any(st.start <= seg.start and seg.end <= st.end for st in steps)  # a few steps: a scan is fine


def _merge(pieces: list[tuple[float, float, Any]]) -> list[tuple[float, float, Any]]:
    out: list[tuple[float, float, Any]] = []
    for start, end, key in pieces:
        if out and out[-1][2] == key and abs(out[-1][1] - start) < 1e-9:
            out[-1] = (out[-1][0], end, key)
        else:
            out.append((start, end, key))
    return out


def _schedule(host: list[Segment], steps: list[Span], t0: float) -> list[list]:
    """[start, end, name, args] slices: each forward/backward/loss label whole, and outside labels the
    host time by term (bubble, optimizer, dp reduction, ...)."""
    keyed = []
    for g in host:
        label = _label(g.stack)
        keyed.append((g.start, g.end, ("label", id(label), label) if label else ("term", g.term)))
    out = []
    for start, end, key in _merge(keyed):
        if key[0] == "label":
            name, stage, mb = _parse_label(key[2].name)
            out.append([start - t0, end - t0, name, {"stage": stage, "microbatch": mb} if stage is not None else None])
        else:
            out.append([start - t0, end - t0, slice_name(key[1]), None])
    out += [[s.start - t0, s.end - t0, f"step {s.name.split()[1]}", None] for s in steps]
    return out


def _parse_label(name: str) -> tuple[str, int | None, int | None]:
    head, *rest = name.split()
    kind = {FORWARD: "forward", BACKWARD: "backward", BACKWARD_WEIGHT: "backward", LOSS: "loss"}[head]
    if len(rest) == 2:
        return kind, int(rest[0]), int(rest[1])
    return kind, None, None


def _device_split(kernels: list[Span], spans: list[Span], host: list[Segment], steps: list[Span],
                  zero_stage: int) -> list[tuple[float, float, str]]:
    """Device time by term: kernels classified by their launching op, overlaps resolved by priority."""
    ops = {s.ext: s for s in spans if s.cat == "cpu_op" and s.ext is not None}
    chains = _chains({id(s) for s in ops.values()}, spans)
    host_starts = [g.start for g in host]
    marks: list[tuple[float, int, str]] = []
    for k in kernels:
        op = ops.get(k.ext)
        stack = chains.get(id(op), ()) if op is not None else ()
        if op is None or not any(s.ctx for s in stack):
            at = op.start if op is not None else k.start
            i = bisect.bisect_right(host_starts, at) - 1
            stack = host[i].stack if i >= 0 and host[i].end >= at else ()
        term = term_of(tuple(stack) + (k,), zero_stage)
        if term == "bubble":  # a kernel always does work; with no context it is unmodelled work
            term = "other"
        marks += [(k.start, 1, term), (k.end, -1, term)]
    out: list[tuple[float, float, str]] = []
    active = dict.fromkeys(_DEVICE_PRIORITY, 0)
    for step in steps:
        cursor = step.start
        for t, delta, term in sorted(marks) + [(step.end, 0, "")]:
            t = min(max(t, step.start), step.end)
            if t > cursor:
                out.append((cursor, t, next((p for p in _DEVICE_PRIORITY if active[p] > 0), "bubble")))
                cursor = t
            if term:
                active[term] += delta
        active = dict.fromkeys(_DEVICE_PRIORITY, 0)
    return _merge(out)


def _chains(wanted: set[int], spans: list[Span]) -> dict[int, tuple[Span, ...]]:
    """For each wanted span (by id), the events open around it on its thread, outermost first, itself last."""
    out: dict[int, tuple[Span, ...]] = {}
    by_thread: dict[Any, list[Span]] = {}
    for s in spans:
        if s.cat not in DEVICE_CATS:
            by_thread.setdefault(s.tid, []).append(s)
    for thread in by_thread.values():
        stack: list[Span] = []
        for s in sorted(thread, key=lambda s: (s.start, -s.end)):
            while stack and stack[-1].end <= s.start:
                stack.pop()
            stack.append(s)
            if id(s) in wanted:
                out[id(s)] = tuple(stack)
    return out


def merged_trace(ranks: list[dict[str, Any]], meta: dict[str, Any]) -> dict[str, Any]:
    """A Chrome trace of the measured steps, one process per rank, each aligned on its first traced step's
    start; ``otherData.autoplan`` keeps per rank the mean seconds of each term per step."""
    events: list[dict] = []
    summary: dict[str, Any] = {}
    for r in ranks:
        pid = r["rank"]
        events += process_metadata(pid, f"rank {pid} (pp {r['pp_rank']}, dp {r['dp_rank']}, cp {r.get('cp_rank', 0)}, "
                                        f"tp {r['tp_rank']}), "
                                        "measured", {SCHEDULE_THREAD: "schedule", SPLIT_THREAD: "time split"})
        for start, end, name, args in r["schedule"]:
            events.append(slice_event(name, pid, SCHEDULE_THREAD, start, end,
                                      "step" if name.startswith("step ") else name, args))
        for start, end, term in r["split"]:
            events.append(slice_event(slice_name(term), pid, SPLIT_THREAD, start, end, term))
        n = len(r["steps"]) or 1
        summary[str(pid)] = {
            "pp_rank": r["pp_rank"], "dp_rank": r["dp_rank"], "cp_rank": r.get("cp_rank", 0), "tp_rank": r["tp_rank"],
            "mode": r["mode"],
            "step_time_s": sum(s["duration_s"] for s in r["steps"]) / n,
            "terms_s": {t: sum(s["terms_s"][t] for s in r["steps"]) / n for t in TERMS},
            "steps": r["steps"],
        }
    info = {"format": TRACE_FORMAT, "source": "measured", **meta, "ranks": summary}
    return {"traceEvents": events, "displayTimeUnit": "ms", "otherData": {"autoplan": info}}
