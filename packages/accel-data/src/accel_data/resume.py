"""Skipping the first batches of an epoch: ``skip_first_batches`` and ``SkipDataLoader``."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from torch.utils.data import BatchSampler, DataLoader, IterableDataset

from accel_data.dispatcher import DataLoaderDispatcher
from accel_data.errors import DataConfigurationError
from accel_data.loader_base import DataLoaderStateMixin, dataloader_kwargs
from accel_data.samplers import SkipBatchSampler
from accel_data.shard_loader import DataLoaderShard


class SkipDataLoader(DataLoaderStateMixin, DataLoader[Any]):
    """A ``DataLoader`` that leaves out the first ``skip_batches`` batches of every iteration.

    The skipped batches are loaded and dropped; for map-style datasets
    :func:`skip_first_batches` skips indices instead, which loads nothing.

    Args:
        dataset: The dataset.
        skip_batches: Batches to leave out.
        use_stateful_dataloader: Accepted for Accelerate compatibility.
        **kwargs: The ``DataLoader`` arguments.

    """

    def __init__(
        self,
        dataset: Any,
        skip_batches: int = 0,
        use_stateful_dataloader: bool = False,
        **kwargs: Any,
    ) -> None:
        super().__init__(dataset, **kwargs)
        self.skip_batches = skip_batches
        self.use_stateful_dataloader = use_stateful_dataloader

    def __iter__(self) -> Iterator[Any]:  # type: ignore[override]
        self.begin()
        try:
            for index, batch in enumerate(DataLoader.__iter__(self)):
                if index >= self.skip_batches:
                    yield batch
        finally:
            self.end()

    def __len__(self) -> int:
        return max(super().__len__() - self.skip_batches, 0)


def skip_first_batches(dataloader: DataLoader[Any], num_batches: int = 0) -> DataLoader[Any]:
    """A dataloader like ``dataloader`` whose iterations leave out the first ``num_batches`` batches.

    For resuming inside an epoch: iterate the result for the rest of that epoch, then go back to
    ``dataloader``. Map-style datasets skip indices (nothing is loaded and a shuffling sampler
    draws exactly the same order); iterable ones load and drop the skipped batches. Prepared
    dataloaders stay prepared (same shard, device, RNG synchronisation and epoch).

    Prepared dataloaders can also resume through ``state_dict()`` / ``load_state_dict()``, which
    needs no second dataloader. One whose loaded mid-epoch state is still pending (Accelerate's
    recipe: ``load_state``, then ``skip_first_batches``) is returned itself, its next iteration
    continuing the interrupted epoch at batch ``num_batches`` with that epoch's order; the
    epochs after it follow as in the uninterrupted run.

    Args:
        dataloader: A ``DataLoader``, ``DataLoaderShard`` or ``DataLoaderDispatcher``.
        num_batches: Batches of ``dataloader`` to skip.

    Raises:
        DataConfigurationError: ``num_batches`` is negative.

    """
    if num_batches < 0:
        raise DataConfigurationError(
            f"skip_first_batches(num_batches={num_batches}) must be 0 or more."
        )
    if isinstance(dataloader, DataLoaderStateMixin) and dataloader._reposition_resume(num_batches):
        return dataloader
    dataset = dataloader.dataset
    kwargs = dataloader_kwargs(dataloader)
    per_batch = 1
    if isinstance(dataloader, DataLoaderDispatcher):
        per_batch = dataloader._base_batches_per_batch()
    skip_by_loading = 0
    if isinstance(dataset, IterableDataset):
        kwargs.update(batch_size=dataloader.batch_size, drop_last=dataloader.drop_last)
        skip_by_loading = num_batches
    elif isinstance(dataloader.sampler, BatchSampler):
        skipper = SkipBatchSampler(dataloader.sampler, num_batches * per_batch)
        kwargs.update(sampler=skipper, batch_size=dataloader.batch_size)
    else:
        batch_sampler: Any = dataloader.batch_sampler
        kwargs["batch_sampler"] = SkipBatchSampler(batch_sampler, num_batches * per_batch)

    new: DataLoader[Any]
    if isinstance(dataloader, DataLoaderDispatcher):
        new = DataLoaderDispatcher(
            dataset,
            split_batches=dataloader.split_batches,
            skip_batches=skip_by_loading,
            _drop_last=dataloader._drop_last,
            _non_blocking=dataloader._non_blocking,
            slice_fn=dataloader.slice_fn,
            even_batches=dataloader.even_batches,
            synchronized_generator=dataloader.synchronized_generator,
            **kwargs,
        )
        new.iteration = dataloader.iteration
    elif isinstance(dataloader, DataLoaderShard):
        new = type(dataloader)(  # an MpDeviceLoaderWrapper stays one
            dataset,
            device=dataloader.device,
            rng_types=dataloader.rng_types,
            synchronized_generator=dataloader.synchronized_generator,
            skip_batches=skip_by_loading,
            _drop_last=dataloader._drop_last,
            _non_blocking=dataloader._non_blocking,
            _num_processes=dataloader._num_processes,
            **kwargs,
        )
        new.iteration = dataloader.iteration
    elif skip_by_loading:
        new = SkipDataLoader(dataset, skip_batches=skip_by_loading, **kwargs)
    else:
        new = DataLoader(dataset, **kwargs)
    return new
