"""``MpDeviceLoaderWrapper``: prepared batches reach the XLA device through torch_xla.

torch_xla's device loader (``MpDeviceLoader``, which runs a ``ParallelLoader``) reads batches on a
background thread, uploads them on another, and cuts the traced graph (``torch_xla.sync``) each
time the training loop takes a batch. Wrapped around a whole prepared loader, its thread would
also run the epoch bookkeeping ahead of the loop: the end of the epoch would reach
``GradientState`` batches early (breaking gradient accumulation and ``gather_for_metrics``),
generators would be synchronised on the wrong thread, and an error raised by the dataset would
end the epoch silently. Here the background threads only read and upload; RNG synchronisation,
end-of-epoch signalling, resume state and errors stay on the thread that iterates. ``torch_xla``
is imported only when iterating.
"""

from __future__ import annotations

import contextlib
import importlib
from collections.abc import Generator, Iterator
from typing import Any

import torch

from accel_data.errors import DataConfigurationError
from accel_data.shard_loader import DataLoaderShard


class _HostFeed:
    """The host batches as torch_xla's loader thread reads them; an error is kept, not lost."""

    def __init__(self, batches: Iterator[Any]) -> None:
        self._batches = batches
        self.error: BaseException | None = None

    def __iter__(self) -> _HostFeed:
        return self

    def __next__(self) -> Any:
        try:
            return next(self._batches)
        except StopIteration:
            raise
        except BaseException as error:  # noqa: BLE001 - re-raised on the iterating thread
            self.error = error
            raise StopIteration from None


class _DeviceBatches:
    """torch_xla's per-device iterator; re-raises a reading error at the end of the batches."""

    def __init__(self, batches: Iterator[Any], feed: _HostFeed) -> None:
        self._batches = batches
        self._feed = feed

    def __iter__(self) -> _DeviceBatches:
        return self

    def __next__(self) -> Any:
        try:
            return next(self._batches)
        except StopIteration:
            if self._feed.error is not None:
                raise self._feed.error from None
            raise


class MpDeviceLoaderWrapper(DataLoaderShard):
    """A :class:`DataLoaderShard` whose batches are uploaded by torch_xla's device loader.

    :func:`accel_data.prepare_data_loader` returns it when batches go to an XLA device (as
    Accelerate does). Everything else (sharding, RNG synchronisation, ``set_epoch``,
    ``state_dict``, end-of-epoch signalling) is :class:`DataLoaderShard`'s.

    Args:
        dataset: The dataset (already sharded by the batch sampler or an IterableDatasetShard).
        device: The XLA device batches go to.
        **kwargs: :class:`DataLoaderShard` and ``DataLoader`` arguments.

    Raises:
        DataConfigurationError: ``device`` is not an XLA device.

    """

    #: Keyword arguments for torch_xla's ``ParallelLoader`` (prefetch sizes and the like).
    loader_kwargs: dict[str, Any]

    def __init__(
        self, dataset: Any, device: torch.device | str | None = None, **kwargs: Any
    ) -> None:
        if device is None or torch.device(device).type != "xla":
            raise DataConfigurationError(
                f"MpDeviceLoaderWrapper(device={device!r}) needs an XLA device; use "
                "DataLoaderShard for other devices (prepare_data_loader picks the right one)."
            )
        super().__init__(dataset, device=device, **kwargs)
        self.loader_kwargs = {}

    @property
    def dataloader(self) -> MpDeviceLoaderWrapper:
        """The loader torch_xla reads from (Accelerate's attribute; here the same object)."""
        return self

    @contextlib.contextmanager
    def _batch_source(
        self, host_batches: Iterator[Any]
    ) -> Generator[tuple[Iterator[Any], torch.device | None], None, None]:
        parallel_loader = importlib.import_module("torch_xla.distributed.parallel_loader")
        feed = _HostFeed(host_batches)
        loader = parallel_loader.ParallelLoader(feed, [self.device], **self.loader_kwargs)
        try:
            batches = _DeviceBatches(loader.per_device_loader(self.device), feed)
            yield batches, None  # already on the device
        finally:
            loader.close()
