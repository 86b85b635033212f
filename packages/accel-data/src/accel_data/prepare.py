"""``prepare_data_loader``: turn any ``DataLoader`` into one that shards, syncs, places and resumes."""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterable
from typing import Any

import torch
from torch.utils.data import BatchSampler, DataLoader, IterableDataset, RandomSampler

from accel_data.dispatcher import DataLoaderDispatcher
from accel_data.errors import DataConfigurationError
from accel_data.iterable import IterableDatasetShard
from accel_data.loader_base import dataloader_kwargs
from accel_data.random_order import GlobalSeedRandomSampler
from accel_data.rng import _as_rng_type
from accel_data.samplers import BatchSamplerShard, SeedableRandomSampler, check_split_batch_size
from accel_data.shard_loader import DataLoaderShard
from accel_data.xla_loader import MpDeviceLoaderWrapper
from accel_ops import broadcast_object_list
from accel_state.partial_state import PartialState
from accel_state.types import RNGType


def prepare_data_loader(
    dataloader: DataLoader[Any],
    device: torch.device | str | None = None,
    num_processes: int | None = None,
    process_index: int | None = None,
    split_batches: bool = False,
    put_on_device: bool = False,
    rng_types: Iterable[RNGType | str] | None = None,
    dispatch_batches: bool | None = None,
    even_batches: bool = True,
    slice_fn_for_dispatch: Callable[..., Any] | None = None,
    use_seedable_sampler: bool = False,
    data_seed: int | None = None,
    non_blocking: bool = False,
    use_stateful_dataloader: bool = False,
) -> DataLoaderShard | DataLoaderDispatcher:
    """Wrap ``dataloader`` so each process of the job gets its own share of every epoch.

    The dataset, collate function, workers and the other ``DataLoader`` settings are kept; the
    batching is rebuilt. Map-style datasets are sharded by batch (:class:`BatchSamplerShard`),
    iterable ones by sample (:class:`IterableDatasetShard`) or dispatched from process 0
    (:class:`DataLoaderDispatcher`).

    Args:
        dataloader: The dataloader to wrap (it is not modified).
        device: Where batches go when ``put_on_device`` (default: ``PartialState().device``).
        num_processes: Number of shards (default: ``PartialState().data_parallel_size``: every
            process, or the data-parallel ranks of an N-D mesh, whose tensor/context-parallel
            ranks share a batch).
        process_index: This process's shard (default:
            ``PartialState().data_parallel_process_index``).
        split_batches: Split every batch between the processes (the total batch size stays the
            dataloader's) instead of giving each process whole batches (``batch_size *
            num_processes`` per step).
        put_on_device: Move every batch to ``device``.
        rng_types: Generators synchronised from process 0 at each epoch (``"torch"``, ``"cuda"``,
            ``"generator"``...). Default: the sampler's generator when it has one. ``[]``: none.
        dispatch_batches: Process 0 reads and dispatches the batches. Default: on for iterable
            datasets when ``put_on_device``, off otherwise.
        even_batches: Complete the last round with samples from the start of the epoch so every
            process gets as many batches; ``False`` leaves an uneven tail.
        slice_fn_for_dispatch: How a dispatched batch is cut (default: slicing every tensor).
        use_seedable_sampler: Replace a ``RandomSampler`` by :class:`SeedableRandomSampler`.
        data_seed: Its seed (default: process 0's torch initial seed, agreed collectively).
        non_blocking: Asynchronous copies to the device (with ``pin_memory=True``).
        use_stateful_dataloader: Accepted for Accelerate compatibility: prepared dataloaders
            always have ``state_dict()`` / ``load_state_dict()``.

    Returns:
        A :class:`DataLoaderShard` (a :class:`MpDeviceLoaderWrapper` when batches go to an XLA
        device), or a :class:`DataLoaderDispatcher` when dispatching.

    Raises:
        DataConfigurationError: Contradictory options (the message says which and the fix).
        BatchSizeError: ``split_batches=True`` with a batch size not divisible by the processes.

    """
    if not isinstance(dataloader, DataLoader):
        raise DataConfigurationError(
            f"prepare_data_loader(dataloader=...) needs a torch.utils.data.DataLoader, got a "
            f"{type(dataloader).__name__}; wrap your data in a DataLoader first."
        )
    dataset = dataloader.dataset
    iterable = isinstance(dataset, IterableDataset)
    if dispatch_batches is None:
        dispatch_batches = put_on_device and iterable
    if dispatch_batches and not put_on_device:
        raise DataConfigurationError(
            "prepare_data_loader(dispatch_batches=True, put_on_device=False): dispatched batches "
            "are broadcast on the device; pass put_on_device=True, or dispatch_batches=False."
        )
    state = PartialState()
    shards, shard = state.data_parallel_size, state.data_parallel_process_index
    num_processes = shards if num_processes is None else num_processes
    process_index = shard if process_index is None else process_index
    if dispatch_batches and (num_processes, process_index) != (shards, shard):
        raise DataConfigurationError(
            f"prepare_data_loader(dispatch_batches=True, num_processes={num_processes}, "
            f"process_index={process_index}): dispatching broadcasts over the real process group "
            f"and slices for its {shards} data-parallel shards (this process: {shard}); leave "
            "num_processes and process_index unset, or pass dispatch_batches=False."
        )
    if split_batches:
        check_split_batch_size(_batch_size_of(dataloader), num_processes, "the dataloader")
    placement = (device if device is not None else state.device) if put_on_device else None
    kwargs = dataloader_kwargs(dataloader)
    generator: torch.Generator | None = None

    if iterable:
        dataset_generator = getattr(dataset, "generator", None)
        if isinstance(dataset_generator, torch.Generator):
            generator = dataset_generator
        if (
            num_processes > 1
            and not dispatch_batches
            and _shards_natively(dataset, num_processes, split_batches)
        ):
            # A Hugging Face IterableDataset with enough shards: each process reads its own.
            dataset = dataset.shard(num_shards=num_processes, index=process_index)  # type: ignore[attr-defined]
        elif num_processes > 1 and not dispatch_batches:
            dataset = IterableDatasetShard(
                dataset,  # type: ignore[arg-type]
                batch_size=dataloader.batch_size,
                drop_last=dataloader.drop_last,
                num_processes=num_processes,
                process_index=process_index,
                split_batches=split_batches,
                even_batches=even_batches,
            )
        batch_size = dataloader.batch_size
        if split_batches and not dispatch_batches and batch_size is not None:
            batch_size //= num_processes
        kwargs.update(batch_size=batch_size, drop_last=dataloader.drop_last)
        drop_last = dataloader.drop_last
    else:
        sampler_is_batch_sampler = isinstance(dataloader.sampler, BatchSampler)
        batch_sampler = dataloader.sampler if sampler_is_batch_sampler else dataloader.batch_sampler
        batch_sampler, generator = _prepare_sampler(batch_sampler, use_seedable_sampler, data_seed)
        drop_last = bool(getattr(batch_sampler, "drop_last", dataloader.drop_last))
        if num_processes > 1 and not dispatch_batches:
            batch_sampler = BatchSamplerShard(
                batch_sampler,
                num_processes=num_processes,
                process_index=process_index,
                split_batches=split_batches,
                even_batches=even_batches,
            )
        if sampler_is_batch_sampler:
            kwargs.update(sampler=batch_sampler, batch_size=dataloader.batch_size)
        else:
            kwargs.update(batch_sampler=batch_sampler)

    if dispatch_batches:
        return DataLoaderDispatcher(
            dataset,
            split_batches=split_batches,
            use_stateful_dataloader=use_stateful_dataloader,
            _drop_last=drop_last,
            _non_blocking=non_blocking,
            slice_fn=slice_fn_for_dispatch,
            even_batches=even_batches,
            synchronized_generator=generator,
            **kwargs,
        )
    # On XLA torch_xla's device loader uploads the batches (Accelerate's MpDeviceLoaderWrapper).
    on_xla = placement is not None and torch.device(placement).type == "xla"
    loader_class = MpDeviceLoaderWrapper if on_xla else DataLoaderShard
    return loader_class(
        dataset,
        device=placement,
        rng_types=_resolve_rng_types(rng_types, generator),
        synchronized_generator=generator,
        use_stateful_dataloader=use_stateful_dataloader,
        _drop_last=drop_last,
        _non_blocking=non_blocking,
        _num_processes=num_processes,
        **kwargs,
    )


def _batch_size_of(dataloader: DataLoader[Any]) -> int | None:
    if dataloader.batch_size is not None:
        return int(dataloader.batch_size)
    holder: Any = dataloader.sampler if isinstance(dataloader.sampler, BatchSampler) else None
    if holder is None:
        holder = dataloader.batch_sampler
    return getattr(holder, "batch_size", None)


def _resolve_rng_types(
    rng_types: Iterable[RNGType | str] | None, generator: torch.Generator | None
) -> list[RNGType]:
    if rng_types is None:
        return [RNGType.GENERATOR] if generator is not None else []
    kinds = [_as_rng_type(kind) for kind in rng_types]
    return [kind for kind in kinds if kind != RNGType.GENERATOR or generator is not None]


def _prepare_sampler(
    batch_sampler: Any, use_seedable_sampler: bool, data_seed: int | None
) -> tuple[Any, torch.Generator | None]:
    """Give the index sampler a generator of its own (or a seedable sampler).

    A ``RandomSampler`` without one becomes a :class:`GlobalSeedRandomSampler` (PyTorch's order);
    other samplers keep the user's generator, or get one seeded from the global generator.

    Returns the batch sampler to shard (a copy when its sampler changed) and the generator to
    synchronise at each epoch (``None`` for a seedable sampler, which reseeds itself, or when
    there is none).
    """
    sampler = getattr(batch_sampler, "sampler", None)
    if sampler is None:  # a batch sampler drawing indices itself: synchronise its own generator
        own = getattr(batch_sampler, "generator", None)
        return batch_sampler, own if isinstance(own, torch.Generator) else None
    if use_seedable_sampler and type(sampler) is RandomSampler:
        sampler = SeedableRandomSampler(
            sampler.data_source,  # type: ignore[arg-type]
            replacement=sampler.replacement,
            num_samples=sampler._num_samples,
            data_seed=_agreed_seed(data_seed),
        )
        generator = None
    elif type(sampler) is RandomSampler and sampler.generator is None:
        # Draws its seed from the global generator every epoch, as torch does; the dataloader
        # gives every process process 0's draw.
        sampler = GlobalSeedRandomSampler(
            sampler.data_source,
            replacement=sampler.replacement,
            num_samples=sampler._num_samples,
        )
        generator = sampler.generator
    elif isinstance(sampler, SeedableRandomSampler) or not hasattr(sampler, "generator"):
        return batch_sampler, None
    else:
        sampler = copy.copy(sampler)
        if sampler.generator is None:
            # Other samplers draw from the global generator in their own ways: they get a
            # generator seeded from it, so set_seed decides the order; the epoch-start
            # synchronisation makes every process agree.
            sampler.generator = torch.Generator()
            sampler.generator.manual_seed(int(torch.randint(0, 2**62, (1,)).item()))
        generator = sampler.generator
    batch_sampler = copy.copy(batch_sampler)
    batch_sampler.sampler = sampler
    return batch_sampler, generator


def _agreed_seed(data_seed: int | None) -> int:
    """``data_seed``, else process 0's torch initial seed (one broadcast in a job)."""
    if data_seed is not None:
        return int(data_seed)
    message: list[Any] = [torch.initial_seed()]
    if PartialState().num_processes > 1:
        broadcast_object_list(message)
    return int(message[0])


def _shards_natively(dataset: Any, num_processes: int, split_batches: bool) -> bool:
    """Whether ``dataset`` is a ``datasets.IterableDataset`` with a shard for every process.

    As Accelerate does, such a dataset is split by its own ``shard()`` (whole files per process)
    instead of reading every sample on every process and keeping one batch in ``num_processes``.
    """
    module = type(dataset).__module__ or ""
    shards = getattr(dataset, "n_shards", None)
    return (
        not split_batches
        and module.split(".")[0] == "datasets"
        and isinstance(shards, int)
        and shards >= num_processes
        and callable(getattr(dataset, "shard", None))
    )
