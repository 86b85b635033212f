"""DataLoaderShard / DataLoaderDispatcher(iteration=...): the epoch the first iteration runs."""

import torch

from accel_data import DataLoaderDispatcher, DataLoaderShard, SeedableRandomSampler


def _sampler_epochs(loader_class):
    sampler = SeedableRandomSampler(range(6), generator=torch.Generator().manual_seed(0))
    loader = loader_class(list(range(6)), iteration=3, sampler=sampler, batch_size=2)
    assert loader.iteration == 3
    first, seen = [], None
    for batch in loader:
        seen = sampler.epoch if seen is None else seen
        first.append(batch.tolist())
    assert loader.iteration == 4
    return first, seen


def test_shard_starts_at_the_given_iteration():
    first, seen = _sampler_epochs(DataLoaderShard)
    assert seen == 3
    assert sorted(value for batch in first for value in batch) == list(range(6))


def test_dispatcher_starts_at_the_given_iteration():
    first, seen = _sampler_epochs(DataLoaderDispatcher)
    assert seen == 3
    assert sorted(value for batch in first for value in batch) == list(range(6))
