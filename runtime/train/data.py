"""Training batches: seeded synthetic tokens by default, or a token file (``--data``).

Token files: a flat little-endian uint16 or uint32 array of ids with a JSON sidecar ``FILE.json``
(autoplan/schema/token_file.py says the format and the rule for files without one; ``autoplan
prepare-data`` makes both). The file is memory-mapped and never scanned whole: ``describe`` probes its
first ids, and every batch's largest id is checked against the vocabulary as it is read (a max over
G x T ids), so a file from another tokenizer stops the run in one line instead of indexing past the
embedding table.

Sampling: the file is cut into n windows of T + 1 ids, window i = ids [i*T, (i+1)*T + 1) (inputs and
their next-token targets; neighbours share one id). An epoch visits every window once, in an order that
is a permutation of the window indices keyed by (seed, epoch); global row j of step s is the window at
position k mod n of epoch k div n, for k = s*G + j. So, as before, the global batch of step s is a pure
function of (seed, s, G): a resumed run sees exactly the windows it would have seen (the checkpoint
holds the step), and every plan sees the same global batch. Rows are split contiguously over dp ranks
(rank d takes rows [d*G/dp, (d+1)*G/dp)), then into micro-batches in order; each rank reads only its
own rows. The serial reference (``global_batch``) sees the same G rows at once.

The permutation is not stored: ``WindowOrder`` computes position -> window with a keyed Feistel network
on the next power of four above n, cycle-walking values >= n back into range (a bijection on [0, n)).
Memory is O(rows per batch) for any n (a stored numpy permutation of 10^8 windows would be 800 MB per
rank, rebuilt at each epoch), and the order depends only on 64-bit integer arithmetic written here, not
on a library's random stream, so a resume under another numpy version sees the same windows.

Synthetic tokens (no file): rows drawn from torch's generator seeded by (seed, step), unchanged.
"""

from __future__ import annotations

import numpy as np
import torch

from autoplan.errors import SpecError
from autoplan.schema.token_file import describe, sidecar_path, windows

_M64 = (1 << 64) - 1
_ROUNDS = 4
"""Feistel rounds: with a strong round function (splitmix64's finaliser) 4 give a pseudo-random permutation."""


def _splitmix(x: int) -> int:
    """splitmix64's finaliser on a Python int: round keys from (seed, epoch, round)."""
    x = (x + 0x9E3779B97F4A7C15) & _M64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _M64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _M64
    return x ^ (x >> 31)


def _mix(x: np.ndarray) -> np.ndarray:
    """The same finaliser on a uint64 array (numpy's uint64 products wrap, as the hash wants)."""
    x = x ^ (x >> np.uint64(30))
    x = x * np.uint64(0xBF58476D1CE4E5B9)
    x = x ^ (x >> np.uint64(27))
    x = x * np.uint64(0x94D049BB133111EB)
    return x ^ (x >> np.uint64(31))


class WindowOrder:
    """Position k of the endless stream of epochs -> window index: epoch k div n visits all n windows, in
    a permutation keyed by (seed, epoch)."""

    def __init__(self, n: int, seed: int) -> None:
        if n < 1:
            raise ValueError("no windows")
        self.n, self.seed = n, seed
        self.half = max(1, ((n - 1).bit_length() + 1) // 2)  # 4**half >= n: at most 4 steps per walk on average
        self._mask = np.uint64((1 << self.half) - 1)

    def _keys(self, epoch: int) -> list[np.uint64]:
        base = _splitmix(_splitmix(self.seed & _M64) ^ epoch)
        return [np.uint64(_splitmix(base ^ r)) for r in range(_ROUNDS)]

    def _feistel(self, x: np.ndarray, keys: list[np.uint64]) -> np.ndarray:
        h, m = np.uint64(self.half), self._mask
        left, right = x >> h, x & m
        for key in keys:
            left, right = right, left ^ (_mix(right ^ key) & m)
        return (left << h) | right

    def permute(self, positions: np.ndarray, epoch: int) -> np.ndarray:
        """The windows at ``positions`` (each in [0, n)) of ``epoch``'s order."""
        keys = self._keys(epoch)
        out = self._feistel(positions.astype(np.uint64), keys)
        bad = np.flatnonzero(out >= self.n)
        while bad.size:  # cycle-walking: follow the permutation of [0, 4**half) until it lands below n
            out[bad] = self._feistel(out[bad], keys)
            bad = bad[out[bad] >= self.n]
        return out.astype(np.int64)

    def __call__(self, k: np.ndarray) -> np.ndarray:
        epoch, pos = np.divmod(k, self.n)
        out = np.empty_like(k)
        for e in np.unique(epoch):  # one or two epochs per batch unless G > n
            where = epoch == e
            out[where] = self.permute(pos[where], int(e))
        return out


class TokenSource:
    """Global batches [G, T] of inputs and next-token targets, or one dp rank's rows of them."""

    def __init__(self, vocab_size: int, seq_len: int, seed: int, path: str | None = None) -> None:
        self.vocab_size, self.seq_len, self.seed, self.path = vocab_size, seq_len, seed, path
        self.tokens: np.ndarray | None = None
        self.order: WindowOrder | None = None
        if path is not None:
            info = describe(path, vocab_size, seq_len)  # one SpecError line on every rank if it cannot train
            self.tokens = np.memmap(path, dtype=info.numpy_dtype, mode="r", shape=(info.tokens,))
            self.order = WindowOrder(windows(info.tokens, seq_len), seed)

    @property
    def num_windows(self) -> int | None:
        """Windows per epoch (None: synthetic tokens)."""
        return None if self.order is None else self.order.n

    def window_ids(self, step: int, batch_size: int, first: int, count: int) -> np.ndarray:
        """The windows of rows [first, first + count) of step ``step``'s global batch of ``batch_size``."""
        k = step * batch_size + np.arange(first, first + count, dtype=np.int64)
        return self.order(k)

    def _file_rows(self, step: int, batch_size: int, first: int, count: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.rows(self.window_ids(step, batch_size, first, count))

    def rows(self, wins: np.ndarray) -> tuple[torch.Tensor, torch.Tensor]:
        """Inputs and next-token targets, int64 [len(wins), T] each, of the file's windows ``wins`` (in that
        order; evaluation reads windows 0, 1, 2 ... through here, training its shuffled ones)."""
        t, count = self.seq_len, len(wins)
        rows = np.empty((count, t + 1), dtype=self.tokens.dtype)
        for i, w in enumerate(wins.tolist()):  # one contiguous read per row from the memory map
            rows[i] = self.tokens[w * t:w * t + t + 1]
        top = int(rows.max()) if count else 0
        if top >= self.vocab_size:
            bad = int(wins[int(np.argmax(rows.max(axis=1)))])
            raise SpecError(f"--data {self.path}: token id {top} >= model.vocab_size {self.vocab_size} in ids "
                            f"{bad * t:,}..{bad * t + t:,}; the file was made with another tokenizer, or "
                            f"{sidecar_path(self.path)} does not describe it")
        both = torch.from_numpy(rows.astype(np.int64))
        return both[:, :-1].contiguous(), both[:, 1:].contiguous()

    def _synthetic(self, step: int, batch_size: int) -> torch.Tensor:
        gen = torch.Generator().manual_seed(self.seed * 1_000_003 + step)
        return torch.randint(0, self.vocab_size, (batch_size, self.seq_len + 1), generator=gen)

    def global_batch(self, step: int, batch_size: int) -> tuple[torch.Tensor, torch.Tensor]:
        """All G rows of step ``step``: x, y int64 [G, T] (the serial reference's view)."""
        if self.tokens is not None:
            return self._file_rows(step, batch_size, 0, batch_size)
        rows = self._synthetic(step, batch_size)
        return rows[:, :-1].contiguous(), rows[:, 1:].contiguous()

    def replica_batch(self, step: int, batch_size: int, dp: int, dp_rank: int) -> tuple[torch.Tensor, torch.Tensor]:
        """This dp rank's rows of the global batch; from a file only those rows are read."""
        per = batch_size // dp
        if self.tokens is not None:
            return self._file_rows(step, batch_size, dp_rank * per, per)
        x, y = self.global_batch(step, batch_size)  # torch's generator cannot skip ahead to a row
        rows = slice(dp_rank * per, (dp_rank + 1) * per)
        return x[rows], y[rows]
