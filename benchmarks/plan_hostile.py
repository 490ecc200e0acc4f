"""Sizes no cluster has: each is refused in one line with exit status 2, well within 2 s (issue 10).

    python benchmarks/plan_hostile.py

Each case runs `autoplan plan` in a fresh process and prints its wall time, exit status and the one line
it wrote to stderr. The limits are in autoplan/search/space.py (MAX_*); the numbers here are those the
issue names (10^12) plus an infeasible but accepted sequence length, which the search must also answer
quickly. Figures measured on a loaded machine are inflated: say so when you quote them.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BASE = ["llama3-70b", "--cluster", "dgx-h100-80gb", "--nodes", "128", "--global-batch-size", "1024",
        "--seq-len", "8192"]


def with_flag(flag: str, value: str) -> list[str]:
    argv = list(BASE)
    if flag in argv:
        argv[argv.index(flag) + 1] = value
    else:
        argv += [flag, value]
    return argv


def main() -> int:
    with tempfile.TemporaryDirectory() as tmp:
        deep = Path(tmp) / "deep.yaml"
        text = (ROOT / "profiles" / "models" / "llama3-70b.yaml").read_text()
        deep.write_text("\n".join("num_layers: 1000000000000" if line.startswith("num_layers:") else line
                                  for line in text.splitlines()) + "\n")
        cases = [
            ("global batch 10^12", with_flag("--global-batch-size", "1000000000000")),
            ("devices per node 10^12", with_flag("--devices-per-node", "1000000000000")),
            ("nodes 10^12", with_flag("--nodes", "1000000000000")),
            ("layers 10^12 (model file)", [str(deep), *BASE[1:]]),
            ("seq len 10^12", with_flag("--seq-len", "1000000000000")),
            ("seq len 10^6 (accepted, fits nowhere)", with_flag("--seq-len", "1000000")),
        ]
        env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
        worst = 0.0
        for label, argv in cases:
            command = [sys.executable, "-m", "autoplan.cli.main", "plan", *argv]
            t0 = time.perf_counter()
            done = subprocess.run(command, capture_output=True, text=True, env=env, cwd=ROOT)
            wall = time.perf_counter() - t0
            worst = max(worst, wall)
            lines = done.stderr.strip().splitlines()
            shown = " ".join(a if a != str(deep) else "deep.yaml" for a in argv)
            print(f"{label}: autoplan plan {shown}\n    exit {done.returncode}, {wall:.2f} s, "
                  f"{len(lines)} line(s) on stderr: {lines[-1] if lines else ''}")
        print(f"slowest: {worst:.2f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
