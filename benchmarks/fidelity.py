"""How well the cost model predicts this machine: plans for gpt-tiny, llama-tiny and a ~100M GPT on 1-4 gloo
ranks (varying tp, pp, dp, ZeRO, schedule, micro-batch and recomputation), each planned with the
calibrated cluster (``autoplan calibrate``), run with ``autoplan run`` and compared with ``autoplan
compare``: step time (median of the steps after warm-up) and peak memory per rank, predicted vs measured.

Fit and test: the calibrated profile is fitted to kernel- and op-level microbenchmarks only (no plan below
is part of its fit), so every plan is a test plan. ``--refine`` adds the optional whole-run refinement
(``autoplan calibrate --runs``'s one parameter, collective_wait_factor), fitted on every other plan of the
list and scored on the others only, from the same runs (no extra launches). ``chosen_vs_best``: the plan
``autoplan plan`` chooses for gpt-tiny on 4 ranks (measured with the others of its group) against the
fastest measured plan of that group - 1.

Host speed: a shared host drifts (on the 2-core test machine the same fixed work took 88 ms and, minutes
later, 140 ms), so every CPU run times a fixed GEMM and a fixed eager op after each step and the
calibration records the same probes (runtime/train/speed_probe.py). The table gives each run's kernel and
host speed against the calibration ("speed k/h") and the error of the plan re-evaluated at that speed
(``autoplan compare``, autoplan/cost/host_speed.py) beside the raw error; the figures are printed for
both. The probes are kernel-level measurements: nothing is fitted to the runs.

Which figures are judged: the errors at the host's speed during each run, where every run has probes (a
CPU host calibrated with them), else the raw ones. The raw figures mix the cost model's error with the
host's drift between the calibration and the run, which no cost model can predict: on 2026-12-06 this
2-core host computed the calibration's fixed GEMM in 572 us in the shipped calibration (taken that
morning), 1,195 us in the calibration this benchmark made, and 1,100-1,600 us during its runs 5-20
minutes later, so every plan was under-predicted by 8-34% while, at the measured speed, the same
predictions were within 21%. Both sets of figures are printed and in ``--json`` (``raw`` and
``at_host_speed``); ``targets`` says which were judged and whether each target was met.

Usage (from the repository root): python benchmarks/fidelity.py [--cluster NAME] [--quick] [--repeats N]
[--json] [--keep DIR] [--rescore DIR] [--refine]. By default it first runs ``autoplan calibrate`` into its
scratch folder and plans on that cluster; ``--cluster NAME`` (say the shipped cpu-local-calibrated) skips that. Targets
(issue 8): Spearman >= 0.9, median |error| <= 15%, max <= 30%, chosen_vs_best <= 10%, memory median |error|
<= 25%. The runtime runs one plan per torchrun launch; every plan is launched ``--repeats`` times (default
3), the whole list once per round, and scored by its median launch: on this host the same plan measured
0.378 s and 0.566 s ten minutes apart, and one launch per plan put that drift on whichever plans ran in a
slow spell.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import NoReturn

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from autoplan.profiler.hardware.calibration_fit import spearman  # noqa: E402

GPT_100M = str(ROOT / "benchmarks" / "data" / "gpt-100m.yaml")
CHOSEN_GROUP = "gpt-tiny x4"
# (group, model, ranks, global batch, pinned flags); the group shares model, ranks and batch
PLANS: list[tuple[str, str, int, int, list[str]]] = [
    ("gpt-tiny x4", "gpt-tiny", 4, 16, ["--dp", "4", "--zero-stage", "0", "--micro-batch-size", "4"]),
    ("gpt-tiny x4", "gpt-tiny", 4, 16, ["--dp", "4", "--zero-stage", "3", "--micro-batch-size", "2"]),
    ("gpt-tiny x4", "gpt-tiny", 4, 16, ["--tp", "2", "--dp", "2", "--micro-batch-size", "8"]),
    ("gpt-tiny x4", "gpt-tiny", 4, 16, ["--pp", "2", "--dp", "2", "--schedule", "1f1b", "--micro-batch-size", "2"]),
    ("gpt-tiny x4", "gpt-tiny", 4, 16, ["--pp", "4", "--schedule", "gpipe", "--micro-batch-size", "2"]),
    ("gpt-tiny x4", "gpt-tiny", 4, 16, ["--pp", "4", "--schedule", "1f1b", "--micro-batch-size", "4",
                                        "--recompute", "full"]),
    ("gpt-tiny x4", "gpt-tiny", 4, 16, ["--tp", "4", "--micro-batch-size", "16"]),
    ("llama-tiny x1", "llama-tiny", 1, 16, ["--micro-batch-size", "8"]),
    ("llama-tiny x2", "llama-tiny", 2, 16, ["--dp", "2", "--zero-stage", "2", "--micro-batch-size", "4"]),
    ("llama-tiny x2", "llama-tiny", 2, 16, ["--pp", "2", "--schedule", "interleaved", "--virtual-stages", "2",
                                            "--micro-batch-size", "2"]),
    ("llama-tiny x4", "llama-tiny", 4, 16, ["--tp", "2", "--pp", "2", "--micro-batch-size", "4",
                                            "--recompute", "selective"]),
    ("llama-tiny x4", "llama-tiny", 4, 16, ["--dp", "4", "--zero-stage", "1", "--micro-batch-size", "2"]),
    ("gpt-100m x1", GPT_100M, 1, 4, ["--micro-batch-size", "2"]),
    ("gpt-100m x2", GPT_100M, 2, 4, ["--pp", "2", "--schedule", "1f1b", "--micro-batch-size", "1"]),
]
QUICK = [0, 4, 7, 9]
CHOSEN_JOB = (len(PLANS), CHOSEN_GROUP, "gpt-tiny", 4, 16, ["(the planner's choice, nothing pinned)"])
"""The planner's own choice for gpt-tiny on 4 ranks, measured as one more plan when no pinned plan is it."""


TARGETS = {"spearman": 0.9, "median_abs_error": 0.15, "max_abs_error": 0.30, "chosen_vs_best": 0.10,
           "memory_median_abs_error": 0.25}
"""Issue 8's targets: spearman at least, the others at most."""


def met(value: float | None, bound: float, name: str) -> bool:
    """Within 1e-9 of the bound counts as met: 5 plans in one swapped pair give Spearman 0.9 as 0.8999...98."""
    if value is None:
        return False
    return value >= bound - 1e-9 if name == "spearman" else value <= bound + 1e-9


def scores(predicted: list[float], measured: list[float], errors: list[float]) -> dict:
    """Spearman of predicted against measured step times, and the median and largest |relative error|."""
    return {"spearman": spearman(predicted, measured), "median_abs_error": statistics.median(map(abs, errors)),
            "max_abs_error": max(map(abs, errors))}


def autoplan(*args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    return subprocess.run([sys.executable, "-m", "autoplan.cli.main", *args], capture_output=True, text=True,
                          env=env, cwd=ROOT)


def checked(result: subprocess.CompletedProcess, what: str) -> str:
    if result.returncode != 0:
        raise SystemExit(f"fidelity: {what} failed ({result.returncode}): {result.stderr.strip()[-800:]}")
    return result.stdout


def plan_one(tmp: Path, i: int, model: str, ranks: int, gbs: int, flags: list[str], cluster: str) -> Path:
    plan = tmp / f"plan{i}.yaml"
    checked(autoplan("plan", model, "--cluster", cluster, "--devices-per-node", str(ranks),
                     "--global-batch-size", str(gbs), *flags, "-o", str(plan)), f"plan {i}")
    return plan


def run_one(tmp: Path, i: int, round_: int, steps: int, warmup: int) -> dict:
    """One launch of plan i; ``autoplan compare``'s JSON of it (its metrics file is kept per round)."""
    metrics = tmp / f"metrics{i}-round{round_}.jsonl"
    checked(autoplan("run", str(tmp / f"plan{i}.yaml"), "--steps", str(steps), "--metrics", str(metrics)),
            f"run {i}")
    return compare_one(tmp, i, round_, warmup)


def compare_one(tmp: Path, i: int, round_: int, warmup: int) -> dict:
    metrics = tmp / f"metrics{i}-round{round_}.jsonl"
    data = json.loads(checked(autoplan("compare", str(tmp / f"plan{i}.yaml"), str(metrics), "--warmup-steps",
                                       str(warmup), "--json"), f"compare {i}"))
    data["metrics_file"] = str(metrics)
    return data


def warmup_steps(group: str, quick: bool) -> tuple[int, int]:
    """(steps, warm-up steps left out of the median) of one launch: fewer for the 100M model's long steps."""
    big = "100m" in group
    return ((4, 2) if big else (8, 3)) if quick else ((6, 2) if big else (14, 4))


def median_run(runs: list[dict]) -> dict:
    """The run whose measured step is the median of the rounds (the lower one of an even count): one real
    run, so its step time, memory and host-speed probes belong together."""
    return sorted(runs, key=lambda d: d["measured_step_time_s"])[(len(runs) - 1) // 2]


def chosen_layout(tmp: Path, cluster: str) -> str:
    out = tmp / "chosen.yaml"
    checked(autoplan("plan", "gpt-tiny", "--cluster", cluster, "--devices-per-node", "4", "--global-batch-size",
                     "16", "-o", str(out)), "the planner's own choice")
    return plan_key(out)


def plan_key(path: Path) -> str:
    """Layout and recomputation: two plans of one layout label differ when one recomputes."""
    from autoplan.report.tables import layout_label, recompute_label
    from autoplan.schema import load_plan
    plan = load_plan(path)
    return f"{layout_label(plan)}, recompute {recompute_label(plan)}"


def row_of(runs: list[dict], tmp: Path, i: int, group: str, ranks: int, flags: list[str]) -> dict:
    d = median_run(runs)
    mem = d["memory_per_rank"]
    return {"group": group, "model": d["model"], "ranks": ranks, "layout": d["layout"],
            "key": plan_key(tmp / f"plan{i}.yaml"), "flags": " ".join(flags),
            "predicted_step_s": d["predicted_step_time_s"], "measured_step_s": d["measured_step_time_s"],
            "step_error": d["step_time_rel_error"],
            "host_speed": d["host_speed"], "adjusted_predicted_step_s": d["speed_adjusted_predicted_step_time_s"],
            "adjusted_step_error": d["speed_adjusted_step_time_rel_error"],
            "memory_errors": [m["rel_error"] for m in mem],
            "predicted_memory_gib": [m["predicted_gib"] for m in mem],
            "measured_memory_gib": [m["measured_gib"] for m in mem], "role": "test",
            "measured_rounds_s": [r["measured_step_time_s"] for r in runs],
            "files": (str(tmp / f"plan{i}.yaml"), d["metrics_file"])}


def _refined(cluster_name: str, rows: list[dict]) -> dict:
    """The run-level refinement fitted on rows 0, 2, 4, ... and scored on rows 1, 3, 5, ..."""
    import dataclasses

    from autoplan.report.compare import measured_run, read_metrics
    from autoplan.report.refine import refine
    from autoplan.report.simulated import simulate_plan
    from autoplan.schema import load_cluster, load_plan

    cluster = load_cluster(cluster_name)
    r = refine(cluster, [row["files"] for row in rows])
    test = rows[1::2]
    errors, predicted, measured = [], [], []
    for row in test:
        plan = load_plan(row["files"][0])
        plan = dataclasses.replace(plan, cluster=dataclasses.replace(plan.cluster, collective_wait_factor=r.factor))
        step = simulate_plan(plan).step_s
        meas = measured_run(read_metrics(row["files"][1]), 2).step_time_s
        errors.append(abs(step - meas) / meas)
        predicted.append(step)
        measured.append(meas)
    return {"factor": r.factor, "fit_plans": list(range(0, len(rows), 2)), "test_plans": list(range(1, len(rows), 2)),
            "test_median_abs_error": statistics.median(errors), "test_max_abs_error": max(errors),
            "test_spearman": spearman(predicted, measured)}


def measured(args: argparse.Namespace, tmp: Path, chosen_plans: list[int], say) -> tuple[list[dict], str, float]:
    """Calibrate (unless a cluster is named), plan, launch every plan ``args.repeats`` times in rounds and
    compare: (rows, the planner's choice, seconds of runs)."""
    tmp.mkdir(parents=True, exist_ok=True)
    if args.cluster is None and args.quick:
        args.cluster = "cpu-local-calibrated"
    if args.cluster is None:
        # the micro-benchmarks then see the host as the runs do: a shared host drifts by tens of percent
        # within an hour, and the shipped calibration was taken on another day
        say("fidelity: autoplan calibrate (kernel and op micro-benchmarks, about 3 minutes)")
        checked(autoplan("calibrate", "--quiet", "-o", str(tmp / "calibrated-device.yaml"),
                         "--cluster-out", str(tmp / "calibrated-cluster.yaml")), "calibrate")
        args.cluster = str(tmp / "calibrated-cluster.yaml")
    chosen = chosen_layout(tmp, args.cluster)
    say(f"fidelity: the planner chooses {chosen} for gpt-tiny on 4 ranks")
    start = time.perf_counter()
    jobs = [(i, *PLANS[i]) for i in chosen_plans]
    for i, group, model, ranks, gbs, flags in jobs:
        plan_one(tmp, i, model, ranks, gbs, flags, args.cluster)
    if not any(plan_key(tmp / f"plan{i}.yaml") == chosen for i, group, *_ in jobs if group == CHOSEN_GROUP):
        # the planner's choice is not among the pinned plans: it is measured as one more test plan
        plan_one(tmp, CHOSEN_JOB[0], "gpt-tiny", 4, 16, [], args.cluster)
        jobs.append(CHOSEN_JOB)
    runs: dict[int, list[dict]] = {i: [] for i, *_ in jobs}
    for round_ in range(args.repeats):
        # round after round rather than plan after plan: the host's drift then lands on every plan alike
        for n, (i, group, model, ranks, gbs, flags) in enumerate(jobs):
            steps, warmup = warmup_steps(group, args.quick)
            say(f"fidelity: round {round_ + 1}/{args.repeats} [{n + 1}/{len(jobs)}] {group} {' '.join(flags)} "
                f"({time.perf_counter() - start:.0f} s)")
            runs[i].append(run_one(tmp, i, round_, steps, warmup))
    rows = [row_of(runs[i], tmp, i, group, ranks, flags) for i, group, model, ranks, gbs, flags in jobs]
    seconds = time.perf_counter() - start
    return rows, chosen, seconds


def bad_input(message: str) -> NoReturn:
    print(f"fidelity: {message}", file=sys.stderr)
    raise SystemExit(2)


def rescored(tmp: Path, quick: bool) -> tuple[list[dict], str, str, int]:
    """The rows of a kept folder's plans and metrics, compared again (no run): (rows, the planner's choice,
    cluster, launches per plan)."""
    if not (tmp / "chosen.yaml").is_file():
        bad_input(f"--rescore {tmp}: no chosen.yaml there; give a folder a --keep run left")
    chosen = plan_key(tmp / "chosen.yaml")
    jobs = [(i, *PLANS[i]) for i in range(len(PLANS)) if (tmp / f"plan{i}.yaml").is_file()]
    if (tmp / f"plan{len(PLANS)}.yaml").is_file():
        jobs.append(CHOSEN_JOB)
    rows, repeats = [], 0
    for i, group, model, ranks, gbs, flags in jobs:
        rounds = sorted(int(m.stem.split("round")[1]) for m in tmp.glob(f"metrics{i}-round*.jsonl"))
        if not rounds:
            bad_input(f"--rescore {tmp}: plan{i}.yaml has no metrics{i}-round*.jsonl; give a folder whose --keep "
                      "run finished")
        repeats = max(repeats, len(rounds))
        runs = [compare_one(tmp, i, r, warmup_steps(group, quick)[1]) for r in rounds]
        rows.append(row_of(runs, tmp, i, group, ranks, flags))
    cluster = tmp / "calibrated-cluster.yaml"
    return rows, chosen, str(cluster) if cluster.is_file() else "cpu-local-calibrated", repeats


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--cluster", help="plan on this calibrated cluster instead of calibrating first (the shipped "
                                      "one is cpu-local-calibrated; --quick uses it)")
    p.add_argument("--quick", action="store_true", help="4 plans, fewer steps, one launch each: a smoke test")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.add_argument("--keep", help="keep plans and metrics in this folder")
    p.add_argument("--repeats", type=int, default=None,
                   help="launch every plan this many times, in rounds, and score each plan's median launch "
                        "(default 3, 1 with --quick)")
    p.add_argument("--rescore", metavar="DIR",
                   help="score the plans and metrics a --keep DIR run left, without calibrating or running again")
    p.add_argument("--refine", action="store_true",
                   help="also fit the run-level refinement on every other plan and score the rest")
    args = p.parse_args()
    if args.repeats is None:
        args.repeats = 1 if args.quick else 3
    if args.repeats < 1:
        p.error("--repeats: give 1 or more launches per plan")
    say = (lambda m: print(m, file=sys.stderr, flush=True))
    chosen_plans = [i for i in (QUICK if args.quick else range(len(PLANS)))]
    with tempfile.TemporaryDirectory() as scratch:
        if args.rescore:
            rows, chosen, args.cluster, args.repeats = rescored(Path(args.rescore), args.quick)
            seconds = 0.0
        else:
            rows, chosen, seconds = measured(args, Path(args.keep or scratch), chosen_plans, say)
        refined = _refined(args.cluster, rows) if args.refine else None
    for r in rows:
        r.pop("files")
    raw = scores([r["predicted_step_s"] for r in rows], [r["measured_step_s"] for r in rows],
                 [r["step_error"] for r in rows])
    adjusted = None
    if all(r["adjusted_step_error"] is not None for r in rows):
        adjusted = scores([r["adjusted_predicted_step_s"] for r in rows], [r["measured_step_s"] for r in rows],
                          [r["adjusted_step_error"] for r in rows])
        adjusted["kernel_speed_range"] = [min(r["host_speed"]["kernel"] for r in rows),
                                          max(r["host_speed"]["kernel"] for r in rows)]
        adjusted["host_speed_range"] = [min(r["host_speed"]["host"] for r in rows),
                                        max(r["host_speed"]["host"] for r in rows)]
    judged = adjusted or raw
    mem_errors = [abs(e) for r in rows for e in r["memory_errors"] if e is not None]
    group_rows = [r for r in rows if r["group"] == CHOSEN_GROUP]
    best = min(r["measured_step_s"] for r in group_rows)
    chosen_step = next(r["measured_step_s"] for r in group_rows if r["key"] == chosen)
    figures = {**{k: judged[k] for k in ("spearman", "median_abs_error", "max_abs_error")},
               "chosen_vs_best": chosen_step / best - 1,
               "memory_median_abs_error": statistics.median(mem_errors) if mem_errors else None}
    result = {
        "cluster": args.cluster, "repeats": args.repeats, "plans": rows, "fit_plans": [], "test_plans": len(rows),
        **figures, "judged": "at_host_speed" if adjusted else "raw",
        "chosen_layout": chosen, "chosen_step_s": chosen_step, "best_step_s": best,
        "memory_max_abs_error": max(mem_errors) if mem_errors else None,
        "seconds": round(seconds, 1), "refined": refined, "raw": raw, "at_host_speed": adjusted,
        "targets": {k: {"value": figures[k], "target": bound, "met": met(figures[k], bound, k)}
                    for k, bound in TARGETS.items()},
    }
    if args.json:
        print(json.dumps(result))
        return 0
    print(f"fidelity on {args.cluster}: fit = kernel/op microbenchmarks only (autoplan calibrate); "
          f"test = all {len(rows)} plans below; meas s = the median of {args.repeats} launches in rounds, "
          f"spread = (slowest - fastest launch) / median")
    print(f"{'model':<11}{'ranks':>5}  {'layout, recomputation':<62}{'pred s':>9}{'meas s':>9}{'error':>8}"
          f"{'spread':>8}{'speed k/h':>11}{'at speed':>10}  memory GiB pred/meas (worst rank)")
    for r in rows:
        worst = max(range(len(r["memory_errors"])), key=lambda k: abs(r["memory_errors"][k] or 0))
        print(f"{r['model']:<11}{r['ranks']:>5}  {r['key'][:61]:<62}{r['predicted_step_s']:9.4f}"
              f"{r['measured_step_s']:9.4f}{100 * r['step_error']:+7.1f}%"
              f"{100 * (max(r['measured_rounds_s']) - min(r['measured_rounds_s'])) / r['measured_step_s']:7.0f}%"
              + (f"{r['host_speed']['kernel']:6.2f}/{r['host_speed']['host']:.2f}"
                 f"{100 * r['adjusted_step_error']:+9.1f}%  " if r["host_speed"] else f"{'-':>11}{'-':>10}  ") +
              f"{r['predicted_memory_gib'][worst]:.3f}/{r['measured_memory_gib'][worst]:.3f} "
              f"({100 * (r['memory_errors'][worst] or 0):+.0f}%)")
    print(f"raw (the calibration's speed): spearman {raw['spearman']:.3f}; median |error| "
          f"{100 * raw['median_abs_error']:.1f}%; max |error| {100 * raw['max_abs_error']:.1f}%")
    if adjusted:
        k, h = adjusted["kernel_speed_range"], adjusted["host_speed_range"]
        print(f"at the host's speed during each run (probes between steps against the calibration's: kernels "
              f"{k[0]:.2f}x-{k[1]:.2f}x, host work {h[0]:.2f}x-{h[1]:.2f}x): spearman {adjusted['spearman']:.3f}; "
              f"median |error| {100 * adjusted['median_abs_error']:.1f}%; max |error| {100 * adjusted['max_abs_error']:.1f}%")
    print(f"judged ({result['judged'].replace('_', ' ')}): spearman {judged['spearman']:.3f} (target >= 0.9); "
          f"median |error| {100 * judged['median_abs_error']:.1f}% (<= 15%); "
          f"max |error| {100 * judged['max_abs_error']:.1f}% (<= 30%)")
    print(f"chosen_vs_best {100 * result['chosen_vs_best']:+.1f}% (<= 10%): planner's {chosen} measured "
          f"{chosen_step:.4f} s, fastest of {CHOSEN_GROUP} {best:.4f} s")
    if mem_errors:
        print(f"peak memory per rank: median |error| {100 * result['memory_median_abs_error']:.1f}% (<= 25%), "
              f"max {100 * result['memory_max_abs_error']:.1f}% over {len(mem_errors)} ranks")
    missed = [k for k, v in result["targets"].items() if not v["met"]]
    print("targets: " + ("all met" if not missed else "missed: " + ", ".join(missed)))
    if refined:
        print(f"run-level refinement (apart from the kernel-only figures above): collective_wait_factor "
              f"{refined['factor']} fitted on plans {refined['fit_plans']}; on the other plans {refined['test_plans']}: "
              f"median |error| {100 * refined['test_median_abs_error']:.1f}%, max {100 * refined['test_max_abs_error']:.1f}%, "
              f"spearman {refined['test_spearman']:.3f}")
    print(f"({seconds:.0f} s of runs)" if not args.rescore else f"(rescored {args.rescore}: no runs)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
