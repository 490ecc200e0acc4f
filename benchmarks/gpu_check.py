"""The one-GPU check: what the cost model predicts for the ``autoplan`` stack against what this runtime
measures on this machine's GPU, as a user would get there.

    python benchmarks/gpu_check.py                  # on one GPU: under 8 minutes on an H100 / H200
    python benchmarks/gpu_check.py --smoke          # anywhere (CPU): the same path with llama-tiny, a few steps
    python benchmarks/gpu_check.py --out DIR        # where the files go (default gpu_check_out/)

1. Measure the device: ``autoplan profile-hardware --nproc 1`` (GEMM curve, memory bandwidth, kernel
   overhead; peaks from the shipped profile of the same GPU) -> DIR/device.yaml and DIR/cluster.yaml.
   ``--smoke`` (and ``--cluster NAME``) uses a shipped cluster instead.
2. Plan a ~1B Llama (Llama 3.2 1B's shape, profiles/models/llama3.2-1b.yaml) for that one device with
   ``--stack autoplan`` -> DIR/plan.yaml.
3. Run it: ``autoplan run`` for ``--steps`` (30) bf16 steps on synthetic tokens, the last few under the
   profiler (``--trace``) -> DIR/metrics.jsonl, DIR/trace/.
4. Compare: ``autoplan compare --trace`` splits the measured step into the cost model's terms; printed
   beside the prediction, with peak memory (``max_memory_allocated`` against the plan's total,
   ``max_memory_reserved`` against its reserved figure) -> DIR/gpu_check.json.

Every step is the command a user runs; their output is in DIR/*.log. The figures are this machine's:
record them in the issue with the GPU's name.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

MODEL = "llama3.2-1b"
SMOKE_MODEL = "llama-tiny"


def autoplan(args: list[str], log: Path, timeout_s: float) -> str:
    """Run ``autoplan ARGS`` as a user would; its output goes to ``log`` and is returned. A failure stops
    the check with the log's tail."""
    cmd = [sys.executable, "-m", "autoplan.cli.main", *args]
    t0 = time.perf_counter()
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s)
    except subprocess.TimeoutExpired:
        raise SystemExit(f"gpu_check: {' '.join(args[:2])} took more than {timeout_s:.0f} s; see {log}") from None
    log.write_text(done.stdout + done.stderr)
    print(f"  autoplan {' '.join(args)}  ({time.perf_counter() - t0:.0f} s, exit {done.returncode})", flush=True)
    if done.returncode != 0:
        tail = "\n".join((done.stdout + done.stderr).strip().splitlines()[-5:])
        raise SystemExit(f"gpu_check: autoplan {args[0]} failed (exit {done.returncode}):\n{tail}")
    return done.stdout


def measured_reserved_gib(metrics: Path) -> float | None:
    rows = [json.loads(line) for line in metrics.read_text().splitlines() if line.strip()]
    values = [r["peak_reserved_gib"] for r in rows[1:] if "peak_reserved_gib" in r and not r.get("profiled")]
    return max(values) if values else None


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--smoke", action="store_true", help="CPU smoke run: llama-tiny on the shipped cpu-local "
                   "cluster, no measurement, 6 steps")
    p.add_argument("--cluster", help="a shipped cluster (or file) instead of measuring this device")
    p.add_argument("--model", help=f"model to plan (default {MODEL}; --smoke: {SMOKE_MODEL})")
    p.add_argument("--steps", type=int, help="optimizer steps (default 30; --smoke: 6)")
    p.add_argument("--global-batch-size", type=int, help="sequences per step (default 8; --smoke: 4)")
    p.add_argument("--seq-len", type=int, help="tokens per sequence (default 2048; --smoke: the model's)")
    p.add_argument("--out", default="gpu_check_out", help="folder for the files (default gpu_check_out/)")
    args = p.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    smoke = args.smoke
    model = args.model or (SMOKE_MODEL if smoke else MODEL)
    steps = args.steps or (6 if smoke else 30)
    batch = args.global_batch_size or (4 if smoke else 8)
    t0 = time.perf_counter()

    print("1. device", flush=True)
    if args.cluster or smoke:
        cluster = args.cluster or "cpu-local"
        print(f"  using the shipped cluster {cluster} (no measurement)")
    else:
        autoplan(["profile-hardware", "--nproc", "1", "-o", str(out / "device.yaml"), "--cluster-out",
                  str(out / "cluster.yaml")], out / "profile_hardware.log", timeout_s=300)
        cluster = str(out / "cluster.yaml")

    print("2. plan (stack autoplan)", flush=True)
    plan = out / "plan.yaml"
    seq = [] if smoke and not args.seq_len else ["--seq-len", str(args.seq_len or 2048)]
    autoplan(["plan", model, "--cluster", cluster, "--nodes", "1", "--devices-per-node", "1",
              "--global-batch-size", str(batch), *seq, "--stack", "autoplan", "-o", str(plan)],
             out / "plan.log", timeout_s=120)

    print(f"3. run ({steps} steps, the last under the profiler)", flush=True)
    metrics, trace = out / "metrics.jsonl", out / "trace"
    shutil.rmtree(trace, ignore_errors=True)
    autoplan(["run", str(plan), "--steps", str(steps), "--data", "synthetic", "--metrics", str(metrics),
              "--trace", str(trace)], out / "run.log", timeout_s=360)

    print("4. predicted against measured", flush=True)
    data = json.loads(autoplan(["compare", str(plan), str(metrics), "--trace", str(trace), "--json"],
                               out / "compare.log", timeout_s=120))
    from autoplan.schema import load_plan

    predicted = load_plan(plan).predicted
    data["predicted_reserved_gib"] = predicted.memory.reserved_gib
    data["measured_reserved_gib"] = measured_reserved_gib(metrics)
    data["wall_s"] = round(time.perf_counter() - t0, 1)
    (out / "gpu_check.json").write_text(json.dumps(data, indent=1))
    print(render(data))
    print(f"({data['wall_s']:.0f} s; files in {out}/)")
    return 0


def render(d: dict) -> str:
    lines = [f"{d['model']}: {d['layout']}",
             f"step time   predicted {d['predicted_step_time_s']:.4f} s   measured {d['measured_step_time_s']:.4f} s   "
             f"error {100 * d['step_time_rel_error']:+.1f}% (predicted - measured, over measured)",
             f"{'term':14s} {'predicted s':>12s} {'measured s':>12s}"]
    measured = d.get("measured_breakdown") or {}
    for term, value in d["predicted_breakdown"].items():
        m = measured.get(term)
        if value or m:
            lines.append(f"{term:14s} {value:12.4f} {'' if m is None else f'{m:12.4f}'}")
    lines.append(f"peak memory predicted {d['predicted_peak_memory_gib']:.2f} GiB, measured (max allocated) "
                 f"{d['measured_peak_memory_gib']:.2f} GiB, error {100 * d['peak_memory_rel_error']:+.1f}%")
    if d.get("measured_reserved_gib") is not None:
        lines.append(f"reserved    predicted {d['predicted_reserved_gib']:.2f} GiB, measured (max reserved) "
                     f"{d['measured_reserved_gib']:.2f} GiB")
    lines.append(f"verdict: {d.get('verdict', '-')}")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
