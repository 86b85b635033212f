"""IterableDatasetShard, every rank simulated in one process."""

import itertools

import pytest
from data_helpers import SizedStream, Stream, expected_stream, interleave

from accel_data import BatchSizeError, IterableDatasetShard


def shard_all(size, batch_size, n, split, even, drop_last):
    shards = [
        IterableDatasetShard(
            SizedStream(size),
            batch_size=batch_size,
            drop_last=drop_last,
            num_processes=n,
            process_index=rank,
            split_batches=split,
            even_batches=even,
        )
        for rank in range(n)
    ]
    per = batch_size // n if split else batch_size
    per_rank = []
    for shard in shards:
        samples = [int(v) for v in shard]
        per_rank.append([samples[i : i + per] for i in range(0, len(samples), per)])
    return shards, per_rank


@pytest.mark.parametrize(
    ("n", "size", "per", "split", "even", "drop_last"),
    list(
        itertools.product([2, 3], [12, 13, 2], [2, 3], [False, True], [True, False], [False, True])
    ),
)
def test_stream_shards_cover_the_data_as_documented(n, size, per, split, even, drop_last):
    batch_size = per * n if split else per
    shards, per_rank = shard_all(size, batch_size, n, split, even, drop_last)
    if drop_last:  # a short round is dropped as a whole, whichever way it is split
        total = batch_size if split else batch_size * n
        expected = list(range(size // total * total))
    else:
        expected = expected_stream(size, batch_size, n, split, even, drop_last)
    assert interleave(per_rank) == expected
    for shard, batches in zip(shards, per_rank, strict=True):
        assert len(shard) == sum(len(batch) for batch in batches)
    total = batch_size if split else batch_size * n
    assert {shard.remainder for shard in shards} == {-1 if drop_last else size % total}


def test_set_epoch_reaches_the_wrapped_dataset():
    stream = Stream(10, shuffle=True)
    shard = IterableDatasetShard(stream, batch_size=2, num_processes=2, process_index=0)
    first = list(shard)
    shard.set_epoch(1)
    assert stream.epoch == 1
    assert list(shard) != first


def test_split_needs_divisible_batch_size():
    with pytest.raises(BatchSizeError, match=r"batch_size=3.*num_processes=2"):
        IterableDatasetShard(Stream(4), batch_size=3, num_processes=2, split_batches=True)


def test_unsized_stream_has_no_length():
    shard = IterableDatasetShard(Stream(4), batch_size=2, num_processes=2)
    with pytest.raises(TypeError, match="no __len__"):
        len(shard)
