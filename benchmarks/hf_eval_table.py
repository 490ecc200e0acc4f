"""``autoplan eval --init-from`` against ``transformers`` on the same windows, per family and plan (issue 29).

    python benchmarks/hf_eval_table.py [--sequences N] [--json]

For each Hugging Face family the runtime builds (Llama-3.1 with rope_scaling, Mistral, Qwen2, Qwen3, GPT-2),
a tiny random model is made with ``transformers`` (``from_config``, ``save_pretrained``, fp32) and a token
file of random ids; then for each plan (one device; tp2 pp2 on 4 gloo ranks; for Qwen3 also cp2 and dp2
ZeRO-3) ``autoplan plan config.json ... -o`` and ``autoplan eval PLAN --init-from DIR --data FILE
--sequences N --json`` give the mean next-token loss over the first N windows in order (window i = tokens
[i*s, (i+1)*s + 1)), and ``transformers`` computes the same mean on the same windows. Prints one row per
(family, plan) with the relative difference; exit status 1 if any exceeds 1e-5.

Each ``autoplan eval`` is one torchrun launch (4-17 s of start-up on 2 cores), so the table takes minutes.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
ENV = {**os.environ, "OMP_NUM_THREADS": "1",
       "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
SEQ_LEN, VOCAB, TOLERANCE = 32, 300, 1e-5
TINY = dict(hidden_size=64, intermediate_size=160, num_hidden_layers=4, num_attention_heads=4, vocab_size=VOCAB,
            max_position_embeddings=128)
FAMILIES = {
    "llama-3.1": ("LlamaConfig", dict(TINY, num_key_value_heads=2, rope_theta=500000.0, rope_scaling={
        "rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
        "original_max_position_embeddings": 16})),
    "mistral": ("MistralConfig", dict(TINY, num_key_value_heads=2, sliding_window=128)),
    "qwen2": ("Qwen2Config", dict(TINY, num_key_value_heads=2, tie_word_embeddings=True)),
    "qwen3": ("Qwen3Config", dict(TINY, num_key_value_heads=2, head_dim=32)),
    "gpt2": ("GPT2Config", dict(n_embd=64, n_layer=4, n_head=4, vocab_size=VOCAB, n_positions=128,
                                resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)),
}
PLANS = {  # label -> (devices, autoplan plan pins)
    "serial": (1, ["--tp", "1", "--pp", "1", "--dp", "1"]),
    "tp2 pp2": (4, ["--tp", "2", "--pp", "2", "--dp", "1", "--schedule", "1f1b"]),
}
EXTRA = {"qwen3": {"cp2 dp2": (4, ["--tp", "1", "--pp", "1", "--cp", "2", "--dp", "2", "--zero-stage", "1"]),
                   "dp2 zero3 tp2": (4, ["--tp", "2", "--pp", "1", "--dp", "2", "--zero-stage", "3"])}}


def make_model(folder: Path, family: str) -> None:
    import torch
    import transformers

    cls, kwargs = FAMILIES[family]
    torch.manual_seed(0)
    config = getattr(transformers, cls)(**kwargs)
    model = transformers.AutoModelForCausalLM.from_config(config, torch_dtype=torch.float32)
    model.save_pretrained(folder, safe_serialization=True)


def make_tokens(path: Path, count: int, seed: int = 0) -> None:
    """``count`` random ids below VOCAB as a uint16 token file with its sidecar."""
    import numpy as np

    ids = np.random.default_rng(seed).integers(0, VOCAB, size=count, dtype=np.uint16)
    path.write_bytes(ids.tobytes())
    Path(f"{path}.json").write_text(json.dumps({"dtype": "uint16", "vocab_size": VOCAB, "tokens": count}))


def transformers_loss(folder: Path, tokens: Path, sequences: int) -> float:
    import numpy as np
    import torch
    import torch.nn.functional as F
    import transformers

    ids = torch.from_numpy(np.fromfile(tokens, dtype=np.uint16).astype(np.int64))
    windows = torch.stack([ids[i * SEQ_LEN:(i + 1) * SEQ_LEN + 1] for i in range(sequences)])
    model = transformers.AutoModelForCausalLM.from_pretrained(folder, torch_dtype=torch.float32).eval()
    with torch.no_grad():
        logits = model(input_ids=windows[:, :-1]).logits
    return float(F.cross_entropy(logits.flatten(0, 1).double(), windows[:, 1:].flatten()))


def autoplan(*argv: str) -> str:
    done = subprocess.run([sys.executable, "-m", "autoplan.cli.main", *argv], env=ENV, cwd=ROOT,
                          capture_output=True, text=True, timeout=900)
    if done.returncode != 0:
        raise SystemExit(f"autoplan {' '.join(argv)} failed ({done.returncode}): {done.stderr.strip()[-2000:]}")
    return done.stdout


def eval_loss(folder: Path, tokens: Path, plan: Path, devices: int, pins: list[str], sequences: int) -> float:
    autoplan("plan", str(folder / "config.json"), "--cluster", "cpu-local", "--devices-per-node", str(devices),
             "--global-batch-size", "4", "--seq-len", str(SEQ_LEN), "--precision", "fp32", *pins, "-o", str(plan))
    out = autoplan("eval", str(plan), "--init-from", str(folder), "--data", str(tokens),
                   "--sequences", str(sequences), "--json")
    return float(json.loads(out.strip().splitlines()[-1])["loss"])


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--sequences", type=int, default=6, help="windows evaluated (default 6: not a whole batch)")
    p.add_argument("--json", action="store_true")
    args = p.parse_args(argv)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        tokens = root / "tokens.bin"
        make_tokens(tokens, (args.sequences + 2) * (SEQ_LEN + 1))
        for family in FAMILIES:
            folder = root / family
            make_model(folder, family)
            reference = transformers_loss(folder, tokens, args.sequences)
            for label, (devices, pins) in {**PLANS, **EXTRA.get(family, {})}.items():
                loss = eval_loss(folder, tokens, root / f"{family}-{label.replace(' ', '_')}.yaml", devices, pins,
                                 args.sequences)
                rows.append({"family": family, "plan": label, "devices": devices, "transformers": reference,
                             "autoplan_eval": loss, "rel_diff": abs(loss - reference) / abs(reference)})
                print(f"{family:10s} {label:14s} {loss:.8f} vs {reference:.8f}", file=sys.stderr, flush=True)
    if args.json:
        print(json.dumps(rows, indent=1))
    else:
        print("| family | plan | devices | transformers loss | autoplan eval loss | relative difference |")
        print("|---|---|---:|---:|---:|---:|")
        for r in rows:
            print(f"| {r['family']} | {r['plan']} | {r['devices']} | {r['transformers']:.8f} | "
                  f"{r['autoplan_eval']:.8f} | {r['rel_diff']:.2e} |")
    return 0 if all(r["rel_diff"] <= TOLERANCE for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
