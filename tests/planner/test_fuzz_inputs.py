"""Hypothesis fuzz of every YAML schema and of the command line: bad input is one line, never a
traceback, never a hang, never accepted when it means nothing.

Each case starts from a valid document (a model spec, a device profile, a cluster, a plan -- whose
``training`` section is the training setup --, a model profile) and damages it: a field replaced by a
hostile value (NaN, inf, 2**70, -1, 0, text with control characters, a list, a map, ...), a key deleted
or added, numbers scaled by powers of ten, or the YAML text itself cut, repeated (duplicate keys),
re-encoded, nested deeply or turned into an alias bomb. The CLI cases run ``main(argv)`` in-process
(fast) with such files and hostile option values; a few run the real ``autoplan`` executable.

What each outcome must be:

* refused: a SpecError, i.e. exit status 2 and exactly one line on stderr (not a traceback, not a
  multi-line error, not another exit status);
* accepted: then the object must mean something -- ``meaningless()`` below states, per field and
  independently of the validators, what no real model, device, cluster or training run can be
  (non-finite numbers; negative sizes; zero where physics needs a positive value; sizes beyond any
  cluster: more than 10^7 devices, 10^5 layers, 10^8 tokens per sequence, ...);
* fast: at most 5 s of CPU time per case (CPU, not wall time: 2 cores shared by several jobs), and
  no case may block (a 60 s alarm turns a blocked read into a failure).

100 cases per run in the fast lane, 1,200 in the slow lane (``pytest -m slow``). ``python
tests/planner/test_fuzz_inputs.py N`` runs N cases against whatever ``autoplan`` is on PYTHONPATH and
prints the counts instead of failing (how the old code was surveyed).
"""

from __future__ import annotations

import contextlib
import io
import math
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from autoplan.cli.main import main
from autoplan.errors import SpecError
from autoplan.schema import load_cluster, load_device, load_model, load_plan
from autoplan.schema.profile import load_profile

ROOT = Path(__file__).resolve().parents[2]
CPU_LIMIT_S = 5.0
PROFILES = ROOT / "profiles"

# ---------------------------------------------------------------------------------- what means nothing
MAX = {"devices": 10**7, "layers": 10**5, "hidden": 10**7, "vocab": 10**8, "tokens": 10**8, "batch": 10**8,
       "steps": 10**10, "params": 10**16}
"""Looser than the validators' bounds (autoplan/schema/limits.py) on purpose: this is what *no* input
can mean, stated independently; the validators may refuse earlier."""


def _finite(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def _all_floats_finite(obj: Any, where: str, out: list[str]) -> None:
    import dataclasses

    if dataclasses.is_dataclass(obj):
        for f in dataclasses.fields(obj):
            _all_floats_finite(getattr(obj, f.name), f"{where}.{f.name}", out)
    elif isinstance(obj, (list, tuple)):
        for i, v in enumerate(obj):
            _all_floats_finite(v, f"{where}[{i}]", out)
    elif isinstance(obj, float) and not math.isfinite(obj):
        out.append(f"{where} = {obj}")
    elif isinstance(obj, str) and ("\n" in obj or "\x00" in obj or len(obj) > 10**5):
        out.append(f"{where}: multi-line or huge text")


def _size(out: list[str], name: str, value: Any, high: float, low: int = 1) -> None:
    if not (isinstance(value, int) and low <= value <= high):
        out.append(f"{name} = {value!r}")


def meaningless_model(m, out: list[str], where: str = "model") -> None:
    _size(out, f"{where}.num_layers", m.num_layers, MAX["layers"])
    for name in ("hidden_size", "ffn_hidden_size", "num_attention_heads", "num_kv_heads"):
        _size(out, f"{where}.{name}", getattr(m, name), MAX["hidden"])
    _size(out, f"{where}.vocab_size", m.vocab_size, MAX["vocab"])
    _size(out, f"{where}.seq_len", m.seq_len, MAX["tokens"])
    if isinstance(m.num_attention_heads, int) and isinstance(m.hidden_size, int) and m.num_attention_heads >= 1:
        if m.hidden_size % m.num_attention_heads or m.num_attention_heads % max(1, m.num_kv_heads):
            out.append(f"{where}: heads do not divide")
    if not (0 <= m.dropout < 1):
        out.append(f"{where}.dropout = {m.dropout}")
    if not (m.rope_theta > 0 and 0 < m.norm_eps < 1):
        out.append(f"{where}: rope_theta {m.rope_theta} / norm_eps {m.norm_eps}")
    if not m.name or m.total_params() > MAX["params"]:
        out.append(f"{where}: empty name or {m.total_params():.3g} params")


def meaningless_device(d, out: list[str], where: str = "device") -> None:
    for name in ("memory_gib", "memory_bandwidth_gb_per_s", "peak_bf16_tflops", "peak_fp16_tflops",
                 "peak_fp32_tflops", "host_link_gb_per_s", "host_adam_gparams_per_s"):
        if not getattr(d, name) > 0:
            out.append(f"{where}.{name} = {getattr(d, name)} (must be positive)")
    for name in ("matmul_efficiency", "memory_efficiency"):
        if not 0 < getattr(d, name) <= 1:
            out.append(f"{where}.{name} = {getattr(d, name)}")
    for name in ("matmul_half_size_gflop", "kernel_overhead_us"):
        if getattr(d, name) < 0:
            out.append(f"{where}.{name} = {getattr(d, name)}")
    for i, p in enumerate(d.matmul_points):
        if min(p.m, p.n, p.k) < 1 or not p.tflops > 0:
            out.append(f"{where}.matmul_points[{i}] = {p}")


def meaningless_cluster(c, out: list[str], where: str = "cluster") -> None:
    _size(out, f"{where}.devices_per_node", c.devices_per_node, MAX["devices"])
    _size(out, f"{where}.num_nodes", c.num_nodes, MAX["devices"])
    if isinstance(c.num_nodes, int) and isinstance(c.devices_per_node, int) and c.num_devices > MAX["devices"]:
        out.append(f"{where}: {c.num_devices} devices")
    for link in ("intra_node", "inter_node"):
        lk = getattr(c, link)
        if not (lk.bandwidth_gb_per_s > 0 and lk.latency_us >= 0):
            out.append(f"{where}.{link} = {lk}")
    meaningless_device(c.device, out, f"{where}.device")


def meaningless_training(t, out: list[str], where: str = "training") -> None:
    _size(out, f"{where}.global_batch_size", t.global_batch_size, MAX["batch"])
    _size(out, f"{where}.seq_len", t.seq_len, MAX["tokens"])
    if not (0 < t.learning_rate <= 100 and 0 <= t.min_learning_rate <= t.learning_rate):
        out.append(f"{where}: learning rates {t.learning_rate}, {t.min_learning_rate}")
    if not (t.weight_decay >= 0 and t.grad_clip >= 0 and 0 <= t.memory_margin < 1):
        out.append(f"{where}: weight_decay {t.weight_decay}, grad_clip {t.grad_clip}, margin {t.memory_margin}")
    _size(out, f"{where}.warmup_steps", t.warmup_steps, MAX["steps"], low=0)
    _size(out, f"{where}.decay_steps", t.decay_steps, MAX["steps"])
    _size(out, f"{where}.seed", t.seed, 2**63 // 1_000_003 - MAX["steps"], low=0)  # the data seed is seed*1000003+step


def meaningless_plan(p, out: list[str]) -> None:
    for name in ("tp", "pp", "dp", "virtual_stages", "micro_batch_size", "num_microbatches"):
        _size(out, name, getattr(p, name), MAX["devices"] if name in ("tp", "pp", "dp") else MAX["batch"])
    if p.tp * p.pp * p.dp != p.cluster.num_devices:
        out.append("tp * pp * dp != the cluster's devices")
    if p.micro_batch_size * p.num_microbatches * p.dp != p.training.global_batch_size:
        out.append("the micro-batches do not make the global batch")
    if not p.stages or p.stages[-1].layers[1] != p.model.num_layers:
        out.append("the stages do not cover the model")
    meaningless_model(p.model, out)
    meaningless_cluster(p.cluster, out)
    meaningless_training(p.training, out)


def meaningless_profile(p, out: list[str]) -> None:
    if not p.micro_batch_sizes or min(p.micro_batch_sizes) < 1 or min(p.tp_sizes or (1,)) < 1:
        out.append("micro_batch_sizes / tp_sizes")
    if p.seq_len is not None:
        _size(out, "seq_len", p.seq_len, MAX["tokens"])
    for i, layer in enumerate(p.layers):
        if layer.params < 0 or layer.param_bytes < 0:
            out.append(f"layers[{i}] negative params")
        for m in layer.measurements:
            for name in ("fwd_flops", "saved_activation_bytes", "output_bytes"):
                if getattr(m, name) < 0:
                    out.append(f"layers[{i}].{name} < 0")
            for name in ("fwd_time_s", "bwd_time_s"):
                if getattr(m, name) is not None and not getattr(m, name) >= 0:
                    out.append(f"layers[{i}].{name}")


def meaningless(kind: str, obj: Any) -> list[str]:
    out: list[str] = []
    _all_floats_finite(obj, kind, out)
    {"model": meaningless_model, "device": meaningless_device, "cluster": meaningless_cluster,
     "plan": meaningless_plan, "profile": meaningless_profile}[kind](obj, out)
    return out


# ------------------------------------------------------------------------------------ valid documents
def _valid_docs(folder: Path) -> dict[str, str]:
    """YAML text of one valid document of each kind (made by the tool itself)."""
    docs = {"model": (PROFILES / "models" / "gpt-tiny.yaml").read_text(),
            "device": (PROFILES / "hardware" / "cpu.yaml").read_text()}
    cluster = yaml.safe_load((PROFILES / "clusters" / "cpu-local.yaml").read_text())
    cluster["device"] = yaml.safe_load(docs["device"])
    docs["cluster"] = yaml.safe_dump(cluster, sort_keys=False)
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        assert main(["plan", "gpt-tiny", "--cluster", "cpu-local", "--global-batch-size", "8", "--pp", "2",
                     "--json", "-o", str(folder / "plan.yaml")]) == 0
        assert main(["profile", "gpt-tiny", "--quiet", "-o", str(folder / "profile.yaml")]) == 0
    docs["plan"] = (folder / "plan.yaml").read_text()
    docs["profile"] = (folder / "profile.yaml").read_text()
    return docs


LOADERS = {"model": load_model, "device": load_device, "cluster": load_cluster, "plan": load_plan,
           "profile": load_profile}

# ------------------------------------------------------------------------------------ hostile values
PLAUSIBLE = st.one_of(st.integers(1, 64), st.sampled_from([128, 256, 1024, 4096]), st.floats(0.0, 1.0),
                      st.sampled_from([1e-5, 1e-3, 0.1, 2.0, 100.0, 1e4]))
"""Values a real file could hold: half the damage is one of these, so that accepted documents are common
(the meaningless accepts hide among them)."""
HOSTILE = st.one_of(
    st.integers(min_value=-(2**70), max_value=2**70),
    st.sampled_from([0, -1, 1, 2, 3, 2**31, 2**53 + 1, 2**63, 2**64, 10**30, -(2**63)]),
    st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from([math.nan, math.inf, -math.inf, 1e308, 5e-324, -0.0, 1e-300, 0.5, 1.5]),
    st.text(max_size=12),
    st.sampled_from(["", "1e9", "yes", "no", "0x1F", "0o17", ".inf", "~", "\n", "a\x00b", "x" * 5000,
                     "gpt", "llama", "fp32", "nccl", "1f1b", "interleaved"]),
    st.booleans(), st.none())
SCALARS = st.one_of(PLAUSIBLE, HOSTILE)
VALUES = st.recursive(SCALARS, lambda c: st.lists(c, max_size=4) | st.dictionaries(st.text(max_size=6), c,
                                                                                   max_size=3), max_leaves=6)


def _paths(doc: Any, prefix: tuple = ()) -> list[tuple]:
    out = [prefix] if prefix else []
    if isinstance(doc, dict):
        for k, v in doc.items():
            out += _paths(v, prefix + (k,))
    elif isinstance(doc, list):
        for i, v in enumerate(doc[:3]):
            out += _paths(v, prefix + (i,))
    return out


EDGE_NUMBERS = st.sampled_from([math.nan, math.inf, -math.inf, -1, -1.0, 0, 0.0, -0.0, 1e30, 2**70, 10**12, 1e-300])


def _is_number(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool)


def _get(doc: Any, path: tuple) -> Any:
    for key in path:
        doc = doc[key]
    return doc


def _set(doc: Any, path: tuple, value: Any, delete: bool = False) -> None:
    for key in path[:-1]:
        doc = doc[key]
    if delete and isinstance(doc, dict):
        doc.pop(path[-1], None)
    else:
        doc[path[-1]] = value


@st.composite
def damaged_yaml(draw, text: str) -> str:
    doc = yaml.safe_load(text)
    for _ in range(draw(st.integers(1, 2))):
        paths = _paths(doc)
        path = draw(st.sampled_from(paths))
        op = draw(st.sampled_from(["replace", "replace", "edge", "edge", "scale", "delete", "add"]))
        target = doc
        for key in path:
            target = target[key]
        numbers = [p for p in paths if _is_number(_get(doc, p))]
        if op == "edge" and numbers:  # a number field set to what no number field may hold
            _set(doc, draw(st.sampled_from(numbers)), draw(EDGE_NUMBERS))
        elif op == "scale" and isinstance(target, (int, float)) and not isinstance(target, bool):
            factor = draw(st.sampled_from([-1, 0, 10**3, 10**9, 10**15, 1e-9, 1e300]))
            _set(doc, path, type(target)(target * factor) if isinstance(target, int) and isinstance(factor, int)
                 else float(target) * factor)
        elif op == "delete":
            _set(doc, path, None, delete=True)
        elif op == "add" and isinstance(target, dict):
            target[draw(st.text(min_size=1, max_size=8))] = draw(VALUES)
        else:
            _set(doc, path, draw(VALUES))
    try:
        out = yaml.safe_dump(doc, sort_keys=False, allow_unicode=True)
    except (yaml.YAMLError, ValueError, OverflowError):
        out = text
    return _text_damage(draw, out)


def _text_damage(draw, text: str) -> str:
    how = draw(st.sampled_from(["as is"] * 6 + ["cut", "repeat line", "latin-1", "deep", "bomb", "bom", "tabs"]))
    lines = text.splitlines(keepends=True) or [""]
    if how == "cut":
        return text[: draw(st.integers(0, len(text)))]
    if how == "repeat line":  # a duplicate key, most of the time
        i = draw(st.integers(0, len(lines) - 1))
        return "".join(lines[: i + 1] + [lines[i]] + lines[i + 1:])
    if how == "latin-1":
        return text + "# caf\udce9\n"  # written with errors="surrogateescape": a lone 0xe9 byte
    if how == "deep":
        depth = draw(st.sampled_from([70, 1000, 5000]))
        return text + "zz: " + "[" * depth + "]" * depth + "\n"
    if how == "bomb":
        nested = "&a0 [0, 0, 0, 0, 0, 0, 0, 0, 0]"
        for i in range(1, 8):
            nested = f"&a{i} [{nested}, " + ", ".join([f"*a{i - 1}"] * 8) + "]"
        key = draw(st.sampled_from(["zz", "name", "layers", "stages", "matmul_points"]))
        return text + f"{key}: [{nested}, " + ", ".join(["*a7"] * 8) + "]\n"
    if how == "bom":
        return "\ufeff" + text
    if how == "tabs":
        return text.replace("  ", "\t", 1)
    return text


# ---------------------------------------------------------------------------------------- one case
class Blocked(Exception):
    pass


@contextlib.contextmanager
def alarm(seconds: int):
    def on_alarm(*_):
        raise Blocked(f"blocked for {seconds} s")

    previous = signal.signal(signal.SIGALRM, on_alarm)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


def outcome_of_load(kind: str, path: Path) -> tuple[str, str]:
    """("refused" | "accepted" | "traceback" | "slow" | "meaningless", detail)."""
    t0 = time.process_time()
    try:
        with alarm(60):
            obj = LOADERS[kind](path)
    except SpecError as err:
        text = str(err)
        if "\n" in text or not text:
            return "multi-line error", f"SpecError of {text.count(chr(10)) + 1} lines"
        return ("slow" if time.process_time() - t0 > CPU_LIMIT_S else "refused"), text[:200]
    except Blocked as err:
        return "slow", str(err)
    except Exception as err:  # noqa: BLE001 - anything else is what the fuzz looks for
        return "traceback", f"{type(err).__name__}: {str(err)[:200]}"
    if time.process_time() - t0 > CPU_LIMIT_S:
        return "slow", f"{time.process_time() - t0:.1f} s of CPU"
    problems = meaningless(kind, obj)
    return ("meaningless", "; ".join(problems)[:300]) if problems else ("accepted", "")


def write(path: Path, text: str) -> Path:
    path.write_bytes(text.encode("utf-8", errors="surrogateescape"))
    return path


# -------------------------------------------------------------------------------------------- the CLI
NUMBERS = st.one_of(st.integers(1, 16).map(str), st.sampled_from(["1", "2", "4", "8"]),
                    st.integers(-(2**70), 2**70).map(str),
                    st.sampled_from(["0", "-1", "1", "2", "4", "8", "16", "1e9", "nan", "inf", "-inf", "1.5", "abc",
                                     "", "99999999999999999999", "0x10", " 3", "1_000"]))
OPTIONS = {
    "common": ["--nodes", "--devices-per-node", "--global-batch-size", "--seq-len", "--memory-margin"],
    "pins": ["--tp", "--pp", "--dp", "--virtual-stages", "--micro-batch-size", "--zero-stage"],
    "choices": {"--schedule": ["gpipe", "1f1b", "interleaved", "zigzag"], "--precision": ["bf16", "fp32", "fp8"],
                "--recompute": ["none", "selective", "full", "some"], "--solver": ["bnb", "cpsat", "bruteforce", "x"],
                "--optimizer": ["adamw", "sgd", "lion"]},
    "flags": ["--json", "--sequence-parallel", "--no-sequence-parallel", "--offload", "--no-offload",
              "--no-flash-attention", "--rescale-profile"],
    "run": ["--steps", "--nproc", "--checkpoint-every", "--max-restarts", "--timeout", "--nnodes", "--node-rank"],
}


@st.composite
def cli_argv(draw, docs: dict[str, str], folder: Path) -> tuple[list[str], Path | None]:
    """An argv for main() and the plan file it may write (-o)."""
    command = draw(st.sampled_from(["plan", "plan", "estimate", "show", "run", "profile"]))

    def file_of(kind: str) -> str:
        name = f"{kind}-{draw(st.integers(0, 10**9))}.yaml"
        return str(write(folder / name, draw(damaged_yaml(docs[kind]))))

    model = draw(st.one_of(st.sampled_from(["gpt-tiny", "llama-tiny", "gpt3-1.3b", "llama3-70b", "nope", "", ".",
                                            "/dev/null", "/", str(folder)]), st.just("FILE")))
    if model == "FILE":
        model = file_of(draw(st.sampled_from(["model", "profile"])))
    output = None
    if command == "show" or command == "run":
        plan = draw(st.sampled_from(["VALID", "FILE", "missing.yaml", "/dev/null", str(folder)]))
        plan = str(write(folder / "valid-plan.yaml", docs["plan"])) if plan == "VALID" else \
            file_of("plan") if plan == "FILE" else plan
        argv = [command, plan]
        if command == "show" and draw(st.booleans()):
            argv.append("--timeline")
        if command == "run":
            argv.append("--print-command")
            for opt in draw(st.lists(st.sampled_from(OPTIONS["run"]), max_size=4, unique=True)):
                argv += [opt, draw(NUMBERS)]
            for opt, vals in (("--data", ["synthetic", "", "missing.bin", str(folder)]),
                              ("--metrics", ["m.jsonl", "", str(folder), "/proc/m.jsonl", "no/such/m.jsonl"]),
                              ("--checkpoint-dir", ["ck", "", str(folder / "valid-plan.yaml"), "/proc/ck"]),
                              ("--backend", ["gloo", "nccl", "mpi"]), ("--rdzv-endpoint", ["h:29500", "h", "h:0"])):
                if draw(st.integers(0, 3)) == 0:
                    argv += [opt, draw(st.sampled_from(vals))]
            if draw(st.integers(0, 3)) == 0:
                argv.append(draw(st.sampled_from(["--resume", "--slurm"])))
        return argv, None
    if command == "profile":
        argv = ["profile", model, "--quiet", "--device", draw(st.sampled_from(["meta", "meta", "cuda", "xla", ""]))]
        for opt in draw(st.lists(st.sampled_from(["--dtype", "--micro-batch-sizes", "--seq-len", "--tp-sizes"]),
                                 max_size=2, unique=True)):
            argv += [opt, draw(st.one_of(NUMBERS, st.sampled_from(["fp32", "bf16", "1,2", "1,,0", "8,-1"])))]
        output = folder / f"out-{draw(st.integers(0, 10**9))}.yaml"
        return argv + ["-o", str(output)], None
    cluster = draw(st.one_of(st.sampled_from(["cpu-local", "dgx-h100-80gb", "dgx-a100-80gb", "nowhere", ""]),
                             st.just("FILE")))
    if cluster == "FILE":
        cluster = file_of("cluster")
    argv = [command, model, "--cluster", cluster]
    if draw(st.integers(0, 5)):
        argv += ["--global-batch-size", draw(st.one_of(NUMBERS, st.sampled_from(["8", "16", "64"])))]
    for opt in draw(st.lists(st.sampled_from(OPTIONS["common"] + OPTIONS["pins"]), max_size=4, unique=True)):
        argv += [opt, draw(NUMBERS)]
    for opt in draw(st.lists(st.sampled_from(sorted(OPTIONS["choices"])), max_size=2, unique=True)):
        argv += [opt, draw(st.sampled_from(OPTIONS["choices"][opt]))]
    argv += draw(st.lists(st.sampled_from(OPTIONS["flags"]), max_size=2, unique=True))
    if command == "estimate":
        argv += ["--tp", "1", "--pp", "1", "--zero-stage", "0", "--schedule", "gpipe", "--micro-batch-size", "1"] \
            if draw(st.booleans()) else []
    if draw(st.booleans()):
        where = draw(st.sampled_from(["file", "file", "folder", "missing", "proc"]))
        output = {"file": folder / f"out-{draw(st.integers(0, 10**9))}.yaml", "folder": folder,
                  "missing": folder / "no" / "plan.yaml", "proc": Path("/proc/plan.yaml")}[where]
        argv += ["-o", str(output)]
    return argv, output


def outcome_of_cli(argv: list[str], output: Path | None) -> tuple[str, str]:
    out, err = io.StringIO(), io.StringIO()
    t0 = time.process_time()
    try:
        with alarm(60), contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            code = main(argv)
    except Blocked as exc:
        return "slow", str(exc)
    except SystemExit as exc:  # what the console script would exit with (argparse does this)
        code = exc.code if isinstance(exc.code, int) else 1
    except BaseException as exc:  # noqa: BLE001 - what the fuzz looks for
        return "traceback", f"{type(exc).__name__}: {str(exc)[:200]}"
    cpu = time.process_time() - t0
    lines = [line for line in err.getvalue().splitlines() if line.strip()]
    if cpu > CPU_LIMIT_S:
        return "slow", f"{cpu:.1f} s of CPU"
    if "Traceback" in err.getvalue():
        return "traceback", f"exit {code}: {lines[-1:]}"
    if code == 2:
        if len(lines) != 1:
            return "multi-line error", f"exit 2 with {len(lines)} lines: {lines[:3]}"
        return "refused", lines[0][:200]
    if code != 0:
        return "other exit", f"exit {code}: {lines[-3:]}"
    if output is not None and output.is_file() and argv[0] in ("plan", "estimate"):
        problems = meaningless("plan", load_plan(output))
        if problems:
            return "meaningless", "; ".join(problems)[:300]
    if argv[0] == "run":
        problems = meaningless_run_options(argv)
        if problems:
            return "meaningless", problems
    return "accepted", ""


def meaningless_run_options(argv: list[str]) -> str:
    """``run --print-command`` accepted: the numbers it would start the job with must make sense."""
    values = dict(zip(argv[2::1], argv[3::1]))
    problems = []
    for opt, low in (("--steps", 1), ("--checkpoint-every", 0), ("--max-restarts", 0), ("--nnodes", 1),
                     ("--node-rank", 0), ("--nproc", 1)):
        if opt in values:
            try:
                ok = low <= int(values[opt]) <= 10**10
            except ValueError:
                ok = False
            if not ok:
                problems.append(f"{opt} {values[opt]}")
    if "--timeout" in values:
        try:
            ok = 0 < float(values["--timeout"]) < 10**8
        except ValueError:
            ok = False
        if not ok:
            problems.append(f"--timeout {values['--timeout']}")
    return ", ".join(problems)


# ------------------------------------------------------------------------------------------ the tests
@pytest.fixture(scope="module")
def docs(tmp_path_factory) -> dict[str, str]:
    return _valid_docs(tmp_path_factory.mktemp("valid"))


def _check(outcome: tuple[str, str], what: str) -> None:
    kind, detail = outcome
    assert kind in ("refused", "accepted"), f"{kind}: {detail}\n{what}"


FAST = settings(max_examples=15, deadline=None, derandomize=True, database=None,
                suppress_health_check=list(HealthCheck))
SLOW = settings(max_examples=150, deadline=None, database=None, suppress_health_check=list(HealthCheck))


def _schema_case(docs, kind, data):
    folder = Path(tempfile.mkdtemp(prefix="fuzz-"))
    try:
        text = data.draw(damaged_yaml(docs[kind]))
        path = write(folder / f"{kind}.yaml", text)
        _check(outcome_of_load(kind, path), text[:2000])
    finally:
        import shutil
        shutil.rmtree(folder, ignore_errors=True)


def _cli_case(docs, data):
    folder = Path(tempfile.mkdtemp(prefix="fuzz-"))
    cwd = os.getcwd()
    try:
        os.chdir(folder)
        argv, output = data.draw(cli_argv(docs, folder))
        _check(outcome_of_cli(argv, output), " ".join(argv))
    finally:
        os.chdir(cwd)
        import shutil
        shutil.rmtree(folder, ignore_errors=True)


KINDS = ["model", "device", "cluster", "plan", "profile"]


@pytest.mark.parametrize("kind", KINDS)
@FAST
@given(data=st.data())
def test_schema_fuzz(docs, kind, data):  # 5 x 15 = 75 cases
    _schema_case(docs, kind, data)


@FAST
@given(data=st.data())
def test_cli_fuzz(docs, data):  # 15 cases, + 75 above + 10 below: 100 in the fast lane
    _cli_case(docs, data)


@pytest.mark.slow
@pytest.mark.parametrize("kind", KINDS)
@SLOW
@given(data=st.data())
def test_schema_fuzz_slow(docs, kind, data):  # 5 x 150 = 750 cases
    _schema_case(docs, kind, data)


@pytest.mark.slow
@settings(max_examples=450, deadline=None, database=None, suppress_health_check=list(HealthCheck))
@given(data=st.data())
def test_cli_fuzz_slow(docs, data):  # 450 cases: 1,200 in the slow lane with the schemas
    _cli_case(docs, data)


SUBPROCESS_CASES = [
    (["plan", "gpt-tiny", "--cluster", "cpu-local", "--global-batch-size", "nan"], 2),
    (["plan", "FILE:deep", "--cluster", "cpu-local", "--global-batch-size", "8"], 2),
    (["show", "FILE:bomb"], 2),
    (["run", "FILE:plan", "--print-command", "--steps", "0"], 2),
    (["plan", "gpt-tiny", "--cluster", "cpu-local", "--global-batch-size", "8", "--json", "|", "head", "-c", "1"], 0),
    (["plan", "gpt-tiny", "--cluster", "cpu-local", "--global-batch-size", "8", "-o", "/proc/p.yaml"], 2),
    (["plan", "gpt-tiny", "--cluster", "cpu-local", "--global-batch-size", "8", "--tp", "3"], 2),
    (["estimate", "gpt-tiny", "--cluster", "cpu-local", "--global-batch-size", "8", "--tp", "8", "--pp", "8",
      "--zero-stage", "0", "--schedule", "gpipe", "--micro-batch-size", "1"], 2),
    (["run", "FILE:plan", "--print-command", "--data", ""], 2),
    (["plan", "gpt-tiny", "--cluster", "cpu-local"], 2),
]


@pytest.mark.parametrize("argv, status", SUBPROCESS_CASES, ids=[" ".join(a)[:60] for a, _ in SUBPROCESS_CASES])
def test_real_executable(docs, tmp_path, argv, status):
    """The installed entry point as a user starts it (10 cases, ~1 s each)."""
    files = {"FILE:deep": write(tmp_path / "deep.yaml", docs["model"] + "x: " + "[" * 5000 + "]" * 5000 + "\n"),
             "FILE:bomb": write(tmp_path / "bomb.yaml", _text_damage_fixed(docs["plan"])),
             "FILE:plan": write(tmp_path / "plan.yaml", docs["plan"])}
    argv = [str(files.get(a, a)) for a in argv]
    cmd = " ".join(argv)
    pipe = "|" in argv
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    shell = f"set -o pipefail; {sys.executable} -m autoplan.cli.main {cmd}" if pipe else None
    proc = subprocess.run(["bash", "-c", shell] if pipe else [sys.executable, "-m", "autoplan.cli.main", *argv],
                          capture_output=True, text=True, timeout=120, cwd=tmp_path, env=env)
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    if pipe:  # head exits after one byte; autoplan then finds stdout gone: 141, silently
        assert proc.returncode in (0, 141) and not lines, proc.stderr
        return
    assert proc.returncode == status, proc.stderr
    assert "Traceback" not in proc.stderr
    assert len(lines) == (1 if status == 2 else len(lines)), lines


def _text_damage_fixed(text: str) -> str:
    nested = "&a0 [0, 0, 0, 0, 0, 0, 0, 0, 0]"
    for i in range(1, 9):
        nested = f"&a{i} [{nested}, " + ", ".join([f"*a{i - 1}"] * 8) + "]"
    return text.replace("full_recompute: []", f"full_recompute: [{nested}, " + ", ".join(["*a8"] * 8) + "]", 1)


# ---------------------------------------------------------------------- survey mode (no assertions)
def survey(n: int) -> dict[str, int]:
    """Run ``n`` cases (schemas and CLI alternately) and count the outcomes; prints the failures."""
    folder = Path(tempfile.mkdtemp(prefix="survey-"))
    docs = _valid_docs(folder)
    counts: dict[str, int] = {}
    for i in range(n):
        case_dir = folder / f"c{i}"
        case_dir.mkdir()
        os.chdir(case_dir)
        if i % 2:
            kind = KINDS[(i // 2) % len(KINDS)]
            text = damaged_yaml(docs[kind]).example()
            outcome = outcome_of_load(kind, write(case_dir / f"{kind}.yaml", text))
            what = f"{kind} file"
        else:
            argv, output = cli_argv(docs, case_dir).example()
            outcome = outcome_of_cli(argv, output)
            what = " ".join(argv)[:150]
        counts[outcome[0]] = counts.get(outcome[0], 0) + 1
        if outcome[0] not in ("refused", "accepted"):
            print(f"{outcome[0]}: {outcome[1][:150]}  <- {what}", flush=True)
    os.chdir(ROOT)
    import shutil
    shutil.rmtree(folder, ignore_errors=True)
    return counts


if __name__ == "__main__":
    import warnings

    warnings.filterwarnings("ignore")
    print(survey(int(sys.argv[1]) if len(sys.argv) > 1 else 200))
