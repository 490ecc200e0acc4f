"""Hugging Face weights in and out for Mixture-of-Experts models (issue 31; runtime/hf/).

In: a tiny random Mixtral and Qwen3-MoE (2 layers, hidden 64, 4 experts of width 48, top 2; Qwen3-MoE as
its config class defaults it, norm_topk_prob false, and with a leading dense block and norm_topk_prob
true), saved with ``save_pretrained`` (transformers 5 writes one tensor per expert, as the Hub's folders
hold them), loaded with ``--init-from`` (``build_parts(..., init_from=)``, serially in a world of one)
give the logits ``transformers`` gives within 1e-5 (fp32, CPU). Controls: the same weights with the
experts' gate and up swapped, or the top-k weights renormalised where Qwen3-MoE does not, miss the bound.
Out: the loaded model saved as our checkpoint and exported (``export_checkpoint``) is the folder it came
from, tensor for tensor (``torch.equal``), with a config.json mapping back to the same spec; a model
trained 2 steps and exported with ``autoplan export-hf`` computes the runtime's logits in ``transformers``.
A rank holding experts 2 and 3 opens those experts' tensors only. Refused in one line: Qwen2-MoE (its
sigmoid-gated shared expert) and an MoE model no family computes (moe-tiny: a leading dense block without
Qwen3's q/k norms). Slow: ``autoplan run`` on 2 ranks with the experts split over ep=2, from a Mixtral
folder, trains as ``transformers``' model trained serially, and ``--save-hf`` writes what that model holds.

Tolerance 1e-5: measured 1e-7 to 5e-7 (max |difference| of logits of magnitude ~1.7; the runtime's
attention kernel and its sort-then-loop expert compute sum in another order than transformers' eager
code). A wrong expert, a swapped matrix or another routing rule moves the logits by 1e-3 or more.
"""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from autoplan.cli.main import main
from autoplan.errors import SpecError
from autoplan.schema import check_fits, dump_plan, load_model
from hf_helpers import (MOE_FAMILIES, SEQ_LEN, VOCAB, folder_spec, hf_training_losses, moe_family_config,
                        next_token_loss, random_hf_moe_model, rel_diff, save_hf_folder, saved_once, world_of_one)
from rt_helpers import make_plan
from rt_launcher import ROOT

pytest.importorskip("transformers")

TOL = 1e-5


def moe_folder(name: str) -> Path:
    """The family's tiny random model saved once per session (mixtral in 100 KB shards with an index)."""
    return saved_once(name, random_hf_moe_model, sharded=name == "mixtral")


def loaded_model(plan, folder: Path | None):
    """The serial runtime's model after ``build_parts(..., init_from=folder)`` (a world of one: the caller's)."""
    from runtime.build import build_parts
    from runtime.mesh import mesh_of_plan

    return build_parts(plan, mesh_of_plan(plan, torch.device("cpu")), init_from=folder).models[0].eval()


def tokens_of(seed: int) -> torch.Tensor:
    return torch.randint(0, VOCAB, (2, SEQ_LEN), generator=torch.Generator().manual_seed(seed))


def hf_logits(model, tokens: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        return model(tokens).logits


# ------------------------------------------------------------------------------------------------- in
@pytest.mark.parametrize("name", MOE_FAMILIES)
def test_init_from_gives_transformers_logits(name):
    folder = moe_folder(name)
    if name == "mixtral":
        assert (folder / "model.safetensors.index.json").is_file() and len(list(folder.glob("*.safetensors"))) > 1
    spec = folder_spec(folder)
    assert spec.moe is not None and spec.moe.num_experts == 4 and spec.moe.experts_per_token == 2
    plan = make_plan(spec, seq_len=SEQ_LEN)
    tokens = tokens_of(1)
    with world_of_one():
        with torch.no_grad():
            ours = loaded_model(plan, folder)(tokens)[..., :VOCAB]
    theirs = hf_logits(random_hf_moe_model(name), tokens)
    d_abs, d_rel = (ours - theirs).abs().max().item(), rel_diff(ours, theirs)
    d_loss = abs(next_token_loss(ours, tokens).item() / next_token_loss(theirs, tokens).item() - 1)
    print(f"{name}: max |logit difference| {d_abs:.2e} (relative {d_rel:.2e}, max |logit| "
          f"{theirs.abs().max().item():.2f}), loss rel diff {d_loss:.2e}")
    assert d_abs <= TOL and d_rel <= TOL and d_loss <= TOL


@pytest.mark.parametrize(("name", "change"), [("mixtral", "swap gate and up"),
                                              ("qwen3_moe", "renormalise top-k")])
def test_the_comparison_sees_the_experts_and_the_routing(name, change):
    """Controls: block 0's experts with gate and up swapped, or Qwen3-MoE's unnormalised top-k weights
    renormalised, miss the bound by far: the test above sees each expert matrix and the routing rule."""
    folder = moe_folder(name)
    spec = folder_spec(folder)
    if change == "renormalise top-k":
        spec = dataclasses.replace(spec, moe=dataclasses.replace(spec.moe, normalize_top_k=True))
    plan = make_plan(spec, seq_len=SEQ_LEN)
    tokens = tokens_of(1)
    with world_of_one():
        model = loaded_model(plan, folder)
        if change == "swap gate and up":
            experts = model.blocks["0"].mlp.experts
            with torch.no_grad():
                gate = experts.gate.detach().clone()
                experts.gate.copy_(experts.up)
                experts.up.copy_(gate)
        with torch.no_grad():
            ours = model(tokens)[..., :VOCAB]
    d = (ours - hf_logits(random_hf_moe_model(name), tokens)).abs().max().item()
    print(f"{name} with {change}: max |logit difference| {d:.2e}")
    assert d > 100 * TOL


@pytest.mark.parametrize("name", MOE_FAMILIES)
def test_every_tensor_is_mapped(name):
    """The map names every parameter the runtime builds (canonical names, shapes) and exactly the tensors
    the folder holds, with their shapes: nothing is left unread or read twice."""
    from runtime.hf.files import stored_tensors
    from runtime.hf.names import runtime_shapes, stored_shapes
    from runtime.models import build_model

    folder = moe_folder(name)
    spec = folder_spec(folder)
    built = {n: tuple(p.shape) for n, p in build_model(spec, device="meta", seq_len=SEQ_LEN).named_parameters()}
    assert runtime_shapes(spec, SEQ_LEN) == built
    held = {k: v.shape for k, v in stored_tensors(folder).items()}
    assert stored_shapes(spec, SEQ_LEN) == held


class _Recorder:
    """A stored tensor that records the boxes read from it (safetensors' slice API: ``[slices]``)."""

    def __init__(self, full: torch.Tensor) -> None:
        self.full, self.reads = full, []

    def __getitem__(self, index):
        self.reads.append(index)
        return self.full[index]


def test_a_rank_reads_only_its_experts():
    """Experts split over ep=2 (this rank: experts 2 and 3 of 4) and, within each, rows 8..16 of the
    width (an expert-tensor-parallel shard): only experts 2 and 3's tensors are asked for, each read as
    that one box, and the stack is theirs in order; an index that is not one range keeps its order."""
    from runtime.hf.load import read_parameter
    from runtime.hf.names import source

    spec = folder_spec(moe_folder("mixtral"))
    src = source("blocks.1.mlp.experts.up", spec)
    full = torch.randn(4, 48, 64)
    stored = {f"model.layers.1.block_sparse_moe.experts.{e}.w3.weight": _Recorder(full[e]) for e in range(4)}
    asked = []

    def tensor(key):
        asked.append(key)
        return stored[key]

    got = read_parameter(tensor, src, [torch.tensor([2, 3]), torch.arange(8, 16), torch.arange(64)], None)
    assert asked == [f"model.layers.1.block_sparse_moe.experts.{e}.w3.weight" for e in (2, 3)]
    assert all(stored[k].reads == [(slice(8, 16), slice(0, 64))] for k in asked)
    assert torch.equal(got, full[2:4, 8:16])
    got = read_parameter(tensor, src, [torch.tensor([3, 0]), torch.arange(48), torch.arange(64)], None)
    assert torch.equal(got, full[[3, 0]])


# ------------------------------------------------------------------------------------------------ out
@pytest.mark.parametrize("name", MOE_FAMILIES)
def test_export_of_the_loaded_model_is_the_folder(name, tmp_path):
    """Folder -> ``--init-from`` -> our checkpoint -> export: the same tensor names, every tensor equal
    (the experts unstacked as they were stacked), a config.json mapping back to the same spec, and
    transformers' logits from it equal to the original model's."""
    from transformers import AutoModelForCausalLM

    from runtime.hf.export import export_checkpoint
    from runtime.train import checkpoint

    folder = moe_folder(name)
    plan = make_plan(folder_spec(folder), seq_len=SEQ_LEN)
    with world_of_one():
        saved = checkpoint.save(str(tmp_path / "ckpt"), 0, [loaded_model(plan, folder)], None, plan.model, plan)
    written = export_checkpoint(saved, tmp_path / "out", plan.model)
    assert written == ["model.safetensors", "config.json"]
    original = {}
    for file in folder.glob("*.safetensors"):
        original |= load_file(file)
    exported = load_file(tmp_path / "out" / "model.safetensors")
    assert exported.keys() == original.keys()
    unequal = [k for k in original if not torch.equal(exported[k], original[k])]
    assert not unequal, unequal
    assert folder_spec(tmp_path / "out") == dataclasses.replace(plan.model, name="out")
    config = json.loads((tmp_path / "out" / "config.json").read_text())
    assert config["model_type"] == moe_family_config(name).model_type
    tokens = tokens_of(2)
    reloaded = AutoModelForCausalLM.from_pretrained(tmp_path / "out").eval()
    assert torch.equal(hf_logits(reloaded, tokens), hf_logits(random_hf_moe_model(name), tokens))


def train_and_checkpoint(plan, ckpt: Path, steps: int = 2):
    """Seeded random init, ``steps`` steps, a checkpoint at the last; returns the trained stage model."""
    from runtime.mesh import mesh_of_plan
    from runtime.train.data import TokenSource
    from runtime.trainer import RunOptions, Trainer, run

    trainer = Trainer(plan, mesh_of_plan(plan, torch.device("cpu")),
                      TokenSource(plan.model.vocab_size, plan.training.seq_len, plan.training.seed))
    run(trainer, RunOptions(steps, checkpoint_dir=str(ckpt), checkpoint_every=steps, log_every=0))
    return trainer.parts.models[0]


@pytest.mark.parametrize("name", ["mixtral", "qwen3_moe_dense0"])
def test_trained_model_exported_computes_the_runtimes_logits(name, tmp_path, capsys):
    """random init -> 2 steps -> checkpoint -> ``autoplan export-hf`` (200 KB shards) -> transformers'
    logits = the runtime's."""
    from transformers import AutoModelForCausalLM

    plan = make_plan(folder_spec(moe_folder(name)), seq_len=SEQ_LEN)
    tokens = tokens_of(3)
    with world_of_one():
        model = train_and_checkpoint(plan, tmp_path / "ckpt")
        with torch.no_grad():
            ours = model.eval()(tokens)[..., :VOCAB]
    assert main(["export-hf", str(tmp_path / "ckpt"), str(tmp_path / "out"), "--max-shard-size", "0.0002"]) == 0
    assert "wrote" in capsys.readouterr().out
    assert (tmp_path / "out" / "model.safetensors.index.json").is_file()
    theirs = hf_logits(AutoModelForCausalLM.from_pretrained(tmp_path / "out").eval(), tokens)
    d = (theirs - ours).abs().max().item()
    print(f"{name}: exported after 2 steps, transformers' logits vs the runtime's: max |difference| {d:.2e}")
    assert d <= TOL and rel_diff(theirs, ours) <= TOL


# ---------------------------------------------------------------------------------------------- refused
def test_qwen2_moe_is_refused_in_one_line_naming_its_gate(tmp_path, capsys):
    """Qwen2-MoE's shared expert is scaled by sigmoid(shared_expert_gate x), which the runtime's MoE layer
    does not compute: the mapping refuses it (one line naming the gate), and so does ``autoplan run
    --init-from`` before any process starts."""
    from transformers import AutoModelForCausalLM, Qwen2MoeConfig

    from runtime.hf.files import check_init_folder
    from runtime.hf.names import family

    config = Qwen2MoeConfig(hidden_size=64, intermediate_size=96, moe_intermediate_size=48,
                            shared_expert_intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
                            num_key_value_heads=2, vocab_size=VOCAB, num_experts=4, num_experts_per_tok=2)
    folder = save_hf_folder(AutoModelForCausalLM.from_config(config), tmp_path / "qwen2_moe")
    spec = folder_spec(folder)
    with pytest.raises(SpecError, match="shared_expert_gate") as err:
        family(spec)
    assert "\n" not in str(err.value)
    with pytest.raises(SpecError, match="^--init-from: .*shared_expert_gate"):
        check_init_folder(folder, spec, SEQ_LEN)
    plan_path = tmp_path / "plan.yaml"
    plan_path.write_text(dump_plan(make_plan(spec, seq_len=SEQ_LEN)))
    capsys.readouterr()  # save_pretrained's progress bar
    code = main(["run", str(plan_path), "--init-from", str(folder), "--data", "synthetic", "--print-command"])
    lines = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert code == 2 and len(lines) == 1 and "shared-expert gate" in lines[0], lines


def test_an_moe_model_no_family_computes_is_refused_before_export(tmp_path, capsys):
    """moe-tiny (a leading dense block, no q/k norms: neither Mixtral nor Qwen3-MoE) trains, and its
    export is one line (exit 2) naming the two families, with nothing written; ``--save-hf``'s check
    (files.check_output with the spec) says so before training."""
    from runtime.hf.files import check_output

    plan = make_plan(load_model("moe-tiny"), seq_len=SEQ_LEN)
    with world_of_one():
        train_and_checkpoint(plan, tmp_path / "ckpt", steps=1)
    capsys.readouterr()
    assert main(["export-hf", str(tmp_path / "ckpt"), str(tmp_path / "out")]) == 2
    lines = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert len(lines) == 1 and "mixtral" in lines[0] and "qwen3_moe" in lines[0], lines
    assert not (tmp_path / "out").exists() and not (tmp_path / "out.tmp").exists()
    with pytest.raises(SpecError, match="^--save-hf: moe-tiny: moe: .*mixtral"):
        check_output(tmp_path / "hf", force=False, flag="--save-hf", can_force=False, spec=plan.model)


def test_a_folder_of_fused_experts_is_one_line_saying_how_to_save_it(tmp_path):
    """transformers 5 holds the experts fused in memory (experts.gate_up_proj [E, 2F, H]); a state_dict
    written as is (not through save_pretrained, which writes the Hub's one tensor per expert) is refused
    before any process starts, with the fix."""
    from safetensors.torch import save_file

    from runtime.hf.files import check_init_folder

    good = moe_folder("qwen3_moe")
    fused = tmp_path / "fused"
    fused.mkdir()
    (fused / "config.json").write_text((good / "config.json").read_text())
    state = random_hf_moe_model("qwen3_moe").state_dict()
    assert "model.layers.0.mlp.experts.gate_up_proj" in state
    save_file({k: v.contiguous() for k, v in state.items()}, fused / "model.safetensors", metadata={"format": "pt"})
    missing = "^--init-from: .*experts.0.gate_proj.weight' is missing.*fused.*save_pretrained"
    with pytest.raises(SpecError, match=missing) as err:
        check_init_folder(fused, folder_spec(good), SEQ_LEN)
    assert "\n" not in str(err.value)


# ------------------------------------------------------------------------------------- end to end
EP_STEPS = 2


def ep_plan(folder: Path):
    """dp 2 with the 4 experts split over ep 2 (2 each), ZeRO-1, on 2 ranks (checked as moe_cases.moe_plan
    checks its plans: make_plan knows no ep)."""
    plan = dataclasses.replace(make_plan(folder_spec(folder), dp=2, seq_len=SEQ_LEN, learning_rate=1e-3, zero=1),
                               ep=2)
    check_fits(plan.layout(), plan.model, plan.training, plan.cluster.num_devices)
    return plan


@pytest.mark.slow
def test_autoplan_run_ep2_from_a_mixtral_folder_trains_as_transformers(tmp_path):
    """``autoplan run`` on 2 ranks, experts split over ep=2 (each rank reads its 2 experts' tensors),
    from a Mixtral folder: every step's loss equals transformers' model trained serially with the plan's
    optimizer on the same batches (step 1: the loaded function itself), and ``--save-hf`` writes a folder
    whose logits in transformers are that trained model's."""
    from transformers import AutoModelForCausalLM

    folder = moe_folder("mixtral")
    plan = ep_plan(folder)
    plan_path = tmp_path / "plan.yaml"
    plan_path.write_text(dump_plan(plan))
    proc = subprocess.run([sys.executable, "-m", "autoplan.cli.main", "run", str(plan_path), "--steps", str(EP_STEPS),
                           "--data", "synthetic", "--init-from", str(folder), "--save-hf", str(tmp_path / "saved"),
                           "--metrics", str(tmp_path / "m.jsonl")],
                          capture_output=True, text=True, cwd=ROOT, timeout=600,
                          env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert proc.returncode == 0, proc.stderr[-4000:]
    got = [json.loads(line)["loss"] for line in (tmp_path / "m.jsonl").read_text().splitlines()]
    hf = random_hf_moe_model("mixtral")
    want = hf_training_losses(hf, plan, EP_STEPS)
    diffs = [abs(a / b - 1) for a, b in zip(got, want)]
    print(f"mixtral ep2 dp2 autoplan run --init-from: loss rel diff per step {', '.join(f'{d:.1e}' for d in diffs)} "
          f"(step 1 {got[0]:.6f}, transformers {want[0]:.6f})")
    assert len(got) == EP_STEPS and max(diffs) <= TOL, (got, want)
    tokens = tokens_of(4)
    saved = AutoModelForCausalLM.from_pretrained(tmp_path / "saved").eval()
    d = rel_diff(hf_logits(saved, tokens), hf_logits(hf.eval(), tokens))
    print(f"mixtral ep2 --save-hf after {EP_STEPS} steps vs transformers trained serially: logits rel diff {d:.2e}")
    assert d <= TOL
