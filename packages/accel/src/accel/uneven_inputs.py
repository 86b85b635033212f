"""Training on uneven inputs: ``join_uneven_inputs`` and ``trigger_sync_in_backward``."""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Iterator, Sequence
from typing import Any

import torch
from torch.nn.parallel import DistributedDataParallel

from accel_data import BatchSamplerShard, DataLoaderDispatcher, IterableDatasetShard
from accel_state import DistributedType

_DDP_TYPES = (DistributedType.MULTI_CPU, DistributedType.MULTI_GPU, DistributedType.MULTI_XPU)


def _even_batches_holder(dataloader: Any) -> Any:
    """The sampler whose ``even_batches`` decides how a map-style ``dataloader`` ends, or None."""
    for candidate in (dataloader, getattr(dataloader, "batch_sampler", None)):
        if isinstance(candidate, BatchSamplerShard):
            return candidate
    return None


def _reads_iterable_dataset(dataloader: Any) -> bool:
    """Whether ``dataloader`` was prepared over an iterable dataset (sharded or dispatched)."""
    dataset = getattr(dataloader, "dataset", None)
    return isinstance(dataloader, DataLoaderDispatcher) or isinstance(
        dataset, IterableDatasetShard | torch.utils.data.IterableDataset
    )


def _override_even_batches(
    dataloaders: Sequence[Any], even_batches: bool
) -> list[tuple[Any, bool]]:
    """Set ``even_batches`` on the map-style loaders; return what to restore afterwards.

    Loaders of iterable datasets keep their setting, with a warning, as in Accelerate: the
    override is for map-style datasets; an iterable one takes ``even_batches`` at ``prepare``.
    """
    saved: list[tuple[Any, bool]] = []
    iterable = False
    for dataloader in dataloaders:
        holder = _even_batches_holder(dataloader)
        if holder is not None:
            saved.append((holder, holder.even_batches))
            holder.even_batches = even_batches
        elif _reads_iterable_dataset(dataloader):
            iterable = True
    if iterable:
        warnings.warn(
            f"join_uneven_inputs(even_batches={even_batches}): overriding even_batches is only "
            "supported for map-style datasets; the dataloaders of iterable datasets keep the "
            "even_batches they were prepared with (set it in DataLoaderConfiguration instead).",
            UserWarning,
            stacklevel=4,
        )
    return saved


@contextlib.contextmanager
def join_uneven_inputs(
    distributed_type: DistributedType,
    dataloaders: Sequence[Any],
    joinables: Sequence[Any],
    even_batches: bool | None,
    default_even_batches: bool,
) -> Iterator[None]:
    """Let processes with fewer batches finish early while the others keep training.

    Under DDP this is ``torch.distributed.algorithms.Join``: a process out of batches shadows
    the others' collectives. ``even_batches`` overrides the prepared map-style dataloaders'
    setting inside the block (``False`` is what makes inputs uneven; loaders of iterable
    datasets keep theirs, with a warning); Join is enabled only when batches are uneven, as in
    Accelerate. Elsewhere the block runs as it is (with a warning for a
    multi-process type that has no Join support).
    """
    if distributed_type not in _DDP_TYPES:
        if distributed_type != DistributedType.NO:
            warnings.warn(
                "join_uneven_inputs is only supported for multi-GPU, multi-CPU and multi-XPU "
                f"DDP jobs; distributed_type={distributed_type.value} runs the block without Join.",
                UserWarning,
                stacklevel=3,
            )
        yield
        return
    from torch.distributed.algorithms.join import Join

    saved = [] if even_batches is None else _override_even_batches(dataloaders, even_batches)
    effective = default_even_batches if even_batches is None else even_batches
    try:
        with Join(list(joinables), enable=not effective, throw_on_early_termination=False):
            yield
    finally:
        for holder, value in saved:
            holder.even_batches = value


@contextlib.contextmanager
def trigger_sync_in_backward(model: torch.nn.Module, use_distributed: bool) -> Iterator[None]:
    """Make the next backward pass of a DDP ``model`` synchronise, even inside ``no_sync``.

    For a model that is not DDP-wrapped, or a single process, the block runs as it is.
    """
    if not use_distributed or not isinstance(model, DistributedDataParallel):
        yield
        return
    old_backward = model.require_backward_grad_sync
    old_forward = model.require_forward_param_sync
    model.require_backward_grad_sync = True
    model.require_forward_param_sync = True
    model.reducer.prepare_for_backward([])
    try:
        yield
    finally:
        model.require_backward_grad_sync = old_backward
        model.require_forward_param_sync = old_forward
