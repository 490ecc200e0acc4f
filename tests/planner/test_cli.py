"""The command line: plans that round-trip, estimates that agree with plans, and one-line errors."""

import json
import subprocess
import sys

import pytest

from autoplan.cli.main import main
from autoplan.schema import load_plan


def run(capsys, *argv):
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_plan_writes_a_plan_that_loads_and_estimate_agrees(tmp_path, capsys):
    path = tmp_path / "plan.yaml"
    code, out, _ = run(capsys, "plan", "gpt-tiny", "--cluster", "cpu-local", "--global-batch-size", "16", "--json",
                       "-o", str(path))
    assert code == 0
    data = json.loads(out)
    for key in ("tp", "pp", "dp", "sequence_parallel", "zero_stage", "schedule", "virtual_stages", "micro_batch_size",
                "num_microbatches", "stages", "predicted", "solver"):
        assert key in data
    assert data["solver"]["status"] == "OPTIMAL"
    plan = load_plan(path)
    assert plan.tp * plan.pp * plan.dp == 4
    assert plan.predicted.step_time_s == pytest.approx(data["predicted"]["step_time_s"])
    # re-estimating the chosen configuration gives the same prediction (one cost model)
    args = ["estimate", "gpt-tiny", "--cluster", "cpu-local", "--global-batch-size", "16", "--tp", str(plan.tp),
            "--pp", str(plan.pp), "--zero-stage", str(plan.zero_stage), "--schedule", plan.schedule,
            "--micro-batch-size", str(plan.micro_batch_size), "--json"]
    if all(not s.full_recompute and not s.selective_recompute for s in plan.stages) and plan.pp == 1:
        code, out, _ = run(capsys, *args)
        assert code == 0
        assert json.loads(out)["predicted"]["step_time_s"] == pytest.approx(plan.predicted.step_time_s)


def test_pins_are_respected(capsys):
    code, out, _ = run(capsys, "plan", "llama3-8b", "--cluster", "dgx-h100-80gb", "--nodes", "2",
                       "--global-batch-size", "64", "--seq-len", "4096", "--tp", "2", "--pp", "2",
                       "--schedule", "1f1b", "--zero-stage", "1", "--json")
    assert code == 0
    data = json.loads(out)
    assert (data["tp"], data["pp"], data["dp"], data["schedule"], data["zero_stage"]) == (2, 2, 4, "1f1b", 1)


@pytest.mark.parametrize("argv, fragment", [
    (["plan", "no-such-model", "--cluster", "cpu-local", "--global-batch-size", "8"], "no-such-model: no such file"),
    (["plan", "gpt-tiny", "--cluster", "nowhere.yaml", "--global-batch-size", "8"], "nowhere.yaml: no such file"),
    (["estimate", "llama3-8b", "--cluster", "dgx-h100-80gb", "--global-batch-size", "8", "--tp", "3", "--pp", "1",
      "--zero-stage", "0", "--schedule", "1f1b", "--micro-batch-size", "1", "--dp", "1"], "does not divide num_attention_heads"),
    (["plan", "llama3-405b", "--cluster", "dgx-h100-80gb", "--global-batch-size", "8", "--seq-len", "8192"],
     "smallest change that fits: --nodes"),
    (["plan", "gpt-tiny", "--cluster", "cpu-local", "--global-batch-size", "0"], "--global-batch-size: must be at least 1"),
    (["plan", "gpt-tiny", "--cluster", "cpu-local", "--global-batch-size", "8", "--tp", "3"], "--tp: 3 must divide"),
])
def test_bad_input_gives_one_line_and_status_2(argv, fragment, capsys):
    code, out, err = run(capsys, *argv)
    assert code == 2
    assert fragment in err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err


def test_unknown_key_in_a_model_file_names_the_field(tmp_path, capsys):
    spec = tmp_path / "m.yaml"
    spec.write_text("name: m\narchitecture: gpt\nnum_layers: 2\nhidden_size: 64\nffn_hidden_size: 256\n"
                    "num_attention_heads: 8\nnum_kv_heads: 8\nvocab_size: 256\nhidden_sise: 3\n")
    code, _, err = run(capsys, "plan", str(spec), "--cluster", "cpu-local", "--global-batch-size", "8")
    assert code == 2 and "m.yaml: hidden_sise: unknown key" in err


def test_planning_does_not_import_torch():
    code = ("import sys; from autoplan.cli.main import main; main(['plan','gpt-tiny','--cluster','cpu-local',"
            "'--global-batch-size','8','--json']); assert 'torch' not in sys.modules, 'torch imported'")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr


def test_show_draws_the_simulated_pipeline(tmp_path, capsys):
    """Every rank's line holds its m forwards and m backwards; the last rank starts after the first."""
    path = tmp_path / "plan.yaml"
    assert main(["plan", "gpt-tiny", "--cluster", "cpu-local", "--global-batch-size", "16", "--pp", "4",
                 "--schedule", "1f1b", "--micro-batch-size", "1", "-o", str(path), "--json"]) == 0
    capsys.readouterr()
    code, out, _ = run(capsys, "show", str(path), "--timeline")
    assert code == 0
    lines = [line for line in out.splitlines() if line.startswith("rank ")]
    assert len(lines) == 4
    bars = [line.split("|")[1] for line in lines]
    assert bars[0][0] == "F" and bars[3][0] == "."
    assert all("F" in bar and ("B" in bar or "r" in bar) for bar in bars)


def test_estimate_exits_3_on_does_not_fit(capsys):
    code = main(["estimate", "llama3-70b", "--cluster", "dgx-h100-80gb", "--global-batch-size", "8", "--tp", "1",
                 "--pp", "1", "--zero-stage", "0", "--schedule", "1f1b", "--micro-batch-size", "1"])
    out = capsys.readouterr().out
    assert code == 3 and "DOES NOT FIT" in out
    code = main(["estimate", "gpt-tiny", "--cluster", "cpu-local", "--global-batch-size", "8", "--tp", "1",
                 "--pp", "1", "--zero-stage", "0", "--schedule", "1f1b", "--micro-batch-size", "2", "--json"])
    assert code == 0 and json.loads(capsys.readouterr().out)["fits"] is True
def test_a_long_search_reports_progress_on_stderr_even_in_a_pipe(monkeypatch, capsys):
    """capsys is not a terminal: progress comes as whole lines, the last one with the totals."""
    from autoplan.search import planner

    monkeypatch.setattr(planner, "PROGRESS_INTERVAL_S", 0.0)
    code, out, err = run(capsys, "plan", "llama3-8b", "--cluster", "dgx-h100-80gb", "--nodes", "2",
                         "--global-batch-size", "64", "--seq-len", "4096", "--json")
    assert code == 0
    lines = err.strip().splitlines()
    assert len(lines) >= 2 and all(line.startswith("searching: ") for line in lines[:-1])
    considered = json.loads(out)["solver"]["candidates"]
    assert lines[-1].startswith(f"searched: OPTIMAL, {considered} configurations")


@pytest.mark.parametrize("flag, value, field", [
    ("--global-batch-size", "1000000000000", "global_batch_size"), ("--devices-per-node", "1000000000000",
                                                                    "devices_per_node"),
    ("--nodes", "1000000000000", "num_nodes"), ("--seq-len", "1000000000000", "seq_len"),
])
def test_sizes_no_cluster_has_get_one_line(flag, value, field, capsys):
    argv = ["plan", "llama3-70b", "--cluster", "dgx-h100-80gb", "--global-batch-size", "1024", flag, value]
    code, _, err = run(capsys, *argv)
    # the input checks name the option (--global-batch-size); the search's own size check names the field
    assert code == 2 and len(err.strip().splitlines()) == 1 and (f"error: {flag}: " in err or f"error: {field}: " in err)


def test_help_and_show_load_no_solver(tmp_path, capsys):
    """`autoplan --help` and `autoplan show` import neither OR-Tools (and pandas behind it) nor torch."""
    path = tmp_path / "plan.yaml"
    assert main(["plan", "gpt-tiny", "--cluster", "cpu-local", "--global-batch-size", "8", "-o", str(path)]) == 0
    capsys.readouterr()
    check = ("; heavy = [m for m in ('ortools', 'pandas', 'numpy', 'scipy', 'torch') if m in sys.modules]; "
             "assert not heavy, heavy")
    for code in ("import sys; from autoplan.cli.main import build_parser; build_parser()" + check,
                 f"import sys; from autoplan.cli.main import main; main(['show', {str(path)!r}])" + check):
        result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
        assert result.returncode == 0, result.stderr


def test_a_time_limit_must_be_positive(capsys):
    code, _, err = run(capsys, "plan", "gpt-tiny", "--cluster", "cpu-local", "--global-batch-size", "8",
                       "--time-limit", "0")
    assert code == 2 and "--time-limit: must be a positive number" in err
