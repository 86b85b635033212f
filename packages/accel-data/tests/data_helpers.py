"""Datasets and expectations shared by the in-process tests and the spawned workers."""

from __future__ import annotations

import torch
from torch.utils.data import Dataset, IterableDataset, Sampler, TensorDataset


def numbers(size: int) -> TensorDataset:
    """A map-style dataset whose sample i is the tensor i (batches collate to [tensor])."""
    return TensorDataset(torch.arange(size))


class Stream(IterableDataset):
    """Yields 0..size-1 (shuffled per epoch when ``shuffle``); has no length."""

    def __init__(self, size: int, shuffle: bool = False):
        self.size = size
        self.shuffle = shuffle
        self.epoch = 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __iter__(self):
        order = torch.arange(self.size)
        if self.shuffle:
            order = torch.randperm(self.size, generator=torch.Generator().manual_seed(self.epoch))
        yield from order


class SizedStream(Stream):
    """A :class:`Stream` that knows its length."""

    def __len__(self) -> int:
        return self.size


class VariableBatches(Sampler):
    """A batch sampler with no batch_size attribute yielding batches of the given sizes."""

    def __init__(self, sizes: list[int]):
        self.sizes = sizes

    def __iter__(self):
        start = 0
        for size in self.sizes:
            yield list(range(start, start + size))
            start += size

    def __len__(self) -> int:
        return len(self.sizes)


class Doubling(Dataset):
    """Map-style dataset returning a nested structure (dict holding a tuple) per sample."""

    def __init__(self, size: int):
        self.size = size

    def __len__(self) -> int:
        return self.size

    def __getitem__(self, index: int):
        return {"x": torch.tensor([index, 2 * index]), "pair": (torch.tensor(index), index)}


def values(batch) -> list[int]:
    """The sample values of a collated batch (a [tensor] list or a tensor)."""
    tensor = batch[0] if isinstance(batch, (list, tuple)) else batch
    return [int(v) for v in tensor.reshape(-1).tolist()]


def interleave(per_rank: list[list[list[int]]]) -> list[int]:
    """The global order: round by round, rank by rank."""
    stream: list[int] = []
    rounds = max(len(batches) for batches in per_rank)
    for step in range(rounds):
        for batches in per_rank:
            if step < len(batches):
                stream.extend(batches[step])
    return stream


def expected_stream(size: int, batch_size: int, n: int, split: bool, even: bool, drop_last: bool):
    """The global order a sharded sequential epoch must produce (documented tail included)."""
    total = batch_size if split else batch_size * n
    if drop_last:
        if split:
            return list(range(size // batch_size * batch_size))
        return list(range(size // batch_size // n * total))
    if not even:
        return list(range(size))
    rounds = -(-size // total)
    return [i % size for i in range(rounds * total)]
