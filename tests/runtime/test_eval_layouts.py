"""`autoplan eval` and `autoplan run --eval-every`, multi-process (gloo): the loss is the model's, whatever
the layout.

One training run (pp2 1f1b, 2 ranks, `autoplan run` with --eval-data/--eval-every and a checkpoint every 2
steps) provides trained weights -- far from the uniform initial prediction, so a wrong target alignment,
a lost or double-counted row or token would show -- and its eval_loss rows. Then:

* the serial plan's `autoplan eval` of the step-4 checkpoint equals a direct computation (the reference
  model built with plain PyTorch, the checkpoint's tensors copied in, one cross_entropy over the same 11
  windows in float64) to 1e-6: 11 windows is not a multiple of the batch (4), so padding is exercised;
* `autoplan eval` of the step-2 checkpoint under the training plan equals the eval_loss row of step 2 (the
  same weights, layout and code: to 1e-12);
* every layout -- TP (+SP, loss_parallel), PP with 1F1B, interleaved, ZB-V and DualPipeV, CP, DP with
  ZeRO-1 and ZeRO-3, and TP x PP and DP x TP(+SP) x ZeRO-3 on 4 ranks -- equals the serial evaluation to
  1e-6 (fp32 logits from other summation orders; measured: at most 1e-8, against ~1e-2 for one row lost
  or counted twice), counts 11 x 32 tokens, leaves every module in training mode and every FSDP group
  resharded (ZeRO-1 keeps them gathered otherwise), and gives the same figure again after a training
  step (its own pipeline stages beside the training ones).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from autoplan.schema import dump_plan
from rt_helpers import make_plan
from rt_launcher import HERE, ROOT, torchrun

pytestmark = pytest.mark.slow

DATA = str(ROOT / "examples" / "shakespeare_bytes.bin")
SEQUENCES, SEQ_LEN = 11, 32
TRAINED = dict(pp=2, schedule="1f1b", num_microbatches=4)  # G = 8: 11 windows are a full and a padded batch
LAYOUTS = {
    2: {
        "tp2": dict(tp=2),
        "tp2_sp": dict(tp=2, sp=True),
        "pp2_1f1b": dict(pp=2, schedule="1f1b", num_microbatches=2),
        "pp2_interleaved_v2": dict(pp=2, schedule="interleaved", virtual_stages=2, num_microbatches=4),
        "pp2_zbv": dict(pp=2, schedule="zbv", virtual_stages=2, num_microbatches=2),
        "pp2_dualpipev": dict(pp=2, schedule="dualpipev", virtual_stages=2, num_microbatches=4),
        "cp2": dict(cp=2),
        "dp2_zero1": dict(dp=2, zero=1),
        "dp2_zero3": dict(dp=2, zero=3, micro_batch_size=1),
    },
    4: {
        "tp2_pp2_1f1b": dict(tp=2, pp=2, schedule="1f1b", num_microbatches=2),
        "dp2_tp2_sp_zero3": dict(dp=2, tp=2, sp=True, zero=3),
    },
}


def autoplan(*args: str, timeout_s: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "autoplan.cli.main", *args], capture_output=True, text=True,
                          cwd=ROOT, timeout=timeout_s, env={**os.environ, "OMP_NUM_THREADS": "1"})


def eval_json(plan, checkpoint_dir, step: int) -> dict:
    proc = autoplan("eval", str(plan), "--data", DATA, "--sequences", str(SEQUENCES), "--checkpoint-dir",
                    str(checkpoint_dir), "--step", str(step), "--json")
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = proc.stdout.splitlines()
    assert len(lines) == 1, proc.stdout  # --json: stdout is exactly the one line
    return json.loads(lines[0])


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    folder = tmp_path_factory.mktemp("eval")
    plan = folder / "pp2.yaml"
    plan.write_text(dump_plan(make_plan(**TRAINED)))
    serial = folder / "serial.yaml"
    serial.write_text(dump_plan(make_plan()))
    proc = autoplan("run", str(plan), "--steps", "4", "--data", DATA, "--lr", "0.01", "--warmup-steps", "1",
                    "--eval-data", DATA, "--eval-every", "2", "--eval-sequences", str(SEQUENCES),
                    "--checkpoint-dir", str(folder / "ckpt"), "--checkpoint-every", "2",
                    "--metrics", str(folder / "m.jsonl"))
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = [json.loads(line) for line in (folder / "m.jsonl").read_text().splitlines()]
    return {"folder": folder, "plan": plan, "serial": serial, "ckpt": folder / "ckpt", "rows": rows,
            "stdout": proc.stdout}


@pytest.fixture(scope="module")
def serial_step4(trained) -> dict:
    return eval_json(trained["serial"], trained["ckpt"], 4)


def test_eval_every_rows_equal_autoplan_eval_of_that_steps_checkpoint(trained, serial_step4):
    rows = trained["rows"]
    assert [r["step"] for r in rows if "eval_loss" in r] == [2, 4]  # every 2 steps, the last included
    assert [line.split()[:3] for line in trained["stdout"].splitlines() if line.startswith("eval")] == [
        ["eval", "step", "2"], ["eval", "step", "4"]]
    same_layout = eval_json(trained["plan"], trained["ckpt"], 2)
    assert same_layout["tokens"] == SEQUENCES * SEQ_LEN
    assert same_layout["loss"] == pytest.approx(rows[1]["eval_loss"], abs=1e-12)
    assert serial_step4["loss"] == pytest.approx(rows[3]["eval_loss"], abs=1e-6)  # another layout, same weights
    # trained: the figure moved well away from the uniform prediction over 256 bytes (ln 256 = 5.55)
    assert rows[3]["eval_loss"] < rows[1]["eval_loss"] < 5.0


def direct_loss(checkpoint) -> float:
    """The reference: the whole model in plain PyTorch, the checkpoint's tensors copied in by name, one
    cross_entropy over windows 0..10 of the file read here with numpy."""
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

    from runtime.models import build_model

    plan = make_plan()
    model = build_model(plan.model, seq_len=SEQ_LEN, seed=123)  # other initial values: only the copy can match
    flat = checkpoint.parent / "flat.pt"
    dcp_to_torch_save(str(checkpoint), str(flat))
    stored = torch.load(flat, weights_only=False)["model"]
    with torch.no_grad():
        for name, p in model.named_parameters():  # the tied head is embed.tok.weight, stored once
            p.copy_(stored[name][:p.shape[0]])  # stored vocabulary rows may be padded
    ids = np.fromfile(DATA, dtype="<u2").astype(np.int64)
    rows = torch.from_numpy(np.stack([ids[i * SEQ_LEN:(i + 1) * SEQ_LEN + 1] for i in range(SEQUENCES)]))
    with torch.no_grad():
        logits = model.eval()(rows[:, :-1])
    return float(F.cross_entropy(logits.flatten(0, 1).double(), rows[:, 1:].flatten()))


def test_serial_eval_equals_a_direct_computation(trained, serial_step4):
    assert serial_step4["tokens"] == SEQUENCES * SEQ_LEN
    assert serial_step4["loss"] == pytest.approx(direct_loss(trained["ckpt"] / "step_4"), abs=1e-6)


@pytest.mark.parametrize("world", sorted(LAYOUTS))
def test_every_layout_evaluates_to_the_serial_loss(trained, serial_step4, world):
    jobs = [{"name": name, "plan": kw, "data": DATA, "sequences": SEQUENCES,
             "checkpoint": str(trained["ckpt"] / "step_4")} for name, kw in LAYOUTS[world].items()]
    folder = trained["folder"]
    (folder / f"jobs{world}.json").write_text(json.dumps(jobs))
    proc = torchrun(world, [str(HERE / "eval_worker.py"), str(folder / f"out{world}.json"),
                            str(folder / f"jobs{world}.json")])
    assert proc.returncode == 0, proc.stderr[-4000:]
    results = json.loads((folder / f"out{world}.json").read_text())
    for name, r in results.items():
        assert r["tokens"] == SEQUENCES * SEQ_LEN, name
        assert r["sum"] / r["tokens"] == pytest.approx(serial_step4["loss"], abs=1e-6), name
        assert r["again"] == pytest.approx([r["sum"], r["tokens"]], rel=1e-12), name
        assert r["train_mode"] and r["sharded"], name


@pytest.mark.parametrize("family,layout", [("llama", dict(tp=2)), ("gpt2", dict(pp=2, schedule="zbv", virtual_stages=2,
                                                                                 num_microbatches=2))])
def test_init_from_evaluates_to_transformers_loss(family, layout, tmp_path):
    """`autoplan eval --init-from` of a tiny random Hugging Face model equals transformers' own loss on the
    same windows: llama (GQA, Llama 3.1 RoPE scaling) under tp2 with its 300-token vocabulary padded to 512
    and vocab-sharded logits (loss_parallel), gpt2 (tied head) under a V-shaped pipeline; 5 windows, not a
    multiple of either batch (4). Tolerance: fp32 logits of two implementations (measured: 3e-8)."""
    pytest.importorskip("transformers")
    from hf_helpers import SEQ_LEN as HF_SEQ, VOCAB, random_hf_model, save_hf_folder

    from autoplan.schema.hf_config import spec_from_hf_config

    folder = save_hf_folder(random_hf_model(family), tmp_path / family)
    plan = tmp_path / "plan.yaml"
    plan.write_text(dump_plan(make_plan(spec_from_hf_config(folder / "config.json"), seq_len=HF_SEQ, **layout)))
    count = 5 * HF_SEQ + 1
    ids = torch.randint(0, VOCAB, (count,), generator=torch.Generator().manual_seed(7)).numpy().astype("<u2")
    ids.tofile(tmp_path / "ids.bin")
    (tmp_path / "ids.bin.json").write_text(json.dumps({"dtype": "uint16", "vocab_size": VOCAB, "tokens": count}))
    proc = autoplan("eval", str(plan), "--data", str(tmp_path / "ids.bin"), "--sequences", "5", "--init-from",
                    str(folder), "--json")
    assert proc.returncode == 0, proc.stderr[-3000:]
    got = json.loads(proc.stdout)
    rows = torch.from_numpy(np.stack([ids[i * HF_SEQ:(i + 1) * HF_SEQ + 1] for i in range(5)]).astype(np.int64))
    with torch.no_grad():
        logits = random_hf_model(family)(rows[:, :-1]).logits
    want = float(F.cross_entropy(logits.flatten(0, 1).double(), rows[:, 1:].flatten()))
    print(f"{family} {layout}: autoplan eval --init-from {got['loss']:.9f}, transformers {want:.9f}")
    assert got["tokens"] == 5 * HF_SEQ
    assert got["loss"] == pytest.approx(want, abs=1e-6)
