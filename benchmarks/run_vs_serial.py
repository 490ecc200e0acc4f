"""`autoplan run` on a plan file against the serial run of the same plan: per-step losses and the max
relative difference (the runtime's promise: equal to serial within 1e-5 in fp32).

Runs ``autoplan run PLAN --steps N`` (torchrun, the plan's world size, its data default: the shipped
text for byte-level models), reads its metrics, then trains the same model, seed and global batches in
this process with plain PyTorch (tests/runtime/rt_helpers.serial_run).
Usage: python benchmarks/run_vs_serial.py PLAN [--steps N] [--data FILE|synthetic]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tests" / "runtime")]

from autoplan.launcher.preflight import SAMPLE_TEXT  # noqa: E402
from autoplan.schema import load_plan  # noqa: E402
from rt_helpers import serial_run  # noqa: E402


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("plan")
    p.add_argument("--steps", type=int, default=5)
    p.add_argument("--data", help="token file or 'synthetic' (default: as autoplan run)")
    args = p.parse_args()
    plan = load_plan(args.plan)
    data = args.data
    if data is None and plan.model.vocab_size >= 256 and SAMPLE_TEXT.is_file():
        data = str(SAMPLE_TEXT)
    with tempfile.TemporaryDirectory() as tmp:
        metrics = Path(tmp) / "metrics.jsonl"
        cmd = [sys.executable, "-m", "autoplan.cli.main", "run", args.plan, "--steps", str(args.steps),
               "--metrics", str(metrics), "--data", data or "synthetic"]
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
        proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
        if proc.returncode != 0:
            print(proc.stderr[-4000:], file=sys.stderr)
            return proc.returncode
        rows = [json.loads(line) for line in metrics.read_text().splitlines()]
    ran = [r["loss"] for r in rows]
    serial, _ = serial_run(plan, args.steps, None if data in (None, "synthetic") else data)
    print(f"{args.plan}: tp{plan.tp} pp{plan.pp} dp{plan.dp} zero{plan.zero_stage} "
          f"{'sp ' if plan.sequence_parallel else ''}{plan.schedule} mbs{plan.micro_batch_size}x{plan.num_microbatches}, "
          f"{plan.world_size} ranks, data {Path(data).name if data not in (None, 'synthetic') else 'synthetic'}")
    print("step  autoplan run    serial          rel diff")
    diffs = []
    for i, (a, b) in enumerate(zip(ran, serial), 1):
        diffs.append(abs(a - b) / abs(b))
        print(f"{i:>4}  {a:.7f}     {b:.7f}     {diffs[-1]:.2e}")
    print(f"max rel diff over {len(diffs)} steps: {max(diffs):.2e}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
