"""The vocabulary of step traces: what the simulated trace (``autoplan show --trace``) and the measured one
(``autoplan run --trace``) call the parts of a step, so that the two open side by side and
``autoplan compare`` can set one against the other.

Both are Chrome trace JSON (``{"traceEvents": [...]}``, times in microseconds; Perfetto and
chrome://tracing open them). Each rank is one process (``pid``): a pipeline rank in the simulated trace,
a global rank in the measured one. Slices are named by what they are (``SLICE_NAMES``); a forward or
backward slice carries ``stage`` and ``microbatch`` in ``args``. ``otherData.autoplan`` holds the numbers
(``TRACE_FORMAT``, ``source``, and per rank the seconds of each term per step), so nothing has to be
re-derived from the drawing.

Terms: a step's time on one rank splits into the cost model's ``TimeBreakdown`` fields (``TIME_TERMS``,
the field names without ``_s``) plus ``other``, host work the cost model does not model (data loading,
loss and gradient-norm reductions, learning-rate updates); ``bubble`` is time the rank is idle.

The helpers below build and check the events, so that the planning side and the runtime (which may import
only schemas) write the same format.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

from autoplan.schema.plan import TimeBreakdown

TRACE_FORMAT = 1
TIME_TERMS: tuple[str, ...] = tuple(f.name.removesuffix("_s") for f in dataclasses.fields(TimeBreakdown))
MEASURED_TERMS: tuple[str, ...] = TIME_TERMS + ("other",)

SLICE_NAMES: dict[str, str] = {
    "compute": "compute", "recompute": "recompute", "tp_comm": "tp comm", "pp_comm": "p2p",
    "zero3_gather": "zero-3 gather", "bubble": "bubble", "dp_comm": "dp reduction", "optimizer": "optimizer",
    "cp_comm": "cp ring", "ep_comm": "ep all-to-all", "other": "other",
}
"""Slice name of each term."""
FORWARD, BACKWARD = "forward", "backward"
"""Slice names of one stage's forward / backward of one micro-batch."""
SCHEDULE_THREAD, SPLIT_THREAD, P2P_THREAD = 0, 1, 2
"""``tid`` of a rank's tracks: the schedule (forward/backward/tail/bubble), the measured split of the step
into terms, and the first of the simulated point-to-point transfer lanes (one lane per overlap)."""


def slice_event(name: str, pid: int, tid: int, start_us: float, end_us: float, cat: str,
                args: dict | None = None) -> dict:
    """A Chrome "complete" event (ph X) at ns resolution; the end is rounded like the start, so that
    slices that touch still touch."""
    ts = round(start_us, 3)
    event = {"name": name, "ph": "X", "pid": pid, "tid": tid, "ts": ts, "dur": round(round(end_us, 3) - ts, 3),
             "cat": cat}
    if args:
        event["args"] = args
    return event


def process_metadata(pid: int, name: str, threads: dict[int, str]) -> list[dict]:
    """The events that name a process and its threads, sorted as numbered."""
    events = [{"name": "process_name", "ph": "M", "pid": pid, "args": {"name": name}},
              {"name": "process_sort_index", "ph": "M", "pid": pid, "args": {"sort_index": pid}}]
    for tid, label in threads.items():
        events += [{"name": "thread_name", "ph": "M", "pid": pid, "tid": tid, "args": {"name": label}},
                   {"name": "thread_sort_index", "ph": "M", "pid": pid, "tid": tid, "args": {"sort_index": tid}}]
    return events


_NEST_TOLERANCE_US = 1e-6  # slices are written at ns resolution; sums of those drift far less than a ns


def check_trace(trace: Any) -> None:
    """What Perfetto's JSON importer needs, plus autoplan's summary: raises ValueError naming the problem.

    Every event has a name, a phase and a pid; complete events have numeric ts >= 0 and dur >= 0; the
    complete events of one thread nest (any two are disjoint or one contains the other: a thread's slices
    form a stack); ``otherData.autoplan`` has this format's number and per-rank numbers."""
    if not isinstance(trace, dict) or not isinstance(trace.get("traceEvents"), list):
        raise ValueError("not a Chrome trace: no traceEvents list")
    threads: dict[tuple, list[tuple[float, float, str]]] = {}
    for k, e in enumerate(trace["traceEvents"]):
        if not isinstance(e, dict) or not {"name", "ph", "pid"} <= e.keys():
            raise ValueError(f"traceEvents[{k}]: needs name, ph and pid")
        if e["ph"] == "X":
            if not all(isinstance(e.get(f), (int, float)) and e[f] >= 0 for f in ("ts", "dur")):
                raise ValueError(f"traceEvents[{k}] ({e['name']}): ts and dur must be numbers >= 0")
            threads.setdefault((e["pid"], e.get("tid")), []).append((e["ts"], e["ts"] + e["dur"], e["name"]))
    for (pid, tid), spans in threads.items():
        stack: list[tuple[float, float, str]] = []
        for start, end, name in sorted(spans, key=lambda s: (s[0], -s[1])):
            while stack and stack[-1][1] <= start + _NEST_TOLERANCE_US:
                stack.pop()
            if stack and end > stack[-1][1] + _NEST_TOLERANCE_US:
                raise ValueError(f"pid {pid} tid {tid}: {name!r} at {start} us overlaps {stack[-1][2]!r} without nesting")
            stack.append((start, end, name))
    info = trace.get("otherData", {}).get("autoplan")
    if not isinstance(info, dict) or info.get("format") != TRACE_FORMAT or "ranks" not in info:
        raise ValueError(f"no otherData.autoplan summary of format {TRACE_FORMAT}")


def relative_error(predicted: float, measured: float) -> float | None:
    """How far a prediction is off, here and wherever autoplan compares: (predicted - measured) / measured,
    so -0.5 means half of what was measured; None when nothing was measured."""
    return (predicted - measured) / measured if measured else None


SPEED_PROBE_KEY = "speed_probe"
"""The metrics rows' field holding the probes timed after a CPU step, ``{"gemm_us": .., "op_us": ..}``
(runtime/train/speed_probe.py); the calibration's are ``DeviceProfile.probe_gemm_us`` / ``probe_op_us``."""


@dataclasses.dataclass(frozen=True)
class HostSpeed:
    """How fast the host ran against its calibration: calibrated probe time / the run's (their geometric
    mean: speed ratios combine multiplicatively); 0.8 means 20% slower."""

    kernel: float
    """From the GEMM probe: GEMM, attention and memory-bound kernels."""
    host: float
    """From the eager-op probe: dispatch, autograd, hooks, gloo's per-call work."""


def host_speed(calibrated_gemm_us: float, calibrated_op_us: float, rows: list[dict]) -> HostSpeed | None:
    """The host's speed over ``rows`` (a run's timed steps); None when the calibration or the rows have
    no probes (GPUs, older files)."""
    probes = [r[SPEED_PROBE_KEY] for r in rows if isinstance(r.get(SPEED_PROBE_KEY), dict)]
    probes = [p for p in probes if p.get("gemm_us", 0) > 0 and p.get("op_us", 0) > 0]
    if calibrated_gemm_us <= 0 or calibrated_op_us <= 0 or not probes:
        return None
    return HostSpeed(kernel=calibrated_gemm_us / geometric_mean([p["gemm_us"] for p in probes]),
                     host=calibrated_op_us / geometric_mean([p["op_us"] for p in probes]))


def geometric_mean(values: list[float]) -> float:
    """The mean of positive ``values`` that speed ratios need (a 2x-fast and a 2x-slow probe average to 1x)."""
    return math.exp(sum(math.log(v) for v in values) / len(values))
