"""``DataLoaderShard``: each process loads its own shard; batches go to the device, one looked ahead."""

from __future__ import annotations

import contextlib
from collections.abc import Generator, Iterable, Iterator
from typing import Any

import torch
from torch.utils.data import DataLoader, IterableDataset

from accel_data.loader_base import DataLoaderStateMixin
from accel_data.rng import _as_rng_type, synchronize_rng_state, synchronize_rng_states
from accel_ops import send_to_device
from accel_state.types import RNGType

_END: Any = object()  # marks an exhausted iterator (cheaper than catching StopIteration)


class DataLoaderShard(DataLoaderStateMixin, DataLoader[Any]):
    """A ``DataLoader`` over this process's shard that also synchronises RNGs and places batches.

    At the start of each iteration it synchronises the random generators named in ``rng_types``
    (process 0's state wins) so every process shuffles the same way, and passes the epoch to
    samplers and datasets with ``set_epoch``. It reads one batch ahead, so it knows which batch is
    the last and says so in ``GradientState`` before yielding it.

    Args:
        dataset: The dataset (already sharded by the batch sampler or an IterableDatasetShard).
        device: Where to put each batch (``None``: leave it where the collate function made it).
        rng_types: Generators to synchronise at each iteration: ``"torch"``, ``"cuda"``,
            ``"xla"``, ``"mps"``, ``"npu"``, ``"xpu"``, ``"generator"``.
        synchronized_generator: The sampler's generator, used for ``"generator"``.
        skip_batches: Batches to leave out at the start of every iteration (they are loaded).
        use_stateful_dataloader: Accepted for Accelerate compatibility (state is built in).
        iteration: The epoch the first iteration starts (``set_epoch`` value), as in Accelerate.
        **kwargs: The ``DataLoader`` arguments.

    """

    def __init__(
        self,
        dataset: Any,
        device: torch.device | str | None = None,
        rng_types: Iterable[RNGType | str] | None = None,
        synchronized_generator: torch.Generator | None = None,
        skip_batches: int = 0,
        use_stateful_dataloader: bool = False,
        _drop_last: bool = False,
        _non_blocking: bool = False,
        _num_processes: int = 1,
        iteration: int = 0,
        **kwargs: Any,
    ) -> None:
        super().__init__(dataset, **kwargs)
        self.device = None if device is None else torch.device(device)
        self.rng_types = list(rng_types) if rng_types is not None else None
        self.synchronized_generator = synchronized_generator
        self.skip_batches = skip_batches
        self.use_stateful_dataloader = use_stateful_dataloader
        self._drop_last = _drop_last
        self._non_blocking = _non_blocking
        self._num_processes = _num_processes
        self.iteration = iteration

    def _num_processes_for_state(self) -> int:
        return self._num_processes

    def __len__(self) -> int:
        return max(super().__len__() - self.skip_batches, 0)

    def _start_generators(self, fresh: bool) -> None:
        """Synchronise ``rng_types`` from process 0 at the start of a fresh epoch.

        The sampler's generator is synchronised last, after it got this epoch's seed from the
        global generator (itself synchronised first when ``"torch"`` is listed). Mid-epoch
        resumes keep the generators as the checkpoint restored them: they were synchronised
        when the interrupted epoch started.
        """
        kinds = [_as_rng_type(kind) for kind in self.rng_types or ()] if fresh else []
        synchronize_rng_states([kind for kind in kinds if kind != RNGType.GENERATOR])
        super()._start_generators(fresh)
        if RNGType.GENERATOR in kinds:
            synchronize_rng_state(RNGType.GENERATOR, self.synchronized_generator)

    def __iter__(self) -> Iterator[Any]:  # type: ignore[override]
        self._fetch_started()
        resume = self._take_resume()
        self._open_epoch(resume)
        try:
            map_style = not isinstance(self.dataset, IterableDataset)
            iterator = self._create_base_iterator(resume, can_skip=map_style)
            for _ in range(self.skip_batches + self._pending_drop):
                if next(iterator, _END) is _END:
                    break
            with self._batch_source(iterator) as (batches, device):
                non_blocking = self._non_blocking
                current = next(batches, _END)
                while current is not _END:
                    if device is not None:
                        current = send_to_device(current, device, non_blocking=non_blocking)
                    following = next(batches, _END)
                    if following is _END:
                        self.signal_last_batch(self._measured_remainder())
                    self._batches_yielded += 1
                    self._fetch_finished()
                    yield current
                    self._fetch_started()
                    current = following
            self._complete_epoch()
        finally:
            self._close_epoch()

    @contextlib.contextmanager
    def _batch_source(
        self, host_batches: Iterator[Any]
    ) -> Generator[tuple[Iterator[Any], torch.device | None], None, None]:
        """The batches to yield and the device the loop still has to move each one to.

        Here: the host batches, moved one at a time just before they are yielded. Subclasses may
        move them elsewhere (see :class:`accel_data.MpDeviceLoaderWrapper`).
        """
        yield host_batches, self.device
