"""`autoplan run`'s preflight, command lines and supervisor, without starting a training job: every bad
option or path is one line before any process starts; a plan for several nodes prints a torchrun line
per node (or an sbatch script); a signal reaches the whole process tree, and nothing outlives it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

from autoplan.cli.main import main
from runtime.train.lock import DirectoryLock
from runtime.train.manifest import Manifest, manifest_text

ROOT = __import__("pathlib").Path(__file__).resolve().parents[2]


def run(capsys, *argv):
    code = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


@pytest.fixture(scope="module")
def plans(tmp_path_factory):
    folder = tmp_path_factory.mktemp("plans")
    made = {"one": ["--devices-per-node", "2", "--dp", "2"], "two_nodes": ["--nodes", "2"],
            "too_many": ["--devices-per-node", "1024", "--dp", "1024"]}
    for name, extra in made.items():
        assert main(["plan", "gpt-tiny", "--cluster", "cpu-local", "--global-batch-size", "2048", "--seq-len", "32",
                     "--zero-stage", "0", "--json", "-o", str(folder / f"{name}.yaml"), *extra]) == 0
    return {name: folder / f"{name}.yaml" for name in made}


def one_line_error(code, err, *needles):
    lines = [line for line in err.splitlines() if line.strip()]
    assert code == 2 and len(lines) == 1 and "Traceback" not in err, err
    for needle in needles:
        assert needle in lines[0], lines[0]


def test_print_command_prints_the_torchrun_line(plans, capsys, tmp_path):
    code, out, _ = run(capsys, "run", plans["one"], "--print-command", "--steps", "7", "--metrics", tmp_path / "m.jsonl",
                       "--checkpoint-dir", tmp_path / "ck", "--checkpoint-every", "2", "--timeout", "60")
    assert code == 0
    assert out.startswith("torchrun --standalone --nproc-per-node=2 -m runtime.launch ")
    assert "--steps 7" in out and "--checkpoint-every 2" in out and "--timeout 60" in out
    assert not (tmp_path / "ck").exists()  # a dry run creates nothing


def test_a_multi_node_plan_prints_one_torchrun_line_per_node(plans, capsys):
    code, out, err = run(capsys, "run", plans["two_nodes"])
    one_line_error(code, err, "made for 2 nodes x 4 devices", "--nnodes")
    lines = out.splitlines()
    assert len(lines) == 2 and all("--nnodes=2 --nproc-per-node=4" in line for line in lines)
    assert "--node-rank=0" in lines[0] and "--node-rank=1" in lines[1] and "--rdzv-endpoint=NODE0_HOST:29500" in out
    code, out, _ = run(capsys, "run", plans["two_nodes"], "--nnodes", "2", "--node-rank", "1",
                       "--rdzv-endpoint", "head:29400", "--print-command")
    assert code == 0 and "--nnodes=2 --nproc-per-node=4 --node-rank=1 --rdzv-backend=c10d" in out
    assert "--rdzv-endpoint=head:29400" in out
    code, out, _ = run(capsys, "run", plans["two_nodes"], "--slurm")
    assert code == 0 and "#SBATCH --nodes=2" in out and "srun bash -c 'torchrun " in out
    assert '--node-rank="$SLURM_NODEID"' in out and "--gpus-per-node" not in out  # a CPU plan
    # asked for the lines, the user gets them and exit 0 (issue 30: the lines, then an error, exit 2)
    code, out, err = run(capsys, "run", plans["two_nodes"], "--print-command", "--data", "synthetic")
    assert code == 0 and err == "" and len(out.splitlines()) == 2


def test_slurm_script_carries_the_cluster_options_and_the_run(plans, capsys):
    code, out, _ = run(capsys, "run", plans["two_nodes"], "--slurm", "--partition", "gpu", "--time", "24:00:00",
                       "--account", "proj1", "--env-setup", "source /opt/venv/bin/activate", "--lr", "0.001",
                       "--seed", "7", "--steps", "50")
    assert code == 0
    for line in ("#SBATCH --partition=gpu", "#SBATCH --time=24:00:00", "#SBATCH --account=proj1"):
        assert line in out.splitlines()
    assert "srun bash -c 'source /opt/venv/bin/activate && torchrun " in out
    assert "--steps 50" in out and "--lr 0.001" in out and "--seed 7" in out and "--decay-steps 50" in out
    code, _, err = run(capsys, "run", plans["two_nodes"], "--slurm", "--partition", "a\nb")
    one_line_error(code, err, "--partition", "control character")
    code, _, err = run(capsys, "run", plans["one"], "--partition", "gpu", "--print-command")
    one_line_error(code, err, "--partition: only with --slurm")


def test_training_knobs_are_checked_and_passed_to_every_rank(plans, capsys):
    code, out, _ = run(capsys, "run", plans["one"], "--print-command", "--steps", "30", "--lr", "0.002",
                       "--lr-schedule", "linear", "--warmup-steps", "3", "--clip-grad", "0.5")
    assert code == 0
    for part in ("--lr 0.002", "--lr-schedule linear", "--warmup-steps 3", "--clip-grad 0.5", "--decay-steps 30"):
        assert part in out
    for extra, needle in ((["--lr", "0"], "--lr: 0.0"), (["--lr", "nan"], "--lr"), (["--min-lr", "1"], "--min-lr"),
                          (["--seed", "-1"], "--seed"), (["--decay-steps", "0"], "--decay-steps")):
        code, _, err = run(capsys, "run", plans["one"], "--print-command", *extra)
        one_line_error(code, err, needle)


@pytest.mark.parametrize("extra, needles", [
    (["--nnodes", "3"], ["do not split evenly over 3 nodes"]),
    (["--nnodes", "2", "--node-rank", "2", "--rdzv-endpoint", "h:1"], ["--node-rank: 2 must be in [0, 1]"]),
    (["--nnodes", "2"], ["--rdzv-endpoint: needed"]),
    (["--nnodes", "2", "--rdzv-endpoint", "h:99999"], ["port in 1..65535"]),
    (["--nnodes", "2", "--rdzv-endpoint", "h:1", "--max-restarts", "1"], ["--max-restarts"]),
])
def test_multi_node_options_are_checked(plans, capsys, extra, needles):
    code, _, err = run(capsys, "run", plans["two_nodes"], "--print-command", *extra)
    one_line_error(code, err, *needles)


def test_more_ranks_than_this_machine_can_run_is_refused(plans, capsys):
    code, _, err = run(capsys, "run", plans["too_many"], "--print-command")
    one_line_error(code, err, "needs 1024 processes on one node", "gloo processes")


def test_bad_options_and_paths_are_one_line_before_any_process(plans, capsys, tmp_path):
    (tmp_path / "afile").write_text("x")
    (tmp_path / "odd.bin").write_bytes(b"\x01\x00\x02")
    (tmp_path / "big_ids.bin").write_bytes((b"\xff\xff" * 100))
    cases = [
        (["--steps", "0"], "--steps: 0 must be in [1"),
        (["--timeout", "nan"], "--timeout: nan"),
        (["--timeout", "-5"], "--timeout: -5"),
        (["--max-restarts", "-1"], "--max-restarts: -1"),
        (["--data", ""], "--data: empty"),
        (["--data", tmp_path / "missing.bin"], "no such file"),
        (["--data", tmp_path / "odd.bin"], "odd byte count"),
        (["--data", tmp_path / "big_ids.bin"], "token id 65535 >= model.vocab_size"),
        (["--metrics", "/proc/m.jsonl"], "--metrics /proc/m.jsonl: cannot write"),
        (["--metrics", tmp_path], "--metrics"),
        (["--timeline", "/proc/t.json"], "--timeline /proc/t.json: cannot write"),
        (["--timeline", tmp_path / "no" / "t.json"], "--timeline"),
        (["--checkpoint-dir", tmp_path / "afile"], "is a file, not a folder"),
        (["--checkpoint-dir", tmp_path / "no" / "ck"], "does not exist"),
        (["--checkpoint-dir", tmp_path / "missing", "--resume"], "no complete checkpoint"),
        (["--resume"], "--resume: needs --checkpoint-dir"),
        (["--checkpoint-every", "5"], "needs --checkpoint-dir"),
        (["--nproc", "3"], "--nproc 3: the plan needs tp * cp * pp * dp = 2"),
        (["--trace", "/proc/x"], "--trace /proc/x: cannot write"),
        (["--trace", tmp_path / "afile"], "is a file, not a folder"),
        (["--trace", tmp_path / "no" / "t"], "its parent"),
    ]
    for extra, needle in cases:
        code, _, err = run(capsys, "run", plans["one"], "--print-command", *extra)
        one_line_error(code, err, needle)


def _edited(plan_path, tmp_path, key: str, value: str):
    """The plan with its model's ``key`` (two-space indented, the first occurrence) set to ``value``."""
    lines = plan_path.read_text().splitlines()
    i = next(i for i, line in enumerate(lines) if line.startswith(f"  {key}:"))
    lines[i] = f"  {key}: {value}"
    path = tmp_path / f"{key}.yaml"
    path.write_text("\n".join(lines) + "\n")
    return path


def test_run_re_derives_memory_from_the_model_not_the_predicted_block(plans, capsys, tmp_path):
    """A hidden size edited into a plan leaves its predicted block describing the old model: run refuses
    the plan by the re-evaluated memory (issue 33: it started, then a rank died allocating 1 TiB); show
    prints the file's tables and warns; a small edit that still fits runs, with a warning that the
    predicted figures are stale."""
    huge = _edited(plans["one"], tmp_path, "hidden_size", str(2**20))
    code, _, err = run(capsys, "run", huge, "--print-command")
    one_line_error(code, err, "pipeline rank 0 needs", "GiB by this autoplan's cost model", "more than the 4 GiB")
    code, out, err = run(capsys, "show", huge)
    assert code == 0 and "memory per pipeline rank" in out
    assert err.count("\n") == 1 and "autoplan show: warning: plan: pipeline rank 0 needs" in err
    wider = _edited(plans["one"], tmp_path, "ffn_hidden_size", "512")
    code, out, err = run(capsys, "run", wider, "--print-command", "--data", "synthetic")
    assert code == 0 and "torchrun" in out
    assert err.count("\n") == 1 and "predicted block does not match its model and layout" in err
    code, _, err = run(capsys, "run", plans["one"], "--print-command", "--data", "synthetic")
    assert code == 0 and err == ""  # the planner's own figures agree with the re-evaluation


def _fake_checkpoint(folder, step, model_sha="0" * 64):
    ck = folder / f"step_{step}"
    ck.mkdir(parents=True)
    (ck / "COMPLETE").write_text(manifest_text(Manifest(step, model_sha, {}, {})))


def test_checkpoint_folder_rules(plans, capsys, tmp_path):
    ck = tmp_path / "ck"
    _fake_checkpoint(ck, 10)
    code, _, err = run(capsys, "run", plans["one"], "--print-command", "--checkpoint-dir", ck)
    one_line_error(code, err, "already holds checkpoints (newest step_10); pass --resume")
    code, _, err = run(capsys, "run", plans["one"], "--print-command", "--checkpoint-dir", ck, "--resume")
    one_line_error(code, err, "was written for another model")
    lock = DirectoryLock(ck).acquire()
    try:
        code, _, err = run(capsys, "run", plans["one"], "--print-command", "--checkpoint-dir", ck, "--resume")
        one_line_error(code, err, f"in use by pid {os.getpid()}")
    finally:
        lock.release()


def test_print_command_of_a_cpu_plan_does_not_import_torch(plans):
    code = (f"import sys; from autoplan.cli.main import main; assert main(['run', {str(plans['one'])!r}, "
            "'--print-command']) == 0; assert 'torch' not in sys.modules, 'torch imported'")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr


def test_supervisor_forwards_a_signal_and_kills_what_is_left(tmp_path):
    """A stand-in torchrun that starts a worker in its own session (as torchrun does) which ignores
    SIGTERM: SIGTERM to the launcher stops the stand-in, and the orphaned worker is killed too."""
    fake = tmp_path / "fake_torchrun.py"
    fake.write_text(textwrap.dedent(f"""
        import os, signal, subprocess, sys, time
        worker = subprocess.Popen([sys.executable, "-c",
            "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(600)"],
            start_new_session=True)
        open({str(tmp_path / 'pids')!r}, "w").write(f"{{os.getpid()}} {{worker.pid}}")
        time.sleep(600)
    """))
    script = textwrap.dedent(f"""
        import json, os, signal, sys, threading, time
        from autoplan.launcher.supervise import Job
        job = Job([sys.executable, {str(fake)!r}], dict(os.environ))
        def stop():
            while not os.path.exists({str(tmp_path / 'pids')!r}):
                time.sleep(0.05)
            time.sleep(0.3)
            os.kill(os.getpid(), signal.SIGTERM)
        threading.Thread(target=stop, daemon=True).start()
        t0 = time.monotonic()
        status = job.run()
        print(json.dumps({{"status": status, "signal": job.stop_signal, "s": time.monotonic() - t0}}))
    """)
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60, cwd=ROOT,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout.splitlines()[-1])
    assert result["signal"] == 15 and result["status"] == 128 + 15 and result["s"] < 10
    for pid in map(int, (tmp_path / "pids").read_text().split()):
        assert not os.path.exists(f"/proc/{pid}") or open(f"/proc/{pid}/stat").read().split(")")[1].split()[0] == "Z"


def test_an_fp8_plan_is_planner_only(plans, tmp_path, capsys):
    """fp8 plans predict; the runtime has no fp8 linear layers, so `autoplan run` (and its dry run) refuse one
    in one line naming the field and the fix, before any process starts; every rank's check does too."""
    from autoplan.errors import SpecError
    from autoplan.schema import load_plan
    from runtime.device import autocast_dtype
    from runtime.validate import check_plan

    path = tmp_path / "fp8.yaml"  # the fp8 field as an fp8 plan has it (planning one needs an fp8 GPU's profile)
    text = plans["one"].read_text()
    assert text.count("precision: fp32") == 1
    path.write_text(text.replace("precision: fp32", "precision: fp8"))
    for extra in ([], ["--dry-run"], ["--print-command"]):
        code, _, err = run(capsys, "run", path, "--backend", "gloo", *extra)
        one_line_error(code, err, "training.precision: fp8", "--precision bf16")
    plan = load_plan(path)
    with pytest.raises(SpecError, match="training.precision: fp8"):
        check_plan(plan, plan.world_size, "cpu", 1)
    with pytest.raises(ValueError, match="fp8"):  # never a silent fp16 autocast
        autocast_dtype(__import__("torch").device("cuda"), "fp8")
