"""``autoplan run PLAN --dry-run [--rank R ...] [--json]``: build ranks of the real plan without training.

Each rank asked for (default: rank 0 and the last rank) is built by ``python -m runtime.dry_run`` in
its own process, on the meta device over a fake process group of the plan's world size: any plan size
runs on a laptop. Prints, per rank, the parameters it holds after TP / PP / ZeRO sharding beside what
the cost model counts for the plan's model and layout (autoplan/cost/local_params.py, re-derived rather
than read from the file's ``predicted.local_params_per_rank``), and the layers of the stages it
built. Exit status 1 when a rank's count differs from the plan's. Like the rest of the CLI, this module
imports neither torch nor the runtime.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

from autoplan.errors import SpecError
from autoplan.report.tables import layout_label
from autoplan.schema import Plan

ROOT = Path(__file__).resolve().parents[2]


def ranks_of(plan: Plan, asked: list[int] | None) -> list[int]:
    ranks = asked or sorted({0, plan.world_size - 1})
    for r in ranks:
        if not 0 <= r < plan.world_size:
            raise SpecError(f"--rank: {r} is outside the plan's world of {plan.world_size} ranks "
                            f"(0 to {plan.world_size - 1})")
    return ranks


def build_rank(plan_path: str, rank: int) -> dict:
    env = {**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1"),
           "PYTHONPATH": os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p)}
    t0 = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "runtime.dry_run", str(plan_path), "--rank", str(rank)],
                          capture_output=True, text=True, env=env)
    if proc.returncode != 0:
        last = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        raise SpecError(f"--dry-run: building rank {rank} failed: {last}")
    row = json.loads(proc.stdout.strip().splitlines()[-1])
    row["process_wall_s"] = round(time.perf_counter() - t0, 3)  # interpreter start and imports included
    return row


def stages_label(stages: list[dict]) -> str:
    parts = []
    for s in stages:
        extra = "+embedding" if s["embedding"] else ""
        extra += "+head" if s["head"] else ""
        first, stop = s["layers"] or (0, 0)
        parts.append(f"{s['index']}:[{first},{stop}){extra}")
    return " ".join(parts)


def table(rows: list[dict]) -> str:
    head = ("rank", "pp/dp/cp/tp", "local_params", "expected", "match", "wall s", "max RSS GiB", "stages: [layers)")
    body = []
    for r in rows:
        expected = r["expected_local_params"]
        match = "-" if expected is None else ("yes" if expected == r["local_params"] else "NO")
        body.append((str(r["rank"]), f"{r['pp_rank']}/{r['dp_rank']}/{r.get('cp_rank', 0)}/{r['tp_rank']}", f"{r['local_params']:,}",
                     "-" if expected is None else f"{expected:,}", match, f"{r['process_wall_s']:.1f}",
                     f"{r['max_rss_gib']:.2f}", stages_label(r["stages"])))
    widths = [max(len(x) for x in col) for col in zip(head, *body)]
    lines = ["  ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip() for row in (head, *body)]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def dry_run(plan_path: str, plan: Plan, asked: list[int] | None, as_json: bool) -> int:
    from autoplan.cost.local_params import local_params_per_rank

    # expected from the plan's model and layout, not its predicted block (a file a user may have edited)
    expected = local_params_per_rank(plan.model, plan.layout(), plan.training)
    rows = [build_rank(plan_path, r) for r in ranks_of(plan, asked)]
    for row in rows:
        row["expected_local_params"] = expected[row["pp_rank"]]
    if as_json:
        print(json.dumps(rows))
    else:
        print(f"dry run of {plan_path}: {plan.model.name}, {layout_label(plan)} "
              f"on {plan.world_size} ranks (meta device, fake process group)\n")
        print(table(rows))
        recorded = plan.predicted.local_params_per_rank if plan.predicted else ()
        if recorded and tuple(recorded) != expected:
            print(f"\nthe plan's predicted.local_params_per_rank {list(recorded)} differs from its model and layout's "
                  f"{list(expected)} (compared above): edited by hand or written by another autoplan; re-plan")
    mismatch = any(r["expected_local_params"] not in (None, r["local_params"]) for r in rows)
    return 1 if mismatch else 0
