"""The load-balanced causal split of context parallelism (runtime/parallel/context_parallel.py), without
torch.distributed: every token on exactly one rank, every rank the same share of the causal work."""

import pytest
import torch

from runtime.parallel.context_parallel import shard_positions, shard_sequence


@pytest.mark.parametrize(("seq_len", "cp"), [(32, 2), (64, 4), (48, 3)])
def test_head_tail_split_partitions_the_sequence_and_balances_causal_work(seq_len, cp):
    shards = [shard_positions(seq_len, cp, r) for r in range(cp)]
    assert sorted(p for s in shards for p in s) == list(range(seq_len))
    c = seq_len // (2 * cp)
    assert shards[0][:c] == list(range(c)) and shards[0][c:] == list(range(seq_len - c, seq_len))
    # causal pairs a rank's queries attend to: sum of (position + 1); equal on every rank
    work = [sum(p + 1 for p in s) for s in shards]
    assert len(set(work)) == 1 and sum(work) == seq_len * (seq_len + 1) // 2


def test_a_sequence_the_split_cannot_cut_is_refused():
    with pytest.raises(ValueError, match="divisible by 2 \\* cp"):
        shard_positions(30, 4, 0)


def test_shard_sequence_takes_the_ranks_tokens_in_its_order():
    batch = torch.arange(16).reshape(2, 8)
    got = shard_sequence(batch, torch.tensor(shard_positions(8, 2, 1)))
    assert got.tolist() == [[2, 3, 4, 5], [10, 11, 12, 13]]
