"""Batch-sampler sharding, skipping and seedable shuffling, every rank simulated in one process."""

import itertools
import pickle

import pytest
import torch
from data_helpers import VariableBatches, expected_stream, interleave
from torch.utils.data import BatchSampler, RandomSampler, SequentialSampler

from accel_data import (
    BatchSamplerShard,
    BatchSizeError,
    DataConfigurationError,
    SeedableRandomSampler,
    SkipBatchSampler,
)
from accel_data.samplers import random_sampler_indices

CASES = list(
    itertools.product(
        [2, 3],  # processes
        [12, 13, 7, 2],  # dataset sizes: dividing, not dividing, smaller than one round
        [2, 3],  # batch size per process (split: times the processes)
        [False, True],  # split_batches
        [True, False],  # even_batches
        [False, True],  # drop_last
    )
)


def shard_all(size, batch_size, n, split, even, drop_last):
    base = BatchSampler(SequentialSampler(range(size)), batch_size, drop_last)
    shards = [BatchSamplerShard(base, n, rank, split, even) for rank in range(n)]
    return shards, [list(shard) for shard in shards]


@pytest.mark.parametrize(("n", "size", "per", "split", "even", "drop_last"), CASES)
def test_sharded_epoch_covers_the_data_as_documented(n, size, per, split, even, drop_last):
    batch_size = per * n if split else per
    shards, per_rank = shard_all(size, batch_size, n, split, even, drop_last)
    stream = interleave(per_rank)
    assert stream == expected_stream(size, batch_size, n, split, even, drop_last)
    for shard, batches in zip(shards, per_rank, strict=True):
        assert len(shard) == len(batches)
    if even or drop_last:
        assert len({len(batches) for batches in per_rank}) == 1
        assert {len(b) for batches in per_rank for b in batches} <= {per}
    else:
        counts = [len(batches) for batches in per_rank]
        assert max(counts) - min(counts) <= 1
    total = batch_size if split else batch_size * n
    expected_remainder = -1 if drop_last else size % total
    assert {shard.remainder for shard in shards} == {expected_remainder}


def test_whole_batches_go_round_robin():
    _, per_rank = shard_all(16, 2, 2, False, True, False)
    assert per_rank[0] == [[0, 1], [4, 5], [8, 9], [12, 13]]
    assert per_rank[1] == [[2, 3], [6, 7], [10, 11], [14, 15]]


def test_last_round_wraps_around_to_the_first_samples():
    # 10 samples, 3 processes of 2: the last round holds 6, 7 | 8, 9 | 0, 1.
    _, per_rank = shard_all(10, 2, 3, False, True, False)
    assert [batches[-1] for batches in per_rank] == [[6, 7], [8, 9], [0, 1]]
    # 11 samples: the short batch [10] is completed with 0, and the next process gets 1, 2.
    _, per_rank = shard_all(11, 2, 3, False, True, False)
    assert [batches[-1] for batches in per_rank] == [[6, 7], [8, 9], [10, 0]]


def test_split_batches_slice_every_batch():
    _, per_rank = shard_all(10, 4, 2, True, True, False)
    assert per_rank[0] == [[0, 1], [4, 5], [8, 9]]
    assert per_rank[1] == [[2, 3], [6, 7], [0, 1]]


def test_variable_batch_sizes_are_completed_with_whole_batches():
    sizes = [3, 1, 2, 4, 1]
    shards = [BatchSamplerShard(VariableBatches(sizes), 2, rank) for rank in range(2)]
    per_rank = [list(shard) for shard in shards]
    assert per_rank[0] == [[0, 1, 2], [4, 5], [10]]
    assert per_rank[1] == [[3], [6, 7, 8, 9], [0, 1, 2]]
    assert [len(shard) for shard in shards] == [3, 3]
    assert {shard.remainder for shard in shards} == {1}
    uneven = [
        BatchSamplerShard(VariableBatches(sizes), 2, rank, even_batches=False) for rank in (0, 1)
    ]
    per_rank = [list(shard) for shard in uneven]
    assert interleave(per_rank) == list(range(11))
    assert [len(shard) for shard in uneven] == [3, 2]


def test_split_batches_needs_a_divisible_batch_size():
    base = BatchSampler(SequentialSampler(range(10)), 3, False)
    with pytest.raises(BatchSizeError, match=r"batch_size=3.*num_processes=2"):
        BatchSamplerShard(base, 2, 0, split_batches=True)
    with pytest.raises(BatchSizeError, match="batch_size=None"):
        BatchSamplerShard(VariableBatches([2, 2]), 2, 0, split_batches=True)


def test_process_index_out_of_range():
    base = BatchSampler(SequentialSampler(range(10)), 2, False)
    with pytest.raises(DataConfigurationError, match="process_index=2"):
        BatchSamplerShard(base, 2, 2)
    with pytest.raises(DataConfigurationError, match="num_processes=0"):
        BatchSamplerShard(base, 0, 0)


def test_skip_batch_sampler():
    base = BatchSampler(SequentialSampler(range(10)), 3, False)
    skipper = SkipBatchSampler(base, 2)
    assert list(skipper) == [[6, 7, 8], [9]]
    assert len(skipper) == 2
    assert skipper.total_length == 4
    assert list(SkipBatchSampler(base, 9)) == []
    with pytest.raises(DataConfigurationError, match="skip_batches=-1"):
        SkipBatchSampler(base, -1)


def test_skipping_draws_the_same_permutation():
    generator = torch.Generator().manual_seed(3)
    full = list(BatchSampler(RandomSampler(range(20), generator=generator), 4, False))
    generator.manual_seed(3)
    skipped = list(
        SkipBatchSampler(BatchSampler(RandomSampler(range(20), generator=generator), 4, False), 2)
    )
    assert skipped == full[2:]


def test_seedable_sampler_depends_on_seed_and_epoch_only():
    first = SeedableRandomSampler(range(50), data_seed=7)
    second = SeedableRandomSampler(range(50), data_seed=7)
    epoch0 = list(first)
    assert epoch0 == list(second)
    assert sorted(epoch0) == list(range(50))
    epoch1 = list(first)  # the epoch advanced by itself
    assert epoch1 != epoch0
    second.set_epoch(1)
    assert list(second) == epoch1
    other = SeedableRandomSampler(range(50), data_seed=8)
    assert list(other) != epoch0
    assert pickle.loads(pickle.dumps(first)).initial_seed == 7


@pytest.mark.parametrize(
    ("replacement", "num_samples"),
    [(False, None), (False, 25), (False, 7), (True, 70), (True, None)],
)
def test_bulk_random_indices_match_random_sampler(replacement, num_samples):
    sampler = RandomSampler(range(20), replacement, num_samples, torch.Generator().manual_seed(1))
    expected = list(sampler)
    sampler.generator.manual_seed(1)
    assert random_sampler_indices(sampler) == expected
