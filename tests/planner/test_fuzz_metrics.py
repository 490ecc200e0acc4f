"""Hypothesis fuzz of ``autoplan compare PLAN METRICS [--trace DIR]``: a damaged metrics file (or trace) is
one line, never a traceback, and never a comparison that means nothing.

Each case starts from what a run of the plan writes -- the rows of runtime/train/metrics.py's
``MetricsLog.record`` (plain Python, no torch) for a tp 2, pp 2 plan on the calibrated CPU cluster, with
the plan's fingerprint and the host-speed probes; half the cases add the measured step trace
(``merged.json``) -- and damages it: a field of one row or of every row replaced by a hostile value
(NaN, inf, -1, 0, true, null, text, [1], {}, 2**70, a denormal, ...), a key dropped, the per-rank list
lengthened or shortened, rows duplicated, shuffled or swapped, the file cut short, a Latin-1 byte, a
deeply nested line, a fingerprint of another plan; or the trace's numbers damaged the same way. Then
``main(["compare", ...])`` runs in-process.

What each outcome must be:

* refused: exit status 2 and exactly one line on stderr;
* accepted: exit status 0, and the ``--json`` output means something: every number in it finite (no
  NaN, no inf: ``json.loads`` here refuses them), the measured step time > 0, the step-time relative
  error a finite number (the others finite or null, where nothing was measured), and the text report
  renders too.

60 cases in the fast lane, 600 in the slow lane (``pytest -m slow``).
"""

from __future__ import annotations

import contextlib
import io
import json
import math
import random
import shutil
import tempfile
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from autoplan.cli.main import main
from autoplan.report.simulated import simulate_plan, terms_of
from autoplan.schema import load_plan
from autoplan.schema.fingerprint import plan_fingerprint
from autoplan.schema.trace import MEASURED_TERMS
from runtime.train.metrics import MetricsLog

STEPS = 6
PROFILED = {5, 6}  # the last steps ran under the profiler, as with autoplan run --trace
GENERATED = {"metrics files": 0, "refused": 0, "accepted": 0}


# ------------------------------------------------------------------------------------ valid files
@pytest.fixture(scope="module")
def valid(tmp_path_factory) -> dict[str, Any]:
    """The plan (4 ranks), another plan (dp 4) and what a run of the first one writes."""
    folder = tmp_path_factory.mktemp("fuzz-metrics")
    common = ["--cluster", "cpu-local-calibrated", "--global-batch-size", "8"]
    with contextlib.redirect_stdout(io.StringIO()):
        assert main(["plan", "gpt-tiny", *common, "--tp", "2", "--pp", "2", "-o", str(folder / "plan.yaml")]) == 0
        assert main(["plan", "gpt-tiny", *common, "--tp", "1", "--pp", "1", "--dp", "4",
                     "-o", str(folder / "dp4.yaml")]) == 0
    plan = load_plan(folder / "plan.yaml")
    log = MetricsLog(None, plan.predicted.step_time_s, plan.predicted.peak_memory_gib,
                     calibrated_probes_us=(plan.cluster.device.probe_gemm_us, plan.cluster.device.probe_op_us),
                     plan_fingerprint=plan_fingerprint(plan))
    rng = random.Random(0)
    for step in range(1, STEPS + 1):
        seconds = (9.0 if step == 1 else 2.0 + rng.random()) * plan.predicted.step_time_s
        per_rank = [round(0.05 + 0.01 * rng.random(), 6) for _ in range(plan.dims.world_size)]
        log.record(step, 5.5 - 0.1 * step, seconds, 8 * plan.training.seq_len, max(per_rank), 3e-4, 1.2,
                   peak_gib_per_rank=per_rank, profiled=step in PROFILED,
                   speed_probe={"gemm_us": 600.0 + 50 * rng.random(), "op_us": 3.0 + rng.random()})
    sim = simulate_plan(plan)
    ranks = {}
    for rank in range(plan.dims.world_size):
        c = plan.dims.coords(rank)
        terms = {**terms_of(sim.time_per_rank[c.pp]), "other": 1e-4}
        ranks[str(rank)] = {"pp_rank": c.pp, "dp_rank": c.dp, "cp_rank": c.cp, "tp_rank": c.tp, "mode": "host",
                            "step_time_s": sum(terms.values()), "terms_s": terms,
                            "steps": [{"step": s, "start_us": 0.0, "duration_s": sum(terms.values()), "terms_s": terms}
                                      for s in sorted(PROFILED)]}
    trace = {"traceEvents": [], "otherData": {"autoplan": {"format": 1, "source": "measured", "ranks": ranks}}}
    return {"plan": folder / "plan.yaml", "other_plan": folder / "dp4.yaml", "rows": log.rows, "trace": trace,
            "other_fingerprint": plan_fingerprint(load_plan(folder / "dp4.yaml"))}


# --------------------------------------------------------------------------------------- damage
HOSTILE = st.one_of(
    st.sampled_from([math.nan, math.inf, -math.inf, -1, -1.0, 0, 0.0, -0.0, True, False, None, "text", "", "1.5",
                     [1], [], {}, {"gemm_us": 1.0}, 2**70, -(2**70), 10**30, 1e308, 5e-324, 1e-300, 1e-7,
                     "caf\u00e9", "\n", 2**63]),
    st.floats(allow_nan=True, allow_infinity=True),
    st.integers(-(2**70), 2**70),
    st.sampled_from([0.5, 1, 2, 3, 0.01, 1e-3, 100.0, 1e4, 12345]))  # plausible values: accepts are common too
FIELDS = ["step", "loss", "step_time_s", "tokens_per_s", "peak_memory_gib", "peak_memory_gib_per_rank",
          "peak_memory_gib_per_rank[i]", "profiled", "speed_probe", "speed_probe.gemm_us", "speed_probe.op_us",
          "plan_fingerprint", "lr", "grad_norm"]


def _set_field(row: dict, field: str, value: Any, drop: bool = False) -> None:
    if field == "peak_memory_gib_per_rank[i]":
        per_rank = row.get("peak_memory_gib_per_rank")
        if isinstance(per_rank, list) and per_rank:
            if drop:
                per_rank.pop()
            else:
                per_rank[len(per_rank) // 2] = value
        return
    if field.startswith("speed_probe."):
        probe = row.get("speed_probe")
        if isinstance(probe, dict):
            if drop:
                probe.pop(field.split(".")[1], None)
            else:
                probe[field.split(".")[1]] = value
        return
    if drop:
        row.pop(field, None)
    else:
        row[field] = value


def _dumps(rows: list[Any]) -> str:
    return "".join(json.dumps(r) + "\n" for r in rows)  # NaN and Infinity as Python writes them


@st.composite
def damaged_metrics(draw, rows: list[dict], other_fingerprint: str) -> tuple[bytes, str]:
    """The bytes of a damaged metrics file and what was done (for the failure message)."""
    rows = json.loads(json.dumps(rows))  # a deep copy
    ops = []
    for _ in range(draw(st.integers(1, 2))):
        op = draw(st.sampled_from(["replace", "replace", "replace all", "drop", "drop all", "per-rank length",
                                   "duplicate", "shuffle", "swap", "other plan", "unknown key"]))
        i = draw(st.integers(0, len(rows) - 1))
        if op in ("replace", "replace all"):
            field, value = draw(st.sampled_from(FIELDS)), draw(HOSTILE)
            for row in (rows if op == "replace all" else [rows[i]]):
                _set_field(row, field, value)
            ops.append(f"{op} {field} = {value!r} (row {i})")
        elif op in ("drop", "drop all"):
            field = draw(st.sampled_from(FIELDS))
            for row in (rows if op == "drop all" else [rows[i]]):
                _set_field(row, field, None, drop=True)
            ops.append(f"{op} {field} (row {i})")
        elif op == "per-rank length":
            n = draw(st.sampled_from([0, 1, 2, 3, 5, 8, 9]))
            everywhere = draw(st.booleans())
            for row in (rows if everywhere else [rows[i]]):
                if isinstance(row.get("peak_memory_gib_per_rank"), list):
                    row["peak_memory_gib_per_rank"] = [0.05] * n
            ops.append(f"{n} per-rank values ({'every row' if everywhere else f'row {i}'})")
        elif op == "duplicate":
            rows.insert(i, json.loads(json.dumps(rows[i])))
            ops.append(f"duplicate row {i}")
        elif op == "shuffle":
            draw(st.randoms(use_true_random=False)).shuffle(rows)
            ops.append("shuffle")
        elif op == "swap" and len(rows) > 1:
            j = (i + 1) % len(rows)
            rows[i], rows[j] = rows[j], rows[i]
            ops.append(f"swap rows {i}, {j}")
        elif op == "other plan":
            for row in (rows if draw(st.booleans()) else [rows[i]]):
                row["plan_fingerprint"] = other_fingerprint
            ops.append("fingerprint of another plan")
        elif op == "unknown key":
            rows[i][draw(st.text(min_size=1, max_size=6))] = draw(HOSTILE)
            ops.append(f"unknown key in row {i}")
    try:
        text = _dumps(rows)
    except (ValueError, TypeError):
        text = _dumps(json.loads(json.dumps(rows, default=str)))
    how = draw(st.sampled_from(["as is"] * 6 + ["cut", "latin-1", "deep", "blank lines", "bom", "crlf", "empty"]))
    data = text.encode()
    if how == "cut":
        data = data[: draw(st.integers(0, len(data)))]
    elif how == "latin-1":
        at = draw(st.integers(0, len(text)))
        data = (text[:at] + "caf\u00e9" + text[at:]).encode("latin-1", errors="replace")
    elif how == "deep":
        depth = draw(st.sampled_from([100, 1000, 100_000]))
        data += b"[" * depth + b"]" * draw(st.sampled_from([0, depth])) + b"\n"
    elif how == "blank lines":
        data = data.replace(b"\n", b"\n\n  \n")
    elif how == "bom":
        data = "\ufeff".encode() + data
    elif how == "crlf":
        data = data.replace(b"\n", b"\r\n")
    elif how == "empty":
        data = b""
    ops.append(how)
    return data, "; ".join(ops)


@st.composite
def damaged_trace(draw, trace: dict) -> tuple[bytes, str]:
    trace = json.loads(json.dumps(trace))
    rank = trace["otherData"]["autoplan"]["ranks"][str(draw(st.integers(0, 3)))]
    field = draw(st.sampled_from(["pp_rank", "dp_rank", "tp_rank", "cp_rank", "mode", "step_time_s", "terms_s",
                                  "steps", "terms_s.term", "steps[0].step", "none"]))
    value = draw(HOSTILE)
    if field == "terms_s.term":
        rank["terms_s"][draw(st.sampled_from(MEASURED_TERMS))] = value
    elif field == "steps[0].step":
        rank["steps"][0]["step"] = value
    elif field != "none":
        rank[field] = value
    return json.dumps(trace).encode(), f"trace: {field} = {value!r}"


# ---------------------------------------------------------------------------------------- one case
def _finite_everywhere(obj: Any, where: str, out: list[str]) -> None:
    if isinstance(obj, dict):
        for k, v in obj.items():
            _finite_everywhere(v, f"{where}.{k}", out)
    elif isinstance(obj, list):
        for i, v in enumerate(obj):
            _finite_everywhere(v, f"{where}[{i}]", out)
    elif isinstance(obj, float) and not math.isfinite(obj):
        out.append(f"{where} = {obj}")


def _no_constant(name: str) -> float:
    raise ValueError(f"{name} in the --json output")


def outcome(argv: list[str]) -> tuple[str, str]:
    """("refused" | "accepted" | "traceback" | "multi-line error" | "other exit" | "meaningless", detail)."""
    out, err = io.StringIO(), io.StringIO()
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            code = main(argv + ["--json"])
    except BaseException as exc:  # noqa: BLE001 - what the fuzz looks for
        return "traceback", f"{type(exc).__name__}: {str(exc)[:200]}"
    lines = [line for line in err.getvalue().splitlines() if line.strip()]
    if code == 2:
        return ("refused", lines[0][:300]) if len(lines) == 1 else ("multi-line error", repr(lines[:3]))
    if code != 0 or lines:
        return "other exit", f"exit {code}: {lines[-3:]}"
    try:
        data = json.loads(out.getvalue(), parse_constant=_no_constant)
    except ValueError as exc:
        return "meaningless", str(exc)
    problems: list[str] = []
    _finite_everywhere(data, "output", problems)
    if not data["measured_step_time_s"] > 0:
        problems.append(f"measured step time {data['measured_step_time_s']}")
    if not isinstance(data["step_time_rel_error"], float):
        problems.append(f"step_time_rel_error {data['step_time_rel_error']!r}")
    for key in ("tokens_per_s_rel_error", "peak_memory_rel_error", "speed_adjusted_step_time_rel_error"):
        if data[key] is not None and not isinstance(data[key], float):
            problems.append(f"{key} {data[key]!r}")
    if data["host_speed"] is not None and not all(0 < v < math.inf for v in data["host_speed"].values()):
        problems.append(f"host speed {data['host_speed']}")
    if problems:
        return "meaningless", "; ".join(problems)[:300]
    try:
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
            code = main(argv)  # the text report of what was accepted
    except BaseException as exc:  # noqa: BLE001
        return "traceback", f"text report: {type(exc).__name__}: {str(exc)[:200]}"
    return ("accepted", "") if code == 0 else ("other exit", f"text report: exit {code}")


def _case(valid: dict[str, Any], data) -> None:
    folder = Path(tempfile.mkdtemp(prefix="fuzz-metrics-"))
    try:
        metrics, what = data.draw(damaged_metrics(valid["rows"], valid["other_fingerprint"]))
        (folder / "m.jsonl").write_bytes(metrics)
        argv = ["compare", str(valid["plan"]), str(folder / "m.jsonl")]
        if data.draw(st.booleans()):
            trace, how = data.draw(damaged_trace(valid["trace"])) if data.draw(st.booleans()) else \
                (json.dumps(valid["trace"]).encode(), "valid trace")
            (folder / "trace").mkdir()
            (folder / "trace" / "merged.json").write_bytes(trace)
            argv += ["--trace", str(folder / "trace")]
            what += f"; {how}"
        if data.draw(st.integers(0, 4)) == 0:
            argv += ["--warmup-steps", str(data.draw(st.sampled_from([0, 2, 3, 4, 5, 6, 100])))]
        GENERATED["metrics files"] += 1
        kind, detail = outcome(argv)
        if kind in GENERATED:
            GENERATED[kind] += 1
        assert kind in ("refused", "accepted"), f"{kind}: {detail}\n{what}\n{metrics[:600]!r}"
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def test_the_valid_files_compare(valid, tmp_path, capsys):
    """The starting point is accepted, with its trace, and refused against another plan."""
    metrics = tmp_path / "m.jsonl"
    metrics.write_text(_dumps(valid["rows"]))
    (tmp_path / "merged.json").write_text(json.dumps(valid["trace"]))
    assert outcome(["compare", str(valid["plan"]), str(metrics), "--trace", str(tmp_path)]) == ("accepted", "")
    kind, detail = outcome(["compare", str(valid["other_plan"]), str(metrics)])
    assert kind == "refused" and "written by a run of another plan" in detail, detail


FAST = settings(max_examples=60, deadline=None, derandomize=True, database=None,
                suppress_health_check=list(HealthCheck))
SLOW = settings(max_examples=600, deadline=None, database=None, suppress_health_check=list(HealthCheck))


@FAST
@given(data=st.data())
def test_metrics_fuzz(valid, data):
    _case(valid, data)


@pytest.mark.slow
def test_metrics_fuzz_slow(valid):
    for key in GENERATED:
        GENERATED[key] = 0

    @SLOW
    @given(data=st.data())
    def fuzz(data):
        _case(valid, data)

    fuzz()
    print(f"\nmetrics files generated: {GENERATED['metrics files']} ({GENERATED['refused']} refused, "
          f"{GENERATED['accepted']} accepted)")
