"""A Hugging Face folder in, trained under tp2 pp2, and out again (issue 29's round trip).

    python benchmarks/hf_round_trip.py [--steps 10]

A tiny random Qwen2-style model (q/k/v biases, tied embedding) is made with ``transformers`` and saved;
``autoplan plan`` gives a tp2 pp2 1f1b plan for 4 gloo ranks; ``autoplan run --init-from`` trains it
``--steps`` steps with a checkpoint at the end; ``autoplan export-hf`` writes the checkpoint as a
``transformers`` folder; then the mean next-token loss over the first N windows of a held-out token file is
computed three ways: ``transformers`` on the exported folder, ``autoplan eval`` on the final checkpoint
under the same plan, and ``autoplan eval --init-from`` the exported folder. Prints the three and their
relative differences (goal <= 1e-5), and the loss of the untrained folder (the run must have moved it).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from hf_eval_table import SEQ_LEN, VOCAB, autoplan, make_tokens, transformers_loss  # noqa: E402

QWEN2 = dict(hidden_size=64, intermediate_size=160, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2,
             vocab_size=VOCAB, max_position_embeddings=128, tie_word_embeddings=True)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--sequences", type=int, default=6)
    args = p.parse_args(argv)
    import torch
    import transformers

    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        start, out, ckpt = root / "qwen2-start", root / "qwen2-trained", root / "ckpt"
        torch.manual_seed(0)
        transformers.AutoModelForCausalLM.from_config(transformers.Qwen2Config(**QWEN2)).save_pretrained(start)
        train, held_out = root / "train.bin", root / "val.bin"
        make_tokens(train, 4096, seed=1)
        make_tokens(held_out, (args.sequences + 1) * (SEQ_LEN + 1), seed=2)
        plan = root / "plan.yaml"
        autoplan("plan", str(start / "config.json"), "--cluster", "cpu-local", "--devices-per-node", "4",
                 "--global-batch-size", "8", "--seq-len", str(SEQ_LEN), "--precision", "fp32", "--tp", "2", "--pp", "2",
                 "--dp", "1", "--schedule", "1f1b", "-o", str(plan))
        autoplan("run", str(plan), "--init-from", str(start), "--data", str(train), "--steps", str(args.steps),
                 "--lr", "3e-3", "--warmup-steps", "2", "--checkpoint-dir", str(ckpt),
                 "--checkpoint-every", str(args.steps))
        autoplan("export-hf", str(ckpt), str(out))
        evaluate = ["--data", str(held_out), "--sequences", str(args.sequences), "--json"]
        from_checkpoint = json.loads(autoplan("eval", str(plan), "--checkpoint-dir", str(ckpt), *evaluate)
                                     .strip().splitlines()[-1])["loss"]
        from_export = json.loads(autoplan("eval", str(plan), "--init-from", str(out), *evaluate)
                                 .strip().splitlines()[-1])["loss"]
        reference = transformers_loss(out, held_out, args.sequences)
        untrained = transformers_loss(start, held_out, args.sequences)
    rows = [("transformers on the exported folder", reference),
            ("autoplan eval --checkpoint-dir (tp2 pp2)", from_checkpoint),
            ("autoplan eval --init-from the export (tp2 pp2)", from_export)]
    print(f"qwen2-style tiny model, tp2 pp2 1f1b on 4 gloo ranks, {args.steps} steps; loss over {args.sequences} "
          f"held-out windows of {SEQ_LEN} tokens (untrained: {untrained:.8f})")
    print("| loss from | value | relative difference to transformers |")
    print("|---|---:|---:|")
    worst = 0.0
    for label, value in rows:
        diff = abs(value - reference) / abs(reference)
        worst = max(worst, diff)
        print(f"| {label} | {value:.8f} | {diff:.2e} |")
    moved = abs(untrained - reference) / abs(reference)
    print(f"training moved the held-out loss by {moved:.1%}")
    return 0 if worst <= 1e-5 and moved > 1e-3 else 1


if __name__ == "__main__":
    sys.exit(main())
