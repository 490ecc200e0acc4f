"""How much slower one rank computes while R ranks compute at once on this node (``autoplan calibrate``).

R processes (one intra-op thread each, as the ranks of ``autoplan run`` on a CPU) run the same loop in the
same wall-clock windows and time it: ``layer`` (the forward and backward of the runtime's gpt-tiny, one
micro-batch of 4 x 64 tokens: the kernel-bound work of a rank, with a rank's working set) or ``ops``
(chains of tiny eager ops: the host-bound work), alternating, ``ROUNDS`` windows of each; between
them, in solo windows, process 0 runs the same loop alone while the others sleep. The slow-down at R is
the median per-call time over the processes, the least over the rounds (a window that another program's
work disturbed reads slower, never faster), divided by process 0's least solo time *of the same session*.
Why solo windows in every session: a shared host drifts by tens of percent within a minute
(runtime/train/speed_probe.py), so a ratio of two sessions measured seconds apart mixes the drift in.
Above the core count it is time-slicing
(about R / cores, plus the cost of switching); below it, what co-running ranks still share (SMT
siblings of one physical core, caches, memory bandwidth).

Why a whole model rather than one GEMM shape: a time slice of another rank evicts this rank's caches, and
what that costs depends on the working set: a cache-resident GEMM reads a smaller slow-down than a layer
whose activations and weights span several MiB. The kernel slow-down is the layer's: the work the ranks
run, not a cache-resident kernel.

Run as ``python -m autoplan.profiler.hardware.corun START_EPOCH_S WINDOW_S INDEX``: prints one JSON line.
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

KINDS = ("layer", "ops")
LAYER_MODEL = "gpt-tiny"
LAYER_BATCH = 4
ROUNDS = 5
SLOT_S = 0.6
"""Window spacing: each window of ``window_s`` < SLOT_S starts at start + k * SLOT_S in every process."""


def _loop(kind: str):
    import torch
    import torch.nn.functional as F

    torch.set_num_threads(1)
    if kind == "layer":
        from autoplan.schema import load_model
        from runtime.models import build_model

        spec = load_model(LAYER_MODEL)
        model = build_model(spec)
        tokens = torch.randint(0, spec.vocab_size, (LAYER_BATCH, spec.seq_len))

        def layer() -> None:
            model(tokens).float().square().mean().backward()
        return layer
    x = torch.randn(2, 32)

    def ops() -> None:
        y = x
        for _ in range(500):
            y = F.gelu(y * 1.001 + 0.5)
    return ops


def _main(start_s: float, window_s: float, index: int) -> None:
    import json

    loops = {kind: _loop(kind) for kind in KINDS}
    for fn in loops.values():
        fn()
    out: dict[str, list[float]] = {name: [] for kind in KINDS for name in (kind, f"{kind}_solo")}
    for k in range(2 * ROUNDS * len(KINDS)):  # co-run and solo windows alternate, each kind in turn
        kind, solo = KINDS[(k // 2) % len(KINDS)], k % 2 == 1
        time.sleep(max(0.0, start_s + k * SLOT_S - time.time()))
        if solo and index != 0:
            continue
        t0, calls = time.perf_counter(), 0
        while time.perf_counter() - t0 < window_s:
            loops[kind]()
            calls += 1
        out[f"{kind}_solo" if solo else kind].append((time.perf_counter() - t0) / calls)
    print(json.dumps(out))


def measure_corun(max_ranks: int, window_s: float = 0.4, say=lambda _m: None) -> dict[str, list[float]]:
    """{kind: [seconds per call with R = 1..max_ranks processes at once]}, each R's time put on the
    first session's speed (x its solo time / the R session's solo time): ratios to the first entry are
    the slow-downs, measured within one session each."""
    import json

    root = str(Path(__file__).resolve().parents[3])
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": root + os.pathsep + os.environ.get("PYTHONPATH", "")}
    out: dict[str, list[float]] = {k: [] for k in KINDS}
    first_solo: dict[str, float] = {}
    for r in range(1, max_ranks + 1):
        say(f"co-running ranks: {r} at once, a model's forward and backward and eager ops")
        start = time.time() + 5.0  # after every process has imported torch
        procs = [subprocess.Popen([sys.executable, "-m", "autoplan.profiler.hardware.corun", str(start), str(window_s),
                                   str(i)], stdout=subprocess.PIPE, text=True, env=env) for i in range(r)]
        results = [json.loads(p.communicate()[0]) for p in procs]
        for kind in KINDS:
            together = min(statistics.median(res[kind][i] for res in results) for i in range(ROUNDS))
            solo = min(results[0][f"{kind}_solo"])
            if r == 1:
                first_solo[kind] = solo
                out[kind].append(solo)  # one rank: slow-down 1 by definition
            else:
                out[kind].append(together / solo * first_solo[kind])
    return out


if __name__ == "__main__":
    _main(float(sys.argv[1]), float(sys.argv[2]), int(sys.argv[3]))
