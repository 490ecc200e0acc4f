"""Tokenise shakespeare.txt into the runtime's token-file format: raw UTF-8 bytes as uint16 little-endian,
with the sidecar that describes it (shakespeare_bytes.bin.json: dtype, vocab_size 256, tokens).

The text: the opening scene of Shakespeare's Coriolanus (public domain), as in the tinyshakespeare corpus
(github.com/karpathy/char-rnn, data/tinyshakespeare/input.txt). The tiny models have a byte-level
vocabulary of 256, so a byte is a token. Run: python examples/make_tokens.py
"""

from pathlib import Path

import numpy as np

from autoplan.schema.token_file import TokenFileInfo, write_sidecar

HERE = Path(__file__).resolve().parent

if __name__ == "__main__":
    text = (HERE / "shakespeare.txt").read_text(encoding="utf-8")
    tokens = np.frombuffer(text.encode("utf-8"), dtype=np.uint8).astype("<u2")
    (HERE / "shakespeare_bytes.bin").write_bytes(tokens.tobytes())
    write_sidecar(HERE / "shakespeare_bytes.bin", TokenFileInfo("uint16", 256, len(tokens), tokenizer="UTF-8 bytes"))
    print(f"{len(tokens)} tokens -> shakespeare_bytes.bin (+ .json)")
