"""``autoplan compare`` on a synthetic run whose numbers are known: medians, relative errors, memory per
rank and the verdict come out exactly, and comparing needs neither torch nor the runtime."""

import json
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
