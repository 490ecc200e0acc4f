"""`autoplan run --dry-run` at real size: time and peak resident memory to build ranks of a large plan
on the meta device over a fake process group, and their parameter counts against the plan's.

Default: the planner's plan for llama3-70b on dgx-h100-80gb --nodes 128 (1024 GPUs, global batch 1024
x 8192); ``--plan FILE`` takes an existing plan instead. Each rank is built in its own process (as the
CLI does); wall time includes interpreter start and imports. Goal (issue 7): < 60 s and < 6 GiB per rank.
Usage: python benchmarks/dry_run_real_size.py [--plan FILE] [--rank R ...]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
PLAN_ARGS = ["llama3-70b", "--cluster", "dgx-h100-80gb", "--nodes", "128", "--global-batch-size", "1024",
             "--seq-len", "8192"]


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--plan")
    p.add_argument("--rank", type=int, action="append")
    args = p.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        plan = args.plan or str(Path(tmp) / "plan.yaml")
        if not args.plan:
            t0 = time.perf_counter()
            subprocess.run([sys.executable, "-m", "autoplan.cli.main", "plan", *PLAN_ARGS, "--json", "-o", plan],
                           check=True, capture_output=True, env=ENV)
            print(f"autoplan plan {' '.join(PLAN_ARGS)}: {time.perf_counter() - t0:.1f} s")
        cmd = [sys.executable, "-m", "autoplan.cli.main", "run", plan, "--dry-run", "--json"]
        for r in args.rank or []:
            cmd += ["--rank", str(r)]
        proc = subprocess.run(cmd, capture_output=True, text=True, env=ENV)
        if proc.returncode not in (0, 1):
            print(proc.stderr[-3000:], file=sys.stderr)
            return proc.returncode
        rows = json.loads(proc.stdout)
    for r in rows:
        same = "==" if r["local_params"] == r["expected_local_params"] else "!="
        print(f"rank {r['rank']} (pp {r['pp_rank']}, dp {r['dp_rank']}, tp {r['tp_rank']}): built in "
              f"{r['process_wall_s']:.1f} s, max RSS {r['max_rss_gib']:.2f} GiB, local_params {r['local_params']:,} "
              f"{same} expected {r['expected_local_params']:,}, stages "
              + ", ".join(f"{s['index']}:[{s['layers'][0]},{s['layers'][1]})" for s in r["stages"]))
    return proc.returncode


if __name__ == "__main__":
    sys.exit(main())
