"""Training batches: seeded synthetic tokens by default, or a token file (``--data``).

Token file format: a flat array of token ids, uint16 little-endian, no header (``.bin``; nanoGPT's
format). ``examples/`` ships raw UTF-8 bytes of a public-domain text in that format (byte-level vocab 256).

Determinism: the global batch of step ``s`` depends only on (seed, s) -- the "data position" in a
checkpoint is just the step -- and is the same for every plan: rows are split contiguously over dp
ranks (rank d takes rows [d*G/dp, (d+1)*G/dp)), then into micro-batches in order. The serial reference
sees the same G rows at once.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from autoplan.errors import SpecError


class TokenSource:
    """Global batches [G, T] of inputs and next-token targets."""

    def __init__(self, vocab_size: int, seq_len: int, seed: int, path: str | None = None) -> None:
        self.vocab_size, self.seq_len, self.seed = vocab_size, seq_len, seed
        self.tokens = None
        if path is not None:
            self.tokens = load_tokens(path, vocab_size, seq_len)

    def global_batch(self, step: int, batch_size: int) -> tuple[torch.Tensor, torch.Tensor]:
        gen = torch.Generator().manual_seed(self.seed * 1_000_003 + step)
        t = self.seq_len
        if self.tokens is None:
            rows = torch.randint(0, self.vocab_size, (batch_size, t + 1), generator=gen)
        else:
            starts = torch.randint(0, len(self.tokens) - t - 1 + 1, (batch_size,), generator=gen).tolist()
            rows = torch.stack([torch.from_numpy(self.tokens[s:s + t + 1].astype(np.int64)) for s in starts])
        return rows[:, :-1].contiguous(), rows[:, 1:].contiguous()  # x, y: [G, T] int64

    def replica_batch(self, step: int, batch_size: int, dp: int, dp_rank: int) -> tuple[torch.Tensor, torch.Tensor]:
        """This dp rank's rows of the global batch."""
        x, y = self.global_batch(step, batch_size)
        per = batch_size // dp
        rows = slice(dp_rank * per, (dp_rank + 1) * per)
        return x[rows], y[rows]


def load_tokens(path: str, vocab_size: int, seq_len: int) -> np.ndarray:
    p = Path(path)
    if not p.is_file():
        raise SpecError(f"--data: {path}: no such file (expected uint16 little-endian token ids)")
    if p.stat().st_size % 2:
        raise SpecError(f"--data: {path}: odd byte count; expected uint16 little-endian token ids")
    tokens = np.memmap(p, dtype="<u2", mode="r")
    if len(tokens) < seq_len + 2:
        raise SpecError(f"--data: {path}: {len(tokens)} tokens, need at least seq_len + 2 = {seq_len + 2}")
    top = int(tokens.max())
    if top >= vocab_size:
        raise SpecError(f"--data: {path}: token id {top} >= model.vocab_size {vocab_size}")
    return tokens

