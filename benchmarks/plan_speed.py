"""Wall time of `autoplan plan` as the cluster grows: llama3-8b/70b/405b on 8 to 65,536 H100s.

    python benchmarks/plan_speed.py               # the whole table (a few minutes on 2 cores)
    python benchmarks/plan_speed.py --sizes 1024 16384 --models llama3-70b llama3-405b

Every cell is one `autoplan plan MODEL --cluster dgx-h100-80gb --nodes GPUS/8 --global-batch-size 1024
--seq-len 8192` in a fresh process (start-up and imports included, as a user sees it), with a global batch
of 1024 sequences of 8192 tokens at every size: the two reference problems of issue 10 (llama3-70b on
1,024 GPUs, goal 2 s; llama3-405b on 16,384 GPUs, goal 10 s) are cells of the table. A cell says
"no fit" when nothing fits (the time then includes the search for the smallest change that would).
The machine's load inflates every figure: say so when you quote them.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

SIZES = [8, 64, 512, 1024, 4096, 16384, 65536]
MODELS = ["llama3-8b", "llama3-70b", "llama3-405b"]
GLOBAL_BATCH, SEQ_LEN = 1024, 8192
ROOT = Path(__file__).resolve().parents[1]


def plan(model: str, gpus: int) -> tuple[float, dict | None, str]:
    argv = [sys.executable, "-m", "autoplan.cli.main", "plan", model, "--cluster", "dgx-h100-80gb", "--nodes",
            str(gpus // 8), "--global-batch-size", str(GLOBAL_BATCH), "--seq-len", str(SEQ_LEN), "--json"]
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    t0 = time.perf_counter()
    done = subprocess.run(argv, capture_output=True, text=True, env=env, cwd=ROOT)
    wall = time.perf_counter() - t0
    if done.returncode != 0:
        return wall, None, done.stderr.strip().splitlines()[-1] if done.stderr.strip() else f"exit {done.returncode}"
    return wall, json.loads(done.stdout), ""


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=SIZES, help="GPUs (multiples of 8)")
    parser.add_argument("--models", nargs="+", default=MODELS)
    args = parser.parse_args()
    results = {(m, g): plan(m, g) for m in args.models for g in args.sizes}
    print(f"autoplan plan wall time (s), dgx-h100-80gb, global batch {GLOBAL_BATCH} x {SEQ_LEN} tokens at every size")
    header = f"{'model':12s}" + "".join(f"{g:>11,d}" for g in args.sizes)
    print(header + "  GPUs")
    for m in args.models:
        cells = []
        for g in args.sizes:
            wall, data, _ = results[(m, g)]
            cells.append(f"{wall:8.2f} {'':2s}" if data else f"{wall:6.2f} nofit")
        print(f"{m:12s}" + "".join(f"{c:>11s}" for c in cells))
    print("\nplans:")
    for (m, g), (wall, data, error) in results.items():
        if data is None:
            print(f"  {m:12s} {g:6,d} GPUs: {error}")
            continue
        s, p = data["solver"], data["predicted"]
        layout = (f"tp{data['tp']} pp{data['pp']} dp{data['dp']}{' cp' + str(data['cp']) if data.get('cp', 1) > 1 else ''} zero{data['zero_stage']} {data['schedule']}"
                  f" v{data['virtual_stages']} mbs{data['micro_batch_size']}x{data['num_microbatches']}"
                  f"{' sp' if data['sequence_parallel'] else ''}{' offload' if data['offload_optimizer'] else ''}")
        print(f"  {m:12s} {g:6,d} GPUs: {s['status']} in {wall:.2f} s wall (search {s['wall_s']:.2f} s, "
              f"{s['candidates']} configurations): {layout}, step {p['step_time_s']:.3f} s, MFU {100 * p['mfu']:.1f}%")
    return 0


if __name__ == "__main__":
    sys.exit(main())
