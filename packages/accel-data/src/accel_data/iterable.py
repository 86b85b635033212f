"""``IterableDatasetShard``: every process reads the whole stream and keeps its own samples."""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterable, Iterator, Sized
from typing import Any

import torch
from torch.utils.data import IterableDataset

from accel_data.samplers import _check_shard, check_split_batch_size


class IterableDatasetShard(IterableDataset[Any]):
    """Shard an iterable dataset by taking this process's samples out of each round.

    The stream is read in rounds of ``batch_size * num_processes`` samples (``batch_size`` with
    ``split_batches=True``); process ``i`` keeps slice ``i`` of every round, so batching its
    output by ``batch_size`` (``batch_size // num_processes`` when splitting) gives every process
    its part of the same step. A short last round is completed with the first samples of the
    epoch (``drop_last=False``, ``even_batches=True``), dropped (``drop_last=True``), or left
    uneven (``even_batches=False``).

    Every process reads the whole stream; use ``dispatch_batches=True`` when reading is costly.

    Args:
        dataset: The iterable dataset to shard.
        batch_size: Batch size of the original dataloader (``None`` counts as 1).
        drop_last: Drop the last incomplete round.
        num_processes: Number of processes.
        process_index: This process's index.
        split_batches: ``batch_size`` is the total batch size of one step, to split.
        even_batches: Complete the last round so every process gets the same number of samples.

    """

    def __init__(
        self,
        dataset: Iterable[Any],
        batch_size: int | None = 1,
        drop_last: bool = False,
        num_processes: int = 1,
        process_index: int = 0,
        split_batches: bool = False,
        even_batches: bool = True,
    ) -> None:
        _check_shard(num_processes, process_index)
        batch_size = 1 if batch_size is None else batch_size
        if split_batches:
            check_split_batch_size(batch_size, num_processes, "the iterable dataset's dataloader")
        self.dataset = dataset
        self.batch_size = batch_size
        self.drop_last = drop_last
        self.num_processes = num_processes
        self.process_index = process_index
        self.split_batches = split_batches
        self.even_batches = even_batches
        self.epoch = 0
        #: Real samples in the last round of the latest complete iteration in this process
        #: (0: full round, -1: unknown or dropped).
        self.remainder = -1

    @property
    def round_size(self) -> int:
        """Samples of the stream consumed per step of the job."""
        return self.batch_size if self.split_batches else self.batch_size * self.num_processes

    @property
    def process_batch_size(self) -> int:
        """Samples this process receives per step."""
        return self.batch_size // self.num_processes if self.split_batches else self.batch_size

    def set_epoch(self, epoch: int) -> None:
        """Pass the epoch on to the wrapped dataset (to reshuffle it)."""
        self.epoch = epoch
        set_epoch = getattr(self.dataset, "set_epoch", None)
        if callable(set_epoch):
            set_epoch(epoch)

    def __len__(self) -> int:
        if not isinstance(self.dataset, Sized):
            raise TypeError(
                f"IterableDatasetShard over a {type(self.dataset).__name__} has no length: the "
                "wrapped dataset defines no __len__."
            )
        total, size, per = len(self.dataset), self.round_size, self.process_batch_size
        if self.drop_last:
            return (total // size) * per
        if self.even_batches:
            return math.ceil(total / size) * per
        start = self.process_index * per
        return (total // size) * per + min(max(total % size - start, 0), per)

    def __iter__(self) -> Iterator[Any]:
        generator = getattr(self.dataset, "generator", None)
        if not hasattr(self.dataset, "set_epoch") and isinstance(generator, torch.Generator):
            generator.manual_seed(self.epoch)
        self.remainder = -1
        size, per = self.round_size, self.process_batch_size
        start = self.process_index * per
        stop = start + per
        first: list[Any] | None = None
        current: list[Any] = []
        for sample in self.dataset:
            current.append(sample)
            if len(current) == size:
                yield from current[start:stop]
                if first is None:
                    first = current
                current = []
        if not current:
            self.remainder = -1 if self.drop_last else 0
            return
        if self.drop_last:
            return
        self.remainder = len(current)
        if self.even_batches:
            filler = itertools.cycle(first if first is not None else list(current))
            current.extend(itertools.islice(filler, size - len(current)))
        yield from current[start:stop]
