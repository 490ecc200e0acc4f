"""One step of a run, rank by rank: its phases with wall time, the training thread's CPU time and their
ratio, from ``autoplan run PLAN --timeline FILE`` (runtime/train/phase_clock.py).

    python benchmarks/step_phases.py FILE [--step N]

Default step: rank 0's median step after the first (warm-up). A phase whose CPU is well below its wall
time waited (for a peer or a collective's slowest member) or was preempted by ranks sharing its cores;
the last lines add up, per rank, the compute phases' wall and CPU: on a host whose ranks share cores, the
gap is the time other ranks took from this one's forward and backward.
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

COMPUTE = ("forward ", "backward ")


def load(path: str) -> dict[int, list[dict]]:
    """Per rank, its phase events sorted by start."""
    events = [e for e in json.loads(Path(path).read_text())["traceEvents"] if e.get("ph") == "X"]
    ranks: dict[int, list[dict]] = {}
    for e in sorted(events, key=lambda e: e["ts"]):
        ranks.setdefault(e["pid"], []).append(e)
    return ranks


def median_step(ranks: dict[int, list[dict]]) -> str:
    steps = [e for e in ranks[min(ranks)] if e["name"].startswith("step ")][1:]
    if not steps:
        raise SystemExit("step_phases: the timeline has under two steps")
    middle = statistics.median_low(e["dur"] for e in steps)
    return next(e["name"] for e in steps if e["dur"] == middle)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("timeline", help="file written by autoplan run --timeline")
    p.add_argument("--step", type=int, help="step number (default: rank 0's median after the first)")
    args = p.parse_args()
    ranks = load(args.timeline)
    name = f"step {args.step}" if args.step else median_step(ranks)
    origin = next(e["ts"] for e in ranks[min(ranks)] if e["name"] == name)
    print(f"{name}: times in ms from rank {min(ranks)}'s start of it")
    totals = []
    for rank, events in sorted(ranks.items()):
        step = next((e for e in events if e["name"] == name), None)
        if step is None:
            continue
        end = step["ts"] + step["dur"]
        inside = [e for e in events if e is not step and step["ts"] <= e["ts"] <= end]
        print(f"rank {rank}: {(step['ts'] - origin) / 1e3:8.2f} .. {(end - origin) / 1e3:8.2f}"
              f"   ({step['dur'] / 1e3:.2f} ms, CPU {step['args']['cpu_ms']:.2f} ms)")
        print(f"    {'start':>8}  {'wall':>7}  {'cpu':>7}  {'cpu/wall':>8}  phase")
        for e in inside:
            print(f"    {(e['ts'] - origin) / 1e3:8.2f}  {e['dur'] / 1e3:7.2f}  {e['args']['cpu_ms']:7.2f}  "
                  f"{e['args']['cpu_share']:8.2f}  {e['name']}")
        compute = [e for e in inside if e["name"].startswith(COMPUTE)]
        totals.append((rank, sum(e["dur"] for e in compute) / 1e3, sum(e["args"]["cpu_ms"] for e in compute)))
    print("forward + backward per rank: wall ms, CPU ms, taken by others ms")
    for rank, wall, cpu in totals:
        print(f"    rank {rank}: {wall:7.2f}  {cpu:7.2f}  {wall - cpu:7.2f}")


if __name__ == "__main__":
    main()
