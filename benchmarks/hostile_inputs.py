"""What autoplan does with hostile input and injected faults: one row per case, what it got.

Runs every reproduction of issue 11's defect list against a checkout (``--root``, default this one), in
a scratch folder, each case in its own process with a time limit (and a 4 GiB address-space limit), and
prints a table: exit status, stderr lines, traceback or not, seconds, and what the case checks
afterwards (processes left, steps in the metrics, whether a symlink survived, ...). Run it on the old
and the new code to get the before/after table:

    python benchmarks/hostile_inputs.py --root /path/to/old/checkout > before.md
    python benchmarks/hostile_inputs.py > after.md
    python benchmarks/hostile_inputs.py --only files,numbers      # groups: signals launcher args
                                                                   # checkpoints numbers files kill
                                                                   # hf-config compare run show plan

Issue 33's cases (groups hf-config, compare, run, show, plan) say what is right (refused in one line, or
accepted) and end with a table per command: tried, refused in one line, right, traceback, hang, accepted
nonsense.

Cases that start torchrun take 5-60 s each on 2 cores; the whole table takes ~10 minutes.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

HERE_ROOT = Path(__file__).resolve().parents[1]
PY = sys.executable


@dataclass
class Ctx:
    root: Path
    work: Path
    new: bool  # the checkout has the launcher of issue 11 (flags such as --max-restarts exist)

    def env(self, **extra: str) -> dict[str, str]:
        return {**os.environ, "PYTHONPATH": str(self.root), "OMP_NUM_THREADS": "1", "PYTHONDONTWRITEBYTECODE": "1",
                **extra}


@dataclass
class Case:
    group: str
    name: str
    argv: Callable[[Ctx], list[str] | str]
    """autoplan arguments, or a shell command line (a str) run with bash."""
    setup: Callable[[Ctx], None] | None = None
    check: Callable[[Ctx, subprocess.CompletedProcess], str] | None = None
    timeout_s: float = 60.0
    custom: Callable[[Ctx], str] | None = None
    """Runs the whole case itself and returns the row's text (signals, kills, concurrent runs)."""
    tags: list[str] = field(default_factory=list)
    expect: str | None = None
    """What is right (issue 33's cases): "refuse" (exit 2, one stderr line), "accept" (exit 0), "warn" (exit 0
    with a warning line on stderr). None: the row is read by eye (issue 11's table)."""
    command: str | None = None
    """The subcommand counted in the summary (default: the first argument)."""


def _limit_memory() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (4 * 2**30, 4 * 2**30))


def _kill_tree_by_marker(marker: str) -> int:
    """SIGKILL every process whose command line contains ``marker``; returns how many there were."""
    n = 0
    for entry in Path("/proc").glob("[0-9]*"):
        try:
            cmd = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if marker in cmd and int(entry.name) != os.getpid():
            try:
                os.kill(int(entry.name), signal.SIGKILL)
                n += 1
            except ProcessLookupError:
                pass
    return n


def _count_by_marker(marker: str) -> int:
    n = 0
    for entry in Path("/proc").glob("[0-9]*"):
        try:
            cmd = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except (OSError, IndexError):
            continue
        if marker in cmd and state != "Z":
            n += 1
    return n


def autoplan(ctx: Ctx, args: list[str], timeout_s: float, env: dict | None = None):
    cmd = [PY, "-m", "autoplan.cli.main", *args]
    t0 = time.monotonic()
    try:
        proc = subprocess.run(cmd, cwd=ctx.work, env=env or ctx.env(), capture_output=True, text=True,
                              timeout=timeout_s, preexec_fn=_limit_memory, errors="replace")
        return proc, time.monotonic() - t0, False
    except subprocess.TimeoutExpired as err:
        _kill_tree_by_marker(str(ctx.work))
        out = err.stdout.decode(errors="replace") if isinstance(err.stdout, bytes) else (err.stdout or "")
        errt = err.stderr.decode(errors="replace") if isinstance(err.stderr, bytes) else (err.stderr or "")
        return subprocess.CompletedProcess(cmd, -9, out, errt), time.monotonic() - t0, True


def summary(proc: subprocess.CompletedProcess, elapsed: float, timed_out: bool) -> str:
    if timed_out:
        return f"no answer within {elapsed:.0f} s (killed)"
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    text = f"exit {proc.returncode}, {len(lines)} stderr line{'s' if len(lines) != 1 else ''}"
    if "Traceback" in proc.stderr:
        last = [line for line in lines if not line.startswith((" ", "[rank"))]
        exc = next((line.split(":")[0] for line in reversed(last) if "Error" in line or "Exception" in line), "?")
        text += f", traceback ({exc[:40]})"
    text += f", {elapsed:.1f} s"
    if proc.returncode == 2 and len(lines) == 1:
        text += f': "{lines[0][:150]}"'
    return text


# ---------------------------------------------------------------------------------------------- set-up
def plan_file(ctx: Ctx, name: str, *args: str) -> Path:
    path = ctx.work / name
    if not path.exists():
        proc, _, _ = autoplan(ctx, ["plan", *args, "--json", "-o", str(path)], 300)
        if proc.returncode != 0:
            raise RuntimeError(f"could not make {name}: {proc.stderr[-2000:]}")
    return path


def p1(ctx: Ctx) -> Path:  # one rank: the cheapest runtime case
    return plan_file(ctx, "p1.yaml", "gpt-tiny", "--cluster", "cpu-local", "--devices-per-node", "1",
                     "--global-batch-size", "4", "--seq-len", "32")


def p2(ctx: Ctx) -> Path:  # two data-parallel ranks
    return plan_file(ctx, "p2.yaml", "gpt-tiny", "--cluster", "cpu-local", "--devices-per-node", "2", "--dp", "2",
                     "--global-batch-size", "4", "--seq-len", "32", "--zero-stage", "0")


def p4(ctx: Ctx) -> Path:  # pp 2 x dp 2
    return plan_file(ctx, "p4.yaml", "gpt-tiny", "--cluster", "cpu-local", "--global-batch-size", "8", "--seq-len",
                     "32", "--pp", "2", "--dp", "2", "--schedule", "1f1b", "--zero-stage", "0")


def edited_plan(ctx: Ctx, name: str, old: str, new: str) -> Path:
    text = p1(ctx).read_text()
    if old not in text:
        raise RuntimeError(f"{old!r} not in the plan")
    path = ctx.work / name
    path.write_text(text.replace(old, new, 1))
    return path


def model_file(ctx: Ctx, name: str, text: str | bytes) -> Path:
    path = ctx.work / name
    path.write_bytes(text if isinstance(text, bytes) else text.encode())
    return path


GPT = ("name: m\narchitecture: gpt\nnum_layers: 2\nhidden_size: 64\nffn_hidden_size: 256\nnum_attention_heads: 4\n"
       "num_kv_heads: 4\nvocab_size: 256\n")
LLAMA = ("name: m\narchitecture: llama\nnum_layers: 2\nhidden_size: 64\nffn_hidden_size: 128\nnum_attention_heads: 4\n"
         "num_kv_heads: 2\nvocab_size: 256\n")
PLAN_ARGS = ["--cluster", "cpu-local", "--global-batch-size", "8", "--seq-len", "32"]


def cluster_with_device(ctx: Ctx, replace: tuple[str, str]) -> Path:
    device = (ctx.root / "profiles" / "hardware" / "cpu.yaml").read_text()
    lines = [line for line in device.splitlines() if not line.startswith(replace[0] + ":")]
    (ctx.work / "dev.yaml").write_text("\n".join(lines) + f"\n{replace[0]}: {replace[1]}\n")
    cluster = (ctx.root / "profiles" / "clusters" / "cpu-local.yaml").read_text()
    cluster = "\n".join("device: dev.yaml" if line.startswith("device:") else line for line in cluster.splitlines())
    path = ctx.work / f"c-{replace[0]}.yaml"
    path.write_text(cluster + "\n")
    return path


def metrics_steps(path: Path) -> list:
    if not path.is_file():
        return []
    out = []
    for line in path.read_text().splitlines():
        try:
            out.append(json.loads(line)["step"])
        except (ValueError, KeyError):
            out.append("?")
    return out


def metrics_losses(path: Path) -> list:
    return [json.loads(line)["loss"] for line in path.read_text().splitlines()] if path.is_file() else []


def run_args(ctx: Ctx, plan: Path, *extra: str) -> list[str]:
    return ["run", str(plan), "--steps", "3", "--metrics", str(ctx.work / "m.jsonl"), *extra]


def after_run(ctx: Ctx, _proc) -> str:
    path = ctx.work / "m.jsonl"
    steps, losses = metrics_steps(path), metrics_losses(path)
    note = f"metrics steps {steps}" if steps else "no metrics"
    if losses and any(x != x for x in losses):
        note += ", loss nan"
    path.unlink(missing_ok=True)
    return note


# ------------------------------------------------------------------------------------------ the cases
def sigterm_case(ctx: Ctx) -> str:
    plan = p4(ctx)
    metrics = ctx.work / "sig.jsonl"
    metrics.unlink(missing_ok=True)
    proc = subprocess.Popen([PY, "-m", "autoplan.cli.main", "run", str(plan), "--steps", "400", "--metrics",
                             str(metrics)], cwd=ctx.work, env=ctx.env(), stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and not metrics_steps(metrics):
        time.sleep(0.2)
    if not metrics_steps(metrics):
        _kill_tree_by_marker(str(plan))
        return "never reached step 1"
    proc.send_signal(signal.SIGTERM)
    t0 = time.monotonic()
    try:
        rc = proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        rc = None
    time.sleep(max(0.0, 10 - (time.monotonic() - t0)))
    left = _count_by_marker(str(plan))
    _kill_tree_by_marker(str(plan))
    err = proc.stderr.read() if proc.stderr else ""
    lines = [line for line in err.splitlines() if line.strip() and not line.startswith("step ")]
    return (f"launcher exit {rc}, {left} processes of the run left 10 s after SIGTERM, "
            f"{len(lines)} stderr lines{', traceback' if 'Traceback' in err else ''}")


def fake_torchrun(ctx: Ctx) -> Path:
    """A stand-in `torch` whose torch.distributed.run only prints its arguments (starts nothing)."""
    shim = ctx.work / "shim"
    (shim / "torch" / "distributed").mkdir(parents=True, exist_ok=True)
    (shim / "torch" / "__init__.py").write_text("")
    (shim / "torch" / "distributed" / "__init__.py").write_text("")
    (shim / "torch" / "distributed" / "run.py").write_text(
        "import sys\nprint('FAKE torchrun started with', ' '.join(sys.argv[1:4]), file=sys.stderr)\n")
    return shim


def many_nodes_case(ctx: Ctx) -> str:
    plan = plan_file(ctx, "p128.yaml", "llama3-70b", "--cluster", "dgx-h100-80gb", "--nodes", "128",
                     "--global-batch-size", "1024", "--seq-len", "8192")
    env = ctx.env(PYTHONPATH=f"{fake_torchrun(ctx)}{os.pathsep}{ctx.root}")
    proc, elapsed, timed_out = autoplan(ctx, ["run", str(plan), "--steps", "1"], 60, env)
    started = [line for line in proc.stderr.splitlines() if "FAKE torchrun started" in line]
    text = summary(proc, elapsed, timed_out)
    return text + ("; STARTED " + started[0].split("with ", 1)[1] if started else "; started nothing") + \
        f"; {len(proc.stdout.splitlines())} lines on stdout"


def corrupt(ctx: Ctx, how: str) -> list[str]:
    """A checkpoint folder (10 steps, saved at 5 and 10) with its newest checkpoint damaged ``how``."""
    base = ctx.work / "ckpt-base"
    if not base.exists():
        proc, _, _ = autoplan(ctx, ["run", str(p2(ctx)), "--steps", "10", "--checkpoint-dir", str(base),
                                    "--checkpoint-every", "5", "--metrics", str(ctx.work / "base.jsonl")], 300)
        if proc.returncode != 0:
            raise RuntimeError(proc.stderr[-2000:])
    folder = ctx.work / f"ckpt-{how}"
    shutil.rmtree(folder, ignore_errors=True)
    shutil.copytree(base, folder)
    (folder / ".lock").unlink(missing_ok=True)
    newest = folder / "step_10"
    if how == "truncated":
        shard = newest / "__0_0.distcp"
        shard.write_bytes(shard.read_bytes()[: shard.stat().st_size // 2])
    elif how == "no-rng":
        (newest / "rng_rank1.pt").unlink()
    elif how == "overwritten":
        shard = newest / "__1_0.distcp"
        with shard.open("r+b") as f:  # 2,048 float32 weights in the middle of the shard
            f.seek(shard.stat().st_size // 2)
            f.write(b"\x7f\x7f\x7f\x3f" * 2048)
    return ["run", str(p2(ctx)), "--steps", "12", "--checkpoint-dir", str(folder), "--checkpoint-every", "5",
            "--resume", "--metrics", str(ctx.work / "m.jsonl")]


def two_runs_case(ctx: Ctx) -> str:
    folder = ctx.work / "ckpt-shared"
    shutil.rmtree(folder, ignore_errors=True)
    procs = []
    for i in range(2):
        procs.append(subprocess.Popen(
            [PY, "-m", "autoplan.cli.main", "run", str(p2(ctx)), "--steps", "30", "--checkpoint-dir", str(folder),
             "--checkpoint-every", "5", "--metrics", str(ctx.work / f"two{i}.jsonl")], cwd=ctx.work, env=ctx.env(),
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True))
        time.sleep(8 if i == 0 else 0)
    outs = []
    for i, proc in enumerate(procs):
        try:
            _, err = proc.communicate(timeout=300)
        except subprocess.TimeoutExpired:
            proc.kill()
            _, err = proc.communicate()
        lines = [line for line in err.splitlines() if line.strip()]
        outs.append(f"run {i + 1}: exit {proc.returncode}, {len(metrics_steps(ctx.work / f'two{i}.jsonl'))} steps"
                    + (f' ("{lines[-1][:110]}")' if proc.returncode else ""))
    return "; ".join(outs)


def metrics_repeat_case(ctx: Ctx) -> str:
    folder, metrics = ctx.work / "ckpt-repeat", ctx.work / "repeat.jsonl"
    shutil.rmtree(folder, ignore_errors=True)
    metrics.unlink(missing_ok=True)
    common = ["--checkpoint-dir", str(folder), "--checkpoint-every", "5", "--metrics", str(metrics)]
    autoplan(ctx, ["run", str(p2(ctx)), "--steps", "12", *common], 300)
    proc, elapsed, timed_out = autoplan(ctx, ["run", str(p2(ctx)), "--steps", "15", "--resume", *common], 300)
    steps = metrics_steps(metrics)
    repeated = sorted({s for s in steps if steps.count(s) > 1})
    return f"{summary(proc, elapsed, timed_out)}; metrics steps {steps}; repeated {repeated or 'none'}"


def kill_case(ctx: Ctx) -> str:
    plan, metrics, folder = p4(ctx), ctx.work / "kill.jsonl", ctx.work / "ckpt-kill"
    shutil.rmtree(folder, ignore_errors=True)
    metrics.unlink(missing_ok=True)
    extra = ["--max-restarts", "1"] if ctx.new else []
    proc = subprocess.Popen([PY, "-m", "autoplan.cli.main", "run", str(plan), "--steps", "20", "--metrics",
                             str(metrics), "--checkpoint-dir", str(folder), "--checkpoint-every", "5", *extra],
                            cwd=ctx.work, env=ctx.env(), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            text=True)
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline and len(metrics_steps(metrics)) < 7:
        time.sleep(0.05)
    # only this run's rank 1: its command line names this case's plan, inside the scratch folder
    victims = [int(e.name) for e in Path("/proc").glob("[0-9]*")
               if "runtime.launch" in _cmd(e) and str(plan) in _cmd(e) and "LOCAL_RANK=1\0" in _environ(e)]
    t_kill = time.monotonic()
    for pid in victims[:1]:
        os.kill(pid, signal.SIGKILL)
    try:
        _, err = proc.communicate(timeout=300)
    except subprocess.TimeoutExpired:
        proc.kill()
        _, err = proc.communicate()
    took = time.monotonic() - t_kill
    steps = metrics_steps(metrics)
    restarted = "restarting" in err
    return (f"killed rank 1 after step 7: exit {proc.returncode} {took:.1f} s later; "
            f"{'restarted' if restarted else 'no restart'}; metrics steps 1..{max(steps) if steps else 0}, "
            f"{len(steps)} rows, repeated {sorted({s for s in steps if steps.count(s) > 1}) or 'none'}")


def _cmd(entry: Path) -> str:
    try:
        return (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def _environ(entry: Path) -> str:
    try:
        return (entry / "environ").read_bytes().decode(errors="replace")
    except OSError:
        return ""


def _bomb_text(plan_text: str) -> str:
    """The plan with stages[0].full_recompute = 9 levels of 9-fold aliases (the anchors defined inline)."""
    nested = "&a0 [0, 0, 0, 0, 0, 0, 0, 0, 0]"
    for i in range(1, 9):
        nested = f"&a{i} [{nested}, " + ", ".join([f"*a{i - 1}"] * 8) + "]"
    return plan_text.replace("full_recompute: []", f"full_recompute: [{nested}, " + ", ".join(["*a8"] * 8) + "]", 1)


def big_yaml(ctx: Ctx) -> Path:
    path = ctx.work / "big.yaml"
    if not path.exists():
        with path.open("w") as f:
            f.write(GPT + "padding: [")
            f.write("0, " * (50 * 2**20 // 3))
            f.write("0]\n")
    return path


def dev_node(ctx: Ctx) -> Path:
    path = ctx.work / "devnode"
    if not path.exists():
        os.mknod(path, 0o666 | 0o020000, os.makedev(1, 3))  # a character device (like /dev/null)
    return path


def link_case_setup(ctx: Ctx) -> None:
    (ctx.work / "target.yaml").write_text("old\n")
    link = ctx.work / "link.yaml"
    link.unlink(missing_ok=True)
    link.symlink_to("target.yaml")


def link_check(ctx: Ctx, _proc) -> str:
    link = ctx.work / "link.yaml"
    target = (ctx.work / "target.yaml").read_text()
    return ("link still a symlink" if link.is_symlink() else "SYMLINK REPLACED by a file") + \
        (", target written" if target != "old\n" else ", target unchanged")


def dev_check(ctx: Ctx, _proc) -> str:
    import stat as st
    mode = os.lstat(ctx.work / "devnode").st_mode
    return "device node intact" if st.S_ISCHR(mode) else "DEVICE NODE REPLACED by a file"


PLAN8 = ["plan", "gpt-tiny", "--cluster", "cpu-local", "--global-batch-size", "8"]

# ------------------------------------------------------------------------------------ issue 33's cases
HF_LLAMA = {"model_type": "llama", "architectures": ["LlamaForCausalLM"], "num_hidden_layers": 2, "hidden_size": 64,
            "intermediate_size": 128, "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 256,
            "max_position_embeddings": 64, "rms_norm_eps": 1e-5, "rope_theta": 10000.0, "hidden_act": "silu"}


def hf_config(ctx: Ctx, name: str, change: dict | None = None, drop: str | None = None, raw: str | None = None) -> Path:
    """A Llama config.json in its own folder, with one key changed or dropped, or ``raw`` text instead."""
    folder = _mkdir(ctx.work / f"hf-{name}")
    data = {**HF_LLAMA, **(change or {})}
    data.pop(drop, None)
    (folder / "config.json").write_text(raw if raw is not None else json.dumps(data))
    return folder / "config.json"


def hf_case(name: str, expect: str = "refuse", **how) -> Case:
    return Case("hf-config", name, lambda c: ["plan", str(hf_config(c, name.split(" ")[0].strip(":"), **how)),
                                              "--cluster", "cpu-local", "--global-batch-size", "8"], expect=expect)


def measured(ctx: Ctx, plan: Path, name: str) -> Path:
    """The metrics of a 3-step run of ``plan`` (made once per scratch folder)."""
    path = ctx.work / f"{name}.jsonl"
    if not path.exists():
        proc, _, _ = autoplan(ctx, ["run", str(plan), "--steps", "3", "--metrics", str(path), "--data", "synthetic"],
                              300)
        if proc.returncode != 0:
            raise RuntimeError(f"could not run {plan.name}: {proc.stderr[-2000:]}")
    return path


def damaged_metrics(ctx: Ctx, name: str, edit: Callable[[list[dict]], list[dict]] | None = None,
                    raw: bytes | None = None) -> list[str]:
    """``compare`` of p4 with its metrics, each row passed through ``edit`` (or the file replaced by ``raw``)."""
    rows = [json.loads(line) for line in measured(ctx, p4(ctx), "m4").read_text().splitlines()]
    path = ctx.work / f"bad-{name}.jsonl"
    path.write_bytes(raw if raw is not None else "".join(json.dumps(r) + "\n" for r in edit(rows)).encode())
    return ["compare", str(p4(ctx)), str(path)]


def each_row(key: str, value) -> Callable[[list[dict]], list[dict]]:
    return lambda rows: [{**r, key: value} for r in rows]


def damaged_trace(ctx: Ctx, name: str, raw: bytes) -> list[str]:
    folder = _mkdir(ctx.work / f"trace-{name}")
    (folder / "merged.json").write_bytes(raw)
    return ["compare", str(p4(ctx)), str(measured(ctx, p4(ctx), "m4")), "--trace", str(folder)]


def predicted_edit(ctx: Ctx, name: str, key: str, value: str) -> Path:
    """p1 (one rank, one stage) with ``predicted.KEY`` replaced by ``value``."""
    lines = p1(ctx).read_text().splitlines()
    out = [f"  {key}: {value}" if line.startswith(f"  {key}:") else line for line in lines]
    path = ctx.work / name
    path.write_text("\n".join(out) + "\n")
    return path


def model_edit(ctx: Ctx, name: str, key: str, value: str, nth: int = 1) -> Path:
    """p1 with the ``nth`` line ``  KEY: ...`` (two-space indent: model, cluster or training) set to ``value``."""
    out, seen = [], 0
    for line in p1(ctx).read_text().splitlines():
        if line.startswith(f"  {key}:"):
            seen += 1
            if seen == nth:
                line = f"  {key}: {value}"
        out.append(line)
    if seen < nth:
        raise RuntimeError(f"{key} appears {seen} times in the plan")
    path = ctx.work / name
    path.write_text("\n".join(out) + "\n")
    return path


def lost_peer_case(ctx: Ctx) -> str:
    """A tp2 pp2 run with rank 1 (rank 0's TP peer) killed mid-run, 3 times: the tracebacks the survivors
    print (torch's pipelining wraps the lost peer of a backward collective in its own error)."""
    plan = plan_file(ctx, "tp2pp2.yaml", "gpt-tiny", "--cluster", "cpu-local", "--global-batch-size", "8",
                     "--tp", "2", "--pp", "2", "--dp", "1", "--schedule", "1f1b")
    tracebacks, lines = 0, []
    for attempt in range(3):
        metrics = ctx.work / f"peer{attempt}.jsonl"
        proc = subprocess.Popen([PY, "-m", "autoplan.cli.main", "run", str(plan), "--steps", "2000", "--metrics",
                                 str(metrics), "--data", "synthetic"], cwd=ctx.work, env=ctx.env(),
                                stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and len(metrics_steps(metrics)) < 5 + 5 * attempt:
            time.sleep(0.05)
        for pid in [int(e.name) for e in Path("/proc").glob("[0-9]*")
                    if "runtime.launch" in _cmd(e) and str(plan) in _cmd(e) and "LOCAL_RANK=1\0" in _environ(e)][:1]:
            os.kill(pid, signal.SIGKILL)
        try:
            _, err = proc.communicate(timeout=120)
        except subprocess.TimeoutExpired:
            proc.kill()
            _, err = proc.communicate()
        tracebacks += "Traceback" in err
        lines.append(len([x for x in err.splitlines() if x.strip() and not x.startswith("step ")]))
        tally("run", "traceback" if "Traceback" in err else "right")  # right: the survivors said it in one line
    return f"3 kills: {tracebacks} with a traceback; stderr lines per run {lines}"


def bruteforce_case(ctx: Ctx) -> list[str]:
    return ["plan", "llama3-70b", "--cluster", "dgx-h100-80gb", "--nodes", "64", "--global-batch-size", "512",
            "--solver", "bruteforce", "--time-limit", "5"]


ISSUE_33_CASES = [
    hf_case("missing: num_hidden_layers", drop="num_hidden_layers"),
    hf_case("zero-heads: num_attention_heads 0", change={"num_attention_heads": 0}),
    hf_case("float-layers: num_hidden_layers 4.0", change={"num_hidden_layers": 4.0}),
    hf_case("string-layers: num_hidden_layers \"8\"", change={"num_hidden_layers": "8"}),
    hf_case("null-layers: num_hidden_layers null", change={"num_hidden_layers": None}),
    hf_case("list-layers: num_hidden_layers [1]", change={"num_hidden_layers": [1]}),
    hf_case("bool-layers: num_hidden_layers true", change={"num_hidden_layers": True}),
    hf_case("rope: rope_theta \"abc\"", change={"rope_theta": "abc"}),
    hf_case("string: the file holds a bare JSON string", raw='"llama"'),
    hf_case("list: the file holds a JSON list", raw="[1, 2]"),
    hf_case("deep: 100,000 nested [", raw="[" * 100_000),
    hf_case("nan: rms_norm_eps NaN", raw=json.dumps(HF_LLAMA).replace('"rms_norm_eps": 1e-05', '"rms_norm_eps": NaN')),
    hf_case("valid: the Llama config as it is", expect="accept"),
    Case("compare", "a string in peak_memory_gib", lambda c: damaged_metrics(c, "mem", each_row("peak_memory_gib", "x")),
         expect="refuse"),
    Case("compare", "a string in tokens_per_s", lambda c: damaged_metrics(c, "tok", each_row("tokens_per_s", "fast")),
         expect="refuse"),
    Case("compare", "9 per-rank values for 4 ranks",
         lambda c: damaged_metrics(c, "nine", each_row("peak_memory_gib_per_rank", [0.01] * 9)), expect="refuse"),
    Case("compare", "1 per-rank value for 4 ranks",
         lambda c: damaged_metrics(c, "one", each_row("peak_memory_gib_per_rank", [0.01])), expect="refuse"),
    Case("compare", "NaN per-rank values",
         lambda c: damaged_metrics(c, "nanrank", each_row("peak_memory_gib_per_rank", [float("nan")] * 4)),
         expect="refuse"),
    Case("compare", "a line of 100,000 nested [", lambda c: damaged_metrics(c, "deep", raw=b"[" * 100_000 + b"\n"),
         expect="refuse"),
    Case("compare", "a binary metrics file", lambda c: damaged_metrics(c, "bin", raw=bytes(range(256)) * 4),
         expect="refuse"),
    Case("compare", "a Latin-1 metrics file",
         lambda c: damaged_metrics(c, "latin", raw='{"step": 1, "note": "caf\xe9"}\n'.encode("latin-1")),
         expect="refuse"),
    Case("compare", "step_time_s NaN", lambda c: damaged_metrics(c, "nan", each_row("step_time_s", float("nan"))),
         expect="refuse"),
    Case("compare", "step_time_s inf", lambda c: damaged_metrics(c, "inf", each_row("step_time_s", float("inf"))),
         expect="refuse"),
    Case("compare", "step_time_s -1", lambda c: damaged_metrics(c, "neg", each_row("step_time_s", -1)),
         expect="refuse"),
    Case("compare", "step_time_s true", lambda c: damaged_metrics(c, "true", each_row("step_time_s", True)),
         expect="refuse"),
    Case("compare", "a dp2 run's metrics against the pp2 dp2 plan",
         lambda c: ["compare", str(p4(c)), str(measured(c, p2(c), "m2"))], expect="refuse"),
    Case("compare", "the run's own metrics", lambda c: ["compare", str(p4(c)), str(measured(c, p4(c), "m4"))],
         expect="accept"),
    Case("compare", "--trace merged.json binary", lambda c: damaged_trace(c, "bin", bytes(range(256)) * 4),
         expect="refuse"),
    Case("compare", "--trace merged.json Latin-1",
         lambda c: damaged_trace(c, "latin", '{"otherData": "caf\xe9"}'.encode("latin-1")), expect="refuse"),
    Case("run", "--trace /proc/x", lambda c: run_args(c, p1(c), "--trace", "/proc/x"), expect="refuse", timeout_s=120),
    Case("run", "--trace naming an existing file",
         lambda c: run_args(c, p1(c), "--trace", str(model_file(c, "afile", "x"))), expect="refuse", timeout_s=120),
    Case("run", "hidden_size 2**20 edited into a plan",
         lambda c: run_args(c, model_edit(c, "hidden.yaml", "hidden_size", str(2**20))), expect="refuse",
         timeout_s=120),
    Case("run", "seq_len 2**24 edited into a plan's training",
         lambda c: run_args(c, model_edit(c, "seq.yaml", "seq_len", str(2**24), nth=2)), expect="refuse",
         timeout_s=120),
    Case("run", "local_params_per_rank: [1, 1, 1, 1] for 1 pipeline rank",
         lambda c: run_args(c, predicted_edit(c, "lp.yaml", "local_params_per_rank", "[1, 1, 1, 1]")),
         expect="refuse", timeout_s=120),
    Case("run", "3 memory_gib_per_stage values for 1 stage",
         lambda c: run_args(c, predicted_edit(c, "mg.yaml", "memory_gib_per_stage", "[0.1, 0.1, 0.1]")),
         expect="refuse", timeout_s=120),
    Case("run", "--dry-run of 3 memory_gib_per_stage values for 1 stage",
         lambda c: ["run", str(predicted_edit(c, "mg.yaml", "memory_gib_per_stage", "[0.1, 0.1, 0.1]")), "--dry-run"],
         expect="refuse", timeout_s=120),
    Case("run", "a surviving TP peer of a killed rank", lambda c: [], custom=lost_peer_case),
    Case("show", "hidden_size 2**20 edited into a plan",
         lambda c: ["show", str(model_edit(c, "hidden.yaml", "hidden_size", str(2**20)))], expect="warn"),
    Case("show", "3 memory_gib_per_stage values for 1 stage",
         lambda c: ["show", str(predicted_edit(c, "mg.yaml", "memory_gib_per_stage", "[0.1, 0.1, 0.1]"))],
         expect="refuse"),
    Case("show", "backend: nccl on a CPU device", lambda c: ["show", str(model_edit(c, "nccl.yaml", "backend", "nccl"))],
         expect="refuse"),
    Case("plan", "--solver bruteforce --time-limit 5, llama3-70b on 512 GPUs", bruteforce_case, expect="accept",
         timeout_s=60),
]

CASES = [
    Case("signals", "SIGTERM to `autoplan run` mid-run (4 ranks)", lambda c: [], custom=sigterm_case),
    Case("launcher", "`autoplan run` of a plan for 128 nodes x 8 GPUs", lambda c: [], custom=many_nodes_case),
    Case("launcher", "`autoplan run` of a GPU plan (dgx-h100, 2 GPUs) on this CPU machine",
         lambda c: run_args(c, plan_file(c, "pgpu.yaml", "gpt-tiny", "--cluster", "dgx-h100-80gb", "--nodes", "1",
                                        "--devices-per-node", "2", "--global-batch-size", "8", "--seq-len", "32")),
         timeout_s=180),
    Case("args", "--steps 0", lambda c: run_args(c, p1(c))[:3] + ["0"], timeout_s=120),
    Case("args", "--data missing.bin", lambda c: run_args(c, p1(c), "--data", "missing.bin"), timeout_s=120),
    Case("args", "--data '' (empty)", lambda c: run_args(c, p1(c), "--data", ""), check=after_run, timeout_s=120),
    Case("args", "--metrics in an unwritable place (/proc/m.jsonl)",
         lambda c: run_args(c, p1(c))[:4] + ["--metrics", "/proc/m.jsonl"], timeout_s=120),
    Case("args", "--checkpoint-dir that is a file",
         lambda c: run_args(c, p1(c), "--checkpoint-dir", str(model_file(c, "afile", "x")), "--checkpoint-every", "1"),
         timeout_s=120),
    Case("args", "--resume on a missing folder",
         lambda c: run_args(c, p1(c), "--checkpoint-dir", str(c.work / "nowhere"), "--resume"), check=after_run,
         timeout_s=120),
    Case("args", "--resume on an empty folder",
         lambda c: run_args(c, p1(c), "--checkpoint-dir", str(_mkdir(c.work / "empty")), "--resume"),
         check=after_run, timeout_s=120),
    Case("checkpoints", "resume from a truncated newest shard", lambda c: corrupt(c, "truncated"), check=after_run,
         timeout_s=300),
    Case("checkpoints", "resume with rng_rank1.pt missing", lambda c: corrupt(c, "no-rng"), check=after_run,
         timeout_s=300),
    Case("checkpoints", "resume from a shard with 2,048 weights overwritten", lambda c: corrupt(c, "overwritten"),
         check=after_run, timeout_s=300),
    Case("checkpoints", "two runs on one checkpoint folder at once", lambda c: [], custom=two_runs_case),
    Case("checkpoints", "metrics of a resumed run (12 steps, saved at 10, resumed to 15)", lambda c: [],
         custom=metrics_repeat_case),
    Case("numbers", "learning_rate: .inf (plan), run 3 steps",
         lambda c: run_args(c, edited_plan(c, "lr.yaml", "learning_rate: 0.0003", "learning_rate: .inf")),
         check=after_run, timeout_s=120),
    Case("numbers", "weight_decay: .nan (plan), run 3 steps",
         lambda c: run_args(c, edited_plan(c, "wd.yaml", "weight_decay: 0.1", "weight_decay: .nan")),
         check=after_run, timeout_s=120),
    Case("numbers", "norm_eps: .nan (plan's model), run 3 steps",
         lambda c: run_args(c, edited_plan(c, "eps.yaml", "norm_eps: 1.0e-05", "norm_eps: .nan")),
         check=after_run, timeout_s=120),
    Case("numbers", "seed: 2**70 (plan), run 3 steps",
         lambda c: run_args(c, edited_plan(c, "seed.yaml", "seed: 0", f"seed: {2**70}")), check=after_run,
         timeout_s=120),
    Case("numbers", "rope_theta: -1 (model spec)",
         lambda c: ["plan", str(model_file(c, "rope.yaml", LLAMA + "rope_theta: -1\n")), *PLAN_ARGS]),
    Case("numbers", "peak_fp32_tflops: .inf (device profile)",
         lambda c: ["plan", "gpt-tiny", "--cluster", str(cluster_with_device(c, ("peak_fp32_tflops", ".inf"))),
                    "--global-batch-size", "8"]),
    Case("numbers", "memory_bandwidth_gb_per_s: 1e2 (a YAML 1.2 number)",
         lambda c: ["plan", "gpt-tiny", "--cluster",
                    str(cluster_with_device(c, ("memory_bandwidth_gb_per_s", "1e2"))), "--global-batch-size", "8"]),
    Case("numbers", "num_layers given twice (2, then 200)",
         lambda c: ["plan", str(model_file(c, "dup.yaml", GPT + "num_layers: 200\n")), *PLAN_ARGS]),
    Case("files", "model YAML that is not UTF-8 (Latin-1 name)",
         lambda c: ["plan", str(model_file(c, "latin1.yaml", GPT.replace("name: m", "name: caf\xe9").encode("latin-1"))),
                    *PLAN_ARGS]),
    Case("files", "YAML nested 5,000 deep",
         lambda c: ["plan", str(model_file(c, "deep.yaml", GPT + "x: " + "[" * 5000 + "]" * 5000 + "\n")), *PLAN_ARGS]),
    Case("files", "billion laughs in stages[0].full_recompute (`autoplan show`)",
         lambda c: ["show", str(c.work / "bomb.yaml")],
         setup=lambda c: (c.work / "bomb.yaml").write_text(_bomb_text(p1(c).read_text())), timeout_s=60),
    Case("files", "a 50 MB model YAML", lambda c: ["plan", str(big_yaml(c)), *PLAN_ARGS], timeout_s=60),
    Case("files", "-o to a folder", lambda c: [*PLAN8, "-o", str(_mkdir(c.work / "outdir"))]),
    Case("files", "-o into a missing folder", lambda c: [*PLAN8, "-o", str(c.work / "no" / "such" / "p.yaml")]),
    Case("files", "-o on a read-only file system (/proc/p.yaml)", lambda c: [*PLAN8, "-o", "/proc/p.yaml"]),
    Case("files", "-o to a symlink", lambda c: [*PLAN8, "-o", str(c.work / "link.yaml")], setup=link_case_setup,
         check=link_check),
    Case("files", "-o to a device node", lambda c: [*PLAN8, "-o", str(dev_node(c))], check=dev_check),
    Case("files", "`plan --json | head -c 1`",
         lambda c: f"{PY} -m autoplan.cli.main {' '.join(PLAN8)} --json | head -c 1 > /dev/null"),
    Case("files", "`plan --json | true` (reader gone before the write)",
         lambda c: f"{PY} -m autoplan.cli.main {' '.join(PLAN8)} --json | (exec 0<&-; true)"),
    Case("kill", "kill -9 of rank 1 mid-run (4 ranks; new code: --max-restarts 1)", lambda c: [], custom=kill_case),
    *ISSUE_33_CASES,
]


def _mkdir(path: Path) -> Path:
    path.mkdir(exist_ok=True)
    return path


OUTCOMES = ("refused in one line", "right", "traceback", "hang", "accepted nonsense", "other")


def outcome(case: Case, proc: subprocess.CompletedProcess, timed_out: bool) -> str:
    """One of OUTCOMES for a case with an expectation."""
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    if timed_out:
        return "hang"
    if "Traceback" in proc.stderr:
        return "traceback"
    if proc.returncode == 2 and len(lines) == 1:
        return "refused in one line" if case.expect == "refuse" else "other"
    if proc.returncode == 0:
        if case.expect == "accept" or (case.expect == "warn" and any("warning" in line for line in lines)):
            return "right"
        return "accepted nonsense"
    return "other"


TALLY: dict[str, dict[str, int]] = {}


def tally(command: str, result: str) -> None:
    row = TALLY.setdefault(command, dict.fromkeys(OUTCOMES, 0))
    row[result] += 1


def run_case(ctx: Ctx, case: Case) -> str:
    if case.custom is not None:
        return case.custom(ctx)
    if case.setup is not None:
        case.setup(ctx)
    argv = case.argv(ctx)
    if isinstance(argv, str):
        t0 = time.monotonic()
        proc = subprocess.run(["bash", "-c", argv], cwd=ctx.work, env=ctx.env(), capture_output=True, text=True,
                              timeout=case.timeout_s)
        text = summary(proc, time.monotonic() - t0, False)
        return text
    proc, elapsed, timed_out = autoplan(ctx, argv, case.timeout_s)
    text = summary(proc, elapsed, timed_out)
    if case.check is not None:
        text += "; " + case.check(ctx, proc)
    if case.expect is not None:
        result = outcome(case, proc, timed_out)
        tally(case.command or argv[0], result)
        text += f" -> {result}"
        if result in ("right",) and proc.stderr.strip():
            text += f' ("{proc.stderr.strip().splitlines()[-1][:150]}")'
    return text


def tally_table() -> str:
    head = "| command | tried | " + " | ".join(OUTCOMES) + " |"
    rows = [head, "| --- " * (len(OUTCOMES) + 2) + "|"]
    for command, counts in TALLY.items():
        rows.append(f"| {command} | {sum(counts.values())} | " + " | ".join(str(counts[o]) for o in OUTCOMES) + " |")
    return "\n".join(rows)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--root", default=str(HERE_ROOT), help="the checkout to test (default: this one)")
    ap.add_argument("--only", help="comma-separated groups")
    ap.add_argument("--keep", action="store_true", help="keep the scratch folder")
    args = ap.parse_args()
    root = Path(args.root).resolve()
    work = Path(tempfile.mkdtemp(prefix="hostile-"))
    ctx = Ctx(root, work, new=(root / "autoplan" / "launcher").is_dir())
    groups = set(args.only.split(",")) if args.only else None
    print(f"# hostile inputs against {root} ({'new' if ctx.new else 'old'} launcher), scratch {work}\n")
    print("| group | case | result |\n| --- | --- | --- |", flush=True)
    try:
        for case in CASES:
            if groups and case.group not in groups:
                continue
            try:
                text = run_case(ctx, case)
            except Exception as err:  # noqa: BLE001 - a broken case must not stop the table
                text = f"CASE FAILED TO RUN: {type(err).__name__}: {str(err)[:200]}"
            print(f"| {case.group} | {case.name} | {text.replace('|', '/')} |", flush=True)
        if TALLY:
            print("\nissue 33's cases by command (right: accepted where acceptance is right, or warned):\n")
            print(tally_table(), flush=True)
    finally:
        _kill_tree_by_marker(str(work))
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
