"""Wall time of `autoplan plan` on the two large reference problems (goal: under 2 s and 10 s on 2 cores).

    python benchmarks/plan_speed.py
"""

from __future__ import annotations

import json
import subprocess
import sys
import time

PROBLEMS = [
    ["llama3-70b", "--cluster", "dgx-h100-80gb", "--nodes", "128", "--global-batch-size", "1024", "--seq-len", "8192"],
    ["llama3-405b", "--cluster", "dgx-h100-80gb", "--nodes", "2048", "--global-batch-size", "1024", "--seq-len", "8192"],
]


def main() -> int:
    for argv in PROBLEMS:
        t0 = time.perf_counter()
        out = subprocess.run([sys.executable, "-m", "autoplan.cli.main", "plan", *argv, "--json"],
                             capture_output=True, text=True, check=True).stdout
        wall = time.perf_counter() - t0
        plan = json.loads(out)
        p, s = plan["predicted"], plan["solver"]
        print(f"{argv[0]:12s} on {int(argv[4]) * 8:6d} GPUs: {s['status']:8s} wall {wall:6.1f} s (search {s['wall_s']:.1f} s, "
              f"{s['candidates']} configurations); tp{plan['tp']} pp{plan['pp']} dp{plan['dp']} zero{plan['zero_stage']} "
              f"{plan['schedule']} v{plan['virtual_stages']} mbs{plan['micro_batch_size']}: step {p['step_time_s']:.2f} s, "
              f"MFU {100 * p['mfu']:.1f}%, peak {p['peak_memory_gib']:.1f} GiB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
