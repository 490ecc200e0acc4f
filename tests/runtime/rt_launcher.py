"""Launch torchrun from tests, once per world size per pytest session (cached)."""

from __future__ import annotations

import functools
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]


def torchrun(nproc: int, args: list[str], timeout_s: float = 600, env: dict | None = None) -> subprocess.CompletedProcess:
    """torchrun --standalone with OMP_NUM_THREADS=1 (8 ranks would oversubscribe 2 cores otherwise)."""
    full_env = {**os.environ, "OMP_NUM_THREADS": "1",
                "PYTHONPATH": os.pathsep.join([str(ROOT), str(HERE), os.environ.get("PYTHONPATH", "")]),
                **(env or {})}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}", *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s, env=full_env, cwd=ROOT)


ABORTED = "Signal 6 (SIGABRT) received"
"""torchrun's report of a rank killed by SIGABRT: gloo's C++ side aborts now and then on this 2-core host
(../shared/runtime-notes.md, section 7: "terminate called without an active exception", exit code -6), with no
Python error and nothing wrong in what the ranks computed; re-runs pass."""


def worker_results(world: int, worker: str, args: list[str], out: Path, timeout_s: float = 600) -> dict:
    """Launch ``worker`` (a file beside this one) on ``world`` ranks with ``args``; rank 0's JSON at ``out``,
    or a RuntimeError carrying the ranks' output. A launch in which a rank was aborted by SIGABRT (``ABORTED``)
    runs once more: a crash of the transport, not a result; a wrong result fails the test as before."""
    proc = torchrun(world, [str(HERE / worker), *args], timeout_s=timeout_s)
    if proc.returncode != 0 and ABORTED in proc.stderr + proc.stdout:
        print(f"torchrun world {world} ({worker}): a rank was aborted by SIGABRT; launching once more")
        out.unlink(missing_ok=True)
        proc = torchrun(world, [str(HERE / worker), *args], timeout_s=timeout_s)
    if proc.returncode != 0 or not out.exists():
        raise RuntimeError(f"torchrun world {world} failed (rc {proc.returncode}):\n{proc.stdout[-3000:]}\n"
                           f"{proc.stderr[-6000:]}")
    return json.loads(out.read_text())


@functools.lru_cache(maxsize=None)
def matrix_results(world: int) -> dict:
    """Run every case of one world size (tests/runtime/rt_cases.py) and return rank 0's JSON."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "out.json"
        return worker_results(world, "rt_worker.py", [str(world), str(out)], out)


def job_results(world: int, jobs: list[dict], folder: Path) -> dict:
    """Run plan-file jobs (rt_worker.py's "jobs" mode) in one launch of ``world`` ranks; rank 0's JSON."""
    jobs_file, out = folder / f"jobs_w{world}.json", folder / f"out_w{world}.json"
    jobs_file.write_text(json.dumps(jobs))
    return worker_results(world, "rt_worker.py", ["jobs", str(out), str(jobs_file)], out)
