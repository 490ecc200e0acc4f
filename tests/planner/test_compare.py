"""``autoplan compare`` on a synthetic run whose numbers are known: medians, relative errors, memory per
rank and the verdict come out exactly, and comparing needs neither torch nor the runtime."""

import json
import math
import subprocess
import sys

import pytest

from autoplan.cli.main import main
from autoplan.report.simulated import simulate_plan, terms_of
from autoplan.schema import load_plan
from autoplan.schema.trace import MEASURED_TERMS, TIME_TERMS

TOKENS = 8 * 64  # global batch x seq_len of the plan below


@pytest.fixture(scope="module")
def plan_path(tmp_path_factory):
    path = tmp_path_factory.mktemp("cmp") / "plan.yaml"
    assert main(["estimate", "gpt-tiny", "--cluster", "cpu-local", "--devices-per-node", "2", "--global-batch-size", "8",
                 "--tp", "1", "--pp", "2", "--zero-stage", "0", "--schedule", "1f1b", "--micro-batch-size", "2",
                 "-o", str(path)]) == 0
    return path


def write_metrics(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))


def synthetic_rows():
    """Step 1 is warm-up (slow), steps 2-4 are measured (2, 4, 3 s), step 5 ran under the profiler."""
    rows = []
    for step, (t, peaks, profiled) in enumerate([(9.0, [0.5, 0.2], False), (2.0, [0.1, 0.3], False),
                                                 (4.0, [0.2, 0.1], False), (3.0, [0.1, 0.1], False),
                                                 (100.0, [7.0, 7.0], True)], 1):
        row = {"step": step, "loss": 1.0, "step_time_s": t, "tokens_per_s": TOKENS / t,
               "peak_memory_gib": max(peaks), "peak_memory_gib_per_rank": peaks}
        if profiled:
            row["profiled"] = True
        rows.append(row)
    return rows


def synthetic_trace(path, sim, extra_s):
    """A measured trace whose critical rank took the predicted time of each term plus ``extra_s``."""
    critical = sim.evaluation.critical_rank
    ranks = {}
    for r in range(2):
        terms = {**terms_of(sim.time_per_rank[r]), "other": 0.0}
        if r == critical:
            terms = {t: terms[t] + extra_s.get(t, 0.0) for t in MEASURED_TERMS}
        ranks[str(r)] = {"pp_rank": r, "dp_rank": 0, "tp_rank": 0, "mode": "host", "terms_s": terms,
                         "step_time_s": sum(terms.values()), "steps": [{"step": 5, "duration_s": sum(terms.values())}]}
    path.write_text(json.dumps({"traceEvents": [], "otherData": {"autoplan": {"format": 1, "source": "measured",
                                                                             "ranks": ranks}}}))
    return critical


def test_compare_json_has_exact_errors_and_the_most_wrong_term(plan_path, tmp_path, capsys):
    plan = load_plan(plan_path)
    sim = simulate_plan(plan)
    metrics = tmp_path / "m.jsonl"
    write_metrics(metrics, synthetic_rows())
    critical = synthetic_trace(tmp_path / "merged.json", sim, {"bubble": 0.02, "compute": -0.05, "other": 0.01})
    assert main(["compare", str(plan_path), str(metrics), "--trace", str(tmp_path), "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    predicted = plan.predicted.step_time_s
    assert data["predicted_step_time_s"] == pytest.approx(predicted, rel=1e-12)
    assert data["measured_step_time_s"] == 3.0  # median of steps 2-4; warm-up and profiled step left out
    assert data["step_time_rel_error"] == pytest.approx((predicted - 3.0) / 3.0, rel=1e-12)
    assert data["steps"] == {"recorded": 5, "skipped_warmup": 1, "skipped_profiled": 1, "used": 3, "used_steps": [2, 3, 4]}
    assert data["measured_tokens_per_s"] == pytest.approx(TOKENS / 3.0)
    assert data["tokens_per_s_rel_error"] == pytest.approx((plan.predicted.tokens_per_s - TOKENS / 3.0) / (TOKENS / 3.0))
    # peak per rank over the unprofiled steps (warm-up included: memory it needed is memory the run needs)
    assert [m["measured_gib"] for m in data["memory_per_rank"]] == [0.5, 0.3]
    for m, pred_gib in zip(data["memory_per_rank"], plan.predicted.memory_gib_per_stage):
        assert m["predicted_gib"] == pytest.approx(pred_gib)
        assert m["rel_error"] == pytest.approx((pred_gib - m["measured_gib"]) / m["measured_gib"])
    assert data["measured_peak_memory_gib"] == 0.5
    assert set(data["predicted_breakdown"]) == set(TIME_TERMS) | {"other"}
    assert data["breakdown_rank"] == critical
    assert data["measured_breakdown"]["bubble"] == pytest.approx(data["predicted_breakdown"]["bubble"] + 0.02)
    assert data["verdict"].startswith("compute is the most wrong term")  # |-0.05| is the largest gap
    assert "-0.05 s" in data["verdict"]


def test_compare_text_without_trace(plan_path, tmp_path, capsys):
    metrics = tmp_path / "m.jsonl"
    write_metrics(metrics, synthetic_rows())
    assert main(["compare", str(plan_path), str(metrics), "--warmup-steps", "2"]) == 0
    out = capsys.readouterr().out
    assert "skipped 2 warm-up and 1 profiled; medians over 2 (steps 3-4)" in out
    assert "step time (s)" in out and "verdict: step time is the most wrong" in out
    assert "time split" not in out


@pytest.mark.parametrize("argv, fragment", [
    (["missing.jsonl"], "missing.jsonl: no such metrics file"),
    (["{metrics}", "--trace", "{tmp}/nowhere"], "--trace:"),
    (["{metrics}", "--warmup-steps", "5"], "--warmup-steps: 5 leaves none of the 5 steps"),
    (["{bad}"], "bad.jsonl:2: not a JSON line"),
])
def test_bad_input_is_one_line_and_status_2(plan_path, tmp_path, capsys, argv, fragment):
    metrics, bad = tmp_path / "m.jsonl", tmp_path / "bad.jsonl"
    write_metrics(metrics, synthetic_rows())
    bad.write_text('{"step": 1, "step_time_s": 1.0}\n{oops\n')
    argv = [a.format(metrics=metrics, bad=bad, tmp=tmp_path) for a in argv]
    code = main(["compare", str(plan_path), *argv])
    err = capsys.readouterr().err
    assert code == 2 and fragment in err and len(err.strip().splitlines()) == 1


def test_compare_imports_neither_torch_nor_runtime(plan_path, tmp_path):
    metrics = tmp_path / "m.jsonl"
    write_metrics(metrics, synthetic_rows())
    code = ("import sys; from autoplan.cli.main import main; "
            f"assert main(['compare', {str(plan_path)!r}, {str(metrics)!r}, '--json']) == 0; "
            "bad = [m for m in sys.modules if m == 'torch' or m.startswith(('torch.', 'runtime'))]; "
            "assert not bad, bad")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr


def test_compare_re_evaluates_the_plan_at_the_host_speed_the_run_probed(plan_path, tmp_path, capsys):
    """The calibration timed the probe GEMM at 1000 us and the eager op at 4 us. Probes of (2000, 8) and
    (500, 2) us over the timed steps average (geometrically) to the calibration's: speed 1.0, the
    prediction unchanged; the warm-up and profiled steps' probes are left out with their steps. A run
    probing (1250, 8) us throughout ran kernels at 0.8x and host work at 0.5x: the plan re-evaluated on
    that cluster is slower than the raw prediction, and exactly what the cost model gives for it."""
    import dataclasses

    from autoplan.cost.cpu_host.host_speed import at_host_speed
    from autoplan.schema.io import dump_plan
    from autoplan.schema.trace import HostSpeed, host_speed

    plan = load_plan(plan_path)
    device = dataclasses.replace(plan.cluster.device, probe_gemm_us=1000.0, probe_op_us=4.0)
    plan = dataclasses.replace(plan, cluster=dataclasses.replace(plan.cluster, device=device))
    probed = tmp_path / "probed.yaml"
    probed.write_text(dump_plan(plan))
    rows = synthetic_rows()
    for row, probe in zip(rows, [(9.0, 9.0), (2000.0, 8.0), (500.0, 2.0), (1000.0, 4.0), (1.0, 1.0)]):
        row["speed_probe"] = {"gemm_us": probe[0], "op_us": probe[1]}
    metrics = tmp_path / "m.jsonl"
    write_metrics(metrics, rows)
    assert main(["compare", str(probed), str(metrics), "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["host_speed"] == pytest.approx({"kernel": 1.0, "host": 1.0})  # steps 2-4 only
    assert data["speed_adjusted_predicted_step_time_s"] == pytest.approx(data["predicted_step_time_s"], rel=1e-9)
    assert host_speed(0.0, 4.0, rows) is None and host_speed(1000.0, 4.0, [{"step": 1}]) is None
    for row in rows:
        row["speed_probe"] = {"gemm_us": 1250.0, "op_us": 8.0}
    write_metrics(metrics, rows)
    assert main(["compare", str(probed), str(metrics), "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["host_speed"] == pytest.approx({"kernel": 0.8, "host": 0.5})
    slower = dataclasses.replace(plan, cluster=at_host_speed(plan.cluster, HostSpeed(kernel=0.8, host=0.5)))
    expected = simulate_plan(slower).step_s
    assert data["speed_adjusted_predicted_step_time_s"] == pytest.approx(expected, rel=1e-12)
    assert data["speed_adjusted_predicted_step_time_s"] > data["predicted_step_time_s"]
    assert data["speed_adjusted_step_time_rel_error"] == pytest.approx((expected - 3.0) / 3.0)
    assert main(["compare", str(plan_path), str(metrics), "--json"]) == 0  # no calibrated probes: nothing to set
    assert json.loads(capsys.readouterr().out)["host_speed"] is None
    assert main(["compare", str(probed), str(metrics)]) == 0
    assert "kernels 0.80x, host work 0.50x" in capsys.readouterr().out


# ------------------------------------------------------------------- hostile metrics and trace files
def _rows_with(**fields):
    """The synthetic rows with ``fields`` set on step 3 (a measured step): the metrics file's bytes."""
    rows = synthetic_rows()
    rows[2].update(fields)
    return "".join(json.dumps(r) + "\n" for r in rows).encode()


def _all_rows_with(**fields):
    rows = synthetic_rows()
    for r in rows:
        r.update(fields)
    return "".join(json.dumps(r) + "\n" for r in rows).encode()


VALID = _rows_with()
HOSTILE_METRICS = [
    ("text peak memory", _rows_with(peak_memory_gib="x"), ':3: peak_memory_gib: got "x"'),
    ("text in per-rank peaks", _rows_with(peak_memory_gib_per_rank=[0.1, "x"]), ":3: peak_memory_gib_per_rank[1]: got"),
    ("text tokens/s", _rows_with(tokens_per_s="fast"), ':3: tokens_per_s: got "fast"'),
    ("9 per-rank values", _all_rows_with(peak_memory_gib_per_rank=[0.1] * 9),
     "peak_memory_gib_per_rank: 9 values per row, the plan has 2 ranks"),
    ("1 per-rank value", _all_rows_with(peak_memory_gib_per_rank=[0.1]),
     "peak_memory_gib_per_rank: 1 value per row, the plan has 2 ranks"),
    ("1 per-rank value on one row", _rows_with(peak_memory_gib_per_rank=[0.1]),
     ":3: peak_memory_gib_per_rank: 1 value, line 1 has 2"),
    ("empty per-rank list", _rows_with(peak_memory_gib_per_rank=[]), ":3: peak_memory_gib_per_rank: got []"),
    ("NaN per-rank peak", _rows_with(peak_memory_gib_per_rank=[math.nan, 0.1]),
     ":3: peak_memory_gib_per_rank[0]: got NaN"),
    ("100,000 nested [", VALID + b"[" * 100_000 + b"\n", ":6: not a JSON line (nested too deeply)"),
    ("binary", bytes(range(256)) * 8, "not UTF-8 text (byte 0x80 at offset 128)"),
    ("Latin-1", VALID + '{"note": "café"}\n'.encode("latin-1"),
     f"not UTF-8 text (byte 0xe9 at offset {len(VALID) + 13})"),
    ("NaN step time", _rows_with(step_time_s=math.nan), ":3: step_time_s: got NaN"),
    ("inf step time", _rows_with(step_time_s=math.inf), ":3: step_time_s: got Infinity"),
    ("negative step time", _rows_with(step_time_s=-1), ":3: step_time_s: got -1"),
    ("zero step time", _rows_with(step_time_s=0), ":3: step_time_s: got 0"),
    ("boolean step time", _rows_with(step_time_s=True), ":3: step_time_s: got true"),
    ("denormal step time", _rows_with(step_time_s=5e-324), ":3: step_time_s: got 5e-324"),
    ("huge int step time", VALID.replace(b'"step_time_s": 4.0', b'"step_time_s": 1' + b"0" * 400),
     ":3: step_time_s: got 1000"),
    ("no step time", VALID.replace(b'"step_time_s": 4.0, ', b""), ":3: step_time_s: missing"),
    ("boolean step", _rows_with(step=True), ":3: step: got true"),
    ("step 0", VALID.replace(b'"step": 1,', b'"step": 0,'), ":1: step: got 0"),
    ("steps out of order", _rows_with(step=2), ":3: step: 2 after step 2"),
    ("NaN loss", _rows_with(loss=math.nan), ":3: loss: got NaN"),
    ("negative peak", _rows_with(peak_memory_gib=-1.0), ":3: peak_memory_gib: got -1.0"),
    ("text profiled", _rows_with(profiled="yes"), ':3: profiled: got "yes"'),
    ("text speed probe", _rows_with(speed_probe="fast"), ':3: speed_probe: got "fast"'),
    ("inf speed probe", _rows_with(speed_probe={"gemm_us": math.inf, "op_us": 1.0}),
     ":3: speed_probe.gemm_us: got Infinity"),
    ("speed probe without op_us", _rows_with(speed_probe={"gemm_us": 1.0}), ":3: speed_probe.op_us: missing"),
    ("a list, not a row", VALID + b"[1, 2]\n", ":6: expected a JSON object"),
    ("bad fingerprint", _rows_with(plan_fingerprint=7), ":3: plan_fingerprint: got 7"),
    ("fingerprints differ", _rows_with(plan_fingerprint="0123456789abcdef"),
     ':3: plan_fingerprint: "0123456789abcdef", line 1 has null'),
]


@pytest.mark.parametrize("data, fragment", [c[1:] for c in HOSTILE_METRICS], ids=[c[0] for c in HOSTILE_METRICS])
def test_hostile_metrics_are_one_line_naming_the_field(plan_path, tmp_path, capsys, data, fragment):
    metrics = tmp_path / "m.jsonl"
    metrics.write_bytes(data)
    code = main(["compare", str(plan_path), str(metrics)])
    err = capsys.readouterr().err
    assert code == 2, err
    assert len(err.strip().splitlines()) == 1 and fragment in err and str(metrics) in err, err


def _trace_with(critical_rank_fields=None, ranks=None, raw=None):
    if raw is not None:
        return raw
    info = {"format": 1, "source": "measured", "ranks": ranks if ranks is not None else {
        "0": {"pp_rank": 0, "dp_rank": 0, "tp_rank": 0, "mode": "host", "terms_s": {"compute": 0.01},
              "step_time_s": 0.01, "steps": [{"step": 5}], **(critical_rank_fields or {})}}}
    return json.dumps({"traceEvents": [], "otherData": {"autoplan": info}}).encode()


HOSTILE_TRACES = [
    ("Latin-1", _trace_with(raw=b'{"otherData": {"autoplan": {"note": "caf\xe9"}}}'),
     "not UTF-8 text (byte 0xe9 at offset 40)"),
    ("binary", _trace_with(raw=bytes(range(128, 256))), "not UTF-8 text (byte 0x80 at offset 0)"),
    ("100,000 nested [", _trace_with(raw=b"[" * 100_000),
     "not a step trace written by autoplan run --trace (JSON nested"),
    ("ranks a list", _trace_with(ranks=[]), "otherData.autoplan.ranks: got []"),
    ("rank key not a number", _trace_with(ranks={"x": {}}),
     "otherData.autoplan.ranks.x: the key must be a global rank"),
    ("text pp_rank", _trace_with({"pp_rank": "0"}), 'ranks.0.pp_rank: got "0"'),
    ("boolean tp_rank", _trace_with({"tp_rank": False}), "ranks.0.tp_rank: got false"),
    ("NaN term", _trace_with({"terms_s": {"compute": math.nan}}), "ranks.0.terms_s: compute: got NaN"),
    ("terms a list", _trace_with({"terms_s": [1]}), "ranks.0.terms_s: got [1]"),
    ("inf step time", _trace_with({"step_time_s": math.inf}), "ranks.0: step_time_s: got Infinity"),
    ("steps of text", _trace_with({"steps": ["5"]}), "ranks.0.steps: got ['5']"),
    ("text step", _trace_with({"steps": [{"step": "5"}]}), 'ranks.0.steps[0].step: got "5"'),
]


@pytest.mark.parametrize("data, fragment", [c[1:] for c in HOSTILE_TRACES], ids=[c[0] for c in HOSTILE_TRACES])
def test_hostile_traces_are_one_line_naming_the_field(plan_path, tmp_path, capsys, data, fragment):
    metrics = tmp_path / "m.jsonl"
    write_metrics(metrics, synthetic_rows())
    (tmp_path / "trace").mkdir()
    (tmp_path / "trace" / "merged.json").write_bytes(data)
    code = main(["compare", str(plan_path), str(metrics), "--trace", str(tmp_path / "trace")])
    err = capsys.readouterr().err
    assert code == 2, err
    assert len(err.strip().splitlines()) == 1 and fragment in err and "--trace:" in err, err


# -------------------------------------------------------------------------------- plan fingerprint
@pytest.fixture(scope="module")
def other_plan_path(plan_path):
    """The same model and training on the same two devices, laid out dp 2 instead of pp 2."""
    path = plan_path.parent / "dp2.yaml"
    assert main(["estimate", "gpt-tiny", "--cluster", "cpu-local", "--devices-per-node", "2", "--global-batch-size",
                 "8", "--tp", "1", "--pp", "1", "--dp", "2", "--zero-stage", "0", "--schedule", "1f1b",
                 "--micro-batch-size", "2", "-o", str(path)]) == 0
    return path


def test_metrics_log_writes_the_plan_fingerprint_and_compare_checks_it(plan_path, other_plan_path, tmp_path, capsys):
    """What the runtime writes (runtime/train/metrics.py, plain Python) carries the fingerprint of the plan it
    ran; compare takes it against that plan and refuses it against another one of the same world size."""
    from autoplan.schema.fingerprint import plan_fingerprint
    from runtime.train.metrics import MetricsLog

    plan, other = load_plan(plan_path), load_plan(other_plan_path)
    metrics = tmp_path / "m.jsonl"
    log = MetricsLog(str(metrics), plan.predicted.step_time_s, plan.predicted.peak_memory_gib,
                     plan_fingerprint=plan_fingerprint(plan))
    for step, t in enumerate([9.0, 2.0, 4.0, 3.0], 1):
        log.record(step, 1.0, t, TOKENS, 0.3, 1e-3, 1.0, peak_gib_per_rank=[0.3, 0.2])
    rows = [json.loads(line) for line in metrics.read_text().splitlines()]
    assert [r["plan_fingerprint"] for r in rows] == [plan_fingerprint(plan)] * 4
    assert "plan_fingerprint" not in MetricsLog(None, None, None).record(1, 1.0, 1.0, TOKENS, 0.1, 1e-3, 1.0)

    assert main(["compare", str(plan_path), str(metrics), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["measured_step_time_s"] == 3.0
    assert main(["compare", str(other_plan_path), str(metrics)]) == 2
    err = capsys.readouterr().err
    assert err.strip().splitlines() == [
        f"autoplan compare: error: {metrics}: written by a run of another plan (fingerprint {plan_fingerprint(plan)}, "
        f"this plan's is {plan_fingerprint(other)}: model, layout or training differ); compare the metrics with the "
        "plan they were run with"]
    for row in rows:  # a file without fingerprints (written before they were) is compared as before
        del row["plan_fingerprint"]
    write_metrics(metrics, rows)
    assert main(["compare", str(other_plan_path), str(metrics)]) == 0
    capsys.readouterr()


def test_plan_fingerprint_is_the_run_not_the_prediction_or_the_cluster(plan_path):
    import dataclasses

    from autoplan.schema.fingerprint import plan_fingerprint

    plan = load_plan(plan_path)
    fp = plan_fingerprint(plan)
    assert len(fp) == 16 and int(fp, 16) >= 0
    cluster = dataclasses.replace(plan.cluster, name="elsewhere", num_nodes=3,
                                  device=dataclasses.replace(plan.cluster.device, peak_fp32_tflops=123.0))
    predicted = dataclasses.replace(plan.predicted, step_time_s=plan.predicted.step_time_s * 7)
    for same in (dataclasses.replace(plan, predicted=None), dataclasses.replace(plan, predicted=predicted),
                 dataclasses.replace(plan, solver=None), dataclasses.replace(plan, cluster=cluster)):
        assert plan_fingerprint(same) == fp
    assert plan_fingerprint(load_plan(plan_path)) == fp  # stable across loads
    changed = [dataclasses.replace(plan, tp=2), dataclasses.replace(plan, pp=1), dataclasses.replace(plan, dp=2),
               dataclasses.replace(plan, micro_batch_size=1),
               dataclasses.replace(plan, model=dataclasses.replace(plan.model, hidden_size=128)),
               dataclasses.replace(plan, training=dataclasses.replace(plan.training, global_batch_size=16))]
    fps = [plan_fingerprint(p) for p in changed]
    assert fp not in fps and len(set(fps)) == len(fps)


def test_plan_fingerprint_is_torch_free():
    code = ("import sys; import autoplan.schema.fingerprint; "
            "bad = [m for m in sys.modules if m == 'torch' or m.startswith(('torch.', 'runtime'))]; "
            "assert not bad, bad")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
