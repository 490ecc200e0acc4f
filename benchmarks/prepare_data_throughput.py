"""``autoplan prepare-data`` on a generated corpus, with two tokenizers made here: a byte-level BPE of 32,000
tokens trained by the ``tokenizers`` library on the corpus (uint16 output) and a word-level tokenizer of
128,256 tokens, Llama 3's vocabulary size, whose ids above 65,535 do occur (uint32 output). Prints the
wall time and throughput of each, and the line ``autoplan run`` prints when a file's vocabulary does not
fit the plan's model.

    python benchmarks/prepare_data_throughput.py [--mb 50] [--keep DIR]

The corpus: documents of words drawn from a Zipf law over 128,000 made-up words (so both tokenizers see
many distinct tokens), one JSON object per line.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
WORDS = 128_000


def corpus(path: Path, megabytes: float, seed: int = 0) -> int:
    """Write about ``megabytes`` of JSONL documents; returns the number of documents."""
    rng = np.random.default_rng(seed)
    letters = np.array(list("abcdefghijklmnopqrstuvwxyz"))
    words = ["".join(rng.choice(letters, size=rng.integers(2, 9))) + str(i % 7) for i in range(WORDS)]
    target, written, docs = megabytes * 2**20, 0, 0
    with path.open("w") as f:
        while written < target:
            ids = np.minimum(rng.zipf(1.2, size=int(rng.integers(50, 400))) - 1, WORDS - 1)
            line = json.dumps({"text": " ".join(words[i] for i in ids)}) + "\n"
            f.write(line)
            written += len(line)
            docs += 1
    return docs


def tokenizers_for(corpus_path: Path, folder: Path) -> dict[str, Path]:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    def texts():
        with corpus_path.open() as f:
            for line in f:
                yield json.loads(line)["text"]

    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=32_000, special_tokens=["<|endoftext|>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    t0 = time.perf_counter()
    bpe.train_from_iterator(texts(), trainer)
    print(f"trained the 32,000-token BPE in {time.perf_counter() - t0:.1f} s", flush=True)
    vocab: dict[str, int] = {"<|endoftext|>": 0, "[UNK]": 1}
    with corpus_path.open() as f:
        for line in f:
            for w in json.loads(line)["text"].split():
                if w not in vocab:
                    vocab[w] = len(vocab)
    for i in range(len(vocab), 128_256):  # fill up to Llama 3's size
        vocab[f"<filler_{i}>"] = i
    words = Tokenizer(models.WordLevel(vocab=vocab, unk_token="[UNK]"))
    words.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    out = {"bpe-32000": folder / "bpe32k.json", "words-128256": folder / "words128k.json"}
    bpe.save(str(out["bpe-32000"]))
    words.save(str(out["words-128256"]))
    return out


def autoplan(*args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run([sys.executable, "-m", "autoplan.cli.main", *args], capture_output=True, text=True, env=env)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--mb", type=float, default=50.0, help="corpus size in MB (default 50)")
    ap.add_argument("--keep", help="write everything into this folder and keep it")
    args = ap.parse_args()
    folder = Path(args.keep or tempfile.mkdtemp(prefix="prepare-data-"))
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "corpus.jsonl"
    docs = corpus(path, args.mb)
    size_mb = path.stat().st_size / 2**20
    print(f"corpus: {docs:,} documents, {size_mb:.1f} MB ({path})", flush=True)
    for name, tok in tokenizers_for(path, folder).items():
        out = folder / f"{name}.bin"
        t0 = time.perf_counter()
        proc = autoplan("prepare-data", str(path), "--tokenizer", str(tok), "-o", str(out), "--val-fraction", "0.01")
        wall = time.perf_counter() - t0
        if proc.returncode != 0:
            print(proc.stderr.strip().splitlines()[-1])
            return 1
        side = json.loads(Path(f"{out}.json").read_text())
        ids = np.memmap(out, dtype="<u2" if side["dtype"] == "uint16" else "<u4", mode="r")
        print(f"{name}: {side['tokens']:,} tokens ({side['dtype']}, largest id {int(ids.max()):,}) in {wall:.1f} s "
              f"(interpreter start included): {side['tokens'] / wall:,.0f} tokens/s, {size_mb / wall:.1f} MB/s; "
              f"autoplan's summary: {proc.stdout.strip().splitlines()[-1]}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
