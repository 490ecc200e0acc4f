"""How the runtime samples a token file: epochs of shuffled windows without replacement, the batch of a
step a pure function of (seed, step, G) whatever the dp split, each rank reading only its rows, uint32
ids read as uint32, and an id beyond the vocabulary stopping the run in one line. One process, no
torch.distributed."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from autoplan.errors import SpecError
from autoplan.launcher.preflight import SAMPLE_TEXT
from autoplan.schema.token_file import HEAD_TOKENS
from runtime.train.data import TokenSource, WindowOrder

T = 8
N_WINDOWS = 397  # not a multiple of G: batches straddle epochs
OFFSET = 70_000  # ids above uint16's range
G = 8


@pytest.fixture(scope="module")
def ids_file(tmp_path_factory):
    """uint32 ids OFFSET + i at position i (so a row names its window), with a sidecar; 5 spare ids at
    the end that no window covers."""
    path = tmp_path_factory.mktemp("tokens") / "ids.bin"
    count = N_WINDOWS * T + 1 + 5
    (OFFSET + np.arange(count)).astype("<u4").tofile(path)
    (path.parent / "ids.bin.json").write_text(json.dumps({"dtype": "uint32", "vocab_size": 80_000, "tokens": count}))
    return path


def windows_of(x: torch.Tensor) -> list[int]:
    return ((x[:, 0] - OFFSET) // T).tolist()


def test_rows_are_whole_windows_of_uint32_ids(ids_file):
    source = TokenSource(100_000, T, seed=3, path=str(ids_file))
    assert source.num_windows == N_WINDOWS
    x, y = source.global_batch(0, G)
    assert x.dtype == torch.int64 and x.shape == (G, T) and int(x.min()) >= OFFSET  # not split into uint16 halves
    for row_x, row_y, w in zip(x, y, windows_of(x)):
        start = OFFSET + w * T
        assert row_x.tolist() == list(range(start, start + T))  # window w = ids [w*T, (w+1)*T + 1)
        assert row_y.tolist() == list(range(start + 1, start + T + 1))  # next-token targets


def test_an_epoch_visits_every_window_once_in_a_shuffled_order(ids_file):
    source = TokenSource(100_000, T, seed=3, path=str(ids_file))
    stream = []
    for step in range(2 * N_WINDOWS // G + 1):
        stream += windows_of(source.global_batch(step, G)[0])
    first, second = stream[:N_WINDOWS], stream[N_WINDOWS:2 * N_WINDOWS]
    assert sorted(first) == list(range(N_WINDOWS)) and sorted(second) == list(range(N_WINDOWS))
    assert first != sorted(first)  # shuffled
    assert first != second  # each epoch its own order
    assert sum(a == b for a, b in zip(first, second)) < N_WINDOWS // 10


def test_the_order_is_a_permutation_for_any_number_of_windows():
    for n in (1, 2, 3, 4, 5, 15, 16, 17, 1000, 4097):
        order = WindowOrder(n, seed=11)
        for epoch in range(3):
            assert sorted(order.permute(np.arange(n), epoch).tolist()) == list(range(n))


@pytest.mark.parametrize("synthetic", [False, True])
def test_replica_rows_concatenate_to_the_global_batch_for_every_dp(ids_file, synthetic):
    """The rows of step s do not depend on dp: the serial reference (global_batch) and every plan see
    the same batch."""
    source = TokenSource(100_000, T, seed=5, path=None if synthetic else str(ids_file))
    for step in (0, 1, 49, 50, 123):  # 49 and 50 straddle the end of the first epoch (397 windows)
        x, y = source.global_batch(step, G)
        for dp in (1, 2, 4):
            parts = [source.replica_batch(step, G, dp, r) for r in range(dp)]
            assert torch.equal(torch.cat([p[0] for p in parts]), x)
            assert torch.equal(torch.cat([p[1] for p in parts]), y)


def test_a_rank_reads_only_its_own_rows(ids_file):
    source = TokenSource(100_000, T, seed=5, path=str(ids_file))
    reads = []

    class Recording:
        dtype = source.tokens.dtype

        def __getitem__(self, key):
            reads.append(key)
            return source_tokens[key]

    source_tokens, source.tokens = source.tokens, Recording()
    x, _ = source.replica_batch(7, 64, 4, 2)
    assert len(reads) == 64 // 4 and x.shape == (16, T)


def test_the_batch_of_a_step_depends_only_on_seed_and_step(ids_file):
    """A resumed run (the checkpoint holds the step) sees the windows it would have seen."""
    trained = TokenSource(100_000, T, seed=9, path=str(ids_file))
    for step in range(12):
        trained.global_batch(step, G)
    resumed = TokenSource(100_000, T, seed=9, path=str(ids_file))
    assert torch.equal(trained.global_batch(11, G)[0], resumed.global_batch(11, G)[0])
    other = TokenSource(100_000, T, seed=10, path=str(ids_file))
    assert not torch.equal(other.global_batch(11, G)[0], resumed.global_batch(11, G)[0])


def test_an_id_beyond_the_vocabulary_stops_the_batch_in_one_line(tmp_path):
    """Past the ids describe() probes at start, the per-batch check finds it (here: window 255 of 256)."""
    seq = 4096
    ids = np.zeros(HEAD_TOKENS + 100, dtype="<u2")
    ids[HEAD_TOKENS] = 999
    path = tmp_path / "late.bin"
    ids.tofile(path)
    source = TokenSource(256, seq, seed=0, path=str(path))
    assert source.num_windows == 256
    with pytest.raises(SpecError) as err:
        for step in range(256 // 4):
            source.replica_batch(step, 8, 2, 0)
            source.replica_batch(step, 8, 2, 1)
    text = str(err.value)
    assert "\n" not in text and text.startswith(f"--data {path}: token id 999 >= model.vocab_size 256"), text
    assert "late.bin.json" in text  # the fix names the sidecar


def test_the_shipped_sample_reads_as_bytes_of_its_text():
    source = TokenSource(256, 32, seed=0, path=str(SAMPLE_TEXT))
    text = (SAMPLE_TEXT.parent / "shakespeare.txt").read_bytes()
    x, _ = source.global_batch(0, 4)
    for row in x.tolist():
        assert bytes(row) in text
