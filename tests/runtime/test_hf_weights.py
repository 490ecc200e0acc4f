"""Hugging Face checkpoints in and out (issue 29; runtime/hf/).

In: a tiny random ``transformers`` model of each family (llama with Llama 3.1 RoPE scaling, mistral,
qwen2, qwen3, gpt2; one saved sharded with an index) loaded with ``--init-from`` gives the logits and
loss ``transformers`` gives (serially, in a world of one, through ``build_parts``), and the same folder
under tp / pp / cp / ZeRO-3 / interleaved and V-shaped schedules in one 4-rank launch trains as
``transformers``' model trained serially. Out: random init -> 2 steps with a checkpoint -> ``autoplan
export-hf`` -> ``AutoModelForCausalLM.from_pretrained`` computes the runtime's logits. Bad input: one line
naming ``--init-from``, exit 2, before any process starts.

Tolerance 1e-5 relative everywhere: the two implementations order fp32 sums differently (the runtime's
attention kernel, GELU's tanh form, TP's split reductions), a few ulps per operation; a wrong name,
transpose, slice, missing bias or norm gives differences of order 1.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from autoplan.cli.main import main
from autoplan.schema import dump_plan
from hf_helpers import (FAMILIES, SEQ_LEN, VOCAB, folder_spec, hf_training_losses, next_token_loss, random_hf_model,
                        rel_diff, save_hf_folder, saved_once, world_of_one)
from rt_helpers import make_plan
from rt_launcher import ROOT, worker_results

TOL = 1e-5


def hf_folder(family: str) -> Path:
    """The family's tiny random model saved once per session (qwen3 in 100 KB shards with an index)."""
    return saved_once(family, random_hf_model, sharded=family == "qwen3")


def runtime_logits(plan, folder: Path | None, tokens: torch.Tensor) -> torch.Tensor:
    """The serial runtime's logits (real vocabulary columns) after ``build_parts(..., init_from=folder)``."""
    from runtime.build import build_parts
    from runtime.mesh import mesh_of_plan

    with world_of_one():
        parts = build_parts(plan, mesh_of_plan(plan, torch.device("cpu")), init_from=folder)
        with torch.no_grad():
            return parts.models[0].eval()(tokens)[..., :plan.model.vocab_size]


# ------------------------------------------------------------------------------------------------- in
@pytest.mark.parametrize("family", FAMILIES)
def test_init_from_gives_transformers_logits(family):
    folder = hf_folder(family)
    if family == "qwen3":
        assert (folder / "model.safetensors.index.json").is_file() and len(list(folder.glob("*.safetensors"))) > 1
    plan = make_plan(folder_spec(folder), seq_len=SEQ_LEN)
    assert plan.padded_vocab_size > VOCAB  # the padding rows exist and must come out zero
    tokens = torch.randint(0, VOCAB, (2, SEQ_LEN), generator=torch.Generator().manual_seed(1))
    ours = runtime_logits(plan, folder, tokens)
    with torch.no_grad():
        theirs = random_hf_model(family).eval()(tokens).logits
    d_logits = rel_diff(ours, theirs)
    d_loss = abs(next_token_loss(ours, tokens).item() / next_token_loss(theirs, tokens).item() - 1)
    print(f"{family}: logits rel diff {d_logits:.2e}, loss rel diff {d_loss:.2e}")
    assert d_logits <= TOL and d_loss <= TOL


def test_padding_rows_are_zero_and_nothing_is_drawn():
    """The padded vocabulary rows are zeros and every parameter comes from the folder (a different seed
    gives the same model: nothing of the seeded initial values is left)."""
    folder = hf_folder("qwen2")  # tied: the head is the embedding
    tokens = torch.randint(0, VOCAB, (1, SEQ_LEN), generator=torch.Generator().manual_seed(2))
    a = runtime_logits(make_plan(folder_spec(folder), seq_len=SEQ_LEN, seed=0), folder, tokens)
    b = runtime_logits(make_plan(folder_spec(folder), seq_len=SEQ_LEN, seed=7), folder, tokens)
    assert torch.equal(a, b)
    from runtime.build import build_parts
    from runtime.mesh import mesh_of_plan

    plan = make_plan(folder_spec(folder), seq_len=SEQ_LEN)
    with world_of_one():
        model = build_parts(plan, mesh_of_plan(plan, torch.device("cpu")), init_from=folder).models[0]
        emb = model.embed.tok.weight
        assert emb.shape[0] == 384 and torch.all(emb[VOCAB:] == 0) and torch.all(emb[:VOCAB].abs().sum(1) > 0)


class _Recorder:
    """A stored tensor that records the boxes read from it (safetensors' slice API: ``[slices]``)."""

    def __init__(self, full: torch.Tensor) -> None:
        self.full, self.reads = full, []

    def __getitem__(self, index):
        self.reads.append(index)
        return self.full[index]


def test_a_shard_reads_only_its_box_of_a_fused_transposed_tensor():
    """GPT-2's c_attn [h, 3h] (Conv1D: [in, out]): a TP shard of k (rows 16:32 of k's 64 output rows)
    reads exactly columns 64+16 .. 64+32 and returns their transpose; a padded vocabulary shard reads
    only its real rows and zero-fills the rest."""
    from runtime.hf.load import read_box
    from runtime.hf.names import source

    spec = folder_spec(hf_folder("gpt2"))
    c_attn = _Recorder(torch.randn(64, 192))
    src = source("blocks.0.attn.k.weight", spec)
    got = read_box(c_attn, src, [torch.arange(16, 32), torch.arange(64)], None)
    assert c_attn.reads == [(slice(0, 64), slice(80, 96))]
    assert torch.equal(got, c_attn.full[:, 64:128].T[16:32])
    wte = _Recorder(torch.randn(VOCAB, 64))
    rows = torch.arange(256, 512)  # the second tp2 shard of 512 padded rows: 256..299 real
    got = read_box(wte, source("embed.tok.weight", spec), [rows, torch.arange(64)], VOCAB)
    assert wte.reads == [(slice(256, VOCAB), slice(0, 64))]
    assert torch.equal(got[:VOCAB - 256], wte.full[256:]) and torch.all(got[VOCAB - 256:] == 0)
    strided = torch.tensor([0, 1, 4, 5])  # a shard that is not one range: its span read, its rows kept
    got = read_box(_Recorder(wte.full), source("embed.tok.weight", spec), [strided, torch.arange(64)], VOCAB)
    assert torch.equal(got, wte.full[strided])


# name -> (family, make_plan arguments): the plan kinds the issue lists, all on 4 ranks
LAYOUTS = {
    "llama tp2 pp2 1f1b": ("llama", dict(tp=2, pp=2, schedule="1f1b", num_microbatches=2)),
    "qwen3 tp2 dp2 zero3 (FSDP2 over TP: strided shards)": ("qwen3", dict(tp=2, dp=2, zero=3)),
    "llama tp2 dp2 zero0 (replicate over TP)": ("llama", dict(tp=2, dp=2, zero=0)),
    "gpt2 tp2 sp pp2 interleaved (tied copy on another rank)": (
        "gpt2", dict(tp=2, sp=True, pp=2, schedule="interleaved", virtual_stages=2, num_microbatches=2)),
    "qwen2 pp2 dp2 zero1 zbv (tied, V-shape)": (
        "qwen2", dict(pp=2, dp=2, zero=1, schedule="zbv", virtual_stages=2, num_microbatches=4)),
    "mistral cp2 dp2 zero3 offload": ("mistral", dict(cp=2, dp=2, zero=3, offload=True, micro_batch_size=1)),
}
STEPS = 3


def layout_plan(family: str, kw: dict):
    return make_plan(folder_spec(hf_folder(family)), seq_len=SEQ_LEN, learning_rate=1e-3, **kw)


@functools.lru_cache(maxsize=None)
def layout_runs() -> dict:
    folder = Path(tempfile.mkdtemp(prefix="autoplan-hf-layouts-"))
    jobs = []
    for i, (name, (family, kw)) in enumerate(LAYOUTS.items()):
        path = folder / f"plan{i}.yaml"
        path.write_text(dump_plan(layout_plan(family, kw)))
        jobs.append({"name": name, "plan": str(path), "steps": STEPS, "init_from": str(hf_folder(family))})
    (folder / "jobs.json").write_text(json.dumps(jobs))
    out = folder / "out.json"
    return worker_results(4, "hf_worker.py", [str(out), str(folder / "jobs.json")], out)


@pytest.mark.slow
@pytest.mark.parametrize("name", list(LAYOUTS))
def test_init_from_under_parallel_layouts_trains_as_transformers(name):
    """Each layout's losses, starting from the folder, equal transformers' model trained serially with
    the plan's optimizer on the same global batches: the first step (the loaded function itself) and two
    more (the loaded values are trained as the serial model's: nothing half-loaded or unsynchronised).
    And each rank read one box per parameter, exactly its local shard, the boxes of all ranks covering
    every element (hf_worker.py; mistral's MLP width 97 makes FSDP2's shards uneven)."""
    family, kw = LAYOUTS[name]
    run = layout_runs()[name]
    assert run["boxes"] == "one box per parameter, every element held", run["boxes"]
    got = run["losses"]
    want = hf_training_losses(random_hf_model(family), layout_plan(family, kw), STEPS)
    diffs = [abs(a - b) / abs(b) for a, b in zip(got, want)]
    print(f"{name}: loss rel diff per step {', '.join(f'{d:.1e}' for d in diffs)} (first step {got[0]:.6f})")
    assert len(got) == STEPS and max(diffs) <= TOL, (got, want)


# ------------------------------------------------------------------------------------------------ out
def train_and_checkpoint(plan, ckpt: Path, steps: int = 2):
    """Seeded random init, ``steps`` steps, a checkpoint at the last; returns the trained stage model."""
    from runtime.mesh import mesh_of_plan
    from runtime.train.data import TokenSource
    from runtime.trainer import RunOptions, Trainer, run

    trainer = Trainer(plan, mesh_of_plan(plan, torch.device("cpu")),
                      TokenSource(plan.model.vocab_size, plan.training.seq_len, plan.training.seed))
    run(trainer, RunOptions(steps, checkpoint_dir=str(ckpt), checkpoint_every=steps, log_every=0))
    return trainer.parts.models[0]


@pytest.mark.parametrize("family", FAMILIES)
def test_export_round_trip(family, tmp_path, capsys):
    """random init -> 2 steps -> checkpoint -> ``autoplan export-hf`` -> transformers' logits = the runtime's."""
    from transformers import AutoModelForCausalLM

    plan = make_plan(folder_spec(hf_folder(family)), seq_len=SEQ_LEN)
    tokens = torch.randint(0, VOCAB, (2, SEQ_LEN), generator=torch.Generator().manual_seed(3))
    with world_of_one():
        model = train_and_checkpoint(plan, tmp_path / "ckpt")
        with torch.no_grad():
            ours = model.eval()(tokens)[..., :VOCAB]
    sharded = family == "llama"
    extra = ["--max-shard-size", "0.0002"] if sharded else []  # 200 KB: several files and an index
    assert main(["export-hf", str(tmp_path / "ckpt"), str(tmp_path / "out"), *extra]) == 0
    assert "wrote" in capsys.readouterr().out
    assert (tmp_path / "out" / "model.safetensors.index.json").is_file() == sharded
    hf = AutoModelForCausalLM.from_pretrained(tmp_path / "out").eval()
    with torch.no_grad():
        theirs = hf(tokens).logits
    d = rel_diff(theirs, ours)
    print(f"{family}: exported after 2 steps, transformers' logits vs the runtime's: rel diff {d:.2e}")
    assert d <= TOL
    config = json.loads((tmp_path / "out" / "config.json").read_text())
    assert config["model_type"] == family and folder_spec(tmp_path / "out") == dataclasses.replace(
        plan.model, name="out")


def test_export_refuses_and_explains(tmp_path, capsys):
    """Non-empty output without --force, no checkpoint, an old manifest without the model (needs --plan,
    then works), a --plan of another model, a damaged file: one line each, exit 2."""
    from runtime.train.manifest import MARKER, manifest_text, read_manifest

    plan = make_plan("llama-tiny", seq_len=SEQ_LEN)
    with world_of_one():
        train_and_checkpoint(plan, tmp_path / "ckpt", steps=1)
    (tmp_path / "busy").mkdir()
    (tmp_path / "busy" / "x").write_text("x")

    def refused(*argv, needle):
        assert main([str(a) for a in argv]) == 2
        err = capsys.readouterr().err
        assert len(err.strip().splitlines()) == 1 and needle in err, err

    refused("export-hf", tmp_path / "ckpt", tmp_path / "busy", needle="--force")
    refused("export-hf", tmp_path / "nothing", tmp_path / "o", needle="no such folder")
    refused("export-hf", tmp_path / "ckpt", tmp_path / "o", "--step", "5", needle="has steps 1")
    step = tmp_path / "ckpt" / "step_1"
    manifest = read_manifest(step)
    (step / MARKER).write_text(manifest_text(dataclasses.replace(manifest, model=None)))
    refused("export-hf", step, tmp_path / "o", needle="--plan")
    other = tmp_path / "other.yaml"
    other.write_text(dump_plan(make_plan("gpt-tiny", seq_len=SEQ_LEN)))
    refused("export-hf", step, tmp_path / "o", "--plan", other, needle="not the one")
    mine = tmp_path / "mine.yaml"
    mine.write_text(dump_plan(plan))
    assert main(["export-hf", str(step), str(tmp_path / "o"), "--plan", str(mine)]) == 0
    assert main(["export-hf", str(step), str(tmp_path / "busy"), "--plan", str(mine), "--force"]) == 0
    assert (tmp_path / "busy" / "model.safetensors").is_file() and not (tmp_path / "busy" / "x").exists()
    capsys.readouterr()
    shard = next(step.glob("*.distcp"))
    data = shard.read_bytes()
    shard.write_bytes(data[:-1] + bytes([data[-1] ^ 0xFF]))  # same size, one byte changed
    refused("export-hf", step, tmp_path / "o2", "--plan", mine, needle="SHA-256")
    assert not (tmp_path / "o2").exists() and not (tmp_path / "o2.tmp").exists()


def test_resume_wins_over_init_from(tmp_path, capsys):
    from runtime.hf.in_training import folder_to_read

    folder = hf_folder("mistral")
    plan = make_plan(folder_spec(folder), seq_len=SEQ_LEN)
    with world_of_one():
        train_and_checkpoint(plan, tmp_path / "ckpt", steps=1)
        assert folder_to_read(str(folder), str(tmp_path / "ckpt"), resume=True) is None
        assert "checkpoint" in capsys.readouterr().err
        assert folder_to_read(str(folder), str(tmp_path / "empty"), resume=True) == folder
        assert folder_to_read(str(folder), str(tmp_path / "ckpt"), resume=False) == folder


# ------------------------------------------------------------------------------------------ bad input
@pytest.fixture()
def bad_folders(tmp_path):
    """A good folder of the plan's model and broken copies of it."""
    from transformers import AutoModelForCausalLM

    good = hf_folder("llama")
    plan_path = tmp_path / "plan.yaml"
    plan_path.write_text(dump_plan(make_plan(folder_spec(good), seq_len=SEQ_LEN)))
    other = save_hf_folder(AutoModelForCausalLM.from_config(_wider_llama()), tmp_path / "other")
    tensors = {}
    for f in sorted(good.glob("*.safetensors")):
        tensors |= load_file(f)
    folders = {"other": other}
    for name, change in (("missing", lambda t: t.pop("model.layers.1.mlp.up_proj.weight")),
                         ("shape", lambda t: t.__setitem__("model.norm.weight", torch.ones(65)))):
        folder = tmp_path / name
        folder.mkdir()
        (folder / "config.json").write_text((good / "config.json").read_text())
        copy = dict(tensors)
        change(copy)
        save_file(copy, folder / "model.safetensors", metadata={"format": "pt"})
        folders[name] = folder
    return plan_path, folders


def _wider_llama():
    from hf_helpers import family_config

    cfg = family_config("llama")
    cfg.hidden_size, cfg.head_dim = 128, 32
    return cfg


@pytest.mark.parametrize("case,needle", [("nothing", "no such folder"), ("other", "hidden_size 128 in the folder"),
                                         ("missing", "model.layers.1.mlp.up_proj.weight' is missing"),
                                         ("shape", "has shape [65]")])
def test_bad_init_folders_are_one_line_before_any_process(bad_folders, case, needle, capsys, tmp_path):
    plan_path, folders = bad_folders
    folder = folders.get(case, tmp_path / "nothing")
    code = main(["run", str(plan_path), "--init-from", str(folder), "--data", "synthetic", "--print-command"])
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.strip()]
    assert code == 2 and len(lines) == 1 and "--init-from" in lines[0] and needle in lines[0], err


def test_init_from_and_save_hf_reach_every_rank_without_torch(bad_folders, tmp_path):
    """``--print-command`` (and so the torchrun line and the sbatch script) carries both options, and the
    preflight reading the folder imports no torch."""
    plan_path, _ = bad_folders
    code = (f"import sys; from autoplan.cli.main import main; assert main(['run', {str(plan_path)!r}, '--init-from', "
            f"{str(hf_folder('llama'))!r}, '--save-hf', {str(tmp_path / 'hf')!r}, '--data', 'synthetic', "
            "'--print-command']) == 0; assert 'torch' not in sys.modules, 'torch imported'")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr
    assert f"--init-from {hf_folder('llama')}" in proc.stdout and f"--save-hf {tmp_path / 'hf'}" in proc.stdout
    (tmp_path / "hf").mkdir()
    (tmp_path / "hf" / "x").write_text("")
    proc = subprocess.run([sys.executable, "-m", "autoplan.cli.main", "run", str(plan_path), "--save-hf",
                           str(tmp_path / "hf"), "--data", "synthetic", "--print-command"],
                          capture_output=True, text=True, cwd=ROOT)
    assert proc.returncode == 2 and "--save-hf" in proc.stderr and "not empty" in proc.stderr, proc.stderr


# ------------------------------------------------------------------------------------- end to end
@pytest.mark.slow
def test_autoplan_run_init_from_then_save_hf_and_export_hf(tmp_path):
    """``autoplan run`` under tp2 (vocabulary padded to 512) from a gpt2 folder: step 1's loss is
    transformers' loss on that batch; ``--save-hf`` and ``export-hf`` of the same checkpoint write the same
    tensors, and transformers' logits from them are the runtime's logits from the checkpoint."""
    from transformers import AutoModelForCausalLM

    from runtime.train import checkpoint
    from runtime.train.data import TokenSource

    folder = hf_folder("gpt2")
    plan = make_plan(folder_spec(folder), tp=2, seq_len=SEQ_LEN, learning_rate=1e-3)
    plan_path = tmp_path / "plan.yaml"
    plan_path.write_text(dump_plan(plan))
    proc = subprocess.run([sys.executable, "-m", "autoplan.cli.main", "run", str(plan_path), "--steps", "2",
                           "--data", "synthetic", "--init-from", str(folder), "--checkpoint-dir",
                           str(tmp_path / "ckpt"), "--checkpoint-every", "2", "--save-hf", str(tmp_path / "saved"),
                           "--metrics", str(tmp_path / "m.jsonl")],
                          capture_output=True, text=True, cwd=ROOT, timeout=600,
                          env={**__import__("os").environ, "OMP_NUM_THREADS": "1"})
    assert proc.returncode == 0, proc.stderr[-4000:]
    first = json.loads((tmp_path / "m.jsonl").read_text().splitlines()[0])["loss"]
    x, y = TokenSource(VOCAB, SEQ_LEN, plan.training.seed).global_batch(0, plan.training.global_batch_size)
    with torch.no_grad():
        want = torch.nn.functional.cross_entropy(random_hf_model("gpt2")(x).logits.flatten(0, 1), y.flatten()).item()
    print(f"gpt2 tp2 autoplan run --init-from: step 1 loss {first:.6f}, transformers {want:.6f}, "
          f"rel diff {abs(first / want - 1):.1e}")
    assert abs(first / want - 1) <= TOL
    assert main(["export-hf", str(tmp_path / "ckpt"), str(tmp_path / "exported")]) == 0
    saved, exported = load_file(tmp_path / "saved" / "model.safetensors"), load_file(
        tmp_path / "exported" / "model.safetensors")
    assert saved.keys() == exported.keys() and all(torch.equal(saved[k], exported[k]) for k in saved)
    assert saved["transformer.wte.weight"].shape == (VOCAB, 64)  # unpadded from the checkpoint's 512 rows
    serial = make_plan(folder_spec(folder), seq_len=SEQ_LEN)
    tokens = torch.randint(0, VOCAB, (2, SEQ_LEN), generator=torch.Generator().manual_seed(4))
    from runtime.build import build_parts
    from runtime.mesh import mesh_of_plan

    with world_of_one():
        models = build_parts(serial, mesh_of_plan(serial, torch.device("cpu"))).models
        checkpoint.load_weights(tmp_path / "ckpt" / "step_2", models, serial.model)
        with torch.no_grad():
            ours = models[0].eval()(tokens)[..., :VOCAB]
    with torch.no_grad():
        theirs = AutoModelForCausalLM.from_pretrained(tmp_path / "saved").eval()(tokens).logits
    d = rel_diff(theirs, ours)
    print(f"gpt2 tp2 --save-hf after 2 steps: transformers' logits vs the runtime's from the checkpoint: {d:.2e}")
    assert d <= TOL


def test_a_base_model_folder_without_the_causal_lm_prefix_loads(tmp_path):
    """The Hub's original gpt2 was saved from GPT2Model: ``h.0.attn.c_attn.weight``, ``wte.weight``, no
    ``transformer.`` and no lm_head (tied). Such a folder loads as the prefixed one does."""
    folder = hf_folder("gpt2")
    tensors = load_file(folder / "model.safetensors")
    base = tmp_path / "base"
    base.mkdir()
    (base / "config.json").write_text((folder / "config.json").read_text())
    save_file({k.removeprefix("transformer."): v for k, v in tensors.items() if not k.startswith("lm_head")},
              base / "model.safetensors", metadata={"format": "pt"})
    plan = make_plan(folder_spec(folder), seq_len=SEQ_LEN)
    tokens = torch.randint(0, VOCAB, (1, SEQ_LEN), generator=torch.Generator().manual_seed(5))
    assert torch.equal(runtime_logits(plan, base, tokens), runtime_logits(plan, folder, tokens))

