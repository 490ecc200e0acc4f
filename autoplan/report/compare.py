"""Predicted against measured: what ``autoplan compare`` computes and prints.

Inputs are files only (the plan, the run's metrics JSON lines, optionally the measured step trace of
``autoplan run --trace``), so comparing never needs torch or the runtime.

Conventions: the measured step time and tokens/s are medians over the steps after ``warmup_steps``
(default 1: the first step pays one-off costs) leaving out profiled steps when any others remain (the
profiler slows the steps it records). Peak memory per rank is the highest over the non-profiled steps (on
CPU the profiler's buffers sit in the measured heap). Relative error = (predicted - measured) / measured
(autoplan.schema.trace.relative_error, as in the run's summary line). A CPU run also reports the host's
speed against its calibration (a fixed GEMM and eager op timed after each step, runtime/train/speed_probe.py)
and the plan re-evaluated at that speed (autoplan/cost/cpu_host/host_speed.py), beside the raw prediction: a shared
host drifts by tens of percent within minutes.
The time split sets the cost model's ``TimeBreakdown`` of its critical pipeline rank against the mean of
the traced steps of that rank's first replica (dp 0, tp 0); terms as in autoplan/schema/trace.py. The
verdict names the term whose predicted and measured seconds differ most.

The files are read and checked by autoplan/report/measured_files.py. Rows written with the plan's
fingerprint (autoplan/schema/fingerprint.py) are compared only with that plan.
"""

from __future__ import annotations

import dataclasses
import statistics
from dataclasses import dataclass
from typing import Any

from autoplan.cost.cpu_host.host_speed import at_host_speed
from autoplan.errors import SpecError
from autoplan.report.simulated import SimulatedStep, simulate_plan, terms_of
from autoplan.report.tables import layout_label, render
from autoplan.schema import Plan
from autoplan.report.measured_files import MERGED_TRACE, read_measured_trace, read_metrics  # noqa: F401 (re-exported)
from autoplan.schema.fingerprint import FINGERPRINT_KEY, plan_fingerprint
from autoplan.schema.trace import MEASURED_TERMS, SLICE_NAMES, host_speed, relative_error


@dataclass(frozen=True)
class MeasuredRun:
    rows: list[dict]
    used: list[dict]
    """The rows the medians are taken over."""
    skipped_warmup: int
    skipped_profiled: int
    step_time_s: float
    tokens_per_s: float
    peak_gib_per_rank: list[float]
    """Empty when the metrics predate per-rank peaks (then only ``peak_gib`` is known)."""
    peak_gib: float
    source: str = "the metrics"
    """The metrics file, for messages."""
    plan_fingerprint: str | None = None
    """autoplan.schema.fingerprint of the plan the run trained; None in files written before it was recorded."""


def measured_run(rows: list[dict], warmup_steps: int = 1, source: str = "the metrics") -> MeasuredRun:
    """Medians and peaks of rows that ``read_metrics`` checked; ``source`` names them in messages."""
    if warmup_steps < 0:
        raise SpecError(f"--warmup-steps: must be >= 0, got {warmup_steps}")
    if warmup_steps >= len(rows):
        raise SpecError(f"--warmup-steps: {warmup_steps} leaves none of the {len(rows)} steps; lower it")
    after = rows[warmup_steps:]
    clean = [r for r in after if not r.get("profiled")]
    used = clean or after
    unprofiled = [r for r in rows if not r.get("profiled")] or rows
    per_rank = [r["peak_memory_gib_per_rank"] for r in unprofiled if r.get("peak_memory_gib_per_rank")]
    peaks = [max(col) for col in zip(*per_rank)] if per_rank else []
    return MeasuredRun(
        rows=rows, used=used, skipped_warmup=warmup_steps, skipped_profiled=len(after) - len(used),
        step_time_s=statistics.median(r["step_time_s"] for r in used),
        tokens_per_s=statistics.median(r.get("tokens_per_s") or 0.0 for r in used),
        peak_gib_per_rank=peaks, peak_gib=max(r.get("peak_memory_gib", 0.0) for r in unprofiled),
        source=str(source), plan_fingerprint=rows[0].get(FINGERPRINT_KEY),
    )


def comparison(sim: SimulatedStep, run: MeasuredRun, trace: dict[str, Any] | None) -> dict[str, Any]:
    """Everything ``compare --json`` prints."""
    plan, predicted = sim.plan, sim.predicted
    dims = plan.dims
    if run.plan_fingerprint is not None and run.plan_fingerprint != plan_fingerprint(plan):
        raise SpecError(f"{run.source}: written by a run of another plan (fingerprint {run.plan_fingerprint}, this "
                        f"plan's is {plan_fingerprint(plan)}: model, layout or training differ); compare the metrics "
                        "with the plan they were run with")
    if run.peak_gib_per_rank and len(run.peak_gib_per_rank) != dims.world_size:
        n = len(run.peak_gib_per_rank)
        raise SpecError(f"{run.source}: peak_memory_gib_per_rank: {n} value{'s' * (n != 1)} per row, the plan has "
                        f"{dims.world_size} ranks; compare the metrics with the plan they were run with")
    memory = [{"rank": r, "pp_rank": dims.coords(r).pp, "predicted_gib": sim.memory_per_rank[dims.coords(r).pp].total_gib,
               "measured_gib": g} for r, g in enumerate(run.peak_gib_per_rank)]
    for m in memory:
        m["rel_error"] = relative_error(m["predicted_gib"], m["measured_gib"])
    used_steps = [r.get("step") for r in run.used]
    data: dict[str, Any] = {
        "model": plan.model.name, "layout": layout_label(plan),
        "predicted_step_time_s": sim.step_s, "measured_step_time_s": run.step_time_s,
        "step_time_rel_error": relative_error(sim.step_s, run.step_time_s),
        "steps": {"recorded": len(run.rows), "skipped_warmup": run.skipped_warmup,
                  "skipped_profiled": run.skipped_profiled, "used": len(run.used), "used_steps": used_steps},
        "predicted_tokens_per_s": predicted.tokens_per_s, "measured_tokens_per_s": run.tokens_per_s,
        "tokens_per_s_rel_error": relative_error(predicted.tokens_per_s, run.tokens_per_s),
        "predicted_peak_memory_gib": predicted.peak_memory_gib, "measured_peak_memory_gib": run.peak_gib,
        "peak_memory_rel_error": relative_error(predicted.peak_memory_gib, run.peak_gib),
        "memory_per_rank": memory,
        "plan_file_step_time_s": sim.plan_predicted.step_time_s if sim.plan_predicted else None,
        "critical_pp_rank": sim.evaluation.critical_rank,
        "predicted_breakdown": {**terms_of(sim.time_per_rank[sim.evaluation.critical_rank]), "other": 0.0},
        "measured_breakdown": None,
    }
    data.update(_at_host_speed(plan, run))
    if trace is not None:
        data.update(_measured_split(sim, trace))
    data["verdict"] = verdict(data)
    return data


def _at_host_speed(plan: Plan, run: MeasuredRun) -> dict[str, Any]:
    """The host's speed over the steps the medians use (runtime/train/speed_probe.py, probed after each
    step) and the plan re-evaluated on the cluster at that speed (autoplan/cost/cpu_host/host_speed.py). None
    where the calibration or the run has no probes (GPUs, older files)."""
    d = plan.cluster.device
    speed = host_speed(d.probe_gemm_us, d.probe_op_us, run.used)
    if speed is None:
        return {"host_speed": None, "speed_adjusted_predicted_step_time_s": None,
                "speed_adjusted_step_time_rel_error": None}
    slower = dataclasses.replace(plan, cluster=at_host_speed(plan.cluster, speed))
    adjusted = simulate_plan(slower).step_s
    return {"host_speed": {"kernel": speed.kernel, "host": speed.host},
            "speed_adjusted_predicted_step_time_s": adjusted,
            "speed_adjusted_step_time_rel_error": relative_error(adjusted, run.step_time_s)}


def at_speed_line(data: dict[str, Any]) -> str:
    """One line: the host's speed during the run and the prediction at that speed (``comparison``'s data)."""
    speed = data["host_speed"]
    return (f"host speed during the run against its calibration: kernels {speed['kernel']:.2f}x, host work "
            f"{speed['host']:.2f}x (runtime/train/speed_probe.py); re-evaluated at that speed the plan predicts "
            f"{data['speed_adjusted_predicted_step_time_s']:.4g} s, measured {data['measured_step_time_s']:.4g} s "
            f"(error {_pct(data['speed_adjusted_step_time_rel_error'])})")


def _measured_split(sim: SimulatedStep, trace: dict[str, Any]) -> dict[str, Any]:
    pp_rank = sim.evaluation.critical_rank
    ranks = trace.get("ranks", {})
    chosen = next((k for k, r in sorted(ranks.items(), key=lambda kv: int(kv[0]))
                   if r.get("pp_rank") == pp_rank and r.get("dp_rank") == 0 and r.get("cp_rank", 0) == 0
                   and r.get("tp_rank") == 0), None)
    if chosen is None or not ranks[chosen].get("steps"):
        raise SpecError(f"--trace: no traced steps of pipeline rank {pp_rank} (dp 0, tp 0) in the trace; "
                        "was it recorded for this plan?")
    r = ranks[chosen]
    return {"breakdown_rank": int(chosen), "measured_breakdown": {t: r["terms_s"].get(t, 0.0) for t in MEASURED_TERMS},
            "traced_step_time_s": r["step_time_s"], "traced_steps": [s["step"] for s in r["steps"]],
            "trace_mode": r.get("mode", "host")}


def verdict(data: dict[str, Any]) -> str:
    pred, meas = data["predicted_breakdown"], data["measured_breakdown"]
    if meas is None:
        step, mem = data["step_time_rel_error"] or 0.0, data["peak_memory_rel_error"] or 0.0
        worse = "step time" if abs(step) >= abs(mem) else "peak memory"
        return (f"{worse} is the most wrong ({step:+.1%} step time, {mem:+.1%} peak memory); "
                "run with --trace DIR and compare --trace DIR to see which term")
    gaps = {t: meas[t] - pred.get(t, 0.0) for t in MEASURED_TERMS}
    term = max(gaps, key=lambda t: abs(gaps[t]))
    total = data["traced_step_time_s"] - data["predicted_step_time_s"]
    ratio = f"{meas[term] / pred[term]:.3g}x" if pred.get(term, 0.0) > 1e-7 else \
        "not modelled" if term == "other" else "predicted 0"
    share = f", {gaps[term] / total:.0%} of the {total:+.4g} s gap" if total else ""
    return (f"{_label(term)} is the most wrong term: predicted {pred.get(term, 0.0):.4g} s, measured "
            f"{meas[term]:.4g} s per step ({ratio}; {gaps[term]:+.4g} s{share})")


def _label(term: str) -> str:
    return SLICE_NAMES.get(term, term.replace("_", " ")) + (" (not modelled)" if term == "other" else "")


def render_comparison(data: dict[str, Any], metrics_path: str) -> str:
    st = data["steps"]
    used = st["used_steps"]
    lines = [f"{data['model']}: {data['layout']}, predicted (cost model) vs measured ({metrics_path})",
             f"steps: {st['recorded']} recorded, skipped {st['skipped_warmup']} warm-up"
             + (f" and {st['skipped_profiled']} profiled" if st["skipped_profiled"] else "")
             + f"; medians over {st['used']} (steps {used[0]}-{used[-1]})", ""]
    rows = [["step time (s)", f"{data['predicted_step_time_s']:.4g}", f"{data['measured_step_time_s']:.4g}",
             _pct(data["step_time_rel_error"]), _ratio(data["measured_step_time_s"], data["predicted_step_time_s"])],
            ["tokens/s", f"{data['predicted_tokens_per_s']:,.0f}", f"{data['measured_tokens_per_s']:,.0f}",
             _pct(data["tokens_per_s_rel_error"]), _ratio(data["measured_tokens_per_s"], data["predicted_tokens_per_s"])],
            ["peak memory (GiB)", f"{data['predicted_peak_memory_gib']:.4g}", f"{data['measured_peak_memory_gib']:.4g}",
             _pct(data["peak_memory_rel_error"]),
             _ratio(data["measured_peak_memory_gib"], data["predicted_peak_memory_gib"])]]
    lines.append(render(rows, ["", "predicted", "measured", "error", "measured/predicted"]))
    if data["host_speed"] is not None:
        lines += ["", at_speed_line(data)]
    if data["memory_per_rank"]:
        mem = [[str(m["rank"]), str(m["pp_rank"]), f"{m['predicted_gib']:.4g}", f"{m['measured_gib']:.4g}",
                _pct(m["rel_error"])] for m in data["memory_per_rank"]]
        lines += ["", render(mem, ["rank", "pp rank", "predicted GiB", "measured GiB", "error"])]
    plan_s = data["plan_file_step_time_s"]
    if plan_s is not None and abs(plan_s - data["predicted_step_time_s"]) > 1e-9 * max(plan_s, 1e-30):
        lines += ["", f"note: the plan file predicted {plan_s:.4g} s; re-evaluated with today's cost model it is "
                  f"{data['predicted_step_time_s']:.4g} s (used above)"]
    if data["measured_breakdown"] is not None:
        lines += ["", _split_table(data)]
    return "\n".join(lines + ["", "verdict: " + data["verdict"]])


def _split_table(data: dict[str, Any]) -> str:
    pred, meas = data["predicted_breakdown"], data["measured_breakdown"]
    p_total, m_total = data["predicted_step_time_s"], data["traced_step_time_s"]
    rows = [[_label(t), _sec(pred.get(t, 0.0)), f"{100 * pred.get(t, 0.0) / p_total:.1f}%", _sec(meas[t]),
             f"{100 * meas[t] / m_total:.1f}%", _sec(meas[t] - pred.get(t, 0.0), "+")] for t in MEASURED_TERMS]
    rows.append(["step", _sec(p_total), "", _sec(m_total), "", _sec(m_total - p_total, "+")])
    steps = data["traced_steps"]
    head = (f"time split of one step on rank {data['breakdown_rank']} (pipeline rank {data['critical_pp_rank']}, the "
            f"cost model's critical rank); measured: mean of {len(steps)} profiled steps ({steps[0]}-{steps[-1]}, "
            f"{'device' if data['trace_mode'] == 'device' else 'host'} time), slower than unprofiled ones")
    return head + "\n" + render(rows, ["term", "predicted s", "share", "measured s", "share", "measured - predicted"])


def _sec(x: float, sign: str = "") -> str:
    """Seconds to 4 significant digits; below 0.1 us (the cost table's ns rounding) shown as 0."""
    return "0" if abs(x) < 1e-7 else f"{x:{sign}.4g}"


def _pct(x: float | None) -> str:
    return "n/a" if x is None else f"{x:+.1%}"


def _ratio(measured: float, predicted: float) -> str:
    return f"{measured / predicted:.3g}x" if predicted else "n/a"
